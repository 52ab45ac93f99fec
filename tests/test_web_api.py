"""The web lab's API (attnlab.web.create_app): status codes, caps, Host check, JSON shapes; and `attnlab serve`'s
refusals."""
from __future__ import annotations

import argparse
import math
import re
import socket

import pytest

fastapi = pytest.importorskip("fastapi", reason="the web lab needs fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from attnlab.cli.serve import add_serve  # noqa: E402
from attnlab.lab.inspect import attention_maps  # noqa: E402
from attnlab.web import create_app  # noqa: E402
from attnlab.web.app import STATIC_DIR  # noqa: E402

CAP = 60
TEXT = "the dog bit the man"


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(max_chars=CAP), base_url="http://127.0.0.1:8000")


def post(client, **body):
    return client.post("/api/attention", json={"text": TEXT, "model": "toy-encoder"} | body)


def test_page_and_static_files_are_local(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '/static/app.js' in r.text and '/static/style.css' in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]
    for name in ("app.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200
    # no CDN, no web fonts: the only absolute URL anywhere is the SVG namespace (an identifier, never fetched)
    for path in STATIC_DIR.iterdir():
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"')]*", path.read_text()))
        assert urls <= {"http://www.w3.org/2000/svg"}, (path.name, urls)


def test_models_listing(client):
    data = client.get("/api/models").json()
    toy = [m for m in data["models"] if m["name"] == "toy-encoder"][0]
    assert toy == dict(name="toy-encoder", description=toy["description"], layers=2, heads=4, available=True)
    assert {"name": "reference", "exact": True} in data["backends"] and data["max_chars"] == CAP


def test_attention_json_shapes(client):
    r = post(client, layer=1)
    assert r.status_code == 200, r.text
    d = r.json()
    L = 5
    assert d["tokens"] == TEXT.split() and d["layer"] == 1 and d["heads"] == [0, 1, 2, 3]
    assert (d["n_layers"], d["n_heads"], d["model"], d["backend"], d["exact"]) == (2, 4, "toy-encoder", "auto", True)
    assert len(d["weights"]) == 4 and all(len(h) == L and all(len(row) == L for row in h) for h in d["weights"])
    for h, head in enumerate(d["weights"]):
        for row in head:
            assert abs(sum(row) - 1) < 1e-4
        # entropy recomputed here from the returned rows, independently of the server's
        ent = sum(-sum(p * math.log(p) for p in row if p > 0) for row in head) / L
        assert abs(ent - d["entropy"][h]) < 1e-4 and d["entropy"][h] <= d["max_entropy"] + 1e-9
    assert abs(d["max_entropy"] - math.log(L)) < 1e-12
    assert 0 <= d["agreement"] < 1e-5
    want = attention_maps("toy-encoder", TEXT, layer=1).weights[0]
    assert max(abs(a - b) for h in range(4) for i in range(L)
               for a, b in zip(d["weights"][h][i], want[h, i].tolist())) < 2e-6


def test_one_head_and_knobs(client):
    one = post(client, layer=0, head=2, backend="reference", scale_factor=4.0, positional=False).json()
    assert one["heads"] == [2] and len(one["weights"]) == 1 and one["agreement"] is None
    assert (one["positional"], one["scale_factor"], one["backend"]) == (False, 4.0, "reference")
    every = post(client, layer=0, backend="reference", scale_factor=4.0, positional=False).json()
    assert one["weights"][0] == every["weights"][2]
    # no positions: swapping "dog" and "man" swaps rows and columns 1 and 4 of every map
    other = client.post("/api/attention", json={"text": "the man bit the dog", "model": "toy-encoder", "layer": 0,
                                                  "positional": False, "scale_factor": 4.0, "head": 2}).json()
    p = [0, 4, 2, 3, 1]
    a, b = one["weights"][0], other["weights"][0]
    assert max(abs(a[p[i]][p[j]] - b[i][j]) for i in range(5) for j in range(5)) < 1e-5


def test_approximate_backend_is_flagged(client):
    d = post(client, backend="favor").json()
    assert d["exact"] is False and d["agreement"] > 1e-3


@pytest.mark.parametrize("body, status, match", [
    (dict(text=""), 422, "empty"),
    (dict(text=" \n\t "), 422, "empty"),
    (dict(text="x" * (CAP + 1)), 413, f"{CAP + 1} characters, over the cap of {CAP}"),
    (dict(model="nope"), 404, "not a registered model"),
    (dict(model="../../runs/demo/gpt"), 404, "not a registered model"),
    (dict(layer=2), 422, "layer 2 does not exist"),
    (dict(layer=-1), 422, "layer -1 does not exist"),
    (dict(head=4), 422, "head 4 does not exist"),
    (dict(backend="fast"), 422, "unknown backend 'fast'"),
    (dict(layer="1"), 422, "layer"),
    (dict(positional="no"), 422, "positional"),
    (dict(scale_factor=0), 422, "scale_factor"),
    (dict(scale_factor=1000), 422, "scale_factor"),
    (dict(text=None), 422, "text"),
    (dict(path="/etc/passwd"), 422, "path"),
])
def test_bad_input_is_a_4xx_with_a_message(client, body, status, match):
    r = post(client, **body)
    assert r.status_code == status, r.text
    assert isinstance(r.json()["detail"], str) and re.search(match, r.json()["detail"]), r.json()


def test_text_at_the_cap_is_accepted(client):
    assert post(client, text="a" * CAP).status_code == 200


def test_missing_text_and_malformed_json(client):
    assert client.post("/api/attention", json={"model": "toy-encoder"}).status_code == 422
    r = client.post("/api/attention", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "Invalid JSON" in r.json()["detail"]


def test_huge_body_is_refused_before_parsing(client):
    r = client.post("/api/attention", content=b'{"text": "' + b"a" * 100_000 + b'"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and "capped" in r.json()["detail"]


def test_token_cap():
    c = TestClient(create_app(max_chars=1000), base_url="http://127.0.0.1")
    r = c.post("/api/attention", json={"text": "a " * 200, "model": "toy-encoder"})
    assert r.status_code == 413 and "200 tokens" in r.json()["detail"]


@pytest.mark.parametrize("host, ok", [("127.0.0.1:8000", True), ("localhost:1234", True), ("localhost", True),
                                      ("evil.example", False), ("127.0.0.1.evil.example", False),
                                      ("0.0.0.0:8000", False)])
def test_host_header_check(host, ok):
    c = TestClient(create_app(), base_url="http://127.0.0.1")
    r = c.get("/api/models", headers={"host": host})
    assert (r.status_code == 200) == ok and (ok or r.status_code == 400), (host, r.status_code)
    r = c.post("/api/attention", json={"text": TEXT, "model": "toy-encoder"}, headers={"host": host})
    assert (r.status_code == 200) == ok


def test_a_model_that_fails_to_load_is_a_503(client, tmp_path, monkeypatch):
    from attnlab.lab import inspect
    monkeypatch.setattr(inspect, "DEMO_GPT", tmp_path)           # exists, but holds no checkpoint
    monkeypatch.setattr(inspect, "_LOADED", {})
    r = post(client, model="gpt-demo")
    assert r.status_code == 503 and "could not be loaded" in r.json()["detail"]


def test_no_interactive_docs(client):
    assert client.get("/docs").status_code == 404 and client.get("/openapi.json").status_code == 404


def test_create_app_arguments():
    with pytest.raises(ValueError, match="max_chars"):
        create_app(max_chars=0)
    with pytest.raises(ValueError, match="allowed_hosts"):
        create_app(allowed_hosts=["*"])


def _serve(argv: list[str]):
    p = argparse.ArgumentParser()
    add_serve(p.add_subparsers(dest="cmd"))
    args = p.parse_args(["serve", *argv])
    return args.run(args)


def test_serve_refuses_other_hosts(capsys):
    assert _serve(["--host", "0.0.0.0"]) == 2
    assert "refused" in capsys.readouterr().err


def test_serve_refuses_a_busy_port_and_bad_caps(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert _serve(["--port", str(s.getsockname()[1])]) == 2
        assert "in use" in capsys.readouterr().err
    assert _serve(["--max-chars", "0"]) == 2
    assert "--max-chars" in capsys.readouterr().err


# -- issue #18: other sites cannot drive the lab; a burst cannot starve the cheap routes -----------------------
@pytest.mark.parametrize("headers, status, match", [
    ({"origin": "http://evil.example"}, 403, "cross-origin request refused"),
    ({"origin": "null"}, 403, "cross-origin"),                               # sandboxed frames, file:// pages
    ({"origin": "http://localhost:8000"}, 403, "cross-origin"),             # another name for us is another origin
    ({"origin": "http://127.0.0.1:9999"}, 403, "cross-origin"),             # another local service's page
    ({"sec-fetch-site": "cross-site"}, 403, "cross-site request refused"),
    ({"content-type": "text/plain"}, 415, "Content-Type must be application/json, got 'text/plain'"),
    ({"content-type": "application/x-www-form-urlencoded"}, 415, "application/json"),
    ({"content-type": ""}, 415, "got 'none'"),
])
def test_foreign_origins_and_non_json_bodies_are_refused(client, headers, status, match):
    body = b'{"text": "the dog bit the man", "model": "toy-encoder"}'
    r = client.post("/api/attention", content=body, headers={"content-type": "application/json"} | headers)
    assert r.status_code == status and re.search(match, r.json()["detail"]), (r.status_code, r.text)


def test_own_origin_is_answered(client):
    body = b'{"text": "the dog bit the man", "model": "toy-encoder"}'
    r = client.post("/api/attention", content=body, headers={"content-type": "application/json; charset=utf-8",
                                                             "origin": "http://127.0.0.1:8000",
                                                             "sec-fetch-site": "same-origin"})
    assert r.status_code == 200, r.text
    assert client.get("/api/models", headers={"origin": "http://evil.example"}).status_code == 200   # reads: no state


def test_the_kernel_that_ran_is_named(client):
    auto = post(client).json()
    assert auto["backend"] == "auto" and auto["kernel"] == "sdpa"          # no mask, no bias: SDPA's flash kernel
    assert post(client, backend="tiled").json()["kernel"] == "tiled"


def _serve_in_thread(app):
    import threading
    import time
    import uvicorn
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start within 20 s"
        time.sleep(0.05)
    return srv, thread, f"http://127.0.0.1:{port}"


def test_a_burst_gets_429s_while_the_model_list_stays_fast(monkeypatch):
    """12 concurrent POSTs against a cap of 3, each computation holding the model lock until the test lets
    it go: the excess is refused with Retry-After, and /api/models, asked while the lock is held, answers
    (it never waits for a computation). The cause, not the speed: were /api/models to need the lock, it
    could only answer after the release, so its request would hit the guard. Loopback only; every loop
    and request is bounded by a hang guard (HANG_S)."""
    import json
    import threading
    import time
    import urllib.error
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    pytest.importorskip("uvicorn")
    from attnlab.lab import inspect
    from attnlab.web import app as app_mod
    real = app_mod.attention_maps
    HANG_S = 120                                                            # far beyond a healthy run's seconds
    release, holding = threading.Event(), threading.Event()

    def slow(*args, **kwargs):
        with inspect._LOCK:                                                 # what serialises real computations
            holding.set()
            release.wait(2 * HANG_S)
            holding.clear()
            return real(*args, **kwargs)

    monkeypatch.setattr(app_mod, "attention_maps", slow)
    srv, thread, base = _serve_in_thread(create_app(max_computing=3))
    body = json.dumps({"text": TEXT, "model": "toy-encoder"}).encode()

    def one(_):
        req = urllib.request.Request(base + "/api/attention", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=3 * HANG_S) as r:
                return r.status, None
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Retry-After")

    try:
        with ThreadPoolExecutor(12) as pool:
            burst = [pool.submit(one, i) for i in range(12)]
            deadline = time.monotonic() + HANG_S
            while not holding.is_set() or sum(f.done() for f in burst) < 12 - 3:   # lock held; the excess refused
                assert time.monotonic() < deadline, "hang guard: the burst neither computed nor was refused"
                time.sleep(0.05)
            with urllib.request.urlopen(base + "/api/models", timeout=HANG_S) as r:   # the lock is still held
                listed = json.loads(r.read())
            held = holding.is_set()
            release.set()
            results = [f.result(timeout=3 * HANG_S) for f in burst]
    finally:
        release.set()
        srv.should_exit = True
        thread.join(timeout=10)
    codes = [c for c, _ in results]
    assert held and any(m["name"] == "toy-encoder" for m in listed["models"]), listed
    assert codes.count(200) == 3 and codes.count(429) == 12 - 3, codes             # exactly the cap at once
    assert set(codes) <= {200, 429} and all(ra == "2" for c, ra in results if c == 429)


def test_create_app_caps_computations_sensibly():
    with pytest.raises(ValueError, match="max_computing"):
        create_app(max_computing=0)
