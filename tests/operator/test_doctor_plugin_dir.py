"""doctor checks the plugin dir the agent uses, read from the agent files as the agent reads them.

Nomad's rule (command/agent/command.go): the -plugin-dir flag, else the files' plugin_dir (the last
file that sets it), else <data_dir>/plugins; a relative data_dir or plugin_dir stops the agent
("must be given as an absolute path"). doctor's --plugin-dir stands for the flag. Each test runs the
real command (doctor.main) on real files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME, __version__
from nomad_plugin.cli import doctor
from tests.operator.test_dist_launcher import shipped_file

Found = dict[str, list[dict[str, str]]]


def plugin_block(tmp_path: Path) -> str:
    return f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    data_dir = "{tmp_path / "journal"}"\n  }}\n}}\n'


def install(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return shipped_file(directory / PLUGIN_NAME, __version__)  # laid out as tools/build_dist.py writes it


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: Path, *extra: str) -> tuple[str, Found]:
    sockets = ["--set", f'xdm_socket="{tmp_path}/no-dp2mgr.sock"', "--set", f'config_socket="{tmp_path}/no-cd.sock"']
    argv = ["--plugin-config", str(config), "--json", "--root", str(tmp_path / "root"), *sockets, *extra]
    doctor.main(argv, doctor.Host(root=tmp_path / "root", nvml_usable=lambda: False))
    doc = json.loads(capsys.readouterr().out)
    found: Found = {}
    for finding in doc["findings"]:
        found.setdefault(finding["check"], []).append(finding)
    return doc["summary"], found


def agent_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.hcl"
    path.write_text(text + plugin_block(tmp_path))
    return path


def test_plugin_dir_from_the_agent_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugins = tmp_path / "opt" / "plugins"
    exe = install(plugins)
    config = agent_file(tmp_path, f'data_dir = "{tmp_path / "nomad"}"\nplugin_dir = "{plugins}"\n')
    _, found = run(tmp_path, capsys, config)
    assert found["plugin dir"] == [
        {"check": "plugin dir", "status": "ok", "summary": f"{plugins} (plugin_dir in {config})", "next_step": ""}
    ]
    assert found["plugin file"][0]["status"] == "ok" and str(exe) in found["plugin file"][0]["summary"]


def test_data_dir_plugins_when_no_plugin_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Commas between attributes, as HCL v1 allows them: the file is read, not refused."""
    exe = install(tmp_path / "nomad" / "plugins")
    config = agent_file(tmp_path, f'data_dir = "{tmp_path / "nomad"}/", log_level = "INFO"\n')
    _, found = run(tmp_path, capsys, config)
    assert found["config"][0]["status"] == "ok", found["config"]
    assert found["plugin dir"][0]["status"] == "ok"
    assert found["plugin dir"][0]["summary"] == f"{exe.parent} (data_dir + /plugins in {config})"
    assert found["plugin file"][0]["status"] == "ok"


def test_plugin_dir_flag_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    given = tmp_path / "given"
    exe = install(given)
    config = agent_file(tmp_path, f'plugin_dir = "{tmp_path / "missing"}"\n')
    _, found = run(tmp_path, capsys, config, "--plugin-dir", str(given))
    assert "plugin dir" not in found  # the flag's directory is the one checked, and it is fine
    assert found["plugin file"][0]["status"] == "ok" and str(exe) in found["plugin file"][0]["summary"]


@pytest.mark.parametrize(
    ("setting", "flag"), [('plugin_dir = "plugins"', "plugin-dir"), ('data_dir = "var/nomad"', "data-dir")]
)
def test_relative_dir_fails_as_the_agent_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str, flag: str
) -> None:
    config = agent_file(tmp_path, setting + "\n")
    summary, found = run(tmp_path, capsys, config)
    value = setting.split('"')[1]
    assert found["plugin dir"][0]["status"] == "fail"
    assert f"{flag} must be given as an absolute path: got {value}" in found["plugin dir"][0]["summary"]
    assert "can run the plugin" not in summary


def test_no_plugin_file_in_the_derived_dir_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nomad" / "plugins").mkdir(parents=True)
    config = agent_file(tmp_path, f'data_dir = "{tmp_path / "nomad"}"\n')
    summary, found = run(tmp_path, capsys, config)
    fail = [f for f in found["plugin dir"] if f["status"] == "fail"]
    assert fail and f"no {PLUGIN_NAME} file in {tmp_path / 'nomad' / 'plugins'}" in fail[0]["summary"]
    assert "can run the plugin" not in summary


def test_neither_set_is_a_skip_that_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = agent_file(tmp_path, 'datacenter = "dc1"\n')
    _, found = run(tmp_path, capsys, config)
    assert found["plugin dir"][0]["status"] == "skip"
    assert "sets neither plugin_dir nor data_dir" in found["plugin dir"][0]["summary"]


def test_a_config_directory_merges_as_the_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Files in name order, the last plugin_dir wins; an editor's backup file is not read."""
    conf = tmp_path / "nomad.d"
    conf.mkdir()
    first, last = tmp_path / "first", tmp_path / "last"
    install(first)
    exe = install(last)
    (conf / "00-base.hcl").write_text(f'data_dir = "{tmp_path / "nomad"}"\nplugin_dir = "{first}"\n')
    (conf / "10-plugin.hcl").write_text(plugin_block(tmp_path))
    (conf / "20-dirs.hcl").write_text(f'plugin_dir = "{last}"\n')
    (conf / "20-dirs.hcl~").write_text('plugin_dir = "/elsewhere" {{{')
    _, found = run(tmp_path, capsys, conf)
    assert found["config"][0]["status"] == "ok", found["config"]
    assert found["plugin dir"][0]["summary"] == f"{last} (plugin_dir in {conf})"
    assert str(exe) in found["plugin file"][0]["summary"]


def test_unreadable_agent_file_skips_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = agent_file(tmp_path, 'data_dir = "/var/lib/nomad"\ntelemetry { collection_interval = 5s }\n')
    summary, found = run(tmp_path, capsys, config)
    assert found["config"][0]["status"] == "fail"
    assert "not valid HCL" in found["config"][0]["summary"]
    assert found["plugin dir"][0]["status"] == "skip" and "could not be read" in found["plugin dir"][0]["summary"]
    assert "can run the plugin" not in summary
