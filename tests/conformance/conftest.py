"""Fixtures for the go-plugin conformance tests (see README.md here)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.hostlib import HostNotBuilt, HostProcess, HostRun, built_host, real_plugin, run_host, start_host

GO_PACKAGES = (
    "golang-go golang-github-hashicorp-go-plugin-dev golang-google-grpc-dev golang-goprotobuf-dev "
    "protobuf-compiler golang-github-zclconf-go-cty-dev golang-github-hashicorp-hcl-v2-dev "
    "golang-github-hashicorp-go-version-dev golang-github-hashicorp-hcl-dev"
)


@pytest.fixture(scope="session")
def conformance_host() -> Path:
    """Path of the host ``make go-tools`` built. Nothing is built here: a cold Go build outlasts a
    test's timeout on a loaded box. Skips only outside CI when Go itself is absent; a missing or
    stale host fails the tests, naming the make target."""
    if shutil.which("go") is None and not os.environ.get("CI"):
        pytest.skip(f"`go` is not installed; the conformance host needs: apt-get install -y {GO_PACKAGES}")
    try:
        return built_host()
    except HostNotBuilt as exc:
        why = str(exc)
    pytest.fail(why, pytrace=False)  # outside the except: the message alone, no chained traceback


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
