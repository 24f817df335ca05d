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
(quant/intloss.py, kernels/intloss.py) the last Gemm trains against a target in place of
the labels: model(x_int8, target), or model(x_int8) when the input is its own target."""
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
from ..pipeline.plan import assign_offsets
from .int8 import int8_graph
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
    if len(quant) != 1 or any(g.input[0].name in n.input for n in g.node if n is not quant[0]):
        raise UnsupportedOpError("integer training: the input must be read only by its "
                                 "QuantizeLinear (the device is fed quantized inputs)")
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


def _conv_chain(fused, gemm):
    """The QLinearConv nodes from the network's input to the GlobalAveragePool feeding the
    classifier, in order (each read only by the next), or an UnsupportedOpError naming the
    node that breaks the chain (the integer backward handles convolutions with their fused
    ReLU / Clip and the GlobalAveragePool only)."""
    producers, readers, node = _behind_views(fused, gemm)
    if node is None or node.op_type != "QLinearGlobalAveragePool":
        raise UnsupportedOpError("integer sparse update: the classifier's input must be a "
                                 "GlobalAveragePool of a convolution's output")
    chain = []
    node = producers.get(node.input[0])
    while node is not None and node.op_type == "QLinearConv":
        if len(readers.get(node.output[0], [])) != 1:
            raise UnsupportedOpError(f"integer sparse update: the output of node "
                                     f"'{node.name}' is read by more than one node")
        chain.insert(0, node)
        node = producers.get(node.input[0])
    if not chain:
        raise UnsupportedOpError("integer sparse update: no convolution before the "
                                 "GlobalAveragePool")
    if node is not None and node.op_type != "Quantize":
        raise UnsupportedOpError(f"integer sparse update: node '{node.name}' "
                                 f"({node.op_type}) before the convolutions has no integer "
                                 f"backward (convolutions, their ReLU / Clip and the "
                                 f"GlobalAveragePool have)")
    return chain


def _sparse_nodes(fused, gemm, frozen, inits, params, quantization, inputs, taken,
                  train_biases, train_weights, train_depthwise, stochastic):
    """The integer backward of the sparse update (MIT's: biases everywhere, weights of the
    last block): from the classifier input's gradient through the GlobalAveragePool and
    the convolutions, down to the first one (train_biases) or to the last block's
    depthwise conv. Every convolution it passes trains its bias; the last one (pointwise)
    its weights with train_weights, the one before it (depthwise) with train_depthwise.
    Returns (the frozen nodes with the trained convolutions reading their parameters, the
    backward nodes, {conv node name: its IntClampMask node}, which the train graph runs
    right after the conv); fills params, quantization, inputs and taken."""
    chain = _conv_chain(fused, gemm)
    if train_depthwise:
        train_weights = True
        if len(chain) < 2 or attr(chain[-2], "group", 1) == 1:
            raise UnsupportedOpError("integer training of the last depthwise convolution: "
                                     "the convolution before the last one is not grouped")
    low = 0 if train_biases else len(chain) - (2 if train_depthwise else 1)
    weights = {len(chain) - 1} if train_weights else set()
    if train_depthwise:
        weights.add(len(chain) - 2)
    replaced = {}
    masks = {}
    nodes = []
    grad = "intgrad.grad.%d" % (len(chain) - 1)
    nodes.append(helper.make_node("IntPoolGrad", [FEATURE_GRAD, chain[-1].output[0]], [grad],
                                  name=gemm.name + ".pool_grad", domain=DOMAIN))
    for index in range(len(chain) - 1, low - 1, -1):
        conv = chain[index]
        w = inits[conv.input[1]]
        channels = w.shape[0]
        if len(conv.input) < 3 or not conv.input[2]:
            raise UnsupportedOpError(f"integer sparse update: node '{conv.name}' has no bias")
        b_name = _param_name(conv.input[2], conv.name + ".bias")
        params[b_name] = inits[conv.input[2]].astype(np.int32)
        inputs.append(helper.make_tensor_value_info(b_name, TensorProto.INT32, [channels]))
        taken.add(conv.input[2])
        w_name = conv.input[1]
        if index in weights:
            w_name = _param_name(conv.input[1], conv.name + ".weight")
            params[w_name] = w
            scales = [float(v) for v in attr(conv, "w_scales")]
            quantization[w_name] = (scales * channels if len(scales) == 1 else scales,
                                    [0] * channels, 0)
            inputs.append(helper.make_tensor_value_info(w_name, TensorProto.INT8,
                                                        list(w.shape)))
            taken.add(conv.input[1])
        trained = helper.make_node(conv.op_type, [conv.input[0], w_name, b_name],
                                   list(conv.output), name=conv.name, domain=conv.domain)
        trained.attribute.extend(conv.attribute)
        replaced[id(conv)] = trained
        masked = grad + ".masked"
        masks[conv.name] = helper.make_node("IntClampMask", [conv.output[0], conv.input[0]],
                                            [conv.output[0] + ".mask"],
                                            name=conv.name + ".mask", domain=DOMAIN,
                                            conv=conv.name)
        nodes.append(helper.make_node(
            "IntClampBiasGrad", [grad, conv.output[0], conv.output[0] + ".mask", b_name,
                                 w_name],
            [masked, b_name + ".updated"], name=conv.name + ".bias_grad", domain=DOMAIN,
            conv=conv.name, stochastic=int(bool(stochastic))))
        geometry = [a for a in conv.attribute if a.name in
                    ("kernel_shape", "strides", "pads", "dilations", "group")]
        if index > low:
            grad = "intgrad.grad.%d" % (index - 1)
            node = helper.make_node("IntConvGradInput", [masked, w_name, conv.input[0]],
                                    [grad], name=conv.name + ".grad_input", domain=DOMAIN)
            node.attribute.extend(geometry)
            nodes.append(node)
        if index in weights:
            node = helper.make_node("IntConvUpdate", [w_name, conv.input[0], masked],
                                    [w_name + ".updated"], name=conv.name + ".update",
                                    domain=DOMAIN, stochastic=int(bool(stochastic)))
            node.attribute.extend(geometry)
            nodes.append(node)
    return [replaced.get(id(n), n) for n in frozen], nodes, masks


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
                        keep_classes=None, loss="cross_entropy", target=None):
    """(train graph, eval graph, roles, quantization, parameters {name: array}, info).
    loss: a name of INTEGER_LOSSES; target (mse): None, a target input quantized with the
    output's scale and zero point, or "input": the model's own quantized input is the
    target (an autoencoder: the device is called model(x)).
    train_conv: also train the 1x1 convolution before the GlobalAveragePool (weights and
    bias) from the classifier's input gradient. train_biases / train_depthwise: the
    integer backward through the convolutions (ops/intgrad.py, _sparse_nodes).
    max_classes / keep_classes: see _class_slots."""
    check_loss(loss, {"train_conv": train_conv, "train_biases": train_biases,
                      "train_depthwise": train_depthwise, "max_classes": max_classes is not None,
                      "keep_classes": keep_classes is not None})
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
    if train_biases or train_depthwise:
        frozen, sparse, masks = _sparse_nodes(fused, gemm, frozen, inits, params, quantization,
                                       inputs, taken, train_biases, train_conv,
                                       train_depthwise, stochastic)
        conv_nodes = [helper.make_node("IntGemmGradInput", [GRAD, w_name], [FEATURE_GRAD],
                                       name=gemm.name + ".grad_input", domain=DOMAIN)] + sparse
    elif train_conv:
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
    keep = [i for i in g.initializer if i.name not in taken]
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
                            loss="cross_entropy", target=None):
    """Write int8_train.mtb, int8_train.ckpt and int8_train.json into out_dir (see the
    module docstring); returns the info dict (with the three paths). stochastic: round the
    weight steps stochastically (default; steps below half a quantum would otherwise be
    lost) or half to even. train_conv: also train the 1x1 convolution before the
    GlobalAveragePool feeding the classifier (the last pointwise conv of a DS-CNN).
    momentum: SGD momentum (torch's rule, dampening 0) of the classifier, in [0, 1): an
    int16 velocity per weight (2 bytes) and an int32 one per bias, kept in the arenas; the
    device saves them with the optimizer state (momentum0 of the parameter, ONNX INT16 /
    INT32; device checkpoint.py), the checkpoint written here has none (zero velocities).
    train_biases: also train the int32 bias of every convolution (the integer backward
    through the frozen int8 convolutions, their ReLU and the GlobalAveragePool:
    ops/intgrad.py); train_depthwise: also train the int8 weights of the last block's
    depthwise convolution (and so its pointwise one: train_conv). With either, the
    convolutions train through kernels/intgrad.py (the last pointwise conv's weights when
    train_conv), every convolution the backward passes training its bias; the model is
    then a chain of convolutions (with their fused ReLU / Clip) into a GlobalAveragePool
    and the classifier, as a DS-CNN. The classifier's momentum applies to it only.
    max_classes: the classifier's room for classes added on the device (continual
    learning); keep_classes: how many of the model's classes stay in use (default all; 0:
    every slot starts unused). See _class_slots.
    loss: "cross_entropy" (the classifier), "mse" or "bce_with_logits" (ops/intloss.py: the
    last Gemm only; the device is called model(x, target), target the output's size: mse
    int8 / uint8 quantized with the output's scale and zero point (quantize_target), bce
    int32 probabilities in Q14; mse with target="input": model(x), the input its own
    target, an autoencoder's); any other loss is refused, named."""
    if not 0.0 <= float(momentum) < 1.0:
        raise ArtifactError(f"momentum {momentum!r} must lie in [0, 1)")
    if not (0.0 < float(learning_rate) < 3e38):
        raise ArtifactError(f"learning rate {learning_rate!r} must be positive and finite")
    train, evaluate, roles, quantization, params, info = int8_training_model(
        qdq_model, stochastic, train_conv, momentum, train_biases, train_depthwise,
        max_classes, keep_classes, loss, target)
    lowering = Lowering(roles)
    lowering.quantization = quantization
    lowering.lower("train", train)
    lowering.lower("eval", evaluate)
    parameters = [(lowering.persistent[name], -1, (), False) for name in params]
    data = serialize(lowering, parameters, assign_offsets(lowering), INTEGER_LOSSES[loss][1],
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
