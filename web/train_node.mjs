// The same runtime as the page, under Node, no browser or CLI involved:
//   node web/train_node.mjs DIST_DIR STEPS [LR] [CHECKPOINT_OUT]
// DIST_DIR is what prepare.py wrote. Prints one training loss per line, then
// "precision double|single", then "val_loss X" and "val_accuracy Y" after the steps.
import { readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { loadMicroPython } from "@micropython/micropython-webassembly-pyscript";
import { startTrainer, checkpointBytes, floatPrecision } from "./runtime.mjs";

const [dist, stepsArg, lrArg, out] = process.argv.slice(2);
if (!dist || !stepsArg) {
  console.error("usage: node train_node.mjs DIST_DIR STEPS [LR] [CHECKPOINT_OUT]");
  process.exit(2);
}
const session = await startTrainer({
  loadMicroPython,
  readFile: (name) => readFile(path.join(dist, name)),
  lr: lrArg === undefined ? undefined : Number(lrArg),
  stderr: (line) => console.error(line),
});
for (let i = 0; i < Number(stepsArg); i++) console.log(String(session.trainer.step()));
console.log(`precision ${floatPrecision(session)}`);
session.trainer.evaluate();
console.log(`val_loss ${session.trainer.val_loss}`);
console.log(`val_accuracy ${session.trainer.val_accuracy}`);
if (out) await writeFile(out, checkpointBytes(session));
