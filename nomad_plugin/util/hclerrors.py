"""HCL syntax errors as an operator reads them: file:line:column, what was found, what was expected.

python-hcl2's errors are lark's token dumps (``Token('STRING_CHARS', ...)``,
``* RBRACE``); job files and agent configs both go through this.
"""

from __future__ import annotations

import json

END_OF_INPUT = "$END"  # lark's name for the end of the text
_TOKEN_WORDS = {
    END_OF_INPUT: "the end of the file",
    "RBRACE": '"}"',
    "LBRACE": '"{"',
    "RSQB": '"]"',
    "LSQB": '"["',
    "LPAR": '"("',
    "RPAR": '")"',
    "EQ": '"="',
    "COMMA": '","',
    "COLON": '":"',
    "DBLQUOTE": "a quoted string",
    "NAME": "a name",
    "NL_OR_COMMENT": "a new line",
    "INT_LITERAL": "a number",
    "FLOAT_LITERAL": "a number",
    "TRUE": "true",
    "FALSE": "false",
    "NULL": "null",
}


_STRUCTURAL = frozenset({"NL_OR_COMMENT", "RBRACE"})


def describe_hcl_error(exc: Exception, text: str, source: str) -> str:
    """``job.hcl:3:15: unexpected "2"; expected "}" or a new line``, the line and a caret.

    python-hcl2's errors are the parser's token dumps (``Token('STRING_CHARS', ...)``,
    ``* RBRACE``); an operator needs the place and a plain word for what was expected.
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
    wanted = f"; expected {', '.join(expected[:-1])} or {expected[-1]}" if len(expected) > 1 else ""
    if len(expected) == 1:
        wanted = f"; expected {expected[0]}"
    lines = text.splitlines()
    shown = lines[line - 1] if line <= len(lines) else ""
    caret = " " * (max(column, 1) - 1) + "^"
    return f"{source}:{line}:{column}: not valid HCL: {found}{wanted}\n    {shown}\n    {caret}"
