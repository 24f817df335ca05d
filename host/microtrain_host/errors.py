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
