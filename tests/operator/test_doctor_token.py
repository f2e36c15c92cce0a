"""doctor on where the Nomad ACL token is kept: in the agent file it warns (who can read it, how to move
it), in a file of the plugin's user's own or in the environment it is quiet; a token file others may read
fails the config check as the plugin's SetConfig would. Through the command's entry point, on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.cli import doctor

TOKEN = "d0ct0r-5e1f-4b7a-token-in-agent-file"


def _agent_file(tmp_path: Path, line: str) -> Path:
    cfg = tmp_path / "agent.hcl"
    cfg.write_text(f'plugin "{PLUGIN_NAME}" {{\n  config {{\n    {line}\n  }}\n}}\n')
    return cfg


def _doctor(cfg: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = doctor.main(["--plugin-config", str(cfg), "--config-only", *extra], doctor.Host(environ={}))
    return code, capsys.readouterr().out


def test_a_token_in_the_agent_file_is_a_warning_saying_who_reads_it_and_how_to_move_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _agent_file(tmp_path, f'nomad_token = "{TOKEN}"')
    code, out = _doctor(cfg, capsys)
    assert code == 0, out  # a warning: the node can still run the plugin
    assert f"[WARN] nomad token: nomad_token is written in the plugin's config block ({cfg})" in out
    assert "GET /v1/agent/self" in out and "every ACL token with agent:read" in out
    assert "next step: write the token to a file" in out and "nomad_token_file" in out and "NOMAD_TOKEN" in out
    assert TOKEN not in out

    code, out = _doctor(cfg, capsys, "--json")
    (finding,) = [f for f in json.loads(out)["findings"] if f["check"] == "nomad token"]
    assert finding["status"] == "warn" and "rotate the token" in finding["next_step"]
    assert TOKEN not in out


@pytest.mark.parametrize("kept", ["file", "environment"])
def test_a_token_kept_out_of_the_agent_file_gets_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kept: str
) -> None:
    token_file = tmp_path / "nomad.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    cfg = _agent_file(tmp_path, f'nomad_token_file = "{token_file}"' if kept == "file" else "enabled = true")
    code, out = _doctor(cfg, capsys, "--json")
    findings = json.loads(out)["findings"]
    assert code == 0 and [f["status"] for f in findings if f["check"] == "config"] == ["ok"], out
    assert not [f for f in findings if f["check"] == "nomad token"]
    assert TOKEN not in out


def test_a_token_file_others_may_read_fails_the_config_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file = tmp_path / "nomad.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)
    code, out = _doctor(_agent_file(tmp_path, f'nomad_token_file = "{token_file}"'), capsys)
    assert code == 1
    assert f'[FAIL] config: {tmp_path / "agent.hcl"}: config option "nomad_token_file"' in out
    assert "(mode 0644)" in out and "mode 0600 or 0400" in out
    assert TOKEN not in out
