"""Fixtures for the go-plugin conformance tests (see README.md here)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.hostlib import HostProcess, HostRun, build_host, real_plugin, run_host, start_host

GO_PACKAGES = (
    "golang-go golang-github-hashicorp-go-plugin-dev golang-google-grpc-dev golang-goprotobuf-dev "
    "protobuf-compiler golang-github-zclconf-go-cty-dev golang-github-hashicorp-hcl-v2-dev "
    "golang-github-hashicorp-go-version-dev golang-github-hashicorp-hcl-dev"
)


@pytest.fixture(scope="session")
def conformance_host() -> Path:
    """Path of the built host. Skips only when Go itself is absent (the
    Makefile installs it in CI, so a skip there is a defect); any other
    build failure fails the tests."""
    if shutil.which("go") is None:
        pytest.skip(f"`go` is not installed; the conformance host needs: apt-get install -y {GO_PACKAGES}")
    try:
        return build_host()
    except Exception as exc:
        pytest.fail(f"building the conformance host failed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def plugin_executable() -> Path:
    return real_plugin()


@pytest.fixture
def host(conformance_host: Path) -> Callable[..., HostRun]:
    """`host(args, env=..., timeout=...)` runs the built host to completion."""

    def _run(args: list[str], **kw: Any) -> HostRun:
        return run_host(args, binary=conformance_host, **kw)

    return _run


@pytest.fixture
def interactive_host(conformance_host: Path) -> Iterator[Callable[..., HostProcess]]:
    """`interactive_host(args, env=...)` starts the host with --stdin; any
    host still running at teardown is stopped."""
    started: list[HostProcess] = []

    def _start(args: list[str], **kw: Any) -> HostProcess:
        proc = start_host(args, binary=conformance_host, **kw)
        started.append(proc)
        return proc

    yield _start
    for proc in started:
        if proc.proc.poll() is None:
            proc.finish(timeout=10)
