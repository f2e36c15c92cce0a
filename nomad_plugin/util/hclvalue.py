"""python-hcl2 output -> plain Python values.

python-hcl2 (v7+) keeps string literals in their quoted, escaped HCL form
(``'"80 GiB"'``), labels quoted too, and marks blocks with ``__is_block__``;
an expression it cannot fold stays as ``"${...}"`` text. These helpers turn
that into the values Nomad's own HCL decoder would produce, so the launcher
(plugin configs) and the job-spec evaluator see the same literals Nomad does.
"""

from __future__ import annotations

from typing import Any

BLOCK_MARK = "__is_block__"
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "r": "\r", "t": "\t"}


class HclValueError(ValueError):
    """A value in an HCL file that cannot be used as written."""


def unquote(text: str) -> str:
    """The string a quoted HCL literal stands for (escapes and ``$${``/``%%{`` undone)."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        return text
    body = text[1:-1]
    out: list[str] = []
    pos = 0
    while pos < len(body):
        ch = body[pos]
        if ch == "\\" and pos + 1 < len(body):
            nxt = body[pos + 1]
            if nxt in _SIMPLE_ESCAPES:
                out.append(_SIMPLE_ESCAPES[nxt])
                pos += 2
                continue
            if nxt in "uU":
                width = 4 if nxt == "u" else 8
                digits = body[pos + 2 : pos + 2 + width]
                try:
                    out.append(chr(int(digits, 16)))
                    pos += 2 + width
                    continue
                except ValueError:
                    pass
        if body.startswith("$${", pos) or body.startswith("%%{", pos):
            out.append(body[pos + 1 : pos + 3])
            pos += 3
            continue
        out.append(ch)
        pos += 1
    return "".join(out)


def is_expression(value: Any) -> bool:
    """True for an unquoted ``${...}`` that python-hcl2 could not fold (a variable, a call)."""
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


def is_meta(key: Any) -> bool:
    """python-hcl2's own keys (``__is_block__``, ``__comments__``, ...), not HCL content."""
    return isinstance(key, str) and key.startswith("__") and key.endswith("__")


def plain(value: Any) -> Any:
    """Recursively unquote strings and drop block markers."""
    if isinstance(value, str):
        return unquote(value) if value.startswith('"') else value
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items() if not is_meta(k)}
    return value


def labelled(blocks: Any) -> list[tuple[str, dict[str, Any]]]:
    """``[{'"label"': {...}}, ...]`` (a labelled block list) -> ``[(label, body), ...]``."""
    out: list[tuple[str, dict[str, Any]]] = []
    for item in blocks if isinstance(blocks, list) else [blocks]:
        if not isinstance(item, dict):
            continue
        for key, body in item.items():
            if is_meta(key):
                continue
            out.append((plain(key), body if isinstance(body, dict) else {}))
    return out


def unlabelled(blocks: Any) -> list[dict[str, Any]]:
    """``[{...}, ...]`` (an unlabelled block list) -> the block bodies."""
    return [b for b in (blocks if isinstance(blocks, list) else [blocks]) if isinstance(b, dict)]
