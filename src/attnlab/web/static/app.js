// attnlab lab page: asks /api/attention for one layer's heads and draws them (plain DOM, no libraries).
// Everything the user typed is inserted as text (textContent), never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
let models = [];          // from /api/models
let last = null;          // the last /api/attention answer
let timer = null;

function svgEl(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// white -> deep blue, perceptually even enough for probabilities in [0, 1]
function color(w) {
  const t = Math.sqrt(Math.max(0, Math.min(1, w)));       // sqrt: small weights stay visible
  const a = [247, 251, 255], b = [8, 48, 107];
  const c = a.map((x, i) => Math.round(x + (b[i] - x) * t));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
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

function sizeSelects(layers, heads) {
  fillSelect($("layer"), [...Array(layers || 1).keys()].map((i) => [i, String(i)]), true);
  fillSelect($("head"), [...Array(heads || 1).keys()].map((i) => [i, String(i)]), true);
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
  sizeSelects(m && m.layers, m && m.heads);
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

async function run() {
  const body = request();
  $("status").textContent = "Computing…";
  let r, data;
  try {
    r = await fetch("/api/attention", {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
    });
    data = await r.json();
  } catch (e) {
    showError("The lab server did not answer: " + e);
    $("status").textContent = "";
    return;
  }
  if (!r.ok) {
    const d = data && data.detail;
    showError(typeof d === "string" ? d : JSON.stringify(d || data));
    $("status").textContent = "";
    return;
  }
  clearError();
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
  drawHeatmap(last.tokens, w);
  drawHeadView(last.tokens, w);
  drawHeadGrid(last, h);
  const L = last.tokens.length;
  $("status").textContent = `${last.model} · layer ${last.layer} · head ${last.heads[h]} · ${L} tokens`
    + (last.positional ? "" : " · positions off") + ` · scale ×${last.scale_factor.toFixed(3).replace(/\.?0+$/, "")}`;
  $("agreement").textContent = last.agreement === null
    ? "backend: reference (the baseline)"
    : `backend: ${last.backend}${last.exact ? "" : " (approximate)"} · max |Δ| vs reference = ${last.agreement.toExponential(2)}`;
  $("entropy").textContent = `entropy ${last.entropy[h].toFixed(3)} of max ${last.max_entropy.toFixed(3)} nats`;
}

function drawHeatmap(tokens, w) {
  const L = tokens.length;
  const cell = Math.max(6, Math.min(28, Math.floor(520 / L)));
  const pad = 10 + 8 * Math.min(16, Math.max(...tokens.map((t) => t.length)));
  const svg = $("heatmap");
  svg.replaceChildren();
  svg.setAttribute("width", pad + L * cell + 4);
  svg.setAttribute("height", pad + L * cell + 4);
  const font = Math.min(13, cell - 1);
  tokens.forEach((t, i) => {
    const label = t.length > 16 ? t.slice(0, 15) + "…" : t;
    svg.appendChild(svgEl("text", {x: pad - 4, y: pad + i * cell + cell / 2, class: "qlabel", "font-size": font}, label));
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
}

function drawHeadView(tokens, w) {
  const L = tokens.length;
  const row = 20, colW = 130, gap = 150;
  const svg = $("headview");
  svg.replaceChildren();
  svg.setAttribute("width", colW * 2 + gap);
  svg.setAttribute("height", L * row + 10);
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
    left.addEventListener("mouseleave", () => focusQuery(svg, null));
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
  for (const id of ["layer", "backend", "positional"]) $(id).addEventListener("change", soon);
  $("model").addEventListener("change", () => {
    const m = currentModel();
    $("model").title = m ? m.description : "";
    sizeSelects(m && m.layers, m && m.heads);
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
