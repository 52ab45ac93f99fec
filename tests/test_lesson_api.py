"""The lesson's routes (attnlab.web.lesson): the page and its files with their MIME types and CSP, where the
Pyodide files are found and the message when they are not, and the read-along endpoint (fixed programs only;
unknown names → 404)."""
from __future__ import annotations

import json
import logging
import re

import pytest

fastapi = pytest.importorskip("fastapi", reason="the web lab needs fastapi")
import torch  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from attnlab.web import create_app, lesson, readalong  # noqa: E402
from attnlab.web.lesson import (LESSON_DIR, PYODIDE_ENV, PYODIDE_FILES, PYODIDE_VERSION, PyodideFiles,  # noqa: E402
                                find_pyodide, lesson_router)
from attnlab.web.readalong import PROGRAMS, Cell, Program, run_program  # noqa: E402

MIME = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript", ".zip": "application/zip",
        ".json": "application/json", ".css": "text/css"}


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), base_url="http://127.0.0.1:8000")


def fake_pyodide(folder, version=PYODIDE_VERSION, skip=()):
    """A folder shaped like node_modules/pyodide: the five files (tiny) and a package.json."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in PYODIDE_FILES:
        if name not in skip:
            (folder / name).write_bytes(b"\0asm" if name.endswith(".wasm") else b"{}")
    (folder / "package.json").write_text(json.dumps({"name": "pyodide", "version": version}))
    return folder


def app_with(files: PyodideFiles) -> TestClient:
    app = FastAPI()
    app.include_router(lesson_router(files))
    return TestClient(app, base_url="http://127.0.0.1")


def suffix(name: str) -> str:
    return name[name.rindex("."):]


def test_page_is_served_with_the_wasm_csp(client):
    r = client.get("/lesson")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self' 'wasm-unsafe-eval';" in csp and "default-src 'self'" in csp
    assert "unsafe-inline" not in csp and "'unsafe-eval'" not in csp and "http" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert 'href="/"' in r.text                                    # the link back to the lab
    assert "wasm-unsafe-eval" not in client.get("/").headers["content-security-policy"]   # the lab's stays strict
    assert 'href="/lesson"' in client.get("/").text                # and the lab links to the lesson


def test_lesson_files_and_their_mime_types(client):
    names = sorted(p.name for p in LESSON_DIR.iterdir() if p.suffix in (".js", ".css"))
    assert {"lesson.js", "worker.js", "viz.js", "quiz.js", "readalong.js", "lesson.css"} <= set(names)
    for name in names:
        r = client.get(f"/lesson/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"].split(";")[0] == MIME[suffix(name)], name
        assert "wasm-unsafe-eval" in r.headers["content-security-policy"]     # the worker's script carries it
    for bad in ("lesson.html", "missing.js", "..%2Flesson.py", "%2E%2E%2Fapp.py"):
        assert client.get(f"/lesson/static/{bad}").status_code == 404, bad


def test_no_file_of_the_lesson_points_elsewhere():
    for path in LESSON_DIR.iterdir():
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"')`]*", path.read_text()))
        assert urls <= {"http://www.w3.org/2000/svg"}, (path.name, urls)


def test_pyodide_files_are_served_with_their_mime_types(tmp_path):
    folder = fake_pyodide(tmp_path / "pyodide")
    files = find_pyodide(env={PYODIDE_ENV: str(folder)})
    assert files.dir == folder.resolve() and files.version == PYODIDE_VERSION and files.problem is None
    c = app_with(files)
    for name in PYODIDE_FILES:
        r = c.get(f"/lesson/pyodide/{name}")
        assert r.status_code == 200 and r.headers["content-type"].split(";")[0] == MIME[suffix(name)], name
    assert c.get("/lesson/pyodide/pyodide.asm.wasm").headers["content-type"] == "application/wasm"
    for bad in ("package.json", "pyodide.js", "..%2Fpackage.json"):          # only the five files
        assert c.get(f"/lesson/pyodide/{bad}").status_code == 404, bad
    assert c.get("/lesson/api/pyodide").json() == dict(found=True, version=PYODIDE_VERSION, dir=str(folder.resolve()),
                                                        problem=None)


def test_the_installed_pyodide_is_the_pinned_one(client):
    files = find_pyodide()
    if files.dir is None:
        pytest.skip(files.problem)
    assert files.version == PYODIDE_VERSION
    r = client.get("/lesson/pyodide/pyodide.asm.wasm")
    assert r.headers["content-type"] == "application/wasm" and r.content[:4] == b"\0asm"
    assert client.get("/lesson/pyodide/pyodide.mjs").headers["content-type"].startswith("text/javascript")


def test_missing_pyodide_says_which_command_installs_it(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(lesson, "_CHECKOUT_ROOT", tmp_path / "checkout")
    files = find_pyodide(env={}, cwd=tmp_path)
    assert files.dir is None
    for needed in ("npm ci", f"npm install pyodide@{PYODIDE_VERSION}", PYODIDE_ENV):
        assert needed in files.problem
    with caplog.at_level(logging.WARNING, logger="attnlab.web"):
        c = app_with(files)
    assert "npm ci" in caplog.text                                  # the serve log says it
    info = c.get("/lesson/api/pyodide").json()
    assert info["found"] is False and "npm ci" in info["problem"]   # and the page shows it
    r = c.get("/lesson/pyodide/pyodide.mjs")
    assert r.status_code == 404 and "npm ci" in r.json()["detail"]
    assert c.get("/lesson").status_code == 200                      # the lesson's text still reads


def test_where_pyodide_is_looked_for(tmp_path, monkeypatch):
    monkeypatch.setattr(lesson, "_CHECKOUT_ROOT", tmp_path / "checkout")
    cwd_copy = fake_pyodide(tmp_path / "node_modules" / "pyodide")
    assert find_pyodide(env={}, cwd=tmp_path).dir == cwd_copy.resolve()         # a wheel user's npm install
    checkout_copy = fake_pyodide(tmp_path / "checkout" / "node_modules" / "pyodide")
    assert find_pyodide(env={}, cwd=tmp_path).dir == checkout_copy.resolve()    # the checkout's comes first
    explicit = fake_pyodide(tmp_path / "elsewhere")
    assert find_pyodide(env={PYODIDE_ENV: str(explicit)}, cwd=tmp_path).dir == explicit.resolve()


@pytest.mark.parametrize("problem", ["missing", "version"])
def test_a_bad_pyodide_dir_is_refused_with_the_reason(tmp_path, problem):
    if problem == "missing":
        folder, why = fake_pyodide(tmp_path / "p", skip=("pyodide.asm.wasm",)), "lacks pyodide.asm.wasm"
    else:
        folder, why = fake_pyodide(tmp_path / "p", version="0.26.4"), "holds pyodide 0.26.4, the lesson is pinned to"
    files = find_pyodide(env={PYODIDE_ENV: str(folder)})
    assert files.dir is None and why in files.problem and PYODIDE_ENV in files.problem


def test_readalong_lists_exactly_the_code_it_runs(client):
    listed = client.get("/lesson/api/readalong").json()["programs"]
    assert set(listed) == set(PROGRAMS)
    for name, program in PROGRAMS.items():
        assert [c["code"] for c in listed[name]["cells"]] == [c.code for c in program.cells]
    r = client.post("/lesson/api/readalong/self-attention", json={})
    assert r.status_code == 200, r.text
    d = r.json()
    assert [c["code"] for c in d["cells"]] == [c.code for c in PROGRAMS["self-attention"].cells]
    assert d["agree"] is True and len(d["agreement"]) == 3 and max(d["agreement"].values()) <= 1e-6
    assert all(c["output"] for c in d["cells"]) and "max |difference|" in d["cells"][-1]["output"]
    assert "(1, 4, 5, 5)" in d["cells"][2]["output"]                               # shapes, line by line


def test_readalong_runs_only_fixed_programs(client):
    for name in ("nope", "__init__", "self-attention.py", "_SETUP"):
        r = client.post(f"/lesson/api/readalong/{name}", json={})
        assert r.status_code == 404 and "the programs are ['scaling', 'self-attention']" in r.json()["detail"], name
    assert client.post("/lesson/api/readalong/..%2Freadalong", json={}).status_code == 404
    # a body is never run: code sent along is ignored, the fixed program runs (the body's cap: test_web_body_guard)
    r = client.post("/lesson/api/readalong/scaling", json={"code": "raise SystemExit('ran browser code')"})
    assert r.status_code == 200 and "1024" in r.json()["cells"][0]["output"] and r.json()["agree"] is None
    assert client.get("/lesson/api/readalong/scaling").status_code == 405
    bad_host = TestClient(create_app(), base_url="http://evil.example")
    assert bad_host.post("/lesson/api/readalong/scaling").status_code == 400      # the lab's Host check applies


def test_agreement_fails_a_wrong_implementation(monkeypatch):
    wrong = Program("a broken by-hand attention", (Cell("off by 1e-3", "agreement = {'manual vs torch': 1e-3}\n"),))
    monkeypatch.setitem(PROGRAMS, "broken", wrong)
    result = run_program("broken")
    assert result["agree"] is False and result["agreement"] == {"manual vs torch": 1e-3}


def test_a_run_leaves_the_server_as_it_was():
    before = torch.get_rng_state()
    run_program("self-attention")
    assert torch.equal(before, torch.get_rng_state())              # the program's manual_seed does not leak
    assert readalong._RUN_LOCK.acquire(blocking=False)
    readalong._RUN_LOCK.release()
