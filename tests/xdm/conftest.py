"""Fixtures: a real fake XDM server on a short Unix socket path, and clients for it."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.xdm.client import XdmClient
from tests.doubles.fake_xdm import FakeXdm, short_socket_dir


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = short_socket_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_fake(sockdir: Path) -> Iterator[Callable[..., FakeXdm]]:
    started: list[FakeXdm] = []

    def make(start: bool = True, **attrs: Any) -> FakeXdm:
        fake = FakeXdm(str(sockdir / "dp2mgr.sock"), str(sockdir / "config-daemon.sock"))
        for key, value in attrs.items():
            setattr(fake, key, value)
        started.append(fake)
        return fake.start() if start else fake

    yield make
    for fake in started:
        fake.stop()


@pytest.fixture
def config(sockdir: Path) -> PluginConfig:
    return PluginConfig(
        xdm_socket=str(sockdir / "dp2mgr.sock"),
        config_socket=str(sockdir / "config-daemon.sock"),
        xdm_call_timeout=2.0,
    )


@pytest.fixture
def make_client(config: PluginConfig) -> Iterator[Callable[..., XdmClient]]:
    clients: list[XdmClient] = []

    def make(**overrides: Any) -> XdmClient:
        client = XdmClient(replace(config, **overrides))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
