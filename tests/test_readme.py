"""The README's promises that can drift: the configuration reference and the two commands."""

from __future__ import annotations

import re
from pathlib import Path

from nomad_plugin.config.options import CARD_OPTIONS, OPTIONS, splice_readme

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_config_reference_matches_the_schema() -> None:
    assert splice_readme(README) == README, (
        "README config reference is stale: python -m nomad_plugin.config.options readme --write README.md"
    )


def test_every_option_is_documented_in_readme_and_plugin_hcl() -> None:
    plugin_hcl = (ROOT / "plugin.hcl").read_text()
    for opt in (*OPTIONS, *CARD_OPTIONS):
        assert f"`{opt.name}`" in README or f".{opt.name}`" in README, opt.name
        assert re.search(rf"\b{re.escape(opt.name)}\b", plugin_hcl), opt.name


def test_the_two_commands_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "make demo" in README and "make test" in README
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_linked_docs_exist() -> None:
    for link in re.findall(r"\]\(((?:docs|benchmarks|examples|tests|nomad_plugin)/[^)#]+)\)", README):
        assert (ROOT / link).exists(), link
