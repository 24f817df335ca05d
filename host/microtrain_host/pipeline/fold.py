"""Constant folding on the host: the shape arithmetic of torch exports becomes constants.

torch.onnx writes `x.view(x.size(0), -1)`, `F.pad`, `expand` and friends as small graphs of
Shape, Gather, Unsqueeze, Concat, Cast, ConstantOfShape, Range... Once load_model has fixed
every shape these graphs compute the same values on every step, so they are evaluated here,
once, with the ONNX reference evaluator, and every folded node becomes a Constant node; the
device never sees them.

What counts as known: Constant nodes, integer and bool initializers, and the output of
Shape / Size of any tensor whose shape is static. Float initializers are parameters
(trainable or frozen, ORT's rule), so nothing that reads one is ever folded: the value a
parameter has at export time is not the value it has after training."""
import numpy as np
from onnx import AttributeProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ..errors import ArtifactError, node_name

# Ops whose output is not a function of their inputs' values.
NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                "Multinomial", "Bernoulli", "Dropout"}


def _shape_value(node, shape):
    # Shape (with optional start / end, opset 15) and Size read only the static shape.
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.array(shape[slice(start, end)], dtype=np.int64)


def _evaluate(node, inputs, opset_imports):
    """Run one node on known numpy inputs with the ONNX reference evaluator."""
    names = [f"in{i}" if name else "" for i, name in enumerate(node.input)]
    single = helper.make_node(node.op_type, names, list(node.output), domain=node.domain)
    single.attribute.extend(node.attribute)
    graph = helper.make_graph(
        [single], "fold",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in zip(names, inputs) if n],
        [helper.make_empty_tensor_value_info(o) for o in node.output if o])
    model = helper.make_model(graph, opset_imports=opset_imports)
    feeds = {n: v for n, v in zip(names, inputs) if n}
    try:
        return ReferenceEvaluator(model).run(None, feeds)
    except Exception as e:  # the evaluator raises many types; name the node instead
        raise ArtifactError(f"cannot fold {node.op_type} node {node_name(node)} over constant "
                            f"inputs: {e}") from e


def _constant_node(name, output, value):
    return helper.make_node("Constant", [], [output], name=name,
                            value=numpy_helper.from_array(np.asarray(value), output))


def fold_constants(model, shapes):
    """Replace every node computable on the host by Constant nodes, in place, and drop the
    Constants nothing reads any more. shapes: {name: (elem_type, shape)} from shape
    inference (None for a dimension that is not fixed). Returns how many nodes were folded."""
    graph = model.graph
    opsets = list(model.opset_import)
    known = {i.name: numpy_helper.to_array(i) for i in graph.initializer
             if np.dtype(helper.tensor_dtype_to_np_dtype(i.data_type)).kind in "iub"}
    nodes, folded = [], 0
    for node in graph.node:
        values = None
        if (node.domain not in ("", "ai.onnx") or node.op_type in NOT_FOLDABLE
                or any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)
                       for a in node.attribute)):
            pass  # other domains, randomness and subgraphs (If, Loop) stay as they are
        elif node.op_type in ("Shape", "Size"):
            shape = shapes.get(node.input[0], (None, None))[1]
            if shape is not None and all(d is not None for d in shape):
                values = [_shape_value(node, shape)]
        elif all(not i or i in known for i in node.input):
            values = _evaluate(node, [known.get(i) for i in node.input], opsets)
        if values is None:
            nodes.append(node)
            continue
        outputs = [o for o in node.output if o]
        for output, value in zip(outputs, values):
            known[output] = np.asarray(value)
        if node.op_type == "Constant":
            nodes.append(node)
            continue
        folded += 1
        for k, output in enumerate(outputs):
            nodes.append(_constant_node(node.name if k == 0 else f"{node.name}_{k}", output,
                                        known[output]))
    read = {i for n in nodes for i in n.input} | {o.name for o in graph.output}
    kept = [n for n in nodes if n.op_type != "Constant" or any(o in read for o in n.output)]
    del graph.node[:]
    graph.node.extend(kept)
    return folded
