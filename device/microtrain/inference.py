# InferenceSession: run an inference-only blob (Module.export_model_for_inferencing writes
# one) with the same reader and kernels as training. A board that only predicts needs this
# file, blob.py with its helpers and the kernel families the model uses - no module.py,
# checkpoint.py or optimizer.
from array import array
from microtrain import blob as blobfile
from microtrain.errors import BlobError, InputError

INFER_PROGRAM = "infer"


class InferenceSession:
    """InferenceSession(path): session.run(x) -> array('f') of the model's outputs."""

    def __init__(self, path):
        data = blobfile.read(path)
        float_arena, int_arena = blobfile.arena_sizes(data)
        self.F = blobfile.zeros("f", float_arena)
        self.I = blobfile.zeros("i", int_arena)
        b = blobfile.parse(data)
        del data
        if INFER_PROGRAM not in b.programs:
            raise BlobError("'%s' is not an inference blob (its programs: %s); write one with "
                            "Module.export_model_for_inferencing" % (path, ", ".join(b.programs)))
        for tid, raw in b.constants:
            off = b.offsets[tid]
            self.F[off:off + b.sizes[tid]] = array("f", raw)
        b.constants = None  # copied into the arena: let the GC have the raw bytes
        self.blob = b
        self._program = b.programs[INFER_PROGRAM]
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
        if len(inputs) != len(program.inputs):
            raise InputError("the model takes %d inputs (%s), got %d"
                             % (len(program.inputs), ", ".join(self.input_names()), len(inputs)))
        for tid, values in zip(program.inputs, inputs):
            off, n = b.offsets[tid], b.sizes[tid]
            if len(values) != n:
                raise InputError("input '%s' needs %d values (shape %r), got %d"
                                 % (b.names[tid], n, b.shapes[tid], len(values)))
            arena = self.I if b.dtypes[tid] == blobfile.INT32 else self.F
            for i in range(n):
                arena[off + i] = values[i]
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
