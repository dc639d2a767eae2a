"""The server's front door (an ASGI middleware in front of Gradio): what a request may be before Gradio
reads it.

* a request body is at most ``max_body`` bytes (413 otherwise), whether or not it says its length;
* uploads are refused (403): no control of the page takes a file;
* one session may have at most ``per_session`` requests waiting or running (429, named), so one visitor
  cannot fill the queue that every visitor shares;
* it keeps count of each session's open result streams (:meth:`Guard.listening`), so a handler can see
  that the client that asked for a run has gone away and not run it.
"""

from __future__ import annotations

import json
from collections import Counter
from urllib.parse import parse_qs

from demo.errors import log

UPLOAD_PATHS = ("/upload", "/gradio_api/upload")
MODELS = "models"  # the concurrency group of every event that runs a model (demo.server.build)


class Guard:
    def __init__(self, app, *, blocks, max_body: int, per_session: int, streams: Counter):
        self.app, self.blocks = app, blocks
        self.max_body, self.per_session, self.streams = max_body, per_session, streams

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"].rstrip("/"), scope["method"]
        if method == "POST" and path.endswith(UPLOAD_PATHS):
            return await self._reply(send, 403, "uploads are disabled: no control of this page takes a file")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await self._reply(send, 413, f"request bodies may be at most {self.max_body} bytes")
        if method == "POST" and path.endswith("/queue/join"):
            body = await self._body(receive)
            if body is None:
                return await self._reply(send, 413, f"request bodies may be at most {self.max_body} bytes")
            refused = self._over_session_limit(body)
            if refused:
                return await self._reply(send, 429, refused)
            return await self.app(scope, self._replay(body, receive), send)
        if method == "GET" and path.endswith("/queue/data"):
            session = parse_qs(scope.get("query_string", b"").decode()).get("session_hash", [""])[0]
            self.streams[session] += 1
            try:
                return await self.app(scope, receive, send)
            finally:
                self.streams[session] -= 1
                if self.streams[session] <= 0:
                    del self.streams[session]
        if method == "POST":
            return await self.app(scope, self._capped(receive, send), send)
        return await self.app(scope, receive, send)

    def _over_session_limit(self, body: bytes) -> str | None:
        """A refusal when this join asks for a model run and its session has its share waiting or running."""
        try:
            data = json.loads(body)
            session, fn = data.get("session_hash"), self.blocks.fns.get(data.get("fn_index"))
        except (ValueError, AttributeError, TypeError):
            return None  # Gradio answers a malformed body itself
        queue = getattr(self.blocks, "_queue", None)
        if queue is None or fn is None or fn.concurrency_id != MODELS:
            return None  # the page's own quick events are not model runs
        events = [queue.event_ids_to_events.get(i) for i in queue.pending_event_ids_session.get(session, ())]
        pending = sum(1 for e in events if e is not None and e.fn.concurrency_id == MODELS)
        if session and pending >= self.per_session:
            log.info("refused queue/join: session %s has %d requests waiting or running", session[:12], pending)
            return (
                f"this session already has {pending} requests waiting or running (at most {self.per_session} "
                "per visitor): wait for them to finish or press Stop"
            )
        return None

    async def _body(self, receive) -> bytes | None:
        """The whole body, or None past the cap."""
        chunks, size = [], 0
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                return None
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    def _replay(body: bytes, receive):
        """``receive`` that gives the body read already, then the connection's own messages (a disconnect)."""
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

    def _capped(self, receive, send):
        """``receive`` that stops a body without a length once it passes the cap."""
        size = 0

        async def capped():
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > self.max_body:
                raise BodyTooLarge()
            return message

        return capped

    @staticmethod
    async def _reply(send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail, "error": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    """A body without a declared length ran past the cap (the connection is dropped)."""
