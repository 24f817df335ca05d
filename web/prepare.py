"""Lay out what the browser page and train_node.mjs load into MicroPython's WebAssembly port:

    python web/prepare.py [--out web/dist] [--artifacts DIR] [--model ONNX] [--data NPZ]

Writes OUT/device/microtrain/** (the device package), OUT/artifacts/{model.mtb,checkpoint}
(`microtrain pack MODEL --batch-size 8`, or copied from --artifacts), OUT/data/*.f32|i32
(the raw files microtrain.fit reads), OUT/trainer.py and OUT/manifest.json (the file list)."""
import argparse
import json
import pathlib
import shutil
import sys
import tempfile

WEB = pathlib.Path(__file__).resolve().parent
ROOT = WEB.parent
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "device")]

from microtrain import blob as device_blob  # noqa: E402
from microtrain import parser as device_blob_parser
from microtrain_host import cli  # noqa: E402
from microtrain_host.tools.train import load_data, write_device_data  # noqa: E402

DIGITS = ROOT / "examples" / "digits"
HEAP_BYTES = 8 * 1024 * 1024    # data (≈0.5 MB of floats) + arena + bytecode, with room
LEARNING_RATE = 0.01            # `microtrain train`'s default


def pack(model, directory):
    status = cli.main(["pack", str(model), "-o", str(directory), "--batch-size", "8"])
    if status:
        raise SystemExit(f"microtrain pack {model} failed ({status})")


def prepare(out, artifacts=None, model=DIGITS / "mlp.onnx", data=DIGITS / "digits.npz"):
    out = pathlib.Path(out)
    if out.exists():
        if any(out.iterdir()) and not (out / "manifest.json").is_file():
            raise SystemExit(f"{out} is not empty and not an earlier prepare.py output: "
                             f"not overwriting it")
        shutil.rmtree(out)
    (out / "artifacts").mkdir(parents=True)
    (out / "data").mkdir()
    with tempfile.TemporaryDirectory(prefix="microtrain-web-") as tmp:
        source = pathlib.Path(artifacts) if artifacts else pathlib.Path(tmp)
        if not artifacts:
            pack(model, source)
        for name in ("model.mtb", "checkpoint"):
            if not (source / name).is_file():
                raise SystemExit(f"{source}/{name} missing: give --artifacts the directory "
                                 f"`microtrain pack` wrote")
            shutil.copyfile(source / name, out / "artifacts" / name)
    blob = device_blob_parser.load(str(out / "artifacts" / "model.mtb"))
    write_device_data(str(out / "data"), blob, *load_data(data))
    # kernels/native: machine code for boards; the WebAssembly port loads no native module
    shutil.copytree(ROOT / "device" / "microtrain", out / "device" / "microtrain",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "native"))
    shutil.copyfile(WEB / "trainer.py", out / "trainer.py")
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    manifest = {"files": files, "heap_bytes": HEAP_BYTES, "lr": LEARNING_RATE}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(WEB / "dist"))
    parser.add_argument("--artifacts", help="packed artifact directory (default: pack --model)")
    parser.add_argument("--model", default=str(DIGITS / "mlp.onnx"))
    parser.add_argument("--data", default=str(DIGITS / "digits.npz"))
    args = parser.parse_args()
    out = prepare(args.out, args.artifacts, args.model, args.data)
    print(f"wrote {out}/ (serve web/: python3 -m http.server -d web 8000)")


if __name__ == "__main__":
    main()
