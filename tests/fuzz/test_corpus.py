"""Every input in tests/fuzz/corpus/ through its target's checker: a fixed bug stays fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz import checks

CORPUS = Path(__file__).parent / "corpus"
HELD = ("GPU-aaaa", "GPU-bbbb")


def _cases(folder: str) -> list[Path]:
    return sorted(p for p in (CORPUS / folder).glob("*") if p.is_file())


def _id(p: Path) -> str:
    return p.name


@pytest.mark.parametrize("path", _cases("config"), ids=_id)
def test_config_corpus(path):
    checks.check_config(path.read_bytes())


@pytest.mark.parametrize("path", _cases("topology"), ids=_id)
def test_topology_corpus(path):
    checks.check_topology(path.read_text(errors="replace"))


@pytest.mark.parametrize("path", _cases("xdm_allocate"), ids=_id)
def test_xdm_allocate_corpus(path):
    outcome = checks.check_allocate_response(path.read_bytes())
    expected = path.name.split(".", 1)[0].rsplit("-", 1)[-1]  # name ends with -<outcome>
    assert outcome == expected, f"{path.name}: {outcome}"


@pytest.mark.parametrize("path", _cases("nomad_allocs"), ids=_id)
def test_nomad_allocs_corpus(path):
    holder = path.name.startswith("holder-")  # the page still shows a live holder of HELD
    checks.check_nomad_page(path.read_bytes(), HELD, contains_live_holder=holder)


@pytest.mark.parametrize("path", _cases("journal"), ids=_id)
def test_journal_corpus(path):
    outcome = checks.check_journal_bytes(path.read_bytes())
    expected = path.name.split(".", 1)[0].rsplit("-", 1)[-1]
    assert outcome == expected.replace("_", "-"), f"{path.name}: {outcome}"


def test_corpus_is_not_empty():
    for folder in ("config", "topology", "xdm_allocate", "nomad_allocs", "journal"):
        assert _cases(folder), f"corpus/{folder} is empty"
