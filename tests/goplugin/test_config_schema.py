"""ConfigSchema follows Nomad's hclspec rules; plugin.hcl is the option table's rendering."""

from __future__ import annotations

import json
import subprocess
import sys

import hcl2
import pytest
from goplugin_harness import REPO

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.config.options import (
    CARD_BLOCK,
    CARD_OPTIONS,
    OPTIONS,
    config_spec,
    hcl_literal,
    hcl_string,
    plugin_hcl,
)


def test_root_is_an_object_with_every_option_and_the_card_block_list() -> None:
    spec = config_spec()
    assert spec.WhichOneof("block") == "object"
    assert set(spec.object.attributes) == {opt.name for opt in OPTIONS} | {CARD_BLOCK}
    card = spec.object.attributes[CARD_BLOCK]
    assert card.WhichOneof("block") == "block_list"
    assert card.block_list.name == CARD_BLOCK
    assert set(card.block_list.nested.object.attributes) == {opt.name for opt in CARD_OPTIONS}


@pytest.mark.parametrize("opt", [*OPTIONS, *CARD_OPTIONS], ids=lambda o: o.name)
def test_each_option_is_default_of_named_attr_and_literal(opt: object) -> None:
    spec = config_spec()
    attrs = spec.object.attributes
    if opt in CARD_OPTIONS:
        attrs = attrs[CARD_BLOCK].block_list.nested.object.attributes
    entry = attrs[opt.name]  # type: ignore[attr-defined]
    assert entry.WhichOneof("block") == "default"
    primary, default = entry.default.primary, entry.default.default
    assert primary.WhichOneof("block") == "Attr"
    # Nomad converts a Default's halves with an empty implied name: the Attr must name itself.
    assert primary.Attr.name == opt.name  # type: ignore[attr-defined]
    assert primary.Attr.type == opt.hcl_type  # type: ignore[attr-defined]
    assert default.WhichOneof("block") == "literal"
    literal = default.literal.value
    assert literal == hcl_literal(opt.default)  # type: ignore[attr-defined]
    if isinstance(opt.default, str):  # type: ignore[attr-defined]
        assert literal.startswith('"') and literal.endswith('"')
        assert json.loads(literal) == opt.default  # type: ignore[attr-defined]


def test_literals() -> None:
    assert hcl_literal(True) == "true"
    assert hcl_literal(10) == "10"
    assert hcl_literal([]) == "[]"
    assert hcl_literal(["a", "b"]) == '["a", "b"]'
    assert hcl_literal([13, 31]) == "[13, 31]"
    assert hcl_string('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    assert hcl_string("${x} %{y}") == '"$${x} %%{y}"'
    assert hcl_string("\x08") == '"\\u0008"'


def test_escaped_strings_parse_back_in_hcl() -> None:
    text = 'quote " backslash \\ tab \t end'
    parsed = hcl2.loads(f"x = {hcl_string(text)}\n")["x"]
    assert json.loads(parsed) == text  # python-hcl2 keeps the quoted, escaped form


def test_plugin_hcl_is_the_rendering_and_parses() -> None:
    on_disk = (REPO / "plugin.hcl").read_text()
    assert on_disk == plugin_hcl(), (
        "plugin.hcl is stale: run python -m nomad_plugin.config.options plugin.hcl > plugin.hcl"
    )
    parsed = hcl2.loads(on_disk)
    block = parsed["plugin"][0][f'"{PLUGIN_NAME}"']
    config = block["config"][0]
    for opt in OPTIONS:
        value = config[opt.name]
        if isinstance(opt.default, str):
            assert json.loads(value) == opt.default
        elif isinstance(opt.default, list):
            assert [json.loads(v) if isinstance(v, str) else v for v in value] == opt.default
        else:
            assert value == opt.default
        assert f"# {opt.doc}\n    {opt.name} =" in on_disk
    assert CARD_BLOCK not in config  # only shown commented out
    assert f"# {CARD_BLOCK} {{" in on_disk


def test_render_module_prints_the_file() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nomad_plugin.config.options", "plugin.hcl"], cwd=REPO, capture_output=True, timeout=30
    )
    assert result.returncode == 0
    assert result.stdout.decode() == plugin_hcl()
