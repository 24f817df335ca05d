"""Integer training blobs (issue 11): the int8 inference lowering of a QAT-calibrated model
whose classifier (the last Gemm) trains on the device in integers.

`int8_training_artifacts(qdq_model, out_dir, learning_rate)` takes the QDQ model
`microtrain export --qdq` writes (int8 weights, int32 biases, learned activation ranges;
its batch size is the artifacts' batch size), fuses it as pack_inference_model does
(quant/int8.py) and writes
  int8_train.mtb      programs "train" (inputs: the quantized int8 / uint8 input and the
                      int32 labels; the frozen layers as QLINEAR_* steps, then
                      INT_GEMM_LOGITS, INT_SOFTMAX_CE and INT_GEMM_UPDATE: the update is
                      fused into the backward step, no gradient buffer) and "eval" (outputs:
                      the loss ints and the int32 logits); every step integer-only
  int8_train.ckpt     the checkpoint (ONNX Runtime's layout) of the two trainable
                      parameters: the classifier's int8 weight [n, k] (data type INT8, per
                      output channel scales in the blob) and its int32 bias (INT32)
  int8_train.json     what a caller needs: input name, scale, zero point and type (to
                      quantize inputs as onnxruntime's QuantizeLinear does), label name,
                      classes, parameter names, learning rate
The device trains it with the usual API: Module(blob, CheckpointState.load_checkpoint(
ckpt)), Optimizer(blob, module) (set_learning_rate rewrites the integer multipliers), and
model(x_int8, labels) per step (kernels/inttrain.py). With loss="mse" or "bce_with_logits"
(quant/intloss.py, kernels/intloss.py) the last Gemm (with train_biases / train_last, the
layers before it too) trains against a target in place of the labels: model(x_int8, target),
or model(x_int8) when the input is its own target."""
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ArtifactError, UnsupportedOpError
from ..graph import DOMAIN, attr
from ..formats.blob import serialize
from ..formats.checkpoint import write_checkpoint
from ..formats.files import write_atomically
from ..ir import INPUT, LABEL, PARAM
from ..pipeline.lower import Lowering
from ..ops.inttrain import UNUSED_BIAS
from ..pipeline.plan import assign_offsets, mark_latent
from .int8 import int8_graph
from .intbackward import Graph, backward_nodes, named_choice
from .intloss import INTEGER_LOSSES, check_loss

BLOB, CHECKPOINT, INFO = "int8_train.mtb", "int8_train.ckpt", "int8_train.json"
LOGITS, LOSS, GRAD = "inttrain.logits", "inttrain.loss", "inttrain.grad"
FEATURE_GRAD = "inttrain.feature_grad"
LABELS = "labels"
TARGET = "target"


def _classifier(fused):
    """(Quantize node of the input, the last QLinearGemm, its Dequantize) of a fused graph
    whose single output is the dequantized classifier output."""
    g = fused.graph
    if len(g.input) != 1 or len(g.output) != 1:
        raise UnsupportedOpError("integer training needs a model with one input and one output")
    producers = {o: n for n in g.node for o in n.output}
    deq = producers.get(g.output[0].name)
    gemm = producers.get(deq.input[0]) if deq is not None and deq.op_type == "Dequantize" \
        else None
    if gemm is None or gemm.op_type != "QLinearGemm":
        raise UnsupportedOpError(
            f"integer training: the output '{g.output[0].name}' is not the int8 output of a "
            f"Gemm (found {deq.op_type if deq is not None else 'no node'}); the classifier "
            f"must be a quantized Gemm")
    quant = [n for n in g.node if n.op_type == "Quantize" and n.input[0] == g.input[0].name]
    others = [n for n in g.node if g.input[0].name in n.input and n not in quant[:1]]
    if len(quant) != 1 or others:
        where = f": node '{others[0].name}' ({others[0].op_type}) reads it" if others else ""
        raise UnsupportedOpError(f"integer training: the input '{g.input[0].name}' must be "
                                 f"read only by its QuantizeLinear (the device is fed "
                                 f"quantized inputs){where}")
    if attr(gemm, "transA", 0) or attr(gemm, "alpha", 1.0) != 1.0:
        raise UnsupportedOpError(f"QLinearGemm node '{gemm.name}': transA / alpha")
    return quant[0], gemm, deq


def _behind_views(fused, gemm):
    """(producer of each tensor, readers of each tensor, the node behind the views that
    make the classifier's input) of the fused graph."""
    producers = {o: n for n in fused.graph.node for o in n.output}
    readers = {}
    for n in fused.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    node = producers.get(gemm.input[0])
    while node is not None and node.op_type in ("Flatten", "Reshape", "Squeeze"):
        node = producers.get(node.input[0])
    return producers, readers, node


def _last_conv(fused, gemm):
    """The 1x1 QLinearConv whose output a QLinearGlobalAveragePool (then views) turns into
    the classifier's input, or an UnsupportedOpError saying why there is none."""
    producers, readers, node = _behind_views(fused, gemm)
    conv = producers.get(node.input[0]) if node is not None and \
        node.op_type == "QLinearGlobalAveragePool" else None
    if conv is None or conv.op_type != "QLinearConv" or \
            len(readers.get(conv.output[0], [])) != 1:
        raise UnsupportedOpError("integer training of the last convolution: the classifier's "
                                 "input must be a GlobalAveragePool of a convolution's output "
                                 "(read by nothing else)")
    ones = lambda key, n: list(attr(conv, key, [1] * n)) == [1] * n       # noqa: E731
    if not (ones("kernel_shape", 2) and ones("strides", 2) and attr(conv, "group", 1) == 1
            and not any(attr(conv, "pads", [0] * 4))):
        raise UnsupportedOpError(f"integer training of the last convolution: node "
                                 f"'{conv.name}' is not a 1x1 convolution (stride 1, no "
                                 f"padding, one group)")
    return conv


def _trained_weights(graph, train_conv, train_depthwise, train_last):
    """The layers (before the classifier) whose int8 weights train: the last train_last - 1
    of them, or the last one (train_conv), or the last two, a depthwise conv and its
    pointwise one (train_depthwise)."""
    if train_last:
        return graph.last_layers(train_last - 1)
    if train_depthwise:
        layers = graph.layers
        if len(layers) < 2 or attr(layers[-2], "group", 1) == 1:
            raise UnsupportedOpError(
                "integer training of the last depthwise convolution: " +
                (f"node '{layers[-2].name}' ({layers[-2].op_type}) before the last layer is "
                 f"not grouped" if len(layers) >= 2 else "the model has one layer before "
                 "the classifier") + " (--train-last 3 trains the last two layers of any "
                "kind)")
        return graph.last_layers(2)
    return graph.last_layers(1) if train_conv else []


def _param_name(name, fallback):
    return name.removesuffix(".quantized") if name else fallback


def _class_slots(gemm, w, bias, w_scales, max_classes, keep_classes):
    """(W, bias, weight scales) of a classifier with room for classes added on the device
    (continual learning, device continual.py): max_classes rows (default: the model's), of
    which the first keep_classes (default: all the model's) are the model's own classes and
    the rest unused slots - zero weights and the bias UNUSED_BIAS, which the kernels read as
    "no class here" (no logit, probability 0, no update) until the device adds a class
    there. An unused slot's weight scale is the largest of the model's (a class trained
    from zero then has the range of the widest one)."""
    n, k = w.shape
    keep = n if keep_classes is None else int(keep_classes)
    slots = n if max_classes is None else int(max_classes)
    if not 0 <= keep <= n:
        raise ArtifactError(f"keep_classes {keep} must lie in [0, {n}]: the classifier "
                            f"'{gemm.name}' has {n} classes")
    if not max(keep, 2) <= slots <= 1024:
        raise ArtifactError(f"max_classes {slots} must lie in [{max(keep, 2)}, 1024] (at "
                            f"least the {keep} classes kept, at least 2)")
    rows = np.zeros((slots, k), np.int8)
    rows[:keep] = w[:keep]
    biases = np.full(slots, UNUSED_BIAS, np.int32)
    biases[:keep] = bias[:keep]
    scales = list(w_scales[:keep]) + [max(w_scales)] * (slots - keep)
    return rows, biases, scales


def int8_training_model(qdq_model, stochastic=True, train_conv=False, momentum=0.0,
                        train_biases=False, train_depthwise=False, max_classes=None,
                        keep_classes=None, loss="cross_entropy", target=None,
                        train_last=None, requires_grad=None, frozen_params=None):
    """(train graph, eval graph, roles, quantization, parameters {name: array}, info).
    loss: a name of INTEGER_LOSSES; target (mse): None, a target input quantized with the
    output's scale and zero point, or "input": the model's own quantized input is the
    target (an autoencoder: the device is called model(x)).
    train_conv: also train the 1x1 convolution before the GlobalAveragePool (weights and
    bias) from the classifier's input gradient. train_biases / train_depthwise / train_last:
    the integer backward (quant/intbackward.py). requires_grad / frozen_params: a named
    parameter set (intbackward.named_choice). max_classes / keep_classes: see
    _class_slots."""
    named = requires_grad is not None or frozen_params is not None
    check_loss(loss, {"train_conv": train_conv, "train_biases": train_biases,
                      "train_depthwise": train_depthwise, "max_classes": max_classes is not None,
                      "keep_classes": keep_classes is not None,
                      "train_last": (train_last or 1) > 1, "requires_grad / frozen": named})
    if requires_grad is not None and (train_conv or train_biases or train_depthwise or
                                      (train_last or 1) > 1):
        raise ArtifactError("requires_grad and train_biases / train_last both choose the "
                            "trainable parameters: give one or the other")
    if named and (train_conv or train_depthwise):
        raise ArtifactError("a named parameter set (requires_grad / frozen_params) with "
                            "train_conv / train_depthwise: name the parameters instead")
    if target not in (None, "input") or (target and loss != "mse"):
        raise ArtifactError(f"target {target!r}: give None or 'input' (the mse loss only)")
    if not isinstance(qdq_model, onnx.ModelProto):
        qdq_model = onnx.load(os.fspath(qdq_model))
    fused = int8_graph(qdq_model)
    quant, gemm, deq = _classifier(fused)
    g = fused.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    w = inits[gemm.input[1]]
    if w.dtype != np.int8:
        raise UnsupportedOpError(f"QLinearGemm node '{gemm.name}': the weight is not int8")
    w = np.ascontiguousarray(w if attr(gemm, "transB", 0) else w.T)     # [n, k]
    n, k = w.shape
    bias = (inits[gemm.input[2]].astype(np.int32) if len(gemm.input) > 2 and gemm.input[2]
            else np.zeros(n, np.int32))
    w_name = gemm.input[1].removesuffix(".quantized") or "classifier.weight"
    b_name = (gemm.input[2] if len(gemm.input) > 2 and gemm.input[2] else w_name + ".bias")
    b_name = b_name.removesuffix(".quantized")
    if b_name == w_name:
        b_name += ".bias"
    w_scales = [float(v) for v in attr(gemm, "w_scales")]
    if len(w_scales) == 1:
        w_scales *= n
    if max_classes is not None or keep_classes is not None:
        w, bias, w_scales = _class_slots(gemm, w, bias, w_scales, max_classes, keep_classes)
        n = w.shape[0]
    x_name = quant.output[0]
    x_type = attr(quant, "y_type", TensorProto.UINT8)
    shape = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
    batch = shape[0]
    frozen = [nd for nd in g.node if nd is not quant and nd is not gemm and nd is not deq]
    taken = {gemm.input[1]} | set(gemm.input[2:3])
    quantization = {x_name: ([attr(quant, "scale")], [attr(quant, "zero_point", 0)], 0),
                    w_name: (w_scales, [0] * n, 0)}
    op_type, _, per_sample = INTEGER_LOSSES[loss]
    label, label_type, label_shape = LABELS, TensorProto.INT32, [batch]
    if loss == "bce_with_logits":
        label, label_shape = TARGET, [batch, n]         # probabilities in Q14
    elif loss == "mse" and target == "input":
        label = None
    elif loss == "mse":
        label, label_shape = TARGET, [batch, n]
        label_type = attr(gemm, "y_type", TensorProto.UINT8)
        quantization[TARGET] = ([attr(gemm, "y_scale")], [attr(gemm, "y_zero_point", 0)], 0)
    inputs = [helper.make_tensor_value_info(x_name, x_type, shape)] + (
        [helper.make_tensor_value_info(label, label_type, label_shape)] if label else []) + [
        helper.make_tensor_value_info(w_name, TensorProto.INT8, [n, k]),
        helper.make_tensor_value_info(b_name, TensorProto.INT32, [n])]
    params = {w_name: w, b_name: bias}
    conv_nodes = []
    masks = {}
    extra = []
    if train_conv and not (train_biases or train_depthwise or train_last):
        try:        # a 1x1 conv into the GlobalAveragePool: one fused update step
            _last_conv(fused, gemm)
        except UnsupportedOpError:
            train_last = 2          # any other last layer: the general backward
    weights = biases = None
    if named:
        graph = Graph(fused, gemm)
        weights, biases = named_choice(graph, (w_name, b_name), requires_grad, frozen_params,
                                       _trained_weights(graph, False, False, train_last),
                                       train_biases)
    if (weights or biases) if named else (
            train_biases or train_depthwise or (train_last or 1) > 1):
        constants = {}
        graph = Graph(fused, gemm)
        replaced, sparse, masks = backward_nodes(
            graph, FEATURE_GRAD, weights if named else _trained_weights(
                graph, train_conv, train_depthwise, train_last),
            train_biases and not named, stochastic, inits, params, quantization, inputs, taken,
            constants, biases)
        frozen = [replaced.get(id(nd), nd) for nd in frozen]
        extra = [numpy_helper.from_array(v, k) for k, v in constants.items()]
        conv_nodes = [helper.make_node("IntGemmGradInput", [GRAD, w_name], [FEATURE_GRAD],
                                       name=gemm.name + ".grad_input", domain=DOMAIN)] + sparse
    elif train_conv and not named:
        conv = _last_conv(fused, gemm)
        w2 = inits[conv.input[1]]
        channels = w2.shape[0]
        w2_name = _param_name(conv.input[1], conv.name + ".weight")
        b2_name = _param_name(conv.input[2] if len(conv.input) > 2 else "",
                              conv.name + ".bias")
        bias2 = (inits[conv.input[2]].astype(np.int32) if len(conv.input) > 2 and
                 conv.input[2] else np.zeros(channels, np.int32))
        taken |= set(conv.input[1:3])
        scales2 = [float(v) for v in attr(conv, "w_scales")]
        if len(scales2) == 1:
            scales2 *= channels
        trained = helper.make_node(conv.op_type, [conv.input[0], w2_name, b2_name],
                                   list(conv.output), name=conv.name, domain=conv.domain)
        trained.attribute.extend(conv.attribute)
        frozen = [trained if nd is conv else nd for nd in frozen]
        inputs += [helper.make_tensor_value_info(w2_name, TensorProto.INT8, list(w2.shape)),
                   helper.make_tensor_value_info(b2_name, TensorProto.INT32, [channels])]
        params.update({w2_name: w2, b2_name: bias2})
        quantization[w2_name] = (scales2, [0] * channels, 0)
        conv_nodes = [
            helper.make_node("IntGemmGradInput", [GRAD, w_name], [FEATURE_GRAD],
                             name=gemm.name + ".grad_input", domain=DOMAIN),
            helper.make_node("IntConv1x1Update", [w2_name, b2_name, conv.input[0],
                                                  conv.output[0], FEATURE_GRAD],
                             [w2_name + ".updated", b2_name + ".updated"],
                             name=conv.name + ".update", domain=DOMAIN, conv=conv.name,
                             stochastic=int(bool(stochastic)))]
    keep = [i for i in g.initializer if i.name not in taken] + extra
    infos = [v for v in g.value_info if v.name not in {i.name for i in inputs}]
    logits = helper.make_node("IntGemmLogits", [gemm.input[0], w_name, b_name], [LOGITS],
                              name=gemm.name + ".logits", domain=DOMAIN)
    loss_node = helper.make_node(op_type, [LOGITS, label or x_name], [LOSS, GRAD],
                                 name=gemm.name + ".loss", domain=DOMAIN)
    step = helper.make_node("IntGemmUpdate", [w_name, b_name, gemm.input[0], GRAD],
                            [w_name + ".updated", b_name + ".updated"],
                            name=gemm.name + ".update", domain=DOMAIN,
                            stochastic=int(bool(stochastic)), momentum=float(momentum))
    out_loss = helper.make_tensor_value_info(LOSS, TensorProto.INT32, [batch, per_sample])
    out_logits = helper.make_tensor_value_info(LOGITS, TensorProto.INT32, [batch, n])
    opsets = list(fused.opset_import)

    def model(name, nodes, outputs, forward=frozen):
        graph = helper.make_graph(forward + nodes, name, inputs, outputs, initializer=keep,
                                  value_info=infos)
        return helper.make_model(graph, opset_imports=opsets)

    # the classifier's input gradient reads W before its update; the convolution's update
    # comes last
    # (the sparse update's clamp masks right after their convolutions)
    forward = [nd for n in frozen for nd in ([n, masks[n.name]] if n.name in masks else [n])]
    train = model("train", [logits, loss_node] + conv_nodes[:1] + [step] + conv_nodes[1:],
                  [out_loss], forward)
    evaluate = model("eval", [logits, loss_node], [out_loss, out_logits])
    roles = {x_name: INPUT}
    if label:
        roles[label] = LABEL
    roles.update({name: PARAM for name in params})
    info = {"input": x_name, "input_scale": float(attr(quant, "scale")),
            "input_zero_point": int(attr(quant, "zero_point", 0)),
            "input_type": "int8" if x_type == TensorProto.INT8 else "uint8",
            "input_shape": shape, "labels": label if loss == "cross_entropy" else None,
            "classes": int(n), "batch_size": batch,
            "weight": w_name, "bias": b_name, "features": int(k),
            "feature_tensor": gemm.input[0],
            "feature_scale": float(attr(gemm, "x_scale")),
            "weight_scales": w_scales, "parameters": list(params),
            "classes_in_use": int(np.count_nonzero(bias != UNUSED_BIAS)),
            "loss": loss, "target": label or x_name, "target_type": {
                "cross_entropy": "class index", "bce_with_logits": "q14"}.get(loss)}
    if loss == "mse":       # quantized as the target tensor (the output, or the input)
        scales, zps, _ = quantization[label or x_name]
        info.update(target_scale=float(scales[0]), target_zero_point=int(zps[0]),
                    target_type="int8" if (label_type if label else x_type) ==
                    TensorProto.INT8 else "uint8")
    return train, evaluate, roles, quantization, params, info


def int8_training_artifacts(qdq_model, out_dir, learning_rate=0.01, stochastic=True,
                            train_conv=False, momentum=0.0, train_biases=False,
                            train_depthwise=False, max_classes=None, keep_classes=None,
                            loss="cross_entropy", target=None, train_last=None,
                            requires_grad=None, frozen_params=None):
    """Write int8_train.mtb, int8_train.ckpt and int8_train.json into out_dir (see the
    module docstring); returns the info dict (with the three paths). stochastic: round the
    weight steps stochastically (default; steps below half a quantum would otherwise be
    lost) or half to even. train_conv: also train the 1x1 convolution before the
    GlobalAveragePool feeding the classifier (the last pointwise conv of a DS-CNN).
    momentum: SGD momentum (torch's rule, dampening 0) of the classifier, in [0, 1): an
    int16 velocity per weight (2 bytes) and an int32 one per bias, kept in the arenas; the
    device saves them with the optimizer state (momentum0 of the parameter, ONNX INT16 /
    INT32; device checkpoint.py), the checkpoint written here has none (zero velocities).
    train_biases: also train the int32 bias of every layer (convolution or hidden Gemm:
    the integer backward of quant/intbackward.py through the frozen int8 layers, their
    ReLU / Clip, residual Adds, pools and views); train_last N: also train the weights of
    the N - 1 layers before the classifier; train_depthwise: the weights of the last
    block's depthwise convolution and its pointwise one. Every layer the backward passes
    trains its bias; the last pointwise conv's weights train with train_conv. The
    classifier's momentum applies to it only. requires_grad / frozen_params: a named
    parameter set, as generate_artifacts takes it (the float model's initializer names;
    quant/intbackward.py named_choice): exactly these train - the classifier always, a
    layer the gradient passes whose bias is not named passes it on untrained.
    max_classes: the classifier's room for classes added on the device (continual
    learning); keep_classes: how many of the model's classes stay in use (default all; 0:
    every slot starts unused). See _class_slots.
    loss: "cross_entropy" (the classifier), "mse" or "bce_with_logits" (ops/intloss.py: the
    last Gemm, with train_biases / train_last the layers before it too; not train_conv,
    train_depthwise nor the class slots; the device is called model(x, target), target the output's size: mse
    int8 / uint8 quantized with the output's scale and zero point (quantize_target), bce
    int32 probabilities in Q14; mse with target="input": model(x), the input its own
    target, an autoencoder's); any other loss is refused, named."""
    if not 0.0 <= float(momentum) < 1.0:
        raise ArtifactError(f"momentum {momentum!r} must lie in [0, 1)")
    if not (0.0 < float(learning_rate) < 3e38):
        raise ArtifactError(f"learning rate {learning_rate!r} must be positive and finite")
    train, evaluate, roles, quantization, params, info = int8_training_model(
        qdq_model, stochastic, train_conv, momentum, train_biases, train_depthwise,
        max_classes, keep_classes, loss, target, train_last, requires_grad, frozen_params)
    lowering = Lowering(roles)
    lowering.quantization = quantization
    lowering.lower("train", train)
    lowering.lower("eval", evaluate)
    parameters = [(lowering.persistent[name], -1, (), False) for name in params]
    sizes = assign_offsets(lowering)
    mark_latent(lowering)
    data = serialize(lowering, parameters, sizes, INTEGER_LOSSES[loss][1],
                     info["classes"] if loss == "cross_entropy" else 0, "SGD",
                     {"learning_rate": float(learning_rate)})
    out = os.fspath(out_dir)
    os.makedirs(out, exist_ok=True)
    paths = {key: os.path.join(out, name) for key, name in
             (("blob", BLOB), ("checkpoint", CHECKPOINT), ("info", INFO))}
    try:
        write_atomically(paths["blob"], data)
        write_checkpoint(paths["checkpoint"], params, {}, keep_integers=True)
        info = dict(info, learning_rate=float(learning_rate), stochastic=bool(stochastic),
                    momentum=float(momentum), train_conv=bool(train_conv or train_depthwise),
                    train_biases=bool(train_biases), train_depthwise=bool(train_depthwise),
                    train_last=int(train_last or (3 if train_depthwise else
                                                  2 if train_conv else 1)),
                    **paths)
        write_atomically(paths["info"], json.dumps(info, indent=1).encode())
    except OSError as e:
        raise ArtifactError(f"cannot write into '{out}': {e}") from e
    return info


def quantize_input(x, info):
    """The int8 / uint8 values the device is fed for float input x: onnxruntime's
    QuantizeLinear (x / scale rounded half to even, plus the zero point, saturated)."""
    dtype = np.int8 if info["input_type"] == "int8" else np.uint8
    lo, hi = (-128, 127) if dtype == np.int8 else (0, 255)
    q = np.rint(np.asarray(x, np.float32) / np.float32(info["input_scale"]))
    return np.clip(q + info["input_zero_point"], lo, hi).astype(dtype)
