"""Optimizer extras against torch: SGD momentum, dampening, Nesterov and weight decay
(torch.optim.SGD), elastic L1/L2 penalties (torch autograd of the penalty), global-norm
clipping (torch.nn.utils.clip_grad_norm_), learning-rate schedulers (torch's LambdaLR and
PolynomialLR, and ORT's formula by hand), gradient accumulation with lazy_reset_grad; the
device runtime under CPython and MicroPython, step by step."""
import copy
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

import microtrain_host as mh
from conftest import DEVICE, ROOT, run_micropython
from microtrain import blob as device_blob
from microtrain import parser as device_blob_parser
from microtrain_host.formats.checkpoint import read_checkpoint
from microtrain_host.cli import main as cli_main
from microtrain_host.pipeline.pack import pack
from microtrain_host.reference import reference_evaluator
from torch_reference import export, make_batches, mlp, ort_rule_step, torch_loss, write_batches

STEPS = 60
BATCH = 8
N_IN = 12
N_OUT = 3
LOSS = "MSELoss"
SCRIPT = ROOT / "tests" / "device_scripts" / "optim_steps.py"


def linear_factor(warmup, total):
    """ORT's LinearLRScheduler factor of the number of steps taken (lr_scheduler.cc)."""
    def factor(step):
        if step < warmup:
            return step / max(1.0, warmup)
        return max(0.0, (total - step) / max(1.0, total - warmup))
    return factor


# name: (optimizer, options, schedule for the device script, torch scheduler, accumulate)
CASES = {
    "momentum": ("SGD", {"momentum": 0.9}, ("none", 0.05), None, 1),
    "dampening": ("SGD", {"momentum": 0.9, "dampening": 0.5}, ("none", 0.05), None, 1),
    "nesterov": ("SGD", {"momentum": 0.9, "nesterov": True}, ("none", 0.05), None, 1),
    "sgd_weight_decay": ("SGD", {"momentum": 0.5, "weight_decay": 0.05}, ("none", 0.05), None, 1),
    "sgd_weight_decay_no_momentum": ("SGD", {"weight_decay": 0.05}, ("none", 0.05), None, 1),
    "sgd_elastic": ("SGD", {"l1_penalty": 1e-3, "l2_penalty": 1e-2}, ("none", 0.05), None, 1),
    "adamw_elastic": ("AdamW", {"l1_penalty": 1e-3, "l2_penalty": 1e-2, "weight_decay": 0.01},
                      ("none", 0.01), None, 1),
    "sgd_clip": ("SGD", {"momentum": 0.9, "clip_grad_norm": 0.8}, ("none", 0.05), None, 1),
    "adamw_clip": ("AdamW", {"clip_grad_norm": 0.65, "l2_penalty": 1e-2}, ("none", 0.01), None, 1),
    "linear_warmup": ("SGD", {"momentum": 0.9}, ("linear", 10, 50, 0.05),
                      lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, linear_factor(10, 50)), 1),
    "linear_no_warmup": ("SGD", {}, ("linear", 0, 50, 0.1),
                         lambda opt: torch.optim.lr_scheduler.PolynomialLR(opt, 50, power=1.0), 1),
    "invscaling": ("SGD", {}, ("invscaling", 0.1, 0.5),
                   lambda opt: torch.optim.lr_scheduler.LambdaLR(
                       opt, lambda step: 1.0 / (step + 1) ** 0.5), 1),
    "constant": ("AdamW", {}, ("constant", 0.01), None, 1),
    "accumulate_sgd": ("SGD", {"momentum": 0.9, "dampening": 0.1}, ("none", 0.02), None, 4),
    "accumulate_adamw": ("AdamW", {"weight_decay": 0.01}, ("linear", 5, 60, 0.01),
                         lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, linear_factor(5, 60)),
                         3),
    # Everything at once; also the MicroPython case.
    "combined": ("SGD", {"momentum": 0.8, "nesterov": True, "weight_decay": 0.01,
                         "l1_penalty": 1e-3, "l2_penalty": 1e-3, "clip_grad_norm": 1.2},
                 ("linear", 5, 40, 0.05),
                 lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, linear_factor(5, 40)), 2),
}
MICROPYTHON_CASES = ("combined", "adamw_clip")


def rel(a, b):
    """Largest elementwise error relative to max(|reference|, 1e-3), as the op tests do."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3)))


def rel_to_scale(a, b):
    """Largest error relative to the reference tensor's largest magnitude. After tens of
    float32 steps a parameter near 0 carries rounding noise of ~1e-6 absolute (AdamW divides
    by sqrt(v) of tiny gradients), so elementwise ratios there measure noise, not rules."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    if not b.size:  # plain SGD keeps no state
        return 0.0
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-3))


def prepare(directory, optimizer, options, calls):
    model = mlp(N_IN, N_OUT)
    mh.generate_artifacts(export(model, torch.zeros(1, N_IN)), loss=LOSS, optimizer=optimizer,
                          artifact_directory=directory, batch_size=BATCH,
                          optimizer_options=options)
    xs, ys = make_batches(LOSS, calls, BATCH, N_IN, N_OUT)
    write_batches(directory / "data.bin", xs, ys)
    return model, xs, ys


def parse(text):
    lines = text.split("\n")
    losses = [float(line[5:]) for line in lines if line.startswith("loss ")]
    lrs = [float(line[3:]) for line in lines if line.startswith("lr ")]
    p, s = lines.index("params"), lines.index("state")
    return {"losses": np.array(losses), "lrs": np.array(lrs),
            "params": np.array([float(v) for v in lines[p + 1:s]]),
            "state": np.array([float(v) for v in lines[s + 1:] if v])}


def device_args(directory, checkpoint, out, data, calls, accumulate, schedule):
    return [directory, checkpoint, out, data, calls, accumulate, *schedule]


def run_cpython(*args):
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, env={"PYTHONPATH": str(DEVICE), "PATH": "/usr/bin:/bin"})
    if proc.returncode:
        raise AssertionError(proc.stderr)
    return parse(proc.stdout)


def torch_run(model, optimizer, options, xs, ys, lr, make_scheduler=None, accumulate=1):
    """The oracle: torch.optim.SGD (momentum, dampening, nesterov, weight_decay) or AdamW made
    to follow ORT's rule (torch_reference.ort_rule_step); the elastic penalty added to the
    loss once per optimizer step (autograd gives l1 sign(p) + 2 l2 p), clip_grad_norm_ before
    the step, the torch scheduler stepped after it. Returns what the device script prints,
    plus the gradient norms clip_grad_norm_ saw."""
    params = list(model.parameters())
    o = dict(mh.pipeline.optimizers.DEFAULTS[mh.OptimType[optimizer]], **options)
    if optimizer == "SGD":
        opt = torch.optim.SGD(params, lr=lr, momentum=o["momentum"], dampening=o["dampening"],
                              nesterov=o["nesterov"], weight_decay=o["weight_decay"])
        decoupled_decay = 0.0
    else:
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
        decoupled_decay = o["weight_decay"]
    scheduler = make_scheduler(opt) if make_scheduler else None
    criterion = torch_loss(LOSS)
    losses, lrs, norms, t = [], [], [], 0
    for i, (x, y) in enumerate(zip(xs, ys)):
        value = criterion(model(torch.from_numpy(x)), torch.from_numpy(y))
        value.backward()
        losses.append(value.item())
        if (i + 1) % accumulate:
            continue
        if o["l1_penalty"] or o["l2_penalty"]:
            sum(o["l1_penalty"] * p.abs().sum() + o["l2_penalty"] * (p * p).sum()
                for p in params).backward()
        if o["clip_grad_norm"] is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(params, o["clip_grad_norm"]).item())
        t += 1
        rate = opt.param_groups[0]["lr"]
        lrs.append(rate)
        ort_rule_step(opt, model, optimizer, t, rate, 1e-6, decoupled_decay)
        if scheduler is not None:
            scheduler.step()
        opt.zero_grad()
    names = ("momentum_buffer",) if optimizer == "SGD" else ("exp_avg", "exp_avg_sq")
    state = [opt.state[p][n].detach().numpy().reshape(-1) for p in params for n in names
             if n in opt.state[p]]
    flat = np.concatenate([p.detach().numpy().reshape(-1) for p in params])
    return {"losses": np.array(losses), "lrs": np.array(lrs), "params": flat,
            "state": np.concatenate(state) if state else np.zeros(0), "norms": norms}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each case trained by torch and by the device runtime under CPython."""
    results = {}
    for name, (optimizer, options, schedule, make_scheduler, accumulate) in CASES.items():
        directory = tmp_path_factory.mktemp(name)
        calls = STEPS * accumulate
        model, xs, ys = prepare(directory, optimizer, options, calls)
        args = device_args(directory, directory / "checkpoint", directory / "trained",
                           directory / "data.bin", calls, accumulate, schedule)
        lr = schedule[-1] if schedule[0] in ("none", "constant", "linear") else schedule[1]
        reference = torch_run(copy.deepcopy(model), optimizer, options, xs, ys, lr,
                              make_scheduler, accumulate)
        results[name] = (directory, args, reference, run_cpython(*args))
    return results


@pytest.mark.parametrize("case", sorted(CASES))
def test_device_matches_torch_step_by_step(runs, case):
    _, _, expected, got = runs[case]
    optimizer, options, _, _, accumulate = CASES[case]
    assert len(got["losses"]) == STEPS * accumulate and len(got["lrs"]) == STEPS
    assert rel(got["lrs"], expected["lrs"]) <= 1e-6
    assert rel(got["losses"], expected["losses"]) <= 1e-4
    assert rel_to_scale(got["params"], expected["params"]) <= 1e-4
    assert rel_to_scale(got["state"], expected["state"]) <= 1e-4
    if "clip_grad_norm" in options:  # clipping really acted, and not at every step
        clipped = sum(n > options["clip_grad_norm"] for n in expected["norms"])
        assert 0 < clipped < STEPS, expected["norms"]


def test_the_cases_change_the_trajectory(runs):
    """Each feature moves the parameters away from plain SGD / AdamW with the same lr: a
    kernel that ignored its option would not pass the torch comparison by accident."""
    finals = {name: runs[name][3]["params"] for name in CASES}
    for a, b in (("momentum", "dampening"), ("momentum", "nesterov"),
                 ("momentum", "sgd_clip"), ("sgd_weight_decay_no_momentum", "sgd_elastic"),
                 ("adamw_elastic", "adamw_clip"), ("linear_no_warmup", "invscaling")):
        assert np.max(np.abs(finals[a] - finals[b])) > 1e-3, (a, b)


@pytest.mark.parametrize("case", MICROPYTHON_CASES)
def test_micropython_matches_cpython(runs, micropython, case):
    directory, args, _, cpython = runs[case]
    args = list(args)
    args[2] = directory / "trained_micropython"
    mp = parse(run_micropython(micropython, SCRIPT, *args))
    for key in ("losses", "lrs", "params", "state"):
        assert rel(mp[key], cpython[key]) <= 1e-5, key


def test_momentum_state_is_in_the_parameter_table_and_the_checkpoint(runs):
    directory, _, expected, _ = runs["momentum"]
    b = device_blob_parser.load(str(directory / "model.mtb"))
    assert all([b.names[s] for s in state] == [b.names[t] + ".momentum0"]
               for t, grad, state in b.parameters)
    assert all(device_blob.ROLE_NAMES[b.roles[s]] == "optimizer_state"
               for _, _, state in b.parameters for s in state)
    assert b.optimizer["momentum"] == pytest.approx(0.9)
    saved = read_checkpoint(directory / "trained")
    assert saved.optimizer_step == STEPS
    momentum = np.concatenate([saved.momentums[b.names[t]][0].reshape(-1)
                               for t, _, _ in b.parameters])
    assert rel_to_scale(momentum, expected["state"]) <= 1e-4
    plain = device_blob_parser.load(str(runs["sgd_weight_decay_no_momentum"][0] / "model.mtb"))
    assert all(state == () for _, _, state in plain.parameters)


def test_resume_from_a_checkpoint_continues_the_momentum_and_the_schedule(runs, tmp_path):
    """Stop the combined case half-way, save with the optimizer state, resume in a new
    process: the result is bit-identical to the uninterrupted run."""
    directory, args, _, whole = runs["combined"]
    schedule, accumulate = CASES["combined"][2], CASES["combined"][4]
    half = STEPS * accumulate // 2
    xs, ys = make_batches(LOSS, STEPS * accumulate, BATCH, N_IN, N_OUT)
    write_batches(tmp_path / "first.bin", xs[:half], ys[:half])
    write_batches(tmp_path / "second.bin", xs[half:], ys[half:])
    first = run_cpython(directory, directory / "checkpoint", tmp_path / "half",
                        tmp_path / "first.bin", half, accumulate, *schedule)
    second = run_cpython(directory, tmp_path / "half", tmp_path / "end",
                         tmp_path / "second.bin", half, accumulate, *schedule)
    assert np.array_equal(np.concatenate([first["losses"], second["losses"]]), whole["losses"])
    assert np.array_equal(np.concatenate([first["lrs"], second["lrs"]]), whole["lrs"])
    assert np.array_equal(second["params"], whole["params"])
    assert np.array_equal(second["state"], whole["state"])


def test_linear_scheduler_follows_ort_formula():
    """ORT's LinearLRScheduler(warmup 4, total 10, lr 1): the rate of the k-th step is
    factor(k - 1), computed by hand from lr_scheduler.cc; the first step runs at 0."""
    from microtrain import ConstantLRScheduler, InverseScalingLRScheduler, LinearLRScheduler
    opt = FakeOptimizer()
    scheduler = LinearLRScheduler(opt, 4, 10, 1.0)
    rates = []
    for _ in range(12):
        rates.append(opt.get_learning_rate())
        opt.step_count += 1
        scheduler.step()
    assert rates == pytest.approx([0, 0.25, 0.5, 0.75, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6,
                                   0, 0])
    assert opt.module.state.initial_learning_rate == 1.0
    # onnxcustom's LearningRateSGD: eta0, then eta0 / (t + 1) ** power_t after t steps.
    opt = FakeOptimizer()
    scheduler = InverseScalingLRScheduler(opt, 0.5, power_t=0.5)
    rates = []
    for _ in range(4):
        rates.append(opt.get_learning_rate())
        opt.step_count += 1
        scheduler.step()
    assert rates == pytest.approx([0.5, 0.5 / 2 ** 0.5, 0.5 / 3 ** 0.5, 0.25])
    opt = FakeOptimizer()
    ConstantLRScheduler(opt, 0.125).step()
    assert opt.get_learning_rate() == 0.125


class FakeOptimizer:
    """Just what a scheduler touches: step_count, set/get_learning_rate, module.state."""

    def __init__(self):
        self.step_count = 0
        self.lr = None
        self.module = type("M", (), {"state": type("S", (), {})()})()

    def set_learning_rate(self, lr):
        self.lr = lr

    def get_learning_rate(self):
        return self.lr


def test_scheduler_arguments_are_checked():
    from microtrain import InverseScalingLRScheduler, LinearLRScheduler
    with pytest.raises(ValueError, match="warmup_step_count <= total_step_count"):
        LinearLRScheduler(FakeOptimizer(), 10, 5, 0.1)
    with pytest.raises(ValueError, match="initial_lr must be >= 0"):
        LinearLRScheduler(FakeOptimizer(), 0, 5, -0.1)
    with pytest.raises(ValueError, match="power_t"):
        InverseScalingLRScheduler(FakeOptimizer(), 0.1, power_t=-1)


@pytest.mark.parametrize("optimizer,options", [
    ("SGD", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01, "clip_grad_norm": 0.05,
             "l1_penalty": 1e-3, "l2_penalty": 1e-2}),
    ("SGD", {"momentum": 0.9, "dampening": 0.5}),
    ("AdamW", {"clip_grad_norm": 0.05, "l1_penalty": 1e-3, "weight_decay": 0.01}),
])
def test_optimizer_graph_on_the_reference_evaluator_matches_torch(tmp_path, optimizer, options):
    """optimizer_model.onnx run by onnx.reference (microtrain_host.reference ops), fed torch's
    gradients, steps like torch.optim for three steps (first-step momentum included)."""
    model, xs, ys = prepare(tmp_path, optimizer, options, 3)
    opt_model = onnx.load(tmp_path / "optimizer_model.onnx")
    graph = reference_evaluator(opt_model)
    out_names = [o.name for o in opt_model.graph.output]
    reference = copy.deepcopy(model)
    expected = torch_run(reference, optimizer, options, xs, ys, 0.05)
    feeds = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    states = {i.name: np.zeros_like(feeds[i.name.rsplit(".momentum", 1)[0]])
              for i in opt_model.graph.input if ".momentum" in i.name}
    for t, (x, y) in enumerate(zip(xs, ys), start=1):
        live = copy.deepcopy(model)
        with torch.no_grad():
            for n, p in live.named_parameters():
                p.copy_(torch.from_numpy(feeds[n]))
        torch_loss(LOSS)(live(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        inputs = {"learning_rate": np.array([0.05], np.float32), "step": np.array([t], np.int64)}
        inputs.update(feeds)
        inputs.update(states)
        inputs.update({f"{n}_grad.accumulation.buffer": p.grad.numpy()
                       for n, p in live.named_parameters()})
        outs = dict(zip(out_names, graph.run(None, {i.name: inputs[i.name]
                                                    for i in opt_model.graph.input})))
        feeds = {n: outs[f"{n}.out"] for n in feeds}
        states = {n: outs[f"{n}.out"] for n in states}
    flat = np.concatenate([feeds[n].reshape(-1) for n, _ in model.named_parameters()])
    assert rel_to_scale(flat, expected["params"]) <= 1e-5
    if optimizer == "SGD":
        momentum = np.concatenate([states[f"{n}.momentum0"].reshape(-1)
                                   for n, _ in model.named_parameters()])
        assert rel_to_scale(momentum, expected["state"]) <= 1e-5


@pytest.mark.parametrize("optimizer,options,message", [
    ("SGD", {"nesterov": True}, "nesterov=True needs momentum > 0 and dampening 0"),
    ("SGD", {"nesterov": True, "momentum": 0.9, "dampening": 0.1}, "nesterov=True needs"),
    ("SGD", {"nesterov": "yes", "momentum": 0.9}, "nesterov='yes' must be True or False"),
    ("SGD", {"momentum": -0.5}, "momentum=-0.5 must be >= 0"),
    ("SGD", {"dampening": 1.5, "momentum": 0.9}, r"dampening=1.5 must be \[0, 1\]"),
    ("SGD", {"clip_grad_norm": -1.0}, "clip_grad_norm=-1.0 must be > 0"),
    ("AdamW", {"clip_grad_norm": 0.0}, "clip_grad_norm=0.0 must be > 0"),
    ("AdamW", {"l1_penalty": -1e-3}, "l1_penalty=-0.001 must be >= 0"),
    ("AdamW", {"l2_penalty": float("nan")}, "l2_penalty=nan must be a finite number"),
    ("AdamW", {"beta1": 1.0}, r"beta1=1.0 must be \[0, 1\)"),
    ("SGD", {"weight_decay": -0.1}, "weight_decay=-0.1 must be >= 0"),
    ("AdamW", {"momentum": 0.9}, r"unknown AdamW option\(s\) \['momentum'\]"),
])
def test_bad_options_are_refused(tmp_path, optimizer, options, message):
    model = export(mlp(N_IN, N_OUT), torch.zeros(1, N_IN))
    with pytest.raises(mh.ArtifactError, match=message):
        mh.generate_artifacts(model, loss=LOSS, optimizer=optimizer, artifact_directory=tmp_path,
                              batch_size=BATCH, optimizer_options=options)


def test_lowering_refuses_an_inconsistent_sgd_node(tmp_path):
    """A hand-edited optimizer graph (nesterov without momentum) fails at pack time, naming
    the node, instead of training with a rule nobody asked for."""
    prepare(tmp_path, "SGD", {}, 1)
    opt_model = onnx.load(tmp_path / "optimizer_model.onnx")
    node = opt_model.graph.node[0]
    next(a for a in node.attribute if a.name == "nesterov").i = 1
    with pytest.raises(mh.UnsupportedOpError, match=f"SGD node '{node.name}': nesterov"):
        pack(onnx.load(tmp_path / "training_model.onnx"), onnx.load(tmp_path / "eval_model.onnx"),
             opt_model, tmp_path / "bad.mtb")


def test_pack_flags(tmp_path, capsys):
    onnx.save(export(mlp(N_IN, N_OUT), torch.zeros(1, N_IN)), tmp_path / "mlp.onnx")
    out = tmp_path / "out"
    assert cli_main(["pack", str(tmp_path / "mlp.onnx"), "-o", str(out), "--loss", "mse",
                     "--optimizer", "sgd", "--batch-size", "8", "--lr", "0.05",
                     "--momentum", "0.9", "--nesterov", "--weight-decay", "0.01",
                     "--l1-penalty", "0.001", "--l2-penalty", "0.002",
                     "--clip-grad-norm", "1.5"]) == 0
    config = device_blob_parser.load(str(out / "model.mtb")).optimizer
    assert config["kind"] == "SGD" and config["nesterov"] is True
    for name, value in (("learning_rate", 0.05), ("momentum", 0.9), ("weight_decay", 0.01),
                        ("l1_penalty", 0.001), ("l2_penalty", 0.002), ("clip_grad_norm", 1.5),
                        ("dampening", 0.0)):
        assert config[name] == pytest.approx(value), name
    capsys.readouterr()
    # refused by the argument's type, before any work (one line, exit 2)
    with pytest.raises(SystemExit) as refused:
        cli_main(["pack", str(tmp_path / "mlp.onnx"), "-o", str(out), "--optimizer", "sgd",
                  "--batch-size", "8", "--clip-grad-norm", "-1"])
    assert refused.value.code == 2
    assert "argument --clip-grad-norm: must be a finite number > 0, got -1" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["pack", "--help"])
    text = capsys.readouterr().out
    for flag in ("--momentum", "--dampening", "--nesterov", "--l1-penalty", "--l2-penalty",
                 "--clip-grad-norm", "--weight-decay"):
        assert flag in text, flag


@pytest.mark.parametrize("case", MICROPYTHON_CASES)
def test_steps_do_not_grow_the_micropython_heap(runs, micropython, case):
    directory = runs[case][0]
    out = run_micropython(micropython, ROOT / "tests" / "device_scripts" / "optim_heap.py",
                          directory)
    before, after = (int(v) for v in out.split()[1:3])
    assert after == before, out
