"""Agent configuration as Nomad loads it: one file or a directory, HCL or JSON.

``nomad agent -config=/etc/nomad.d`` reads every ``*.hcl`` and ``*.json``
file of the directory in lexical order; a JSON file holds the same blocks
as HCL (``{"plugin": {"<name>": {"config": {...}}}}``, or HCL's JSON form
with lists of objects). This module finds the plugin blocks in such a
source and hands back the named block's ``config`` as plain values, so the
operator tools read the configuration the agent would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomad_plugin import PLUGIN_NAME
from nomad_plugin.launcher.agent_hcl import AgentSyntaxError, PluginBlock, parse_agent_text
from nomad_plugin.launcher.config import LauncherConfigError, _plain_config

AGENT_SUFFIXES = (".hcl", ".json")


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


def _json_plugin_bodies(data: Any) -> list[tuple[str, dict[str, Any]]]:
    """``plugin`` blocks of a JSON agent file, plain map or HCL-JSON list form."""
    found: list[tuple[str, dict[str, Any]]] = []
    docs = data if isinstance(data, list) else [data]
    for doc in docs:
        plugins = doc.get("plugin") if isinstance(doc, dict) else None
        for item in plugins if isinstance(plugins, list) else [plugins]:
            if not isinstance(item, dict):
                continue
            for label, body in item.items():
                for one in body if isinstance(body, list) else [body]:
                    if isinstance(one, dict):
                        config = one.get("config", {})
                        if isinstance(config, list):
                            config = config[0] if len(config) == 1 and isinstance(config[0], dict) else config
                        found.append((str(label), {"config": [config] if isinstance(config, dict) else config}))
    return found


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise LauncherConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise LauncherConfigError(f"{path} is not valid HCL: not UTF-8 text ({exc.reason})") from None


def _file_plugin_blocks(path: Path) -> list[PluginBlock]:
    text = _read_text(path)
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise LauncherConfigError(f"{path} is not valid JSON: {exc}") from None
        found = []
        for label, body in _json_plugin_bodies(data):
            configs = [c for c in body.get("config", []) if isinstance(c, dict)]
            merged: dict[str, Any] = {}
            for config in configs:
                merged.update(config)
            found.append(PluginBlock(label, config=merged, config_blocks=len(configs)))
        return found
    try:
        return parse_agent_text(text, str(path)).plugins
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
    one with a non-empty config (nomad/structs/config PluginConfigSetMerge)."""
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
    if file.suffix == ".json":
        return _plain_config(block.config, str(file))
    return agent_config_values(block.config, str(file))


def agent_config_values(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The values after the agent's HCL v2 JSON decoding: ``$${`` and ``%%{`` lose their escape."""
    return {key: _untemplate(value) for key, value in config.items()}


def _untemplate(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("$${", "${").replace("%%{", "%{")
    if isinstance(value, list):
        return [_untemplate(v) for v in value]
    if isinstance(value, dict):
        return {k: _untemplate(v) for k, v in value.items()}
    return value
