# Kernel families. Every kernel has the signature kernel(F, I, args): F is the float32
# arena, I the int32 arena, args the tuple (tensor offsets..., ints..., floats...) the
# reader built from the step. Kernels trust their arguments: the reader validated them.
