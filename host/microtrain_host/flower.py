"""Federated learning of microtrain devices on Flower (the `flower` extra: flwr[simulation]).

* `client_app(settings)`: a Flower ClientApp whose `train` handler is one microtrain device
  (`tools.devices`: the device runtime under CPython, or a MicroPython process). It takes the
  global model as the flat buffer `Module.copy_buffer_to_parameters` loads, trains on its own
  shard and replies with `Module.get_contiguous_parameters()` and its sample count
  ("num-examples", the FedAvg weight).
* `DeviceOrderFedAvg`: Flower's own FedAvg strategy (`flwr.serverapp.strategy.FedAvg`, its
  `aggregate_arrayrecords` unchanged) with two fixes that make it reproducible and equal to
  `microtrain aggregate` bit for bit (see `tools/fedavg.py` for the shared arithmetic):
  replies are taken in device order, not arrival order (floating-point sums depend on the
  order), and the float64 mean is rounded once to float32, the model the devices hold.
  Updates travel as float64: the widening of a float32 buffer is exact, and on float32
  arrays Flower's `array * weight` would stay float32 under NumPy 2's promotion rules,
  rounding every term (and the running sum) to float32.
* `federate(...)`: a ServerApp running that strategy for R rounds over N emulated devices
  with Flower's simulation engine (`flwr.simulation.run_simulation`, Ray backend), the
  global model evaluated on the validation set after every round.
"""
import logging
import os
import random
import re
import time

# Flower and Ray report usage to their makers unless told not to; this tool stays offline.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray's notice that it will stop hiding accelerators when num_gpus=0: there are none here.
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

import numpy as np  # noqa: E402

try:
    from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Message,  # noqa: E402
                          MetricRecord, RecordDict)
    from flwr.clientapp import ClientApp  # noqa: E402
    from flwr.serverapp import Grid, ServerApp  # noqa: E402
    from flwr.serverapp.strategy import FedAvg  # noqa: E402
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("microtrain_host.flower needs Flower: pip install 'microtrain[flower]' "
                      f"(flwr[simulation]); {e}") from e

from .tools import devices  # noqa: E402
from .tools.devices import FederateError  # noqa: E402

PARAMETERS = "parameters"  # the one array of the ArrayRecord: the flat parameter buffer
WEIGHT = "num-examples"    # Flower's FedAvg weighs replies by this metric

_cache = {}  # per process (Ray actor): data, shards and devices, built once


def _cached(key, build):
    if key not in _cache:
        _cache[key] = build()
    return _cache[key]


def _shards(settings):
    """(x_train, y_train, [indices of each device]) for these settings."""
    def build():
        from .tools.train import load_data
        x, y, _, _ = load_data(settings["data"])
        return x, y, devices.noniid_shards(y, settings["clients"], settings["alpha"],
                                           settings["seed"])
    return _cached(("shards", settings["data"], settings["clients"], settings["alpha"],
                    settings["seed"]), build)


def _device(settings):
    return _cached(("device", settings["artifacts"], settings["runtime"]), lambda: devices.make_device(
        settings["artifacts"], settings["runtime"], settings.get("micropython"),
        settings.get("heap", "4M")))


def device_seed(settings, server_round, device_id):
    """Each device's shuffling seed in each round: distinct, reproducible."""
    return 1 + device_id + settings["clients"] * (server_round + 1000 * settings["seed"])


def client_app(settings):
    """The ClientApp of every emulated device. settings: artifacts, data, clients, seed,
    runtime (cpython | micropython), micropython, heap; the round's epochs and learning rate
    come with each message's ConfigRecord."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        device_id = int(context.node_config["partition-id"])
        x, y, shards = _shards(settings)
        mine = shards[device_id]
        config = msg.content["config"]
        server_round = int(config["server-round"])
        # The global model as the devices hold it: float32 (the server rounded it so).
        buffer = msg.content["arrays"][PARAMETERS].numpy().astype(np.float32)
        params, samples, loss = _device(settings).train(
            buffer, x[mine], y[mine], int(config["epochs"]), float(config["lr"]),
            device_seed(settings, server_round, device_id))
        content = RecordDict({
            "arrays": ArrayRecord({PARAMETERS: Array(params.astype(np.float64))}),
            "metrics": MetricRecord({WEIGHT: int(samples), "train-loss": float(loss)}),
            "device": ConfigRecord({"id": device_id}),
        })
        return Message(content=content, reply_to=msg)

    return app


class DeviceOrderFedAvg(FedAvg):
    """Flower's FedAvg taking the replies in device order and rounding the mean once to
    float32. on_aggregate(server_round, [(device id, weight, float32 buffer)], global
    float32 buffer) sees every round's updates (to keep them, or to check them)."""

    def __init__(self, on_aggregate=None, **kwargs):
        super().__init__(**kwargs)
        self.on_aggregate = on_aggregate

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        failed = [m for m in replies if m.has_error()]
        if failed:
            raise FederateError(f"{len(failed)} of {len(replies)} devices failed in round "
                                f"{server_round}; the first said: "
                                f"{_device_failure(failed[0].error.reason)}")
        replies.sort(key=lambda m: int(m.content["device"]["id"]))
        arrays, metrics = super().aggregate_train(server_round, replies)
        mean = arrays[PARAMETERS].numpy()
        arrays = ArrayRecord({PARAMETERS: Array(mean.astype(np.float32))})
        if self.on_aggregate is not None:
            updates = []
            for m in replies:
                wide = m.content["arrays"][PARAMETERS].numpy()
                updates.append((int(m.content["device"]["id"]),
                                m.content["metrics"][WEIGHT], wide.astype(np.float32)))
            self.on_aggregate(server_round, updates, arrays[PARAMETERS].numpy())
        return arrays, metrics


def _device_failure(reason):
    """The device's own message out of a failed reply's reason: Flower wraps the exception
    in Ray's and its own, tracebacks included (30-odd lines); what the device said follows
    the last "Message: "."""
    found = [m.strip().rstrip("'>").strip() for m in re.findall(r"Message: (.*)", reason)]
    if found and found[-1]:
        return found[-1]
    return devices.device_error(reason)


class ProgressGrid:
    """The Grid the strategy talks to, reporting each reply as it arrives: Flower's own
    send_and_receive (push, then pull until every reply is in) with a callback."""

    def __init__(self, grid: Grid, progress, poll=0.1):
        self._grid, self._progress, self._poll = grid, progress, poll

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        ids = set(self._grid.push_messages(messages))
        total, replies = len(ids), []
        end = time.time() + (timeout if timeout is not None else 0.0)
        self._progress(0, total)
        while ids and (timeout is None or time.time() < end):
            got = list(self._grid.pull_messages(ids))
            if got:
                replies.extend(got)
                ids.difference_update(m.metadata.reply_to_message_id for m in got)
                self._progress(len(replies), total)
            if ids:
                time.sleep(self._poll)
        return replies


def federate(artifacts, data, clients=100, rounds=5, epochs=5, lr=0.02, alpha=0.3,
             fraction=1.0, runtime="cpython", micropython=None, heap="4M", seed=0,
             workers=None, updates_dir=None, report=None, verbose=False):
    """Run FedAvg for `rounds` rounds over `clients` emulated devices in Flower's simulation
    engine. Every device holds a non-IID shard of DATA's training set (devices.noniid_shards,
    Dirichlet label mixes of concentration alpha) and trains `epochs` local epochs per round with the blob's optimizer at `lr`; a fraction
    of them is sampled each round. After each round the global model is evaluated on DATA's
    validation set. updates_dir: keep every round's device updates and global model there as
    checkpoints (roundR/deviceNNN, roundR/weights.txt, roundR/global), so that
    `microtrain aggregate` can be run on them. report(kind, values) gets ("shards",
    (sizes, distinct labels, top label share) per device), ("round-progress", (round,
    replies, expected)) and ("round", record). Returns the list of round records:
    round, accuracy, loss, train_loss, seconds (training and aggregation), eval_seconds,
    rss_server (this process), rss_total (with Ray's processes), devices, and `parameters`
    (the global model, a float32 buffer in blob order)."""
    from flwr.simulation import run_simulation
    from microtrain import parser as device_blob_parser
    from .tools.train import check_data, load_data
    artifacts, data = os.path.abspath(str(artifacts)), os.path.abspath(str(data))
    for needed in ("model.mtb", "checkpoint"):
        if not os.path.exists(os.path.join(artifacts, needed)):
            raise FederateError(f"'{artifacts}' has no {needed}: pack the model first "
                                f"(microtrain pack MODEL.onnx -o {artifacts} --batch-size 8)")
    devices.check_settings(clients, rounds, epochs, lr, alpha, fraction, seed, workers,
                           updates_dir)
    devices.label_typecode(artifacts)  # a model with a train program of input and label
    x_train, y_train, x_val, y_val = load_data(data)
    # the devices and the evaluation would find a misfit only after Ray started
    check_data(device_blob_parser.load(os.path.join(artifacts, "model.mtb")), x_train, y_train,
               x_val, y_val, source=f"'{data}'")
    shards = devices.noniid_shards(y_train, clients, alpha, seed)
    batch = _batch_size(artifacts)
    small = min(len(s) for s in shards)
    if small < batch:
        raise FederateError(f"{len(y_train)} training samples over {clients} devices leave "
                            f"{small} on the smallest, fewer than one batch ({batch}); use "
                            f"fewer clients or a smaller --batch-size when packing")
    settings = {"artifacts": artifacts, "data": data, "clients": clients, "alpha": alpha,
                "seed": seed, "runtime": runtime, "micropython": micropython, "heap": heap}
    if runtime == "micropython":
        settings["micropython"] = devices.find_micropython(micropython)
    report = report or (lambda kind, values: None)
    report("shards", devices.describe_shards(y_train, shards))
    records, clock = [], {}
    initial = devices.initial_buffer(artifacts)

    def keep_updates(server_round, updates, mean):
        folder = os.path.join(updates_dir, f"round{server_round}")
        os.makedirs(folder, exist_ok=True)
        for device_id, _, buffer in updates:
            devices.buffer_to_checkpoint(artifacts, buffer,
                                         os.path.join(folder, f"device{device_id:03d}"))
        with open(os.path.join(folder, "weights.txt"), "w") as f:
            f.write(" ".join(str(w) for _, w, _ in updates) + "\n")
        devices.buffer_to_checkpoint(artifacts, mean, os.path.join(folder, "global"))

    def on_aggregate(server_round, updates, mean):
        clock["devices"] = len(updates)
        if updates_dir:
            keep_updates(server_round, updates, mean)

    def evaluate_fn(server_round, arrays):
        trained = time.perf_counter()
        buffer = arrays[PARAMETERS].numpy()
        loss, accuracy = devices.evaluate(artifacts, buffer, x_val, y_val)
        done = time.perf_counter()
        record = {"round": server_round, "accuracy": accuracy, "loss": loss, "parameters": buffer,
                  "train_loss": clock.pop("train_loss", None),
                  "seconds": trained - clock["start"], "eval_seconds": done - trained,
                  "rss_server": devices.own_rss(), "rss_total": devices.tree_rss(),
                  "devices": clock.pop("devices", 0)}
        records.append(record)
        report("round", record)
        clock["start"] = time.perf_counter()
        return MetricRecord({"accuracy": accuracy if accuracy is not None else -1.0,
                             "loss": loss})

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        random.seed(seed)  # Flower samples nodes with the random module
        strategy = DeviceOrderFedAvg(
            on_aggregate=on_aggregate, fraction_train=fraction, fraction_evaluate=0.0,
            min_train_nodes=1, min_evaluate_nodes=0, min_available_nodes=clients,
            train_metrics_aggr_fn=_train_loss(clock))
        clock["start"] = time.perf_counter()
        strategy.start(
            grid=ProgressGrid(grid, lambda done, total: report(
                "round-progress", (len(records), done, total))),
            initial_arrays=ArrayRecord({PARAMETERS: Array(initial)}), num_rounds=rounds,
            train_config=ConfigRecord({"epochs": epochs, "lr": float(lr)}),
            evaluate_fn=evaluate_fn)

    cpus = workers or os.cpu_count() or 1
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": cpus, "num_gpus": 0, "include_dashboard": False,
                             "logging_level": "ERROR",
                             # the workers' log lines (Flower's own, e.g. at shutdown);
                             # a device's failure comes back in its reply anyway
                             "log_to_driver": bool(verbose)}}
    logger = logging.getLogger("flwr")
    level = logger.level
    # Without --verbose not even Flower's ERROR lines: it logs a failed device's traceback,
    # wrapped by Ray (30-odd lines a device), while the strategy raises with the device's
    # own message (DeviceOrderFedAvg.aggregate_train); a simulation that ends early is
    # reported below, pointing to --verbose.
    logger.setLevel(logging.INFO if verbose else logging.CRITICAL)
    try:
        run_simulation(server_app=server, client_app=client_app(settings),
                       num_supernodes=clients, backend_config=backend,
                       verbose_logging=verbose)
    finally:
        logger.setLevel(level)
    if len(records) != rounds + 1:
        raise FederateError(f"the simulation ended after {len(records) - 1} of {rounds} "
                            f"rounds (run with --verbose to see Flower's log)")
    return records


def _train_loss(clock):
    """Flower's weighted mean of the devices' train losses, noted for the round record."""
    from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

    def aggregate(records, weight_key):
        metrics = aggregate_metricrecords(records, weight_key)
        clock["train_loss"] = metrics.get("train-loss")
        return metrics
    return aggregate


def _batch_size(artifacts):
    from microtrain import parser as device_blob_parser
    b = device_blob_parser.load(os.path.join(artifacts, "model.mtb"))
    return b.shapes[b.programs["train"].inputs[0]][0]


def describe_report(kind, values, runtime, alpha):
    """The line `microtrain federate` prints for a ("shards", ...) or ("round", ...) report."""
    if kind == "shards":
        sizes, labels, top = values
        return (f"{len(sizes)} emulated devices ({runtime}), non-IID shards of the training set "
                f"(Dirichlet label mixes, alpha {alpha:g}): {min(sizes)}-{max(sizes)} samples, "
                f"{min(labels)}-{max(labels)} distinct labels (mean "
                f"{sum(labels) / len(labels):.1f}), the commonest label "
                f"{100 * sum(top) / len(top):.0f} % of a device's samples on average")
    r = values
    text = f"round {r['round']}: global accuracy "
    text += f"{100 * r['accuracy']:5.1f} %" if r["accuracy"] is not None else "  n/a"
    text += f"  loss {r['loss']:.4f}"
    if r["round"] == 0:
        return text + "  (the initial model)"
    text += (f"  devices' train loss {r['train_loss']:.4f}  {r['devices']} devices"
             f"  {r['seconds']:.1f} s (+ {r['eval_seconds']:.2f} s evaluation)")
    if r["rss_server"] is not None:
        text += (f"  memory {r['rss_server'] / 2**20:.0f} MiB server, "
                 f"{r['rss_total'] / 2**20:.0f} MiB with Ray's processes")
    return text
