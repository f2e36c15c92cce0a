"""A job file's HCL2 syntax: python-hcl2's parse tree, held to the rules of HashiCorp's ``hclsyntax``.

python-hcl2's grammar (lark) accepts what ``hclsyntax/parser.go`` refuses: two arguments on one line, a
one-line block with more than one item, a block whose ``{`` is on the next line, a template in a block
label. ``check_syntax`` refuses those with hclsyntax's summary, detail and ``file:line,col`` range; any
other syntax error is python-hcl2's own, placed by ``util.hcl.describe_hcl_error``. HashiCorp's parser
through pygohcl is not used: it is not in the shipped file and gives no tree to evaluate (docs/operator.md).
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import hcl2
from lark import Token, Tree

from nomad_plugin.util.hcl import describe_hcl_error, unquote

Node = Tree[Any]


class HclError(Exception):
    """An HCL diagnostic Nomad reports (the job is refused): ``file:line,col-col: Summary; Detail``."""

    def __init__(self, summary: str, detail: str, node: Any = None, source: str = "") -> None:
        super().__init__(f"{summary}; {detail}")
        self.summary, self.detail, self.node, self.source = summary, detail, node, source

    def text(self, source: str) -> str:
        if not self.summary:  # python-hcl2's own syntax error, already placed
            return self.detail
        meta = getattr(self.node, "meta", None) if isinstance(self.node, Tree) else self.node
        line = getattr(meta, "line", None)
        if line is None:
            return f"{self.source or source}: {self.summary}; {self.detail}"
        end_line, end = getattr(meta, "end_line", line), getattr(meta, "end_column", None)
        where = f"{line},{getattr(meta, 'column', 0)}" + (
            "" if end is None else f"-{end}" if end_line == line else f"-{end_line},{end}"
        )
        return f"{self.source or source}:{where}: {self.summary}; {self.detail}"


def sig(node: Node) -> list[Any]:
    """A node's children that carry meaning: trees other than line breaks, and names."""
    return [c for c in node.children if (isinstance(c, Tree) and c.data != "new_line_or_comment")]


def name_of(node: Any) -> str:
    return str(node.children[0]) if isinstance(node, Tree) else str(node)


def item_name(item: Node) -> str:
    return name_of(item.children[0])


_ONE_LINE = "Invalid single-argument block definition"


def _newline(node: Node) -> Any:
    """hclsyntax's newline token: the line break alone (python-hcl2's also holds the next line's indent)."""
    text = str(node.children[0])
    line, column = node.meta.line, node.meta.column + text.index("\n")
    return SimpleNamespace(line=line, column=column, end_line=line + 1, end_column=1)


def check_syntax(body: Node, closing: Any = None) -> None:
    """hclsyntax's body rules python-hcl2's grammar lacks (``parser.go``): a newline after every argument
    and block, a one-line block holds one argument, a block opens on its header's line, labels hold no
    template. ``closing`` is the enclosing block's ``}`` (None at the top level)."""
    kids = [c for c in body.children if isinstance(c, Tree)]
    single = bool(kids) and kids[0].data != "new_line_or_comment" and closing is not None
    for index, child in enumerate(kids):
        if child.data == "new_line_or_comment":
            continue
        after = kids[index + 1] if index + 1 < len(kids) else closing
        if single and child.data == "block":
            nxt = child.children[1]
            end: Any = nxt.children[0] if isinstance(nxt, Tree) else nxt
            span = SimpleNamespace(
                line=child.meta.line, column=child.meta.column, end_line=end.end_line, end_column=end.end_column
            )
            raise HclError("Argument definition required", f"A single-line block definition can contain only a single argument. If you meant to define argument {json.dumps(item_name(child))}, use an equals sign to assign it a value. To define a nested block, place it on a line of its own within its parent block.", span)  # fmt: skip
        if child.data == "block":
            _check_block(child)
        if single and after is not closing:
            if after.data == "new_line_or_comment":
                raise HclError(_ONE_LINE, "An argument definition on the same line as its containing block creates a single-line block definition, which must also be closed on the same line. Place the block's closing brace immediately after the argument definition.", _newline(after))  # fmt: skip
            raise HclError(_ONE_LINE, "A single-line block definition must end with a closing brace immediately after its single argument definition.", after.children[0])  # fmt: skip
        ended = _ends_in_newline(child) or (isinstance(after, Tree) and after.data == "new_line_or_comment")
        if not single and after is not None and not ended:
            what = (
                ("argument", "An argument definition")
                if child.data == "attribute"
                else ("block definition", "A block definition")
            )
            raise HclError(f"Missing newline after {what[0]}", f"{what[1]} must end with a newline.", after.children[0] if isinstance(after, Tree) else after)  # fmt: skip


def _ends_in_newline(node: Any) -> bool:
    """python-hcl2 keeps the line break after an operator expression inside the expression's tree, and
    after a heredoc inside the heredoc's token."""
    while isinstance(node, Tree) and node.children:
        if node.data == "new_line_or_comment":
            return True
        node = node.children[-1]
    return isinstance(node, Token) and node.type.startswith("HEREDOC")


def _check_block(block: Node) -> None:
    for label in block.children[1:]:
        if isinstance(label, Tree) and label.data == "new_line_or_comment":
            detail = 'A block definition must have block content delimited by "{" and "}", starting on the same line as the block header.'
            raise HclError("Invalid block definition", detail, _newline(label))
        for part in label.children if isinstance(label, Tree) and label.data == "string" else []:
            inner = part.children[0] if isinstance(part, Tree) and part.children else None
            if isinstance(inner, Tree):
                which = "$" if inner.data == "interpolation" else "%"
                detail = f'Template sequences are not allowed in this string. To include a literal "{which}", double it (as "{which}{which}") to escape it.'
                raise HclError("Invalid string literal", detail, inner.children[0])
    check_syntax(block_body(block), block.children[-1])


def header(block: Node) -> Any:
    """A block's ``DefRange``: its type and labels."""
    parts = [c for c in block.children if isinstance(c, Tree) and c.data not in ("body", "new_line_or_comment")]
    first, last = parts[0].meta, parts[-1].meta
    return SimpleNamespace(line=first.line, column=first.column, end_line=last.end_line, end_column=last.end_column)


def block_labels(block: Node) -> list[str]:
    labels = []
    for label in block.children[1:]:
        if isinstance(label, Token):
            break
        if label.data == "string":
            labels.append(
                unquote("".join(str(p.children[0]) for p in label.children if isinstance(p, Tree)).join('""'))
            )
        elif label.data != "new_line_or_comment":
            labels.append(name_of(label))
    return labels


def block_body(block: Node) -> Node:
    return next(c for c in block.children if isinstance(c, Tree) and c.data == "body")


def body_items(body: Node) -> list[Node]:
    return [c for c in body.children if isinstance(c, Tree) and c.data in ("attribute", "block")]


def attributes(body: Node) -> dict[str, Node]:
    return {item_name(i): sig(i)[-1] for i in body_items(body) if i.data == "attribute"}


_HEREDOC = re.compile(r"<<-?([A-Za-z][A-Za-z0-9._-]*)\r?\n")


def heredoc_markers(text: str) -> str:
    """A heredoc's closing marker with spaces after it closes it in hclsyntax (it trims the line), not in
    python-hcl2's grammar: those spaces are dropped (nothing else on any line moves)."""
    markers = set(_HEREDOC.findall(text))
    if not markers:
        return text
    lines = text.split("\n")
    return "\n".join(line.rstrip(" \t") if line.strip() in markers else line for line in lines)


def parse(text: str, source: str) -> Node:

    try:
        tree = hcl2.parses_to_tree(text)
    except Exception as exc:  # python-hcl2 raises lark's and its own errors
        if "${~" in text or "~}" in text:  # valid HCL python-hcl2's grammar lacks: no verdict on it
            raise HclError("", f"{source}: check-job cannot tell: its parser does not read ${{~ ~}} strip markers") from None  # fmt: skip
        raise HclError("", describe_hcl_error(exc, text, source)) from None
    check_syntax(tree.children[0])
    return tree
