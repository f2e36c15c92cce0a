"""BENCHMARKS.md, docs/testing.md and the benchmark scripts name only what exists.

A benchmark script that is deleted or renamed leaves commands in the docs that fail for the
first reader who tries them; a script that imports a deleted helper fails only when someone
runs it. Both are caught here without running any benchmark.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ("BENCHMARKS.md", "docs/testing.md")
# A repository path (or glob) in prose or in a command: benchmarks/guards.py, tests/operator/test_dist*.py
PATH = re.compile(r"(?<![\w./-])((?:benchmarks|tools|tests|deploy|docs)/[\w./*-]*[\w/*])")


def _paths(doc: str) -> set[str]:
    return {m.rstrip("/.") for m in PATH.findall((REPO / doc).read_text())}


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc: str) -> None:
    base = (REPO / doc).parent
    missing = sorted(p for p in _paths(doc) if not any(REPO.glob(p)) and not any(base.glob(p)))
    assert not missing, f"{doc} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_make_target_a_doc_names_exists(doc: str) -> None:
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    words = {t for line in re.findall(r"`make ([\w -]+)", (REPO / doc).read_text()) for t in line.split()}
    named = {t for t in words if re.fullmatch(r"[a-z][a-z-]*", t)}  # MODULES=... is a variable
    assert named, f"{doc} names no make target (the pattern is wrong)"
    assert named <= targets, f"{doc} names make targets the Makefile lacks: {sorted(named - targets)}"


@pytest.mark.parametrize("script", ["guards.py", "handshake.py", "health_propagation.py"])
def test_benchmark_scripts_start(script: str) -> None:
    """``--help`` imports everything the script needs (the helpers it shares with the others included)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
