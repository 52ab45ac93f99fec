// The PyTorch read-along: the server's fixed programs (web/readalong.py), shown cell by cell and run on request
// by the local torch. The page sends a program's name only; the code it shows is the code the server runs.

const PROGRAM = "self-attention";
const SCALING = "scaling";

function node(tag, cls, text) {
  const n = document.createElement(tag);
  if (cls) n.className = cls;
  if (text !== undefined) n.textContent = text;
  return n;
}

function drawProgram(box, name, program) {
  const wrap = node("div", "program");
  wrap.id = `readalong-${name}`;
  wrap.append(node("h3", "", program.title));
  program.cells.forEach((cell, i) => {
    const part = node("div", "ra-cell");
    part.append(node("h4", "", cell.title), node("pre", "ra-code", cell.code));
    const out = node("pre", "ra-out", "(not run yet)");
    out.id = `ra-out-${name}-${i}`;
    out.setAttribute("aria-label", `output of ${cell.title}`);
    part.append(out);
    wrap.append(part);
  });
  box.append(wrap);
}

async function post(name) {
  const r = await fetch(`/lesson/api/readalong/${encodeURIComponent(name)}`,
                        { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
  const data = await r.json();
  if (!r.ok) throw new Error(data.detail || `HTTP ${r.status}`);
  return data;
}

export async function setupReadalong() {
  const box = document.getElementById("readalong-programs");
  const button = document.getElementById("readalong-run");
  const state = document.getElementById("readalong-state");
  const agreement = document.getElementById("readalong-agreement");
  let programs;
  try {
    const r = await fetch("/lesson/api/readalong");
    programs = (await r.json()).programs;
  } catch (err) {
    state.textContent = `could not load the read-along: ${err.message}`;
    return;
  }
  const names = [PROGRAM, SCALING].filter((n) => programs[n]);
  for (const name of names) drawProgram(box, name, programs[name]);

  async function run() {
    button.disabled = true;
    state.textContent = "running on this machine's torch…";
    try {
      for (const name of names) {
        const result = await post(name);
        result.cells.forEach((cell, i) => {
          document.getElementById(`ra-out-${name}-${i}`).textContent = cell.output || "(no output)";
        });
        if (result.agree !== null) {
          const worst = Math.max(...Object.values(result.agreement));
          agreement.textContent = result.agree
            ? `The three agree: the largest difference is ${worst.toExponential(1)}, within ${result.tolerance.toExponential(0)}.`
            : `They disagree: the largest difference is ${worst.toExponential(1)}, over ${result.tolerance.toExponential(0)}.`;
          agreement.className = result.agree ? "agree" : "disagree";
          agreement.dataset.max = String(worst);
        }
      }
      state.textContent = `ran at ${new Date().toLocaleTimeString()}`;
      box.dataset.runs = String(Number(box.dataset.runs) + 1);
    } catch (err) {
      state.textContent = `the read-along failed: ${err.message}`;
    }
    button.disabled = false;
  }
  button.addEventListener("click", run);        // only then: the page says it runs when the button is pressed
}
