// Drives the page headless with Debian's Chromium through playwright-core (tests/test_web.py):
//   node web/drive_page.mjs URL OUT_DIR MIN_STEPS [CHROMIUM]
// Waits until the runtime is ready, clicks Start, clicks Stop once MIN_STEPS losses are in;
// clicks Continue, then Stop again after a few more steps (training resumes where it
// stopped: the losses stay one sequence, which the test checks); downloads the checkpoint to OUT_DIR/trained_checkpoint, screenshots OUT_DIR/page.png and
// prints window.microtrain (losses, evaluations, precision, status) as JSON.
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const [url, outDir, minSteps, executablePath = "/usr/bin/chromium"] = process.argv.slice(2);
const profile = await mkdtemp(path.join(os.tmpdir(), "microtrain-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath,
  headless: true,
  acceptDownloads: true,
  viewport: { width: 860, height: 720 },
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = context.pages()[0] ?? (await context.newPage());
  const consoleLines = [];
  page.on("console", (message) => consoleLines.push(message.text()));
  page.on("pageerror", (error) => consoleLines.push(`pageerror: ${error.message}`));
  await page.goto(url);
  const status = () => page.evaluate(() => window.microtrain?.status);
  await page.waitForFunction(() => ["ready", "error"].includes(window.microtrain?.status),
                             null, { timeout: 60000 });
  if ((await status()) !== "ready") {
    throw new Error(`page failed: ${await page.textContent("#status")}\n${consoleLines.join("\n")}`);
  }
  await page.click("#start");
  await page.waitForFunction((n) => window.microtrain.losses.length >= n, Number(minSteps),
                             { timeout: 120000 });
  const stopped = () => page.waitForFunction(
    () => ["stopped", "done", "error"].includes(window.microtrain.status), null, { timeout: 60000 });
  await page.click("#stop");
  await stopped();
  const firstStop = await page.evaluate(() => window.microtrain.losses.length);
  if ((await page.textContent("#start")) !== "Continue" || !(await page.isEnabled("#start"))) {
    throw new Error("after Stop, the Start button does not offer to continue");
  }
  await page.click("#start");
  await page.waitForFunction((n) => window.microtrain.losses.length >= n, firstStop + 3,
                             { timeout: 120000 });
  await page.click("#stop");
  await stopped();
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("#download")]);
  await download.saveAs(path.join(outDir, "trained_checkpoint"));
  await page.screenshot({ path: path.join(outDir, "page.png"), fullPage: true });
  const state = await page.evaluate(() => window.microtrain);
  state.statusText = await page.textContent("#status");
  state.console = consoleLines;
  console.log(JSON.stringify(state));
} finally {
  await context.close();
  await rm(profile, { recursive: true, force: true });
}
