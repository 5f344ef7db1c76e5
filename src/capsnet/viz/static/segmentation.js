// capsnet viewer, segmentation models (SegCaps, the U-Net): the panels the page shows instead of the classification
// ones. Loaded before app.js, whose helpers ($, state, walk, bytesOf, drawImage, drawTiles, drawLabelledTiles,
// drawCoupling) these functions call once the page has started.
"use strict";

const CLASSIFICATION_PANELS = ["recon-panel", "digits-panel", "primary-panel", "routing-panel"];
const SEGMENTATION_CANVASES = ["input", "seg-truth", "seg-probability", "seg-mask", "seg-errors", "seg-recon"];

function segmentationSummary(info) {
  const [C, H, W] = info.input;
  return `${checkpointLabel(info, `untrained ${info.model}`)} · ${info.dataset || "no"} test set ` +
    `(${info.test_size} images) · ${info.model} (${info.model_name}), segmentation · input ${C}x${H}x${W}${capsuleLayersLabel(info)}`;
}

function setUpSegmentation() {
  const info = state.info;
  const [, H, W] = info.input;
  document.body.classList.add("segmentation");
  for (const id of CLASSIFICATION_PANELS) $(id).hidden = true;
  $("seg-panel").hidden = false;
  $("layers-panel").hidden = info.layers.length === 0;
  $("seg-routing-panel").hidden = info.routing_layers.length === 0;
  $("seg-recon-figure").hidden = $("seg-recon-hint").hidden = !info.decoder;
  $("class-picker").hidden = $("next-of-class").hidden = true;  // no classes: a test canvas is picked by index
  $("untrained-what").textContent = info.decoder ? "the masks and reconstructions" : "the masks";
  $("draw-hint").textContent = `draw with the mouse or a finger; it is scaled to ${W}x${H} and segmented when ` +
    "you lift it";
  $("upload-size").textContent = info.sides
    ? ` of ${W}x${H} pixels, or another size whose sides are multiples of ${info.sides.multiple} ` +
      `(up to ${info.sides.max_pixels.toLocaleString("en")} pixels)`
    : ` of ${W}x${H} pixels`;
  $("conv-title").textContent = info.conv1.name === "conv1" ? "Conv1" : `First convolution (${info.conv1.name})`;
  $("conv-hint").textContent = "Learned kernels (grey 0, white positive, black negative; each scaled to its own " +
    `range) and their feature maps for this input, after ${info.conv1.batch_norm ? "batch norm and " : ""}ReLU ` +
    "(each scaled to its own maximum).";
  sizeSegmentationCanvases(H, W);
  if (H !== W) {  // the drawing canvas takes the input's shape
    const draw = $("draw");
    draw.height = Math.round(draw.width * H / W);
    draw.style.height = `${Math.round(196 * H / W)}px`;
    state.clearDrawing();
  }
  setUpRoutingPickers();
}

// The routing panel's layer and parent pickers (SegCaps, and CapsPix2pix's generator in synthesis.js): the first
// layer that routes more than once is shown first (SegCaps R3: conv_2_1); another layer re-walks the same input.
function setUpRoutingPickers() {
  const info = state.info;
  const routed = info.layers.filter((l) => l.routing);
  const layers = $("routing-layer");
  for (const l of routed) {
    const option = document.createElement("option");
    const r = l.routing;
    option.value = l.name;
    option.textContent = `${l.name}: ${r.children} → ${r.parents} types, ${r.rounds} round${r.rounds > 1 ? "s" : ""}`;
    layers.appendChild(option);
  }
  if (routed.length) {  // the first layer that routes more than once (SegCaps R3: conv_2_1), else the first
    state.routing = (routed.find((l) => l.routing.rounds > 1) || routed[0]).name;
    layers.value = state.routing;
    fillParents();
  }
  layers.addEventListener("change", () => {
    state.routing = layers.value;
    state.parent = 0;
    fillParents();
    if (state.last) walk(state.last.path, state.last.body, state.last.raw);  // the same input, this layer's routing
  });
  $("routing-parent").addEventListener("change", () => {
    state.parent = Number($("routing-parent").value);
    renderSegmentationRouting();
  });
}

// The views every capsule-grid model shares: the first convolution's feature maps, the capsule layers, the routing.
function renderLayerViews() {
  const w = state.walk;
  const [K, h, wd] = w.feature_maps.shape;
  drawTiles($("feature-maps"), bytesOf(w.feature_maps), K, h, wd, { cols: 8, scale: 1, gap: 2 });
  renderCapsuleLayers();
  renderSegmentationRouting();
}

function fillParents() {
  const layer = state.info.layers.find((l) => l.name === state.routing);
  const select = $("routing-parent");
  select.replaceChildren();
  for (let j = 0; j < layer.routing.parents; j++) {
    const option = document.createElement("option");
    option.value = j;
    option.textContent = `type ${j}`;
    select.appendChild(option);
  }
  select.value = state.parent;
}

// The request of a walk with the routing layer to show: in the JSON body, or in the query of an upload.
function routedRequest(path, body) {
  if (!state.routing) return [path, body];
  if (path === "/api/upload") return [`${path}?routing=${encodeURIComponent(state.routing)}`, body];
  return [path, { ...body, routing: state.routing }];
}

function scaledDrawing(canvas) {
  const [, H, W] = state.info.input;
  const out = document.createElement("canvas");
  out.width = W; out.height = H;
  const ctx = out.getContext("2d");
  ctx.imageSmoothingEnabled = true;
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(canvas, 0, 0, W, H);
  return out;
}

// An H x W image whose pixel i has colour rgbAt(i), scaled to the canvas.
function drawRGB(canvas, H, W, rgbAt) {
  const off = document.createElement("canvas");
  off.width = W; off.height = H;
  const ctx = off.getContext("2d");
  const img = ctx.createImageData(W, H);
  for (let i = 0; i < H * W; i++) img.data.set([...rgbAt(i), 255], 4 * i);
  ctx.putImageData(img, 0, 0);
  const out = canvas.getContext("2d");
  out.imageSmoothingEnabled = false;
  out.drawImage(off, 0, 0, canvas.width, canvas.height);
}

// The input and mask canvases for an H x W image (the model's size, or an upload's other size): the largest whole
// number of screen pixels per pixel that keeps the longer side within 128, and 1 for an image larger than that.
function sizeSegmentationCanvases(H, W) {
  const scale = Math.max(1, Math.floor(128 / Math.max(H, W)));
  for (const id of SEGMENTATION_CANVASES) { $(id).width = W * scale; $(id).height = H * scale; }
}

function renderSegmentation() {
  const w = state.walk, info = state.info;
  const [, H, W] = w.input.shape;
  sizeSegmentationCanvases(H, W);  // (every canvas below is drawn again)
  // an upload of another size than the model's; width first, as the source line's "your image (96x64 px)" (it was
  // height first here: 64x96 beside it, a review of the page, 2026-12-02)
  $("input-size").textContent = `${W}x${H} px`;
  drawImage($("input"), w.input);
  drawImage($("seg-probability"), w.probability);
  drawImage($("seg-mask"), w.mask);
  const known = w.truth !== null;
  $("seg-truth-figure").hidden = $("seg-errors-figure").hidden = !known;
  if (known) {
    drawImage($("seg-truth"), w.truth);
    const [, H, W] = w.mask.shape, m = bytesOf(w.mask), t = bytesOf(w.truth);
    drawRGB($("seg-errors"), H, W, (i) => m[i] && t[i] ? [255, 255, 255] : m[i] ? [220, 50, 50] : t[i] ? [60, 100, 255]
      : [0, 0, 0]);
  }
  if (w.reconstruction) drawImage($("seg-recon"), w.reconstruction);
  $("seg-dice").textContent = known ? w.dice.toFixed(3) : "–";
  $("seg-iou").textContent = known ? w.iou.toFixed(3) : "–";
  $("seg-pixels").textContent = known
    ? `(${w.pixels.predicted} pixels predicted, ${w.pixels.truth} in the ground truth)`
    : `(${w.pixels.predicted} pixels predicted; your image has no ground truth to score against)`;
  renderLayerViews();
  const s = w.source;
  $("source").textContent = s.kind === "test"
    ? `test canvas #${s.index} of ${info.dataset}` : `your image (${s.size[0]}x${s.size[1]} px, as it is)`;
  if (s.kind === "test") $("test-index").value = s.index;
  $("input").setAttribute("aria-label", `what the network sees: ${$("source").textContent}`);
}

function renderCapsuleLayers() {
  const box = $("layers");
  box.replaceChildren();
  state.info.layers.forEach((layer, k) => {
    const e = state.walk.layers[k].lengths;
    const [T, rows, cols] = e.shape;
    const div = document.createElement("div");
    div.className = "layer";
    div.dataset.layer = layer.name;
    const title = document.createElement("h3");
    title.textContent = `${layer.name}: ${T} type${T > 1 ? "s" : ""} of ${layer.dim}D on ${rows}x${cols}, ` +
      `longest ${e.hi.toFixed(3)}`;
    const tiles = document.createElement("div");
    tiles.className = "tiles";
    drawLabelledTiles(tiles, bytesOf(e), T, rows, cols, {
      label: (t) => `type ${t}`, title: (t) => `lengths of ${layer.name}'s capsule type ${t} over its ${rows}x${cols} grid`,
    });
    div.append(title, tiles);
    box.appendChild(div);
  });
}

function renderSegmentationRouting() {
  const r = state.walk.routing;
  if (!r) return;
  const [R, J, , rows, cols] = r.coupling.shape;
  const j = Math.min(state.parent, J - 1);
  // a softmax over the child types: each parent splits its attention among them, so their mean is 1/T everywhere;
  // its largest share shows how decidedly the parent picks one
  const children = r.softmax === "children";
  const { lo, top, hi, flat } = drawCoupling(r.coupling, j, $("seg-routing-rounds"), $("seg-routing-types"), {
    label: (t) => `child ${t}`, largest: children,
    title: (t) => `coupling of child type ${t} to parent type ${j} at each of the ${rows}x${cols} positions`,
  });
  $("seg-routing-layer").textContent = `${r.layer}, to parent type ${j}`;
  $("seg-routing-how").textContent = children
    ? "each parent type splits its attention among the child types (this layer's softmax runs over the children). " +
      "Shown: the largest share of any child type in the selected parent type"
    : "each child capsule type splits its vote among the parent types. Shown: the coupling coefficients to the " +
      "selected parent type, mean over the child types";
  $("seg-routing-range").textContent = `${roundRange(lo, top, hi, flat)}; child maps from 0 to ${hi.toFixed(3)}` +
    (R === 1 ? "; this layer routes once, so its coefficients are the uniform start, before any agreement" : "");
}
