"""Parameters: which float initializers train and which stay frozen, with the rules and
errors of ORT's generate_artifacts (requires_grad / frozen_params)."""
from onnx import TensorProto

from ..errors import ArtifactError
from ..ops.norm import check_requires_grad, running_statistics


def split_parameters(model, requires_grad, frozen_params):
    """(trainable, frozen) parameter names in initializer order, with ORT's rules, except
    that BatchNormalization running statistics are frozen by default (ops/norm.py)."""
    floats = [i.name for i in model.graph.initializer if i.data_type == TensorProto.FLOAT]
    requires_grad = list(requires_grad) if requires_grad is not None else None
    frozen_params = list(frozen_params) if frozen_params is not None else None
    both = sorted(set(requires_grad or ()) & set(frozen_params or ()))
    if both:
        raise ArtifactError(f"parameter(s) {', '.join(both)} named in both requires_grad and "
                            f"frozen_params; a parameter is either trainable or frozen")
    for name in (requires_grad or []) + (frozen_params or []):
        if name not in floats:
            raise ArtifactError(f"'{name}' is not a float initializer of the model; parameters "
                                f"are: {', '.join(floats)}")
    check_requires_grad(model.graph, requires_grad or [])
    statistics = running_statistics(model.graph)
    trainable_by_default = [n for n in floats if n not in statistics]
    if requires_grad is None:
        requires_grad = [n for n in trainable_by_default if n not in set(frozen_params or ())]
    trainable = [n for n in floats if n in set(requires_grad)]
    frozen = [n for n in floats if n not in set(requires_grad)]
    if not trainable and trainable_by_default:
        raise ArtifactError("no trainable parameters: requires_grad is empty or every "
                            "parameter is frozen")
    # A model with no parameter to train at all (a Softmax, a pooling, a preprocessing net)
    # still packs: its blob runs the forward pass and the loss, and training changes nothing.
    return trainable, frozen
