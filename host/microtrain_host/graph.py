"""A small builder for ONNX graphs that records the shape of everything it emits, the
helpers the gradient rules of the op families share (unbroadcast, reshaped), and the readers
of ONNX nodes and graphs that the lowerings and graph rewrites share (attr, optional_input,
links)."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

DOMAIN = "ai.microtrain"   # gradient and optimizer helpers ONNX lacks (like ORT's com.microsoft)
DOMAIN_VERSION = 1


def attr(node, name, default=None):
    """A node attribute's value (strings decoded to str), or default when it is absent."""
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def optional_input(node, index):
    """The node's input `index`, or None when it is absent (left out, or named "")."""
    return node.input[index] if len(node.input) > index and node.input[index] else None


def links(nodes):
    """(producers, consumers) of a graph's nodes: the node that writes each tensor name, and
    the nodes that read it, in graph order."""
    producers = {o: n for n in nodes for o in n.output}
    consumers = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    return producers, consumers


class GraphBuilder:
    def __init__(self, shapes):
        self.shapes = dict(shapes)        # name -> (elem_type, shape tuple)
        self.nodes = []
        self.initializers = []
        self._names = set(shapes)
        self.values = {}                  # name -> numpy value of every known constant
        self.parameters = set()           # of those, the model's parameters: their values
                                          # change on the device (trained, or copied in)

    def fresh(self, hint):
        name, i = hint, 1
        while name in self._names:
            i += 1
            name = f"{hint}_{i}"
        self._names.add(name)
        return name

    def node(self, op_type, inputs, shape, *, domain="", outputs=None, elem_type=TensorProto.FLOAT,
             hint=None, **attrs):
        """Append a node; returns its output name (or names when outputs is a list)."""
        if outputs is None:
            outputs = [self.fresh(hint or f"{op_type}_out")]
            single = True
        else:
            single = False
        for out in outputs:
            if out:
                self._names.add(out)
        shapes = shape if isinstance(shape, list) else [shape]
        for out, s in zip(outputs, shapes):
            if out and s is not None:
                self.shapes[out] = (elem_type, tuple(s))
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=self.fresh(
            f"{hint or op_type}_node"), domain=domain, **attrs))
        return outputs[0] if single else outputs

    def constant(self, hint, value):
        """A constant as an initializer; returns its name."""
        value = np.asarray(value)
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(value, name))
        self.shapes[name] = (helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
        self.values[name] = value
        return name

    def constant_value(self, name):
        return self.values.get(name)

    def shape(self, name):
        return self.shapes[name][1]

    def value_infos(self, names):
        return [helper.make_tensor_value_info(n, self.shapes[n][0], list(self.shapes[n][1]))
                for n in names]


def unbroadcast(g, dy, in_shape):
    """Sum dy over the dimensions along which an input of in_shape was broadcast."""
    out_shape = g.shape(dy)
    in_shape = tuple(in_shape)
    if out_shape == in_shape:
        return dy
    lead = len(out_shape) - len(in_shape)
    axes = [i for i in range(len(out_shape))
            if i < lead or (in_shape[i - lead] == 1 and out_shape[i] != 1)]
    kept = tuple(1 if i in axes else d for i, d in enumerate(out_shape))
    summed = g.node("ReduceSum", [dy, g.constant("axes", np.array(axes, dtype=np.int64))],
                    kept, hint="unbroadcast", keepdims=1)
    if kept == in_shape:
        return summed
    return g.node("Reshape", [summed, g.constant("shape", np.array(in_shape, dtype=np.int64))],
                  in_shape, hint="unbroadcast_reshape")


def reshaped(g, name, shape, hint):
    """name with another shape (a free alias on the device), or name itself."""
    shape = tuple(shape)
    if tuple(g.shape(name)) == shape:
        return name
    return g.node("Reshape", [name, g.constant("shape", np.array(shape, np.int64))], shape,
                  hint=hint)


def trim(inputs):
    """ONNX leaves out trailing optional inputs rather than naming them ""."""
    while inputs and not inputs[-1]:
        inputs = inputs[:-1]
    return inputs
