"""Help text for the operator commands, from a module docstring, without reStructuredText markup.

Docstrings quote names as ``name`` for developers; ``--help`` shows them to operators, who
read plain text.
"""

from __future__ import annotations

import re

_LITERAL = re.compile(r"``([^`]+)``")
_ROLE = re.compile(r":[a-z]+:`([^`]+)`")


def plain_text(text: str) -> str:
    """``x`` and :role:`x` become x; lines of one paragraph are joined."""
    return " ".join(_ROLE.sub(r"\1", _LITERAL.sub(r"\1", text)).split())


def help_text(doc: str | None, paragraph: int = 0) -> str | None:
    """One paragraph of a docstring as plain text (None without a docstring)."""
    if not doc:
        return None
    parts = [p for p in doc.strip().split("\n\n") if p.strip()]
    return plain_text(parts[min(paragraph, len(parts) - 1)])
