"""Federated averaging (FedAvg) of training checkpoints.

Each device trains on its own data from the same global checkpoint and sends its checkpoint
back; the server's new global checkpoint is the mean of their parameters weighted by how
many samples each device trained on (McMahan et al., 2017). Sums are taken in float64 and
rounded once to float32, so parameters every device left unchanged (frozen ones) come out
exactly as they went in.

Only parameters are averaged. Optimizer state (moments, step) is dropped: the moments of
different devices describe different data and are not meaningful averaged, so each round's
devices start their optimizer afresh. Properties are dropped too.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..pipeline.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from ..errors import CheckpointError


def fedavg(checkpoints, weights=None, output=None) -> Checkpoint:
    """The weighted mean of `checkpoints` (paths or Checkpoint objects, at least one).

    weights: one non-negative number per checkpoint (sample counts), not all zero; None
    weighs them equally. output: when given, the result is also written there (atomically).
    Every checkpoint must hold the same trainable and frozen parameters with the same
    shapes, and values (not a nominal checkpoint); otherwise CheckpointError says which
    file and parameter differ."""
    checkpoints = list(checkpoints)
    if not checkpoints:
        raise CheckpointError("fedavg needs at least one checkpoint")
    loaded = [(c if isinstance(c, Checkpoint) else read_checkpoint(c), _describe(c, i))
              for i, c in enumerate(checkpoints)]
    w = _weights(weights, len(loaded))
    first, first_name = loaded[0]
    for ckpt, name in loaded:
        _check_compatible(ckpt, name, first, first_name)

    def mean(kind):
        out = {}
        for param in getattr(first, kind):
            total = np.zeros(getattr(first, kind)[param].shape, np.float64)
            for (ckpt, _), weight in zip(loaded, w):
                total += weight * getattr(ckpt, kind)[param].astype(np.float64)
            out[param] = (total / w.sum()).astype(np.float32)
        return out

    result = Checkpoint(trainable=mean("trainable"), frozen=mean("frozen"))
    if output is not None:
        write_checkpoint(output, result.trainable, result.frozen)
    return result


def _describe(checkpoint, index):
    if isinstance(checkpoint, Checkpoint):
        return f"checkpoint {index}"
    return f"'{os.fspath(checkpoint)}'"


def _weights(weights, count) -> np.ndarray:
    if weights is None:
        return np.ones(count)
    weights = list(weights)
    if len(weights) != count:
        raise CheckpointError(f"{len(weights)} weights for {count} checkpoints; give one "
                              f"weight (sample count) per checkpoint")
    try:
        w = np.array([float(x) for x in weights])
    except (TypeError, ValueError):
        raise CheckpointError(f"weights must be numbers (sample counts), got {weights}") from None
    if not all(math.isfinite(x) and x >= 0 for x in w) or w.sum() <= 0:
        raise CheckpointError(f"weights must be finite, non-negative and not all zero, "
                              f"got {weights}")
    return w


def _check_compatible(ckpt: Checkpoint, name: str, first: Checkpoint, first_name: str):
    if ckpt.is_nominal:
        raise CheckpointError(f"{name} is a nominal checkpoint (no parameter values) and "
                              f"cannot be averaged")
    for kind in ("trainable", "frozen"):
        mine, theirs = getattr(ckpt, kind), getattr(first, kind)
        if set(mine) != set(theirs):
            missing = sorted(set(theirs) - set(mine))
            extra = sorted(set(mine) - set(theirs))
            raise CheckpointError(
                f"{name} and {first_name} hold different {kind} parameters"
                + (f"; {name} lacks {missing}" if missing else "")
                + (f"; {name} has {extra} besides" if extra else ""))
        for param, value in mine.items():
            if value.shape != theirs[param].shape:
                raise CheckpointError(f"parameter '{param}' has shape {list(value.shape)} in "
                                      f"{name} but {list(theirs[param].shape)} in {first_name}")
