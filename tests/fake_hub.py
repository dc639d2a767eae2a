"""A Hugging Face Hub stand-in on 127.0.0.1 for tests: the few routes huggingface_hub uses to read a
repository's file list and download files. Nothing leaves the machine."""

from __future__ import annotations

import hashlib
import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "0" * 40


class _Handler(BaseHTTPRequestHandler):
    repos: dict[str, dict[str, bytes]] = {}
    sizes: dict[str, dict[str, int]] = {}  # reported sizes that differ from the content (e.g. huge files)
    requests: list[str] = []

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _not_found(self) -> None:
        self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})

    def _route(self) -> None:
        path = unquote(urlparse(self.path).path)
        self.requests.append(f"{self.command} {path}")
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/") :]
            repo = rest.split("/revision/")[0].split("/tree/")[0]
            if repo not in self.repos:
                return self._not_found()
            files = self.repos[repo]
            if "/tree/" in rest:  # the listing snapshot_download pages through
                tree = [
                    {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in files.items()
                ]
                return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"})
            siblings = [
                {"rfilename": name, "size": self.sizes.get(repo, {}).get(name, len(data))}
                for name, data in files.items()
            ]
            body = json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode()
            return self._send(200, body, {"Content-Type": "application/json"})
        for repo, files in self.repos.items():
            prefix = f"/{repo}/resolve/"
            if path.startswith(prefix):
                name = path[len(prefix) :].split("/", 1)[1]
                if name not in files:
                    return self._send(404, b"", {"X-Error-Code": "EntryNotFound"})
                data = files[name]
                etag = hashlib.sha256(data).hexdigest()
                return self._send(200, data, {"ETag": f'"{etag}"', "X-Repo-Commit": COMMIT})
        self._not_found()

    do_GET = _route
    do_HEAD = _route


@contextmanager
def fake_hub(repos: dict[str, dict[str, bytes]], sizes: dict[str, dict[str, int]] | None = None):
    """Serve ``repos`` (repo id -> file name -> content); yields (endpoint URL, list of requests seen)."""
    handler = type("Handler", (_Handler,), {"repos": repos, "sizes": sizes or {}, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    finally:
        server.shutdown()
        server.server_close()
