"""AdamW with ORT's defaults and rule (adam_mode=1, the Hugging Face rule, bias correction
on): m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
p -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps); p -= lr wd p.
Its states are momentum0 (m) and momentum1 (v) (contract/facts.py OPTIMIZERS["AdamW"]); the
node is lowered by ops/optim.py."""
from ...graph import DOMAIN, trim
from ...ir import LEARNING_RATE, STEP


def check(options):
    """Nothing beyond the contract's ranges."""


def update_node(g, p, grad, states, clip_coef, outputs, options, penalties):
    g.node("AdamW", trim([LEARNING_RATE, STEP, p, grad] + states + [clip_coef]),
           [g.shape(p)] * len(outputs), outputs=outputs, domain=DOMAIN,
           alpha=options["beta1"], beta=options["beta2"], epsilon=options["epsilon"],
           weight_decay=options["weight_decay"], correct_bias=int(options["bias_correction"]),
           **penalties)
