// A plain-canvas chart: training loss per step (grey), its running mean (blue) and the
// validation accuracy at each epoch end or stop (orange, right axis 0..1).
const PAD = { left: 52, right: 52, top: 24, bottom: 36 };

function axes(ctx, w, h, maxLoss, steps) {
  ctx.strokeStyle = "#999";
  ctx.strokeRect(PAD.left, PAD.top, w, h);
  ctx.fillStyle = "#444";
  ctx.font = "12px sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = PAD.top + h - (h * i) / 4;
    ctx.textAlign = "right";
    ctx.fillText(((maxLoss * i) / 4).toFixed(2), PAD.left - 6, y + 4);
    ctx.textAlign = "left";
    ctx.fillText((i / 4).toFixed(2), PAD.left + w + 6, y + 4);
  }
  ctx.textAlign = "center";
  ctx.fillText(`step (${steps})`, PAD.left + w / 2, PAD.top + h + 28);
  ctx.fillText("loss", PAD.left - 30, PAD.top - 8);
  ctx.textAlign = "right";
  ctx.fillText("val accuracy", PAD.left + w + PAD.right - 4, PAD.top - 8);
}

function line(ctx, points, color, width) {
  ctx.strokeStyle = color;
  ctx.lineWidth = width;
  ctx.beginPath();
  points.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
  ctx.stroke();
  ctx.lineWidth = 1;
}

export function drawChart(canvas, losses, evaluations, totalSteps) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width - PAD.left - PAD.right;
  const h = canvas.height - PAD.top - PAD.bottom;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const maxLoss = Math.max(2.5, ...losses.slice(0, 50));
  const steps = Math.max(totalSteps, losses.length, 1);
  axes(ctx, w, h, maxLoss, steps);
  const x = (step) => PAD.left + (w * step) / steps;
  const yLoss = (loss) => PAD.top + h - (h * Math.min(loss, maxLoss)) / maxLoss;
  line(ctx, losses.map((loss, i) => [x(i + 1), yLoss(loss)]), "#bbb", 1);
  let sum = 0;
  const mean = losses.map((loss, i) => {
    sum += loss - (i >= 20 ? losses[i - 20] : 0);
    return [x(i + 1), yLoss(sum / Math.min(i + 1, 20))];
  });
  line(ctx, mean, "#1f5fbf", 2);
  const acc = evaluations.map((e) => [x(e.step), PAD.top + h - h * e.val_accuracy]);
  line(ctx, acc, "#e07b00", 2);
  ctx.fillStyle = "#e07b00";
  for (const [px, py] of acc) ctx.fillRect(px - 3, py - 3, 6, 6);
}
