"""Fixtures: a simulator on a short socket directory and real gRPC stubs to it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import api_outer_pb2_grpc as pb_grpc
from nomad_plugin._proto.lingjun import config_service_pb2_grpc as cfg_grpc
from nomad_plugin.sim import Simulator
from tests.doubles.drifted_sim import DriftedSimulator


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="xs", dir="/tmp"))
    yield path / "s"
    shutil.rmtree(path, ignore_errors=True)


class Client:
    """Stubs for both sockets, built from the generated code."""

    def __init__(self, sim: Simulator) -> None:
        self.channel = grpc.insecure_channel(f"unix:{sim.dp2mgr_path}")
        self.config_channel = grpc.insecure_channel(f"unix:{sim.config_path}")
        self.xdm = pb_grpc.XpuDeviceManagerServiceStub(self.channel)
        self.config = cfg_grpc.AmpConfigServiceStub(self.config_channel)

    def allocate(self, gid: str, *devices: dict[str, int], **kw: Any) -> pb.AllocateResponse:
        req = pb.AllocateRequest(id=gid, devices=[pb.DeviceRequest(**d) for d in devices], **kw)
        return self.xdm.Allocate(req, timeout=5)

    def raw(self, path: str, request: bytes = b"", timeout: float = 5) -> bytes:
        call = self.channel.unary_unary(path, request_serializer=None, response_deserializer=None)
        result: bytes = call(request, timeout=timeout)
        return result

    def close(self) -> None:
        self.channel.close()
        self.config_channel.close()


@pytest.fixture
def make_sim(sock_dir: Path) -> Iterator[Callable[..., tuple[Simulator, Client]]]:
    made: list[tuple[Simulator, Client]] = []

    def factory(
        profile: str = "h800-8", schema: str | None = None, drift: str | None = None, **options: Any
    ) -> tuple[Simulator, Client]:
        """``schema`` (a schema of tests/doubles/drifted_schemas.py, by name) or ``drift`` (drift modes): a
        DriftedSimulator serves them; otherwise the product's Simulator."""
        options.setdefault("collect_interval_ms", 100)
        if schema is None and drift is None:
            sim = Simulator(sock_dir, profile, **options).start()
        else:
            sim = DriftedSimulator(sock_dir, profile, schema=schema or "builtin", drift=drift, **options).start()
        client = Client(sim)
        made.append((sim, client))
        return sim, client

    yield factory
    for sim, client in made:
        client.close()
        sim.stop()


@pytest.fixture
def sim_client(make_sim: Callable[..., tuple[Simulator, Client]]) -> tuple[Simulator, Client]:
    return make_sim()
