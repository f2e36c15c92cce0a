"""A small typed client for the local Nomad agent's HTTP API, and what its token can see.

This node's allocations by blocking query (``X-Nomad-Index`` is the next ``index``), the node itself,
the token's ACL objects, the agent's dynamic node metadata and Nomad's own reading of a job file.
Settings come from the plugin config, else ``NOMAD_*``.

Every call has an overall deadline, not only httpx's per-read timeouts (an
API that answers one byte every half second keeps each read inside its
timeout for ever). The ACL token goes only into ``X-Nomad-Token``; a trailing
newline is stripped, a token with a control character inside is never sent,
and every spelling of it is masked in errors (``util/text.secret_forms``).
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.reconcile.http_deadline import deadline, deadline_transport
from nomad_plugin.util.secret_file import SecretFile
from nomad_plugin.util.text import normalise_token, printable, secret_forms, transport_words

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "http://127.0.0.1:4646"
#: Client statuses after which Nomad frees the devices; any other (a new one included) counts as live.
TERMINAL = frozenset({"complete", "failed", "lost"})
#: The answer of an ACL endpoint on a cluster without ACLs (nomad/acl.go aclDisabled).
ACL_DISABLED = "ACL support disabled"
#: The local agent's dynamic node metadata (Nomad >= 1.5; command/agent/http.go routes it to NodeMetaRequest).
META_PATH = "/v1/client/metadata"
#: How Nomad's JSON writes an unset time (Go's zero ``time.Time``), e.g. the StartedAt of a task not run yet.
ZERO_TIME_PREFIX = "0001-01-01"


def wait_duration(seconds: float) -> str:
    """A ``wait`` value Nomad parses with Go's ``time.ParseDuration`` (e.g. "300ms", "10s")."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


class NomadApiError(Exception):
    """The agent could not answer; ``kind`` is unreachable/timeout/forbidden/http/bad-response/config."""

    def __init__(self, message: str, kind: str, status: int = 0, answer: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status  # the HTTP status, when there was one
        self.answer = answer  # the whole answer to a request the agent refused, line by line (token masked)


@dataclass(frozen=True)
class NomadApiSettings:
    address: str = DEFAULT_ADDRESS
    token: str = field(default="", repr=False)
    ca_cert: str = ""
    client_cert: str = ""
    client_key: str = ""
    tls_server_name: str = ""
    skip_verify: bool = False
    timeout: float = 5.0
    #: Why the configured token cannot be sent ("" when it can); set by ``from_config``.
    token_problem: str = ""
    #: Where the token comes from: "nomad_token", "nomad_token_file", "NOMAD_TOKEN (environment)"; "" unknown.
    token_source: str = field(default="", compare=False)
    #: ``nomad_token_file``: read again before each request, so a rotated token is sent from then on.
    token_file: SecretFile | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_config(cls, config: PluginConfig, environ: Mapping[str, str] | None = None) -> NomadApiSettings:
        env = os.environ if environ is None else environ
        token_file = SecretFile(config.nomad_token_file, "nomad_token_file") if config.nomad_token_file else None
        source = (
            "nomad_token" if config.nomad_token else "nomad_token_file" if token_file else "NOMAD_TOKEN (environment)"
        )
        token, problem = normalise_token(
            token_file.secret if token_file else config.nomad_token or env.get("NOMAD_TOKEN", "")
        )
        if token_file is not None and token_file.problem:
            problem = f"{token_file.problem}; no Nomad ACL token is sent"
        elif problem:
            problem = f"the Nomad ACL token from {source} {problem}; it is not sent"
        return cls(
            address=config.nomad_address or env.get("NOMAD_ADDR", "") or DEFAULT_ADDRESS,
            token=token,
            token_problem=problem or "",
            token_source=source,
            token_file=token_file,
            ca_cert=config.nomad_ca_cert or env.get("NOMAD_CACERT", ""),
            client_cert=config.nomad_client_cert or env.get("NOMAD_CLIENT_CERT", ""),
            client_key=config.nomad_client_key or env.get("NOMAD_CLIENT_KEY", ""),
            tls_server_name=config.nomad_tls_server_name or env.get("NOMAD_TLS_SERVER_NAME", ""),
            skip_verify=env.get("NOMAD_SKIP_VERIFY", "").lower() in ("1", "true", "yes"),
        )


@dataclass(frozen=True)
class AllocView:
    """What the plugin needs from one allocation."""

    id: str
    client_status: str
    device_ids: frozenset[str]
    namespace: str = "default"
    job: str = ""
    modify_time: float = 0.0  # unix seconds of the last change Nomad recorded
    # (task, device IDs of one ``device`` block) per block: which task a Reserve's IDs belong to.
    task_devices: tuple[tuple[str, frozenset[str]], ...] = ()
    # Device IDs of tasks that have not started yet, so have not been Reserved yet (``task_started``).
    unstarted_ids: frozenset[str] = frozenset()

    @property
    def live(self) -> bool:
        return self.client_status not in TERMINAL


@dataclass(frozen=True)
class AllocPage:
    allocs: tuple[AllocView, ...]
    index: int
    content: bytes = field(default=b"", repr=False, compare=False)  # the answer as it came


def task_started(state: Any) -> bool:
    """Whether a task (its ``TaskStates`` entry) has started, so its Reserve was made.

    Nomad calls Reserve from the task's prestart hooks, after its artifacts and the group's
    prestart tasks. An entry that cannot be read counts as started: the leak check stays on.
    """
    if state is None:
        return False
    if not isinstance(state, dict) or state.get("State") == "running":
        return True
    started_at = state.get("StartedAt")
    return started_at not in (None, "") and not (
        isinstance(started_at, str) and started_at.startswith(ZERO_TIME_PREFIX)
    )


def parse_alloc(raw: Any) -> AllocView:
    """One Allocation JSON object -> AllocView; ``ValueError`` on a wrong shape at any level.

    A drifted shape must fail the whole answer, never read as "this allocation holds no (or
    other) devices", which would release its grant.
    """
    if not isinstance(raw, dict) or not isinstance(raw.get("ID"), str):
        raise ValueError("allocation without an ID")
    where = f"allocation {raw['ID'][:64]!r}"
    status = raw.get("ClientStatus")
    if not isinstance(status, str):
        raise ValueError(f"{where} without ClientStatus")
    resources = raw.get("AllocatedResources") or {}
    if not isinstance(resources, dict):
        raise ValueError(f"{where}: AllocatedResources is not an object")
    tasks = resources.get("Tasks") or {}
    if not isinstance(tasks, dict):
        raise ValueError(f"{where}: AllocatedResources.Tasks is not an object")
    blocks: list[tuple[str, frozenset[str]]] = []
    for name, task in tasks.items():
        task = task or {}
        if not isinstance(task, dict):
            raise ValueError(f"{where}: a task's resources are not an object")
        devices = task.get("Devices") or []
        if not isinstance(devices, list):
            raise ValueError(f"{where}: a task's Devices is not a list")
        for dev in devices:
            dev = dev or {}
            if not isinstance(dev, dict):
                raise ValueError(f"{where}: a Devices entry is not an object")
            device_ids = dev.get("DeviceIDs") or []
            if not isinstance(device_ids, list) or not all(isinstance(d, str) for d in device_ids):
                raise ValueError(f"{where}: DeviceIDs is not a list of strings")
            blocks.append((str(name), frozenset(device_ids)))
    namespace, job = raw.get("Namespace") or "default", raw.get("JobID") or ""
    if not isinstance(namespace, str) or not isinstance(job, str):
        raise ValueError(f"{where}: Namespace/JobID is not a string")
    modify = raw.get("ModifyTime") or 0
    # Only the leak check reads task states, so a drifted shape counts as started (task_started).
    states = raw.get("TaskStates") or {}
    unstarted = [ids for name, ids in blocks if isinstance(states, dict) and not task_started(states.get(name))]
    return AllocView(
        id=raw["ID"],
        client_status=status,
        device_ids=frozenset().union(*(ids for _, ids in blocks)),
        namespace=namespace,
        job=job,
        modify_time=modify / 1e9 if isinstance(modify, int | float) and not isinstance(modify, bool) else 0.0,
        task_devices=tuple(blocks),
        unstarted_ids=frozenset().union(*unstarted),
    )


@dataclass(frozen=True)
class NodeView:
    """What the reconciler checks of the node it watches (``GET /v1/node/<id>``)."""

    name: str
    hostname: str  # Attributes["unique.hostname"]; "" when absent


def parse_node_view(raw: Any) -> NodeView:
    """One Node JSON object -> NodeView; raises ``ValueError`` on a wrong shape."""
    if not isinstance(raw, dict) or not isinstance(raw.get("ID"), str):
        raise ValueError("node without an ID")
    attributes = raw.get("Attributes") or {}
    if not isinstance(attributes, dict):
        raise ValueError("node Attributes is not an object")
    name, hostname = (v if isinstance(v, str) else "" for v in (raw.get("Name"), attributes.get("unique.hostname")))
    return NodeView(name=name, hostname=hostname)


@dataclass(frozen=True)
class NodeMetaView:
    """``NodeMetaResponse``: ``meta`` merged (what the scheduler gets), ``dynamic`` set through the API
    (None = a tombstone that unsets a static key), ``static`` from the agent's configuration."""

    meta: Mapping[str, str]
    dynamic: Mapping[str, str | None]
    static: Mapping[str, str]


def parse_node_meta(body: Any) -> NodeMetaView:
    """One ``NodeMetaResponse`` JSON object; ``NomadApiError`` (bad-response) on a wrong shape."""
    if not isinstance(body, dict):
        raise NomadApiError("node metadata answer is not an object", "bad-response")
    parts: dict[str, dict[str, Any]] = {}
    for name in ("Meta", "Dynamic", "Static"):
        value = body.get(name) or {}
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise NomadApiError(f"node metadata answer: {name} is not an object", "bad-response")
        allowed = (str, type(None)) if name == "Dynamic" else (str,)
        if not all(isinstance(v, allowed) for v in value.values()):
            raise NomadApiError(f"node metadata answer: {name} holds a value that is not a string", "bad-response")
        parts[name] = dict(value)
    return NodeMetaView(parts["Meta"], parts["Dynamic"], parts["Static"])


def required_capability(path: str, method: str = "GET") -> str:
    """The ACL capability a request needs (a POST: client/meta_endpoint.go Apply's, JobsParseRequest's)."""
    if method == "POST":
        return "parse-job or submit-job on the namespace" if path == "/v1/jobs/parse" else "node:write"
    return "agent:read (or set nomad_node_id to skip /v1/agent/self)" if path.startswith("/v1/agent/") else "node:read"


class NomadClient:
    def __init__(self, settings: NomadApiSettings) -> None:
        self._secrets = sorted(secret_forms(settings.token), key=len, reverse=True)
        token, problem = normalise_token(settings.token)
        if token != settings.token and not settings.token_problem:  # settings made by hand, not from_config
            problem_text = f"the Nomad ACL token {problem}; it is not sent" if problem else ""
            settings = replace(settings, token=token, token_problem=problem_text)
        self.settings = settings
        self._extensions = {"sni_hostname": settings.tls_server_name} if settings.tls_server_name else {}
        self._client: httpx.Client | None = None
        self._client_lock = threading.Lock()

    @property
    def _http(self) -> httpx.Client:
        """Made (and httpx imported) on the first request: a client may never be used.

        Never httpx's command-line client, which its package imports whenever click, rich and
        pygments are installed: a ``None`` in ``sys.modules`` makes that import fail, as httpx expects.
        """
        with self._client_lock:
            if self._client is None:
                sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: refused
                import httpx

                s = self.settings
                headers = {"X-Nomad-Token": s.token} if s.token and not s.token_problem else {}
                base, uds = s.address.rstrip("/"), None
                if base.startswith("unix://"):
                    base, uds = "http://nomad", base[len("unix://") :]
                ssl_context = self._ssl_context() if base.startswith("https://") else None
                self._client = httpx.Client(
                    base_url=base,
                    headers=headers,
                    transport=deadline_transport(ssl_context, uds),
                    timeout=httpx.Timeout(s.timeout),
                    trust_env=False,
                )
            return self._client

    def _ssl_context(self) -> ssl.SSLContext:
        s = self.settings
        ctx = ssl.create_default_context(cafile=s.ca_cert or None)
        if s.client_cert:
            ctx.load_cert_chain(s.client_cert, s.client_key or None)
        if s.skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def close(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def node_id(self) -> str:
        body, _ = self._get("/v1/agent/self")
        node_id = ((body or {}).get("stats") or {}).get("client", {}).get("node_id") if isinstance(body, dict) else None
        if not isinstance(node_id, str) or not node_id:
            raise NomadApiError(
                "the local Nomad agent did not report a client node_id (is it a client agent?); set nomad_node_id",
                "bad-response",
            )
        return node_id

    def node(self, node_id: str) -> NodeView | None:
        """The node record; None when Nomad has no such node (404, ``Node.GetNode``). Needs ``node:read``."""
        found, body = self._found(f"/v1/node/{quote(node_id, safe='')}")
        return _parsed(parse_node_view, body, "node answer") if found else None

    def node_allocations(
        self, node_id: str, index: int = 0, wait: float = 0.0, known: AllocPage | None = None
    ) -> AllocPage:
        """The node's allocations, blocking until Nomad's index passes ``index`` or ``wait`` ends. An answer
        byte for byte ``known``'s (a wait that ran out) is not parsed again: ``known``'s allocations are it."""
        params = {"index": str(index), "wait": wait_duration(wait)} if index > 0 else {}
        # Nomad adds up to wait/16 of jitter to a blocking query.
        path = f"/v1/node/{quote(node_id, safe='')}/allocations"
        content, new_index = self._answer("GET", path, params, self.settings.timeout + wait * 1.1)
        if known is not None and known.content and content == known.content:
            return replace(known, index=new_index)
        body = _decoded(content, _what("GET", path))
        if not isinstance(body, list):
            raise NomadApiError("node allocations answer is not a list", "bad-response")
        allocs = _parsed(lambda b: tuple(parse_alloc(a) for a in b), body, "node allocations answer")
        return AllocPage(allocs=allocs, index=new_index, content=content)

    def allocation(self, alloc_id: str) -> AllocView | None:
        """One allocation; None when Nomad no longer has it (404: garbage-collected)."""
        found, body = self._found(f"/v1/allocation/{quote(alloc_id, safe='')}")
        return _parsed(parse_alloc, body, "allocation answer") if found else None

    def token_self(self) -> dict[str, Any] | None:
        """The token's own ACL token object (any valid token may read itself); None on a cluster without ACLs."""
        try:
            body, _ = self._get("/v1/acl/token/self", acl=True)
        except NomadApiError as exc:
            if ACL_DISABLED in str(exc):
                return None
            raise
        if not isinstance(body, dict):
            raise NomadApiError("ACL token answer is not an object", "bad-response")
        return body

    def acl_policy_rules(self, name: str) -> str:
        """The rules of one policy attached to the token (a token may read its own policies)."""
        body, _ = self._get(f"/v1/acl/policy/{quote(name, safe='')}", acl=True)
        rules = body.get("Rules") if isinstance(body, dict) else None
        if not isinstance(rules, str):
            raise NomadApiError(f"ACL policy {name!r}: no Rules in the answer", "bad-response")
        return rules

    def acl_role_policies(self, role_id: str) -> list[str]:
        """The policy names of one role attached to the token."""
        body, _ = self._get(f"/v1/acl/role/{quote(role_id, safe='')}", acl=True)
        policies = body.get("Policies") if isinstance(body, dict) else None
        if not isinstance(policies, list):
            raise NomadApiError(f"ACL role {role_id!r}: no Policies in the answer", "bad-response")
        names = [p.get("Name") for p in policies if isinstance(p, dict)]
        return [n for n in names if isinstance(n, str)]

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node the servers know (``GET /v1/nodes``; needs ``node:read``): the list stubs."""
        body, _ = self._get("/v1/nodes")
        if not isinstance(body, list) or not all(isinstance(n, dict) for n in body):
            raise NomadApiError("node list answer is not a list of objects", "bad-response")
        return body

    def node_record(self, node_id: str) -> dict[str, Any]:
        """One node's whole record as the servers hold it (``GET /v1/node/:id``): Meta, Attributes, NodeResources."""
        body, _ = self._get(f"/v1/node/{quote(node_id, safe='')}")
        if not isinstance(body, dict):
            raise NomadApiError(f"node {node_id} answer is not an object", "bad-response")
        return body

    def node_meta(self) -> NodeMetaView:
        """The local agent's node metadata (``GET /v1/client/metadata``; needs ``node:read``)."""
        return parse_node_meta(self._get(META_PATH)[0])

    def apply_node_meta(self, changes: Mapping[str, str | None]) -> NodeMetaView:
        """Set (a string) or unset (None) dynamic node metadata keys (``{"Meta": {...}}``); Nomad answers the result."""
        return parse_node_meta(self.post(META_PATH, {"Meta": changes}))

    def post(self, path: str, payload: Any, params: dict[str, str] | None = None) -> Any:
        """The JSON answer of one POST of ``payload`` as JSON."""
        return self._call("POST", path, params, self.settings.timeout, payload=payload)[0]

    def get(self, path: str) -> Any:
        """The JSON answer of one GET (the mount lookup reads allocations and jobs as Nomad shapes them)."""
        return self._get(path)[0]

    def _get(
        self, path: str, params: dict[str, str] | None = None, timeout: float | None = None, *, acl: bool = False
    ) -> tuple[Any, int]:
        """One GET: (JSON body, X-Nomad-Index)."""
        return self._call("GET", path, params, self.settings.timeout if timeout is None else timeout, acl=acl)

    def _found(self, path: str) -> tuple[bool, Any]:
        """One GET of an object that Nomad may no longer have: (False, None) on a 404."""
        try:
            return True, self._get(path)[0]
        except NomadApiError as exc:
            if exc.status == 404:
                return False, None
            raise

    def _call(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None,
        timeout: float,
        *,
        acl: bool = False,
        payload: Any = None,
    ) -> tuple[Any, int]:
        """One request: (JSON body, X-Nomad-Index)."""
        content, index = self._answer(method, path, params, timeout, acl=acl, payload=payload)
        return _decoded(content, _what(method, path)), index

    def _answer(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None,
        timeout: float,
        *,
        acl: bool = False,
        payload: Any = None,
    ) -> tuple[bytes, int]:
        """One request: (the body's bytes, X-Nomad-Index); ``timeout`` bounds each read and the whole call
        (``http_deadline``)."""
        what = _what(method, path)
        if self.settings.token_file is not None:
            self._follow(self.settings.token_file.current())
        if self.settings.token_problem:
            raise NomadApiError(f"{what}: not asked: {self.settings.token_problem}", "config")
        http = self._http
        import httpx  # loaded by ``_http``; a dictionary lookup here

        try:
            with deadline(timeout):
                resp = http.request(
                    method, path, params=params, json=payload, timeout=timeout, extensions=self._extensions
                )
        except httpx.TimeoutException:
            raise NomadApiError(f"{what}: timed out after {timeout:.1f}s", "timeout") from None
        except httpx.HTTPError as exc:
            raise NomadApiError(f"{what}: {self._redact(transport_words(exc))}", "unreachable") from None
        text = self._redact(resp.text.strip()[:200]) if resp.status_code != 200 else ""
        if resp.status_code == 403:
            need = "to be a valid ACL token" if acl and method != "POST" else required_capability(path, method)
            raise NomadApiError(f"{what}: 403 {text} (the token needs {need})", "forbidden", 403)
        if resp.status_code != 200:
            answer = "\n".join(self._redact(line) for line in resp.text.strip().splitlines()[:40])
            raise NomadApiError(f"{what}: HTTP {resp.status_code} {text}", "http", resp.status_code, answer)
        header = resp.headers.get("X-Nomad-Index", "0")
        return resp.content, int(header) if header.isdigit() else 0

    def _follow(self, token: str) -> None:
        """The token file's token from this request on; every token it held stays masked in errors."""
        if token and token != self.settings.token:
            self._secrets = sorted({*self._secrets, *secret_forms(token)}, key=len, reverse=True)
            self.settings = replace(self.settings, token=token, token_problem="")
            with self._client_lock:
                if self._client is not None:
                    self._client.headers["X-Nomad-Token"] = token

    def _redact(self, text: str) -> str:
        """``text`` (an error, the API's answer) with every spelling of the token masked, escaped and bounded."""
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        return printable(text, 400)


# --- whether the local agent shows the token to others ------------------------------------------
# ``GET /v1/agent/self`` (agent:read) returns the agent's whole configuration, plugin blocks included;
# Nomad redacts only its own secrets (the ACL replication token, Consul tokens, the Circonus API token:
# ``AgentSelfRequest`` in command/agent/agent_endpoint.go). A token in our ``config`` block is readable there.
SHOWN_WARNING = (
    "the Nomad ACL token from %s is in the local agent's /v1/agent/self answer (%s), which Nomad returns to "
    "every ACL token with agent:read: write it in a file only the plugin's user can read and set nomad_token_file, "
    "or set NOMAD_TOKEN in the agent's environment; then remove it from the agent configuration and rotate it"
)


def token_places(body: Any, token: str, where: str = "") -> list[str]:
    """Pure: the JSON paths (``config.Plugins[0].Config.nomad_token``) of the strings in ``body`` holding ``token``."""
    if isinstance(body, str):
        return [where or "the answer"] if token and token in body else []
    if isinstance(body, dict):
        return [p for key, value in body.items() for p in token_places(value, token, f"{where}.{key}".lstrip("."))]
    if isinstance(body, list):
        return [p for i, value in enumerate(body) for p in token_places(value, token, f"{where}[{i}]")]
    return []


def warn_if_token_shown(settings: NomadApiSettings, stop: Callable[[float], bool]) -> bool:
    """Ask the local agent for ``/v1/agent/self`` with the token and log one warning if the answer holds the
    token (naming where, never the token); True then. The agent opens its HTTP API only after it started its
    plugins (``NewAgent`` before ``NewHTTPServers`` in command/agent/command.go), so an agent that cannot be
    reached yet is asked again (``stop(delay)`` waits, True: give up); any other failure is logged at debug."""
    if not settings.token or settings.token_problem:
        return False
    client, delay = NomadClient(settings), 1.0
    try:
        while True:
            try:
                places = token_places(client.get("/v1/agent/self"), settings.token)
                break
            except NomadApiError as exc:
                if exc.kind not in ("unreachable", "timeout") or stop(delay):
                    log.debug("could not ask the local agent whether it shows the Nomad ACL token: %s", exc)
                    return False
                delay = min(60.0, delay * 2)
    finally:
        client.close()
    if places:
        log.warning(SHOWN_WARNING, settings.token_source or "nomad_token", ", ".join(places[:3]))
    return bool(places)


def _what(method: str, path: str) -> str:
    return f"Nomad API {path}" if method == "GET" else f"Nomad API {method} {path}"


def _decoded(content: bytes, what: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        raise NomadApiError(f"{what}: answer is not JSON", "bad-response") from None


def _parsed(parse: Any, body: Any, what: str) -> Any:
    """``parse(body)``, a ``ValueError`` turned into ``NomadApiError`` (bad-response)."""
    try:
        return parse(body)
    except ValueError as exc:
        raise NomadApiError(f"{what}: {exc}", "bad-response") from None


# --- what the token can see: release only on evidence ----------------------------------------
# Nomad's ``GET /v1/node/:id/allocations`` needs ``node:read`` and then silently leaves out allocations in
# namespaces where the token lacks the ``read-job`` capability, still answering 200 (``Node.GetAllocs`` in
# hashicorp/nomad nomad/node_endpoint.go; the ACL table of "List Node Allocations" in
# website/content/api-docs/nodes.mdx says ``node:read,namespace:read-job``). An allocation missing from the
# answer is therefore evidence of nothing unless the view is *complete*:
#
# - ACLs are disabled (``/v1/acl/token/self`` answers "ACL support disabled"),
# - the token is a ``management`` token, or
# - the token's own policies (directly and through its roles) grant ``read-job`` on every namespace: a
#   namespace rule whose label is only ``*`` globs (it matches every name), and no namespace rule in any of
#   the policies that lacks ``read-job`` or carries ``deny``. Nomad applies to a namespace the exact rule,
#   else the closest glob, and merges the same label across policies (union of capabilities, ``deny`` wins),
#   so when every label grants ``read-job`` every namespace does. ``policy = "read"`` and ``"write"``
#   include ``read-job``; ``"scale"`` and ``"deny"`` do not.
#
# Any valid token may read itself (``/v1/acl/token/self``) and the policies and roles attached to it
# (``/v1/acl/policy/:name``, ``/v1/acl/role/:id``), so the check needs no more rights than the plugin
# already has. Anything the check cannot read or parse counts as incomplete: the safe answer.

#: The policy the docs recommend; doctor and the warning name it.
RECOMMENDED_POLICY = (
    'namespace "*" { capabilities = ["read-job"] }\nnode { policy = "read" }\nagent { policy = "read" }'
)
_READ_JOB_POLICIES = frozenset({"read", "write"})


@dataclass(frozen=True)
class Visibility:
    """Whether the allocation list is complete, and why (one sentence, no secrets)."""

    complete: bool
    reason: str


def check_visibility(client: NomadClient) -> Visibility:
    """Ask Nomad about the token itself; raises ``NomadApiError`` only when Nomad cannot answer."""
    token = client.token_self()
    if token is None:
        return Visibility(True, "ACLs are disabled on this cluster: every allocation is visible")
    if token.get("Type") == "management":
        return Visibility(True, "the token is a management token: every allocation is visible")
    names = [p for p in token.get("Policies") or [] if isinstance(p, str)]
    roles = [r.get("ID") for r in token.get("Roles") or [] if isinstance(r, dict)]
    for role_id in roles:
        if not isinstance(role_id, str):
            return Visibility(False, "the token's roles could not be read")
        try:
            names.extend(client.acl_role_policies(role_id))
        except NomadApiError as exc:
            if exc.kind in ("unreachable", "timeout"):
                raise
            return Visibility(False, f"the token's role {role_id} could not be read ({exc.kind})")
    rules: dict[str, str] = {}
    for name in dict.fromkeys(names):
        try:
            rules[name] = client.acl_policy_rules(name)
        except NomadApiError as exc:
            if exc.kind in ("unreachable", "timeout"):
                raise
            return Visibility(False, f"the token's policy {name!r} could not be read ({exc.kind})")
    return judge_policies(rules)


def judge_policies(rules: dict[str, str]) -> Visibility:
    """Pure: do these policies (name -> rules text) grant read-job on every namespace?"""
    if not rules:
        return Visibility(False, "the token has no policies, so it reads no namespace")
    merged: dict[str, set[str]] = {}
    for name, text in rules.items():
        try:
            namespaces = namespace_rules(text)
        except ValueError as exc:
            return Visibility(False, f"policy {name!r} could not be parsed ({exc})")
        for label, caps in namespaces.items():
            merged.setdefault(label, set()).update(caps)
    if not any(label and set(label) == {"*"} for label in merged):
        return Visibility(False, 'no policy of the token has a namespace "*" rule, so some namespaces are unread')
    lacking = sorted(label for label, caps in merged.items() if "deny" in caps or "read-job" not in caps)
    if lacking:
        return Visibility(False, f"namespace rule(s) {', '.join(repr(x) for x in lacking)} do not grant read-job")
    return Visibility(True, f"policies {', '.join(sorted(rules))} grant read-job on every namespace")


def namespace_rules(text: str) -> dict[str, set[str]]:
    """Namespace label -> capabilities of one policy (HCL or JSON rules); ``ValueError`` if unreadable."""
    try:
        doc = parse_rules(text)
    except Exception as exc:  # the HCL parser raises its own exception types
        if isinstance(exc, ValueError):
            raise
        raise ValueError(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise ValueError("rules are not an object")
    blocks = doc.get("namespace") or []
    if isinstance(blocks, dict):
        blocks = [blocks]
    out: dict[str, set[str]] = {}
    for block in blocks:
        if not isinstance(block, dict):
            raise ValueError("a namespace block is not an object")
        for label, body in block.items():
            if not isinstance(body, dict):
                raise ValueError(f"namespace {label!r} is not a block")
            caps = out.setdefault(_unquote(label), set())
            policy = _unquote(body.get("policy", ""))
            if policy == "deny":
                caps.add("deny")
            elif policy in _READ_JOB_POLICIES:
                caps.add("read-job")
            raw_caps = body.get("capabilities") or []
            if not isinstance(raw_caps, list):
                raise ValueError(f"namespace {label!r}: capabilities is not a list")
            caps.update(_unquote(c) for c in raw_caps if isinstance(c, str))
    return out


def parse_rules(text: str) -> Any:
    """One ACL policy's rules, written in JSON or HCL, as a document (python-hcl2's shape for HCL)."""
    if text.lstrip().startswith("{"):
        return json.loads(text)
    import hcl2

    return hcl2.loads(text)


def _unquote(value: Any) -> str:
    """python-hcl2 >= 5 keeps string quotes in values and block labels."""
    text = str(value)
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return text
