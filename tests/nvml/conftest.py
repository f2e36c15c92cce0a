"""Fixtures for the NVML backend tests: a recorded NVML double and fast timings."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.nvml.backend import NvmlBackend
from nomad_plugin.util.threads import Backoff
from tests.doubles.fake_pynvml import FakeNvml


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., bool]:
    return wait_for


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def make_backend(tmp_path) -> Iterator[Callable[..., NvmlBackend]]:
    started: list[NvmlBackend] = []

    def make(nvml: FakeNvml, config: PluginConfig | None = None, start: bool = True, **kw) -> NvmlBackend:
        kw.setdefault("event_timeout_ms", 20)
        kw.setdefault("backoff", Backoff(initial=0.02, cap=0.1, jitter=0.0))
        kw.setdefault("sysfs_root", str(tmp_path / "sys"))
        kw.setdefault("proc_root", str(tmp_path / "proc"))
        kw.setdefault("dev_root", str(tmp_path / "dev"))
        backend = NvmlBackend(config, nvml=nvml, **kw)
        started.append(backend)
        if start:
            backend.start()
            assert backend.wait_ready(5.0), backend.inventory().unreachable_reason
        return backend

    yield make
    for backend in started:
        backend.stop()
