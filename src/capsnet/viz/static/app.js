// capsnet viewer: talks to the JSON API of capsnet.viz.server and draws every array on canvases.
// No build step and no libraries; arrays arrive as {shape, lo, hi, data: base64 uint8}.
// A segmentation model (info.kind === "segmentation") gets the panels of segmentation.js instead of the
// classification ones (digit capsules, routing to a digit capsule, pose sliders), a synthesis model
// (info.kind === "synthesis") those of synthesis.js.
"use strict";

const state = {
  info: null,      // GET /api/info
  viewer: null,    // the X-Capsnet-Viewer token of the first answer: the server this page was made for
  walk: null,      // the last POST /api/forward or /api/upload answer
  selected: 0,     // the digit capsule shown in routing, reconstruction and sliders
  pose: null,      // the selected capsule's pose as the sliders set it
  inflight: false, // a reconstruction request is on its way ...
  pending: false,  // ... and the sliders moved again meanwhile
  nth: {},         // class -> how many images of it were shown
  clearDrawing: null,  // blanks the drawing canvas (set up by setUpDrawing)
  last: null,      // the input a re-walk sends (a layer, seeds or truncation changed): {path, body, raw}, the last
                   // one asked for (on its way, or refused by the page's own fields: bad seeds), but not one the
                   // server refused (an upload of the wrong size), whose layers would be drawn over the input shown
  shown: null,     // the input of the walk shown
  routing: null,   // segmentation and synthesis: the capsule layer whose routing is shown ...
  parent: 0,       // ... and its parent type
  walkSeq: 0,      // numbers the walk requests: an answer overtaken by a later request is not shown
  reconSeq: 0,     // the same for reconstructions (a capsule or image chosen since makes one stale)
  brush: 18,       // the drawing's stroke width in canvas pixels (280 wide)
};

const $ = (id) => document.getElementById(id);

function showError(message) {
  const el = $("error");
  if (el.textContent === message && el.hidden === !message) return;  // the same alert again is not news
  el.textContent = message;
  el.hidden = !message;
}

// an error of a request, in the page's words: fetch's TypeError is the server not answering
function failure(err) {
  return err instanceof TypeError ? `the viewer at ${location.host} is not answering (stopped?): ${err.message}`
    : err.message;
}

// one line for screen readers (a polite live region) when a new input's result is shown
function announce(text) {
  $("announce").textContent = text;
}

async function api(path, body, raw) {
  const options = body === undefined ? {} : {
    method: "POST",
    body: raw ? body : JSON.stringify(body),
    headers: { "Content-Type": raw ? "application/octet-stream" : "application/json" },
  };
  const response = await fetch(path, options);
  // the token of the server that answered: another than the first answer's is a viewer restarted since, perhaps
  // with another model of the same shape, whose answers this page would draw under the old one's classes
  const served = response.headers.get("X-Capsnet-Viewer");
  if (served && state.viewer && served !== state.viewer) {
    const err = new Error("the viewer was restarted since this page loaded (perhaps with another model): reload " +
      "the page");
    err.restarted = true;
    throw err;
  }
  if (served && !state.viewer) state.viewer = served;
  const payload = await response.json().catch(() => null);  // an answer that is no JSON is an error, even a 200
  if (!response.ok || payload === null) throw new Error((payload && payload.error) || `HTTP ${response.status}`);
  return payload;
}

// ---------------------------------------------------------------- arrays

function bytesOf(e) {
  const s = atob(e.data);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

function valuesOf(e) {  // the real values, lo + byte / 255 * (hi - lo)
  const b = bytesOf(e);
  const lo = Array.isArray(e.lo) ? e.lo : [e.lo];
  const hi = Array.isArray(e.hi) ? e.hi : [e.hi];
  const per = b.length / lo.length;
  const out = new Float32Array(b.length);
  for (let i = 0; i < b.length; i++) {
    const k = Math.floor(i / per);
    out[i] = lo[k] + (b[i] / 255) * (hi[k] - lo[k]);
  }
  return out;
}

const grey = (v) => [v, v, v];
function heat(v) {  // black -> red -> yellow -> white
  const t = v / 255;
  return [Math.min(255, 3 * t * 255), Math.max(0, Math.min(255, (3 * t - 1) * 255)), Math.max(0, (3 * t - 2) * 255)];
}

// Draw n tiles of h x w values (0..255) in a grid of `cols` columns.
function drawTiles(canvas, bytes, n, h, w, { cols = 16, scale = 1, gap = 1, color = grey } = {}) {
  const rows = Math.ceil(n / cols);
  canvas.width = cols * (w * scale + gap) - gap;
  canvas.height = rows * (h * scale + gap) - gap;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(canvas.width, canvas.height);
  for (let p = 0; p < img.data.length; p += 4) img.data.set([150, 160, 175, 255], p);  // gaps between tiles
  for (let k = 0; k < n; k++) {
    const x0 = (k % cols) * (w * scale + gap), y0 = Math.floor(k / cols) * (h * scale + gap);
    for (let y = 0; y < h * scale; y++) {
      for (let x = 0; x < w * scale; x++) {
        const [r, g, b] = color(bytes[k * h * w + Math.floor(y / scale) * w + Math.floor(x / scale)]);
        const p = ((y0 + y) * canvas.width + x0 + x) * 4;
        img.data[p] = r; img.data[p + 1] = g; img.data[p + 2] = b; img.data[p + 3] = 255;
      }
    }
  }
  ctx.putImageData(img, 0, 0);
}

// One labelled canvas per tile (n tiles of h x w values 0..255), in a grid that the stylesheet sizes.
function drawLabelledTiles(box, bytes, n, h, w, { label = (k) => `${k}`, color = grey, title } = {}) {
  box.replaceChildren();
  for (let k = 0; k < n; k++) {
    const fig = document.createElement("figure");
    const canvas = document.createElement("canvas");
    drawTiles(canvas, bytes.subarray(k * h * w, (k + 1) * h * w), 1, h, w, { cols: 1, scale: 1, gap: 0, color });
    if (title) canvas.title = title(k);
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", title ? title(k) : label(k));
    const cap = document.createElement("figcaption");
    cap.textContent = label(k);
    fig.append(canvas, cap);
    box.appendChild(fig);
  }
}

// An image (C, H, W), grey for C = 1 and RGB for C = 3, scaled to the canvas.
function drawImage(canvas, e) {
  const [C, H, W] = e.shape;
  drawPixels(canvas, bytesOf(e), C, H, W);
}

// The same from C x H x W values 0..255 (e.g. one image of a batch: a subarray of its bytes).
function drawPixels(canvas, b, C, H, W) {
  const off = document.createElement("canvas");
  off.width = W; off.height = H;
  const ctx = off.getContext("2d");
  const img = ctx.createImageData(W, H);
  for (let i = 0; i < H * W; i++) {
    const rgb = C === 3 ? [b[i], b[H * W + i], b[2 * H * W + i]] : [b[i], b[i], b[i]];
    img.data.set([...rgb, 255], 4 * i);
  }
  ctx.putImageData(img, 0, 0);
  const out = canvas.getContext("2d");
  out.imageSmoothingEnabled = false;
  out.clearRect(0, 0, canvas.width, canvas.height);
  out.drawImage(off, 0, 0, canvas.width, canvas.height);
}

// ---------------------------------------------------------------- the network's views

// What the class scores are, in the page's words: capsule lengths (margin loss), EM's activations (spread loss) or the
// inverted model's softmax probabilities
function scoreWord(info) {
  return { activations: "activation", probabilities: "probability" }[info.scores_are] || "length";
}

function digitsHint(info) {
  const what = {
    length: "Length of each capsule = probability of its class; the margins 0.9 and 0.1 are marked.",
    activation: "Activation of each class capsule (EM routing's, trained with the spread loss): the largest is the " +
      "prediction.",
    probability: "Softmax probability of each class (from the class capsules' poses, trained with cross-entropy): " +
      "the largest is the prediction.",
  }[scoreWord(info)];
  const uses = info.decoder ? "routing, reconstruction and sliders" : "routing";
  return `${what} Click a capsule (or Tab to the bars and use the arrow keys) to select it for ${uses}.`;
}

function renderLengths() {
  const w = state.walk, info = state.info, word = scoreWord(info);
  const box = $("lengths");
  const focused = box.contains(document.activeElement);  // keyboard use: the selected bar keeps the focus
  box.replaceChildren();
  w.lengths.forEach((len, j) => {
    const bar = document.createElement("div");
    bar.className = "bar" + (j === w.predicted ? " predicted" : "") + (j === state.selected ? " selected" : "");
    bar.dataset.capsule = j;
    // one Tab stop for the group, the selected bar (ten stops stood between the input and the panels after it);
    // the arrow keys, Home and End choose another, as a click does (a radio group's keys)
    bar.tabIndex = j === state.selected ? 0 : -1;
    bar.setAttribute("role", "radio");
    bar.setAttribute("aria-checked", String(j === state.selected));  // which capsule is selected, not only seen
    bar.setAttribute("aria-label", `capsule ${j} (${info.classes[j]}), ${word} ${len.toFixed(3)}` +
      (j === w.predicted ? ", predicted" : ""));
    bar.innerHTML = `<span class="name"></span><span class="track"><span class="fill"></span>` +
      (word === "length" ? `<span class="margin" style="left:90%"></span><span class="margin" style="left:10%"></span>`
        : "") + `</span><span class="value"></span>`;
    bar.querySelector(".name").textContent = info.classes[j];
    bar.querySelector(".fill").style.width = `${(100 * len).toFixed(1)}%`;
    bar.querySelector(".value").textContent = len.toFixed(3);
    bar.title = `capsule ${j} (${info.classes[j]}): ${word} ${len.toFixed(4)}`;
    bar.addEventListener("click", () => selectCapsule(j));
    bar.addEventListener("keydown", (e) => {
      const n = w.lengths.length;
      const to = { ArrowRight: j + 1, ArrowDown: j + 1, ArrowLeft: j - 1, ArrowUp: j - 1, Home: 0, End: n - 1,
        Enter: j, " ": j }[e.key];
      if (to === undefined) return;
      e.preventDefault();
      selectCapsule((to + n) % n);  // the arrows wrap around; the re-drawn bars keep the focus on the chosen one
    });
    box.appendChild(bar);
  });
  if (focused) box.children[state.selected].focus();
  $("predicted").textContent = `${info.classes[w.predicted]} (capsule ${w.predicted}, ${word} ` +
    `${w.lengths[w.predicted].toFixed(3)})`;
}

// Coupling (R, J, T, rows, cols) to upper capsule j: one map per round in roundsBox (the mean over the T lower
// capsule types, or with largest: their largest coefficient; one scale for all rounds), then one labelled map per
// lower type of the last round in typesBox. flat: the round maps were all within the 8-bit coding's rounding, drawn
// on the type maps' scale (0 to hi) rather than stretched (a constant mean showed its rounding noise, black to white).
function drawCoupling(coupling, j, roundsBox, typesBox, { label, title, largest = false }) {
  const [R, J, T, rows, cols] = coupling.shape;
  const values = valuesOf(coupling);
  const hi = coupling.hi || 1;
  roundsBox.replaceChildren();
  const means = [];
  for (let r = 0; r < R; r++) {
    const m = new Float32Array(rows * cols);
    for (let p = 0; p < rows * cols; p++) {
      let s = 0, most = 0;
      for (let t = 0; t < T; t++) {
        const v = values[(((r * J + j) * T + t) * rows * cols) + p];
        s += v;
        if (v > most) most = v;
      }
      m[p] = largest ? most : s / T;
    }
    means.push(m);
  }
  // a loop, not Math.min(...m): spreading a 512x512 layer's 262,144 values overflows the call stack
  let lo = Infinity, top = -Infinity;
  for (const m of means) for (const v of m) { if (v < lo) lo = v; if (v > top) top = v; }
  const flat = top - lo <= 2 * hi / 255;
  for (let r = 0; r < R; r++) {
    const mean = means[r].map((v) => Math.round(255 * Math.min(1, flat ? v / hi : (v - lo) / (top - lo))));
    const fig = document.createElement("figure");
    const canvas = document.createElement("canvas");
    drawTiles(canvas, mean, 1, rows, cols, { cols: 1, scale: Math.max(2, Math.floor(96 / Math.max(rows, cols))), color: heat });
    fig.appendChild(canvas);
    const cap = document.createElement("figcaption");
    cap.textContent = r === 0 && R > 1 ? "round 1 (uniform)" : `round ${r + 1}`;
    fig.appendChild(cap);
    roundsBox.appendChild(fig);
  }
  const last = bytesOf(coupling).subarray(((R - 1) * J + j) * T * rows * cols, ((R - 1) * J + j + 1) * T * rows * cols);
  drawLabelledTiles(typesBox, last, T, rows, cols, { label, color: heat, title });
  return { lo, top, hi, flat };
}

// the range line of the round maps: stretched from their darkest to their brightest, or drawn as the type maps are
function roundRange(lo, top, hi, flat) {
  return flat ? `round maps from 0 (black) to ${hi.toFixed(3)} (white), every position within rounding of ` +
    `${top.toFixed(3)}` : `round maps from ${lo.toFixed(3)} (black) to ${top.toFixed(3)} (white)`;
}

// what the routing panel's maps are, for the routing algorithm drawn (info.routing: capsnet.routing's name)
const ROUTING_WORDS = {
  dynamic: "each round of routing by agreement",
  em: "each iteration of EM routing (its assignment probabilities)",
  "self-attention": "self-attention routing's one pass (agreement plus a learned prior: not uniform)",
  inverted: "each pass of inverted dot-product attention",
};

function renderRouting() {
  const w = state.walk, info = state.info, j = state.selected;
  const [, , , rows, cols] = w.coupling.shape;
  const [R] = w.coupling.shape;
  const { lo, top, hi, flat } = drawCoupling(w.coupling, j, $("routing-rounds"), $("routing-types"),
    { label: (t) => `type ${t}`, title: (t) => `coupling of capsule type ${t}'s ${rows}x${cols} capsules` });
  $("routing-capsule").textContent = `${j} (${info.classes[j]})`;
  $("routing-from").textContent = routesPrimary(info) ? "primary" : "lower";
  $("routing-how").textContent = (ROUTING_WORDS[info.routing] || "each round of its routing") +
    (R > 1 ? " (round 1 is uniform, before any agreement)" : "");
  $("routing-range").textContent = `${roundRange(lo, top, hi, flat)}; type maps from 0 to ${hi.toFixed(3)}`;
}

// CapsNet and Efficient-CapsNet route their primary capsules into the class layer; EM's and inverted attention's
// class layers route deeper capsules
function routesPrimary(info) {
  return info.model === "CapsNet" || info.model === "EfficientCapsNet";
}

function renderLayers() {
  const w = state.walk, info = state.info;
  drawImage($("input"), w.input);
  const [K, h, wd] = w.feature_maps.shape;
  drawTiles($("feature-maps"), bytesOf(w.feature_maps), K, h, wd, { cols: 16, scale: 1, gap: 2 });
  const [T, rows, cols] = w.primary_lengths.shape;
  drawLabelledTiles($("primary"), bytesOf(w.primary_lengths), T, rows, cols,
    { label: (t) => `type ${t}`, title: (t) => `${w.primary_are} of capsule type ${t} over its ${rows}x${cols} grid` });
  $("primary-what").textContent = {activations: "Activation", "largest couplings": "Largest coupling"}[w.primary_are]
    || "Length";  // EM: activations; inverted attention: each capsule's largest coupling
  const primary = routesPrimary(info);
  $("primary-heading").textContent = primary ? "Primary capsules" : "Lower capsules (the class layer's inputs)";
  $("primary-which").textContent = primary ? "primary" : "lower";
  $("primary-range").textContent = `black ${w.primary_lengths.lo.toFixed(3)} to white ${w.primary_lengths.hi.toFixed(3)}, ` +
    "this input's shortest and longest";
  const s = w.source;
  $("source").textContent = s.kind === "test"
    ? `test image #${s.index}, label ${s.label_name}`
    : `your image (${s.size[0]}x${s.size[1]} px, ${info.upload_style === "frame"
      ? "fitted to the frame as Fashion-MNIST's items were" : ["pad", "crop"].includes(info.upload_style)
      ? `fitted to the frame as capsnet prepare --fit ${info.upload_style} does` : "preprocessed as MNIST was"})`;
  if (s.kind === "test") $("test-index").value = s.index;
  $("input").setAttribute("aria-label", `what the network sees: ${$("source").textContent}`);
}

function buildSliders() {
  const box = $("sliders");
  box.replaceChildren();
  for (let d = 0; d < state.info.digit_dim; d++) {
    const label = document.createElement("label");
    label.textContent = `dim ${d}`;
    label.htmlFor = `dim-${d}`;
    const slider = document.createElement("input");
    Object.assign(slider, { type: "range", id: `dim-${d}`, className: "dim-slider", step: "0.005" });
    slider.dataset.dim = d;
    const value = document.createElement("span");
    value.className = "value";
    value.id = `dim-${d}-value`;
    slider.addEventListener("input", () => {
      if (!state.walk) return;  // no input shown yet (a viewer without a test set): no pose to move
      state.pose[d] = Number(slider.value);
      showSliderValue(d);
      requestReconstruction();
    });
    box.append(label, slider, value);
  }
}

function showSliderValue(d) {
  const base = state.walk.poses[state.selected][d];
  const delta = state.pose[d] - base;
  const text = `${delta >= 0 ? "+" : ""}${delta.toFixed(3)}`;
  $(`dim-${d}-value`).textContent = text;
  $(`dim-${d}`).setAttribute("aria-valuetext", text);  // the offset shown, not the pose's raw value
}

function resetSliders() {
  const base = state.walk.poses[state.selected];
  const half = state.info.sweep_half_range;
  state.pose = base.slice();
  if (!state.info.decoder) return;  // no sliders built: nothing to decode a pose
  base.forEach((v, d) => {
    const slider = $(`dim-${d}`);
    slider.min = (v - half).toFixed(4);
    slider.max = (v + half).toFixed(4);
    slider.value = v;
    slider.title = `capsule value ${v.toFixed(4)}; range ±${half} (Sabour et al., Figure 4)`;
    showSliderValue(d);
  });
}

async function requestReconstruction() {
  if (!state.info.decoder || !state.walk) return;
  if (state.inflight) { state.pending = true; return; }
  state.inflight = true;
  const started = performance.now();
  const seq = ++state.reconSeq;
  try {
    const r = await api("/api/reconstruct", { capsule: state.selected, pose: state.pose });
    if (seq !== state.reconSeq) return;  // another capsule or image was chosen meanwhile
    drawImage($("recon"), r.reconstruction);
    $("recon").setAttribute("aria-label", `reconstruction from capsule ${state.selected} with the sliders' offsets`);
    $("latency").textContent = `${(performance.now() - started).toFixed(1)} ms`;
    document.body.dataset.reconstructions = Number(document.body.dataset.reconstructions || 0) + 1;
    showError("");
  } catch (err) {
    if (seq !== state.reconSeq) return;  // of a capsule or image chosen away from: the request after it reports
    // nothing drawn for the capsule chosen: the canvas no longer shows another capsule's image under its heading
    const recon = $("recon");
    recon.getContext("2d").clearRect(0, 0, recon.width, recon.height);
    recon.setAttribute("aria-label", `no reconstruction from capsule ${state.selected}: the request failed`);
    showError(failure(err));
  } finally {
    state.inflight = false;
    if (state.pending) { state.pending = false; requestReconstruction(); }
  }
}

function selectCapsule(j) {
  state.reconSeq++;  // a reconstruction still on its way is of another capsule (or image): not drawn under this one
  state.selected = j;
  $("selected-capsule").textContent = `${j} (${state.info.classes[j]})`;
  renderLengths();
  renderRouting();
  resetSliders();
  if (j === state.walk.predicted && state.walk.reconstruction) {
    drawImage($("recon"), state.walk.reconstruction);
    $("recon").setAttribute("aria-label", `reconstruction from capsule ${j}, the predicted one`);
  } else {
    requestReconstruction();
  }
}

function showWalk(w) {
  const before = state.walk;
  state.walk = w;
  try {
    if (state.info.kind === "segmentation") {
      renderSegmentation();
    } else if (state.info.kind === "synthesis") {
      renderSynthesis();
    } else {
      renderLayers();
      selectCapsule(w.predicted);
    }
  } catch (err) {  // an answer this page cannot draw: a viewer restarted with another model on the same port
    state.walk = before;
    throw new Error(`the viewer's answer does not fit this page (${err.message}); was it restarted with another ` +
      "model? Reload the page");
  }
  if (w.source.kind === "test" && state.clearDrawing) state.clearDrawing();  // the drawing no longer is the input
  const kind = state.info.kind, source = $("source").textContent || "your input";
  announce(kind === "classification" ? `${source}: predicted ${$("predicted").textContent}`
    : `${source}: ${kind === "segmentation" ? "segmented" : "samples drawn"}`);
  document.body.dataset.walks = Number(document.body.dataset.walks || 0) + 1;
  showError("");
}

async function walk(path, body, raw) {
  const asked = { path, body, raw };
  let to, sent;
  try {
    const kind = state.info.kind;
    [to, sent] = kind === "segmentation" ? routedRequest(path, body)
      : kind === "synthesis" ? synthesisRequest(path, body) : [path, body];
  } catch (err) {  // the page's own fields refused it (bad seeds): the input is the one a re-walk sends once fixed
    state.last = asked;
    showError(err.message);
    return;
  }
  state.last = asked;  // on its way: a re-walk meanwhile (seeds changed) sends it again, not the input before it
  const seq = ++state.walkSeq;
  try {
    const w = await api(to, sent, raw);
    if (seq !== state.walkSeq) return;  // a later request was sent meanwhile: its answer is the one to show
    showWalk(w);
    state.shown = asked;
  } catch (err) {
    if (seq !== state.walkSeq) return;  // overtaken: its failure is no more news than its answer would have been
    // refused by the server: a re-walk sends the input shown (a layer picked then is drawn for that one)
    if (state.last === asked) state.last = state.shown;
    showError(failure(err));
  }
}

// ---------------------------------------------------------------- inputs

function setUpDrawing() {
  const canvas = $("draw");
  const ctx = canvas.getContext("2d");
  const clear = () => { ctx.fillStyle = "#000"; ctx.fillRect(0, 0, canvas.width, canvas.height); };
  clear();
  let drawing = false, drawn = false;
  const at = (e) => {
    const r = canvas.getBoundingClientRect();
    return [(e.clientX - r.left) * canvas.width / r.width, (e.clientY - r.top) * canvas.height / r.height];
  };
  canvas.addEventListener("pointerdown", (e) => {
    drawing = true; drawn = true;
    canvas.setPointerCapture(e.pointerId);
    ctx.strokeStyle = "#fff"; ctx.lineWidth = state.brush; ctx.lineCap = ctx.lineJoin = "round";
    ctx.beginPath(); ctx.moveTo(...at(e)); ctx.lineTo(...at(e)); ctx.stroke();
  });
  canvas.addEventListener("pointermove", (e) => {
    if (!drawing) return;
    ctx.lineTo(...at(e)); ctx.stroke();
  });
  const finish = () => {
    if (!drawing) return;
    drawing = false;
    if (!drawn) return;
    // a segmentation or synthesis model takes an image of its own input size, as it is: the drawing is scaled to
    // it here
    const send = state.info.kind === "classification" ? canvas : scaledDrawing(canvas);
    send.toBlob((blob) => walk("/api/upload", blob, true), "image/png");
  };
  canvas.addEventListener("pointerup", finish);
  canvas.addEventListener("pointercancel", finish);
  state.clearDrawing = () => { clear(); drawn = false; };
  $("clear-drawing").addEventListener("click", state.clearDrawing);
}

function setUpPickers() {
  const select = $("test-class");
  state.info.classes.forEach((name, k) => {
    const option = document.createElement("option");
    option.value = k; option.textContent = name === String(k) ? name : `${k}: ${name}`;
    select.appendChild(option);
  });
  $("show-test").addEventListener("click", () => {
    const given = $("test-index").value.trim();  // Number("") is 0: an empty field showed image 0 unasked
    if (given === "") {
      showError(`enter a ${$("test-noun").textContent.toLowerCase()} number, 0 to ${state.info.test_size - 1}`);
      return;
    }
    walk("/api/forward", { index: Number(given) });
  });
  $("test-index").addEventListener("keydown", (e) => { if (e.key === "Enter") $("show-test").click(); });
  $("next-of-class").addEventListener("click", () => {
    const k = Number(select.value);
    const nth = state.nth[k] || 0;
    state.nth[k] = nth + 1;
    walk("/api/forward", { class: k, nth });
  });
  $("upload").addEventListener("change", (e) => {
    const file = e.target.files[0];
    e.target.value = "";  // the same file chosen again is a change too (it was ignored)
    if (file) { state.clearDrawing(); walk("/api/upload", file, true); }
  });
  $("reset").addEventListener("click", () => { if (state.walk) { resetSliders(); requestReconstruction(); } });
  if (state.info.test_size === 0) {
    for (const id of ["test-index", "show-test", "test-class", "next-of-class"]) $(id).disabled = true;
  }
  $("test-index").max = Math.max(0, state.info.test_size - 1);
}

// the checkpoint's path, with "(training weights)" when an averaged run's training weights were loaded
function checkpointLabel(info, untrained) {
  return info.checkpoint ? info.checkpoint + (info.saved ? ` (${info.saved})` : "") +
    (info.weights === "training" ? " (training weights)" : "") : untrained;
}

// a segmentation or synthesis model's capsule layers, how many route and by what ("" without capsule layers)
function capsuleLayersLabel(info) {
  return info.layers.length
    ? ` · ${info.layers.length} capsule layers, ${info.routing_layers.length} of them routing` +
      (info.routing ? ` (${info.routing})` : "") : "";
}

// a run training on saves its checkpoint again while the page shows the weights read at the start: said, checked
// on load, every minute while the page is in view, and when it comes back into view
function showChanged(info) {
  $("checkpoint-changed").hidden = !info.changed;
  $("checkpoint-changed").textContent = info.changed ? `Note: ${info.changed}.` : "";
}

async function checkChanged() {
  if (document.visibilityState !== "visible") return;
  try {
    showChanged(await api("/api/info"));
  } catch (err) {  // a server stopped: the next walk says so; one restarted is said at once
    if (err.restarted) showChanged({ changed: err.message });
  }
}

async function start() {
  try {
    const info = state.info = await api("/api/info");
    const [C, H, W] = info.input;
    const segmenting = info.kind === "segmentation", synthesizing = info.kind === "synthesis";
    $("model-info").textContent = segmenting ? segmentationSummary(info)
      : synthesizing ? synthesisSummary(info)
      : `${checkpointLabel(info, "untrained CapsNet")} · ${info.dataset || "no"} test set ` +
      `(${info.test_size} images) · ${info.model} · input ${C}x${H}x${W} · ` +
      `${info.primary.types}x${info.primary.grid.join("x")} ${routesPrimary(info) ? "primary" : "lower"} ` +
      `capsules${info.primary.dim ? ` of ${info.primary.dim}D` : ""} · ${info.classes.length} class capsules of ` +
      `${info.digit_dim}D · ${info.routing_iterations} ${info.routing ? info.routing + " " : ""}routing ` +
      `round${info.routing_iterations === 1 ? "" : "s"}`;
    $("untrained").hidden = info.trained;
    $("classes-warning").hidden = !info.warning;  // a classifier shown other classes than it learned
    $("classes-warning").textContent = info.warning ? `Note: ${info.warning}.` : "";
    showChanged(info);
    if (info.checkpoint) {
      setInterval(checkChanged, 60_000);
      document.addEventListener("visibilitychange", checkChanged);
    }
    $("input-size").textContent = `${W}x${H} px`;  // width first, as every size in the page's words
    setUpDrawing();
    setUpPickers();
    if (segmenting) setUpSegmentation(); else if (synthesizing) setUpSynthesis();
    else if (info.decoder) buildSliders();
    else $("recon-panel").hidden = true;  // no decoder (EM, --no-decoder): a canvas and sliders that did nothing
    document.body.dataset.started = "1";  // the panels of this kind of model set: shown (style.css)
    $("draw").setAttribute("aria-label", `drawing area: ${$("draw-hint").textContent}`);  // the kind's own hint
    if (!segmenting && !synthesizing) $("digits-hint").textContent = digitsHint(info);
    const k = await api("/api/kernels");
    const [K, Ck, kh, kw] = k.kernels.shape;
    // one tile per kernel and input channel; a generator's few kernels, 8 a row, drawn larger
    const [perRow, scale] = synthesizing ? [8, 3] : [16, 2];
    drawTiles($("kernels"), bytesOf(k.kernels), K * Ck, kh, kw, { cols: perRow * Ck, scale, gap: 2 });
    if (info.test_size > 0) await walk("/api/forward", { index: 0 });
    document.body.dataset.ready = "1";
  } catch (err) {
    showError(`cannot start: ${failure(err)}`);
  }
}

start();
