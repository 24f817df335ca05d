// Shared by the page (app.mjs) and Node (train_node.mjs): boots MicroPython's WebAssembly
// port, copies what prepare.py listed in manifest.json (the device package, the packed
// model, its checkpoint, the data, trainer.py) into the port's filesystem under /mt, and
// returns a StepTrainer (trainer.py) proxy plus the port itself.
const ROOT = "/mt";

function makeDirs(FS, path) {
  let dir = "";
  for (const part of path.split("/").slice(1, -1)) {
    dir += "/" + part;
    if (!FS.analyzePath(dir).exists) FS.mkdir(dir);
  }
}

// readFile(relativePath) -> Promise<Uint8Array>: fetch in the page, fs under Node.
export async function startTrainer({ loadMicroPython, readFile, lr, seed = 1, stdout, stderr }) {
  const manifest = JSON.parse(new TextDecoder().decode(await readFile("manifest.json")));
  const mp = await loadMicroPython({ heapsize: manifest.heap_bytes, stdout, stderr });
  for (const path of manifest.files) {
    const target = `${ROOT}/${path}`;
    makeDirs(mp.FS, target);
    mp.FS.writeFile(target, await readFile(path));
  }
  mp.runPython(`import sys\nsys.path.insert(0, "${ROOT}/device")\nsys.path.insert(0, "${ROOT}")`);
  const { StepTrainer } = mp.pyimport("trainer");
  const trainer = StepTrainer(`${ROOT}/artifacts`, `${ROOT}/data`, lr ?? manifest.lr, seed);
  return { mp, trainer, manifest };
}

// The trained checkpoint (ORT's format) as bytes.
export function checkpointBytes({ mp, trainer }) {
  const path = `${ROOT}/trained_checkpoint`;
  trainer.save(path);
  return mp.FS.readFile(path);
}

// 1.0 + 2**-30 is exactly representable in double precision, not in single.
export function floatPrecision({ mp }) {
  mp.runPython("_mt_double = (1.0 + 2**-30) != 1.0");
  return mp.globals.get("_mt_double") ? "double" : "single";
}
