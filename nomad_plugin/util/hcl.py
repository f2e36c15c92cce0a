"""python-hcl2's output as Nomad's own HCL decoder reads it: plain values, and errors an operator can act on.

python-hcl2 (v7+) keeps string literals in their quoted, escaped HCL form (``'"80 GiB"'``), labels
quoted too, and marks blocks with ``__is_block__``; an expression it cannot fold stays as
``"${...}"`` text. The job-spec evaluator reads files through these helpers, so it sees the literals
Nomad does (agent files are HCL v1: util/hcl1.py).
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "r": "\r", "t": "\t"}
_ESCAPE = re.compile(r'\\(["\\nrt]|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})|([$%])\2\{')


def unquote(text: str) -> str:
    """The string a quoted HCL literal stands for (escapes and ``$${``/``%%{`` undone)."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        return text
    return _ESCAPE.sub(_unescape, text[1:-1])


def _unescape(match: re.Match[str]) -> str:
    escape, doubled = match.groups()
    if doubled:
        return doubled + "{"
    if len(escape) == 1:
        return _SIMPLE_ESCAPES[escape]
    code = int(escape[1:], 16)
    return chr(code) if code <= 0x10FFFF else match.group(0)


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


def _is_block(value: Any) -> bool:
    """python-hcl2 writes a block as a list of bodies marked ``__is_block__`` (a labelled one one level down)."""
    items = value if isinstance(value, list) else []
    return bool(items) and all(
        isinstance(v, dict)
        and (v.get("__is_block__") or any(isinstance(b, dict) and b.get("__is_block__") for b in v.values()))
        for v in items
    )


#: Block types proposed for Nomad's jobspec that no Nomad release decodes (its api structs lack them).
NOT_YET_IN_NOMAD = {"first_available": "a device block's ordered list of alternative requests"}


def unknown_keys(body: dict[str, Any], allowed: frozenset[str], where: str) -> list[str]:
    """Nomad's HCL decoder error for each key the block's schema lacks, with its suggestion.

    The words are hcl's (``hclsyntax.Body.content``): "Unsupported argument" for an attribute,
    "Unsupported block type" for a block.
    """
    problems = []
    for key in body:
        if is_meta(key) or key in allowed:
            continue
        close = difflib.get_close_matches(str(key), sorted(allowed), n=1, cutoff=0.6)
        if _is_block(body[key]):
            hint = f' Did you mean "{close[0]}"?' if close else ""
            problem = f'{where}: Unsupported block type; Blocks of type "{key}" are not expected here.{hint}'
            if key in NOT_YET_IN_NOMAD:
                problem += f" ({key}, {NOT_YET_IN_NOMAD[key]}, is proposed Nomad work, not yet in Nomad)"
            problems.append(problem)
            continue
        hint = f' Did you mean "{close[0]}"?' if close else f" Allowed: {', '.join(sorted(allowed))}."
        problems.append(f'{where}: Unsupported argument; an argument named "{key}" is not expected here.{hint}')
    return problems


END_OF_INPUT = "$END"  # lark's name for the end of the text
_TOKEN_WORDS = {
    END_OF_INPUT: "the end of the file",
    **{
        name: f'"{ch}"'
        for name, ch in zip("RBRACE LBRACE RSQB LSQB LPAR RPAR EQ COMMA COLON".split(), "}{][()=,:", strict=True)
    },
    "DBLQUOTE": "a quoted string",
    "NAME": "a name",
    "NL_OR_COMMENT": "a new line",
    "INT_LITERAL": "a number",
    "FLOAT_LITERAL": "a number",
    **{name: name.lower() for name in ("TRUE", "FALSE", "NULL")},
}
_STRUCTURAL = frozenset({"NL_OR_COMMENT", "RBRACE"})


def describe_hcl_error(exc: Exception, text: str, source: str) -> str:
    """``job.hcl:3:15: unexpected "2"; expected "}" or a new line``, the line and a caret.

    python-hcl2's errors are lark's token dumps (``Token('STRING_CHARS', ...)``, ``* RBRACE``); an
    operator needs the place and a plain word for what was expected.
    """
    line = getattr(exc, "line", None)
    column = getattr(exc, "column", None)
    if not isinstance(line, int) or not isinstance(column, int) or line < 1:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{source} is not valid HCL: {first}"
    token = getattr(exc, "token", None)
    if getattr(token, "type", "") == END_OF_INPUT:
        found = 'the file ends early (an unclosed "{", "[", "(" or quote)'
    elif token is not None:
        found = f"unexpected {json.dumps(str(token).strip()[:30])}"
    else:
        char = getattr(exc, "char", "")
        found = f"unexpected character {json.dumps(char)}" if char else "unexpected input"
    names = set(getattr(exc, "expected", None) or ())
    if names & _STRUCTURAL:  # after a complete attribute: only the ways to end it matter
        names &= _STRUCTURAL
    expected = sorted({_TOKEN_WORDS[t] for t in names if t in _TOKEN_WORDS})
    if len(expected) > 1:
        wanted = f"; expected {', '.join(expected[:-1])} or {expected[-1]}"
    else:
        wanted = f"; expected {expected[0]}" if expected else ""
    lines = text.splitlines()
    shown = lines[line - 1] if line <= len(lines) else ""
    caret = " " * (max(column, 1) - 1) + "^"
    return f"{source}:{line}:{column}: not valid HCL: {found}{wanted}\n    {shown}\n    {caret}"
