// attnlab lab page: asks /api/attention for one layer's heads and draws them (plain DOM, no libraries).
// Everything the user typed is inserted as text (textContent), never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
let models = [];          // from /api/models
let last = null;          // the last /api/attention answer
let lastOff = null;       // the same request with positions off (the "beside it" comparison), or null
let pinned = null;        // the query row picked by a click on its token, or null
let timer = null;

function svgEl(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// white -> deep blue, perceptually even enough for probabilities in [0, 1]; the legend shows the scale
function color(w) {
  const t = Math.sqrt(Math.max(0, Math.min(1, w)));       // sqrt: small weights stay visible
  const a = [247, 251, 255], b = [8, 48, 107];
  const c = a.map((x, i) => Math.round(x + (b[i] - x) * t));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// The colour bar under the heatmap: position is sqrt(weight), as in color(), with ticks at round weights.
function drawLegend() {
  const svg = $("legend");
  const W = 270, x0 = 12, bar = 12;
  svg.replaceChildren();
  setSize(svg, W + 2 * x0, 50);
  for (let i = 0; i < 60; i++) {
    const t = (i + 0.5) / 60;                              // sqrt(weight) at this slice
    svg.appendChild(svgEl("rect", {x: x0 + i * W / 60, y: 4, width: W / 60 + 0.5, height: bar, fill: color(t * t),
      class: "swatch"}));
  }
  for (const w of [0, 0.01, 0.1, 0.25, 0.5, 1]) {
    const x = x0 + Math.sqrt(w) * W;
    svg.appendChild(svgEl("line", {x1: x, x2: x, y1: 4 + bar, y2: 8 + bar, stroke: "#5b6675"}));
    svg.appendChild(svgEl("text", {x: x, y: 19 + bar, "text-anchor": "middle", class: "tick"}, String(w)));
  }
  svg.appendChild(svgEl("text", {x: x0 - 8, y: 46, class: "caption"}, "colour ∝ √weight (faint ones stay visible)"));
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

function fillSelect(sel, options, keep) {
  const old = keep ? sel.value : null;
  sel.replaceChildren(...options.map(([value, label]) => {
    const o = document.createElement("option");
    o.value = value;
    o.textContent = label;
    return o;
  }));
  if (old !== null && options.some(([v]) => String(v) === old)) sel.value = old;
}

// Where a model opens: the README's example (`attnlab show --model minilm ... --layer 5 --head 4`, the head that
// links "sat" to "award" in the default sentence), or, in a model without that head, its last layer's head 0.
const START = {layer: 5, head: 4};

function startView(layers, heads) {
  if (layers > START.layer && heads > START.head) return START;
  return {layer: Math.max(0, (layers || 1) - 1), head: 0};
}

// fresh: a model just picked (open on its start view); otherwise keep the current layer and head when they exist.
function sizeSelects(layers, heads, fresh) {
  fillSelect($("layer"), [...Array(layers || 1).keys()].map((i) => [i, String(i)]), !fresh);
  fillSelect($("head"), [...Array(heads || 1).keys()].map((i) => [i, String(i)]), !fresh);
  if (fresh) {
    const s = startView(layers, heads);
    $("layer").value = String(s.layer);
    $("head").value = String(s.head);
  }
}

function currentModel() {
  return models.find((m) => m.name === $("model").value);
}

async function loadModels() {
  const r = await fetch("/api/models");
  const data = await r.json();
  models = data.models.filter((m) => m.available);
  fillSelect($("model"), models.map((m) => [m.name, m.name]));
  $("model").title = currentModel() ? currentModel().description : "";
  fillSelect($("backend"), data.backends.map((b) => [b.name, b.exact ? b.name : b.name + " (approximate)"]));
  $("text").maxLength = data.max_chars;
  const m = currentModel();
  sizeSelects(m && m.layers, m && m.heads, true);
}

function request() {
  return {
    text: $("text").value,
    model: $("model").value,
    layer: parseInt($("layer").value || "0", 10),
    head: null,                                           // all heads of the layer; the page picks one
    positional: $("positional").checked,
    scale_factor: Math.pow(2, parseFloat($("scale").value)),
    backend: $("backend").value || "auto",
  };
}

async function ask(body) {
  const r = await fetch("/api/attention", {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  });
  return [r, await r.json()];
}

let latest = 0;                                            // the newest run's number: an older one's answer is dropped

async function run() {
  const seq = ++latest;    // a knob's delayed run and a click may overlap: the answer shown is the newest request's
  const body = request();
  $("status").textContent = "Computing…";
  let r, data, off = null;
  try {
    [r, data] = await ask(body);
    if (r.ok && $("compare").checked && body.positional) {
      const [r2, d2] = await ask({...body, positional: false});
      if (r2.ok) off = d2;
    }
  } catch (e) {
    if (seq !== latest) return;
    showError("The lab server did not answer: " + e);
    $("status").textContent = "";
    return;
  }
  if (seq !== latest) return;
  lastOff = off;
  if (r.status === 429) {                                  // the server is busy: wait as it asks, then retry
    const wait = parseFloat(r.headers.get("Retry-After") || "2");
    $("status").textContent = `Busy (other computations running): retrying in ${wait} s…`;
    clearTimeout(timer);
    timer = setTimeout(run, 1000 * wait);
    return;
  }
  if (!r.ok) {
    const d = data && data.detail;
    showError(typeof d === "string" ? d : JSON.stringify(d || data));
    $("status").textContent = "";
    return;
  }
  clearError();
  if (!last || last.tokens.join("\u0000") !== data.tokens.join("\u0000")) pinned = null;   // new text: no pin
  last = data;
  const m = currentModel();
  if (m && (m.layers !== data.n_layers || m.heads !== data.n_heads)) {
    m.layers = data.n_layers;
    m.heads = data.n_heads;
    sizeSelects(m.layers, m.heads);
  }
  draw();
}

function draw() {
  if (!last) return;
  const h = Math.min(parseInt($("head").value || "0", 10), last.weights.length - 1);
  const w = last.weights[h];
  drawHeatmap($("heatmap"), last.tokens, w);
  $("compare-figure").hidden = !lastOff;
  if (lastOff) drawHeatmap($("heatmap-off"), lastOff.tokens, lastOff.weights[h]);
  drawHeadView(last.tokens, w);
  drawHeadGrid(last, h);
  showPinned();
  const L = last.tokens.length;
  const via = last.backend === last.kernel ? last.kernel : `${last.backend} → ${last.kernel}`;
  $("status").textContent = `${last.model} · layer ${last.layer} · head ${last.heads[h]} · ${L} tokens`
    + (last.positional ? "" : " · positions off") + ` · scale ×${last.scale_factor.toFixed(3).replace(/\.?0+$/, "")}`
    + ` · kernel ${last.kernel}`;
  $("agreement").textContent = last.agreement === null
    ? "backend: reference (the baseline)"
    : `backend: ${via}${last.exact ? "" : " (approximate)"} · max |Δ| vs reference = ${last.agreement.toExponential(2)}`;
  $("entropy").textContent = `entropy ${last.entropy[h].toFixed(3)} of max ${last.max_entropy.toFixed(3)} nats`;
}

// Size an SVG to its drawing, with a viewBox so that CSS (svg.fit) can scale it down on a narrow screen.
function setSize(svg, width, height) {
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
}

function drawHeatmap(svg, tokens, w) {
  const L = tokens.length;
  const cell = Math.max(6, Math.min(28, Math.floor(520 / L)));
  const pad = 10 + 8 * Math.min(16, Math.max(...tokens.map((t) => t.length)));
  svg.replaceChildren();
  setSize(svg, pad + L * cell + 4, pad + L * cell + 4);
  const font = Math.min(13, cell - 1);
  tokens.forEach((t, i) => {
    const label = t.length > 16 ? t.slice(0, 15) + "…" : t;
    const q = svgEl("text", {x: pad - 4, y: pad + i * cell + cell / 2, class: "qlabel", "font-size": font,
      "data-q": i}, label);
    q.addEventListener("click", () => { pinned = pinned === i ? null : i; showPinned(); });
    svg.appendChild(q);
    const x = pad + i * cell + cell / 2;
    svg.appendChild(svgEl("text", {x: x, y: pad - 4, class: "klabel", "font-size": font,
      transform: `rotate(-60 ${x} ${pad - 4})`}, label));
  });
  const g = svgEl("g", {class: "cells"});
  for (let i = 0; i < L; i++) {
    for (let j = 0; j < L; j++) {
      const r = svgEl("rect", {class: "cell", x: pad + j * cell, y: pad + i * cell, width: cell, height: cell,
        fill: color(w[i][j]), "data-q": i, "data-k": j});
      r.appendChild(svgEl("title", {}, `${tokens[i]} → ${tokens[j]}: ${w[i][j].toFixed(4)}`));
      g.appendChild(r);
    }
  }
  svg.appendChild(g);
  svg.dataset.cells = String(L * L);
  svg.dataset.tokens = String(L);
  showPinned();
}

// The clicked query's row stands out in every heatmap (the others dim), and in the head view.
function showPinned() {
  if (pinned !== null && last && pinned >= last.tokens.length) pinned = null;
  for (const svg of [$("heatmap"), $("heatmap-off")]) {
    svg.querySelectorAll("rect.cell").forEach((r) => {
      r.classList.toggle("dim", pinned !== null && r.dataset.q !== String(pinned));
    });
    svg.querySelectorAll("text.qlabel").forEach((t) => t.classList.toggle("pinned", t.dataset.q === String(pinned)));
  }
  focusQuery($("headview"), pinned);
}

function drawHeadView(tokens, w) {
  const L = tokens.length;
  const row = 20, colW = 130, gap = 150;
  const svg = $("headview");
  svg.replaceChildren();
  setSize(svg, colW * 2 + gap, L * row + 10);
  const lines = svgEl("g", {class: "lines"});
  for (let i = 0; i < L; i++) {
    for (let j = 0; j < L; j++) {
      if (w[i][j] < 0.01) continue;                       // invisible anyway; keeps the SVG small
      lines.appendChild(svgEl("line", {x1: colW, y1: i * row + row / 2 + 5, x2: colW + gap, y2: j * row + row / 2 + 5,
        "stroke-width": 0.5 + 4 * w[i][j], "stroke-opacity": Math.min(1, 0.15 + w[i][j]), "data-q": i, class: "link"}));
    }
  }
  svg.appendChild(lines);
  tokens.forEach((t, i) => {
    const y = i * row + row / 2 + 9;
    const left = svgEl("text", {x: colW - 6, y: y, class: "qtok", "data-q": i}, t);
    left.addEventListener("mouseenter", () => focusQuery(svg, i));
    left.addEventListener("mouseleave", () => focusQuery(svg, pinned));
    left.addEventListener("click", () => { pinned = pinned === i ? null : i; showPinned(); });
    svg.appendChild(left);
    svg.appendChild(svgEl("text", {x: colW + gap + 6, y: y, class: "ktok"}, t));
  });
}

function focusQuery(svg, q) {
  svg.querySelectorAll("line.link").forEach((l) => {
    l.classList.toggle("dim", q !== null && l.dataset.q !== String(q));
  });
}

function drawHeadGrid(data, selected) {
  const box = $("heads");
  box.replaceChildren();
  const L = data.tokens.length;
  const px = Math.max(1, Math.floor(96 / L));
  data.weights.forEach((w, h) => {
    const fig = document.createElement("button");
    fig.type = "button";
    fig.className = "thumb" + (h === selected ? " selected" : "");
    const c = document.createElement("canvas");
    c.width = c.height = L * px;
    const ctx = c.getContext("2d");
    for (let i = 0; i < L; i++) {
      for (let j = 0; j < L; j++) {
        ctx.fillStyle = color(w[i][j]);
        ctx.fillRect(j * px, i * px, px, px);
      }
    }
    const cap = document.createElement("span");
    cap.textContent = `head ${data.heads[h]} · H=${data.entropy[h].toFixed(2)}`;
    fig.append(c, cap);
    fig.addEventListener("click", () => { $("head").value = String(h); draw(); });
    box.appendChild(fig);
  });
}

function soon() {                                          // re-run shortly after a knob moves
  clearTimeout(timer);
  timer = setTimeout(run, 150);
}

document.addEventListener("DOMContentLoaded", async () => {
  $("controls").addEventListener("submit", (e) => { e.preventDefault(); run(); });
  $("head").addEventListener("change", draw);
  for (const id of ["layer", "backend", "positional", "compare"]) $(id).addEventListener("change", soon);
  drawLegend();
  $("model").addEventListener("change", () => {
    const m = currentModel();
    $("model").title = m ? m.description : "";
    sizeSelects(m && m.layers, m && m.heads, true);
    soon();
  });
  $("scale").addEventListener("input", () => {
    $("scale-value").textContent = Math.pow(2, parseFloat($("scale").value)).toFixed(3).replace(/\.?0+$/, "");
    soon();
  });
  document.querySelectorAll("button.example").forEach((b) => b.addEventListener("click", () => {
    $("text").value = b.dataset.text;
    run();
  }));
  try {
    await loadModels();
    $("status").textContent = "Ready: press “Show attention”.";
    document.body.dataset.ready = "1";
  } catch (e) {
    showError("Could not list the models: " + e);
  }
});
