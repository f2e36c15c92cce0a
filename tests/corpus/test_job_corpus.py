"""check-job against a corpus of public job files, each with the outcome Nomad's source gives on the h800-8 node.

Every job in ``jobs/expected.json`` is run through the real command (``check-job FILE --profile h800-8
--no-agent --json`` plus the run's ``--node-value`` and ``-var`` arguments), and its verdict must be
Nomad's outcome, or "cannot tell" with a reason the manifest documents for that run. Never a
traceback or a Python warning. The outcomes and the Nomad source deciding each are in the manifest.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

JOBS = Path(__file__).parent / "jobs"
MANIFEST = json.loads((JOBS / "expected.json").read_text())
OUTCOMES = {"place", "not_placed", "refuse", "unknown"}
TIMEOUT_S = 120
pytestmark = pytest.mark.timeout(900)  # one fixture runs every job (in parallel) before the first test
RUNS = [(job, index, run) for job in MANIFEST["jobs"] for index, run in enumerate(job["runs"])]


@dataclass(frozen=True)
class Result:
    argv: list[str]
    code: int
    stdout: str
    stderr: str


def command(job: dict[str, Any], run: dict[str, Any]) -> list[str]:
    return [
        sys.executable, "-m", "nomad_plugin", "check-job", str(JOBS / job["file"]),
        "--profile", "h800-8", "--no-agent", "--json", *run["args"],
    ]  # fmt: skip


def execute(argv: list[str]) -> Result:
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        return Result(argv, -1, str(exc.stdout or ""), f"timed out after {TIMEOUT_S} s")
    return Result(argv, done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, int], Result]:
    """Every run at once, a few processes at a time: each launches the plugin and its simulator."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = pool.map(lambda item: execute(command(item[0], item[2])), RUNS)
        return {(job["file"], index): result for (job, index, _), result in zip(RUNS, done, strict=True)}


def reasons(doc: dict[str, Any]) -> str:
    """Everything check-job says about why it decided as it did, as one text."""
    parts: list[Any] = [doc.get("verdict", ""), doc.get("node_rules", {})]
    for request in doc.get("requests", []):
        parts += [request.get(k) for k in ("verdict", "problems", "unsupported", "why", "notes")]
    return json.dumps(parts)


def test_manifest_is_complete() -> None:
    files = {p.name for p in JOBS.iterdir() if p.name not in {"expected.json", "SOURCES.md"}}
    listed = [job["file"] for job in MANIFEST["jobs"]]
    assert sorted(listed) == sorted(files), "every corpus file has exactly one manifest entry"
    assert len(files) >= 60
    for job in MANIFEST["jobs"]:
        assert re.fullmatch(r"[0-9a-f]{40}", job["commit"]), job["file"]
        assert job["repository"] and job["path"] and job["runs"], job["file"]
        for run in job["runs"]:
            assert run["outcome"] in OUTCOMES and run["rule"] in MANIFEST["rules"], job["file"]
            assert run["outcome"] != "refuse" or run.get("error"), f"{job['file']}: a refusal names Nomad's error"


@pytest.mark.parametrize(("job", "index", "run"), RUNS, ids=[f"{job['file']}#{index}" for job, index, _ in RUNS])
def test_check_job_agrees_with_nomad(
    job: dict[str, Any], index: int, run: dict[str, Any], results: dict[tuple[str, int], Result]
) -> None:
    result = results[(job["file"], index)]
    problems = [*clean_run(result), *verdict_problems(run, result)]
    shown = f"{' '.join(result.argv[2:])}\nexit {result.code}\nstderr: {result.stderr[-1500:]}"
    assert not problems, "\n".join([*problems, shown])


def clean_run(result: Result) -> list[str]:
    problems = []
    if "Traceback" in result.stderr + result.stdout:
        problems.append("a traceback")
    if warning := re.search(r"^.*\w+Warning\b.*$", result.stderr, re.MULTILINE):
        problems.append(f"a Python warning: {warning.group(0).strip()}")
    return problems


def verdict_problems(run: dict[str, Any], result: Result) -> list[str]:
    wanted, why = run["outcome"], run["why"]
    try:
        doc = json.loads(result.stdout)
    except json.JSONDecodeError:
        return [f"--json printed no JSON document; Nomad: {wanted} ({why})"]
    said, text = doc.get("outcome"), reasons(doc)
    documented = run.get("documented_unknown", [])
    if said == "unknown" and not any(reason in text for reason in documented):
        return [
            f"check-job cannot tell, for no reason documented for this run ({documented}); Nomad: {wanted} ({why}); "
            f"check-job: {doc.get('verdict')}"
        ]
    if said == "unknown":
        return []
    if said != wanted:
        return [f"Nomad: {wanted} ({why}); check-job: {said}: {doc.get('verdict')}"]
    if wanted == "refuse" and not re.search(run["error"], text):
        return [f"the refusal does not name Nomad's error /{run['error']}/: {text[:1500]}"]
    return []
