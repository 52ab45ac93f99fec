// The lesson page: editable Python cells run by Pyodide in a Web Worker (worker.js), their drawings (viz.js),
// the PyTorch read-along (readalong.js) and the quiz (quiz.js).
//
// State for tests and assistive tech: body[data-python] is starting | ready | failed; each .cell carries
// data-state (queued | running | done | error | stopped), data-runs (finished runs) and data-show (the cell's
// `show`, empty until a run succeeds).
import { render } from "./viz.js";
import { setupQuiz } from "./quiz.js";
import { setupReadalong } from "./readalong.js";

// Pyodide starts in seconds; a wrong MIME type makes it hang, never fail. ?load_timeout=S shortens it (the tests).
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

// One worker, and one run in it at a time: the page keeps the queue, so it always knows which run is in the
// worker. Stop on the running cell terminates the worker (ending its run) and starts a fresh one, on which the
// queued runs then go on; Stop on a queued cell only takes that run out of the queue.
class Python {
  constructor() { this.nextId = 0; this.queue = []; this.current = null; this.start(); }

  // Why the queued runs wait, told to each (their cell says it) whenever it changes.
  announce() {
    const why = !this.isReady ? "waiting for Python" : this.current ? "another cell is running" : "";
    for (const run of this.queue) run.onQueued(why);
  }

  start() {
    setPython("starting", "starting (loading Pyodide from this server)…");
    this.isReady = false;
    this.announce();
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
        if (this.worker !== worker) return;                               // a stopped worker's last words
        if (data.type === "ready") { clearTimeout(timer); resolve(data.version); }
        else if (data.type === "failed") { clearTimeout(timer); reject(new Error(`Python failed to start: ${data.message}`)); }
        else if (this.current && this.current.id === data.id) {
          if (data.type === "stdout") this.current.onStdout(data.text);
          else if (data.type === "result") this.finish(this.current, data);
        }
      };
      worker.onerror = (e) => { clearTimeout(timer); reject(new Error(`the Python worker failed: ${e.message || "error"}`)); };
    });
    this.ready = ready;
    ready.then((version) => {
      if (this.ready !== ready) return;
      setPython("ready", `ready (${version})`);
      this.isReady = true;
      this.announce();
    }, (err) => { if (err !== RESTARTED) { setPython("failed", "not available"); showProblem(err.message); } });
  }

  async started() {                            // a Stop while waiting for Python: wait for the fresh worker
    for (;;) {
      try { return await this.ready; } catch (err) { if (err !== RESTARTED) throw err; }
    }
  }

  // Queue `code`; onQueued(why) while it waits, onStart() when it enters the worker, onStdout(text) as it prints.
  // Returns the run: run.done resolves to the worker's result, {stopped: true, queued} after a Stop, or
  // {ok: false, error} if Python failed to start.
  run(code, { onQueued = () => {}, onStart = () => {}, onStdout = () => {} } = {}) {
    const run = { id: ++this.nextId, code, onQueued, onStart, onStdout };
    run.done = new Promise((resolve) => { run.resolve = resolve; });
    this.queue.push(run);
    this.announce();
    this.next();
    return run;
  }

  async next() {
    try {
      await this.started();
    } catch (err) {
      for (const run of this.queue.splice(0)) run.resolve({ ok: false, error: err.message, show: null });
      return;
    }
    if (this.current || !this.queue.length) return;       // checked after the wait: one run in the worker
    const run = this.queue.shift();
    this.current = run;
    run.onStart();
    this.announce();
    this.worker.postMessage({ id: run.id, code: run.code });
  }

  finish(run, result) {
    this.current = null;
    run.resolve(result);
    this.next();
  }

  stop(run) {
    if (run === this.current) {
      this.abandon();
      this.worker.terminate();
      this.start();
      this.finish(run, { stopped: true, queued: false });  // the queue goes on once the fresh worker is ready
    } else if (this.queue.includes(run)) {
      this.queue.splice(this.queue.indexOf(run), 1);
      run.resolve({ stopped: true, queued: true });
    }
  }
}

// A cell's printed text, drawn at most every FRAME_MS however fast it arrives, and trimmed to its last KEEP
// characters past MAX_SHOWN (a loop that prints forever must not grow the page without bound).
const FRAME_MS = 30, MAX_SHOWN = 200_000, KEEP = 100_000;

function printer(out) {
  const span = el("span", "stdout", "");
  out.replaceChildren(span);
  let waiting = "", shown = 0, timer = null;
  const paint = () => {
    timer = null;
    if (!waiting) return;
    shown += waiting.length;
    if (shown > MAX_SHOWN) {
      const text = "[… earlier output trimmed]\n" + (span.textContent + waiting).slice(-KEEP);
      span.textContent = text;
      shown = text.length;
    } else {
      span.append(waiting);
    }
    waiting = "";
  };
  return {
    write(text) { waiting += text; if (timer === null) timer = setTimeout(paint, FRAME_MS); },
    flush() { clearTimeout(timer); paint(); },
  };
}

// Editors fit their code: one row per line plus one (room for the sideways scrollbar), within MIN..MAX rows.
// Every shipped cell shows whole (the longest is 52 lines); a long pasted program scrolls inside its editor.
const MIN_ROWS = 4, MAX_ROWS = 60;

function fit(code) {
  const lines = code.value.replace(/\n$/, "").split("\n").length;
  code.rows = Math.min(MAX_ROWS, Math.max(MIN_ROWS, lines + 1));
}

function setupCell(cell, python) {
  const code = cell.querySelector("textarea.code");
  const out = cell.querySelector(".out");
  const viz = cell.querySelector(".viz");
  const state = cell.querySelector(".state");
  const [runB, resetB, stopB] = ["run", "reset", "stop"].map((c) => cell.querySelector(`button.${c}`));
  let job = null;                              // this cell's run, queued or in the worker

  async function run() {
    if (job) return;
    // A new run owns the output from the start: the old text goes now (the new streams in), and the old drawing
    // is dimmed, then replaced by the new one or removed, so no drawing ever sits under a traceback or a Stop.
    const printed = printer(out);
    viz.classList.add("stale");
    cell.dataset.state = "queued";
    cell.dataset.show = "";
    runB.disabled = true;
    stopB.disabled = false;
    let started = performance.now();
    job = python.run(code.value, {
      onQueued: (why) => { state.textContent = why ? `queued (${why})…` : "queued…"; },
      onStart: () => { cell.dataset.state = "running"; state.textContent = "running…"; started = performance.now(); },
      onStdout: (text) => printed.write(text),
    });
    const r = await job.done;
    job = null;
    printed.flush();
    runB.disabled = false;
    stopB.disabled = true;
    viz.classList.remove("stale");
    if (r.stopped) {
      viz.replaceChildren();
      out.append(el("span", "stopped", r.queued
        ? "Stopped before it started: it was waiting for another cell. Press Run to queue it again."
        : "Stopped: the Python worker was ended and a fresh one is starting. Edit the code and press Run again."));
      cell.dataset.state = "stopped";
      state.textContent = "stopped";
    } else {
      if (r.error) out.append(el("span", "traceback", r.error));
      cell.dataset.state = r.ok ? "done" : "error";
      state.textContent = r.ok ? `ran in ${((performance.now() - started) / 1000).toFixed(2)} s` : "error (see below)";
      if (r.ok) render(r.show, viz);
      else viz.replaceChildren();
      cell.dataset.show = r.ok ? JSON.stringify(r.show) : "";
    }
    cell.dataset.runs = String(Number(cell.dataset.runs || 0) + 1);
  }

  fit(code);
  code.addEventListener("input", () => fit(code));
  cell.addEventListener("fit", () => fit(code));         // a knob rewrote the code (rewrite())
  runB.addEventListener("click", run);
  stopB.addEventListener("click", () => { if (job) python.stop(job); });
  resetB.addEventListener("click", () => {
    code.value = code.defaultValue;
    fit(code);
    cell.dispatchEvent(new Event("reset"));
  });
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
  cell.dispatchEvent(new Event("fit"));
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
