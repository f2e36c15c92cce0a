"""Hypothesis strategies shared by the fuzz suite: msgpack values, JSON values, byte mutations."""

from __future__ import annotations

import msgpack
from hypothesis import strategies as st

#: One budget for every fuzz property: the whole suite stays under 60 s on 2 cores.
EXAMPLES = 150
DEADLINE = None  # a slow example is not a failure here; hangs are caught by pytest-timeout

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.binary(max_size=40),
    st.builds(msgpack.ExtType, st.integers(min_value=0, max_value=127), st.binary(max_size=16)),
)

msgpack_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(
            st.one_of(st.text(max_size=20), st.integers(min_value=-(2**63), max_value=2**64 - 1)), inner, max_size=6
        ),
    ),
    max_leaves=30,
)

json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30)
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=15), inner, max_size=5)),
    max_leaves=25,
)


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    """``seed`` with a few byte flips, inserts, deletions, truncation or duplication."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        op = draw(st.sampled_from(("flip", "insert", "delete", "truncate", "dup", "set")))
        pos = draw(st.integers(min_value=0, max_value=max(0, len(data))))
        if op == "flip" and data:
            i = min(pos, len(data) - 1)
            data[i] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "set" and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(min_value=0, max_value=255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[pos : pos + draw(st.integers(min_value=1, max_value=8))]
        elif op == "truncate":
            del data[pos:]
        elif op == "dup" and data:
            chunk = data[pos : pos + draw(st.integers(min_value=1, max_value=16))]
            data[pos:pos] = chunk
    return bytes(data)
