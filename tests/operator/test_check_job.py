"""check-job against the real plugin + simulator: every example passes, every bad job fails for its reason."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from nomad_plugin.cli import check_job, fingerprint

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples" / "jobs").glob("*.nomad.hcl"))
POOL = ["--node-value", "node.pool=default"]  # the node pool decides where a job may run (jobspec/scope.py)
BAD = sorted((Path(__file__).parent / "bad_jobs").glob("*.nomad.hcl"))


def header_value(path: Path, key: str) -> str:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return ""


def run_check(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict]:
    code = check_job.main([*argv, *POOL, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_examples_cover_the_brief() -> None:
    names = {p.name for p in EXAMPLES}
    for wanted in (
        "whole-card",
        "two-cards-one-numa",
        "tdm-share",
        "mig-slice",
        "leaf-switch-affinity",
        "pod-spread",
        "raw-exec-env",
    ):
        assert f"{wanted}.nomad.hcl" in names
    for path in EXAMPLES:
        assert path.read_text().startswith(f"# {path.name}:"), f"{path.name}: comment header missing"
        assert header_value(path, "check-job"), f"{path.name}: no '# check-job:' line"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_against_its_profile(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = shlex.split(header_value(path, "check-job"))
    args = [str(REPO / a) if a.startswith("examples/") else a for a in args]
    code, doc = run_check(capsys, [str(path), *args])
    assert code == 0, json.dumps(doc["requests"], indent=1)[:3000]
    assert doc["ok"] and doc["requests"]
    for req in doc["requests"]:
        assert req["chosen"] and len(req["picked_ids"]) == req["count"]


def test_whole_card_picks_the_h800_group(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_check(capsys, [str(REPO / "examples/jobs/whole-card.nomad.hcl"), "--profile", "h800-8"])
    assert code == 0
    (req,) = doc["requests"]
    assert req["chosen"] == "nvidia/gpu/NVIDIA H800"
    (constraint,) = req["groups"][0]["constraints"]
    assert constraint["passed"] and constraint["left"].startswith("81559 MiB")


def test_leaf_switch_affinity_prefers_asw002(capsys: pytest.CaptureFixture[str]) -> None:
    path = REPO / "examples/jobs/leaf-switch-affinity.nomad.hcl"
    code, doc = run_check(capsys, [str(path), "--profile", "h800-8", "--set", "group_by=numaNodes"])
    assert code == 0
    assert doc["requests"][0]["chosen"] == "nvidia/gpu/NVIDIA H800 numa1"


@pytest.fixture(scope="module")
def saved_fingerprints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Live fingerprints (whole and mig mode) saved by `fingerprint --json`, read back by check-job."""
    out: dict[str, Path] = {}
    for key, extra in (("whole", []), ("mig", ["--set", "default_mode=mig"])):
        path = tmp_path_factory.mktemp("fp") / f"{key}.json"
        result = subprocess.run(
            [sys.executable, "-m", "nomad_plugin", "fingerprint", "--profile", "h800-8", "--json", *extra],
            capture_output=True, text=True, timeout=90, cwd=REPO,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        path.write_text(result.stdout)
        out[key] = path
    return out


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_bad_job_is_rejected_with_its_reason(
    path: Path, saved_fingerprints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    expected = header_value(path, "expect")
    assert expected
    fp = saved_fingerprints["mig" if "mig" in header_value(path, "check-job") else "whole"]
    code, doc = run_check(capsys, [str(path), "--fingerprint", str(fp)])
    assert code == int((header_value(path, "exit") or "1").split()[0]) and not doc["ok"]
    said = json.dumps(doc["requests"])
    assert expected in said.replace('\\"', '"'), f"{expected!r} not in {said[:1500]}"


def test_text_output_names_group_and_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    code = check_job.main([str(Path(__file__).parent / "bad_jobs/bad-unit-base.nomad.hcl"), "--profile", "h800-8"])
    out = capsys.readouterr().out
    assert code == 1
    assert "rejected nvidia/gpu/NVIDIA H800: constraint ${device.attr.memory} >= '1000 MHz': unit mismatch" in out
    assert "\x1b[" not in out  # no colour when stdout is not a terminal


def test_bad_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "j.hcl"
    broken.write_text("job {{")
    assert check_job.main([str(broken), "--profile", "h800-8"]) == 2
    out = capsys.readouterr().out  # Nomad refuses a file it cannot parse, in HashiCorp's parser's words
    assert f"INVALID {broken}:1,6-7: Argument or block definition required" in out, out
    assert out.rstrip().endswith("Nomad would refuse this job at submission")
    assert check_job.main([str(REPO / "examples/jobs/whole-card.nomad.hcl"), "--profile", "nope"]) == 2
    assert "unknown profile" in capsys.readouterr().err


def test_fingerprint_command_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert fingerprint.main(["--profile", "m890p-8", "--detail"]) == 0
    out = capsys.readouterr().out
    assert "Device Group Attributes: alibaba/ppu/PPU M890P  (8/8 healthy)" in out
    assert "memory                   = 147456 MiB" in out
