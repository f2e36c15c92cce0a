"""ConfigSchema: the hclspec Nomad decodes our ``config { }`` block with.

Built from the option table by Nomad's conversion rules (nomad-protocol.md
§4.2): the root is an ``Object`` (Nomad HEAD requires an object at the root);
each option is ``Default(primary=Attr(name, type), default=Literal(value))``
because hcldec converts both halves of a Default with an empty implied name,
so the Attr must carry its own name; ``Literal.value`` is an HCL expression,
so strings are quoted and escaped. ``card`` blocks are a ``BlockList`` whose
nested Object holds the card options.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from nomad_plugin._proto.nomad import hcl_spec_pb2
from nomad_plugin.config.options import CARD_BLOCK, CARD_OPTIONS, OPTIONS, Option

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def hcl_string(text: str) -> str:
    """A quoted HCL string literal using only the escapes HCL knows."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    # "${" and "%{" would start template sequences inside an HCL string.
    return '"' + "".join(out).replace("${", "$${").replace("%{", "%%{") + '"'


def hcl_literal(value: Any) -> str:
    """An HCL expression for a default value: string, number, bool, or a list or map of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"no HCL literal for {value!r}")
        return repr(value)
    if isinstance(value, str):
        return hcl_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(hcl_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{hcl_string(str(k))} = {hcl_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no HCL literal for {type(value).__name__} {value!r}")


def option_spec(opt: Option) -> hcl_spec_pb2.Spec:
    return hcl_spec_pb2.Spec(
        default=hcl_spec_pb2.Default(
            primary=hcl_spec_pb2.Spec(Attr=hcl_spec_pb2.Attr(name=opt.name, type=opt.hcl_type)),
            default=hcl_spec_pb2.Spec(literal=hcl_spec_pb2.Literal(value=hcl_literal(opt.default))),
        )
    )


def object_spec(options: tuple[Option, ...]) -> hcl_spec_pb2.Spec:
    return hcl_spec_pb2.Spec(object=hcl_spec_pb2.Object(attributes={opt.name: option_spec(opt) for opt in options}))


@lru_cache(maxsize=1)
def config_spec() -> hcl_spec_pb2.Spec:
    """The root spec returned by ConfigSchema (built once per process)."""
    root = object_spec(OPTIONS)
    root.object.attributes[CARD_BLOCK].CopyFrom(
        hcl_spec_pb2.Spec(block_list=hcl_spec_pb2.BlockList(name=CARD_BLOCK, nested=object_spec(CARD_OPTIONS)))
    )
    return root
