"""A Nomad agent HTTP API double: just the endpoints the reconciler uses.

Serves on 127.0.0.1 (ephemeral port) the JSON shapes of ``/v1/agent/self``,
``/v1/node/<id>/allocations`` (blocking queries: ``?index=N&wait=5s`` blocks
until the allocations' index passes N or ``wait`` elapses; ``X-Nomad-Index``
on every answer) and ``/v1/allocation/<id>``. The control methods change
allocations and inject faults (token required, latency, down).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?\Z")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
MAX_WAIT = 300.0


def parse_wait(text: str) -> float:
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"bad wait {text!r}")
    return min(MAX_WAIT, float(match.group(1)) * _UNITS[match.group(2)])


class NomadApiDouble:
    """Start with ``start()``; ``address`` is the base URL to give the client."""

    def __init__(self, node_id: str | None = None, task: str = "task") -> None:
        self.node_id = node_id or str(uuid.uuid4())
        self.task = task
        self._cond = threading.Condition()
        self._allocs: dict[str, dict[str, Any]] = {}
        self._index = 1
        self._token: str | None = None
        self._latency = 0.0
        self._down = False
        self.requests: list[tuple[str, str]] = []  # (path with query, token seen or "")
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> NomadApiDouble:
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="nomad-api-double", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> NomadApiDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control -----------------------------------------------------------------
    def add_alloc(
        self, alloc_id: str, device_ids: Iterable[str], status: str = "running", *, device: str = "alibaba/ppu/x"
    ) -> None:
        vendor, dtype, name = [*device.split("/", 2), "", "", ""][:3]
        with self._cond:
            self._index += 1
            self._allocs[alloc_id] = {
                "ID": alloc_id,
                "Name": f"job.group[{len(self._allocs)}]",
                "NodeID": self.node_id,
                "JobID": "job",
                "TaskGroup": "group",
                "DesiredStatus": "run",
                "ClientStatus": status,
                "CreateIndex": self._index,
                "ModifyIndex": self._index,
                "AllocatedResources": {
                    "Tasks": {
                        self.task: {
                            "Cpu": {"CpuShares": 100},
                            "Memory": {"MemoryMB": 256},
                            "Devices": [{"Vendor": vendor, "Type": dtype, "Name": name, "DeviceIDs": list(device_ids)}],
                        }
                    },
                    "Shared": {"DiskMB": 0},
                },
            }
            self._cond.notify_all()

    def set_status(self, alloc_id: str, status: str) -> None:
        with self._cond:
            self._index += 1
            alloc = self._allocs[alloc_id]
            alloc["ClientStatus"] = status
            alloc["ModifyIndex"] = self._index
            self._cond.notify_all()

    def remove_alloc(self, alloc_id: str) -> None:
        with self._cond:
            self._index += 1
            self._allocs.pop(alloc_id, None)
            self._cond.notify_all()

    def require_token(self, token: str | None) -> None:
        with self._cond:
            self._token = token

    def set_latency(self, seconds: float) -> None:
        with self._cond:
            self._latency = seconds

    def set_down(self, down: bool) -> None:
        """While down, every connection is closed without an answer."""
        with self._cond:
            self._down = down

    @property
    def index(self) -> int:
        with self._cond:
            return self._index

    # -- serving (called from handler threads) ------------------------------------
    def _serve(self, path: str, token: str) -> tuple[int, Any, int] | None:
        """Return (status, body, index), or None to drop the connection."""
        with self._cond:
            self.requests.append((path, token))
            down, latency, required = self._down, self._latency, self._token
        if down:
            return None
        if latency:
            time.sleep(latency)
        if required is not None and token != required:
            return 403, "Permission denied", self.index
        url = urlsplit(path)
        query = parse_qs(url.query)
        parts = [p for p in url.path.split("/") if p]
        if parts == ["v1", "agent", "self"]:
            return 200, self._agent_self(), self.index
        if len(parts) == 4 and parts[:2] == ["v1", "node"] and parts[3] == "allocations":
            return self._node_allocs(parts[2], query)
        if len(parts) == 3 and parts[:2] == ["v1", "allocation"]:
            with self._cond:
                alloc = self._allocs.get(parts[2])
                return (200, dict(alloc), self._index) if alloc else (404, "alloc not found", self._index)
        return 404, "Invalid URL", self.index

    def _node_allocs(self, node_id: str, query: dict[str, list[str]]) -> tuple[int, Any, int]:
        try:
            min_index = int(query.get("index", ["0"])[0])
            wait = parse_wait(query.get("wait", ["5m"])[0])
        except ValueError as exc:
            return 400, str(exc), self.index
        deadline = time.monotonic() + wait
        with self._cond:
            while min_index and self._index <= min_index:
                left = deadline - time.monotonic()
                if left <= 0 or self._down:
                    break
                self._cond.wait(left)
            allocs = [dict(a) for a in self._allocs.values()] if node_id == self.node_id else []
            return 200, allocs, self._index

    def _agent_self(self) -> dict[str, Any]:
        return {
            "config": {
                "Client": {"Enabled": True, "NodeClass": "", "Options": {}},
                "Datacenter": "dc1",
                "Region": "global",
                "Version": {"Version": "1.10.0"},
            },
            "member": {"Name": "node-1.global", "Addr": "127.0.0.1", "Status": "alive", "Tags": {}},
            "stats": {"client": {"node_id": self.node_id, "known_servers": "127.0.0.1:4647"}},
        }


def _handler_for(double: NomadApiDouble) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle(self) -> None:
            # A client that goes away mid-answer (a plugin its test just stopped) is
            # normal here; socketserver would print a traceback from this thread, and
            # on Python 3.11 printing one runs ast.parse, which races the main
            # thread's ast.parse (SystemError "AST constructor recursion depth mismatch").
            try:
                super().handle()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def do_GET(self) -> None:
            result = double._serve(self.path, self.headers.get("X-Nomad-Token", ""))
            if result is None:
                self.close_connection = True
                self.connection.close()
                return
            status, body, index = result
            data = (json.dumps(body) if not isinstance(body, str) else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Nomad-Index", str(index))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
