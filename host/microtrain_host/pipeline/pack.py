"""Pack: lower the three graphs, make the memory moves, plan the arenas, write the blob.

The last stage of the pipeline. `lower_and_plan` does everything but writing (what the
artifacts step also uses for the figures of a fully trained variant); `blob_bytes` adds the
inference template and serializes (formats/blob.py)."""
import ast
import dataclasses
import os

from ..errors import ArtifactError
from ..formats.blob import serialize
from ..formats.files import write_atomically
from ..ir import LAZY_RESET_GRAD, LEARNING_RATE, STEP_SIZE, grad_buffer, state_name
from . import inference
from .lower import Lowering, meta_names, roles_from_metadata
from .moves import mask_relus, place_updates, recompute_activations, split_program
from .optimizers import OptimType, optimizer_kind, state_names
from .plan import assign_offsets

# The programs of one training step: "train", or "forward" + "backward" when the loss is
# computed outside the graph; with update_in_backward "train" (forward pass and loss) +
# "backward_update" (the backward pass with the updates in it) and no "optimizer".
TRAINING_PROGRAMS = ("train", "forward", "backward", "backward_update")


def _forward_node_names(training_model, count):
    # The training graph starts with the forward pass (model and loss nodes), named as the
    # lowering names steps.
    return {n.name or n.op_type for n in training_model.graph.node[:count]}


# Step arguments (offsets, counts, strides) are int32 in the blob and element indices on
# the device: no tensor and no arena may hold more elements than an int32 can count.
MAX_ELEMENTS = 2**31 - 1


def _check_limits(lowering, sizes):
    for t in lowering.tensors:
        if t.size > MAX_ELEMENTS:
            raise ArtifactError(f"tensor '{t.name}' has {t.size} elements (shape "
                                f"{list(t.shape)}); a blob holds at most 2**31 - 1 = "
                                f"{MAX_ELEMENTS} elements per tensor")
    for arena, kind in zip(sizes[:2], ("float", "int")):
        if arena > MAX_ELEMENTS:
            raise ArtifactError(f"the {kind} arena would need {arena} elements; a blob holds "
                                f"at most 2**31 - 1 = {MAX_ELEMENTS} elements per arena")


@dataclasses.dataclass
class Planned:
    """A lowered, planned training blob before it is written."""
    lowering: Lowering
    sizes: tuple            # (float arena, int arena, naive size, lower bound)
    meta: dict              # the training graph's metadata (microtrain.*)
    optimizer: OptimType | None
    options: dict | None
    int8_template: object   # what int8_export returned: a QAT blob's int8 template
                            # lowering, template(training lowering), or None

    @property
    def steps(self):
        """Steps of one training step (train, or forward + backward, ...)."""
        return sum(len(self.lowering.programs[p].steps) for p in TRAINING_PROGRAMS
                   if p in self.lowering.programs)


def pack(training_model, eval_model, optimizer_model, path, optimizer_options=None,
         full_training=(0, 0), int8_export=None):
    """Lower the graphs, plan the arenas and write the blob to path (see blob_bytes)."""
    write_blob(path, blob_bytes(training_model, eval_model, optimizer_model, optimizer_options,
                                full_training, int8_export))


def write_blob(path, data):
    try:
        write_atomically(os.fspath(path), data)
    except OSError as e:
        raise ArtifactError(f"cannot write blob '{path}': {e}") from e


def lower_and_plan(training_model, eval_model, optimizer_model, optimizer_options=None,
                   int8_export=None):
    """The three graphs lowered (memory moves made) and planned: a Planned. int8_export(
    lowering, eval_model): lowers the program that exports a QAT blob as int8 and returns
    the lowering of its int8 inference template, or None for another blob
    (quant/qat_export.py lower_export, which the artifacts step passes)."""
    roles, meta = roles_from_metadata(training_model, optimizer_model)
    lowering = Lowering(roles)
    output_grads = meta_names(meta, "output_grads")
    in_backward = meta.get("microtrain.update_in_backward") == "1"
    training = "forward_backward" if output_grads else "train"
    lowering.lower(training, training_model)
    forward_count = int(meta.get("microtrain.forward_nodes", len(eval_model.graph.node)))
    forward_nodes = _forward_node_names(training_model, forward_count)
    if meta.get("microtrain.recompute") == "1":
        mask_relus(lowering.programs[training], lowering, forward_nodes)
        recompute_activations(lowering.programs[training], lowering, forward_nodes)
    if in_backward:  # after recomputing: a recomputed step may read a parameter
        place_updates(lowering.programs["train"], lowering.tensors)
    lowering.lower("eval", eval_model)
    optimizer = None
    opt_meta = ({p.key: p.value for p in optimizer_model.metadata_props}
                if optimizer_model is not None else meta)
    if "microtrain.optimizer" in opt_meta:
        optimizer = OptimType[opt_meta["microtrain.optimizer"]]
        if optimizer_options is None:
            optimizer_options = dict(ast.literal_eval(opt_meta["microtrain.options"]))
    if optimizer_model is not None:
        lowering.lower("optimizer", optimizer_model)
    int8 = int8_export(lowering, eval_model) if int8_export is not None else None
    lowering.control(LAZY_RESET_GRAD)
    lowering.control(LEARNING_RATE)
    if optimizer is not None and optimizer_kind(optimizer).step_size:
        lowering.control(STEP_SIZE)
    sizes = assign_offsets(lowering)
    _check_limits(lowering, sizes)
    if output_grads:
        # Planned as one timeline, then split: the activations backward reads survive
        # between the two calls, and the outputs stay valid until the end of backward.
        split_program(lowering.programs, "forward_backward", forward_nodes, "forward",
                      "backward", [lowering.persistent[name] for name in output_grads])
    elif in_backward:
        # The loss is known before any update: the Module checks it between the two.
        split_program(lowering.programs, "train", forward_nodes, "train", "backward_update")
    return Planned(lowering, sizes, meta, optimizer, optimizer_options, int8)


def blob_bytes(training_model, eval_model, optimizer_model, optimizer_options=None,
               full_training=(0, 0), int8_export=None):
    """The blob of the three graphs: lowered, planned and serialized. full_training: (float
    arena, train steps) of the same model with every parameter trained, recorded so that
    inspect can show what freezing parameters saved. int8_export: see lower_and_plan."""
    planned = lower_and_plan(training_model, eval_model, optimizer_model, optimizer_options,
                             int8_export)
    lowering, meta, optimizer, options = (planned.lowering, planned.meta, planned.optimizer,
                                          planned.options)
    template = inference.inference_template(
        eval_model, lowering.roles, lowering,
        lambda infer, regions: serialize(infer, [], assign_offsets(infer), "", 0, None, None,
                                         regions=regions,
                                         share_quantization=planned.int8_template is None),
        planned.int8_template)
    in_backward = meta.get("microtrain.update_in_backward") == "1"
    trainable = set(meta_names(meta, "trainable"))
    parameters = []
    for name in meta_names(meta, "params"):
        tid = lowering.persistent[name]
        grad = lowering.persistent.get(grad_buffer(name), -1) if name in trainable else -1
        states = [lowering.persistent[state_name(name, s)]
                  for s in state_names(optimizer, options)] \
            if optimizer is not None and name in trainable else []
        parameters.append((tid, grad, states, in_backward and name in trainable))
    return serialize(lowering, parameters, planned.sizes, meta.get("microtrain.loss", ""),
                     int(meta.get("microtrain.num_classes", "0") or 0),
                     optimizer.name if optimizer is not None else None, options,
                     full_training, template, int(meta.get("microtrain.source_opset", "0")))
