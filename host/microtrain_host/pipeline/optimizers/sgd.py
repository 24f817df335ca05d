"""SGD as torch.optim.SGD: momentum, dampening, nesterov, weight decay coupled into the
gradient (L2). Plain SGD keeps no state; with momentum its state is momentum0, the buffer,
which starts as the first step's gradient (contract/facts.py OPTIMIZERS["SGD"]); the node is
lowered by ops/optim.py."""
from ...errors import ArtifactError
from ...graph import DOMAIN, trim
from ...ir import LEARNING_RATE, STEP


def check(options):
    if options["nesterov"] and (options["momentum"] <= 0 or options["dampening"] != 0):
        raise ArtifactError(f"nesterov=True needs momentum > 0 and dampening 0 (as in "
                            f"torch.optim.SGD); got momentum={options['momentum']!r}, "
                            f"dampening={options['dampening']!r}")


def update_node(g, p, grad, states, clip_coef, outputs, options, penalties):
    momentum = [STEP] + states if states else ["", ""]
    g.node("SGD", trim([LEARNING_RATE, p, grad] + momentum + [clip_coef]),
           [g.shape(p)] * len(outputs), outputs=outputs, domain=DOMAIN,
           momentum=options["momentum"], dampening=options["dampening"],
           nesterov=int(options["nesterov"]), weight_decay=options["weight_decay"],
           **penalties)
