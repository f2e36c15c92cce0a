"""SetConfig's ``msgpack_config`` -> a validated ``PluginConfig``.

Nomad msgpack-encodes the cty object it decoded with our ConfigSchema (go-cty's ``cty/msgpack``, called in
Nomad's ``helper/pluginutils/loader/init.go``): every attribute present, null for unset ones, numbers as
ints, float64 or decimal strings; empty bytes for no config. Anything else is a ``ConfigError`` naming the
option, the (truncated, secret-masked) value and what is allowed; nothing else is raised, whatever the bytes.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import posixpath
import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

import msgpack

from nomad_plugin.config.model import MIN_FINGERPRINT_PERIOD_S, CardRule, ConfigError, PluginConfig
from nomad_plugin.config.options import CARD_BLOCK, CARD_OPTIONS, OPTIONS, Option, option

MAX_INPUT_BYTES = 1 << 20
MAX_STRING = 4096
MAX_LIST = 1024
MAX_CARDS = 1024
MAX_DURATION = 30 * 86400.0  # seconds; anything longer is a typo
#: Go's time.Duration limit (int64 nanoseconds): what time.ParseDuration accepts.
GO_MAX_DURATION = (2**63 - 1) / 1e9
#: nomad-device-nvidia's list options, whose entries it takes as they are (an empty string matches nothing).
VERBATIM_LISTS = frozenset({"ignored_gpu_ids"})
# Durations that must be > 0 (a zero timeout or resync period makes no sense).
POSITIVE_DURATIONS = frozenset({"xdm_call_timeout", "xdm_allocate_timeout", "inventory_resync_period"})
# A relative socket path would resolve against wherever Nomad started the plugin: refused, not guessed.
ABSOLUTE_PATHS = ("xdm_socket", "config_socket")
URL_SCHEMES = ("http", "https", "unix")
LEVEL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
# Nomad refuses a dynamic meta key that is not a dotted HCL identifier (NodeMetaApplyRequest.Validate).
META_PREFIX = re.compile(r"(?:[A-Za-z][A-Za-z0-9_-]*\.){1,8}")
SHOWN_CHARS = 60
REDACTED = "<redacted>"

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(f"(?:{_DURATION_PART.pattern})+")


# --- showing a value in an error message ----------------------------------------


def show(value: Any, secret: bool = False, depth: int = 0) -> str:
    """A short, safe rendering: truncated, secrets masked, deep nesting elided."""
    if secret:
        return REDACTED
    if isinstance(value, msgpack.ExtType):
        return f"msgpack extension type {value.code} (an unknown value)"
    if isinstance(value, msgpack.Timestamp):
        return "msgpack timestamp extension"
    if isinstance(value, (bytes, bytearray)):
        return f"binary data ({len(value)} bytes)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = repr(value[: SHOWN_CHARS + 1])
        return text if len(value) <= SHOWN_CHARS else text[:-1] + f"...' ({len(value)} chars)"
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."
    if depth >= 2:
        return "[...]" if isinstance(value, list) else "{...}"
    if isinstance(value, list):
        items = [show(v, depth=depth + 1) for v in value[:4]]
        more = ", ..." if len(value) > 4 else ""
        return _cap("[" + ", ".join(items) + more + "]")
    if isinstance(value, dict):
        pairs = [f"{show(k, depth=depth + 1)}: {show(v, depth=depth + 1)}" for k, v in list(value.items())[:4]]
        more = ", ..." if len(value) > 4 else ""
        return _cap("{" + ", ".join(pairs) + more + "}")
    return _cap(f"a {type(value).__name__}")


def _cap(text: str) -> str:
    return text if len(text) <= 2 * SHOWN_CHARS else text[: 2 * SHOWN_CHARS] + "..."


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``; did you mean "x"?`` for a close match (as Nomad's check-job suggests), else ""."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.75)
    return f'; did you mean "{close[0]}"?' if close else ""


def invalid(name: str, value: Any, allowed: str, secret: bool = False, problem: str = "is not valid") -> ConfigError:
    return ConfigError(f'config option "{name}": value {show(value, secret)} {problem}; allowed: {allowed}')


# --- scalar parsers ---------------------------------------------------------------


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration string ("500ms", "1m30s", "1.5h", "0"); ValueError if not one."""
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body[1:] if body[:1] in ("+", "-") else body
    if body == "0":
        return 0.0
    if not body:
        raise ValueError("empty duration")
    if not _DURATION.fullmatch(body):
        raise ValueError(f"bad duration {text!r}")
    return sign * sum(float(number) * _UNITS[unit] for number, unit in _DURATION_PART.findall(body))


def whole_number(value: Any) -> int | None:
    """An integer from int, integral float or numeric string (cty's encodings); None if not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str) and len(value) <= 64:
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            return None
        if not number.is_finite() or number.adjusted() > 30 or number != number.to_integral_value():
            return None
        return int(number)
    return None


def decode_number(opt: Option, value: Any, name: str) -> int:
    number = whole_number(value)
    lo = "" if opt.minimum is None else f" from {opt.minimum:g}"
    hi = "" if opt.maximum is None else f" to {opt.maximum:g}"
    allowed = f"a whole number{lo}{hi}"
    if number is None:
        raise invalid(name, value, allowed, opt.secret, "is not a whole number")
    if (opt.minimum is not None and number < opt.minimum) or (opt.maximum is not None and number > opt.maximum):
        raise invalid(name, value, allowed, opt.secret, "is out of range")
    return number


def decode_string(opt: Option, value: Any, name: str) -> str:
    allowed = _string_allowed(opt)
    if not isinstance(value, str):
        raise invalid(name, value, allowed, opt.secret, "is not a string")
    if len(value) > MAX_STRING or "\x00" in value:
        raise invalid(name, value, allowed, opt.secret, f"is too long or holds a NUL (max {MAX_STRING} chars)")
    text: str = value.strip().lower() if opt.name == "log_level" else value
    if opt.choices and text not in opt.choices:
        raise invalid(name, value, allowed, opt.secret, "is not one of the choices")
    return text


def _string_allowed(opt: Option) -> str:
    if opt.choices:
        return " or ".join(f'"{c}"' for c in opt.choices)
    if opt.duration:
        return 'a Go duration such as "500ms", "30s", "1m30s" or "1h"'
    if opt.name == "group_by":
        return '"none" or a topology level name such as "numaNodes" or "pcieSwitches"'
    if opt.name == "xdm_schema":
        return '"auto", "reflection", "builtin", or a path to a .proto file, a directory of them or a descriptor set'
    if opt.name == "node_meta_prefix":
        return 'dotted identifiers ending with a dot, such as "lingjun." or "site.lingjun." (at most 64 characters)'
    return f"a string of at most {MAX_STRING} characters"


def decode_duration(opt: Option, value: Any, name: str) -> float:
    text = decode_string(opt, value, name)
    allowed = _string_allowed(opt)
    try:
        seconds = parse_go_duration(text)
    except ValueError:
        raise invalid(name, value, allowed, opt.secret, "is not a Go duration") from None
    if seconds < 0 or seconds > MAX_DURATION or (opt.name in POSITIVE_DURATIONS and seconds == 0):
        floor = "> 0" if opt.name in POSITIVE_DURATIONS else ">= 0"
        raise invalid(name, value, f"{allowed}, {floor} and at most 30 days", opt.secret, "is out of range")
    return seconds


def decode_list(opt: Option, value: Any, name: str) -> tuple[Any, ...]:
    element = opt.hcl_type[len("list(") : -1]
    allowed = f"a list of at most {MAX_LIST} {'non-empty strings' if element == 'string' else 'whole numbers'}"
    if not isinstance(value, list):
        raise invalid(name, value, allowed, opt.secret, "is not a list")
    if len(value) > MAX_LIST:
        raise invalid(name, value, allowed, opt.secret, f"has {len(value)} entries")
    items: list[Any] = []
    for index, item in enumerate(value):
        if element == "string":
            empty_ok = opt.name in VERBATIM_LISTS and item == ""
            if not isinstance(item, str) or not (item or empty_ok) or len(item) > MAX_STRING or "\x00" in item:
                raise invalid(f"{name}[{index}]", item, allowed, opt.secret, "is not a non-empty string")
            items.append(item)
        else:
            number = whole_number(item)
            if number is None or not 0 <= number <= 2**31 - 1:
                raise invalid(f"{name}[{index}]", item, f"{allowed} from 0 to 2147483647", opt.secret)
            items.append(number)
    return tuple(items)


def decode_map(opt: Option, value: Any, name: str) -> tuple[tuple[str, str], ...]:
    """A ``list(map(string))`` (Nomad's HCL1 shape of a map, as in the docker driver's
    ``labels``) or a plain map -> sorted (key, value) pairs (hashable, like every config value)."""
    allowed = f"a map of at most {MAX_LIST} non-empty strings to non-empty strings"
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):  # HCL1 spells a map as [{...}]
        merged: dict[Any, Any] = {}
        for part in value:
            merged.update(part)
        value = merged
    if not isinstance(value, dict):
        raise invalid(name, value, allowed, opt.secret, "is not a map")
    if len(value) > MAX_LIST:
        raise invalid(name, value, allowed, opt.secret, f"has {len(value)} entries")
    pairs = []
    for key, item in value.items():
        for part in (key, item):
            if not isinstance(part, str) or not part.strip() or len(part) > MAX_STRING or "\x00" in part:
                raise invalid(f"{name}[{show(key)}]", item, allowed, opt.secret, "is not a non-empty string")
        pairs.append((key.strip(), item.strip()))
    return tuple(sorted(pairs))


def decode_option(opt: Option, value: Any, name: str | None = None) -> Any:
    """One option's value (never None: the caller substitutes the default for null)."""
    label = name or opt.name
    if "map(" in opt.hcl_type:
        return decode_map(opt, value, label)
    if opt.hcl_type == "number":
        return decode_number(opt, value, label)
    if opt.hcl_type == "bool":
        if not isinstance(value, bool):
            raise invalid(label, value, "true or false", opt.secret, "is not a bool")
        return value
    if opt.hcl_type.startswith("list("):
        return decode_list(opt, value, label)
    if opt.duration:
        return decode_duration(opt, value, label)
    text = decode_string(opt, value, label)
    if opt.name == "xdm_schema" and not text.strip():
        raise invalid(label, value, _string_allowed(opt), problem="is empty")
    if opt.name == "group_by" and text != "none" and not LEVEL_NAME.fullmatch(text):
        raise invalid(label, value, _string_allowed(opt), problem="is not a level name")
    if opt.name == "node_meta_prefix" and (len(text) > 64 or not META_PREFIX.fullmatch(text)):
        raise invalid(label, value, _string_allowed(opt), problem="is not a meta key prefix")
    return text


def default_value(opt: Option) -> Any:
    if opt.duration:
        return parse_go_duration(str(opt.default))
    return tuple(opt.default) if isinstance(opt.default, list) else opt.default


# --- objects ------------------------------------------------------------------------


def _decode_object(
    raw: dict[Any, Any], options: tuple[Option, ...], where: str, extra: frozenset[str] = frozenset()
) -> dict[str, Any]:
    known = {opt.name for opt in options} | extra
    for key in raw:
        if not isinstance(key, str) or key not in known:
            names = ", ".join(sorted(known))
            raise ConfigError(
                f"{where}: unknown option {show(key)}{did_you_mean(str(key), known)}; allowed options: {names}"
            )
    values: dict[str, Any] = {}
    for opt in options:
        value = raw.get(opt.name)
        label = opt.name if where == "config" else f"{where}.{opt.name}"
        values[opt.name] = default_value(opt) if value is None else decode_option(opt, value, label)
    return values


def decode_cards(value: Any) -> tuple[CardRule, ...]:
    allowed = f'a list of at most {MAX_CARDS} "card" blocks'
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_CARDS:
        raise invalid(CARD_BLOCK, value, allowed, problem="is not a list of blocks")
    rules: list[CardRule] = []
    modes: dict[str, str] = {}
    for index, block in enumerate(value):
        where = f"{CARD_BLOCK}[{index}]"
        if not isinstance(block, dict):
            raise invalid(where, block, "a block with match, mode, shares, share_percent", problem="is not a block")
        rule = CardRule(**_decode_object(block, CARD_OPTIONS, where))  # the card options are CardRule's fields
        if not rule.match.strip():
            raise invalid(f"{where}.match", rule.match, "a card minor, a card UUID or a model name", problem="is empty")
        if rule.shares and rule.share_percent:
            raise ConfigError(
                f"{where}: shares = {rule.shares} and share_percent = {rule.share_percent} are both set; "
                "allowed: at most one of them"
            )
        if rule.share_percent and 100 % rule.share_percent:
            raise invalid(
                f"{where}.share_percent",
                rule.share_percent,
                "a divisor of 100 (1, 2, 4, 5, 10, 20, 25, 50, 100)",
                problem="does not divide 100",
            )
        previous = modes.setdefault(rule.match, rule.mode)
        if previous != rule.mode:
            raise ConfigError(
                f"{where}: match {show(rule.match)} already has mode {previous!r} in an earlier card block, "
                f"here mode {rule.mode!r}; allowed: one mode per match value"
            )
        rules.append(rule)
    return tuple(rules)


# --- entry points -------------------------------------------------------------------


def unpack(data: bytes) -> Any:
    """msgpack bytes -> Python value; ConfigError for anything that is not one msgpack value."""
    if len(data) > MAX_INPUT_BYTES:
        raise ConfigError(f"config: msgpack_config is {len(data)} bytes; allowed: at most {MAX_INPUT_BYTES}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises many types for garbage; all mean the same
        raise ConfigError(
            f"config: msgpack_config ({len(data)} bytes) is not one valid msgpack value "
            f"({type(exc).__name__}); allowed: the msgpack object Nomad encodes from the config block"
        ) from None


def decode_config(data: bytes) -> PluginConfig:
    """Decode and validate ``SetConfigRequest.msgpack_config``; empty bytes = all defaults."""
    raw = unpack(data) if data else None
    if raw is None:
        return PluginConfig()
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config: the decoded value {show(raw)} is not a map; allowed: a map of option names to values"
        )
    values = _decode_object(raw, OPTIONS, "config", extra=frozenset({CARD_BLOCK}))
    values["cards"] = decode_cards(raw.get(CARD_BLOCK))
    check_paths_and_urls(values)
    check_plugin_settings(values)
    merge_fingerprint_period(values, raw)
    return PluginConfig(**values)


def check_paths_and_urls(values: dict[str, Any]) -> None:
    """Socket paths must be absolute; ``nomad_address`` must be a URL the API client can dial."""
    for name in ABSOLUTE_PATHS:
        if not str(values[name]).startswith("/"):
            raise invalid(name, values[name], "an absolute path such as /run/xdm/dp2mgr.sock", problem="is relative")
    address = str(values["nomad_address"]).strip()
    if not address:
        return
    allowed = 'a URL such as "http://127.0.0.1:4646", "https://nomad.local:4646" or "unix:///run/nomad.sock"'
    try:
        parts = urlsplit(address)
        parts.port  # noqa: B018 - raises ValueError for a non-numeric or out-of-range port
    except ValueError:
        raise invalid("nomad_address", address, allowed, problem="is not a URL") from None
    if parts.scheme not in URL_SCHEMES:
        raise invalid("nomad_address", address, allowed, problem="has no http, https or unix scheme")
    if parts.scheme == "unix" and not (parts.path.startswith("/") and not parts.netloc):
        raise invalid("nomad_address", address, allowed, problem="is not unix:// followed by an absolute path")
    if parts.scheme != "unix" and not parts.hostname:
        raise invalid("nomad_address", address, allowed, problem="names no host")


#: A Nomad node ID is a UUID (``uuid.Generate`` in Nomad's helper/uuid).
NODE_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_plugin_settings(values: dict[str, Any]) -> None:
    """Settings that would otherwise fail, or do harm, only later: ``data_dir``, ``nomad_node_id``,
    ``metrics_bind``, ``nomad_token`` (a trailing newline dropped, never shown) or ``nomad_token_file`` and
    the allow lists."""
    from nomad_plugin.util.text import data_dir_problem, normalise_token

    found = data_dir_problem(str(values["data_dir"]))
    if found is not None:
        allowed = 'an absolute path of a directory of the plugin\'s own, such as "/var/lib/nomad-device-lingjun"'
        raise invalid("data_dir", values["data_dir"], allowed, problem=found)
    node = str(values["nomad_node_id"])
    if node and not NODE_ID.fullmatch(node):
        allowed = 'a Nomad node ID (a UUID such as "4c1a2b3d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"), or "" to ask the agent'
        raise invalid("nomad_node_id", node, allowed, problem="is not a UUID")
    bind = str(values["metrics_bind"])
    try:
        if bind != "localhost":  # an IP address or "localhost": nothing is resolved or bound here
            ipaddress.ip_address(bind)
    except ValueError:
        allowed = 'an IP address such as "127.0.0.1", "0.0.0.0", "::1" or "::", or "localhost"'
        raise invalid("metrics_bind", bind, allowed, problem="is not an IP address") from None
    token, problem = normalise_token(str(values["nomad_token"]))
    if problem is not None:
        raise invalid("nomad_token", values["nomad_token"], "one line of printable text", secret=True, problem=problem)
    values["nomad_token"] = token
    token_file = str(values["nomad_token_file"])
    if token_file and not token_file.startswith("/"):
        allowed = 'an absolute path such as "/etc/nomad.d/lingjun.token"'
        raise invalid("nomad_token_file", token_file, allowed, problem="is relative")
    if token_file and token:
        raise ConfigError(
            "config: nomad_token and nomad_token_file are both set; allowed: one of them (nomad_token_file keeps "
            "the token out of the agent configuration)"
        )
    for index, name in enumerate(values["xdm_env_allow"]):
        if not ENV_NAME.fullmatch(name):
            raise invalid(f"xdm_env_allow[{index}]", name, 'env variable names such as "LD_LIBRARY_PATH"')
    for index, path in enumerate(values["xdm_mount_allow"]):
        if not (path.startswith("/") and path == posixpath.normpath(path) and path != "/" and path.isprintable()):
            allowed = 'absolute, normalised host paths other than "/", such as "/run/amp/eKitC"'
            raise invalid(f"xdm_mount_allow[{index}]", path, allowed)


def merge_fingerprint_period(values: dict[str, Any], raw: dict[Any, Any]) -> None:
    """``fingerprint_period`` (nomad-device-nvidia's key, Go's ``time.ParseDuration`` syntax) and
    ``inventory_resync_period`` are one setting. Nomad fills in every default, so the one that differs
    from its default was written; both written and different is refused; "" means not written."""
    text = str(values["fingerprint_period"]).strip()
    written = values["inventory_resync_period"]
    resync_default = default_value(option("inventory_resync_period"))
    period = None
    if text:  # any sign and no 30-day cap, as time.ParseDuration
        allowed = _string_allowed(option("inventory_resync_period"))
        try:
            period = parse_go_duration(text)
        except ValueError:
            raise invalid("fingerprint_period", text, allowed, problem="is not a Go duration") from None
        if abs(period) > GO_MAX_DURATION:
            allowed += ", within Go's limit of about 292 years"
            raise invalid("fingerprint_period", text, allowed, problem="is out of range")
    if period is None or (
        period == parse_go_duration(str(option("fingerprint_period").default)) and written != resync_default
    ):
        values["fingerprint_period"] = written
        return
    if written not in (period, resync_default):
        raise ConfigError(
            f"config: fingerprint_period = {show(text)} and inventory_resync_period = "
            f"{show(raw.get('inventory_resync_period'))} disagree; allowed: one of them (they are one setting), "
            "or both the same duration"
        )
    values["fingerprint_period"] = period
    values["inventory_resync_period"] = max(MIN_FINGERPRINT_PERIOD_S, period)


def secret_values(config: PluginConfig) -> list[str]:
    """The configured values of options marked secret (for the log redactor)."""
    return [str(getattr(config, opt.name)) for opt in OPTIONS if opt.secret and getattr(config, opt.name)]
