# InferenceSession: run an inference-only blob (Module.export_model_for_inferencing writes
# one) with the same reader and kernels as training. A board that only predicts needs this
# file, loader.py with its helpers and the kernel families the model uses - no module.py,
# checkpoint.py or optimizer.
from microtrain import blob as blobfile
from microtrain.feed import copy_inputs
from microtrain.loader import load_into_arenas
from microtrain.errors import BlobError, InputError

INFER_PROGRAM = "infer"


class InferenceSession:
    """InferenceSession(path): session.run(x) -> array('f') of the model's outputs.
    Named after onnxruntime.InferenceSession, but run() takes the inputs themselves. path
    may be the blob as a buffer; max_arena_bytes as for Module."""

    def __init__(self, path, max_arena_bytes=None):
        b, self.F, self.I = load_into_arenas(path, max_arena_bytes)
        if INFER_PROGRAM not in b.programs:
            raise BlobError("'%s' is not an inference blob (its programs: %s); write one with "
                            "Module.export_model_for_inferencing" % (blobfile.describe(path),
                                                                ", ".join(b.programs)))
        self.blob = b
        self._program = b.programs[INFER_PROGRAM]
        for tid in self._program.outputs:
            if b.dtypes[tid] != blobfile.FLOAT:
                # run() returns the outputs as float32 (an int8 blob's dequantized)
                raise BlobError("'%s': output '%s' of the inference program is not a float32 "
                                "tensor" % (blobfile.describe(path), b.names[tid]))
        self._view = memoryview(self.F)
        self._result = blobfile.zeros("f", sum(b.sizes[t] for t in self._program.outputs))
        self._result_view = memoryview(self._result)

    def input_names(self):
        return [self.blob.names[t] for t in self._program.inputs]

    def output_names(self):
        return [self.blob.names[t] for t in self._program.outputs]

    def output_shapes(self):
        return [self.blob.shapes[t] for t in self._program.outputs]

    def run(self, *inputs):
        """run(x) or run(x1, x2, ...): one flat row-major sequence per input, in
        input_names() order. Returns one array('f') holding the outputs one after another,
        in output_names() order (output_shapes() tells where each ends). The array is the
        session's own: the next run overwrites it (copy it to keep it)."""
        b = self.blob
        program = self._program
        if inputs and (inputs[0] is None or isinstance(inputs[-1], dict)):
            raise InputError("run() takes the inputs themselves, one flat sequence each in "
                             "input_names() order: run(x), not onnxruntime's "
                             "run(output_names, input_feed)")
        copy_inputs(b, self.F, self.I, program, inputs, 0)
        F = self.F
        I = self.I
        for kernel, args in program.steps:
            kernel(F, I, args)
        at = 0
        for tid in program.outputs:
            off, n = b.offsets[tid], b.sizes[tid]
            self._result_view[at:at + n] = self._view[off:off + n]
            at += n
        return self._result
