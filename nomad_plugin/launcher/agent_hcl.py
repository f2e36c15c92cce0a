"""An agent configuration file read by the rules of the Nomad agent's own parser, HCL v1.

The agent reads ``-config`` files with ``github.com/hashicorp/hcl`` (v1; command/agent/config_parse.go).
python-hcl2 parses HCL v2 and is more lenient than both: it reads ``default_mode = tdm`` (a bare
word), ``null``, ``True`` and multi-line quoted strings as values. This module walks python-hcl2's
parse tree and keeps only what HCL v1 accepts, with HCL v1's values: literals only (quoted strings
on one line, heredocs, numbers with a leading ``0`` octal, true/false, lists and objects); the last
of a repeated attribute; blocks of one type as a list; two ``config`` blocks of a plugin block
merged (helper/pluginutils/loader). A ``${...}`` or ``%{...}`` is refused: the agent evaluates it
as a template with no variables (hclutils.ParseHclInterface), doctor does not. Where python-hcl2
refuses what HCL v1 accepts (hex numbers, commas between attributes) the file is reported as not
valid HCL: stricter than the agent, never more lenient (docs/operator.md lists the differences;
tests/operator/test_config_corpus.py proves the rest against HCL v1 itself).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import hcl2
from lark import Token, Tree

from nomad_plugin.util.hcl import describe_hcl_error


class AgentSyntaxError(ValueError):
    """Something in the file that the Nomad agent's parser refuses (the message names the place)."""


@dataclass
class PluginBlock:
    """One ``plugin "<label>" { args = [...] config { ... } }`` block as the agent keeps it."""

    label: str
    args: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    line: int = 0
    extra_keys: list[str] = field(default_factory=list)  # ignored by the agent; doctor warns
    config_blocks: int = 0


_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"'}
_NEWLINE = "new_line_or_comment"
_EXPRESSIONS = {
    "function_call": "a function call",
    "binary_op": "an operator",
    "unary_op": "an operator",
    "conditional": "a conditional expression",
    "index_expr_term": "an index",
    "get_attr_expr_term": "an attribute reference",
    "attr_splat_expr_term": "a splat expression",
    "full_splat_expr_term": "a splat expression",
    "for_tuple_expr": "a for expression",
    "for_object_expr": "a for expression",
}


def parse_agent_text(text: str, source: str) -> list[PluginBlock]:
    """``text`` (one agent config file) -> its plugin blocks; AgentSyntaxError for what the agent refuses."""
    spelled, quoted = _unquote_keys(text)
    try:
        tree = hcl2.parses_to_tree(spelled)
    except Exception as exc:  # lark raises many types; all mean "not valid HCL"
        raise AgentSyntaxError(describe_hcl_error(exc, text, source)) from None
    walker = _Walker(text, source, quoted)
    body = _first_tree(tree, "body")
    if body is None:
        return []
    walker.body(body)  # checks the whole file: the agent refuses a bad value anywhere in it
    return [walker.plugin_block(b) for b in _children(body, "block") if _block_type(b) == "plugin"]


_QUOTED_KEY = re.compile(r'^([ \t]*)"([^"\\$%\n]*)"(?=[ \t]*=)', re.MULTILINE)
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


def _unquote_keys(text: str) -> tuple[str, dict[str, str]]:
    """HCL v1 allows a quoted attribute name (``"driver.raw_exec.enable" = "1"`` in a client's
    ``options`` block); HCL v2 does not. Each becomes a name of the same length (columns in error
    messages stay right), mapped back to the quoted text."""
    names: dict[str, str] = {}

    def name(match: re.Match[str]) -> str:
        key = match.group(2)
        placeholder = "Q" + _NOT_NAME.sub("_", key) + "Q"
        names[placeholder] = key
        return match.group(1) + placeholder

    return _QUOTED_KEY.sub(name, text), names


# --- tree helpers ----------------------------------------------------------------------


def _children(tree: Tree[Any], name: str) -> list[Tree[Any]]:
    return [c for c in tree.children if isinstance(c, Tree) and c.data == name]


def _first_tree(tree: Tree[Any], name: str) -> Tree[Any] | None:
    found = _children(tree, name)
    return found[0] if found else None


def _first_token(node: Any) -> Token | None:
    if isinstance(node, Token):
        return node
    if isinstance(node, Tree):
        for child in node.children:
            token = _first_token(child)
            if token is not None:
                return token
    return None


def _name(node: Tree[Any]) -> str:
    token = _first_token(node)
    return str(token) if token is not None else ""


def _block_type(block: Tree[Any]) -> str:
    ident = _first_tree(block, "identifier")
    return _name(ident) if ident is not None else ""


def _block_labels(block: Tree[Any]) -> list[Tree[Any]]:
    """The label nodes of a block: everything between its type and its ``{``."""
    labels: list[Tree[Any]] = []
    for child in block.children[1:]:
        if isinstance(child, Token):
            break
        if child.data in ("string", "identifier"):
            labels.append(child)
    return labels


def _hcl1_shape(value: Any, in_list: bool) -> Any:
    """HCL v1's decoding into interface{}: an object under a key becomes a list of one map."""
    if isinstance(value, dict):
        shaped = {k: _hcl1_shape(v, in_list=False) for k, v in value.items()}
        return shaped if in_list else [shaped]
    if isinstance(value, list):
        return [_hcl1_shape(v, in_list=True) for v in value]
    return value


def _source_text(node: Any) -> str:
    if isinstance(node, Token):
        return str(node)
    return "".join(_source_text(c) for c in node.children)


class _Walker:
    def __init__(self, text: str, source: str, quoted: dict[str, str] | None = None) -> None:
        self.text = text
        self.source = source
        self.quoted = quoted or {}

    def fail(self, node: Any, message: str) -> AgentSyntaxError:
        token = _first_token(node)
        line = getattr(token, "line", None)
        column = getattr(token, "column", None)
        if not isinstance(line, int) or not isinstance(column, int):
            return AgentSyntaxError(f"{self.source}: {message}")
        lines = self.text.splitlines()
        shown = lines[line - 1] if 0 < line <= len(lines) else ""
        caret = " " * (column - 1) + "^"
        return AgentSyntaxError(
            f"{self.source}:{line}:{column}: not valid in a Nomad agent config: {message}\n    {shown}\n    {caret}"
        )

    # -- bodies ---------------------------------------------------------------------------
    def body(self, body: Tree[Any]) -> dict[str, Any]:
        """A body as HCL v1 decodes it into a map: attributes (last wins) and blocks (lists)."""
        out: dict[str, Any] = {}
        for child in body.children:
            if not isinstance(child, Tree):
                continue
            if child.data == "attribute":
                ident = _first_tree(child, "identifier")
                key = _name(ident) if ident is not None else ""
                key = self.quoted.get(key, key)
                out[key] = _hcl1_shape(self.value(child.children[-1], key), in_list=False)
            elif child.data == "block":
                key = _block_type(child)
                inner = _first_tree(child, "body")
                value: Any = self.body(inner) if inner is not None else {}
                for label in reversed(_block_labels(child)):
                    value = {self.label(label): [value]}
                previous = out.get(key)
                out[key] = [*previous, value] if isinstance(previous, list) else [value]
        return out

    def label(self, node: Tree[Any]) -> str:
        if node.data == "identifier":
            return _name(node)
        return self.string(node)

    def plugin_block(self, block: Tree[Any]) -> PluginBlock:
        labels = _block_labels(block)
        token = _first_token(block)
        line = token.line if token is not None and isinstance(token.line, int) else 0
        if len(labels) != 1:
            raise self.fail(
                block, f'a plugin block takes one label, its file name: plugin "<name>" {{ ... }} ({len(labels)} given)'
            )
        plugin = PluginBlock(self.label(labels[0]), line=line)
        inner = _first_tree(block, "body")
        if inner is None:
            return plugin
        for child in inner.children:
            if not isinstance(child, Tree) or child.data not in ("attribute", "block"):
                continue
            kind = _name(_first_tree(child, "identifier") or child)
            if child.data == "block" and kind == "config" and not _block_labels(child):
                body = _first_tree(child, "body")
                plugin.config.update(self.body(body) if body is not None else {})  # HCL v1 merges them
                plugin.config_blocks += 1
            elif child.data == "attribute" and kind == "config":
                value = _hcl1_shape(self.value(child.children[-1], "config"), in_list=False)
                merged = value[0] if isinstance(value, list) and len(value) == 1 else value
                if not isinstance(merged, dict):
                    raise self.fail(child, "config must be a block: config { ... }")
                plugin.config.update(merged)
                plugin.config_blocks += 1
            elif child.data == "attribute" and kind == "args":
                args = self.value(child.children[-1], "args")
                if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                    raise self.fail(child, 'args must be a list of strings, e.g. args = ["-v"]')
                plugin.args = args
            else:
                plugin.extra_keys.append(kind)
        return plugin

    # -- values ---------------------------------------------------------------------------
    def value(self, node: Any, key: str) -> Any:
        if isinstance(node, Token):
            raise self.fail(node, f"{key} = {node}: not a value")
        kind = node.data
        if kind == "expr_term":
            inner = [c for c in node.children if isinstance(c, Tree) and c.data != _NEWLINE]
            if len(inner) != 1 or any(isinstance(c, Token) and str(c) == "(" for c in node.children):
                raise self.fail(
                    node, f"{key} = {_source_text(node).strip()}: parentheses are not allowed; write a literal value"
                )
            return self.value(inner[0], key)
        if kind == "identifier":
            word = _name(node)
            raise self.fail(
                node,
                f'{key} = {word} is a bare word; the agent refuses it ("Unknown token: IDENT {word}"): '
                f'quote it, {key} = "{word}"',
            )
        if kind == "literal_value":
            word = _name(node)
            if word in ("true", "false"):
                return word == "true"
            raise self.fail(
                node, f'{key} = {word}: the agent refuses {word} ("Unknown token: IDENT {word}"); leave the option out'
            )
        if kind == "string":
            return self.string(node, key)
        if kind in ("heredoc_template", "heredoc_template_trim"):
            return self.heredoc(node, key)
        if kind == "int_lit":
            return self.integer(node, key)
        if kind == "float_lit":
            return float(_name(node))
        if kind == "unary_op" and str(node.children[0]) == "-":
            number = self.value(node.children[1], key)
            if isinstance(number, (int, float)) and not isinstance(number, bool):
                return -number
        if kind == "tuple":
            return [self.value(c, key) for c in node.children if isinstance(c, Tree) and c.data != _NEWLINE]
        if kind == "object":
            return self.object(node, key)
        what = _EXPRESSIONS.get(kind, "an expression")
        raise self.fail(
            node,
            f"{key} = {_source_text(node).strip()}: {what}; the agent's parser (HCL v1) accepts only literal values "
            "(quoted strings, numbers, true/false, lists and objects of them)",
        )

    def object(self, node: Tree[Any], key: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for elem in _children(node, "object_elem"):
            if any(isinstance(c, Token) and str(c).strip() == ":" for c in elem.children):
                raise self.fail(elem, f'{key}: use "=" between a key and its value (the agent refuses ":")')
            key_node = _first_tree(elem, "object_elem_key")
            term = key_node.children[0] if key_node is not None and key_node.children else None
            inner = term.children[0] if isinstance(term, Tree) and term.children else term
            if isinstance(inner, Tree) and inner.data == "identifier":
                name = _name(inner)
            elif isinstance(inner, Tree) and inner.data == "string":
                name = self.string(inner, key)
            else:
                raise self.fail(elem, f"{key}: an object key must be a name or a quoted string")
            out[name] = self.value(elem.children[-1], f"{key}.{name}")
        return out

    def integer(self, node: Tree[Any], key: str) -> int:
        text = _name(node)
        try:
            return int(text, 8) if len(text) > 1 and text.startswith("0") else int(text)  # HCL v1: leading 0 = octal
        except ValueError:
            raise self.fail(
                node, f"{key} = {text}: a leading 0 makes an octal number in HCL v1, and {text} is not one"
            ) from None

    def string(self, node: Tree[Any], key: str = "label") -> str:
        parts: list[str] = []
        for child in node.children:
            if not isinstance(child, Tree) or child.data != "string_part":
                continue
            if any(isinstance(c, Tree) for c in child.children):
                raise self.template(child, key)
            parts.append(_name(child))
        raw = "".join(parts)
        if "\n" in raw:
            raise self.fail(
                node, f'{key}: a quoted string ends on its own line in HCL v1 ("literal not terminated"); use a heredoc'
            )
        if "%{" in raw.replace("%%{", ""):
            raise self.template(node, key)
        return self.unescape(node, raw, key)

    def template(self, node: Any, key: str) -> AgentSyntaxError:
        return self.fail(
            node,
            f"{key}: a ${{...}} or %{{...}} template; the agent evaluates it with no variables (HCL v2's JSON decoder) "
            "and doctor does not evaluate templates: write the value itself",
        )

    def unescape(self, node: Tree[Any], raw: str, key: str) -> str:
        """Go's escapes, as HCL v1's strconv.Unquote reads them."""
        out: list[str] = []
        pos = 0
        while pos < len(raw):
            ch = raw[pos]
            if ch != "\\":
                out.append(ch)
                pos += 1
                continue
            nxt = raw[pos + 1 : pos + 2]
            if nxt in _SIMPLE_ESCAPES:
                out.append(_SIMPLE_ESCAPES[nxt])
                pos += 2
                continue
            width = {"x": 2, "u": 4, "U": 8}.get(nxt)
            digits = raw[pos + 2 : pos + 2 + width] if width else raw[pos + 1 : pos + 4]
            try:
                if width and len(digits) == width:
                    out.append(chr(int(digits, 16)))
                    pos += 2 + width
                    continue
                if not width and len(digits) == 3 and all(d in "01234567" for d in digits):
                    out.append(chr(int(digits, 8)))
                    pos += 4
                    continue
            except ValueError:
                pass
            raise self.fail(node, f"{key}: the escape \\{nxt} is not valid in a quoted string")
        return "".join(out)

    def heredoc(self, node: Tree[Any], key: str) -> str:
        token = _first_token(node)
        start, end = getattr(token, "start_pos", None), getattr(token, "end_pos", None)
        # From the file as written: quoted names were respelled in the parsed copy (same offsets).
        text = self.text[start:end] if isinstance(start, int) and isinstance(end, int) else _name(node)
        first, _, rest = text.partition("\n")
        lines = rest.split("\n")
        while len(lines) > 1 and not lines[-1].strip():
            lines.pop()
        closing = lines[-1] if lines else ""
        content = lines[:-1]
        body = "".join(line + "\n" for line in content)
        if "${" in body.replace("$${", "") or "%{" in body.replace("%%{", ""):
            raise self.template(node, key)
        if not first.startswith("<<-"):
            return body
        prefix = closing[: len(closing) - len(closing.lstrip(" \t"))]
        if all(line.startswith(prefix) for line in content):
            return "".join(line[len(prefix) :] + "\n" for line in content)
        return body
