"""The node metadata the plugin publishes for job-level placement (pure; keys in docs/topology.md).

Nomad evaluates ``constraint``, ``affinity`` and ``spread`` outside a
``device`` block on node attributes and meta only, so XDM's network topology
must become node meta for a job to say "all my allocations in one point of
delivery". The publisher (``reconcile/node_meta.py``) and ``nomad-device-lingjun
node-meta`` both call :func:`node_meta`, so the two never disagree. Only the
cards the plugin offers count. Nomad refuses a key that is not a dotted HCL
identifier, so a level name that cannot become one is left out and reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.model.card import NODE_RUNTIME_KIT, Card, Inventory, offered_cards

#: The summary keys (after the prefix); a topology level of the same name is left out.
MODEL_KEY = "model"
CARD_COUNT_KEY = "card_count"
RUNTIME_KIT_KEY = "runtime_kit"
SUMMARY_KEYS = (MODEL_KEY, CARD_COUNT_KEY, RUNTIME_KIT_KEY)

_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]*")
_WORD_BOUNDARY = (re.compile(r"([a-z0-9])([A-Z])"), re.compile(r"([A-Z]+)([A-Z][a-z])"))


def level_key(name: str) -> str:
    """XDM's level name in snake_case: ``pointOfDelivery`` -> ``point_of_delivery``; "" if it cannot be a key."""
    text = name.strip()
    for pattern in _WORD_BOUNDARY:
        text = pattern.sub(r"\1_\2", text)
    text = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()
    return text if _IDENTIFIER.fullmatch(text) else ""


def joined(values: Iterable[str]) -> str:
    """One value for all cards: the shared value, or the sorted distinct values joined by ``,``."""
    return ",".join(sorted({v.strip() for v in values if v.strip()}))


@dataclass(frozen=True)
class NodeMeta:
    """The keys to publish (full names, prefix included) and what had to be left out, and why."""

    keys: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    #: Whether any card carries a topology level. When none does, the inventory says nothing about
    #: the topology (XDM's first ListAndWatch push, which carries it, has not come yet): the
    #: publisher then keeps the level keys it finds instead of unsetting them.
    topology_known: bool = True


def topology_values(cards: Iterable[Card]) -> tuple[dict[str, str], list[str]]:
    """Snake-case level name -> joined value, for every string level of ``cards``; plus problems."""
    values: dict[str, set[str]] = {}
    names: dict[str, set[str]] = {}
    problems: list[str] = []
    for card in cards:
        for level in card.topology.levels:
            if not isinstance(level.domain, str) or not level.domain.strip():
                continue
            key = level_key(level.name)
            if not key:
                problems.append(f"topology level {level.name!r} cannot be a Nomad meta key; left out")
                continue
            values.setdefault(key, set()).add(level.domain)
            names.setdefault(key, set()).add(level.name)
    for key, spelled in names.items():
        if len(spelled) > 1:
            problems.append(f"topology levels {', '.join(sorted(spelled))} share the meta key {key!r}; values merged")
    return {key: joined(found) for key, found in sorted(values.items())}, sorted(set(problems))


def node_meta(inventory: Inventory, config: PluginConfig) -> NodeMeta:
    """The prefixed keys for this inventory (see the module docstring)."""
    cards, _ = offered_cards(inventory, config)
    prefix = config.node_meta_prefix
    levels, problems = topology_values(cards)
    out: dict[str, str] = {}
    for key, value in levels.items():
        if key in SUMMARY_KEYS:
            problems.append(f"topology level {key!r} would hide the summary key {prefix}{key}; left out")
            continue
        out[prefix + key] = value
    models = joined(card.model_name for card in cards)
    if models:
        out[prefix + MODEL_KEY] = models
    out[prefix + CARD_COUNT_KEY] = str(len(cards))
    status = inventory.node.get(NODE_RUNTIME_KIT, "").strip()
    if status:
        out[prefix + RUNTIME_KIT_KEY] = status
    known = any(card.topology.levels for card in cards)
    return NodeMeta(dict(sorted(out.items())), tuple(problems), known)


def meta_changes(
    wanted: Mapping[str, str], current: Mapping[str, str], prefix: str, *, topology_known: bool = True
) -> dict[str, str | None]:
    """The smallest update from ``current`` (the node's merged Meta) to ``wanted``.

    A key is sent when its value differs; a key under ``prefix`` that is no
    longer wanted is sent as None (Nomad unsets it), except a level key while
    the topology is not known. Keys outside ``prefix`` are never part of the answer.
    """
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    summary = {prefix + key for key in SUMMARY_KEYS}
    for key in current:
        if key.startswith(prefix) and key not in wanted and (topology_known or key in summary):
            changes[key] = None
    return dict(sorted(changes.items()))


def client_meta_block(keys: Mapping[str, str]) -> str:
    """The keys as the agent configuration's ``client { meta = { } }`` (HCL).

    Written as a map assignment with quoted keys, the form Nomad's own agent
    tests use for dotted keys (command/agent/command_test.go,
    TestCommand_MetaConfigValidation): Nomad's agent config (HCL1) reads it
    like a ``meta { }`` block, and HCL2 parsers (python-hcl2, which this
    project's operator tools read agent files with) accept it too, where they
    refuse a quoted name in block form.
    """
    width = max((len(k) + 2 for k in keys), default=0)
    lines = ["client {", "  meta = {"]
    for key, value in keys.items():
        lines.append(f"    {_quoted(key):<{width}} = {_quoted(value)}")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
