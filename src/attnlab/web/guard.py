"""The guard in front of every POST the web lab answers (the lab's computations and the lesson's read-along).

One ASGI middleware, so that no route can forget a check. In order:

1. another site's request (a foreign ``Origin``, a cross-site ``Sec-Fetch-Site``) is a 403, a body that is not
   ``application/json`` a 415: a cross-site form or text/plain "simple request" needs no CORS preflight, so
   without this any page the user visits could drive the lab blind;
2. at most ``max_computing`` POSTs hold a slot at once; one more is a 429 with ``Retry-After``;
3. the body is read here, whole, before any route runs, and the slot is held while it arrives:
   a declared or actual length over ``body_limit`` is a 413 (read no further), a body not complete within
   ``body_timeout_s`` of the request's start a 408 (a sender that trickles bytes cannot hold a slot for
   longer than that), and a client that disconnects mid-body is one log line, not a traceback.

The route then reads the buffered body as usual (``await request.body()``). The event loop is one thread,
so the slot count needs no lock. GET, HEAD and OPTIONS pass straight through: the page stays responsive
while every slot is taken.

Example::

    app.add_middleware(PostGuard, max_computing=4, body_limit=6096, body_timeout_s=10.0,
                       too_large="the text is capped at 500 characters")
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["PostGuard", "refusal", "SAFE_METHODS", "RETRY_AFTER_S"]

log = logging.getLogger("attnlab.web")

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
RETRY_AFTER_S = 2                  # what a 429 tells the client to wait


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers or None)


def refusal(request: Request) -> Optional[JSONResponse]:
    """403 for a POST another site's page sent (Origin or Sec-Fetch-Site say so), 415 for a body that is not
    JSON; None for a request the lab's own page could have sent."""
    origin = request.headers.get("origin")
    if origin is not None and origin != f"http://{request.headers.get('host', '')}":
        return _error(403, f"cross-origin request refused (Origin {origin!r}): the lab answers only its own page")
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return _error(403, f"cross-site request refused (Sec-Fetch-Site: {site}): the lab answers only its own page")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        return _error(415, f"Content-Type must be application/json, got {ctype or 'none'!r}")
    return None


class _Disconnected(Exception):
    def __init__(self, received: int):
        super().__init__(received)
        self.received = received


class PostGuard:
    """ASGI middleware: origin and type checks, the slot cap, and the body read under a size cap and a deadline.

    Args:
        max_computing: POSTs holding a slot at once (receiving their body, running or queued); one more is a 429.
        body_limit: the largest body accepted, in bytes; longer is a 413.
        body_timeout_s: seconds a client has to deliver its whole body; later is a 408 and the slot is freed.
        too_large: what the 413 adds after the byte count (e.g. the text cap, in characters).

    Example::

        app.add_middleware(PostGuard, max_computing=4, body_limit=6096, body_timeout_s=10.0)
    """

    def __init__(self, app: ASGIApp, *, max_computing: int, body_limit: int, body_timeout_s: float,
                 too_large: str = ""):
        self.app = app
        self.max_computing = max_computing
        self.body_limit = body_limit
        self.body_timeout_s = body_timeout_s
        self.too_large = too_large
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        refused = refusal(Request(scope))
        if refused is None and self.in_flight >= self.max_computing:
            refused = _error(429, f"busy: {self.max_computing} computations are already running or queued; "
                                  f"retry in {RETRY_AFTER_S} s", **{"Retry-After": str(RETRY_AFTER_S)})
        if refused is not None:
            await refused(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self._answer(scope, receive, send)
        finally:
            self.in_flight -= 1

    def _over(self) -> JSONResponse:
        # Connection: close, so that the unread rest of the body is never parsed as a next request.
        tail = f": {self.too_large}" if self.too_large else ""
        return _error(413, f"request body over {self.body_limit} bytes{tail}", Connection="close")

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        where = f"{scope['method']} {scope['path']}"
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.body_limit:
            await self._over()(scope, receive, send)
            return
        try:
            body = await asyncio.wait_for(self._read(receive), self.body_timeout_s)
        except asyncio.TimeoutError:
            log.warning("%s: the body did not arrive within %g s; answered 408", where, self.body_timeout_s)
            await _error(408, f"the request body did not arrive within {self.body_timeout_s:g} s: send it whole "
                              "(the lab's requests are a few KB)", Connection="close")(scope, receive, send)
            return
        except _Disconnected as e:          # the tab was closed mid-request: nobody is left to answer
            log.warning("%s: the client disconnected after %d bytes of its body; dropped", where, e.received)
            return
        if body is None:
            await self._over()(scope, receive, send)
            return
        delivered = False

        async def replay() -> Message:      # the buffered body once, then the client's own messages (disconnect)
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> Optional[bytes]:
        """The whole body, or None as soon as it is longer than ``body_limit`` (with or without Content-Length)."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected(len(body))
            body += message.get("body", b"")
            if len(body) > self.body_limit:
                return None
            if not message.get("more_body", False):
                return bytes(body)
