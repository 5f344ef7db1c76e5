// capsnet viewer, synthesis models (CapsPix2pix, pix2pix: conditional GANs that turn a label map into an image): the
// panels the page shows for them. Loaded before app.js, whose helpers ($, state, walk, bytesOf, drawPixels, drawTiles)
// and segmentation.js's (the capsule layers and routing panels, the scaled drawing) these functions call once the
// page has started.
"use strict";

const SYNTHESIS_HIDDEN = ["recon-panel", "digits-panel", "primary-panel", "routing-panel", "seg-panel",
  "class-picker", "next-of-class"];
const SKELETON_BRUSH = 1.5;  // stroke width in label-map pixels: the data set's skeletons are one pixel wide
const SHAPE_BRUSH = 4;       // silhouettes and other label maps are filled shapes

function synthesisSummary(info) {
  const [C, H, W] = info.input, [Co] = info.output;
  const noise = info.noise === "vector" ? `${info.noise_dim}-D noise vector` : "noise from dropout";
  return `${checkpointLabel(info, `untrained ${info.model}`)} · ${info.dataset || "no"} test set ` +
    `(${info.test_size} pairs) · ${info.model} (${info.model_name}), synthesis · label map ${C}x${H}x${W} → ` +
    `image ${Co}x${H}x${W} · ${noise}${capsuleLayersLabel(info)}`;
}

function setUpSynthesis() {
  const info = state.info;
  const [C, H, W] = info.input;
  const vector = info.noise === "vector";
  document.body.classList.add("synthesis");
  for (const id of SYNTHESIS_HIDDEN) $(id).hidden = true;
  $("syn-panel").hidden = false;
  $("syn-noise-panel").hidden = !vector;
  $("syn-truncation-label").hidden = !vector;
  $("layers-panel").hidden = info.layers.length === 0;
  $("seg-routing-panel").hidden = info.routing_layers.length === 0;
  $("layers-note").textContent = " Of the first seed's noise.";
  $("test-noun").textContent = "Test label map";
  $("untrained-what").textContent = "the images it makes";
  $("syn-noise-how").textContent = vector
    ? `${info.model} draws a ${info.noise_dim}-D normal noise vector from each seed. Truncation t draws it from the ` +
      "normal cut to [-t, t]: smaller t trades variety for fidelity, and 0 gives every seed the noise's mean, so " +
      "one image; leave it blank for the untruncated noise."
    : `${info.model} has no noise vector: its noise is the dropout it keeps on when it generates, and the seed ` +
      "picks the dropout masks.";

  const draw = $("draw");
  const skeleton = /skeleton/i.test(info.dataset || "");
  state.brush = (skeleton ? SKELETON_BRUSH : SHAPE_BRUSH) * draw.width / W;
  $("draw-hint").textContent = (skeleton
    ? "draw a skeleton in thin strokes (one or two pixels wide once scaled)"
    : "draw a label map: filled shapes, as a silhouette") +
    `; it is scaled to ${W}x${H} and its images are made when you lift it`;
  $("upload-size").textContent = ` label map of ${W}x${H} pixels`;
  if (H !== W) {  // the drawing canvas takes the input's shape
    draw.height = Math.round(draw.width * H / W);
    draw.style.height = `${Math.round(196 * H / W)}px`;
    state.clearDrawing();
  }
  const scale = Math.max(1, Math.floor(128 / Math.max(H, W)));  // a whole number of screen pixels per pixel
  for (const id of ["input", "syn-noise-map"]) { $(id).width = W * scale; $(id).height = H * scale; }

  const seeds = $("syn-seeds");
  seeds.value = info.seeds.join(", ");
  seeds.title = `1 to ${info.max_seeds} different whole numbers, separated by commas`;
  const rewalk = () => { if (state.last) walk(state.last.path, state.last.body, state.last.raw); };
  seeds.addEventListener("change", rewalk);
  const truncation = $("syn-truncation");
  truncation.addEventListener("change", rewalk);
  // a field holding text that is no number already reads "" to the page, so clearing it fires no change: the
  // truncation and the error of that text stayed. Leaving the field re-walks when it reads otherwise than it was sent.
  truncation.addEventListener("blur", () => { if (truncationKey(truncation) !== state.truncationSent) rewalk(); });

  const noiseChannel = vector && info.conv1.in_channels === C + 1;
  $("conv-title").textContent = info.conv1.name === "conv1" ? "Conv1" : `First convolution (${info.conv1.name})`;
  $("conv-hint").textContent = "The generator's learned kernels (grey 0, white positive, black negative; each " +
    "scaled to its own range" + (noiseChannel ? "; each kernel's label-map channel, then its noise channel" : "") +
    `) and their feature maps for this label map${vector ? " and the first seed" : ""}, after ` +
    (info.layers.some((l) => l.name === info.conv1.name) ? `LeakyReLU, as the capsule layer ${info.conv1.name} reads `
      : "the LeakyReLU its next layer applies ") + "them (each scaled to its own maximum).";
  setUpRoutingPickers();
}

function parseSeeds(text) {
  const parts = text.split(",").map((s) => s.trim()).filter((s) => s !== "");
  if (!parts.length || !parts.every((s) => /^[0-9]{1,10}$/.test(s))) {
    throw new Error(`seeds: give 1 to ${state.info.max_seeds} different whole numbers (0 or more) separated by ` +
      "commas, e.g. 0, 1, 2, 3");
  }
  return parts.map(Number);
}

function truncationKey(input) {  // what the field holds, as far as the page can tell
  return `${input.validity.badInput}|${input.value.trim()}`;
}

function parseTruncation(input) {
  state.truncationSent = truncationKey(input);
  if (input.validity.badInput) throw new Error("truncation: give a number of 0 or more, or leave it blank");
  return input.value.trim() === "" ? null : Number(input.value);
}

// The request of a walk with the seeds, truncation and routing layer asked for: in the JSON body, or in the query
// of an upload.
function synthesisRequest(path, body) {
  const fields = { seeds: parseSeeds($("syn-seeds").value) };
  if (state.info.noise === "vector") {
    const t = parseTruncation($("syn-truncation"));
    if (t !== null) fields.truncation = t;
  }
  if (state.routing) fields.routing = state.routing;
  if (path !== "/api/upload") return [path, { ...body, ...fields }];
  const query = new URLSearchParams({ ...fields, seeds: fields.seeds.join(",") });
  return [`${path}?${query}`, body];
}

// A figure of one image (C, H, W values 0..255) at `scale` screen pixels per pixel, captioned with `lines`.
function imageFigure(bytes, [C, H, W], scale, id, lines, title) {
  const fig = document.createElement("figure");
  const canvas = document.createElement("canvas");
  canvas.className = "pixel";
  canvas.id = id;
  canvas.width = W * scale; canvas.height = H * scale;
  if (title) canvas.title = title;
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", title || lines.join(", "));
  drawPixels(canvas, bytes, C, H, W);
  const cap = document.createElement("figcaption");
  lines.forEach((line, k) => { if (k) cap.appendChild(document.createElement("br")); cap.append(line); });
  fig.append(canvas, cap);
  return fig;
}

// One image of a batch (K, C, H, W) of encoded images.
function nthImage(e, bytes, k) {
  const n = e.shape.slice(1).reduce((a, b) => a * b, 1);
  return bytes.subarray(k * n, (k + 1) * n);
}

function renderSynthesis() {
  const w = state.walk, info = state.info;
  drawImage($("input"), w.input);
  renderSamples();
  renderNoise();
  renderLayerViews();
  const s = w.source;
  $("source").textContent = s.kind === "test"
    ? `test pair #${s.index} of ${info.dataset || "the test set"}` +
      (s.class_name !== undefined ? `, class ${s.class_name}` : "")
    : `your label map (${s.size[0]}x${s.size[1]} px, as it is)`;
  if (s.kind === "test") $("test-index").value = s.index;
  $("input").setAttribute("aria-label", `the label map: ${$("source").textContent}`);
}

function renderSamples() {
  const w = state.walk;
  const [, C, H, W] = w.samples.shape;
  const scale = Math.max(1, Math.floor(128 / Math.max(H, W)));
  const box = $("syn-samples");
  box.replaceChildren();
  if (w.truth) box.appendChild(imageFigure(bytesOf(w.truth), [C, H, W], scale, "syn-truth", ["real image"]));
  const bytes = bytesOf(w.samples);
  w.seeds.forEach((seed, k) => {
    const score = w.scores && w.scores[k];
    const lines = [`seed ${seed}`];
    if (score) lines.push(`L1 ${score.l1.toFixed(3)} · SSIM ${score.ssim.toFixed(3)}`);
    box.appendChild(imageFigure(nthImage(w.samples, bytes, k), [C, H, W], scale, `syn-sample-${k}`, lines,
      `the image of seed ${seed}` + (w.truncation === null ? "" : `, noise truncated to ±${w.truncation}`)));
  });
  const parts = [];
  if (w.scores) {
    const mean = (key) => w.scores.reduce((a, r) => a + r[key], 0) / w.scores.length;
    parts.push(`mean L1 ${mean("l1").toFixed(3)} · mean SSIM ${mean("ssim").toFixed(3)}`);
  }
  parts.push(w.spread === null ? "spread – (one seed)"
    : `spread ${w.spread.toFixed(4)} over ${w.seeds.length} seeds`);
  if (w.truncation !== null) parts.push(`noise truncated to ±${w.truncation}`);
  if (w.source.class_name !== undefined) parts.push(`class ${w.source.class_name}`);
  $("syn-summary").textContent = parts.join(" · ") +
    (w.truth ? "" : " (your label map has no real image to score against)");
}

function renderNoise() {
  const w = state.walk;
  const between = w.interpolation;
  $("syn-interpolation-block").hidden = !between;
  $("syn-interpolation-none").hidden = !!between || !w.noise_map;
  const box = $("syn-interpolation");
  box.replaceChildren();
  if (between) {
    const [S, C, H, W] = between.shape;
    const scale = Math.max(1, Math.floor(64 / Math.max(H, W)));
    box.style.gridTemplateColumns = `repeat(${S}, minmax(0, ${W * scale}px))`;  // one row, narrowed to fit
    const bytes = bytesOf(between);
    const [a, b] = w.seeds;
    $("syn-interpolation-ends").textContent = `seed ${a} to seed ${b}`;
    for (let k = 0; k < S; k++) {
      const label = k === 0 ? `seed ${a}` : k === S - 1 ? `seed ${b}` : `${k}/${S - 1}`;
      box.appendChild(imageFigure(nthImage(between, bytes, k), [C, H, W], scale, `syn-interpolation-${k}`, [label],
        `noise (1 − t)·z(seed ${a}) + t·z(seed ${b}) at t = ${k}/${S - 1}`));
    }
  }
  const map = w.noise_map;
  $("syn-noise-figure").hidden = !map;
  if (map) {
    const [H, W] = map.shape;
    const canvas = $("syn-noise-map");
    drawTiles(canvas, bytesOf(map), 1, H, W, { cols: 1, scale: canvas.width / W, gap: 0 });
    $("syn-noise-caption").textContent = `noise channel of seed ${w.seeds[0]}: black ${map.lo.toFixed(2)}, ` +
      `grey 0, white +${map.hi.toFixed(2)}`;
    canvas.setAttribute("aria-label", $("syn-noise-caption").textContent);
  }
}
