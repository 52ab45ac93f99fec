// Drawings for the lesson's cells, from the `show` dict a cell leaves behind: plain SVG and tables, no library.
// render(show, container) picks the drawing by show.kind: heatmap | scaling | positions | order.

const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs = {}, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Sequential blues for weights in [0, 1] (white = 0, dark blue = 1): the lab's palette.
const BLUES = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
export function blue(t) {
  const x = Math.min(1, Math.max(0, t)) * (BLUES.length - 1);
  const i = Math.min(BLUES.length - 2, Math.floor(x));
  const f = x - i;
  const c = BLUES[i].map((a, j) => Math.round(a + f * (BLUES[i + 1][j] - a)));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

// Diverging for values in [-1, 1]: orange below 0, white at 0, blue above.
function diverging(v) {
  const t = Math.min(1, Math.abs(v));
  const to = v < 0 ? [230, 85, 13] : [8, 81, 156];
  const c = [255, 255, 255].map((a, j) => Math.round(a + t * (to[j] - a)));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

function legend(svg, x, y, width, label) {
  const id = "grad-" + Math.random().toString(36).slice(2);
  const grad = el("svg:linearGradient", { id });
  for (let i = 0; i <= 4; i++) grad.append(el("svg:stop", { offset: `${i * 25}%`, "stop-color": blue(i / 4) }));
  const defs = el("svg:defs");
  defs.append(grad);
  svg.append(defs, el("svg:rect", { x, y, width, height: 12, fill: `url(#${id})`, class: "legend-bar" }));
  svg.append(el("svg:text", { x, y: y + 26, class: "tick" }, "0"),
             el("svg:text", { x: x + width, y: y + 26, class: "tick end" }, "1"),
             el("svg:text", { x: x + width / 2, y: y + 26, class: "tick middle" }, label));
}

function heatmap(show, box) {
  const { tokens, weights } = show;
  const n = tokens.length, cell = 58, left = 70, top = 48;
  const width = left + n * cell + 90, height = top + n * cell + 56;
  const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "group", class: "heatmap",
                              "aria-label": `attention weights, ${n} queries by ${n} keys; each row sums to 1` });
  svg.append(el("svg:text", { x: left + (n * cell) / 2, y: 14, class: "axis middle" }, "key (attended to) →"));
  tokens.forEach((t, j) => svg.append(el("svg:text", { x: left + j * cell + cell / 2, y: top - 8, class: "klabel" }, t)));
  svg.append(el("svg:text", { x: left + n * cell + 45, y: top - 8, class: "klabel" }, "row sum"));
  weights.forEach((row, i) => {
    const y = top + i * cell;
    svg.append(el("svg:text", { x: left - 8, y: y + cell / 2, class: "qlabel" }, tokens[i]));
    row.forEach((w, j) => {
      const label = `query ${i} “${tokens[i]}” → key ${j} “${tokens[j]}”: weight ${w.toFixed(4)}`;
      const r = el("svg:rect", { x: left + j * cell, y, width: cell, height: cell, fill: blue(w), class: "cell",
                                 tabindex: "0", role: "img", "aria-label": label, "data-value": String(w) });
      r.append(el("svg:title", {}, label));
      svg.append(r, el("svg:text", { x: left + j * cell + cell / 2, y: y + cell / 2,
                                     class: w > 0.5 ? "value light" : "value" }, w.toFixed(3)));
    });
    const sum = row.reduce((a, b) => a + b, 0);
    svg.append(el("svg:text", { x: left + n * cell + 45, y: y + cell / 2, class: "value rowsum" }, sum.toFixed(4)));
  });
  legend(svg, left, top + n * cell + 16, n * cell, "weight");
  box.append(el("p", { class: "caption" }, "Row = query token, column = key token; tab to a cell to hear its value."),
             svg);
}

// A line plot over x = log2(d_k); ys per series, y on a linear axis from lo to hi.
function linePlot({ title, xs, series, lo, hi, ticks, fmt, marker }) {
  const width = 380, height = 230, left = 56, right = 12, top = 28, bottom = 40;
  const w = width - left - right, h = height - top - bottom;
  const sx = (x) => left + ((x - xs[0]) / (xs[xs.length - 1] - xs[0])) * w;
  const sy = (y) => top + (1 - (Math.min(hi, Math.max(lo, y)) - lo) / (hi - lo)) * h;
  const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", class: "plot",
                              "aria-label": title });
  svg.append(el("svg:title", {}, title), el("svg:text", { x: left, y: 16, class: "axis" }, title));
  for (const t of ticks) {
    svg.append(el("svg:line", { x1: left, x2: left + w, y1: sy(t), y2: sy(t), class: "grid" }),
               el("svg:text", { x: left - 6, y: sy(t), class: "tick end mid" }, fmt(t)));
  }
  for (const x of xs) {
    if (x % 2 === 0) svg.append(el("svg:text", { x: sx(x), y: top + h + 16, class: "tick middle" }, String(2 ** x)));
  }
  svg.append(el("svg:text", { x: left + w / 2, y: height - 4, class: "tick middle" }, "d_k (log scale)"));
  if (marker !== undefined) {
    svg.append(el("svg:line", { x1: sx(marker), x2: sx(marker), y1: top, y2: top + h, class: "marker" }));
  }
  series.forEach((s, k) => {
    const d = s.ys.map((y, i) => `${i ? "L" : "M"}${sx(xs[i]).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
    svg.append(el("svg:path", { d, class: `line ${s.cls}` }));
    s.ys.forEach((y, i) => {
      const dot = el("svg:circle", { cx: sx(xs[i]), cy: sy(y), r: 3, class: `dot ${s.cls}` });
      dot.append(el("svg:title", {}, `${s.label}, d_k = ${2 ** xs[i]}: ${y.toPrecision(3)}`));
      svg.append(dot);
    });
    const at = k === 0 ? { x: left, class: `tick key ${s.cls}` } : { x: left + w, class: `tick end key ${s.cls}` };
    svg.append(el("svg:text", { y: height - 4, ...at }, `— ${s.label}`));
  });
  return svg;
}

function bars(title, ps, scores, cls) {
  const width = 190, height = 130, top = 24, h = 80, bw = 18;
  const svg = el("svg:svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", class: "plot",
                              "aria-label": `${title}: ${ps.map((p) => p.toFixed(3)).join(", ")}` });
  svg.append(el("svg:text", { x: 4, y: 14, class: "axis" }, title));
  ps.forEach((p, i) => {
    const r = el("svg:rect", { x: 8 + i * (bw + 4), y: top + h * (1 - p), width: bw, height: Math.max(0.5, h * p),
                               class: `bar ${cls}` });
    r.append(el("svg:title", {}, `key ${i}: score ${scores[i].toFixed(2)}, weight ${p.toFixed(4)}`));
    svg.append(r);
  });
  svg.append(el("svg:text", { x: 8, y: top + h + 16, class: "tick" }, "8 keys: softmax weights"));
  return svg;
}

function scaling(show, box) {
  const xs = show.sweep.map((r) => Math.log2(r.d_k));
  const col = (k) => show.sweep.map((r) => r[k]);
  const lg = (ys) => ys.map((y) => Math.log10(Math.max(y, 1e-12)));
  const row = el("div", { class: "plots" });
  row.append(bars(`unscaled, d_k = ${show.d_k}`, show.weights_unscaled, show.raw, "unscaled"),
             bars(`scaled by 1/√${show.d_k}`, show.weights_scaled, show.scaled, "scaled"));
  row.append(linePlot({ title: "softmax entropy (nats), median of 15", xs, lo: 0, hi: 2.2, ticks: [0, 0.5, 1, 1.5, 2],
                        fmt: (t) => t.toFixed(1), marker: Math.log2(show.d_k),
                        series: [{ label: "unscaled", ys: col("entropy_unscaled"), cls: "unscaled" },
                                 { label: "scaled", ys: col("entropy_scaled"), cls: "scaled" }] }));
  row.append(linePlot({ title: "largest |∂p/∂s| (log10), median of 15", xs, lo: -12, hi: 0, ticks: [0, -3, -6, -9, -12],
                        fmt: (t) => `1e${t}`, marker: Math.log2(show.d_k),
                        series: [{ label: "unscaled", ys: lg(col("gradient_unscaled")), cls: "unscaled" },
                                 { label: "scaled", ys: lg(col("gradient_scaled")), cls: "scaled" }] }));
  box.append(row);
}

function positions(show, box) {
  const table = el("table", { class: "pe" });
  const cap = el("caption", {}, `Sinusoidal encoding, d = ${show.d}` +
                 (show.d === 4 ? " (the worked example: position 1 is (0.841, 0.540, 0.010, 1.000))" : ""));
  const head = el("tr");
  head.append(el("th", { scope: "col" }, "position"));
  for (let j = 0; j < show.d; j++) head.append(el("th", { scope: "col" }, `${j % 2 ? "cos" : "sin"} ${j}`));
  table.append(cap, head);
  show.table.forEach((values, r) => {
    const pos = show.positions[r];
    const tr = el("tr", show.d === 4 && (pos === 0 || pos === 1) ? { class: "worked" } : {});
    tr.append(el("th", { scope: "row" }, String(pos)));
    values.forEach((v, j) => {
      const td = el("td", { title: `PE(${pos}, ${j}) = ${v}` }, v.toFixed(3));
      td.style.backgroundColor = diverging(v);         // CSSOM, allowed by the page's style-src 'self'
      if (Math.abs(v) > 0.6) td.classList.add("light");
      tr.append(td);
    });
    table.append(tr);
  });
  box.append(table);
}

function order(show, box) {
  const table = el("table", { class: "order" });
  table.append(el("caption", {}, `max |output in “${show.sentences[0]}” − output in “${show.sentences[1]}”| per word`));
  const words = Object.keys(show.rows[0].diff);
  const head = el("tr");
  head.append(el("th", { scope: "col" }, "word"));
  show.rows.forEach((r) => head.append(el("th", { scope: "col" }, r.positions ? "positions added" : "no positions")));
  table.append(head);
  for (const w of words) {
    const tr = el("tr");
    tr.append(el("th", { scope: "row" }, w));
    show.rows.forEach((r) => {
      const v = r.diff[w];
      const td = el("td", { class: v < 1e-9 ? "same" : "differs" }, v < 1e-9 ? "0 (identical)" : v.toFixed(4));
      tr.append(td);
    });
    table.append(tr);
  }
  const vectors = el("table", { class: "order" });
  vectors.append(el("caption", {}, "the output vector of “dog” (d = 4)"));
  for (const r of show.rows) {
    show.sentences.forEach((sentence, k) => {
      const tr = el("tr");
      tr.append(el("th", { scope: "row" }, `${r.positions ? "positions" : "no positions"}, “${sentence}”`));
      for (const x of k ? r.dog_b : r.dog_a) tr.append(el("td", {}, x.toFixed(4)));
      vectors.append(tr);
    });
  }
  box.append(table, vectors);
}

const RENDERERS = { heatmap, scaling, positions, order };

export function render(show, box) {
  box.replaceChildren();
  const draw = show && RENDERERS[show.kind];
  if (draw) draw(show, box);
}
