"""A job file's HCL2 syntax: judged by HashiCorp's own parser, then read as python-hcl2's parse tree.

HashiCorp's ``hclsyntax`` (Go, through pygohcl) decides whether the file is HCL at all and says why not,
as Nomad does; it gives no tree to evaluate, so a file it accepts is then parsed by python-hcl2 (lark),
whose grammar accepts more than ``hclsyntax`` but nothing less, save the ``${~ ~}`` strip markers.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import hcl2
from lark import Token, Tree

from nomad_plugin.util.hcl import describe_hcl_error, unquote

Node = Tree[Any]
_PYGOHCL_NEXT = re.compile(r", tmp\.hcl:\d+,\d+")  # where pygohcl joins the next diagnostic (its file name)


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


def hashicorp_syntax(text: str, source: str) -> None:
    """HashiCorp's own HCL2 parser (``hclsyntax``, through pygohcl) on the file: its diagnostics are the
    ones Nomad prints for a job it cannot parse, word for word and at the same position."""
    import pygohcl  # loads a Go runtime: only when a job file is read

    try:
        pygohcl.loads(text)
    except pygohcl.HCLParseError as exc:
        first = _PYGOHCL_NEXT.split(str(exc).removeprefix("invalid HCL: tmp.hcl:"))[0]  # as jobspec2's first
        raise HclError("", f"{source}:{first}") from None


def parse(text: str, source: str) -> Node:
    """The job file's tree, once HashiCorp's parser has accepted its syntax."""
    hashicorp_syntax(text, source)
    try:
        tree = hcl2.parses_to_tree(text)
    except Exception as exc:  # python-hcl2 raises lark's and its own errors
        if "${~" in text or "~}" in text:  # valid HCL python-hcl2's grammar lacks: no verdict on it
            raise HclError("", f"{source}: check-job cannot tell: its parser does not read ${{~ ~}} strip markers") from None  # fmt: skip
        raise HclError("", describe_hcl_error(exc, text, source)) from None
    return tree
