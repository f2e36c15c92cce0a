"""Allocations with their job, as Nomad's API serves them, for the Nomad API double.

``/v1/node/<id>/allocations`` and ``/v1/allocation/<id>`` return whole
``structs.Allocation`` objects, which embed the job they were placed from
(``Job.TaskGroups[].Tasks[]``, group ``Volumes`` and task ``VolumeMounts``).
``add_alloc_with_job`` adds such an allocation to a ``NomadApiDouble`` so the
``container_mounts = "auto"`` lookup reads the shapes a real agent sends.
Kept apart from the double itself so the double stays small.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tests.doubles.nomad_api import NomadApiDouble


@dataclass(frozen=True)
class HostVolume:
    """A group ``volume "<name>" { type = "host" source = ... }`` and the task's ``volume_mount``."""

    name: str = "scratch"
    source: str = "scratch"
    destination: str = "/scratch"
    read_only: bool = False


def job_json(
    job_id: str, group: str, task: str, device: str, count: int, volumes: Sequence[HostVolume]
) -> dict[str, Any]:
    """A job as ``nomad job inspect`` / the allocation's ``Job`` field shows it (fields that matter here)."""
    return {
        "ID": job_id,
        "Name": job_id,
        "Namespace": "default",
        "Type": "service",
        "Datacenters": ["dc1"],
        "Status": "running",
        "TaskGroups": [
            {
                "Name": group,
                "Count": 1,
                "Volumes": {
                    v.name: {
                        "Name": v.name,
                        "Type": "host",
                        "Source": v.source,
                        "ReadOnly": v.read_only,
                        "AccessMode": "",
                        "AttachmentMode": "",
                        "MountOptions": None,
                        "PerAlloc": False,
                    }
                    for v in volumes
                }
                or None,
                "Tasks": [
                    {
                        "Name": task,
                        "Driver": "docker",
                        "Config": {"image": "registry.local/train:latest"},
                        "Env": None,
                        "Resources": {
                            "CPU": 100,
                            "MemoryMB": 256,
                            "Devices": [{"Name": device.rsplit("/", 1)[0], "Count": count}],
                        },
                        "VolumeMounts": [
                            {
                                "Volume": v.name,
                                "Destination": v.destination,
                                "ReadOnly": v.read_only,
                                "PropagationMode": "private",
                                "SELinuxLabel": "",
                            }
                            for v in volumes
                        ]
                        or None,
                    }
                ],
            }
        ],
    }


def add_alloc_with_job(
    double: NomadApiDouble,
    alloc_id: str,
    device_ids: Iterable[str],
    status: str = "running",
    *,
    device: str = "alibaba/ppu/x",
    volumes: Sequence[HostVolume] = (),
    desired_status: str = "run",
    job_id: str = "train",
) -> None:
    """``double.add_alloc`` with a fuller embedded job (host volumes when given) and DesiredStatus."""
    ids = list(device_ids)
    double.add_alloc(alloc_id, ids, status, device=device, job=job_id)
    with double._cond:
        alloc = double._allocs[alloc_id]
        alloc["DesiredStatus"] = desired_status
        alloc["Job"] = job_json(job_id, str(alloc["TaskGroup"]), double.task, device, len(ids), volumes)
        double._index += 1
        alloc["ModifyIndex"] = double._index
        double._cond.notify_all()


class NodeListWithoutJobs(NomadApiDouble):
    """A double whose node allocation list leaves the embedded job out.

    Only ``/v1/allocation/<id>`` carries it then, which is the fallback the
    ``container_mounts = "auto"`` lookup takes when a list answer has no job.
    """

    def _node_allocs(self, *args: Any, **kwargs: Any) -> tuple[int, Any, int]:
        status, body, index = super()._node_allocs(*args, **kwargs)
        if status == 200 and isinstance(body, list):
            body = [{key: value for key, value in alloc.items() if key != "Job"} for alloc in body]
        return status, body, index
