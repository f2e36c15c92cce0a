"""What check-job knows of this node's values, and Nomad's ``resolveTarget`` over them.

Nomad resolves a job-, group- or task-level target on the node
(``scheduler/feasible/feasible.go`` ``resolveTarget``): a text without
``${`` is a literal; ``${node.unique.id}``, ``${node.datacenter}``,
``${node.unique.name}``, ``${node.class}`` and ``${node.pool}`` are the
node's fields (always found, even when empty); ``${attr.<k>}`` and
``${meta.<k>}`` are looked up in its attributes and meta (not found when
absent); anything else (``${device.*}`` outside a device block included) is
not found.

check-job knows some of these and not others, and never guesses:

- the node as Nomad's servers hold it, from a file (``nomad node status
  -self -json``, ``GET /v1/node/<id>``) or the local agent: fields,
  attributes, meta;
- the plugin's own meta keys (``node_meta_prefix``), computed from the same
  inventory as the fingerprint (``model/card.py``). When the plugin
  publishes them (``node_meta = true``) they are the node's values under the
  prefix, whatever the servers hold now (the plugin writes them; Nomad sees
  them within about 10 s), except level keys while no card carries a
  topology (the plugin then keeps what the node has);
- values the operator states (``--node-value meta.rack=r1``).

Anything else is unknown, and the answer says what would make it known.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: ``${node.<field>}`` targets Nomad resolves, and the node JSON field each reads.
NODE_FIELDS = {
    "${node.unique.id}": "ID",
    "${node.datacenter}": "Datacenter",
    "${node.unique.name}": "Name",
    "${node.class}": "NodeClass",
    "${node.pool}": "NodePool",
}
SUMMARY_KEYS = ("model", "card_count", "runtime_kit")  # model/card.py's summary keys (after the prefix)
#: How to make a value known, by kind of value.
HINT_NODE = "--node FILE (`nomad node status -self -json > FILE` on this node) or --agent"
HINT_STATE = "--node-value {kind}=VALUE"
HINT_PUBLISH = "--set node_meta=true (as if the plugin published its keys)"


class NodeFileError(ValueError):
    """A node document that is not Nomad's node JSON."""


@dataclass(frozen=True)
class PluginKeys:
    """The plugin's node meta keys for this inventory, and whether the plugin publishes them."""

    keys: Mapping[str, str]
    prefix: str = "lingjun."
    publishes: bool = False  # node_meta = true
    topology_known: bool = True
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "node_meta": self.publishes,
            "prefix": self.prefix,
            "keys": dict(self.keys),
            "topology_known": self.topology_known,
            "problems": list(self.problems),
        }

    @classmethod
    def from_json(cls, doc: Any) -> PluginKeys:
        """The ``plugin_keys`` section of a saved fingerprint; NodeFileError when it is not one."""
        if not isinstance(doc, dict):
            raise NodeFileError("plugin_keys is not an object")
        keys, prefix = doc.get("keys"), doc.get("prefix")
        if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items()):
            raise NodeFileError("plugin_keys.keys is not an object of strings")
        if not isinstance(prefix, str) or not isinstance(doc.get("node_meta"), bool):
            raise NodeFileError("plugin_keys needs a string prefix and a bool node_meta")
        problems = doc.get("problems", [])
        return cls(
            dict(keys),
            prefix,
            bool(doc["node_meta"]),
            doc.get("topology_known") is not False,
            tuple(str(p) for p in problems) if isinstance(problems, list) else (),
        )


@dataclass(frozen=True)
class NodeDocument:
    """This node as Nomad's servers hold it: the fields targets read, attributes and meta."""

    fields: Mapping[str, str]  # target -> value, for NODE_FIELDS
    attributes: Mapping[str, str]
    meta: Mapping[str, str]
    source: str


def node_from_json(doc: Any, source: str) -> NodeDocument:
    """Nomad's node JSON (``GET /v1/node/<id>``, ``nomad node status -json``); NodeFileError when it is not."""
    if isinstance(doc, list) and len(doc) == 1:
        doc = doc[0]  # `nomad node status -json` without an ID prints a list
    if not isinstance(doc, dict):
        raise NodeFileError(f"{source}: not a Nomad node (a JSON object with ID, Attributes and Meta)")
    if "Attributes" not in doc and "ID" in doc:
        raise NodeFileError(
            f"{source}: a node without Attributes (a node list stub?): save one node, "
            "`nomad node status -self -json` or `nomad node status -json <id>`"
        )
    maps: dict[str, dict[str, str]] = {}
    for key in ("Attributes", "Meta"):
        value = doc.get(key)
        if value is None and key == "Meta":
            value = {}
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise NodeFileError(f"{source}: {key} is not an object of strings (is it a Nomad node?)")
        maps[key] = dict(value)
    if not isinstance(doc.get("ID"), str):
        raise NodeFileError(f"{source}: ID is not a string (is it a Nomad node?)")
    fields = {}
    for target, key in NODE_FIELDS.items():
        value = doc.get(key, "")
        fields[target] = value if isinstance(value, str) else ""
    return NodeDocument(fields, maps["Attributes"], maps["Meta"], source)


@dataclass(frozen=True)
class Resolved:
    """One side of a node-level rule: a value (None: Nomad does not find it), or unknown to check-job."""

    value: str | None
    known: bool = True
    origin: str = ""  # where the value comes from, when it is not a literal
    why_unknown: str = ""
    remark: str = ""  # something the author should know (a stale copy, a value about to change)
    hints: tuple[str, ...] = ()  # what would make an unknown value known

    def shown(self, target: str) -> str:
        if not self.known:
            return "unknown"
        if self.value is None:
            return "not set" if target.startswith("${") else repr(target)
        return repr(self.value)


@dataclass(frozen=True)
class NodeValues:
    node: NodeDocument | None = None
    plugin: PluginKeys | None = None
    plugin_why: str = ""  # why the plugin's keys are not known, when they are not
    stated: Mapping[str, str] = field(default_factory=dict)  # "meta.rack" -> "r1" (--node-value)
    node_why: str = ""  # why the node document is not known (the agent did not answer, ...)

    def describe(self) -> list[str]:
        """Where the node's values come from, one line each."""
        lines = []
        if self.node is not None:
            lines.append(f"node fields, attributes and meta: {self.node.source}")
        else:
            lines.append(f"node fields, attributes and meta: not known ({self.node_why or 'no --node or --agent'})")
        if self.plugin is not None:
            how = (
                "published by the plugin (node_meta = true)"
                if self.plugin.publishes
                else "computed, but not published (node_meta = false)"
            )
            lines.append(f"the plugin's keys ({self.plugin.prefix}*): {how}")
        elif self.plugin_why:
            lines.append(f"the plugin's keys: unknown ({self.plugin_why})")
        if self.stated:
            lines.append("stated with --node-value: " + ", ".join(f"{k}={v!r}" for k, v in sorted(self.stated.items())))
        return lines

    def resolve(self, target: str) -> Resolved:
        """``resolveTarget`` with what check-job knows."""
        if not target.startswith("${"):
            return Resolved(target)
        body = target[2:].removesuffix("}")
        if body in self.stated:
            return Resolved(self.stated[body], origin="--node-value")
        if target in NODE_FIELDS:
            if self.node is not None:
                return Resolved(self.node.fields[target], origin=self.node.source)
            return self._unknown(body, "this node's fields are not known")
        if target.startswith("${attr."):
            key = target[len("${attr.") :].removesuffix("}")
            if self.node is not None:
                return Resolved(self.node.attributes.get(key), origin=self.node.source)
            return self._unknown(f"attr.{key}", "this node's attributes are not known")
        if target.startswith("${meta."):
            return self._meta(target[len("${meta.") :].removesuffix("}"))
        return Resolved(None, origin="Nomad resolves it to nothing outside a device block")

    def _unknown(self, key: str, why: str, publish: bool = False) -> Resolved:
        if self.node_why and not publish:
            why += f" ({self.node_why})"
        kind = "meta.<key>" if key.startswith("meta.") else "attr.<key>" if key.startswith("attr.") else key
        hints = (*((HINT_PUBLISH,) if publish else ()), HINT_NODE, HINT_STATE.format(kind=kind))
        return Resolved(None, known=False, why_unknown=why, hints=hints)

    def _meta(self, key: str) -> Resolved:
        plugin, node = self.plugin, self.node
        on_node = node.meta.get(key) if node is not None else None
        mine = plugin is not None and key.startswith(plugin.prefix)
        if plugin is not None and mine:
            computed = plugin.keys.get(key)
            summary = key[len(plugin.prefix) :] in SUMMARY_KEYS
            if plugin.publishes and (computed is not None or plugin.topology_known or summary):
                remark = ""
                if node is not None and on_node != computed:
                    now = "not set" if on_node is None else repr(on_node)
                    change = "unsets it" if computed is None else f"publishes {computed!r}"
                    remark = f"the node has {now} now; the plugin {change}, which Nomad sees within about 10 s"
                return Resolved(computed, origin="the plugin publishes it", remark=remark)
            if node is not None:
                remark = ""
                if not plugin.publishes and on_node != computed:
                    remark = (
                        f"the plugin computes {'no value' if computed is None else repr(computed)} for it; with "
                        "node_meta = false the node's static meta holds what `node-meta` printed when it was copied"
                    )
                return Resolved(on_node, origin=node.source, remark=remark)
            if not plugin.publishes:
                value = "no value" if computed is None else repr(computed)
                return self._unknown(
                    f"meta.{key}",
                    f"the plugin computes {value} for it but publishes it only with node_meta = true",
                    publish=True,
                )
            return self._unknown(f"meta.{key}", "XDM has not reported the topology yet (no card carries one)")
        if node is not None:
            return Resolved(on_node, origin=node.source)
        why = "this node's meta is not known"
        if plugin is None and self.plugin_why:
            why += f"; nor are the plugin's keys: {self.plugin_why}"
        return self._unknown(f"meta.{key}", why)
