"""The plugin's config as a Nomad agent reads it and sends it in SetConfig.

``nomad agent -config=DIR`` reads every ``*.hcl`` and ``*.json`` file of the directory in lexical
order (HCL files by the rules of ``agent_hcl.py``; a JSON file holds the same blocks). The agent
decodes the ``plugin "<name>" { config { ... } }`` block with the plugin's ConfigSchema (an Object
of ``Default(Attr, Literal)``: hcldec and go-cty's conversions) and msgpack-encodes the cty object:
every attribute, defaults filled in, keys sorted, integers compact, exact non-integers as float64
and inexact ones as decimal text (go-cty's cty/msgpack/marshal.go). This module does the same from
the agent's files plus ``key=value`` overrides, so the operator commands send the plugin exactly
the bytes an agent would.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import hcl2
import msgpack

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.config.options import CARD_BLOCK, CARD_OPTIONS, OPTIONS, Option
from nomad_plugin.launcher.agent_hcl import AgentSyntaxError, PluginBlock, parse_agent_text
from nomad_plugin.util.hcl import is_expression, is_meta, plain, unlabelled

AGENT_SUFFIXES = (".hcl", ".json")
_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class LauncherConfigError(ValueError):
    """A plugin config file or override that Nomad would refuse too."""


# -- the agent's files ---------------------------------------------------------------------


@dataclass
class PluginBlocks:
    """Every ``plugin`` block found: label -> (file, block), in load order."""

    files: list[Path] = field(default_factory=list)
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
    for doc in data if isinstance(data, list) else [data]:
        plugins = doc.get("plugin") if isinstance(doc, dict) else None
        for item in plugins if isinstance(plugins, list) else [plugins]:
            for label, body in item.items() if isinstance(item, dict) else ():
                for one in body if isinstance(body, list) else [body]:
                    if not isinstance(one, dict):
                        continue
                    config = one.get("config", {})
                    configs = [c for c in (config if isinstance(config, list) else [config]) if isinstance(c, dict)]
                    merged: dict[str, Any] = {}
                    for c in configs:
                        merged.update(c)
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
    try:
        return parse_agent_text(text, str(path))
    except AgentSyntaxError as exc:
        raise LauncherConfigError(str(exc)) from None


def find_plugin_blocks(path: str | Path) -> PluginBlocks:
    """All plugin blocks under ``path`` (a file or an agent config directory)."""
    result = PluginBlocks(files=agent_files(path))
    if not result.files:
        raise LauncherConfigError(f"{path}: no *.hcl or *.json file (Nomad reads only those from a directory)")
    for file in result.files:
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
    """What the agent silently resolves in the plugin's blocks: doctor shows it as a warning."""
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


def did_you_mean(word: str, choices: set[str] | list[str] | tuple[str, ...]) -> str:
    """``; did you mean "x"?`` for a close match (as check-job suggests), else ""."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.75)
    return f'; did you mean "{close[0]}"?' if close else ""


def _brief(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def agent_value(value: Any, opt: Option, where: str) -> Any:
    """``value`` converted to the option's schema type as the agent's decoder does (hcldec and
    go-cty's conversions: a number or a bool becomes a string, a numeric string a number, "true",
    "false", "1" or "0" a bool), or LauncherConfigError with the agent's message."""
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
    for key in raw:
        if key not in allowed:
            raise LauncherConfigError(
                f'{where}: unsupported argument "{key}" (Nomad refuses it: "No argument or block type is named '
                f'{json.dumps(str(key))}"){did_you_mean(str(key), allowed)}; allowed: {", ".join(sorted(allowed))}'
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
