"""Op families: one module per family, named like its device kernel module
(device/microtrain/kernels/<family>.py). Each holds its ops' gradient rules, lowerings and the
numpy references of its gradient ops, registered into registry.py's tables (and reference.OPS)
by being imported here. `windows.py` is geometry shared by conv and pool."""
from . import (activation, conv, dense, elementwise, gather, group_norm, layout, loss,  # noqa: F401
               intflow, intgrad, intlookup, intloss, inttrain, norm, optim, pool, qlinear,
               quant, recurrent, reduce, resize, smooth)
