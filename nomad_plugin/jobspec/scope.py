"""Which nodes a job's task group may use at all, before any constraint: its datacenters, its node pool and
its host volumes.

- The scheduler considers only ready nodes in one of the job's datacenters and in its node pool
  (``readyNodesInDCsAndPool``, ``scheduler/util.go``; ``Node.IsInAnyDC`` and ``Node.IsInPool``,
  ``nomad/structs/structs.go``). A datacenter is a pattern whose only wildcard is ``*`` (``glob.Glob``,
  github.com/ryanuber/go-glob); a job without datacenters gets ``["*"]`` (``Job.Canonicalize``,
  ``nomad/structs/structs.go``), one without a pool ``"default"`` (``jobNodePoolMutatingHook``,
  ``nomad/job_endpoint_hook_node_pool_ce.go``), and the pool ``"all"`` takes every node.
- A group volume of type ``host`` needs the node to have a host volume named by its ``source``
  (``HostVolumeChecker.nodeIsFeasibleForRequest``, ``scheduler/feasible/feasible.go``); a volume of no
  known type is dropped on submission (``ApiTgToStructsTG``, ``command/agent/job_endpoint.go``), and a CSI
  volume depends on the cluster's volume claims and plugins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from nomad_plugin.jobspec.parse import ParsedJob, ValueProblem, dicts, string_value
from nomad_plugin.util.hcl import labelled, plain


class Known(Protocol):
    """A node value as ``node.NodeValues.resolve`` gives it."""

    @property
    def value(self) -> str | None: ...
    @property
    def known(self) -> bool: ...
    @property
    def hints(self) -> tuple[str, ...]: ...


HOLDS, FAILS, UNKNOWN = "holds", "fails", "unknown"
NODE_FILE = "--node FILE (`nomad node status -self -json > FILE` on this node) or --agent"


@dataclass(frozen=True)
class ScopeCheck:
    """One of the job's datacenters, node pool or a host volume, against this node."""

    what: str  # 'datacenters ["dc2"]', 'node_pool "gpu"', 'volume "models" (host volume "moosefs")'
    status: str  # holds / fails / unknown
    detail: str = ""
    hints: tuple[str, ...] = ()  # what would make it known

    def describe(self) -> str:
        return f"{self.what}: {self.detail}" if self.detail else self.what


def glob(pattern: str, subject: str) -> bool:
    """``glob.Glob`` (github.com/ryanuber/go-glob): ``*`` matches any text, nothing else is special."""
    if pattern in ("", "*") or "*" not in pattern:
        return pattern == "*" or subject == pattern
    parts = pattern.split("*")
    for index, part in enumerate(parts[:-1]):
        at = subject.find(part)
        if at < 0 or (index == 0 and not pattern.startswith("*") and at != 0):
            return False
        subject = subject[at + len(part) :]
    return pattern.endswith("*") or subject.endswith(parts[-1])


def _text(raw: Any, key: str) -> str | None:
    """A string field of the job (HCL or API form); None when check-job does not evaluate it."""
    try:
        return string_value(raw, key)
    except ValueProblem:
        return None


def _job_scope(job: ParsedJob) -> tuple[list[str | None] | None, str | None]:
    """The job's datacenters and node pool, defaults applied (None, or a None datacenter: not evaluated)."""
    api, body = job.api_form, job.hcl_body or {}
    raw_dcs = api.get("Datacenters") if api is not None else body.get("datacenters")
    raw_pool = api.get("NodePool") if api is not None else body.get("node_pool")
    dcs: list[str | None] | None = ["*"]  # absent, or an empty list
    if isinstance(raw_dcs, list) and raw_dcs:
        dcs = [_text(d, "datacenters") for d in raw_dcs]
    elif raw_dcs is not None and not isinstance(raw_dcs, list):
        dcs = None  # an expression check-job does not evaluate
    pool = "" if raw_pool is None else _text(raw_pool, "node_pool")
    return dcs, "default" if pool == "" else pool


def _volumes(job: ParsedJob, group: str) -> list[dict[str, Any]]:
    """The group's volume requests in the API form (``Name``, ``Type``, ``Source``, ``ReadOnly``, ...)."""
    if job.api_form is not None:
        for tg in dicts(job.api_form.get("TaskGroups")):
            if tg.get("Name") == group and isinstance(tg.get("Volumes"), dict):
                return [{"Name": name, **v} for name, v in tg["Volumes"].items() if isinstance(v, dict)]
        return []
    keys = {"type": "Type", "source": "Source", "read_only": "ReadOnly", "sticky": "Sticky", "per_alloc": "PerAlloc"}
    for name, body in labelled((job.hcl_body or {}).get("group", [])):
        if name == group:
            return [
                {"Name": label, **{field: plain(v.get(key)) for key, field in keys.items()}}
                for label, v in labelled(body.get("volume", []))
            ]
    return []


def _host_volume(volume: dict[str, Any], node_volumes: Mapping[str, Any] | None) -> ScopeCheck | None:
    kind = _text(volume.get("Type"), "type")
    source = _text(volume.get("Source"), "source")
    what = f'volume "{volume["Name"]}"'
    if kind == "csi":
        return ScopeCheck(what, UNKNOWN, "a CSI volume: Nomad checks its claims and plugins (CSIVolumeChecker)")
    if kind != "host":
        return None if kind is not None else ScopeCheck(what, UNKNOWN, "its type is not evaluated")
    if source is None:
        return ScopeCheck(what, UNKNOWN, "its source is not evaluated")
    what += f' (host volume "{source}")'
    if volume.get("PerAlloc") is True:
        return ScopeCheck(what, UNKNOWN, "per_alloc: the host volume's name ends with each allocation's index")
    if node_volumes is None:
        return ScopeCheck(what, UNKNOWN, "this node's host volumes are not known", (NODE_FILE,))
    given = node_volumes.get(source)
    if not isinstance(given, dict):
        return ScopeCheck(what, FAILS, "this node has no such host volume")
    if given.get("ID"):
        return ScopeCheck(what, UNKNOWN, "a dynamic host volume: Nomad checks it in its state (namespace, claims)")
    if volume.get("Sticky") is True:
        return ScopeCheck(what, FAILS, "sticky needs a dynamic host volume; this node's is static")
    if volume.get("ReadOnly") is not True and given.get("ReadOnly") is True:
        return ScopeCheck(what, FAILS, "the node's host volume is read-only and the request is not")
    return ScopeCheck(what, HOLDS)


def scope_checks(
    job: ParsedJob, group: str, resolve: Callable[[str], Known], host_volumes: Mapping[str, Any] | None
) -> tuple[ScopeCheck, ...]:
    """The group's datacenters, node pool and host volumes on this node (``host_volumes``: None, not known)."""
    dcs, pool = _job_scope(job)
    checks = []
    if dcs is None or None in dcs:
        checks.append(ScopeCheck("datacenters", UNKNOWN, "the job's datacenters are not evaluated"))
    elif "*" not in dcs:
        here = resolve("${node.datacenter}")
        what = f"datacenters {[d for d in dcs if d is not None]}"
        if not here.known:
            checks.append(ScopeCheck(what, UNKNOWN, "this node's datacenter is not known", here.hints))
        elif any(glob(d, here.value or "") for d in dcs if d is not None):
            checks.append(ScopeCheck(what, HOLDS, f"this node is in {here.value!r}"))
        else:
            checks.append(ScopeCheck(what, FAILS, f"this node is in {here.value!r}"))
    if pool is None:
        checks.append(ScopeCheck("node_pool", UNKNOWN, "the job's node pool is not evaluated"))
    elif pool != "all":
        here = resolve("${node.pool}")
        node_pool = (here.value or "default") if here.known else None  # Node.Register: "" is "default"
        if node_pool is None:
            checks.append(ScopeCheck(f"node_pool {pool!r}", UNKNOWN, "this node's pool is not known", here.hints))
        else:
            checks.append(
                ScopeCheck(
                    f"node_pool {pool!r}", HOLDS if node_pool == pool else FAILS, f"this node is in {node_pool!r}"
                )
            )
    for volume in _volumes(job, group):
        check = _host_volume(volume, host_volumes)
        checks += [check] if check is not None else []
    return tuple(checks)
