// The page: boots the runtime (runtime.mjs), trains in slices of ~40 ms so the chart
// redraws and Stop is honoured between slices, then offers the trained checkpoint.
// State for tests and curious users: window.microtrain.
// URL parameters: ?epochs=N&lr=X&autostart=1
import { loadMicroPython } from "./node_modules/@micropython/micropython-webassembly-pyscript/micropython.mjs";
import { startTrainer, checkpointBytes, floatPrecision } from "./runtime.mjs";
import { drawChart } from "./chart.mjs";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
if (params.has("epochs")) $("epochs").value = params.get("epochs");
if (params.has("lr")) $("lr").value = params.get("lr");
const state = (window.microtrain = { status: "loading", losses: [], evaluations: [] });
let session = null;
let stopRequested = false;

function setStatus(status, text) {
  state.status = status;
  $("status").textContent = text;
}

async function readFile(name) {
  const response = await fetch(`dist/${name}`);
  if (!response.ok) throw new Error(`dist/${name}: HTTP ${response.status} (run web/prepare.py)`);
  return new Uint8Array(await response.arrayBuffer());
}

function evaluate() {
  const trainer = session.trainer;
  trainer.evaluate();
  state.evaluations.push({ step: state.losses.length, epoch: trainer.epoch,
                           val_loss: trainer.val_loss, val_accuracy: trainer.val_accuracy });
}

function describe(prefix) {
  const e = state.evaluations.at(-1);
  const tail = e ? `, val loss ${e.val_loss.toFixed(4)}, val accuracy ${(100 * e.val_accuracy).toFixed(1)}%` : "";
  return `${prefix}: step ${state.losses.length}, loss ${state.losses.at(-1)?.toFixed(4)}${tail}`;
}

async function train() {
  const { trainer } = session;
  const total = Number($("epochs").value) * trainer.steps_per_epoch;
  $("start").disabled = true;
  $("stop").disabled = false;
  setStatus("training", "training…");
  while (!stopRequested && state.losses.length < total) {
    const sliceEnd = performance.now() + 40;
    while (!stopRequested && state.losses.length < total && performance.now() < sliceEnd) {
      state.losses.push(trainer.step());
      if (trainer.epoch_finished()) evaluate();
    }
    drawChart($("chart"), state.losses, state.evaluations, total);
    setStatus("training", describe(`epoch ${trainer.epoch}`));
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
  if (state.evaluations.at(-1)?.step !== state.losses.length) evaluate();
  drawChart($("chart"), state.losses, state.evaluations, total);
  const bytes = checkpointBytes(session);
  $("download").href = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
  $("download").hidden = false;
  $("stop").disabled = true;
  // Continue picks up where training stopped (or, after raising epochs, where it ended).
  $("start").textContent = "Continue";
  $("start").disabled = false;
  setStatus(stopRequested ? "stopped" : "done", describe(stopRequested ? "stopped" : "done"));
}

$("stop").onclick = () => { stopRequested = true; };
$("start").onclick = () => {
  stopRequested = false;
  session.trainer.optimizer.set_learning_rate(Number($("lr").value));
  train().catch((error) => setStatus("error", `error: ${error.message}`));
};

try {
  session = await startTrainer({ loadMicroPython, readFile, lr: Number($("lr").value),
                                 stderr: (line) => console.error(line) });
  state.precision = floatPrecision(session);
  state.stepsPerEpoch = session.trainer.steps_per_epoch;
  drawChart($("chart"), [], [], Number($("epochs").value) * state.stepsPerEpoch);
  setStatus("ready", `ready: MicroPython ${state.precision}-precision floats, ` +
            `${state.stepsPerEpoch} steps per epoch`);
  $("start").disabled = false;
  if (params.get("autostart") === "1") $("start").click();
} catch (error) {
  setStatus("error", `error: ${error.message}`);
}
