"""The keyword-spotting example (examples/kws): deterministic synthetic data, the committed
pretrained DS-CNN at MLPerf Tiny size, and its personalisation on the device runtime
checked against torch.optim on the same samples."""
import copy
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from conftest import DEVICE, ROOT
from torch_reference import ort_rule_step

KWS = ROOT / "examples" / "kws"
sys.path.insert(0, str(KWS))
import make_data  # noqa: E402
import personalise  # noqa: E402


def test_data_are_the_same_in_every_process():
    code = ("import sys, hashlib; sys.path.insert(0, %r); import make_data; "
            "p = make_data.pretraining_set(); q = make_data.personalisation_set(); "
            "print(hashlib.sha256(b''.join(v.tobytes() for d in (p, q) for v in d.values()))"
            ".hexdigest())" % str(KWS))
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout for _ in range(2)}
    assert len(runs) == 1
    p, q = make_data.pretraining_set(), make_data.personalisation_set()
    assert p["x_train"].shape == (3840, 1, 49, 10) and p["x_val"].shape == (960, 1, 49, 10)
    assert q["x_train"].shape == (120, 1, 49, 10) and q["x_val"].shape == (300, 1, 49, 10)
    assert np.bincount(q["y_train"]).tolist() == [10] * 12
    assert np.bincount(q["y_val"]).tolist() == [25] * 12
    _, old, new = make_data.inventory()
    assert not {frozenset(w) for w in old} & {frozenset(w) for w in new}   # new keywords


def test_committed_model_is_the_pretrained_mlperf_ds_cnn():
    import onnxruntime
    model = onnx.load(personalise.MODEL)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    assert len(convs) == 9 and [n.op_type for n in model.graph.node][-3:] == [
        "GlobalAveragePool", "Flatten", "Gemm"]
    assert shapes["stem.weight"] == [64, 1, 10, 4]
    assert [shapes[f"blocks.{k}.weight"] for k in range(8)] == [[64, 1, 3, 3], [64, 64, 1, 1]] * 4
    assert shapes["classifier.weight"] == [12, 64]
    assert sum(int(np.prod(d)) for d in shapes.values()) == 22604
    session = onnxruntime.InferenceSession(str(personalise.MODEL))
    data = make_data.pretraining_set()
    scores = session.run(None, {"input": data["x_val"]})[0]
    assert (scores.argmax(1) == data["y_val"]).mean() >= 0.95     # it is pretrained


def torch_model(onnx_model):
    """The ONNX DS-CNN as a torch module (examples/kws/pretrain.py's FoldedDSCNN)."""
    import pretrain
    module = pretrain.FoldedDSCNN(pretrain.DSCNN())
    module.load_state_dict({i.name: torch.from_numpy(numpy_helper.to_array(i).copy())
                            for i in onnx_model.graph.initializer})
    return module


def test_personalisation_matches_torch_and_beats_chance(tmp_path):
    model = personalise.fresh_head(onnx.load(personalise.MODEL))
    art = personalise.pack(model, "float sparse", tmp_path, moves=True, lr=0.003)
    train, held_out = personalise.write_data(tmp_path, 3, 2)
    proc = subprocess.run([sys.executable, str(personalise.DEVICE_SCRIPT), str(tmp_path), "1",
                           "0.003"], capture_output=True, text=True,
                          env={"PYTHONPATH": str(DEVICE), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    before = [int(v) for v in re.search(r"accuracy before (\d+)/(\d+)", out).groups()]
    after = [int(v) for v in re.search(r"accuracy after (\d+)/(\d+)", out).groups()]
    mean_loss = float(re.search(r"epoch 1 (\S+)", out).group(1))
    assert before == [2, 24]  # a zero classifier says class 0: the 2 held out of class 0
    assert after[0] > 2 * before[0]

    # torch: the same parameters trainable, the same samples in the same order, AdamW with
    # ORT's rule (torch_reference.ort_rule_step).
    data = make_data.personalisation_set(shots=3, held_out=2)
    reference = torch_model(model).train()
    for name, p in reference.named_parameters():
        p.requires_grad_(name in art.trainable)
    assert sorted(art.trainable) == sorted(n for n, _ in reference.named_parameters()
                                           if n.endswith(".bias") or n.startswith("classifier"))
    opt = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=0.003,
                            betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
    losses = []
    for t, (x, y) in enumerate(zip(data["x_train"], data["y_train"]), 1):
        loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x[None])),
                                                 torch.tensor([y]))
        loss.backward()
        losses.append(loss.item())
        ort_rule_step(opt, reference, "AdamW", t, 0.003)
        opt.zero_grad()
    assert abs(mean_loss - np.mean(losses)) <= 1e-4 * abs(np.mean(losses))
    reference.eval()
    with torch.no_grad():
        predicted = reference(torch.from_numpy(data["x_val"])).argmax(1).numpy()
    assert abs(after[0] - int((predicted == data["y_val"]).sum())) <= 1  # float32 ties


# -- the int8 configuration (issue 11): int8 backbone, classifier trained in integers ----------

from test_frozen_runtime import frozen  # noqa: E402,F401  (the frozen Unix port fixture)

sys.path.insert(0, str(ROOT / "scripts"))
import measure_heap  # noqa: E402


@pytest.fixture(scope="module")
def int8_backbone(tmp_path_factory):
    """The DS-CNN calibrated through the QAT path (4 batches of 16 pretraining utterances:
    the example uses 20) -> (QDQ model, int8 inference blob at batch 1)."""
    import quantize
    return quantize.calibrate(tmp_path_factory.mktemp("kws_int8"), steps=4)


def test_int8_backbone_keeps_the_float_accuracy(int8_backbone):
    import quantize
    from microtrain import InferenceSession
    qdq, blob = int8_backbone
    data = make_data.pretraining_set()
    x, y = data["x_val"], data["y_val"]
    float_accuracy = (quantize.onnxruntime_predictions(personalise.MODEL, x) == y).mean()
    int8 = quantize.onnxruntime_predictions(qdq, x)
    print(f"pretraining validation: float {100 * float_accuracy:.2f} %, int8 "
          f"{100 * (int8 == y).mean():.2f} %")
    assert (int8 == y).mean() >= float_accuracy - 0.01
    # the device's int8 blob predicts what onnxruntime's QDQ kernels predict
    session = InferenceSession(str(blob))
    for row, expected in zip(x[:6], int8[:6]):
        assert int(np.argmax(session.run(row.reshape(-1)))) == expected


def test_int8_inference_loads_without_the_file_and_arenas_at_once(frozen, int8_backbone,
                                                                  tmp_path):
    # load_into_arenas reads the 32 KB file into the place of the 47 KB of arenas and
    # streams the constants in afterwards: the heap a load and one inference need on the
    # frozen port fell from 237 KiB (file, constant copies and arenas at once) to ~117 KiB.
    script = tmp_path / "infer.py"
    script.write_text("import sys\nfrom array import array\n"
                      "from microtrain import InferenceSession\n"
                      "s = InferenceSession(sys.argv[1])\n"
                      "print(list(s.run(array('f', bytes(4 * 490)))))\n")
    needed, out = measure_heap.needed_heap(script, [str(int8_backbone[1])], frozen=True,
                                           low=32 * 1024, high=1024 * 1024)
    print(f"int8 DS-CNN load + inference: {needed} bytes of heap (frozen port)")
    assert needed is not None and needed <= 130 * 1024, (needed, out)


@pytest.mark.parametrize("config", ["int8 last", "int8 last block"])
def test_int8_personalisation_on_the_frozen_port(frozen, tmp_path, config):
    info = personalise.int8_pack(tmp_path, 0.01, calibration_steps=4,
                                 **personalise.INT8[config])
    train, held_out = personalise.write_data(tmp_path, 3, 2, info=info)
    assert (train, held_out) == (36, 24)
    assert (tmp_path / "x_train.q8").stat().st_size == 36 * 490
    code, out = measure_heap.run(measure_heap.interpreter(True), 256 * 1024,
                                 personalise.DEVICE_SCRIPT, [str(tmp_path), "2", "0.01"], True,
                                 600)
    assert code == 0, out
    before = [int(v) for v in re.search(r"accuracy before (\d+)/(\d+)", out).groups()]
    after = [int(v) for v in re.search(r"accuracy after (\d+)/(\d+)", out).groups()]
    losses = [float(v) for v in re.findall(r"epoch \d (\S+)", out)]
    peak = int(re.search(r"peak heap (\d+)", out).group(1))
    print(out)
    assert before == [2, 24]    # a zero classifier says class 0: the 2 held out of class 0
    assert losses[1] < losses[0] and after[0] > 2 * before[0]
    assert 0 < peak < 256 * 1024
    # the personalised checkpoint holds the integer classifier the run trained
    from microtrain import CheckpointState
    state = CheckpointState.load_checkpoint(str(tmp_path / "personalised_checkpoint"))
    weight = state.parameters[info["weight"]]
    assert any(weight.data) and len(weight.data) == 12 * 64
    assert sorted(state.parameters) == sorted(
        [info["weight"], info["bias"]] + (["blocks.7.weight", "blocks.7.bias"]
                                          if personalise.INT8[config] else []))


def test_int8_personalisation_runs_in_64k_as_a_board_holds_it(frozen, tmp_path):
    # Issue 11: the int8 personalisation in a 64 KB heap, on the 32-bit Unix port built as
    # a board's firmware would be: the model's minimal runtime frozen in, the blob frozen as
    # a bytes constant (its int8 weights read in place, as from flash). It is the same run,
    # loss for loss and prediction for prediction, as the 64-bit port's from the blob file.
    info = personalise.int8_pack(tmp_path, 0.01, calibration_steps=4)
    personalise.write_data(tmp_path, 3, 2, info=info)
    options = personalise.build_options(tmp_path, True, True, True)
    assert (tmp_path / "runtime" / "microtrain" / "kernels" / "qlinear_viper.py").exists()
    args = [str(tmp_path), "2", "0.01"]
    code, board = measure_heap.run(measure_heap.interpreter(True, options), 64 * 1024,
                                   personalise.DEVICE_SCRIPT, args + ["flash"], True, 600)
    assert code == 0, board
    code, reference = measure_heap.run(measure_heap.interpreter(True), 1024 * 1024,
                                       personalise.DEVICE_SCRIPT, args, True, 600)
    assert code == 0, reference
    print(board)
    assert board.split("peak heap")[0] == reference.split("peak heap")[0]
    before, after = re.findall(r"accuracy \w+ (\d+)/", board)
    assert int(after) > 2 * int(before)
    assert 0 < int(re.search(r"peak heap (\d+)", board).group(1)) < 64 * 1024


def test_continual_example_learns_keywords_stage_by_stage(frozen, tmp_path):
    # Issue 25: examples/kws/continual_device.py on the frozen port, a few recordings: four
    # stages of three keywords, their latent codes in the sample store (64 bytes + 12 of
    # record each), replayed; the same program without replay forgets the earlier keywords
    # outright (its classifier predicts only the newest ones); joint learns the keywords so
    # far in one stage, at every stage.
    import continual
    info = continual.pack(tmp_path, 0.02, calibration_steps=4)
    assert info["classes"] == 12 and info["classes_in_use"] == 0
    personalise.write_data(tmp_path, 3, 2, info=info)
    runs = {}
    for mode in continual.MODES:
        code, out = measure_heap.run(measure_heap.interpreter(True), 256 * 1024,
                                     continual.DEVICE_SCRIPT, [str(tmp_path), mode, "4", "0.02"],
                                     True, 600)
        assert code == 0, out
        runs[mode] = continual.parse(out)
        print(mode, out)
    stages, peak = runs["replay"]
    assert [s[0] for s in stages] == [3, 6, 9, 12]
    assert [s[1] for s in stages] == [76 * 9, 76 * 18, 76 * 27, 76 * 36]
    assert [len(s[2]) for s in stages] == [1, 2, 3, 4] and 0 < peak < 256 * 1024
    forgot, _ = runs["noreplay"]
    assert all(right == 0 for right, _ in forgot[-1][2][:3])      # the earlier nine keywords
    assert continual.percent(stages[-1][2][:3]) > continual.percent(forgot[-1][2][:3])
    joint, _ = runs["joint"]
    assert [s[0] for s in joint] == [3, 6, 9, 12]
    assert [s[1] for s in joint] == [76 * 9, 76 * 18, 76 * 27, 76 * 36]
    assert joint[0] == stages[0]        # the first stage is the same run
    assert (tmp_path / "test_latents.bin").stat().st_size == 24 * 64
