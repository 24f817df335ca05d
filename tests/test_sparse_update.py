"""Sparse update (issue 11): the biases of every layer and the weights of the last N layers.
The selection is checked against the layers named in PyTorch, training against PyTorch with
the same parameters frozen, and the memory inspect reports against the blob's tensors and
the ONNX initializers."""
import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import microtrain_host as mh
from microtrain import parser as device_blob_parser
from microtrain_host.cli import main
from microtrain_host.errors import ArtifactError
from microtrain_host.pipeline.sparse import layers, sparse_update
from microtrain_host.tools import choices
from microtrain_host.tools.inspect import describe
from reference_models import ds_cnn, mobilenet_v2_block, tiny_transformer
from test_models import STEPS, assert_parameters_match, device_parameter_names, example, \
    make_data, torch_state
from torch_reference import export, relative_error, run_device_cpython, torch_train, \
    write_batches


def onnx_of(ref):
    return export(ref.module, example(ref, ref.batch))


def test_layers_of_the_ds_cnn_are_its_convolutions_and_classifier():
    ref = ds_cnn()
    found = layers(onnx_of(ref))
    # stem conv, 2 x (depthwise, pointwise), classifier; each conv with the BatchNorm after it
    assert [layer.op_type for layer in found] == ["Conv"] * 5 + ["Gemm"]
    assert found[-1].weights == ["classifier.weight"] and found[-1].biases == ["classifier.bias"]
    assert found[-2].weights == ["blocks.9.weight", "blocks.10.weight"]
    assert found[-2].biases == ["blocks.10.bias"]
    torch_names = [n for n, _ in ref.module.named_parameters()]
    # Every trainable torch parameter is in exactly one layer; running statistics in none.
    assert sorted(p for layer in found for p in layer.parameters) == sorted(torch_names)


def test_sparse_update_names_what_pytorch_calls_biases_and_last_layers():
    ref = ds_cnn()
    model = onnx_of(ref)
    torch_names = [n for n, _ in ref.module.named_parameters()]
    assert sparse_update(model, train_biases=True) == [n for n in torch_names
                                                       if n.endswith(".bias")]
    # The last 3 layers: the last depthwise-separable block (blocks.6-11) and the classifier.
    last = ("classifier.", "blocks.6.", "blocks.7.", "blocks.9.", "blocks.10.")
    assert sparse_update(model, train_last=3) == [n for n in torch_names if n.startswith(last)]
    both = sparse_update(model, train_biases=True, train_last=1)
    assert both == [n for n in torch_names if n.endswith(".bias") or n.startswith("classifier.")]


def test_a_matmul_bias_added_after_it_is_a_bias():
    # torch's Linear on a (batch, tokens, features) input exports as MatMul + Add(bias).
    model = onnx_of(tiny_transformer())
    found = {layer.node: layer for layer in layers(model)}
    qkv = [layer for name, layer in found.items() if "qkv" in name][0]
    assert qkv.op_type == "MatMul" and qkv.weights == ["qkv.weight"] and qkv.biases == ["qkv.bias"]
    chosen = sparse_update(model, train_biases=True)
    assert "norm1.bias" in chosen and "head.bias" in chosen and "qkv.weight" not in chosen


def test_bad_choices_are_refused():
    model = onnx_of(ds_cnn())
    with pytest.raises(ArtifactError, match="has 6 layers with parameters"):
        sparse_update(model, train_last=7)
    with pytest.raises(ArtifactError, match="selects no parameter"):
        sparse_update(model)
    with pytest.raises(ArtifactError, match="layer count"):
        sparse_update(model, train_last=-1)


def run_sparse(tmp, ref, optimizer, chosen, **pack_options):
    """Pack with requires_grad=chosen and train the device (CPython) and torch with the same
    parameters trainable on the same batches."""
    artifacts = mh.generate_artifacts(onnx_of(ref), requires_grad=chosen, loss=ref.loss,
                                      optimizer=optimizer, artifact_directory=tmp,
                                      batch_size=ref.batch, **pack_options)
    xs, ys = make_data(ref, STEPS)
    write_batches(tmp / "data.bin", xs, ys)
    reference = copy.deepcopy(ref.module).train()
    for name, p in reference.named_parameters():
        p.requires_grad_(name in chosen)
    lr = ref.lr[optimizer]
    torch_losses, _ = torch_train(reference, ref.loss, optimizer, xs, ys, lr)
    device = run_device_cpython(tmp, tmp / "data.bin", STEPS, lr)
    return artifacts, torch_losses, torch_state(reference, device_parameter_names(tmp)), device


@pytest.mark.parametrize("moves", [{}, {"update_in_backward": True, "recompute": True}],
                         ids=["plain", "moves"])
@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
@pytest.mark.parametrize("build", [ds_cnn, mobilenet_v2_block])
def test_biases_and_last_layer_train_like_pytorch(tmp_path, build, optimizer, moves):
    """With and without the memory moves (updates in the backward pass, recomputed
    activations): the same losses as torch.optim with the same parameters frozen."""
    ref = build()
    chosen = sparse_update(onnx_of(ref), train_biases=True, train_last=1)
    ref = build()  # a fresh copy: the export above ran a training-mode forward pass
    artifacts, torch_losses, torch_params, (losses, params, _) = run_sparse(
        tmp_path, ref, optimizer, chosen, **moves)
    assert artifacts.trainable == chosen
    assert relative_error(losses, torch_losses) <= 1e-4
    assert_parameters_match(params, torch_params, optimizer)
    assert losses[-10:].mean() < losses[:10].mean()


def test_inspect_shows_what_the_choice_costs(tmp_path):
    ref = ds_cnn()
    model = onnx_of(ref)
    chosen = sparse_update(model, train_biases=True, train_last=1)
    artifacts = mh.generate_artifacts(model, requires_grad=chosen, optimizer="AdamW",
                                      artifact_directory=tmp_path, batch_size=4)
    sizes = {i.name: int(np.prod(i.dims)) for i in model.graph.initializer}
    trained = sum(sizes[n] for n in chosen)
    frozen = sum(sizes[n] for n in artifacts.frozen)
    text = describe(artifacts.blob, steps=False)
    assert f"trainable parameters {trained:10d}" in text
    assert f"frozen parameters {frozen:13d}" in text
    assert f"gradient buffers {trained:14d}" in text
    assert f"optimizer state {2 * trained:15d}" in text    # AdamW: two moments each
    b = device_blob_parser.load(artifacts.blob)
    assert f"train steps      {len(b.programs['train'].steps):8d}  (" in text
    assert "pruning saved" in text and "train temporaries" in text


def test_choices_table_against_the_initializers(tmp_path):
    ref = ds_cnn()
    model = onnx_of(ref)
    rows = choices.sparse_choices(model, max_layers=2, loss="CrossEntropyLoss",
                                  optimizer="SGD", batch_size=1)
    assert [r.label for r in rows] == ["biases", "last 1", "biases + last 1", "last 2",
                                       "biases + last 2", "all"]
    sizes = {i.name: numpy_helper.to_array(i).size for i in model.graph.initializer}
    torch_names = [n for n, _ in ref.module.named_parameters()]
    by_label = {r.label: r for r in rows}
    for row in rows:
        names = row.requires_grad if row.requires_grad is not None else torch_names
        assert row.trained == sum(sizes[n] for n in names), row
        assert row.gradients == row.trained and row.optimizer_state == 0  # plain SGD
        assert 0 < row.peak_temporaries < row.arena
    # Training the classifier alone prunes the whole backward pass through the convolutions;
    # the biases need it all the way down.
    assert by_label["last 1"].arena < by_label["last 2"].arena < by_label["biases"].arena
    assert by_label["last 1"].train_steps < by_label["biases"].train_steps
    assert by_label["biases"].arena <= by_label["all"].arena
    assert "biases + last 2" in choices.table(rows)


def test_cli_pack_and_inspect(tmp_path, capsys):
    model = onnx_of(ds_cnn())
    path = tmp_path / "ds_cnn.onnx"
    onnx.save(model, path)
    out = tmp_path / "build"
    assert main(["pack", str(path), "-o", str(out), "--batch-size", "4", "--optimizer", "sgd",
                 "--train-biases", "--train-last", "1", "--frozen", "stem.1.bias"]) == 0
    text = capsys.readouterr().out
    assert "sparse update: the biases of all 6 layers, and every parameter of the last 1" in text
    expected = [n for n in sparse_update(model, True, 1) if n != "stem.1.bias"]
    assert f"trainable: {', '.join(expected)}" in text
    assert main(["pack", str(path), "-o", str(out), "--train-last", "1",
                 "--requires-grad", "classifier.bias"]) == 2
    assert "give one or the other" in capsys.readouterr().err
    assert main(["pack", str(path), "-o", str(out), "--train-last", "9"]) == 2
    assert "has 6 layers" in capsys.readouterr().err
    assert main(["inspect", str(path), "--batch-size", "1", "--optimizer", "sgd",
                 "--max-layers", "1"]) == 0
    text = capsys.readouterr().out
    assert "6 layers with parameters" in text and "  1 /classifier/Gemm (Gemm)" in text
    assert "biases + last 1" in text and "arena KiB" in text
