"""Mutation fuzzing in the suite (seeded, a few hundred mutations per file and interpreter;
scripts/fuzz.py runs tens of thousands): every blob or checkpoint mutated with its CRC-32
recomputed must load and train, or be refused with microtrain's own error — no crash, no
hang, no non-finite state after a mutation that loaded and trained, and no arena larger
than the unmutated file's. The float models, and (issue 21) an int8 inference blob run by
InferenceSession and an integer-training blob and its checkpoint (with momentum
velocities)."""
import pytest

import fuzzing

COUNTS = {"cpython": 400, "micropython": 150}
INT_COUNTS = {"cpython": 300, "micropython": 100}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return fuzzing.make_artifacts(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(scope="module")
def int_artifacts(tmp_path_factory):
    return fuzzing.make_int_artifacts(tmp_path_factory.mktemp("fuzz_int"))


def _check(directory, kind, interpreter, count, request):
    binary = "cpython" if interpreter == "cpython" else request.getfixturevalue("micropython")
    # a chunk of 100 mutations that has not answered in 600 s is a hang (a wall-clock bound:
    # 120 s was once passed on a machine loaded 4 processes per core)
    outcomes, examples, arena = fuzzing.fuzz(binary, directory, kind, seed=2026, count=count,
                                             chunk_timeout=600)
    print(directory.name, kind, interpreter, dict(outcomes))
    bad = fuzzing.failures(outcomes)
    assert not bad, {key: "mutations %s" % examples[key][:10] for key in bad}
    assert arena[0] <= arena[1]
    # Not vacuous: some mutations get past the structural checks, some are refused.
    assert outcomes["trained"] > 0 and sum(outcomes.values()) - outcomes["trained"] > 0


@pytest.mark.parametrize("kind", ["blob", "checkpoint"])
@pytest.mark.parametrize("model", ["mlp", "cnn", "rnn", "decoder"])
@pytest.mark.parametrize("interpreter", ["cpython", "micropython"])
def test_mutations_load_and_train_or_are_refused(artifacts, model, kind, interpreter, request):
    _check(artifacts[model], kind, interpreter, COUNTS[interpreter], request)


@pytest.mark.parametrize("model,kind", [("int8", "inference"), ("inttrain", "blob"),
                                        ("inttrain", "checkpoint")])
@pytest.mark.parametrize("interpreter", ["cpython", "micropython"])
def test_int8_mutations_run_or_train_or_are_refused(int_artifacts, model, kind, interpreter,
                                                    request):
    _check(int_artifacts[model], kind, interpreter, INT_COUNTS[interpreter], request)
