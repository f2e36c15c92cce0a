"""The plugin's config as a Nomad agent reads it and sends it in SetConfig, byte for byte.

``nomad agent -config=DIR`` reads the directory's ``*.hcl`` and ``*.json`` files in lexical order,
decodes the ``plugin "<name>" { config { ... } }`` block with the plugin's ConfigSchema (hcldec and
go-cty's conversions) and msgpack-encodes the cty object: every attribute, defaults filled in, keys
sorted, integers compact, exact non-integers as float64, inexact ones as decimal text (go-cty's
cty/msgpack/marshal.go). Here the same is done from those files plus ``key=value`` overrides.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import hcl2
import msgpack
from lark import Token, Tree

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.config.decode import did_you_mean
from nomad_plugin.config.options import CARD_BLOCK, CARD_OPTIONS, OPTIONS, Option
from nomad_plugin.util.hcl import describe_hcl_error, is_expression, is_meta, plain, unlabelled

AGENT_SUFFIXES = (".hcl", ".json")
_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class LauncherConfigError(ValueError):
    """A plugin config file or override that Nomad would refuse too."""


# -- an agent file by the rules of the agent's parser, HCL v1 ----------------------------
# The agent reads ``-config`` files with HCL v1 (command/agent/config_parse.go); python-hcl2 parses
# HCL v2, which also takes bare words, ``null``, ``True`` and multi-line quoted strings, so the walker
# keeps only what HCL v1 accepts, with its values. ``${...}`` and ``%{...}`` are refused: the agent
# evaluates them with no variables (hclutils.ParseHclInterface). What python-hcl2 refuses and HCL v1
# takes (hex numbers, commas between attributes) is refused too: stricter than the agent, never more
# lenient (docs/operator.md; tests/operator/test_config_corpus.py checks against HCL v1 itself).


class AgentSyntaxError(LauncherConfigError):
    """Something in the file that the Nomad agent's parser refuses."""


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
_ESCAPE = re.compile(r'\\(?:([abfnrtv\\"])|(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})|([0-7]{3})|.?)', re.S)
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
    body = _body(tree)
    walker.body(body)  # checks the whole file: the agent refuses a bad value anywhere in it
    return [walker.plugin_block(b) for b in _children(body, "block") if _block_type(b) == "plugin"]


_QUOTED_KEY = re.compile(r'^([ \t]*)"([^"\\$%\n]*)"(?=[ \t]*=)', re.MULTILINE)
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


def _unquote_keys(text: str) -> tuple[str, dict[str, str]]:
    """HCL v1 allows a quoted attribute name (``"driver.raw_exec.enable" = "1"``), HCL v2 does not:
    each becomes a name of the same length (error columns stay right), mapped back afterwards."""
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


def _body(tree: Tree[Any]) -> Tree[Any]:
    """The body of a file or block (python-hcl2's grammar gives each exactly one)."""
    return _children(tree, "body")[0]


def _first_token(node: Any) -> Token | None:
    if isinstance(node, Tree):
        return next(node.scan_values(lambda leaf: isinstance(leaf, Token)), None)
    return node if isinstance(node, Token) else None


def _name(node: Tree[Any]) -> str:
    token = _first_token(node)
    return str(token) if token is not None else ""


def _block_type(block: Tree[Any]) -> str:
    ident = _first_tree(block, "identifier")
    return _name(ident) if ident is not None else ""


def _block_labels(block: Tree[Any]) -> list[Tree[Any]]:
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
    def __init__(self, text: str, source: str, quoted: dict[str, str]) -> None:
        self.text = text
        self.source = source
        self.quoted = quoted

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
                value: Any = self.body(_body(child))
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
        for child in _body(block).children:
            if not isinstance(child, Tree) or child.data not in ("attribute", "block"):
                continue
            kind = _name(_first_tree(child, "identifier") or child)
            if child.data == "block" and kind == "config" and not _block_labels(child):
                plugin.config.update(self.body(_body(child)))  # HCL v1 merges them
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

        def one(match: re.Match[str]) -> str:
            simple, hexa, octal = match.group(1, 2, 3)
            try:
                if simple or hexa or octal:
                    return _SIMPLE_ESCAPES[simple] if simple else chr(int(hexa[1:], 16) if hexa else int(octal, 8))
            except (ValueError, OverflowError):  # beyond U+10FFFF
                pass
            raise self.fail(node, f"{key}: the escape \\{match.group(0)[1:2]} is not valid in a quoted string")

        return _ESCAPE.sub(one, raw)

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


# -- the agent's files ---------------------------------------------------------------------


@dataclass
class PluginBlocks:
    """Every ``plugin`` block found: label -> (file, block), in load order."""

    blocks: dict[str, list[tuple[Path, PluginBlock]]] = field(default_factory=dict)

    def names(self) -> list[str]:
        return sorted(self.blocks)


def agent_files(path: str | Path) -> list[Path]:
    """The files Nomad reads for ``-config=path``: the file, or a directory's *.hcl/*.json (sorted)."""
    source = Path(path)
    try:
        if source.is_dir():
            return sorted(p for p in source.iterdir() if p.is_file() and p.suffix in AGENT_SUFFIXES)
    except OSError as exc:
        raise LauncherConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    return [source]


def _json_plugin_blocks(data: Any) -> list[PluginBlock]:
    """``plugin`` blocks of a JSON agent file: a plain map, or HCL's JSON form with lists of objects."""
    found: list[PluginBlock] = []
    for doc in unlabelled(data):
        for item in unlabelled(doc.get("plugin")):
            for label, body in item.items():
                for one in unlabelled(body):
                    configs = unlabelled(one.get("config", {}))
                    merged = {key: value for config in configs for key, value in config.items()}
                    found.append(PluginBlock(str(label), config=merged, config_blocks=len(configs)))
    return found


def _file_plugin_blocks(path: Path) -> list[PluginBlock]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise LauncherConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise LauncherConfigError(f"{path} is not valid HCL: not UTF-8 text ({exc.reason})") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise LauncherConfigError(f"{path} is not valid JSON: {exc}") from None
        return _json_plugin_blocks(data)
    return parse_agent_text(text, str(path))


def find_plugin_blocks(path: str | Path) -> PluginBlocks:
    files = agent_files(path)
    if not files:
        raise LauncherConfigError(f"{path}: no *.hcl or *.json file (Nomad reads only those from a directory)")
    result = PluginBlocks()
    for file in files:
        for block in _file_plugin_blocks(file):
            result.blocks.setdefault(block.label, []).append((file, block))
    return result


def chosen_block(blocks: PluginBlocks, source: str | Path, name: str = PLUGIN_NAME) -> tuple[Path, PluginBlock]:
    """The block the agent uses for ``name``: the last one of a file, and across files the last
    one with a non-empty config (nomad/structs/config/plugins.go, PluginConfigSetMerge)."""
    found = blocks.blocks.get(name, [])
    if not found:
        names = ", ".join(repr(n) for n in blocks.names()) or "none"
        raise LauncherConfigError(f'{source}: no plugin "{name}" block (plugin blocks found: {names})')
    chosen = found[0]
    for file, block in found[1:]:
        if file == chosen[0] or block.config:
            chosen = (file, block)
    return chosen


def duplicate_notes(blocks: PluginBlocks, name: str = PLUGIN_NAME) -> list[str]:
    """What the agent silently resolves in the plugin's blocks (doctor warns)."""
    notes: list[str] = []
    found = blocks.blocks.get(name, [])
    if len(found) > 1:
        where = ", ".join(f"{f}:{b.line}" if b.line else str(f) for f, b in found)
        file, block = chosen_block(blocks, "", name)
        at = f"{file}:{block.line}" if block.line else str(file)
        notes.append(f'plugin "{name}" is defined {len(found)} times ({where}); the agent uses the one at {at}')
    for file, block in found:
        if block.config_blocks > 1:
            notes.append(f"{file}: {block.config_blocks} config blocks in one plugin block; the agent merges them")
        if block.extra_keys:
            keys = ", ".join(block.extra_keys)
            notes.append(f'{file}: plugin "{name}" has {keys} beside args and config; the agent ignores it')
    return notes


def plugin_user_config(blocks: PluginBlocks, source: str | Path, name: str = PLUGIN_NAME) -> dict[str, Any]:
    """The user-written config of ``plugin "<name>"`` as the agent keeps it; LauncherConfigError if missing."""
    file, block = chosen_block(blocks, source, name)
    return _json_values(block.config, str(file)) if file.suffix == ".json" else agent_config_values(block.config)


def agent_config_values(config: dict[str, Any]) -> dict[str, Any]:
    """The values after the agent's HCL v2 JSON decoding of the plugin block (hclutils.ParseHclInterface):
    ``$${`` and ``%%{`` lose their escape."""

    def untemplate(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("$${", "${").replace("%%{", "%{")
        if isinstance(value, list):
            return [untemplate(v) for v in value]
        if isinstance(value, dict):
            return {k: untemplate(v) for k, v in value.items()}
        return value

    return {key: untemplate(value) for key, value in config.items()}


def _json_values(raw: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if is_meta(key):
            continue
        if key == CARD_BLOCK:
            out[key] = [_json_values(b, f"{where}: card block") for b in unlabelled(value)]
        elif is_expression(value):
            raise LauncherConfigError(f"{where}: option {key} = {value} is an expression; allowed: a literal value")
        else:
            out[key] = plain(value)
    return out


# -- the schema's decoding -----------------------------------------------------------------


def parse_override(text: str) -> tuple[str, Any]:
    """``key=<HCL literal>`` (e.g. ``default_mode="tdm"``, ``tdm_shares=4``); a bare word is a string."""
    key, sep, literal = text.partition("=")
    key, literal = key.strip(), literal.strip()
    if not sep or not key:
        raise LauncherConfigError(f'override {text!r}: expected key=value, e.g. default_mode="tdm"')
    try:
        value = hcl2.loads(f"v = {literal}\n")["v"]
    except Exception:  # lark raises many types; all mean "not an HCL literal": take the text
        return key, literal
    if is_expression(value):
        return key, literal
    return key, plain(value)


def _brief(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def agent_value(value: Any, opt: Option, where: str) -> Any:
    """``value`` converted to the option's schema type as hcldec and go-cty do (a number or bool to a
    string, a numeric string to a number, "true"/"false"/"1"/"0" to a bool), or the agent's error."""
    try:
        return _convert(value, opt.hcl_type)
    except TypeError as exc:
        label = opt.name if where == "config" else f"{where}.{opt.name}"
        raise LauncherConfigError(
            f'{where}: Incorrect attribute value type; Inappropriate value for attribute "{opt.name}": {exc} '
            f"(Nomad refuses it before the plugin sees it; {label} = {_brief(value)})"
        ) from None


def _convert(value: Any, hcl_type: str) -> Any:
    if hcl_type.startswith("list("):
        element = hcl_type[len("list(") : -1]
        if not isinstance(value, list):
            raise TypeError("list of " + element.replace("map(string)", "map of string") + " required")
        return [_convert(v, element) for v in value]
    if hcl_type == "map(string)":
        if not isinstance(value, dict):
            raise TypeError("map of string required")
        return {k: _convert(v, "string") for k, v in value.items()}
    if value is None:
        return None
    if hcl_type == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            return str(int(value)) if value.is_integer() else repr(value)
        if isinstance(value, str):
            return value
        raise TypeError("string required")
    if hcl_type == "number":
        if isinstance(value, bool):
            raise TypeError("number required")
        if isinstance(value, (int, float)):
            return value
        if isinstance(value, str) and _NUMBER_TEXT.fullmatch(value):
            number = Decimal(value)
            return int(number) if number == number.to_integral_value() else float(number)
        raise TypeError("a number is required")
    if hcl_type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value in ("true", "1", "false", "0"):
            return value in ("true", "1")
        raise TypeError("a bool is required")
    return value


def _filled(
    raw: dict[str, Any], options: tuple[Option, ...], where: str, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    allowed = {opt.name for opt in options} | set(extra)
    # A handful of names is shown; the plugin block's are too many for one line: plugin.hcl lists them.
    listed = f"allowed: {', '.join(sorted(allowed))}" if len(allowed) <= 8 else "plugin.hcl lists every option"
    for key in raw:
        if key not in allowed:
            raise LauncherConfigError(
                f'{where}: unsupported argument "{key}" (Nomad refuses it: "No argument or block type is named '
                f'{json.dumps(str(key))}"){did_you_mean(str(key), allowed)}; {listed}'
            )
    return {
        opt.name: agent_value(raw[opt.name], opt, where) if raw.get(opt.name) is not None else opt.default
        for opt in options
    }


def full_config(user: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every option present: the user's value, an override, or the option's default."""
    merged = {**user, **(overrides or {})}
    config = _filled(merged, OPTIONS, "config", extra=(CARD_BLOCK,))
    cards = merged.get(CARD_BLOCK) or []
    if not isinstance(cards, list) or not all(isinstance(card, dict) for card in cards):
        raise LauncherConfigError(
            f'config: {CARD_BLOCK} must be blocks, card {{ match = "..." mode = "..." }}, got {_brief(cards)}'
        )
    config[CARD_BLOCK] = [_filled(card, CARD_OPTIONS, f"{CARD_BLOCK}[{i}]") for i, card in enumerate(cards)]
    return config


# -- the msgpack encoding ------------------------------------------------------------------


def cty_number(value: Any) -> Any:
    """A number the way cty/msgpack writes it: int, exact float64, or decimal text."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    if value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value if Decimal(repr(value)) == Decimal(value) else repr(value)


def _cty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _cty(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_cty(v) for v in value]
    return cty_number(value)


def msgpack_config(config: dict[str, Any]) -> bytes:
    """The SetConfig ``msgpack_config`` bytes for a full config map (keys sorted like cty)."""
    packed: bytes = msgpack.packb(_cty(config), use_bin_type=True)
    return packed


def load_config(
    plugin_config: str | Path | None = None, overrides: list[str] | None = None, name: str = PLUGIN_NAME
) -> dict[str, Any]:
    """An agent file or directory (optional) plus ``key=value`` overrides -> the full config map."""
    user = plugin_user_config(find_plugin_blocks(plugin_config), plugin_config, name) if plugin_config else {}
    return full_config(user, dict(parse_override(o) for o in overrides or []))
