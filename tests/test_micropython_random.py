"""tests/micropython_random.py (MicroPython's `random` for CPython, which re-makes the board
scripts' cases on the host) draws what the MicroPython Unix port's `random` draws: the
same words, bits, ints, ranges and choices after each of several seeds."""
import sys

from conftest import ROOT, run_micropython

DRAWS = """
import random
out = []
for s in (0, 1, 5, 11, 24, 0xFFFFFFFF, 123456789, 1 << 31):
    random.seed(s)
    for k in range(33):
        out.append(random.getrandbits(k))
    for i in range(150):
        out.append(random.randint(-(1 << 29), 1 << 29))
        out.append(random.randint(0, i))
        out.append(random.choice((0, 127, 128, 255, 7)))
        out.append(random.randrange(i + 1))
        out.append(random.randrange(-5, i + 3))
        out.append(random.randrange(i + 50, -3, -7))
        out.append(random.randrange(3, 100, 4))
print(len(out), sum(out), out[40:60])
"""


def test_micropython_random_draws_what_the_unix_port_draws(micropython, tmp_path):
    import subprocess
    script = tmp_path / "draws.py"
    script.write_text(DRAWS)
    board = run_micropython(micropython, script)
    host = subprocess.run([sys.executable, "-c", "import sys, micropython_random\n"
                           "sys.modules['random'] = micropython_random\n"
                           f"exec(open({str(script)!r}).read())"],
                          capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT / "tests")}).stdout
    assert int(board.split()[0]) == 8 * (33 + 7 * 150)
    assert host == board
