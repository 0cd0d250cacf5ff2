"""A small Hugging Face Hub on 127.0.0.1 for tests: the real `huggingface_hub` client talks HTTP to it.

It implements only the endpoints the client calls to create and upload to a dataset repo, resolve a
revision, list a tree, and download or range-read files (`snapshot_download`, `HfFileSystem`), with the
Hub's error conventions (`X-Error-Code` / `X-Error-Message` headers, 401 for a bad token). Repos live in
memory as commits of {path: bytes}. The server binds an ephemeral loopback port and shuts itself down
after `lifetime_s` even if a test forgets to stop it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

_API = "/api/datasets/"
_RESOLVE = "/datasets/"


@dataclass
class Repo:
    private: bool = False
    refs: dict[str, str] = field(default_factory=dict)
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def files(self, revision: str) -> dict[str, bytes] | None:
        sha = self.refs.get(revision, revision)
        return self.commits.get(sha)


class LoopbackHub:
    """`with LoopbackHub(tokens={"hf_good"}) as hub:` then point `HF_ENDPOINT` at `hub.endpoint`."""

    def __init__(self, tokens: set[str] | None = None, lifetime_s: float = 300.0) -> None:
        self.tokens = set(tokens or ())
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.bytes_served = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        # shutdown() waits for the serving loop's next poll: 0.5 s by default, paid by every test that stops one
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> LoopbackHub:
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._timer.cancel()
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    # -- repository content

    def commit(self, repo_id: str, files: dict[str, bytes], revision: str = "main",
               deleted: tuple[str, ...] = (), private: bool = False) -> str:
        """Apply a commit on top of `revision` (creating the repo if needed); returns the new sha."""
        with self._lock:
            repo = self.repos.setdefault(repo_id, Repo(private=private))
            tree = dict(repo.files(revision) or {})
            for prefix in deleted:
                tree = {p: b for p, b in tree.items() if p != prefix and not p.startswith(prefix.rstrip("/") + "/")}
            tree.update(files)
            h = hashlib.sha1(repr(sorted(repo.commits)).encode())
            for p in sorted(tree):
                h.update(p.encode() + b"\0" + hashlib.sha1(tree[p]).digest())
            sha = h.hexdigest()
            repo.commits[sha] = tree
            repo.refs[revision] = sha
            return sha

    def publish_folder(self, repo_id: str, folder: Path, private: bool = False) -> str:
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        return self.commit(repo_id, files, private=private)


def _tree_entries(files: dict[str, bytes], prefix: str, recursive: bool) -> list[dict[str, Any]] | None:
    base = prefix.strip("/")
    if base and base in files:
        return [_file_entry(base, files[base])]
    under = {p: b for p, b in files.items() if not base or p.startswith(base + "/")}
    if base and not under:
        return None
    out: dict[str, dict[str, Any]] = {}
    for p, b in sorted(under.items()):
        rel = p[len(base) + 1:] if base else p
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            d = "/".join(([base] if base else []) + parts[:depth])
            if recursive or depth == 1:
                out.setdefault(d, {"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest(),
                                   "size": 0})
            if not recursive:
                break
        if recursive or len(parts) == 1:
            out[p] = _file_entry(p, b)
    return list(out.values())


def _file_entry(path: str, data: bytes) -> dict[str, Any]:
    return {"type": "file", "path": path, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}


def _handler(hub: LoopbackHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        # -- plumbing

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  content_type: str = "application/json") -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
                with hub._lock:
                    hub.bytes_served += len(body)

        def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps(obj).encode(), headers)

        def _error(self, status: int, code: str | None = None, message: str | None = None,
                   headers: dict[str, str] | None = None) -> None:
            h = dict(headers or {})
            if code:
                h["X-Error-Code"] = code
            if message:
                h["X-Error-Message"] = message
            self._json({"error": message or code or "error"}, status, h)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _auth(self, write: bool = False) -> bool | None:
            """True: a valid token; False: anonymous; None: an error response was sent."""
            auth = self.headers.get("Authorization")
            if auth is None:
                if write:
                    self._error(401, message="You must be authenticated to access this resource.")
                    return None
                return False
            token = auth.removeprefix("Bearer ").strip()
            if token not in hub.tokens:
                self._error(401, message="Invalid credentials in Authorization header")
                return None
            return True

        def _repo(self, repo_id: str, authed: bool) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None or (repo.private and not authed):
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            return repo

        # -- routes

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            with hub._lock:
                hub.requests.append((self.command, url.path, self.headers.get("Range")))
            authed = self._auth()
            if authed is None:
                return
            path = unquote(url.path)
            if path.startswith(_API):
                self._api_get(path[len(_API):], parse_qs(url.query), authed)
            elif path.startswith(_RESOLVE):
                self._resolve(path[len(_RESOLVE):], authed)
            else:
                self._error(404, message="not served by the loopback Hub")

        def _api_get(self, rest: str, query: dict[str, list[str]], authed: bool) -> None:
            parts = rest.split("/")
            repo_id = "/".join(parts[:2])
            repo = self._repo(repo_id, authed)
            if repo is None:
                return
            if len(parts) == 2 or parts[2] == "revision":
                revision = "/".join(parts[3:]) or "main"
                files = repo.files(revision)
                if files is None:
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                    return
                sha = repo.refs.get(revision, revision)
                self._json({"id": repo_id, "sha": sha, "private": repo.private,
                            "siblings": [{"rfilename": p} for p in sorted(files)]})
            elif parts[2] == "tree":
                revision, prefix = parts[3], "/".join(parts[4:])
                files = repo.files(revision)
                if files is None:
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                    return
                entries = _tree_entries(files, prefix, query.get("recursive", ["false"])[0] in ("true", "True", "1"))
                if entries is None:
                    self._error(404, "EntryNotFound", f"{prefix} does not exist")
                    return
                self._json(entries)
            else:
                self._error(404, message="not served by the loopback Hub")

        def _resolve(self, rest: str, authed: bool) -> None:
            parts = rest.split("/")
            repo = self._repo("/".join(parts[:2]), authed)
            if repo is None:
                return
            revision, filename = parts[3], "/".join(parts[4:])
            files = repo.files(revision)
            if files is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return
            sha = repo.refs.get(revision, revision)
            if filename not in files:
                self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
                return
            data = files[filename]
            headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                       "Accept-Ranges": "bytes"}
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                first, _, last = rng[len("bytes="):].partition("-")
                if first == "":
                    start, end = max(0, len(data) - int(last)), len(data)
                else:
                    start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
                if start >= len(data) and len(data) > 0:
                    self._error(416, headers={"Content-Range": f"bytes */{len(data)}"})
                    return
                headers["Content-Range"] = f"bytes {start}-{max(start, end - 1)}/{len(data)}"
                self._send(206, data[start:end], headers, "application/octet-stream")
                return
            self._send(200, data, headers, "application/octet-stream")

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            with hub._lock:
                hub.requests.append((self.command, url.path, None))
            body = self._body()
            path = unquote(url.path)
            write = path == "/api/repos/create" or "/commit/" in path
            authed = self._auth(write=write)
            if authed is None:
                return
            if path == "/api/repos/create":
                payload = json.loads(body)
                repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") \
                    else payload["name"]
                if repo_id in hub.repos:
                    self._json({"error": "You already created this dataset repo",
                                "url": f"{hub.endpoint}/datasets/{repo_id}"}, 409)
                    return
                hub.commit(repo_id, {".gitattributes": b"*.zip filter=lfs diff=lfs merge=lfs -text\n"},
                           private=payload.get("visibility") == "private" or bool(payload.get("private")))
                self._json({"url": f"{hub.endpoint}/datasets/{repo_id}", "name": repo_id})
                return
            if path == "/api/validate-yaml":
                self._validate_yaml(json.loads(body)["content"])
                return
            if not path.startswith(_API):
                self._error(404, message="not served by the loopback Hub")
                return
            parts = path[len(_API):].split("/")
            repo = self._repo("/".join(parts[:2]), authed)
            if repo is None:
                return
            action, revision = parts[2], "/".join(parts[3:])
            if action == "preupload":
                files = json.loads(body)["files"]
                self._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                      for f in files]})
            elif action == "paths-info":
                form = parse_qs(body.decode())
                files = repo.files(revision)
                if files is None:
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                    return
                out = []
                for p in form.get("paths", []):
                    entries = _tree_entries(files, p, recursive=False)
                    if entries and len(entries) == 1 and entries[0]["path"] == p:
                        out.append(entries[0])
                    elif entries:
                        out.append({"type": "directory", "path": p, "oid": hashlib.sha1(p.encode()).hexdigest()})
                self._json(out)
            elif action == "commit":
                self._commit("/".join(parts[:2]), revision, body)
            else:
                self._error(404, message="not served by the loopback Hub")

        def _validate_yaml(self, content: str) -> None:
            """The Hub checks a card's front matter on upload; here: it must be a YAML mapping."""
            front = content.split("---\n")[1] if content.startswith("---\n") else ""
            try:
                ok = isinstance(yaml.safe_load(front), dict)
            except yaml.YAMLError:
                ok = False
            if not ok:
                self._json({"errors": [{"message": "front matter is not a YAML mapping"}]}, 400)
                return
            self._json({"errors": [], "warnings": []})

        def _commit(self, repo_id: str, revision: str, body: bytes) -> None:
            added: dict[str, bytes] = {}
            deleted: list[str] = []
            for line in body.splitlines():
                item = json.loads(line)
                value = item["value"]
                if item["key"] == "file":
                    added[value["path"]] = base64.b64decode(value["content"])
                elif item["key"] in ("deletedFile", "deletedFolder"):
                    deleted.append(value["path"])
                elif item["key"] != "header":
                    self._error(400, message=f"loopback Hub does not support {item['key']}")
                    return
            sha = hub.commit(repo_id, added, revision or "main", tuple(deleted))
            self._json({"commitOid": sha, "commitUrl": f"{hub.endpoint}/datasets/{repo_id}/commit/{sha}",
                        "success": True})

    return Handler


def point_client_at(hub: LoopbackHub, monkeypatch: Any, tmp_path: Path) -> None:
    """The Hub client reads its endpoint and token file once at import: point them at `hub`, with no
    token of the user's and a cache of this test's own."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "client-cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_XET_CACHE", raising=False)  # `pull` points it into its target
    # A replay reads in worker processes that import the client afresh: they find the same settings in
    # the environment, as a user's own HF_ENDPOINT reaches them.
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "client-cache"))
