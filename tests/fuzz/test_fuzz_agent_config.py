"""Agent config files of arbitrary shape through doctor's config path (nomad_plugin/launcher/config.py,
the schema's conversions, SetConfig's checks): each ends in a named refusal or a config, never in
another exception."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nomad_plugin.backend_select import accept_config
from nomad_plugin.config.model import ConfigError
from nomad_plugin.launcher.config import (
    AgentSyntaxError,
    LauncherConfigError,
    agent_config_values,
    full_config,
    msgpack_config,
    read_agent_text,
)

TOKENS = (
    "plugin", '"nomad-device-lingjun"', "{", "}", "config", "card", "=", '"x"', '"tdm"', "tdm", "1", "010",
    "0x1", "-", "4.5", "1e3", "[", "]", ",", "\n", "<<EOF\nabc\nEOF\n", "<<-EOF\n  a\n  EOF\n", '"${x}"',
    '"$${x}"', '"%{ if true }x%{ endif }"', "null", "true", "(", ")", ":", '"a\\u00e9"', '"\\q"', "#c\n",
    "/*", "*/", '"k" =', "default_mode", "tdm_shares", "enabled", "ignored_ids", "xdm_field_aliases",
    '"0"', '"true"', "+", ".", '"', "'", "match", "mode", "args", '"share"', "xid_ignore",
)  # fmt: skip


def _config_path(text: str) -> None:
    try:
        blocks = read_agent_text(text, "agent.hcl").plugins
    except AgentSyntaxError:
        return
    for block in blocks:
        try:
            user = agent_config_values(block.config)
            accept_config(msgpack_config(full_config(user, {"data_dir": "/nonexistent/fuzz"})))
        except (LauncherConfigError, ConfigError):
            pass


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=30))
def test_inside_a_plugin_block(tokens: list[str]) -> None:
    _config_path('plugin "nomad-device-lingjun" {\n  config {\n' + " ".join(tokens) + "\n  }\n}\n")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=30))
def test_anywhere_in_the_file(tokens: list[str]) -> None:
    _config_path(" ".join(tokens))
