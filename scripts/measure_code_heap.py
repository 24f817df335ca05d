"""Measure, on the emulated board, the heap the device package's code takes once imported:
every module of device/microtrain compiled with mpy-cross, imported (a) from .mpy files on
the board's littlefs (bytecode copied into the heap) and (b) from a ROMFS image (bytecode
run in place). Prints heap bytes per .mpy byte for each: the CODE_HEAP_PER_MPY_BYTE figures
of host/microtrain_host/tools/boards.py. The fit check applies them to a model's minimal
runtime, a different set of modules, and is checked against boards in
tests/test_board_qemu.py.

    python scripts/measure_code_heap.py     (after scripts/build_qemu_board.sh)
"""
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "device")]

from microtrain_host.tools import boards, deploy, runtime  # noqa: E402

PROBE = """
import gc, sys
gc.collect()
base = gc.mem_alloc()
for name in NAMES:
    __import__(name)
gc.collect()
print("code heap", gc.mem_alloc() - base)
"""


def measure(board, modules, placement, sources=None):
    """(.mpy bytes, heap bytes) of importing these device modules (relative paths) on the
    emulated board from its littlefs ("files") or a ROMFS image ("romfs"); sources: their
    text ({path: text}, e.g. runtime.minimal_sources()), else the package's."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        sizes = runtime.compile_runtime(sources or runtime.package_sources(modules),
                                        board["mpy_arch"], board["mpy_version"], tmp / "rt")
        names = [m[:-3].replace("/", ".").replace(".__init__", "") for m in modules]
        script = tmp / "probe.py"
        script.write_text(f"NAMES = {names!r}\n" + PROBE)
        args = [sys.executable, "-m", "mpremote", "connect", None, "exec", board["setup"], "+"]
        if placement == "romfs":
            (tmp / "image").write_bytes(runtime.romfs_image(tmp / "rt"))
            args += ["cp", str(tmp / "image"), ":microtrain.romfs", "+", "exec",
                     board["romfs_install"].format(image="microtrain.romfs"), "+"]
        else:
            args += ["cp", "-r", str(tmp / "rt" / "microtrain"), ":", "+"]
        args += ["run", str(script)]
        with deploy.QemuBoard() as qemu:
            args[4] = qemu.port
            out = subprocess.run(args, capture_output=True, text=True, timeout=300).stdout
        heap = int(out.split("code heap")[1].split()[0])
        return sum(sizes.values()), heap


def main():
    board = boards.load_board("qemu-mps2-an385")
    base = runtime.device_package_dir()
    modules = sorted(str(p.relative_to(base)) for p in (base / "microtrain").rglob("*.py")
                     if p.name not in ("fit.py",))  # fit.py runs a script when imported
    for placement in ("files", "romfs"):
        mpy, heap = measure(board, modules, placement)
        print(f"{placement:6s} {len(modules)} modules, {mpy} B of .mpy -> {heap} B of heap: "
              f"{heap / mpy:.3f} heap bytes per .mpy byte")


if __name__ == "__main__":
    main()
