"""Exceptions of the host packager. One type per concern; messages name the node, tensor, shape."""


class MicrotrainHostError(Exception):
    """Base of every error the host packager raises on purpose."""


class ArtifactError(MicrotrainHostError, ValueError):
    """The model or the arguments cannot be turned into training artifacts."""


class UnsupportedOpError(ArtifactError):
    """An op, or an attribute combination of an op, that microtrain cannot train."""


class DynamicShapeError(ArtifactError):
    """A dimension is not fixed and no batch_size was given to fix it."""


class CheckpointError(MicrotrainHostError, ValueError):
    """A checkpoint file that cannot be read or written."""


# Messages name a node by its name. A node the model left unnamed is given its index in the
# graph as loaded ("#12") when the model is loaded (pipeline/load.py), so that messages can
# point at it (node #12 (SequenceConstruct)) instead of saying node ''.
UNNAMED_PREFIX = "#"


def node_name(node):
    """The node's name as messages write it: 'conv1' in quotes, or #12 for an unnamed node."""
    name = node.name
    if name.startswith(UNNAMED_PREFIX) and name[len(UNNAMED_PREFIX):].isdigit():
        return name
    return f"'{name}'"


def node_label(node):
    """node 'conv1' (Conv), or node #12 (SequenceConstruct) for an unnamed node."""
    return f"node {node_name(node)} ({node.op_type})"
