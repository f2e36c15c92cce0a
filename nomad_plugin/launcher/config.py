"""The plugin's ``config { }`` block as Nomad would send it in SetConfig.

Nomad decodes the agent's ``plugin "<name>" { config { ... } }`` block with
the plugin's ConfigSchema (an Object of ``Default(Attr, Literal)``) and
msgpack-encodes the cty object: a map with **every** attribute, defaults
filled in, keys sorted, integers compact, exact non-integers as float64 and
inexact ones as decimal strings (nomad-protocol.md §4.1-4.4). This module
reproduces that from an HCL file plus ``key=value`` overrides, so operator
commands drive the plugin through exactly the bytes a Nomad agent would.
"""

from __future__ import annotations

import difflib
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import hcl2
import msgpack

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.config.options import CARD_BLOCK, CARD_OPTIONS, OPTIONS, Option
from nomad_plugin.util.hcl import is_expression, is_meta, plain, unlabelled


class LauncherConfigError(ValueError):
    """A plugin config file or override that Nomad would refuse too."""


def plugin_config_from_file(path: str | Path, name: str = PLUGIN_NAME) -> dict[str, Any]:
    """The user-written ``config`` attributes of ``plugin "<name>"`` in ``path`` (no defaults)."""
    from nomad_plugin.launcher.agent_files import find_plugin_blocks, plugin_user_config

    return plugin_user_config(find_plugin_blocks(path), path, name)


def _plain_config(raw: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if is_meta(key):
            continue
        if key == CARD_BLOCK:
            out[key] = [_plain_config(b, f"{where}: card block") for b in unlabelled(value)]
            continue
        if is_expression(value):
            raise LauncherConfigError(f"{where}: option {key} = {value} is an expression; allowed: a literal value")
        out[key] = plain(value)
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """``key=<HCL literal>`` (e.g. ``default_mode="tdm"``, ``tdm_shares=4``); a bare word is a string."""
    key, sep, literal = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise LauncherConfigError(f'override {text!r}: expected key=value, e.g. default_mode="tdm"')
    literal = literal.strip()
    try:
        value = hcl2.loads(f"v = {literal}\n")["v"]
    except Exception:
        return key, literal
    if is_expression(value):
        return key, literal
    return key, plain(value)


def _filled(
    raw: dict[str, Any], options: tuple[Option, ...], where: str, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    known = {opt.name for opt in options}
    for key in raw:
        if key not in known and key not in extra:
            hint = did_you_mean(str(key), known | set(extra))
            raise LauncherConfigError(
                f'{where}: unsupported argument "{key}" (Nomad refuses it: "No argument or block type is named '
                f'{json.dumps(str(key))}"){hint}; allowed: {", ".join(sorted(known | set(extra)))}'
            )
    return {
        opt.name: agent_value(raw[opt.name], opt, where) if raw.get(opt.name) is not None else opt.default
        for opt in options
    }


def did_you_mean(word: str, choices: set[str] | list[str] | tuple[str, ...]) -> str:
    """``; did you mean "x"?`` for a close match (as check-job suggests), else ""."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.75)
    return f'; did you mean "{close[0]}"?' if close else ""


_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


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


def _brief(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


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


def cty_number(value: Any) -> Any:
    """A number the way cty/msgpack writes it: int, exact float64, or decimal text."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    if value.is_integer() and abs(value) < 2**63:
        return int(value)
    if Decimal(repr(value)) == Decimal(value):
        return value
    return repr(value)


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
    """File or agent config directory, HCL or JSON (optional) + ``key=value`` overrides -> the full config map."""
    from nomad_plugin.launcher.agent_files import find_plugin_blocks, plugin_user_config

    user = plugin_user_config(find_plugin_blocks(plugin_config), plugin_config, name) if plugin_config else {}
    extra = dict(parse_override(o) for o in overrides or [])
    return full_config(user, extra)
