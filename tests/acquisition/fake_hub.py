"""A Hugging Face Hub stand-in on loopback: the endpoints `huggingface_hub` calls to download.

- ``HEAD|GET /{org}/{repo}/resolve/{rev}/{path}``: a GGUF (an LFS file) answers 302 to
  ``http://localhost:{port}/cdn/{sha256}`` — another host name than the endpoint's
  ``127.0.0.1``, so the hub library treats it as a CDN, as it does on the real hub — with
  ``X-Repo-Commit``, ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``; another file answers
  200 with its git blob sha1 as ``ETag``. Unknown repo, revision or file: 404 with the hub's
  ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``).
- ``GET /cdn/{sha256}``: the bytes, honouring ``Range: bytes=N-`` (206 + ``Content-Range``).
- ``GET /api/models/{org}/{repo}/tree/{rev}``: the file listing (``list_repo_files``).

Faults, per file name: ``drop_after`` (the first body stops after N bytes and the socket is
closed), ``corrupt`` (the body differs from the advertised sha256), ``stall_after`` (the body
pauses after N bytes, setting ``stalled``, until ``release`` is set or the server stops).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

import orjson

COMMIT: Final = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str = COMMIT


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    stall_after: dict[str, int] = field(default_factory=dict)
    release: threading.Event = field(default_factory=threading.Event)
    stalled: threading.Event = field(default_factory=threading.Event)
    requests: list[tuple[str, str, str | None, bool]] = field(default_factory=list)
    """(method, path, Range header, whether an Authorization header came) per request."""
    port: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def body_gets(self, name: str) -> list[str | None]:
        """The Range headers of the body downloads of the file `name`."""
        sha = self._sha_of(name)
        return [r for m, p, r, _ in self.requests if m == "GET" and p == f"/cdn/{sha}"]

    def _sha_of(self, name: str) -> str:
        for repo in self.repos.values():
            if name in repo.files:
                return hashlib.sha256(repo.files[name]).hexdigest()
        raise KeyError(name)

    def _blob(self, sha: str) -> tuple[str, bytes] | None:
        for repo in self.repos.values():
            for name, data in repo.files.items():
                if hashlib.sha256(data).hexdigest() == sha:
                    return name, data
        return None


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return None

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        def _empty(self, status: int, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _serve(self, *, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            hub.requests.append(
                (self.command, path, self.headers.get("Range"), "Authorization" in self.headers)
            )
            if path.startswith("/cdn/"):
                self._cdn(path[len("/cdn/") :], head)
            elif path.startswith("/api/models/"):
                self._tree(path[len("/api/models/") :])
            elif "/resolve/" in path:
                self._resolve(path, head)
            else:
                self._empty(404, {})

        def _tree(self, rest: str) -> None:
            repo_id, _, tail = rest.partition("/tree/")
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._empty(404, {"X-Error-Code": "RepoNotFound"})
                return
            listing = [
                {"type": "file", "path": name, "size": len(data), "oid": _git_sha1(data)}
                for name, data in repo.files.items()
            ]
            body = orjson.dumps(listing)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _resolve(self, path: str, head: bool) -> None:
            before, _, after = path.lstrip("/").partition("/resolve/")
            revision, _, filename = after.partition("/")
            repo = hub.repos.get(before)
            if repo is None:
                self._empty(404, {"X-Error-Code": "RepoNotFound"})
                return
            if revision not in ("main", repo.commit):
                self._empty(404, {"X-Error-Code": "RevisionNotFound"})
                return
            data = repo.files.get(filename)
            if data is None:
                self._empty(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit})
                return
            if filename.endswith(".gguf"):
                sha = hashlib.sha256(data).hexdigest()
                self._empty(
                    302,
                    {
                        "Location": f"http://localhost:{hub.port}/cdn/{sha}",
                        "X-Repo-Commit": repo.commit,
                        "ETag": f'"{_git_sha1(data)}"',
                        "X-Linked-Etag": f'"{sha}"',
                        "X-Linked-Size": str(len(data)),
                    },
                )
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{_git_sha1(data)}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def _cdn(self, sha: str, head: bool) -> None:
            found = hub._blob(sha)
            if found is None:
                self._empty(404, {})
                return
            name, data = found
            if name in hub.corrupt:
                data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
            start = 0
            wanted = self.headers.get("Range")
            if wanted and wanted.startswith("bytes=") and wanted.endswith("-"):
                start = int(wanted[len("bytes=") : -1])
            body = data[start:]
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(body)))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if head:
                return
            drop = hub.drop_after.pop(name, None)
            if drop is not None:
                self.wfile.write(body[:drop])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            stall = hub.stall_after.get(name)
            if stall is not None:
                self.wfile.write(body[:stall])
                self.wfile.flush()
                hub.stalled.set()
                hub.release.wait(30)
                body = body[stall:]
            self.wfile.write(body)

    return Handler


@contextmanager
def serve(hub: FakeHub) -> Iterator[FakeHub]:
    """Run `hub` on 127.0.0.1 (a free port) until the block ends; then stop and join it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
