"""A Nomad agent HTTP API double: just the endpoints the reconciler uses.

Serves on 127.0.0.1 (ephemeral port) the JSON shapes of ``/v1/agent/self``,
``/v1/node/<id>`` (``Node.GetNode``: the node, or 404 "node not found" for
an ID Nomad does not know; ``node:read``),
``/v1/node/<id>/allocations`` (blocking queries: ``?index=N&wait=5s`` blocks
until the allocations' index passes N or ``wait`` elapses; ``X-Nomad-Index``
on every answer; an unknown node's list is ``200 []``, as in Nomad, whose
``Node.GetAllocs`` reads ``AllocsByNode`` without looking the node up),
``/v1/allocation/<id>``, ``/v1/acl/token/self``, ``POST /v1/jobs/parse`` (``_parse_job``),
``/v1/acl/policy/<name>`` and ``/v1/acl/role/<id>``, and the local agent's
dynamic node metadata ``/v1/client/metadata`` (GET and POST, see
``NodeMetaState``). The control methods change allocations and inject faults
(token required, latency, down, an answer dripped one byte at a time, and the
``FAULTS`` below).

With ``enable_acls()`` it enforces Nomad's ACL rules as Nomad's source and
API docs state them (see docs/reserve.md, "What Nomad's ACLs let the plugin
see"): ``/v1/node/:id/allocations`` needs ``node:read`` (else 403) and then
*silently drops* allocations in namespaces where the token lacks
``read-job`` (``Node.GetAllocs`` in nomad/node_endpoint.go), still answering
200 with ``X-Nomad-Index`` computed over every allocation. The policy
evaluation here is written independently of the plugin's own
(``nomad_plugin/reconcile/nomad_api.py``), so a test cannot pass because
both share a mistake.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

# Go's time.ParseDuration: [sign] then one or more <decimal><unit>; a bare
# number is refused unless it is 0 (Nomad's parseWait answers 400 "Invalid wait time").
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_WAIT = 600.0  # Nomad caps a blocking query's wait at 10 minutes
#: What Nomad's coarse ``policy = ...`` expands to, as far as ``read-job`` goes
#: (acl/policy.go expandNamespacePolicy: read and write include read-job; scale does not).
_POLICY_CAPS = {
    "read": {"list-jobs", "parse-job", "read-job"},
    "write": {"list-jobs", "parse-job", "read-job", "submit-job"},
    "scale": {"list-scaling-policies", "read-scaling-policy", "read-job-scaling", "scale-job"},
    "deny": {"deny"},
}


def parse_wait(text: str) -> float:
    """Seconds for a Go duration string, as Nomad's ``parseWait`` reads ``?wait=``."""
    rest = text
    sign = 1.0
    if rest[:1] in "+-" and rest:
        sign, rest = (-1.0 if rest[0] == "-" else 1.0), rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f"Invalid wait time {text!r}")
    total = 0.0
    while rest:
        match = _DURATION_PART.match(rest)
        if not match:
            raise ValueError(f"Invalid wait time {text!r}")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        rest = rest[match.end() :]
    return max(0.0, min(MAX_WAIT, sign * total))


def _unquote(value: Any) -> Any:
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    if isinstance(value, list):
        return [_unquote(v) for v in value]
    return value


def _glob_matches(pattern: str, name: str) -> bool:
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, name) is not None


@dataclass
class _Acl:
    """One token's effective rights, merged over its policies like Nomad's acl.NewACL."""

    management: bool = False
    node_read: bool = False
    agent_read: bool = False
    node_write: bool = False  # acl.go AllowNodeWrite: node policy "write" (or management)
    namespaces: dict[str, set[str]] = field(default_factory=dict)

    def read_job(self, namespace: str) -> bool:
        return self.allows(namespace, "read-job")

    def allows(self, namespace: str, capability: str) -> bool:
        if self.management:
            return True
        caps = self.namespaces.get(namespace)
        if caps is None:
            # Nomad: the closest matching glob (smallest len(name) - len(pattern without '*')).
            best: tuple[int, str] | None = None
            for pattern in self.namespaces:
                if "*" in pattern and _glob_matches(pattern, namespace):
                    diff = len(namespace) - len(pattern.replace("*", ""))
                    if best is None or diff < best[0]:
                        best = (diff, pattern)
            caps = self.namespaces[best[1]] if best else set()
        return "deny" not in caps and capability in caps


def _acl_from_policies(rules: Iterable[str]) -> _Acl:
    import hcl2

    acl = _Acl()
    node: set[str] = set()
    agent: set[str] = set()
    for text in rules:
        doc = json.loads(text) if text.lstrip().startswith("{") else hcl2.loads(text)
        for block in doc.get("namespace", []) or []:
            for label, body in block.items():
                label = _unquote(label)
                caps = acl.namespaces.setdefault(label, set())
                policy = _unquote(body.get("policy", ""))
                caps |= _POLICY_CAPS.get(policy, set())
                caps |= set(_unquote(body.get("capabilities", [])) or [])
        for name, into in (("node", node), ("agent", agent)):
            blocks = doc.get(name, [])
            for body in blocks if isinstance(blocks, list) else [blocks]:
                into.add(_unquote(body.get("policy", "")))
    acl.node_read = "deny" not in node and bool(node & {"read", "write"})
    acl.agent_read = "deny" not in agent and bool(agent & {"read", "write"})
    acl.node_write = "deny" not in node and "write" in node
    return acl


#: Ways an API can fail besides being down or slow (``set_fault``), each answered to every request:
#: ``status-500`` (an agent that cannot reach its servers: 500 "No cluster leader"), ``status-502``
#: (a proxy in front), ``not-json`` (200 with a body that is not JSON), ``truncated`` (the headers
#: promise more body than comes, then the connection closes), ``reset`` (the request is read and the
#: connection closed, no answer), ``hang`` (the request is read and never answered).
FAULTS = ("status-500", "status-502", "not-json", "truncated", "reset", "hang")

#: Go's zero ``time.Time`` as Nomad's JSON writes it (a task's StartedAt before it ever ran).
ZERO_TIME = "0001-01-01T00:00:00Z"


def task_states(status: str, previous: Any, task: str) -> dict[str, Any] | None:
    """The ``TaskStates`` Nomad's client reports for the allocation's one task, by its ClientStatus.

    Like Nomad: ``pending`` is a task not running (never started yet, or
    between restarts, StartedAt kept), ``running`` starts it (StartedAt set
    once), ``complete`` and ``failed`` end it ("dead", FinishedAt set), and a
    lost or unknown allocation keeps what its client last reported.
    """
    if status not in ("pending", "running", "complete", "failed"):
        return previous if isinstance(previous, dict) else None
    before = previous.get(task) if isinstance(previous, dict) else None
    started = before.get("StartedAt", ZERO_TIME) if isinstance(before, dict) else ZERO_TIME
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    state: dict[str, Any] = {
        "State": "pending",
        "Failed": False,
        "Restarts": 0,
        "StartedAt": started,
        "FinishedAt": ZERO_TIME,
        "Events": [],
    }
    if status == "running":
        state.update(State="running", StartedAt=now if started == ZERO_TIME else started)
    elif status != "pending":
        state.update(State="dead", Failed=status == "failed", FinishedAt=now)
    return {task: state}


#: Nomad's node update batching: the first change arms a timer of 5 s plus a random stagger of up to
#: 5 s more (client/client.go watchNodeUpdates, nodeUpdateRetryIntv = 5 s, retryIntv adds
#: helper.RandomStagger); later changes ride along. "up to 10 seconds" in the API docs.
META_BATCH = (5.0, 5.0)
#: Static meta a Nomad client always has (client/client.go setupNode adds the connect.* defaults).
NOMAD_STATIC_META = {
    "connect.gateway_image": "docker.io/envoyproxy/envoy:v${NOMAD_envoy_version}",
    "connect.log_level": "info",
    "connect.proxy_concurrency": "1",
    "connect.sidecar_image": "docker.io/envoyproxy/envoy:v${NOMAD_envoy_version}",
}


def valid_meta_key(key: str) -> bool:
    """Nomad's NodeMetaApplyRequest.Validate: every dot-separated part is an HCL identifier
    (``hclsyntax.ValidIdentifier``: a letter or ``_`` first, then letters, digits, ``_`` or ``-``)."""
    return all(part and part[0] != "-" and part.replace("-", "_").isidentifier() for part in key.split("."))


class NodeMetaState:
    """One client agent's node metadata, as Nomad's client keeps it.

    - ``static``: the agent config's ``client { meta { } }`` (plus Nomad's connect.* defaults),
      read at agent start (``Client.metaStatic``);
    - ``dynamic``: what ``POST /v1/client/metadata`` set, None being a tombstone that unsets a
      static key; persisted in the client's state DB, so it survives an agent restart
      (``stateDB.PutNodeMeta`` in client/meta_endpoint.go Apply, read back in client.go setupNode);
    - ``node``: the merged ``Node.Meta`` the client holds now (GET answers it at once);
    - ``registered``: what the servers (and so the scheduler and ``/v1/node/:id``) have: the
      client's copy after the batching delay (``updateNode`` -> ``watchNodeUpdates``).
    """

    def __init__(self, static: dict[str, str] | None, batch: tuple[float, float]) -> None:
        self._lock = threading.Lock()
        self.batch = batch
        self.static: dict[str, str] = {**NOMAD_STATIC_META, **(static or {})}
        self.dynamic: dict[str, str | None] = {}
        self.node: dict[str, str] = dict(self.static)
        self.registered: dict[str, str] = dict(self.node)
        self.posts: list[dict[str, str | None]] = []  # every accepted POST's Meta, in order
        self.registrations = 0  # node updates sent to the servers
        self._timer: threading.Timer | None = None
        self._closed = False

    def read(self) -> dict[str, Any]:
        """NodeMeta.Read: Meta is the client's Node.Meta, Dynamic a copy, Static as loaded."""
        with self._lock:
            return {"Meta": dict(self.node), "Dynamic": dict(self.dynamic), "Static": dict(self.static)}

    def apply(self, changes: dict[str, str | None]) -> dict[str, Any]:
        """NodeMeta.Apply after validation: merge into dynamic, drop nulls that unset nothing static,
        persist, apply to Node.Meta, then trigger a (batched) node update."""
        with self._lock:
            dynamic = {**self.dynamic, **changes}
            for key, value in changes.items():
                if value is None and key not in self.static:
                    dynamic.pop(key, None)
            self.dynamic = dynamic
            for key, value in changes.items():
                if value is None:
                    self.node.pop(key, None)
                else:
                    self.node[key] = value
            self.posts.append(dict(changes))
            self._arm()
            return {"Meta": dict(self.node), "Dynamic": dict(dynamic), "Static": dict(self.static)}

    def _arm(self) -> None:
        if self._timer is not None or self._closed:
            return  # watchNodeUpdates: already changed, this change rides along
        base, stagger = self.batch
        delay = base + random.uniform(0.0, stagger)
        self._timer = threading.Timer(delay, self._register)
        self._timer.daemon = True
        self._timer.start()

    def _register(self) -> None:
        with self._lock:
            self._timer = None
            self.registered = dict(self.node)
            self.registrations += 1

    def restart(self, *, lose_state: bool = False, static: dict[str, str] | None = None) -> None:
        """An agent restart (client.go setupNode): static meta re-read, dynamic read back from the
        state DB (gone with ``lose_state``); a tombstone whose static key is gone is forgotten.
        The node registers at once."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if static is not None:
                self.static = {**NOMAD_STATIC_META, **static}
            if lose_state:
                self.dynamic = {}
            node = dict(self.static)
            for key, value in list(self.dynamic.items()):
                if value is None:
                    if key in node:
                        del node[key]
                    else:
                        del self.dynamic[key]
                    continue
                node[key] = value
            self.node = node
            self.registered = dict(node)
            self.registrations += 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


class NomadApiDouble:
    """Start with ``start()``; ``address`` is the base URL to give the client."""

    def __init__(
        self,
        node_id: str | None = None,
        task: str = "task",
        hostname: str | None = None,
        *,
        static_meta: dict[str, str] | None = None,
        meta_batch: tuple[float, float] = META_BATCH,
    ) -> None:
        import socket

        self.node_id = node_id or str(uuid.uuid4())
        self.task = task
        #: The node's ``unique.hostname`` attribute (the agent's ``os.Hostname()``).
        self.hostname = socket.gethostname() if hostname is None else hostname
        self._drip: float | None = None  # seconds between two bytes of an answer
        self._fault: str | None = None
        self.closed = threading.Event()  # set by stop(): a hung answer gives up
        self._cond = threading.Condition()
        self.meta = NodeMetaState(static_meta, meta_batch)
        self._allocs: dict[str, dict[str, Any]] = {}
        self._index = 1
        self._token: str | None = None
        self._latency = 0.0
        self._down = False
        self._acls = False
        self._policies: dict[str, str] = {}  # name -> rules
        self._roles: dict[str, tuple[str, list[str]]] = {}  # id -> (name, policies)
        self._tokens: dict[str, dict[str, Any]] = {}  # secret -> token object
        self.requests: list[tuple[str, str]] = []  # (path with query, token seen or "")
        #: What Nomad's jobspec2 makes of a job file for ``POST /v1/jobs/parse``: (JobHCL, Variables) -> the
        #: API form, or ValueError with jobspec2's message. A test gives it; none: every parse fails.
        self.job_parser: Callable[[str, str], dict[str, Any]] | None = None
        self.parse_requests: list[dict[str, Any]] = []  # the bodies POST /v1/jobs/parse received
        #: The agent configuration's plugin blocks as ``/v1/agent/self`` returns them: ``{"Name", "Args",
        #: "Config"}`` each, ``Config`` unredacted (command/agent/agent_endpoint.go AgentSelfRequest redacts
        #: only the ACL replication, Consul and Circonus tokens).
        self.agent_plugins: list[dict[str, Any]] = []
        self._server = _QuietServer(("127.0.0.1", 0), _handler_for(self))
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
        self.closed.set()
        with self._cond:
            self._cond.notify_all()
        self.meta.close()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> NomadApiDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control -----------------------------------------------------------------
    def add_alloc(
        self,
        alloc_id: str,
        device_ids: Iterable[str],
        status: str = "running",
        *,
        device: str = "alibaba/ppu/x",
        namespace: str = "default",
        job: str = "job",
    ) -> None:
        vendor, dtype, name = [*device.split("/", 2), "", "", ""][:3]
        ids = list(device_ids)
        now_ns = time.time_ns()
        with self._cond:
            self._index += 1
            self._allocs[alloc_id] = {
                "ID": alloc_id,
                "Name": f"{job}.group[{len(self._allocs)}]",
                "Namespace": namespace,
                "NodeID": self.node_id,
                "JobID": job,
                "TaskGroup": "group",
                "DesiredStatus": "run",
                "ClientStatus": status,
                "CreateIndex": self._index,
                "ModifyIndex": self._index,
                "CreateTime": now_ns,
                "ModifyTime": now_ns,
                "TaskStates": task_states(status, None, self.task),
                "AllocatedResources": {
                    "Tasks": {
                        self.task: {
                            "Cpu": {"CpuShares": 100},
                            "Memory": {"MemoryMB": 256},
                            "Devices": [{"Vendor": vendor, "Type": dtype, "Name": name, "DeviceIDs": ids}],
                        }
                    },
                    "Shared": {"DiskMB": 0},
                },
                # Nomad embeds the job the allocation was placed from (nomad_jobs.py adds volumes).
                "Job": {
                    "ID": job,
                    "Name": job,
                    "Namespace": namespace,
                    "Type": "service",
                    "TaskGroups": [
                        {
                            "Name": "group",
                            "Count": 1,
                            "Volumes": None,
                            "Tasks": [
                                {
                                    "Name": self.task,
                                    "Driver": "docker",
                                    "Resources": {"Devices": [{"Name": f"{vendor}/{dtype}", "Count": len(ids)}]},
                                    "VolumeMounts": None,
                                }
                            ],
                        }
                    ],
                },
            }
            self._cond.notify_all()

    def set_status(self, alloc_id: str, status: str) -> None:
        with self._cond:
            self._index += 1
            alloc = self._allocs[alloc_id]
            alloc["ClientStatus"] = status
            alloc["TaskStates"] = task_states(status, alloc.get("TaskStates"), self.task)
            alloc["ModifyIndex"] = self._index
            alloc["ModifyTime"] = time.time_ns()
            self._cond.notify_all()

    def remove_alloc(self, alloc_id: str) -> None:
        with self._cond:
            self._index += 1
            self._allocs.pop(alloc_id, None)
            self._cond.notify_all()

    def reset_index(self, index: int) -> None:
        """Make ``X-Nomad-Index`` go backwards (a server restored from a snapshot)."""
        with self._cond:
            self._index = index
            self._cond.notify_all()

    def require_token(self, token: str | None) -> None:
        with self._cond:
            self._token = token

    def enable_acls(self) -> None:
        """From now on every request is judged by its token, as a Nomad cluster with ACLs on."""
        with self._cond:
            self._acls = True

    def add_policy(self, name: str, rules: str) -> None:
        with self._cond:
            self._policies[name] = rules

    def add_role(self, role_id: str, name: str, policies: Iterable[str]) -> None:
        with self._cond:
            self._roles[role_id] = (name, list(policies))

    def add_token(
        self, secret: str, policies: Iterable[str] = (), *, management: bool = False, roles: Iterable[str] = ()
    ) -> str:
        """Register a token; returns its accessor id."""
        accessor = str(uuid.uuid4())
        with self._cond:
            self._tokens[secret] = {
                "AccessorID": accessor,
                "SecretID": secret,
                "Name": f"token-{len(self._tokens)}",
                "Type": "management" if management else "client",
                "Policies": [] if management else list(policies),
                "Roles": [{"ID": r, "Name": self._roles[r][0]} for r in roles],
                "Global": False,
                "CreateIndex": self._index,
                "ModifyIndex": self._index,
            }
        return accessor

    def set_latency(self, seconds: float) -> None:
        with self._cond:
            self._latency = seconds

    def set_down(self, down: bool) -> None:
        """While down, every connection is closed without an answer."""
        with self._cond:
            self._down = down

    def set_drip(self, seconds_per_byte: float | None) -> None:
        """Answer one byte every ``seconds_per_byte`` (status line and headers too); None: at once.

        Each read of a client then returns well within any per-read timeout,
        while one answer of a few hundred bytes takes minutes.
        """
        with self._cond:
            self._drip = seconds_per_byte

    def set_fault(self, fault: str | None) -> None:
        """Fail every request in one of the ``FAULTS`` ways; None: answer normally."""
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fault {fault!r} is not one of {', '.join(FAULTS)}")
        with self._cond:
            self._fault = fault

    @property
    def fault(self) -> tuple[str | None, float | None]:
        with self._cond:
            return self._fault, self._drip

    @property
    def index(self) -> int:
        with self._cond:
            return self._index

    # -- serving (called from handler threads) ------------------------------------
    def _serve(self, path: str, token: str) -> tuple[int, Any, int | None] | None:
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
        acl = self._resolve(token)
        if isinstance(acl, tuple):
            return acl
        if parts[:2] == ["v1", "acl"]:
            return self._acl_endpoint(parts[2:], token)
        if parts == ["v1", "client", "metadata"]:
            return self._meta_read(query, acl)
        if parts == ["v1", "agent", "self"]:
            if acl is not None and not acl.agent_read:
                return 403, "Permission denied", self.index
            return 200, self._agent_self(), self.index
        if len(parts) == 3 and parts[:2] == ["v1", "node"]:
            if acl is not None and not acl.node_read:
                return 403, "Permission denied", self.index
            if parts[2] != self.node_id:  # Node.GetNode: an exact ID, no prefix match
                return 404, "node not found", self.index
            return 200, self._node(), self.index
        if len(parts) == 4 and parts[:2] == ["v1", "node"] and parts[3] == "allocations":
            if acl is not None and not acl.node_read:
                return 403, "Permission denied", self.index
            return self._node_allocs(parts[2], query, acl)
        if len(parts) == 3 and parts[:2] == ["v1", "allocation"]:
            with self._cond:
                alloc = self._allocs.get(parts[2])
                if alloc and acl is not None and not acl.read_job(alloc["Namespace"]):
                    return 403, "Permission denied", self._index
                return (200, dict(alloc), self._index) if alloc else (404, "alloc not found", self._index)
        return 404, "Invalid URL", self.index

    def _resolve(self, token: str) -> _Acl | tuple[int, Any, int] | None:
        """None with ACLs off; the token's ACL; or the error answer for an unknown token."""
        with self._cond:
            if not self._acls:
                return None
            if not token:
                rules = [self._policies["anonymous"]] if "anonymous" in self._policies else []
                return _acl_from_policies(rules)
            obj = self._tokens.get(token)
            if obj is None:
                return 403, "ACL token not found", self._index
            if obj["Type"] == "management":
                return _Acl(management=True, node_read=True, agent_read=True, node_write=True)
            names = list(obj["Policies"]) + [p for r in obj["Roles"] for p in self._roles[r["ID"]][1]]
            return _acl_from_policies(self._policies[n] for n in names if n in self._policies)

    def _acl_endpoint(self, rest: list[str], token: str) -> tuple[int, Any, int]:
        with self._cond:
            if not self._acls:
                return 400, "ACL support disabled", self._index
            obj = self._tokens.get(token)
            management = obj is not None and obj["Type"] == "management"
            if rest == ["token", "self"]:
                return (200, dict(obj), self._index) if obj else (403, "Permission denied", self._index)
            if len(rest) == 2 and rest[0] == "policy":
                own = set(obj["Policies"]) if obj else set()
                own |= {p for r in (obj or {}).get("Roles", []) for p in self._roles[r["ID"]][1]}
                if not management and rest[1] not in own:
                    return 403, "Permission denied", self._index
                if rest[1] not in self._policies:
                    return 404, "ACL policy not found", self._index
                return 200, {"Name": rest[1], "Rules": self._policies[rest[1]], "Description": ""}, self._index
            if len(rest) == 2 and rest[0] == "role":
                mine = {r["ID"] for r in (obj or {}).get("Roles", [])}
                if not management and rest[1] not in mine:
                    return 403, "Permission denied", self._index
                if rest[1] not in self._roles:
                    return 404, "ACL role not found", self._index
                name, policies = self._roles[rest[1]]
                return 200, {"ID": rest[1], "Name": name, "Policies": [{"Name": p} for p in policies]}, self._index
            return 404, "Invalid URL", self._index

    def _node_allocs(self, node_id: str, query: dict[str, list[str]], acl: _Acl | None) -> tuple[int, Any, int]:
        try:
            min_index = int(query.get("index", ["0"])[0])
            wait = parse_wait(query.get("wait", ["5m"])[0])
        except ValueError:
            return 400, "Invalid wait time", self.index
        deadline = time.monotonic() + wait
        with self._cond:
            while min_index and self._index <= min_index:
                left = deadline - time.monotonic()
                if left <= 0 or self._down:
                    break
                self._cond.wait(left)
            allocs = [dict(a) for a in self._allocs.values()] if node_id == self.node_id else []
            # Node.GetAllocs: drop what the token may not read, still 200; the
            # index still covers every allocation.
            visible = [a for a in allocs if acl is None or acl.read_job(a["Namespace"])]
            return 200, visible, self._index

    def allocations(self) -> list[dict[str, Any]]:
        """Every allocation of this node, as Nomad's JSON (copies; for a cluster double's server view)."""
        with self._cond:
            return [dict(a) for a in self._allocs.values()]

    # -- dynamic node metadata (/v1/client/metadata) ------------------------------------
    def registered_meta(self) -> dict[str, str]:
        """The node's Meta as the servers have it (after Nomad's batching), i.e. what ``/v1/node/:id`` shows."""
        with self.meta._lock:
            return dict(self.meta.registered)

    def restart_agent(self, *, lose_state: bool = False, static_meta: dict[str, str] | None = None) -> None:
        """Restart the client agent (see ``NodeMetaState.restart``); allocations are kept."""
        self.meta.restart(lose_state=lose_state, static=static_meta)

    def _meta_read(self, query: dict[str, list[str]], acl: _Acl | None) -> tuple[int, Any, int | None]:
        """GET /v1/client/metadata (command/agent/meta_endpoint.go nodeMetaRead -> NodeMeta.Read)."""
        wrong_node = self._meta_node_error(query)
        if wrong_node is not None:
            return wrong_node
        if acl is not None and not acl.node_read:
            return 403, "Permission denied", None  # NodeMeta.Read: AllowNodeRead
        return 200, self.meta.read(), None  # not a blocking query: no X-Nomad-Index

    def _meta_node_error(self, query: dict[str, list[str]]) -> tuple[int, Any, None] | None:
        """``?node_id`` of another node needs a server to forward to; this double is one client agent."""
        node_id = query.get("node_id", [""])[0]
        if node_id and node_id != self.node_id:
            return 404, f"Unknown node {node_id}", None
        return None

    def _serve_post(self, path: str, token: str, body: bytes) -> tuple[int, Any, int | None] | None:
        """Answer one POST (only /v1/client/metadata); None drops the connection."""
        with self._cond:
            self.requests.append((f"POST {path}", token))
            down, latency, required = self._down, self._latency, self._token
        if down:
            return None
        if latency:
            time.sleep(latency)
        if required is not None and token != required:
            return 403, "Permission denied", None
        url = urlsplit(path)
        parts = [p for p in url.path.split("/") if p]
        if parts == ["v1", "jobs", "parse"]:
            return self._parse_job(parse_qs(url.query), token, body)
        if parts != ["v1", "client", "metadata"]:
            return 404, "Invalid URL", None
        # The HTTP layer decodes the body before the RPC (nodeMetaApply, decodeBody): 400 on bad JSON.
        if not body:
            return 400, "Request body is empty", None
        try:
            doc = json.loads(body)
        except ValueError as exc:
            return 400, f"invalid character in request body: {exc}", None
        raw = doc.get("Meta") if isinstance(doc, dict) else None
        if doc is not None and not isinstance(doc, dict):
            return 400, "json: cannot unmarshal into Go value of type structs.NodeMetaApplyRequest", None
        if raw is not None and not isinstance(raw, dict):
            return 400, "json: cannot unmarshal into Go struct field NodeMetaApplyRequest.Meta", None
        changes: dict[str, str | None] = dict(raw or {})
        if not all(v is None or isinstance(v, str) for v in changes.values()):
            return 400, "json: cannot unmarshal into Go struct field NodeMetaApplyRequest.Meta of type string", None
        wrong_node = self._meta_node_error(parse_qs(url.query))
        if wrong_node is not None:
            return wrong_node
        acl = self._resolve(token)
        if isinstance(acl, tuple):
            return acl[0], acl[1], None
        if acl is not None and not acl.node_write:
            return 403, "Permission denied", None  # NodeMeta.Apply: AllowNodeWrite, before Validate
        # NodeMetaApplyRequest.Validate (nomad/structs/node.go); Apply wraps it as a 400.
        if not changes:
            return 400, "missing required Meta object", None
        for key in changes:
            if not key:
                return 400, "metadata keys must not be empty", None
            if not valid_meta_key(key):
                return 400, f"{json.dumps(key)} is invalid; metadata keys must be valid dotted hcl identifiers", None
        return 200, self.meta.apply(changes), None

    def _parse_job(self, query: dict[str, list[str]], token: str, body: bytes) -> tuple[int, Any, None]:
        """``JobsParseRequest`` (command/agent/job_endpoint.go): the ACL check (``parse-job`` or ``submit-job``
        on the request's namespace, else 403 ErrPermissionDenied), ``decodeBody`` into ``api.JobsParseRequest``
        (400 on bad JSON), 400 "Job spec is empty", then ``jobspec2.ParseWithConfig`` (``job_parser`` here):
        400 "Failed to parse job: <error>" when it fails; the job (canonicalised when asked) when it does not."""
        namespace = query.get("namespace", ["default"])[0] or "default"
        acl = self._resolve(token)
        if isinstance(acl, tuple):
            return acl[0], acl[1], None
        if acl is not None and not (acl.allows(namespace, "parse-job") or acl.allows(namespace, "submit-job")):
            return 403, "Permission denied", None
        try:
            request = json.loads(body or b"null")
        except ValueError as exc:
            return 400, f"invalid character in request body: {exc}", None
        if not isinstance(request, dict):
            request = {}
        self.parse_requests.append(request)
        hcl = request.get("JobHCL")
        if not isinstance(hcl, str) or hcl == "":
            return 400, "Job spec is empty", None
        if self.job_parser is None:
            return 400, "Failed to parse job: the double was given no parser", None
        try:
            return 200, self.job_parser(hcl, str(request.get("Variables") or "")), None
        except ValueError as exc:
            return 400, f"Failed to parse job: {exc}", None

    def _node(self) -> dict[str, Any]:
        """The node as ``GET /v1/node/<id>`` shows it (``structs.Node``, sanitised: no SecretID)."""
        return {
            "ID": self.node_id,
            "Name": "node-1",
            "Datacenter": "dc1",
            "NodePool": "default",
            "Status": "ready",
            "SchedulingEligibility": "eligible",
            "Attributes": {"unique.hostname": self.hostname, "kernel.name": "linux", "nomad.version": "1.10.0"},
            "Meta": self.registered_meta(),
            "CreateIndex": 1,
            "ModifyIndex": self.index,
        }

    def _agent_self(self) -> dict[str, Any]:
        return {
            "config": {
                "Client": {"Enabled": True, "NodeClass": "", "Options": {}},
                "Datacenter": "dc1",
                "Plugins": [dict(p) for p in self.agent_plugins] or None,
                "Region": "global",
                "Version": {"Version": "1.10.0"},
            },
            "member": {"Name": "node-1.global", "Addr": "127.0.0.1", "Status": "alive", "Tags": {}},
            "stats": {"client": {"node_id": self.node_id, "known_servers": "127.0.0.1:4647"}},
        }


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (a reconciler stopping) is normal here, not a traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _handler_for(double: NomadApiDouble) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Go sets TCP_NODELAY on every connection, so a Nomad agent's answer is never held
        # back; without it the body, written after the headers, waits out the client's
        # delayed ACK (40 ms on Linux) on a kept-alive connection.
        disable_nagle_algorithm = True

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
            if double.fault != (None, None):
                self._misbehave(*double.fault)
                return
            self._answer(double._serve(self.path, self.headers.get("X-Nomad-Token", "")))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length > 0 else b""
            self._answer(double._serve_post(self.path, self.headers.get("X-Nomad-Token", ""), body))

        def do_PUT(self) -> None:
            self._invalid_method()

        def do_DELETE(self) -> None:
            self._invalid_method()

        def _invalid_method(self) -> None:
            """NodeMetaRequest: any method but GET and POST is 405 ErrInvalidMethod."""
            length = int(self.headers.get("Content-Length") or 0)
            if length > 0:
                self.rfile.read(length)
            meta = urlsplit(self.path).path.rstrip("/") == "/v1/client/metadata"
            self._answer((405, "Invalid method", None) if meta else (404, "Invalid URL", None))

        def _answer(self, result: tuple[int, Any, int | None] | None) -> None:
            if result is None:
                self.close_connection = True
                self.connection.close()
                return
            status, body, index = result
            data = (json.dumps(body) if not isinstance(body, str) else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            if index is not None:
                self.send_header("X-Nomad-Index", str(index))
            self.end_headers()
            self.wfile.write(data)

        def _misbehave(self, fault: str | None, drip: float | None) -> None:
            """Answer as ``set_fault`` / ``set_drip`` say (the answer itself is ``_serve``'s)."""
            if fault in ("reset", "hang"):
                with double._cond:
                    double.requests.append((self.path, self.headers.get("X-Nomad-Token", "")))
                if fault == "hang":
                    double.closed.wait()
                self._hang_up()
                return
            result = double._serve(self.path, self.headers.get("X-Nomad-Token", ""))
            if result is None:
                self._hang_up()
                return
            status, body, index = result
            if fault in ("status-500", "status-502"):
                status, body = int(fault[-3:]), "No cluster leader" if fault == "status-500" else "Bad Gateway"
            data = (json.dumps(body) if not isinstance(body, str) else body).encode()
            if fault == "not-json" and status == 200:
                data = b"<html>upstream error</html>"
            length = len(data) + (100 if fault == "truncated" else 0)
            answer = (
                f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}\r\n"
                f"Content-Type: {'application/json' if not isinstance(body, str) else 'text/plain'}\r\n"
                f"Content-Length: {length}\r\nX-Nomad-Index: {index}\r\n\r\n"
            ).encode() + data
            if drip is None:
                self.wfile.write(answer)
            else:
                for i in range(len(answer)):
                    if double.closed.wait(drip):
                        break
                    self.wfile.write(answer[i : i + 1])
                    self.wfile.flush()
            if fault == "truncated":
                self._hang_up()

        def _hang_up(self) -> None:
            self.close_connection = True
            self.connection.close()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
