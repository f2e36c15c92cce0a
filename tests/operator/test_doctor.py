"""doctor against broken setups: each finding with its next step.

Tests run as root, so "this user cannot open the socket" is simulated with
an injected access check (Host.access); a non-socket file stands in for a
socket path taken by something else. Everything else is real: the XDM
simulator on Unix sockets, the Nomad API double over HTTP, real files.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME, __version__
from nomad_plugin.cli import doctor
from nomad_plugin.sim import Simulator
from tests.doubles.drifted_schemas import served_schema
from tests.doubles.nomad_api import NomadApiDouble
from tests.operator.test_dist_launcher import shipped_file

TOKEN = "s3cr3t-token"


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    directory = Path(tempfile.mkdtemp(prefix="doc-", dir="/tmp"))  # short: Unix socket paths
    try:
        with Simulator(directory / "s", "h800-8") as s:
            yield s
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def nomad() -> Iterator[NomadApiDouble]:
    with NomadApiDouble() as double:
        double.require_token(TOKEN)
        yield double


@pytest.fixture
def setup(tmp_path: Path, sim: Simulator, nomad: NomadApiDouble) -> dict[str, Path]:
    """A healthy node: plugin config, plugin_dir with the right file, containerd + xpu runtime under a root."""
    cfg = tmp_path / "agent.hcl"
    cfg.write_text(
        f'plugin "{PLUGIN_NAME}" {{\n  config {{\n'
        f'    xdm_socket = "{sim.dp2mgr_path}"\n    config_socket = "{sim.config_path}"\n'
        f'    nomad_address = "{nomad.address}"\n    nomad_token = "{TOKEN}"\n'
        f'    data_dir = "{tmp_path / "data"}"\n  }}\n}}\n'
    )
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    shipped_file(plugins / PLUGIN_NAME, __version__)  # laid out as tools/build_dist.py writes it
    root = tmp_path / "root"
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.lj-runtime]\n'
    )
    (root / "usr/local/harp/kitC").mkdir(parents=True)
    (root / "usr/local/harp/kitC/xpu-container-runtime").write_text("")
    return {"config": cfg, "plugins": plugins, "root": root}


def run(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], *extra: str, host: doctor.Host | None = None
) -> tuple[int, dict[str, dict[str, str]]]:
    argv = ["--plugin-config", str(setup["config"]), "--plugin-dir", str(setup["plugins"]), "--json", *extra]
    code = doctor.main(argv, host or doctor.Host(root=setup["root"]))
    doc = json.loads(capsys.readouterr().out)
    by_check: dict[str, dict[str, str]] = {}
    for f in doc["findings"]:
        by_check.setdefault(f["check"], f)
        if f["status"] == "fail":
            by_check[f["check"]] = f
    return code, by_check


def test_healthy_node_passes(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, found = run(setup, capsys)
    assert code == 0, found
    for check in (
        "config",
        "socket dp2mgr",
        "socket config-daemon",
        "xdm",
        "runtime kit",
        "inventory",
        "topology",
        "nomad api",
        "plugin file",
        "lj-runtime",
    ):
        assert found[check]["status"] == "ok", (check, found[check])
    assert "8 cards" in found["inventory"]["summary"]


def test_missing_socket(setup: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, found = run(setup, capsys, "--set", f'xdm_socket="{tmp_path}/nope.sock"')
    assert code == 1
    assert found["socket dp2mgr"]["status"] == "fail" and "does not exist" in found["socket dp2mgr"]["summary"]
    assert "Controller job" in found["socket dp2mgr"]["next_step"]


def test_path_that_is_not_a_socket(setup: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fake = tmp_path / "dp2mgr.sock"
    fake.write_text("")
    code, found = run(setup, capsys, "--set", f'xdm_socket="{fake}"')
    assert code == 1 and "is not a socket" in found["socket dp2mgr"]["summary"]


def test_socket_this_user_cannot_open(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], sim: Simulator
) -> None:
    def no_access(path: str, mode: int) -> bool:
        return path != str(sim.dp2mgr_path)

    code, found = run(setup, capsys, host=doctor.Host(root=setup["root"], access=no_access))
    assert code == 1
    assert "cannot be opened by this user" in found["socket dp2mgr"]["summary"]
    assert "root-only" in found["socket dp2mgr"]["next_step"] and "as root" in found["socket dp2mgr"]["next_step"]


def test_runtime_kit_disabled(setup: dict[str, Path], capsys: pytest.CaptureFixture[str], sim: Simulator) -> None:
    sim.set_enabled(False)
    try:
        code, found = run(setup, capsys)
    finally:
        sim.set_enabled(True)
    assert code == 1
    assert found["runtime kit"]["status"] == "fail" and "disabled" in found["runtime kit"]["summary"]
    assert "nomad-device-lingjun runtime-kit enable" in found["runtime kit"]["next_step"]


def test_bad_token(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, found = run(setup, capsys, "--set", 'nomad_token="wrong"')
    assert code == 1
    assert found["nomad api"]["status"] == "fail" and "node:read" in found["nomad api"]["next_step"]
    assert "wrong" not in json.dumps(found)  # the token never appears


def test_nomad_unreachable(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, found = run(setup, capsys, "--set", 'nomad_address="http://127.0.0.1:1"')
    assert code == 1 and "NOMAD_ADDR" in found["nomad api"]["next_step"]


def test_misnamed_plugin_file(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    (setup["plugins"] / PLUGIN_NAME).rename(setup["plugins"] / f"{PLUGIN_NAME}-0.1.0")
    code, found = run(setup, capsys)
    assert code == 1
    assert "no matching plugin" in found["plugin file"]["summary"] and "1.10" in found["plugin file"]["next_step"]


def test_plugin_file_not_executable(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    (setup["plugins"] / PLUGIN_NAME).chmod(0o644)
    code, found = run(setup, capsys)
    assert code == 1 and "chmod 0755" in found["plugin file"]["next_step"]


def test_missing_plugin_file(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    (setup["plugins"] / PLUGIN_NAME).unlink()
    code, found = run(setup, capsys)
    assert code == 1 and f"dist/{PLUGIN_NAME}" in found["plugin dir"]["next_step"]


def test_bad_config_names_the_option(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, found = run(setup, capsys, "--set", 'default_mode="halves"')
    assert code == 1
    assert found["config"]["status"] == "fail" and "default_mode" in found["config"]["summary"]


@pytest.mark.parametrize(
    ("content", "summary", "step"),
    [
        (f'plugin "{PLUGIN_NAME}" {{\n config {{\n  backend = \n }}\n', "not valid HCL", "fix the syntax"),
        (f'plugin "{PLUGIN_NAME}" {{\n config {{\n  cout = 3\n }}\n}}\n', "cout", "refuses to start the agent"),
        (None, "cannot read", "point --plugin-config at"),
    ],
    ids=["bad-hcl", "unknown-option", "missing-file"],
)
def test_config_findings_name_the_right_next_step(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], content: str | None, summary: str, step: str
) -> None:
    if content is None:
        setup["config"].unlink()
    else:
        setup["config"].write_text(content)
    code, found = run(setup, capsys)
    assert code == 1 and found["config"]["status"] == "fail"
    assert summary in found["config"]["summary"]
    assert step in found["config"]["next_step"], found["config"]["next_step"]
    assert "option named above" not in found["config"]["next_step"] or summary == "cout"
    # An unreadable config says nothing about the plugin file's name (it is named right here).
    assert found["plugin file"]["status"] != "fail", found["plugin file"]


def test_runtime_missing_is_a_warning_only(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    (setup["root"] / "usr/local/harp/kitC/xpu-container-runtime").unlink()
    code, found = run(setup, capsys)
    assert code == 0 and found["lj-runtime"]["status"] == "warn"


def test_text_output(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = doctor.main(
        ["--plugin-config", str(setup["config"]), "--set", 'nomad_token="x"'], doctor.Host(root=setup["root"])
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "[FAIL] nomad api:" in out and "next step: the token needs node:read" in out


@pytest.fixture(scope="module")
def renumbered_sim() -> Iterator[Simulator]:
    directory = Path(tempfile.mkdtemp(prefix="doc-", dir="/tmp"))
    try:
        with Simulator(directory / "s", "h800-8", schema=served_schema("renumbered")) as s:
            yield s
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_schema_binding_report_only_with_verbose(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, found = run(setup, capsys)
    assert code == 0 and found["xdm schema"]["status"] == "ok"
    assert found["xdm schema"]["summary"] == "bound from builtin"
    code, found = run(setup, capsys, "--verbose")
    summary = found["xdm schema"]["summary"]
    assert summary.startswith("bound from builtin")
    assert "Device.totalMemory -> xdm.Device.totalMemory #6 int64" in summary


def test_healthy_node_ends_with_one_summary_line(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--plugin-config", str(setup["config"]), "--plugin-dir", str(setup["plugins"])]
    code = doctor.main(argv, doctor.Host(root=setup["root"]))
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[-1].startswith("doctor: ") and "0 failed" in lines[-1] and "can run the plugin" in lines[-1]
    assert len(lines) <= 30, "\n".join(lines)  # one line per check (and its next step), not the binding report


def test_schema_mismatch_is_a_failure_with_the_next_step(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], renumbered_sim: Simulator
) -> None:
    sockets = [
        "--set", f'xdm_socket="{renumbered_sim.dp2mgr_path}"',
        "--set", f'config_socket="{renumbered_sim.config_path}"',
    ]  # fmt: skip
    code, found = run(setup, capsys, *sockets, "--set", 'xdm_schema="builtin"')
    assert code == 1
    assert found["inventory"]["status"] == "fail" and "XDM schema mismatch" in found["inventory"]["summary"]
    assert "xdm_schema" in found["inventory"]["next_step"]
    renumbered_sim.schema.emit(setup["root"] / "official")
    code, found = run(setup, capsys, *sockets, "--set", f'xdm_schema="{setup["root"] / "official"}"')
    assert found["xdm schema"]["status"] == "ok" and found["inventory"]["status"] == "ok", found


@pytest.mark.parametrize(
    ("rules", "status"),
    [
        ('namespace "default" { policy = "read" }\nnode { policy = "read" }\nagent { policy = "read" }\n', "warn"),
        ('namespace "*" { capabilities = ["read-job"] }\nnode { policy = "read" }\nagent { policy = "read" }\n', "ok"),
    ],
)
def test_nomad_visibility_names_the_policy_to_add(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str], rules: str, status: str
) -> None:
    with NomadApiDouble() as acl_nomad:
        acl_nomad.enable_acls()
        acl_nomad.add_policy("lingjun", rules)
        acl_nomad.add_token("acl-token", ["lingjun"])
        acl_nomad.add_alloc("hidden", ["x"], namespace="team-a")
        code, found = run(
            setup, capsys, "--set", f'nomad_address="{acl_nomad.address}"', "--set", 'nomad_token="acl-token"'
        )
    assert code == 0, found  # a warning, not a failure: the plugin stays safe, it only keeps more grants
    assert found["nomad api"]["status"] == "ok"
    finding = found["nomad visibility"]
    assert finding["status"] == status, finding
    if status == "warn":
        assert 'namespace "*" { capabilities = ["read-job"] }' in finding["next_step"]
        assert "namespace" in finding["summary"] and "acl-token" not in json.dumps(finding)
