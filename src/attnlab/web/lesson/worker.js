// The lesson's Python: Pyodide in a module Web Worker, so a runaway loop blocks this thread, never the page.
// Messages in:  {id, code}               run one cell in a fresh namespace (the page sends one at a time)
// Messages out: {type: "ready", version} once, after Pyodide started ("Pyodide 314.0.8, Python 3.14.2")
//               {type: "failed", message} Pyodide could not start
//               {type: "stdout", id, text}  printed text (stdout and stderr), line by line as the cell prints it
//                                           (in a flood of lines, at most ~1000 messages a second)
//               {type: "result", id, ok, error, show}   error: the traceback; show: the cell's `show` as JSON
// The page ends a run by terminating this worker and starting a new one (see lesson.js).

const INDEX_URL = "/lesson/pyodide/";     // served by attnlab serve from node_modules/pyodide (web/lesson.py)

// Runs a cell as __main__ in its own dict; the traceback drops this runner's frame and shows the cell's lines.
// The flush at the end sends a last partial line (print(..., end="")): stdout is line-buffered here.
const RUNNER = `
import json, linecache, sys, traceback

def _attnlab_run(code):
    linecache.cache["<cell>"] = (len(code), None, code.splitlines(True), "<cell>")
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(code, "<cell>", "exec"), namespace)
    except BaseException as e:
        lines = traceback.format_exception(type(e), e, e.__traceback__.tb_next)
        return json.dumps({"ok": False, "error": "".join(lines), "show": None})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        show = json.dumps(namespace.get("show"), allow_nan=False)
    except (TypeError, ValueError) as e:
        return json.dumps({"ok": False, "error": f"show must be plain JSON data (lists, dicts, numbers): {e}",
                           "show": None})
    return json.dumps({"ok": True, "error": None, "show": json.loads(show)})
`;

let runId = null;                          // the run whose output is being printed
const decoder = new TextDecoder();
// Python's stdout is line-buffered here, so each write is a line (or 8 KB of one). Nothing runs in this worker
// while Python does, so a line held back could never be sent later: a cell that prints and then loops forever
// would lose it. Posting every line, though, swamps the page when a cell prints in a loop. A token bucket does
// both: up to BURST writes go at once, then at most RATE_PER_MS per ms, each carrying all text held since the
// last (at most ~1 ms of a flood of printing can be held when a Stop comes).
const BURST = 100, RATE_PER_MS = 1;
let tokens = BURST, refilled = performance.now(), held = "";

function post(id) {
  if (held) postMessage({ type: "stdout", id, text: held });
  held = "";
}

const write = (bytes) => {
  held += decoder.decode(bytes, { stream: true });
  const now = performance.now();
  tokens = Math.min(BURST, tokens + (now - refilled) * RATE_PER_MS);
  refilled = now;
  if (tokens >= 1) {
    tokens -= 1;
    post(runId);
  }
  return bytes.length;
};

const ready = (async () => {
  const { loadPyodide } = await import(INDEX_URL + "pyodide.mjs");
  const py = await loadPyodide({ indexURL: INDEX_URL });
  py.setStdout({ write });
  py.setStderr({ write });
  py.runPython(RUNNER);
  return { version: py.version, python: py.runPython("import sys; sys.version.split()[0]"),
           run: py.globals.get("_attnlab_run") };
})();

ready.then(
  (python) => postMessage({ type: "ready", version: `Pyodide ${python.version}, Python ${python.python}` }),
  (err) => postMessage({ type: "failed", message: String(err && err.message ? err.message : err) }),
);

onmessage = async (event) => {
  const { id, code } = event.data;
  const python = await ready;
  runId = id;
  let reply;
  try {
    reply = JSON.parse(python.run(code));
  } catch (err) {                            // a failure of the interpreter itself, not of the cell
    reply = { ok: false, error: String(err), show: null };
  }
  held += decoder.decode();
  post(id);
  postMessage({ type: "result", id, ...reply });
};
