"""SetConfig msgpack: any bytes, any msgpack value, any value for a real option -> a config or a ConfigError naming it."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nomad_plugin.config.options import OPTIONS
from tests.fuzz.checks import check_config
from tests.fuzz.strategies import DEADLINE, EXAMPLES, msgpack_values, mutated

OPTION_NAMES = [opt.name for opt in OPTIONS] + ["card"]
VALID = msgpack.packb(
    {"backend": "xdm", "tdm_shares": 4, "release_grace_period": "30s", "card": [{"match": "0", "mode": "tdm"}]}
)


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(st.binary(max_size=300))
@example(b"\xc1")  # the one byte msgpack never uses
@example(b"\xd4\x05\x00")  # a bare ExtType
@example(b"\x81\xa7backend\xd4\x05\x00")  # {"backend": ExtType(5, b"\0")}
def test_random_bytes(data):
    check_config(data)


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(msgpack_values)
def test_random_msgpack_values(value):
    check_config(msgpack.packb(value, use_bin_type=True))


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(st.sampled_from(OPTION_NAMES), msgpack_values)
@example("card", [{"": None}])  # found by this property: card-block errors start with "card[0]:"
def test_any_value_for_a_real_option_is_refused_by_name(name, value):
    check_config(msgpack.packb({name: value}, use_bin_type=True), option=name)


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(mutated(VALID))
def test_mutated_valid_config(data):
    check_config(data)


@pytest.mark.parametrize(
    "value",
    [
        {"xdm_socket": "x" * 2_000_000},  # huge string
        {"nomad_token": "s" * 70_000},  # huge secret
        {"card": [{"match": "0"}] * 5000},  # many blocks
        {"ignored_ids": ["GPU-1"] * 100_000},
        {"log_level": msgpack.ExtType(1, b"x" * 1000)},
        {"nomad_address": msgpack.Timestamp(0)},
        {"tdm_shares": 2**64 - 1},
        {"tdm_shares": -(2**63)},
        {"release_grace_period": float("nan")},
        {"release_grace_period": "9999999999999999999h"},
        {b"backend": "xdm"},
        {1: 2},
    ],
    ids=lambda v: str(next(iter(v)))[:20],
)
def test_hostile_shapes(value):
    check_config(msgpack.packb(value, use_bin_type=True, datetime=False))


@pytest.mark.parametrize("depth", [100, 600, 5000])
def test_deep_nesting(depth):
    # Nested one-element arrays straight on the wire (the packer itself stops at 512 levels).
    check_config(b"\x81\xa4card" + b"\x91" * depth + b"\xc0")
    check_config(b"\x91" * depth + b"\xc0")
    check_config(b"\x81\xa1a" * depth + b"\xc0")  # nested maps


def test_secret_never_echoed():
    from nomad_plugin.config.decode import decode_config
    from nomad_plugin.config.model import ConfigError

    with pytest.raises(ConfigError) as err:
        decode_config(msgpack.packb({"nomad_token": ["s3cr3t-token-value"]}))
    assert "s3cr3t" not in str(err.value) and "nomad_token" in str(err.value)
