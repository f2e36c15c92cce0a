"""doctor's node metadata check: the capability it needs, judged read-only from the token's policies."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.cli import doctor
from nomad_plugin.sim import Simulator
from tests.doubles.nomad_api import NomadApiDouble

READ_ONLY = 'namespace "*" { capabilities = ["read-job"] }\nnode { policy = "read" }\nagent { policy = "read" }'


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    directory = Path(tempfile.mkdtemp(prefix="dnm-", dir="/tmp"))
    try:
        with Simulator(directory / "s", "m890p-8") as s:
            yield s
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def api() -> Iterator[NomadApiDouble]:
    with NomadApiDouble() as double:
        double.enable_acls()
        double.add_policy("plugin", READ_ONLY)
        double.add_policy("meta", 'node { policy = "write" }')
        double.add_token("reader", ["plugin"])
        double.add_token("writer", ["plugin", "meta"])
        yield double


def findings(tmp_path: Path, sim: Simulator, api: NomadApiDouble, token: str, node_meta: bool = True) -> list[dict]:
    cfg = tmp_path / "agent.hcl"
    cfg.write_text(
        f'plugin "{PLUGIN_NAME}" {{\n  config {{\n'
        f'    xdm_socket = "{sim.dp2mgr_path}"\n    config_socket = "{sim.config_path}"\n'
        f'    nomad_address = "{api.address}"\n    nomad_token = "{token}"\n'
        f'    data_dir = "{tmp_path / "data"}"\n    node_meta = {str(node_meta).lower()}\n  }}\n}}\n'
    )
    doc = json.loads(_run(["--plugin-config", str(cfg), "--json", "--root", str(tmp_path)]))
    return [f for f in doc["findings"] if f["check"] == "node meta"]


def _run(argv: list[str]) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        doctor.main(argv)
    return out.getvalue()


def test_a_read_only_token_fails_naming_node_write(tmp_path: Path, sim: Simulator, api: NomadApiDouble) -> None:
    (finding,) = findings(tmp_path, sim, api, "reader")
    assert finding["status"] == "fail" and "lacks node:write" in finding["summary"]
    assert 'node { policy = "write" }' in finding["next_step"] and "node-meta" in finding["next_step"]
    assert not api.meta.posts  # doctor wrote nothing to find out


def test_a_token_with_node_write_passes(tmp_path: Path, sim: Simulator, api: NomadApiDouble) -> None:
    api.meta.apply({"lingjun.card_count": "8"})
    (finding,) = findings(tmp_path, sim, api, "writer")
    assert finding["status"] == "ok" and "lingjun.card_count=8" in finding["summary"], finding


def test_off_is_a_skip_that_names_the_static_alternative(tmp_path: Path, sim: Simulator, api: NomadApiDouble) -> None:
    (finding,) = findings(tmp_path, sim, api, "reader", node_meta=False)
    assert finding["status"] == "skip" and "node-meta" in finding["summary"]
