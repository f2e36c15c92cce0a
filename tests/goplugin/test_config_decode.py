"""SetConfig's msgpack decoding: every spelling cty produces, and clear rejections."""

from __future__ import annotations

import dataclasses
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nomad_plugin.config.decode import MAX_INPUT_BYTES, decode_config, parse_go_duration, secret_values, show
from nomad_plugin.config.model import CardRule, ConfigError, PluginConfig
from nomad_plugin.config.options import CARD_BLOCK, OPTIONS


def full_object(**values: object) -> dict[str, object]:
    """What Nomad sends: every attribute present, null when unset."""
    obj: dict[str, object] = {opt.name: None for opt in OPTIONS}
    obj[CARD_BLOCK] = []
    obj.update(values)
    return obj


def decode(obj: object) -> PluginConfig:
    return decode_config(msgpack.packb(obj))


def rejected(obj: object) -> str:
    with pytest.raises(ConfigError) as err:
        decode(obj)
    return str(err.value)


def float64(value: float) -> bytes:
    return b"\xcb" + struct.pack(">d", value)


def test_empty_bytes_and_nil_mean_all_defaults() -> None:
    assert decode_config(b"") == PluginConfig()
    assert decode_config(b"\xc0") == PluginConfig()


def test_full_object_of_nulls_equals_the_dataclass_defaults() -> None:
    # Nulls decode to the defaults stated once in model.py.
    assert decode(full_object()) == PluginConfig()
    assert decode(full_object(**{CARD_BLOCK: None})) == PluginConfig()


def test_option_defaults_spelled_out_decode_to_the_same_config() -> None:
    assert decode(full_object(**{opt.name: opt.default for opt in OPTIONS})) == PluginConfig()


def test_number_encodings_cty_produces() -> None:
    # compact int, float64-encoded integral value, and a decimal string
    assert decode({"tdm_shares": 4}).tdm_shares == 4
    raw = b"\x81" + msgpack.packb("tdm_shares") + float64(8.0)
    assert decode_config(raw).tdm_shares == 8
    assert decode({"tdm_shares": "16"}).tdm_shares == 16
    assert decode({"metrics_port": "9400.0"}).metrics_port == 9400
    assert decode({"xid_ignore": [1, 2.0, "3"]}).xid_ignore == (1, 2, 3)


def test_durations_are_go_durations_in_seconds() -> None:
    cfg = decode({"xdm_call_timeout": "500ms", "release_grace_period": "1m30s", "inventory_resync_period": "1h"})
    assert (cfg.xdm_call_timeout, cfg.release_grace_period, cfg.inventory_resync_period) == (0.5, 90.0, 3600.0)
    assert parse_go_duration("1.5h") == 5400.0
    assert parse_go_duration("0") == 0.0
    assert parse_go_duration("2us") == pytest.approx(2e-6)
    for bad in ("", "5", "1x", "1.5.5s", "s", "1m 30s"):
        with pytest.raises(ValueError):
            parse_go_duration(bad)


# (option, bad value, text the message must hold)
BAD_VALUES = [
    ("backend", "gpu", '"auto" or "xdm" or "nvml"'),
    ("backend", 3, "not a string"),
    ("xdm_minor_encoding", "omit_zero", "omit-zero"),
    ("xdm_call_timeout", "5", "Go duration"),
    ("xdm_call_timeout", "0s", "> 0"),
    ("health_recovery_delay", "-1s", ">= 0"),
    ("release_grace_period", "999h", "30 days"),
    ("log_level", "warning", '"warn"'),
    ("default_mode", "shared", '"whole" or "tdm" or "mig"'),
    ("tdm_shares", 0, "from 1 to 100"),
    ("tdm_shares", 101, "from 1 to 100"),
    ("tdm_shares", 2.5, "whole number"),
    ("tdm_shares", "0.1", "whole number"),
    ("tdm_shares", "1e999", "whole number"),
    ("tdm_shares", True, "whole number"),
    ("tdm_shares", float("nan"), "whole number"),
    ("health_recovery_checks", 0, "from 1 to 1000"),
    ("metrics_port", 65536, "from 0 to 65535"),
    ("metrics_port", -1, "from 0 to 65535"),
    ("mig_models", "A100", "list"),
    ("mig_models", ["A100", ""], "non-empty strings"),
    ("ignored_ids", [1], "non-empty strings"),
    ("xid_ignore", ["x"], "whole numbers"),
    ("xid_ignore", [-1], "from 0"),
    ("reconcile", "true", "true or false"),
    ("nvml_enrich", 1, "true or false"),
    ("group_by", "numa nodes", "topology level name"),
    ("group_by", "1abc", "topology level name"),
    ("data_dir", "x" * 5000, "at most 4096"),
    ("xdm_socket", "/tmp/a\x00b", "NUL"),
    ("nomad_address", {"a": 1}, "not a string"),
]


@pytest.mark.parametrize(("name", "value", "allowed"), BAD_VALUES)
def test_bad_value_names_option_value_and_what_is_allowed(name: str, value: object, allowed: str) -> None:
    message = rejected(full_object(**{name: value}))
    assert f'"{name}' in message
    assert allowed in message
    assert len(message) < 600  # huge values are truncated


def test_every_option_rejects_a_wrong_type() -> None:
    wrong = {
        "string": 12,
        "number": "twelve",
        "bool": "yes",
        "list(string)": "x",
        "list(number)": {"a": 1},
        "list(map(string))": "x",
    }
    for opt in OPTIONS:
        message = rejected(full_object(**{opt.name: wrong[opt.hcl_type]}))
        assert f'"{opt.name}"' in message, message


def test_secret_value_is_masked_in_errors() -> None:
    token = "abcd-secret-token-value-1234"
    message = rejected(full_object(nomad_token=[token]))
    assert token not in message and "<redacted>" in message and "nomad_token" in message
    assert secret_values(decode({"nomad_token": token})) == [token]


def test_extension_types_are_rejected_with_the_option_name() -> None:
    unknown = msgpack.ExtType(0, b"\x00")  # cty's plain unknown value
    assert "unknown value" in rejected(full_object(backend=unknown))
    assert "extension type 12" in rejected(full_object(data_dir=msgpack.ExtType(12, b"\x80")))
    assert "backend" in rejected({"backend": msgpack.Timestamp(1, 0)})


def test_garbage_bytes_and_trailing_data_are_rejected() -> None:
    for data in (b"\xc1", b"\x81", b"\xff\xff\xff", msgpack.packb({}) + b"\x00", b"\xa2\xff\xfe"):
        with pytest.raises(ConfigError, match="not one valid msgpack value"):
            decode_config(data)


def test_non_map_root_and_unknown_keys_are_rejected() -> None:
    assert "not a map" in rejected([1, 2])
    assert "not a map" in rejected("backend")
    message = rejected({"bakend": "xdm"})
    assert "'bakend'" in message and "backend" in message
    assert "unknown option" in rejected({1: 2})


def test_deep_nesting_and_huge_inputs_are_rejected() -> None:
    deep = b"\x81" + msgpack.packb("ignored_ids") + b"\x91" * 900 + b"\xc0"
    with pytest.raises(ConfigError, match="ignored_ids"):
        decode_config(deep)
    with pytest.raises(ConfigError, match="not one valid msgpack value"):
        decode_config(b"\x91" * 100_000 + b"\xc0")
    with pytest.raises(ConfigError, match="at most"):
        decode_config(msgpack.packb({"data_dir": "x" * (2 << 20)}))
    with pytest.raises(ConfigError, match="ignored_ids"):
        decode({"ignored_ids": ["a"] * 5000})


def test_card_blocks() -> None:
    cfg = decode(
        full_object(
            card=[
                {"match": "3", "mode": "tdm", "shares": 4, "share_percent": None},
                {"match": "GPU-1", "mode": "tdm", "shares": None, "share_percent": 25},
                {"match": "NVIDIA A100-SXM4-80GB", "mode": "mig", "shares": None, "share_percent": None},
                {"match": "3", "mode": "tdm", "shares": 4, "share_percent": 0},
            ]
        )
    )
    assert cfg.cards[0] == CardRule(match="3", mode="tdm", shares=4, share_percent=0)
    assert cfg.cards[1].share_percent == 25
    assert cfg.cards[2].mode == "mig"


@pytest.mark.parametrize(
    ("cards", "expected"),
    [
        ([{"mode": "tdm"}], "card[0].match"),
        ([{"match": "  "}], "is empty"),
        ([{"match": "1", "shares": 2, "share_percent": 50}], "at most one of them"),
        ([{"match": "1", "share_percent": 30}], "does not divide 100"),
        ([{"match": "1", "mode": "tdm"}, {"match": "1", "mode": "whole"}], "one mode per match"),
        ([{"match": "1", "mode": "fast"}], "card[0].mode"),
        ([{"match": "1", "shares": 101}], "card[0].shares"),
        ([{"match": "1", "colour": "red"}], "card[0]: unknown option 'colour'"),
        (["x"], "card[0]"),
        ({"match": "1"}, '"card"'),
    ],
)
def test_bad_card_blocks(cards: object, expected: str) -> None:
    assert expected in rejected({CARD_BLOCK: cards})


def test_decoding_is_deterministic_for_repeated_set_config() -> None:
    data = msgpack.packb(full_object(tdm_shares=3, card=[{"match": "0", "mode": "tdm"}]))
    first = decode_config(data)
    assert all(decode_config(data) == first for _ in range(3))
    assert dataclasses.replace(first) == first


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)
_option_names = st.sampled_from([opt.name for opt in OPTIONS] + [CARD_BLOCK, "bogus"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_option_names, _values, max_size=6))
def test_structured_input_only_ever_raises_config_error(obj: dict[str, object]) -> None:
    try:
        decode_config(msgpack.packb(obj, use_bin_type=True))
    except ConfigError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_only_ever_raise_config_error(data: bytes) -> None:
    try:
        decode_config(data)
    except ConfigError:
        pass


DURATION = 'a Go duration such as "500ms", "30s", "1m30s" or "1h"'
STRINGS = "a list of at most 1024 non-empty strings"

# Every rejection site, with the whole message: option, shown value, problem and what is allowed.
EXACT_MESSAGES = [
    ({"reconcile": "true"}, "config option \"reconcile\": value 'true' is not a bool; allowed: true or false"),
    (
        {"xdm_call_timeout": "5"},
        f"config option \"xdm_call_timeout\": value '5' is not a Go duration; allowed: {DURATION}",
    ),
    (
        {"xdm_call_timeout": "0s"},
        f"config option \"xdm_call_timeout\": value '0s' is out of range; allowed: {DURATION}, > 0 and at most 30 days",
    ),
    (
        {"health_recovery_delay": "-1s"},
        f"config option \"health_recovery_delay\": value '-1s' is out of range; allowed: {DURATION}, >= 0 and at most 30 days",
    ),
    ({"mig_models": "A100"}, f"config option \"mig_models\": value 'A100' is not a list; allowed: {STRINGS}"),
    (
        {"mig_models": ["x"] * 1025},
        f"config option \"mig_models\": value ['x', 'x', 'x', 'x', ...] has 1025 entries; allowed: {STRINGS}",
    ),
    (
        {"mig_models": ["A100", ""]},
        f"config option \"mig_models[1]\": value '' is not a non-empty string; allowed: {STRINGS}",
    ),
    (
        {"xid_ignore": [5, 2**31]},
        'config option "xid_ignore[1]": value 2147483648 is not valid; '
        "allowed: a list of at most 1024 whole numbers from 0 to 2147483647",
    ),
    (
        {"group_by": "numa nodes"},
        "config option \"group_by\": value 'numa nodes' is not a level name; "
        'allowed: "none" or a topology level name such as "numaNodes" or "pcieSwitches"',
    ),
    ({"backend": True}, 'config option "backend": value true is not a string; allowed: "auto" or "xdm" or "nvml"'),
    ({"backend": False}, 'config option "backend": value false is not a string; allowed: "auto" or "xdm" or "nvml"'),
    (
        {CARD_BLOCK: [{"match": " "}]},
        "config option \"card[0].match\": value ' ' is empty; allowed: a card minor, a card UUID or a model name",
    ),
    (
        {CARD_BLOCK: [{"match": "1", "shares": 2, "share_percent": 50}]},
        "card[0]: shares = 2 and share_percent = 50 are both set; allowed: at most one of them",
    ),
    (
        {CARD_BLOCK: [{"match": "1", "share_percent": 30}]},
        'config option "card[0].share_percent": value 30 does not divide 100; '
        "allowed: a divisor of 100 (1, 2, 4, 5, 10, 20, 25, 50, 100)",
    ),
]


@pytest.mark.parametrize(("obj", "message"), EXACT_MESSAGES)
def test_rejection_messages_in_full(obj: dict[str, object], message: str) -> None:
    assert rejected(obj) == message


def test_limits_are_inclusive() -> None:
    """The documented maxima and minima are themselves accepted."""
    cfg = decode(
        {
            "mig_models": ["m"] * 1024,
            "ignored_ids": ["i" * 4096],
            "xid_ignore": [0, 2**31 - 1],
            "release_grace_period": "720h",
            "health_recovery_delay": "0s",
        }
    )
    assert len(cfg.mig_models) == 1024 and cfg.ignored_ids == ("i" * 4096,)
    assert cfg.xid_ignore == (0, 2**31 - 1)
    assert (cfg.release_grace_period, cfg.health_recovery_delay) == (720 * 3600.0, 0.0)
    assert "ignored_ids[0]" in rejected({"ignored_ids": ["i" * 4097]})
    assert "release_grace_period" in rejected({"release_grace_period": "720h1s"})


def test_a_short_list_entry_with_a_nul_is_rejected() -> None:
    assert "ignored_ids[0]" in rejected({"ignored_ids": ["a\x00b"]})


def test_show_truncates_and_elides() -> None:
    assert show("x" * 60) == repr("x" * 60)
    assert show("x" * 61) == "'" + "x" * 61 + "...' (61 chars)"
    assert show([[1, 2]]) == "[[1, 2]]"
    assert show([[[1]]]) == "[[[...]]]"
    assert show({"a": [[1]]}) == "{'a': [[...]]}"
    assert show([1, 2, 3, 4, 5]) == "[1, 2, 3, 4, ...]"
    assert show(10**70) == "1" + "0" * 59 + "..."
    capped = show(["y" * 50] * 4)
    assert len(capped) == 123 and capped.endswith("yyy...") and capped.startswith("['yyy")
    exactly_at_cap = "[" + ", ".join([repr("y" * 26)] * 4) + "]"
    assert len(exactly_at_cap) == 120 and show(["y" * 26] * 4) == exactly_at_cap
    assert show("secret", secret=True) == "<redacted>"


NUMBER_1_100 = "allowed: a whole number from 1 to 100"

EXACT_MESSAGES_2 = [
    ({"tdm_shares": 2.5}, f'config option "tdm_shares": value 2.5 is not a whole number; {NUMBER_1_100}'),
    ({"tdm_shares": 101}, f'config option "tdm_shares": value 101 is out of range; {NUMBER_1_100}'),
    ({"tdm_shares": "0.1"}, f"config option \"tdm_shares\": value '0.1' is not a whole number; {NUMBER_1_100}"),
    ({"tdm_shares": "1e999"}, f"config option \"tdm_shares\": value '1e999' is not a whole number; {NUMBER_1_100}"),
    ({"tdm_shares": "1e30"}, f"config option \"tdm_shares\": value '1e30' is out of range; {NUMBER_1_100}"),
    ({"tdm_shares": "1e31"}, f"config option \"tdm_shares\": value '1e31' is not a whole number; {NUMBER_1_100}"),
    ({"tdm_shares": [1]}, f'config option "tdm_shares": value [1] is not a whole number; {NUMBER_1_100}'),
    (
        {CARD_BLOCK: "x"},
        'config option "card": value \'x\' is not a list of blocks; allowed: a list of at most 1024 "card" blocks',
    ),
    (
        {CARD_BLOCK: ["x"]},
        "config option \"card[0]\": value 'x' is not a block; allowed: a block with match, mode, shares, share_percent",
    ),
    (
        {CARD_BLOCK: [{"match": "1", "mode": "tdm"}, {"match": "1", "mode": "whole"}]},
        "card[1]: match '1' already has mode 'tdm' in an earlier card block, here mode 'whole'; "
        "allowed: one mode per match value",
    ),
    ([1, 2], "config: the decoded value [1, 2] is not a map; allowed: a map of option names to values"),
    (
        {"data_dir": "x" * 4097},
        'config option "data_dir": value \'' + "x" * 61 + "...' (4097 chars) is too long or holds a NUL "
        "(max 4096 chars); allowed: a string of at most 4096 characters",
    ),
    (
        {"nomad_token": "s" * 4097},
        'config option "nomad_token": value <redacted> is too long or holds a NUL (max 4096 chars); '
        "allowed: a string of at most 4096 characters",
    ),
    (
        {"log_level": "loud"},
        "config option \"log_level\": value 'loud' is not one of the choices; "
        'allowed: "trace" or "debug" or "info" or "warn" or "error"',
    ),
    (
        {"bakend": "xdm"},
        "config: unknown option 'bakend'; did you mean \"backend\"?; allowed options: "
        + ", ".join(sorted([*[o.name for o in OPTIONS], CARD_BLOCK])),
    ),
]


@pytest.mark.parametrize(("obj", "message"), EXACT_MESSAGES_2)
def test_more_rejection_messages_in_full(obj: object, message: str) -> None:
    assert rejected(obj) == message


def test_number_and_string_limits_are_inclusive() -> None:
    assert decode({"tdm_shares": 100, "metrics_port": 65535}).tdm_shares == 100
    assert decode({"tdm_shares": "0" * 63 + "5"}).tdm_shares == 5  # 64 characters: still parsed
    assert "not a whole number" in rejected({"tdm_shares": "0" * 64 + "5"})
    assert decode({"data_dir": "/" + "d" * 4095}).data_dir == "/" + "d" * 4095
    assert decode({CARD_BLOCK: [{"match": str(i)} for i in range(1024)]}).cards[-1].match == "1023"
    assert "at most 1024" in rejected({CARD_BLOCK: [{"match": str(i)} for i in range(1025)]})


def test_input_of_exactly_the_byte_limit_is_decoded() -> None:
    header = len(msgpack.packb({"data_dir": "x" * 70_000})) - 70_000
    data = msgpack.packb({"data_dir": "x" * (MAX_INPUT_BYTES - header)})
    assert len(data) == MAX_INPUT_BYTES
    with pytest.raises(ConfigError, match="too long"):  # the string is too long, not the input
        decode_config(data)
    with pytest.raises(ConfigError, match=f"allowed: at most {MAX_INPUT_BYTES}"):
        decode_config(msgpack.packb({"data_dir": "x" * (MAX_INPUT_BYTES - header + 1)}))


def test_the_msgpack_error_type_is_named() -> None:
    with pytest.raises(ConfigError, match=r"\(ExtraData\)"):
        decode_config(msgpack.packb({}) + b"\x00")


def test_log_level_is_case_and_space_insensitive() -> None:
    assert decode({"log_level": " WARN "}).log_level == "warn"
    assert decode({"nomad_address": " Http://X "}).nomad_address == " Http://X "  # other strings kept as given


def test_duration_signs_and_parse_errors() -> None:
    assert parse_go_duration("+2s") == 2.0
    assert parse_go_duration("-1.5s") == -1.5
    with pytest.raises(ValueError, match=r"^empty duration$"):
        parse_go_duration("-")
    with pytest.raises(ValueError, match="bad duration 'X5s'"):
        parse_go_duration("X5s")


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "null"),
        ([True, None, False], "[true, null, false]"),
        (msgpack.Timestamp(1, 0), "msgpack timestamp extension"),
        ({"a": 1, "b": 2, "c": 3, "d": 4}, "{'a': 1, 'b': 2, 'c': 3, 'd': 4}"),
        ({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}, "{'a': 1, 'b': 2, 'c': 3, 'd': 4, ...}"),
        ([1, 2, 3, 4], "[1, 2, 3, 4]"),
        ({"k": {"x": 1}}, "{'k': {'x': 1}}"),
        ({"k": [{"x": 1}]}, "{'k': [{...}]}"),
        ([{"a": {}}], "[{'a': {...}}]"),
        (10**59, "1" + "0" * 59),  # 60 characters: shown whole
        (3 + 4j, "a complex"),
        (
            {i: "v" * 30 for i in range(4)},
            "{0: '" + "v" * 30 + "', 1: '" + "v" * 30 + "', 2: '" + "v" * 30 + "', 3: 'vvvv...",
        ),
    ],
)
def test_show_renders_each_kind_of_value(value: object, shown: str) -> None:
    assert show(value) == shown


# --- the newer options: xdm_field_aliases, xdm_schema, fingerprint_period, nomad_address ---------

ALIASES_ALLOWED = "allowed: a map of at most 1024 non-empty strings to non-empty strings"


def test_field_aliases_in_hcl1_list_shape_or_as_a_map_become_sorted_stripped_pairs() -> None:
    assert decode({"xdm_field_aliases": [{"b": "y"}, {" a ": " x "}]}).xdm_field_aliases == (("a", "x"), ("b", "y"))
    assert decode({"xdm_field_aliases": {"b": "y", "a": "x"}}).xdm_field_aliases == (("a", "x"), ("b", "y"))
    assert decode({"xdm_field_aliases": []}).xdm_field_aliases == ()
    many = {f"k{i}": "v" for i in range(1024)}
    assert len(decode({"xdm_field_aliases": many}).xdm_field_aliases) == 1024
    assert decode({"xdm_field_aliases": {"k": "v" * 4096}}).xdm_field_aliases == (("k", "v" * 4096),)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x", "value 'x' is not a map"),
        ([{"a": "x"}, "b"], "value [{'a': 'x'}, 'b'] is not a map"),
        (["a"], "value ['a'] is not a map"),
    ],
)
def test_field_aliases_that_are_no_map_are_refused_in_full(value: object, message: str) -> None:
    assert rejected({"xdm_field_aliases": value}) == f'config option "xdm_field_aliases": {message}; {ALIASES_ALLOWED}'


def test_field_aliases_with_too_many_entries_are_refused_in_full() -> None:
    too_many = {f"k{i}": "v" for i in range(1025)}
    assert rejected({"xdm_field_aliases": too_many}) == (
        "config option \"xdm_field_aliases\": value {'k0': 'v', 'k1': 'v', 'k2': 'v', 'k3': 'v', ...} "
        f"has 1025 entries; {ALIASES_ALLOWED}"
    )


@pytest.mark.parametrize(
    ("aliases", "name", "shown"),
    [
        ({"": "x"}, "xdm_field_aliases['']", "'x'"),
        ({"  ": "x"}, "xdm_field_aliases['  ']", "'x'"),
        ({"a": ""}, "xdm_field_aliases['a']", "''"),
        ({"a": " "}, "xdm_field_aliases['a']", "' '"),
        ({"a": 5}, "xdm_field_aliases['a']", "5"),
        ({"a": "x\x00"}, "xdm_field_aliases['a']", "'x\\x00'"),
        ({"a" * 4097: "x"}, "xdm_field_aliases['" + "a" * 61 + "...' (4097 chars)]", "'x'"),
    ],
)
def test_a_bad_alias_key_or_value_names_its_key(aliases: dict[str, object], name: str, shown: str) -> None:
    assert rejected({"xdm_field_aliases": aliases}) == (
        f'config option "{name}": value {shown} is not a non-empty string; {ALIASES_ALLOWED}'
    )


def test_a_too_long_alias_value_is_refused() -> None:
    message = rejected({"xdm_field_aliases": {"a": "v" * 4097}})
    assert message.startswith("config option \"xdm_field_aliases['a']\": value 'vvv")
    assert message.endswith(f"...' (4097 chars) is not a non-empty string; {ALIASES_ALLOWED}")


SCHEMA_ALLOWED = (
    'allowed: "auto", "reflection", "builtin", or a path to a .proto file, a directory of them or a descriptor set'
)


def test_xdm_schema_empty_or_not_a_string_is_refused_in_full() -> None:
    assert rejected({"xdm_schema": "  "}) == f"config option \"xdm_schema\": value '  ' is empty; {SCHEMA_ALLOWED}"
    assert rejected({"xdm_schema": 5}) == f'config option "xdm_schema": value 5 is not a string; {SCHEMA_ALLOWED}'
    assert decode({"xdm_schema": "/etc/xdm/api.proto"}).xdm_schema == "/etc/xdm/api.proto"


def test_group_by_none_is_accepted() -> None:
    assert decode({"group_by": "none"}).group_by == "none"


def test_fingerprint_period_sets_both_periods_in_seconds() -> None:
    assert decode({}).fingerprint_period == decode({}).inventory_resync_period == 60.0
    empty = decode({"fingerprint_period": "", "inventory_resync_period": "30s"})
    assert (empty.fingerprint_period, empty.inventory_resync_period) == (30.0, 30.0)
    spaced = decode({"fingerprint_period": " 5s "})
    assert (spaced.fingerprint_period, spaced.inventory_resync_period) == (5.0, 5.0)
    same = decode({"fingerprint_period": "5s", "inventory_resync_period": "5000ms"})
    assert (same.fingerprint_period, same.inventory_resync_period) == (5.0, 5.0)
    over_default = decode({"fingerprint_period": "5s", "inventory_resync_period": "1m"})
    assert (over_default.fingerprint_period, over_default.inventory_resync_period) == (5.0, 5.0)


def test_fingerprint_period_and_a_different_resync_period_are_refused_in_full() -> None:
    assert rejected({"fingerprint_period": "10s", "inventory_resync_period": "20s"}) == (
        "config: fingerprint_period = '10s' and inventory_resync_period = '20s' disagree; "
        "allowed: one of them (they are one setting), or both the same duration"
    )


DURATION_ALLOWED = 'allowed: a Go duration such as "500ms", "30s", "1m30s" or "1h"'


def test_a_bad_fingerprint_period_is_refused_under_its_own_name_with_resyncs_rules() -> None:
    assert rejected({"fingerprint_period": "5 minutes"}) == (
        f"config option \"fingerprint_period\": value '5 minutes' is not a Go duration; {DURATION_ALLOWED}"
    )
    assert rejected({"fingerprint_period": "2562048h"}) == (
        f"config option \"fingerprint_period\": value '2562048h' is out of range; {DURATION_ALLOWED}, "
        "within Go's limit of about 292 years"
    )


@pytest.mark.parametrize(
    ("text", "written", "in_use"),
    [("0s", 0.0, 1.0), ("-1s", -1.0, 1.0), ("0", 0.0, 1.0), ("1000h", 3_600_000.0, 3_600_000.0)],
)
def test_fingerprint_period_takes_what_go_parse_duration_takes(text: str, written: float, in_use: float) -> None:
    """nomad-device-nvidia parses it with time.ParseDuration: an agent block that loads it loads this plugin."""
    config = decode({"fingerprint_period": text})
    assert (config.fingerprint_period, config.inventory_resync_period) == (written, in_use)


@pytest.mark.parametrize("name", ["xdm_socket", "config_socket"])
def test_a_relative_socket_path_is_refused_in_full(name: str) -> None:
    assert rejected({name: "run/x.sock"}) == (
        f"config option \"{name}\": value 'run/x.sock' is relative; "
        "allowed: an absolute path such as /run/xdm/dp2mgr.sock"
    )


URL_ALLOWED = 'allowed: a URL such as "http://127.0.0.1:4646", "https://nomad.local:4646" or "unix:///run/nomad.sock"'


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("http://nomad:notaport", "is not a URL"),
        (" http://[::1 ", "is not a URL"),
        ("127.0.0.1:4646", "has no http, https or unix scheme"),
        ("ftp://nomad:4646", "has no http, https or unix scheme"),
        ("unix://relative.sock", "is not unix:// followed by an absolute path"),
        ("unix:relative.sock", "is not unix:// followed by an absolute path"),
        ("unix://host/run/nomad.sock", "is not unix:// followed by an absolute path"),
        ("http://", "names no host"),
        ("https://:4646", "names no host"),
    ],
)
def test_a_bad_nomad_address_is_refused_in_full(address: str, problem: str) -> None:
    assert rejected({"nomad_address": address}) == (
        f'config option "nomad_address": value {address.strip()!r} {problem}; {URL_ALLOWED}'
    )


@pytest.mark.parametrize("address", ["", "  ", "unix:///run/nomad.sock", "https://nomad.local:4646/"])
def test_good_nomad_addresses_are_kept_as_written(address: str) -> None:
    assert decode({"nomad_address": address}).nomad_address == address


# --- data_dir, nomad_node_id, metrics_bind, nomad_token, the Reserve allow lists --------------------
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is empty"),
        ("var/lib/x", "is relative"),
        ("/", "system directory /"),
        ("/etc", "system directory /etc"),
        ("/tmp", "system directory /tmp"),
        ("/var/tmp", "system directory /var/tmp"),
        ("/var/lib", "system directory /var/lib"),
        ("/var/lib/x/../y", "'..'"),
        ("/var/lib/x\n", "control character"),
        ("/var/lib/\x1bx", "control character"),
        ("/dev/shm/x", "kernel or device filesystem"),
        ("/proc/1", "kernel or device filesystem"),
    ],
)
def test_a_data_dir_that_cannot_be_the_plugins_own_is_refused(value: str, problem: str) -> None:
    message = rejected({"data_dir": value})
    assert message.startswith('config option "data_dir": value ') and problem in message, message


def test_a_data_dir_of_the_plugins_own_below_a_system_directory_passes() -> None:
    assert decode({"data_dir": "/var/lib/nomad-device-lingjun"}).data_dir == "/var/lib/nomad-device-lingjun"
    assert decode({"data_dir": "/srv/gpu/journal"}).data_dir == "/srv/gpu/journal"


def test_nomad_node_id_is_a_uuid_or_empty() -> None:
    node = "4C1A2B3D-5E6F-4A7B-8C9D-0E1F2A3B4C5D"
    assert decode({"nomad_node_id": node}).nomad_node_id == node
    assert decode({"nomad_node_id": ""}).nomad_node_id == ""
    for bad in ("node-1", node + " ", node[:-1], "../x"):
        assert "is not a UUID" in rejected({"nomad_node_id": bad})


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0", "::", "::1", "10.1.2.3", "localhost"])
def test_metrics_bind_takes_an_ip_address_or_localhost(bind: str) -> None:
    assert decode({"metrics_bind": bind}).metrics_bind == bind


@pytest.mark.parametrize("bind", ["not an address", "", "127.0.0.1:9100", "node.example.com", "300.1.1.1"])
def test_metrics_bind_that_is_not_an_address_is_refused(bind: str) -> None:
    assert "is not an IP address" in rejected({"metrics_bind": bind})


def test_a_token_loses_a_trailing_newline_and_one_inside_is_refused_unseen() -> None:
    assert decode({"nomad_token": "s3cr3t-token\n"}).nomad_token == "s3cr3t-token"
    assert decode({"nomad_token": "s3cr3t-token\r\n"}).nomad_token == "s3cr3t-token"
    message = rejected({"nomad_token": "s3cr3t\n-token"})
    assert "nomad_token" in message and "control character" in message and "s3cr3t" not in message


def test_the_reserve_allow_lists_are_checked() -> None:
    config = decode({"xdm_env_allow": ["LD_LIBRARY_PATH"], "xdm_mount_allow": ["/run/amp/eKitC"]})
    assert config.xdm_env_allow == ("LD_LIBRARY_PATH",) and config.xdm_mount_allow == ("/run/amp/eKitC",)
    assert "xdm_env_allow[0]" in rejected({"xdm_env_allow": ["LD LIBRARY"]})
    for bad in ("relative", "/", "/run/../etc", "/run/x/"):
        assert "xdm_mount_allow[0]" in rejected({"xdm_mount_allow": [bad]})
    assert decode({"xdm_allocate_timeout": "2m"}).xdm_allocate_timeout == 120.0
    assert "out of range" in rejected({"xdm_allocate_timeout": "0s"})
