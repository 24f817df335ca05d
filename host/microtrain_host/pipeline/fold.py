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
# The largest output a folded node may have. A folded value becomes a constant of the blob,
# held by a microcontroller: 64 MiB is far past any board and far below what would exhaust
# the host (ConstantOfShape([1e9]) would allocate gigabytes before anything else refused it).
FOLD_LIMIT_BYTES = 64 * 2**20


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


def _planned_size(node, inputs, shapes):
    """(elements, bytes per element) of the node's largest output, as far as it is known
    before evaluating it: from shape inference, or, for the ops that make a large tensor from
    a small input, from that input's value. None when unknown."""
    sizes = []
    for output in node.output:
        elem_type, shape = shapes.get(output, (None, None))
        if elem_type and shape is not None and None not in shape:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
            sizes.append((int(np.prod(shape, dtype=object)), itemsize))
    values = [np.asarray(v) if v is not None else None for v in inputs]
    try:
        if node.op_type == "ConstantOfShape" and values and values[0] is not None:
            value = next((helper.get_attribute_value(a) for a in node.attribute
                          if a.name == "value"), None)
            itemsize = (np.dtype(helper.tensor_dtype_to_np_dtype(value.data_type)).itemsize
                        if value is not None else 4)
            sizes.append((int(np.prod([int(d) for d in values[0].ravel()], dtype=object)),
                          itemsize))
        elif node.op_type == "Expand" and len(values) > 1 and values[0] is not None \
                and values[1] is not None:
            shape = np.broadcast_shapes(values[0].shape, tuple(int(d) for d in values[1].ravel()))
            sizes.append((int(np.prod(shape, dtype=object)), values[0].itemsize))
        elif node.op_type == "Tile" and len(values) > 1 and values[0] is not None \
                and values[1] is not None:
            sizes.append((values[0].size * int(np.prod([int(r) for r in values[1].ravel()],
                                                       dtype=object)), values[0].itemsize))
        elif node.op_type == "Range" and len(values) == 3 and all(v is not None for v in values):
            start, limit, delta = (float(v) for v in values)
            if delta != 0 and np.isfinite([start, limit, delta]).all():
                sizes.append((max(0, int(np.ceil((limit - start) / delta))),
                              values[0].itemsize))
    except (ValueError, TypeError, OverflowError):
        pass  # shapes that do not broadcast, odd inputs: the evaluator names the problem
    if not sizes:
        return None
    return max(sizes, key=lambda size: size[0] * size[1])


def _check_size(node, inputs, shapes):
    size = _planned_size(node, inputs, shapes)
    if size is not None and size[0] * size[1] > FOLD_LIMIT_BYTES:
        elements, itemsize = size
        raise ArtifactError(
            f"{node.op_type} node '{node.name}' computes a constant of {elements:,} elements "
            f"({elements * itemsize / 2**20:,.1f} MiB); pack-time constant folding refuses "
            f"values over {FOLD_LIMIT_BYTES // 2**20} MiB (no microcontroller holds one)")


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
            inputs = [known.get(i) for i in node.input]
            _check_size(node, inputs, shapes)
            values = _evaluate(node, inputs, opsets)
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
