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
from nomad_plugin.launcher.config import LauncherConfigError, _plain_config, read_agent_file
from nomad_plugin.util.hclvalue import labelled, unlabelled

AGENT_SUFFIXES = (".hcl", ".json")


@dataclass
class PluginBlocks:
    """Every ``plugin`` block found: label -> (file, raw body), in load order."""

    files: list[Path] = field(default_factory=list)
    blocks: dict[str, list[tuple[Path, dict[str, Any]]]] = field(default_factory=dict)

    def names(self) -> list[str]:
        return sorted(self.blocks)


def agent_files(path: str | Path) -> list[Path]:
    """The files Nomad reads for ``-config=path``: the file, or a directory's *.hcl/*.json (sorted)."""
    source = Path(path)
    if source.is_dir():
        return sorted(p for p in source.iterdir() if p.is_file() and p.suffix in AGENT_SUFFIXES)
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


def _file_plugin_bodies(path: Path) -> list[tuple[str, dict[str, Any]]]:
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise LauncherConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise LauncherConfigError(f"{path} is not valid JSON: {exc}") from None
        return _json_plugin_bodies(data)
    return [(label, body) for label, body in labelled(read_agent_file(path).get("plugin", []))]


def find_plugin_blocks(path: str | Path) -> PluginBlocks:
    """All plugin blocks under ``path`` (a file or an agent config directory)."""
    result = PluginBlocks(files=agent_files(path))
    if not result.files:
        raise LauncherConfigError(f"{path}: no *.hcl or *.json file (Nomad reads only those from a directory)")
    for file in result.files:
        for label, body in _file_plugin_bodies(file):
            result.blocks.setdefault(label, []).append((file, body))
    return result


def plugin_user_config(blocks: PluginBlocks, source: str | Path, name: str = PLUGIN_NAME) -> dict[str, Any]:
    """The user-written config of ``plugin "<name>"``; LauncherConfigError if missing or doubled."""
    found = blocks.blocks.get(name, [])
    if not found:
        names = ", ".join(repr(n) for n in blocks.names()) or "none"
        raise LauncherConfigError(f'{source}: no plugin "{name}" block (plugin blocks found: {names})')
    if len(found) > 1:
        where = ", ".join(str(f) for f, _ in found)
        raise LauncherConfigError(f'{source}: plugin "{name}" is defined {len(found)} times ({where}); allowed: once')
    file, body = found[0]
    configs = unlabelled(body.get("config", []))
    if len(configs) > 1:
        raise LauncherConfigError(f'{file}: plugin "{name}" has {len(configs)} config blocks; allowed: one')
    return _plain_config(configs[0] if configs else {}, str(file))
