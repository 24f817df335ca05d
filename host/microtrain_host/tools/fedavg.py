"""Federated averaging (FedAvg) of training checkpoints.

Each device trains on its own data from the same global checkpoint and sends its checkpoint
back; the server's new global checkpoint is the mean of their parameters weighted by how
many samples each device trained on (McMahan et al., 2017).

The arithmetic is that of Flower's FedAvg (`aggregate_arrayrecords` of
flwr.serverapp.strategy) on float64 arrays, so that `microtrain federate` (Flower's strategy)
and this function give the same bits: each weight is first divided by the total
(w_i / sum(w), Python floats, the total summed in the order given), then every parameter is
widened to float64, multiplied by its device's factor and added up in the order given,
starting from the first product; the sum is rounded once to float32. Parameters every device
left unchanged (frozen ones) come out exactly as they went in: the factors sum to 1 within
a few float64 ulps, far below float32's rounding step.

Only parameters are averaged. Optimizer state (moments, step) is dropped: the moments of
different devices describe different data and are not meaningful averaged, so each round's
devices start their optimizer afresh. Properties are dropped too.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..formats.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
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

    total_weight = sum(w)
    factors = [weight / total_weight for weight in w]

    def mean(kind):
        out = {}
        for param in getattr(first, kind):
            total = None
            for (ckpt, _), factor in zip(loaded, factors):
                term = getattr(ckpt, kind)[param].astype(np.float64) * factor
                if total is None:
                    total = term
                else:
                    total += term
            out[param] = total.astype(np.float32)
        return out

    result = Checkpoint(trainable=mean("trainable"), frozen=mean("frozen"))
    if output is not None:
        write_checkpoint(output, result.trainable, result.frozen)
    return result


def _describe(checkpoint, index):
    if isinstance(checkpoint, Checkpoint):
        return f"checkpoint {index}"
    return f"'{os.fspath(checkpoint)}'"


def _weights(weights, count) -> list[float]:
    if weights is None:
        return [1.0] * count
    weights = list(weights)
    if len(weights) != count:
        raise CheckpointError(f"{len(weights)} weights for {count} checkpoints; give one "
                              f"weight (sample count) per checkpoint")
    try:
        w = [float(x) for x in weights]
    except (TypeError, ValueError):
        raise CheckpointError(f"weights must be numbers (sample counts), got {weights}") from None
    if not all(math.isfinite(x) and x >= 0 for x in w) or sum(w) <= 0:
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
