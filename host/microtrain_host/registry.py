"""The op tables the pipeline's drivers read. The op families (`ops/<family>.py`) fill them
when they are imported (`microtrain_host/__init__.py` imports `ops`, which imports every
family): each family keeps an op's gradient rule, its lowering and the numpy references of
its gradient ops side by side, and registers them here with the decorators below (and
lowerings(), for ops whose lowerings differ only in their device op code).

  GRAD_RULES[op_type] = rule(g, node, dys, needs) -> [gradient name or None per input]
      (pipeline/autodiff.py walks the graph backwards and calls the rules)
  LOWERINGS[op_type] = lower(ctx, node)          emits device steps into a Lowering
      (pipeline/lower.py)
  reference ops: subclasses of reference.MicrotrainOp register themselves (reference.py)
"""
GRAD_RULES = {}
LOWERINGS = {}
SHAPED_LIKE_INPUT = set()   # op types whose output has their first input's shape, for the
                            # ones onnx's shape inference leaves unknown (pipeline/load.py)


def _register(table, kind, op_types, function):
    for op_type in op_types:
        if op_type in table:
            raise RuntimeError(f"two {kind}s for op '{op_type}': {table[op_type].__name__} and "
                               f"{function.__name__}")
        table[op_type] = function
    return function


def gradient(*op_types):
    """Decorator: the gradient rule of these op types."""
    return lambda rule: _register(GRAD_RULES, "gradient rule", op_types, rule)


def lowering(*op_types):
    """Decorator: the lowering of these op types (ONNX ops and our ai.microtrain ones)."""
    return lambda lower: _register(LOWERINGS, "lowering", op_types, lower)


def lowerings(make, codes):
    """Registers make(code) as the lowering of each op type in codes, {op type: device op
    code}: one lowering serves all of them but for the op code its steps carry."""
    for op_type, code in codes.items():
        lowering(op_type)(make(code))
