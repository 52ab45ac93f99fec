// The lesson page: editable Python cells run by Pyodide in a Web Worker (worker.js), their drawings (viz.js),
// the PyTorch read-along (readalong.js) and the quiz (quiz.js).
//
// State for tests and assistive tech: body[data-python] is starting | ready | failed; each .cell carries
// data-state (running | done | error | stopped), data-runs (completed runs) and data-show (the cell's `show`).
import { render } from "./viz.js";
import { setupQuiz } from "./quiz.js";
import { setupReadalong } from "./readalong.js";

// Pyodide starts in ~5 s; a wrong MIME type makes it hang, never fail. ?load_timeout=S shortens it (the tests).
const LOAD_TIMEOUT_S = Number(new URLSearchParams(location.search).get("load_timeout")) || 90;
const status = document.getElementById("py-status");
const problem = document.getElementById("py-problem");

function setPython(state, text) {
  document.body.dataset.python = state;
  status.textContent = `Python: ${text}`;
}

function showProblem(text) {
  problem.textContent = text;
  problem.hidden = false;
}

const RESTARTED = new Error("the Python worker was restarted");

// One worker at a time; stop() terminates it (ending whatever runs) and starts a fresh one.
class Python {
  constructor() { this.nextId = 0; this.pending = new Map(); this.start(); }

  start() {
    setPython("starting", "starting (loading Pyodide from this server)…");
    const worker = new Worker("/lesson/static/worker.js", { type: "module" });
    this.worker = worker;
    const ready = new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        worker.terminate();
        reject(new Error(`Python did not start within ${LOAD_TIMEOUT_S} s. Check attnlab serve's log; ` +
                         "/lesson/pyodide/pyodide.asm.wasm must be served as application/wasm."));
      }, LOAD_TIMEOUT_S * 1000);
      this.abandon = () => { clearTimeout(timer); reject(RESTARTED); };   // a no-op once it has started
      worker.onmessage = ({ data }) => {
        if (data.type === "ready") { clearTimeout(timer); resolve(data.version); }
        else if (data.type === "failed") { clearTimeout(timer); reject(new Error(`Python failed to start: ${data.message}`)); }
        else if (data.type === "result") {
          const done = this.pending.get(data.id);
          this.pending.delete(data.id);
          if (done) done(data);
        }
      };
      worker.onerror = (e) => { clearTimeout(timer); reject(new Error(`the Python worker failed: ${e.message || "error"}`)); };
    });
    this.ready = ready;
    ready.then((version) => { if (this.ready === ready) setPython("ready", `ready (${version})`); },
               (err) => { if (err !== RESTARTED) { setPython("failed", "not available"); showProblem(err.message); } });
  }

  async started() {                            // a Stop while waiting for Python: wait for the fresh worker
    for (;;) {
      try { return await this.ready; } catch (err) { if (err !== RESTARTED) throw err; }
    }
  }

  async run(code) {
    await this.started();
    const id = ++this.nextId;
    return new Promise((resolve) => { this.pending.set(id, resolve); this.worker.postMessage({ id, code }); });
  }

  stop() {
    this.abandon();
    this.worker.terminate();
    for (const done of this.pending.values()) done({ stopped: true });
    this.pending.clear();
    this.start();
  }
}

function setupCell(cell, python) {
  const code = cell.querySelector("textarea.code");
  const out = cell.querySelector(".out");
  const viz = cell.querySelector(".viz");
  const state = cell.querySelector(".state");
  const [runB, resetB, stopB] = ["run", "reset", "stop"].map((c) => cell.querySelector(`button.${c}`));
  let running = false;

  async function run() {
    if (running) return;
    running = true;
    cell.dataset.state = "running";
    runB.disabled = true;
    stopB.disabled = false;
    state.textContent = document.body.dataset.python === "ready" ? "running…" : "waiting for Python…";
    const started = performance.now();
    let r;
    try {
      r = await python.run(code.value);
    } catch (err) {
      r = { ok: false, stdout: "", error: err.message, show: null };
    }
    running = false;
    runB.disabled = false;
    stopB.disabled = true;
    const stdout = el("span", "stdout", r.stdout || "");
    out.replaceChildren(stdout);
    if (r.stopped) {
      out.append(el("span", "stopped", "Stopped: the Python worker was ended and a fresh one is starting. " +
                                         "Edit the code and press Run again."));
      cell.dataset.state = "stopped";
      state.textContent = "stopped";
    } else {
      if (r.error) out.append(el("span", "traceback", r.error));
      cell.dataset.state = r.ok ? "done" : "error";
      state.textContent = r.ok ? `ran in ${((performance.now() - started) / 1000).toFixed(2)} s` : "error (see below)";
      if (r.ok) render(r.show, viz);
      cell.dataset.show = r.ok ? JSON.stringify(r.show) : "";
    }
    cell.dataset.runs = String(Number(cell.dataset.runs || 0) + 1);
  }

  runB.addEventListener("click", run);
  stopB.addEventListener("click", () => python.stop());
  resetB.addEventListener("click", () => { code.value = code.defaultValue; cell.dispatchEvent(new Event("reset")); });
  code.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(); }
  });
  return run;
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  node.className = cls;
  node.textContent = text;
  return node;
}

// Knobs rewrite one line of the cell's code, so that what runs is always what is shown.
function rewrite(cell, pattern, line) {
  const code = cell.querySelector("textarea.code");
  if (!pattern.test(code.value)) {
    cell.querySelector(".state").textContent = `the line “${line.split(" ")[0]} = …” is gone from the code: press Reset`;
    return false;
  }
  code.value = code.value.replace(pattern, line);
  return true;
}

function setupKnobs(runs) {
  const dk = document.getElementById("dk");
  const dkValue = document.getElementById("dk-value");
  const scalingCell = document.getElementById("cell-scaling");
  dk.addEventListener("input", () => { dkValue.textContent = String(2 ** Number(dk.value)); });
  dk.addEventListener("change", () => {
    if (rewrite(scalingCell, /^d_k = \d+/m, `d_k = ${2 ** Number(dk.value)}`)) runs.scaling();
  });
  scalingCell.addEventListener("reset", () => { dk.value = "6"; dkValue.textContent = "64"; });

  const d = document.getElementById("pe-d");
  const pos = document.getElementById("pe-positions");
  const peCell = document.getElementById("cell-positions");
  const apply = () => {
    const list = pos.value.split(/[\s,]+/).filter(Boolean);
    if (!list.length || !list.every((p) => /^\d{1,6}$/.test(p)) || !/^\d{1,3}$/.test(d.value)) {
      peCell.querySelector(".state").textContent = "d: a whole number; positions: whole numbers separated by commas";
      return;
    }
    if (rewrite(peCell, /^d = \d+/m, `d = ${Number(d.value)}`) &&
        rewrite(peCell, /^positions = \[[^\]\n]*\]/m, `positions = [${list.map(Number).join(", ")}]`)) runs.positions();
  };
  document.getElementById("pe-apply").addEventListener("click", apply);
  for (const input of [d, pos]) input.addEventListener("keydown", (e) => { if (e.key === "Enter") apply(); });
  peCell.addEventListener("reset", () => { d.value = "4"; pos.value = "0, 1"; });
}

async function checkPyodide() {
  try {
    const r = await fetch("/lesson/api/pyodide");
    const info = await r.json();
    if (!info.found) { showProblem(info.problem); setPython("failed", "not installed on the server"); return false; }
  } catch (err) {
    showProblem(`could not ask the server where Pyodide is: ${err.message}`);
  }
  return true;
}

async function main() {
  setupQuiz(document.getElementById("quiz-questions"), document.getElementById("quiz-score"),
            document.getElementById("quiz-clear"));
  setupReadalong();
  if (!(await checkPyodide())) {
    for (const b of document.querySelectorAll(".cell button.run")) b.disabled = true;
    return;
  }
  const python = new Python();
  const runs = {};
  for (const cell of document.querySelectorAll(".cell")) runs[cell.dataset.cell] = setupCell(cell, python);
  setupKnobs(runs);
  try {
    await python.started();
  } catch {
    return;
  }
  for (const run of Object.values(runs)) await run();      // first view: every cell's output and drawing
}

main();
