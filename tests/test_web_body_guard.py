"""Every POST's body, the lab's and the lesson's, goes through one guard (attnlab.web.guard, issue #28): capped in
size (413), capped in time (408: a slow sender frees its slot), and a client that leaves mid-body is one log line.

The slow-sender and disconnect checks use a real uvicorn on 127.0.0.1 and raw sockets (a test client sends its
body at once); every wait is bounded."""
from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the web lab needs fastapi")
pytest.importorskip("uvicorn", reason="the web lab needs uvicorn")
from fastapi.testclient import TestClient
from live_server import live_server

from attnlab.web import create_app

CAP = 60
LIMIT = 4 * CAP + 4096                     # create_app's body limit for max_chars=CAP
DEADLINE_S = 0.5
ATTENTION = json.dumps({"text": "the dog bit the man", "model": "toy-encoder"}).encode()


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(max_chars=CAP), base_url="http://127.0.0.1")


@pytest.fixture(scope="module")
def server():
    """The port of a live app with 2 slots and a 0.5 s body deadline (log_config=None: uvicorn's own error log
    reaches caplog)."""
    app = create_app(max_chars=CAP, max_computing=2, body_timeout_s=DEADLINE_S)
    with live_server(app, log_config=None) as base:
        yield int(base.rsplit(":", 1)[1])


def _head(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def _status(sock: socket.socket, timeout: float) -> int:
    """The status code of the first answer on ``sock`` (0: none within ``timeout``, or the connection closed)."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(4096)
    except (socket.timeout, ConnectionError):
        return 0
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def _post(port: int, path: str, body: bytes, timeout: float = 30) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(_head(path, len(body)) + body)
        return _status(s, timeout)


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    """Send a body of 200 declared bytes one byte per 0.1 s: always sending, never done (within the test)."""
    try:
        sock.sendall(_head("/api/attention", 200) + b'{"text": "')
        while not stop.wait(0.1):
            sock.sendall(b"a")
    except OSError:
        pass                                      # the server answered 408 and closed: the trickle ends


@pytest.mark.parametrize("path", ["/lesson/api/readalong/self-attention", "/api/attention"])
def test_every_post_body_is_capped(client, path):
    big = b'{"text": "' + b"a" * LIMIT + b'"}'
    r = client.post(path, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and f"over {LIMIT} bytes" in r.json()["detail"], (r.status_code, r.text[:200])
    chunks = (big[i:i + 1000] for i in range(0, len(big), 1000))      # no Content-Length: counted as it arrives
    r = client.post(path, content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413, r.status_code


def test_a_slow_body_gets_408_and_frees_its_slot(server):
    stop = threading.Event()
    socks = [socket.create_connection(("127.0.0.1", server), timeout=10) for _ in range(2)]
    senders = [threading.Thread(target=_trickle, args=(s, stop), daemon=True) for s in socks]
    try:
        for t in senders:
            t.start()
        time.sleep(0.1)
        assert _post(server, "/api/attention", ATTENTION) == 429           # both slots held by the trickles
        codes = [_status(s, 10) for s in socks]                            # each cut off at the deadline
        assert codes == [408, 408], codes
        assert _post(server, "/api/attention", ATTENTION) == 200           # the slots are free again
    finally:
        stop.set()
        for t in senders:
            t.join(timeout=5)
        for s in socks:
            s.close()


def test_a_client_leaving_mid_body_is_one_log_line(server, caplog):
    with caplog.at_level(logging.INFO):
        with socket.create_connection(("127.0.0.1", server), timeout=10) as s:
            s.sendall(_head("/api/attention", 100) + b'{"te')
            time.sleep(0.1)
        deadline = time.monotonic() + 5
        while not any("disconnected" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)                                                    # a traceback would follow at once
        assert _post(server, "/api/attention", ATTENTION) == 200          # the server goes on answering
    records = [r for r in caplog.records if r.name.startswith(("attnlab", "uvicorn"))]
    assert len(records) == 1 and "disconnected after 4 bytes" in records[0].getMessage(), \
        [(r.name, r.getMessage()[:80]) for r in records]
    assert records[0].exc_info is None


def test_body_timeout_must_be_positive():
    for bad in (0, -1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="body_timeout_s"):
            create_app(body_timeout_s=bad)
