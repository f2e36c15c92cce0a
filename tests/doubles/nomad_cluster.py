"""A Nomad cluster double: the servers' view of several client agents, for ``topology``.

Each node is a client agent double (``NomadApiDouble``: its allocations and
its node metadata, which the real plugin publishes there) plus the device
groups its plugin fingerprinted. This double answers what any agent answers
for the whole cluster (forwarding to the servers):

- ``GET /v1/nodes``: the node list stubs (``nomad/structs`` ``Node.Stub``: no
  Meta; ``?resources=true`` adds NodeResources); ``node:read``
  (nomad/node_endpoint.go ``Node.List``: ``AllowNodeRead``);
- ``GET /v1/node/:id``: the node with ``Meta`` as the servers have it (the
  agent's registered meta, after Nomad's batching) and
  ``NodeResources.Devices`` (``NodeDeviceResource``: Vendor, Type, Name,
  Instances of ID/Healthy/HealthDescription/Locality, Attributes as
  ``psstructs.Attribute`` JSON: Float/Int/String/Bool and Unit); 404 "node
  not found" (command/agent/node_endpoint.go); ``node:read``;
- ``GET /v1/node/:id/allocations``: ``node:read``, then allocations in
  namespaces without ``read-job`` silently left out (``Node.GetAllocs``);
- the ACL endpoints and rules of ``NomadApiDouble`` (this class is one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.doubles.nomad_api import NomadApiDouble, _Acl


@dataclass
class ClusterMember:
    agent: NomadApiDouble
    name: str
    devices: list[dict[str, Any]] = field(default_factory=list)  # NodeDeviceResource JSON
    status: str = "ready"
    eligibility: str = "eligible"
    drain: bool = False
    datacenter: str = "dc1"

    @property
    def node_id(self) -> str:
        return self.agent.node_id


def device_resources(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fingerprint groups (the conformance host's event JSON) as Nomad's ``NodeDeviceResource`` JSON.

    What the client's device manager turns a FingerprintResponse into
    (client/devicemanager, nomad/structs ``NodeDeviceResource``).
    """
    kinds = {"int": "Int", "float": "Float", "string": "String", "bool": "Bool"}
    out = []
    for g in groups:
        attributes = {
            key: {
                "Float": None,
                "Int": None,
                "String": None,
                "Bool": None,
                kinds[a["kind"]]: a["value"],
                "Unit": a["unit"],
            }
            for key, a in g["attributes"].items()
        }
        out.append(
            {
                "Vendor": g["vendor"],
                "Type": g["type"],
                "Name": g["name"],
                "Instances": [
                    {
                        "ID": d["id"],
                        "Healthy": d["healthy"],
                        "HealthDescription": d.get("health_description", ""),
                        "Locality": {"PciBusID": d["pci_bus_id"]} if d.get("pci_bus_id") else None,
                    }
                    for d in g["devices"]
                ],
                "Attributes": attributes,
            }
        )
    return out


class NomadClusterDouble(NomadApiDouble):
    """``start()`` like the agent double; ``add_node`` each client agent double with its devices."""

    def __init__(self) -> None:
        super().__init__(node_id="cluster-server")
        self.members: dict[str, ClusterMember] = {}

    def add_node(self, agent: NomadApiDouble, name: str, devices: list[dict[str, Any]] | None = None) -> ClusterMember:
        member = ClusterMember(agent, name, list(devices or []))
        with self._cond:
            self.members[agent.node_id] = member
            self._index += 1
        return member

    def set_devices(self, node_id: str, devices: list[dict[str, Any]]) -> None:
        with self._cond:
            self.members[node_id].devices = list(devices)
            self._index += 1

    # -- serving ----------------------------------------------------------------------
    def _serve(self, path: str, token: str) -> tuple[int, Any, int | None] | None:
        url = urlsplit(path)
        parts = [p for p in url.path.split("/") if p]
        if parts != ["v1", "nodes"] and not (len(parts) in (3, 4) and parts[:2] == ["v1", "node"]):
            return super()._serve(path, token)
        with self._cond:
            self.requests.append((path, token))
            down, latency, required = self._down, self._latency, self._token
        if down:
            return None
        if latency:
            time.sleep(latency)
        if required is not None and token != required:
            return 403, "Permission denied", self.index
        acl = self._resolve(token)
        if isinstance(acl, tuple):
            return acl
        if acl is not None and not acl.node_read:
            return 403, "Permission denied", self.index
        if parts == ["v1", "nodes"]:
            resources = parse_qs(url.query).get("resources", ["false"])[0] == "true"
            with self._cond:
                return 200, [self._stub(m, resources) for m in self.members.values()], self._index
        with self._cond:
            member = self.members.get(parts[2])
        if member is None:
            return 404, "node not found", self.index
        if len(parts) == 3:
            return 200, self._member_node(member), self.index
        if parts[3] != "allocations":
            return 404, "Invalid URL", self.index
        return 200, self._visible(member, acl), self.index

    def _visible(self, member: ClusterMember, acl: _Acl | None) -> list[dict[str, Any]]:
        return [a for a in member.agent.allocations() if acl is None or acl.read_job(a["Namespace"])]

    def _stub(self, m: ClusterMember, resources: bool) -> dict[str, Any]:
        stub: dict[str, Any] = {
            "ID": m.node_id,
            "Name": m.name,
            "Datacenter": m.datacenter,
            "NodeClass": "",
            "NodePool": "default",
            "Version": "1.10.0",
            "Drain": m.drain,
            "SchedulingEligibility": m.eligibility,
            "Status": m.status,
            "StatusDescription": "",
            "Address": "127.0.0.1",
            "CreateIndex": 1,
            "ModifyIndex": self._index,
        }
        if resources:
            stub["NodeResources"] = {"Devices": m.devices}
        return stub

    def _member_node(self, m: ClusterMember) -> dict[str, Any]:
        return {
            "ID": m.node_id,
            "Name": m.name,
            "Datacenter": m.datacenter,
            "NodePool": "default",
            "Status": m.status,
            "SchedulingEligibility": m.eligibility,
            "DrainStrategy": {"Deadline": 3600_000_000_000} if m.drain else None,
            "Attributes": {"kernel.name": "linux", "nomad.version": "1.10.0"},
            "Meta": m.agent.registered_meta(),
            "NodeResources": {"Devices": m.devices},
            "CreateIndex": 1,
            "ModifyIndex": self._index,
        }
