// The lesson's Python: Pyodide in a module Web Worker, so a runaway loop blocks this thread, never the page.
// Messages in:  {id, code}               run one cell in a fresh namespace
// Messages out: {type: "ready", version} once, after Pyodide started ("Pyodide 314.0.8, Python 3.14.2")
//               {type: "failed", message} Pyodide could not start
//               {type: "result", id, ok, stdout, error, show}   error: the traceback; show: the cell's `show` as JSON
// The page ends a run by terminating this worker and starting a new one (see lesson.js).

const INDEX_URL = "/lesson/pyodide/";     // served by attnlab serve from node_modules/pyodide (web/lesson.py)

// Runs a cell as __main__ in its own dict; the traceback drops this runner's frame and shows the cell's lines.
const RUNNER = `
import json, linecache, traceback

def _attnlab_run(code):
    linecache.cache["<cell>"] = (len(code), None, code.splitlines(True), "<cell>")
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(code, "<cell>", "exec"), namespace)
    except BaseException as e:
        lines = traceback.format_exception(type(e), e, e.__traceback__.tb_next)
        return json.dumps({"ok": False, "error": "".join(lines), "show": None})
    try:
        show = json.dumps(namespace.get("show"), allow_nan=False)
    except (TypeError, ValueError) as e:
        return json.dumps({"ok": False, "error": f"show must be plain JSON data (lists, dicts, numbers): {e}",
                           "show": None})
    return json.dumps({"ok": True, "error": None, "show": json.loads(show)})
`;

let out = [];
const decoder = new TextDecoder();
const write = (bytes) => { out.push(decoder.decode(bytes, { stream: true })); return bytes.length; };

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
  out = [];
  let reply;
  try {
    reply = JSON.parse(python.run(code));
  } catch (err) {                            // a failure of the interpreter itself, not of the cell
    reply = { ok: false, error: String(err), show: null };
  }
  out.push(decoder.decode());
  postMessage({ type: "result", id, stdout: out.join(""), ...reply });
};
