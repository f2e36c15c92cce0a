"""Claims in docs/ that a command can check, checked with that command.

- docs/fingerprint.md: the first job stanza (whole cards with a memory
  constraint) is served on `h800-8`, whose "80 GB" cards report 81559 MiB.
- docs/fingerprint.md: the leaf-switch job is rejected on `h800-8` with the
  default grouping (its cards sit behind two leaf switches, so the whole-card
  group has no `leaf_switch`) and served with `group_by = "leafSwitch"`.
- docs/upgrade.md's upgrade procedure is shown by
  tests/integration/test_upgrade_e2e.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nomad_plugin.cli import check_job

REPO = Path(__file__).resolve().parents[2]
FINGERPRINT_DOC = (REPO / "docs" / "fingerprint.md").read_text()


def _doc_block(after: str) -> str:
    """The first ```hcl block after the sentence ``after`` in docs/fingerprint.md."""
    start = FINGERPRINT_DOC.index(after)
    match = re.compile(r"```hcl\n(.*?)```", re.S).search(FINGERPRINT_DOC, start)
    assert match, f"no hcl block after {after!r}"
    return match.group(1)


@pytest.fixture
def leaf_job(tmp_path: Path) -> Path:
    device = _doc_block("Stay behind one leaf switch.")
    body = "\n".join("        " + line for line in device.splitlines())
    job = tmp_path / "leaf.nomad.hcl"
    job.write_text(
        'job "leaf" {\n  group "g" {\n    task "t" {\n      driver = "docker"\n'
        '      config { image = "x" }\n      resources {\n' + body + "\n      }\n    }\n  }\n}\n"
    )
    return job


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = check_job.main([*argv, "--node-value", "node.pool=default", "--json"])  # the pool decides too
    return code, capsys.readouterr().out


def test_leaf_switch_job_needs_grouping_by_the_switch_on_h800_8(
    leaf_job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _check(capsys, str(leaf_job), "--profile", "h800-8")
    assert code == 1, out
    assert "unknown attribute 'leaf_switch'" in json.dumps(json.loads(out))

    code, out = _check(capsys, str(leaf_job), "--profile", "h800-8", "--set", "group_by=leafSwitch")
    assert code == 0, out
    assert "leafSwitch-asw-001" in out


def test_first_job_stanza_fits_an_80_gb_h800(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stanza = _doc_block("## Job file stanzas")
    assert 'attribute = "${device.attr.memory}"' in stanza
    job = tmp_path / "whole.nomad.hcl"
    job.write_text(
        'job "whole" {\n  group "g" {\n    task "t" {\n      driver = "docker"\n' + stanza + "    }\n  }\n}\n"
    )
    code, out = _check(capsys, str(job), "--profile", "h800-8")
    assert code == 0, out
    assert json.loads(out)["verdict"] == "Nomad would place this"
