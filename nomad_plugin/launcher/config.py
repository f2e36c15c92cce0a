"""The plugin's config as a Nomad agent reads it and sends it in SetConfig, byte for byte.

``nomad agent -config=DIR`` reads the directory's ``*.hcl`` and ``*.json`` files in lexical order,
decodes the ``plugin "<name>" { config { ... } }`` block with the plugin's ConfigSchema (hcldec and
go-cty's conversions) and msgpack-encodes the cty object: every attribute, defaults filled in, keys
sorted, integers compact, exact non-integers as float64, inexact ones as decimal text (go-cty's
cty/msgpack/marshal.go). Here the same is done from those files plus ``key=value`` overrides.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import hcl2
import msgpack

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.config.decode import did_you_mean
from nomad_plugin.config.options import CARD_BLOCK, CARD_OPTIONS, OPTIONS, Option
from nomad_plugin.util.hcl import is_expression, is_meta, plain, unlabelled
from nomad_plugin.util.hcl1 import Hcl1Error
from nomad_plugin.util.hcl1_decode import decode_agent

AGENT_SUFFIXES = (".hcl", ".json")
_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class LauncherConfigError(ValueError):
    """A plugin config file or override that Nomad would refuse too."""


# -- an agent file by the rules of the agent's parser, HCL v1 ----------------------------
# The agent reads ``-config`` files with HCL v1 (command/agent/config_parse.go, hcl.Decode);
# nomad_plugin/util/hcl1.py reads them by the same rules. The plugin's config is then evaluated by
# HCL v2's JSON decoder with no variables (hclutils.ParseHclInterface): ``${...}`` and ``%{...}``
# templates there are refused, since doctor does not evaluate them (stricter than the agent,
# never more lenient; docs/operator.md).


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
    from_json: bool = False


@dataclass
class AgentFile:
    """What one agent file sets that the plugin's tools use: ``""`` where it sets nothing."""

    plugins: list[PluginBlock] = field(default_factory=list)
    data_dir: str = ""
    plugin_dir: str = ""


def _syntax_error(exc: Hcl1Error, text: str, source: str) -> AgentSyntaxError:
    hint = ""
    if exc.reason.startswith("Unknown token:") and " IDENT " in exc.reason:
        word = exc.reason.rsplit(" ", 1)[-1]
        hint = f'; a bare word ({word}) is not a value: quote it, "{word}"'
    if not exc.line:
        return AgentSyntaxError(f"{source}: not valid HCL: {exc.reason}{hint}")
    lines = text.splitlines()
    shown = lines[exc.line - 1] if exc.line <= len(lines) else ""
    caret = " " * (exc.column - 1) + "^"
    return AgentSyntaxError(
        f"{source}:{exc.line}:{exc.column}: not valid HCL: {exc.reason}{hint}\n    {shown}\n    {caret}"
    )


def read_agent_text(text: str, source: str) -> AgentFile:
    """One HCL agent file as the agent decodes it; AgentSyntaxError for what the agent refuses."""
    try:
        fields = decode_agent(text)
    except Hcl1Error as exc:
        raise _syntax_error(exc, text, source) from None
    blocks = [
        PluginBlock(p.name, p.args, p.config or {}, p.line, p.extra_keys, p.config_blocks) for p in fields.plugins
    ]
    return AgentFile(blocks, fields.data_dir, fields.plugin_dir)


# -- the agent's files ---------------------------------------------------------------------


@dataclass
class PluginBlocks:
    """Every ``plugin`` block found: label -> (file, block), in load order; and the paths the
    files set, merged as the agent merges them (the last file that sets one wins)."""

    blocks: dict[str, list[tuple[Path, PluginBlock]]] = field(default_factory=dict)
    data_dir: str = ""
    plugin_dir: str = ""

    def names(self) -> list[str]:
        return sorted(self.blocks)


def _temporary(name: str) -> bool:
    """An editor's backup file, which the agent skips (command/agent/config.go, isTemporaryFile)."""
    return name.endswith("~") or name.startswith(".#") or (name.startswith("#") and name.endswith("#"))


def agent_files(path: str | Path) -> list[Path]:
    """The files Nomad reads for ``-config=path``: the file, or a directory's *.hcl/*.json (sorted)."""
    source = Path(path)
    try:
        if source.is_dir():
            return sorted(
                p
                for p in source.iterdir()
                if p.is_file() and p.name.endswith(AGENT_SUFFIXES) and not _temporary(p.name)
            )
    except OSError as exc:
        raise LauncherConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    return [source]


def _json_agent(data: Any) -> AgentFile:
    """A JSON agent file: a plain map, or HCL's JSON form with lists of objects."""
    found = AgentFile()
    for doc in unlabelled(data):
        for key in ("data_dir", "plugin_dir"):
            if isinstance(doc.get(key), str):
                setattr(found, key, doc[key])
        for item in unlabelled(doc.get("plugin")):
            for label, body in item.items():
                for one in unlabelled(body):
                    configs = unlabelled(one.get("config", {}))
                    merged = {key: value for config in configs for key, value in config.items()}
                    block = PluginBlock(str(label), config=merged, config_blocks=len(configs), from_json=True)
                    found.plugins.append(block)
    return found


def read_agent_file(path: Path) -> AgentFile:
    """One agent file; JSON when its first character other than a space is ``{`` (HCL v1's rule)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise LauncherConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise LauncherConfigError(f"{path} is not valid HCL: not UTF-8 text ({exc.reason})") from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise LauncherConfigError(f"{path} is not valid JSON: {exc}") from None
        return _json_agent(data)
    return read_agent_text(text, str(path))


def find_plugin_blocks(path: str | Path) -> PluginBlocks:
    files = agent_files(path)
    if not files:
        raise LauncherConfigError(f"{path}: no *.hcl or *.json file (Nomad reads only those from a directory)")
    result = PluginBlocks()
    for file in files:
        agent = read_agent_file(file)
        result.data_dir = agent.data_dir or result.data_dir
        result.plugin_dir = agent.plugin_dir or result.plugin_dir
        for block in agent.plugins:
            result.blocks.setdefault(block.label, []).append((file, block))
    return result


def agent_plugin_dir(blocks: PluginBlocks) -> tuple[str, str]:
    """(directory, which setting gives it) as the agent derives it: plugin_dir, else <data_dir>/plugins
    (command/agent/command.go); ("", "") when the files set neither. A relative one is refused, as the
    agent refuses to start with it ("plugin-dir must be given as an absolute path")."""
    for flag, value in (("data-dir", blocks.data_dir), ("plugin-dir", blocks.plugin_dir)):
        if value and not value.startswith("/"):
            raise LauncherConfigError(f"{flag} must be given as an absolute path: got {value} (the agent refuses it)")
    if blocks.plugin_dir:
        return blocks.plugin_dir, "plugin_dir"
    if blocks.data_dir:
        return "/" + os.path.normpath(blocks.data_dir + "/plugins").lstrip("/"), "data_dir + /plugins"
    return "", ""


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
    return _json_values(block.config, str(file)) if block.from_json else agent_config_values(block.config, str(file))


def agent_config_values(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """The values after the agent's HCL v2 JSON decoding of the plugin block (hclutils.ParseHclInterface):
    ``$${`` and ``%%{`` lose their escape; a template the agent would evaluate is refused."""

    def untemplate(key: str, value: Any) -> Any:
        if isinstance(value, str):
            bare = value.replace("$${", "").replace("%%{", "")
            if "${" in bare or "%{" in bare:
                raise AgentSyntaxError(
                    f"{source}: {key} = {json.dumps(value)}: a ${{...}} or %{{...}} template; the agent evaluates it "
                    "with no variables (HCL v2's JSON decoder) and doctor does not evaluate templates: write the "
                    "value itself"
                )
            return value.replace("$${", "${").replace("%%{", "%{")
        if isinstance(value, list):
            return [untemplate(key, v) for v in value]
        if isinstance(value, dict):
            return {k: untemplate(f"{key}.{k}", v) for k, v in value.items()}
        return value

    return {key: untemplate(key, value) for key, value in config.items()}


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
