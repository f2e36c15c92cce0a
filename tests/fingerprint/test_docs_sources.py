"""docs/fingerprint.md names, for each attribute, the code that makes it: every ``file:name`` it cites exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nomad_plugin

PACKAGE = Path(nomad_plugin.__file__).parent
DOC = PACKAGE.parent / "docs" / "fingerprint.md"
CITED = re.compile(r"`([a-z_]+/[a-z_]+\.py):([A-Za-z_][A-Za-z0-9_]*)")


def _defined(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_every_cited_function_exists_where_the_doc_says() -> None:
    cited = CITED.findall(DOC.read_text())
    assert len(cited) >= 20, "the Source column cites the code"
    missing = [f"{rel}:{name}" for rel, name in cited if name not in _defined(PACKAGE / rel)]
    assert not missing, f"docs/fingerprint.md cites code that does not exist: {missing}"


def test_the_attribute_named_memory_comes_from_total_memory_in_one_hop() -> None:
    row = next(line for line in DOC.read_text().splitlines() if line.startswith("| `memory` |"))
    assert "`totalMemory`" in row and "xdm/adapter.py:card_from_device" in row
    assert 'attrs["memory"] = Attr(card.memory_mib, "MiB")' in (PACKAGE / "nomad" / "catalog.py").read_text()
