"""Mutation fuzzing in the suite (seeded, a few hundred mutations per file and interpreter;
scripts/fuzz.py runs tens of thousands): every blob or checkpoint mutated with its CRC-32
recomputed must load and train, or be refused with microtrain's own error — no crash, no
hang, and no arena larger than the unmutated file's."""
import pytest

import fuzzing

COUNTS = {"cpython": 400, "micropython": 150}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return fuzzing.make_artifacts(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("kind", ["blob", "checkpoint"])
@pytest.mark.parametrize("model", ["mlp", "cnn", "rnn", "decoder"])
@pytest.mark.parametrize("interpreter", ["cpython", "micropython"])
def test_mutations_load_and_train_or_are_refused(artifacts, model, kind, interpreter, request):
    binary = "cpython" if interpreter == "cpython" else request.getfixturevalue("micropython")
    outcomes, examples, arena = fuzzing.fuzz(binary, artifacts[model], kind, seed=2026,
                                             count=COUNTS[interpreter], chunk_timeout=120)
    print(model, kind, interpreter, dict(outcomes))
    bad = fuzzing.failures(outcomes)
    assert not bad, {key: "mutation %d" % examples[key] for key in bad}
    assert arena[0] <= arena[1]
    # Not vacuous: some mutations get past the structural checks, some are refused.
    assert outcomes["trained"] > 0 and sum(outcomes.values()) - outcomes["trained"] > 0
