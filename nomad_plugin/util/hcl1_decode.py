"""HCL v1's decoder (decoder.go) for what the Nomad agent's tools read of an agent file.

``hcl.Decode`` into Nomad's Config (command/agent/config_parse.go): top-level ``data_dir`` and
``plugin_dir`` are strings, ``plugin "<name>" { args = [...] config { ... } }`` blocks are
config.PluginConfig values whose ``config`` is a map[string]interface{}. The rules are Go's: field
names match in any case, an object under a key becomes a list of one map, a second value for a key
decodes into the first (lists append, maps merge), and the fork Nomad pins (v1.0.1-nomad-1) reads a
number or bool where a string is wanted as its text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nomad_plugin.util.hcl1 import (
    BOOL,
    FLOAT,
    HEREDOC,
    NUMBER,
    STRING,
    Hcl1Error,
    Item,
    ListType,
    Literal,
    ObjectList,
    ObjectType,
    go_float,
    go_int,
    key_value,
    literal_value,
    parse,
)

# -- decoder (decoder.go, into the types the agent's plugin block and paths use) -------------------

IFACE, STR, INT, FLT, BOOLEAN, MAP, LIST, MAPLIST, STRLIST = "iface str int float bool map list maplist strlist".split()


class MapList(list[Any]):
    """A Go []map[string]interface{}: what an object under a key decodes to."""


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, int):
        return INT
    if isinstance(value, float):
        return FLT
    if isinstance(value, str):
        return STR
    if isinstance(value, dict):
        return MAP
    return MAPLIST if isinstance(value, MapList) else LIST


def _pos(node: Any) -> tuple[int, int]:
    if isinstance(node, Literal):
        return node.token.line, node.token.column
    if isinstance(node, Item) and node.keys:
        return node.keys[0].line, node.keys[0].column
    if isinstance(node, ObjectList) and node.items:
        return _pos(node.items[0])
    return 0, 0


def _error(node: Any, message: str) -> Hcl1Error:
    return Hcl1Error(*_pos(node), message)


class Decoder:
    """decoder.go for interface{}, string, []string and map[string]interface{} targets."""

    def __init__(self) -> None:
        self.stack: list[str] = []

    def decode(self, name: str, node: Any, kind: str, old: Any = None) -> Any:
        if kind == IFACE and old is not None:
            kind = _kind(old)
        if kind != IFACE:
            self.stack.append(LIST if kind in (LIST, MAPLIST, STRLIST) else kind)
        try:
            return self._dispatch(name, node, kind, old)
        finally:
            if kind != IFACE:
                self.stack.pop()

    def _dispatch(self, name: str, node: Any, kind: str, old: Any) -> Any:
        if kind == IFACE:
            return self.interface(name, node)
        if kind == MAP:
            return self.map(name, node, old)
        if kind in (LIST, MAPLIST, STRLIST):
            return self.slice(name, node, kind, old)
        if not isinstance(node, Literal):
            raise _error(node, f"{name}: unknown type {type(node).__name__}")
        tok = node.token
        try:
            if kind == STR and tok.type in (NUMBER, FLOAT, BOOL):
                return tok.text
            if kind == STR and tok.type in (STRING, HEREDOC):
                return literal_value(tok)
            if kind == INT and tok.type in (NUMBER, STRING):
                return go_int(tok.text if tok.type == NUMBER else literal_value(tok))
            if kind == FLT and tok.type in (NUMBER, FLOAT):
                return go_float(tok.text)
            if kind == BOOLEAN and tok.type in (BOOL, STRING, NUMBER):
                word = tok.text.replace('"', "").lower()
                if word in ("1", "true", "0", "false"):
                    return word in ("1", "true")
                raise ValueError(f"decodeBool: Unknown value for boolean: {tok.text}")
        except ValueError as exc:
            raise _error(node, f"{name}: {exc}") from None
        raise _error(node, f"{name}: unknown type for {kind} {tok.type}")

    def interface(self, name: str, node: Any) -> Any:
        test = node.list if isinstance(node, ObjectType) else node
        if isinstance(test, ObjectList):
            fresh: Any = {} if not self.stack or self.stack[-1] == LIST else MapList()
        elif isinstance(test, ListType):
            fresh = []
        elif isinstance(test, Literal) and test.token.type in (BOOL, FLOAT, NUMBER, STRING, HEREDOC):
            fresh = {BOOL: False, FLOAT: 0.0, NUMBER: 0}.get(test.token.type, "")
        else:
            raise _error(node, f"{name}: cannot decode into interface")
        return self.decode(name, node, IFACE, fresh)

    def map(self, name: str, node: Any, old: Any) -> dict[str, Any]:
        if isinstance(node, Item):
            node = ObjectList([node])
        if isinstance(node, ObjectType):
            node = node.list
        if not isinstance(node, ObjectList):
            raise _error(node, f"{name}: not an object type for map")
        result: dict[str, Any] = old if isinstance(old, dict) else {}
        done: set[str] = set()
        for item in node.items:
            if not item.keys:
                raise _error(node, f"{name}: map must have string keys")
            key = key_value(item.keys[0])
            if key in done:
                continue
            value = item.value
            if len(item.keys) > 1:
                value = node.filter(key)
                done.add(key)
            result[key] = self.decode(f"{name}.{key}", value, IFACE, result.get(key))
        return result

    def slice(self, name: str, node: Any, kind: str, old: Any) -> list[Any]:
        result: list[Any] = old if isinstance(old, list) else (MapList() if kind == MAPLIST else [])
        items = slice_items(name, node)
        element = {MAPLIST: MAP, STRLIST: STR}.get(kind, IFACE)
        for index, item in enumerate(items):
            result.append(self.decode(f"{name}[{index}]", item, element))
        return result


# -- the agent's fields --------------------------------------------------------------------------


@dataclass
class Plugin:
    """One ``plugin`` block as config.PluginConfig decodes it."""

    name: str
    args: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None
    line: int = 0
    config_blocks: int = 0
    extra_keys: list[str] = field(default_factory=list)


@dataclass
class AgentFields:
    """What doctor needs of one agent file: data_dir, plugin_dir (``""`` when unset) and the plugin blocks."""

    data_dir: str = ""
    plugin_dir: str = ""
    plugins: list[Plugin] = field(default_factory=list)


def _field_nodes(body: ObjectList, name: str) -> list[Any]:
    """decodeStruct's nodes for one field: the labelled items as one list, then each unlabelled value."""
    found = body.filter(name)
    prefixed = [i for i in found.items if i.keys]
    nodes: list[Any] = [ObjectList(prefixed)] if prefixed else []
    for match in (i for i in found.items if not i.keys):
        nodes.append(ObjectList(match.value.list.items) if isinstance(match.value, ObjectType) else match.value)
    return nodes


def _plugin(decoder: Decoder, name: str, node: Any) -> Plugin:
    """decodePtr + decodeStruct of one PluginConfig (``Name`` is the item's first key)."""
    item = node if isinstance(node, Item) else None
    if item is not None:
        if len(item.keys) == 2:  # expandObject: plugin "a" "b" {} is plugin "a" { "b" {} }
            node = Item(item.keys[:1], ObjectType(ObjectList([Item(item.keys[1:], item.value)])))
            item = node
        node = node.value
    if isinstance(node, ObjectType):
        node = node.list
    if isinstance(node, Literal) and item is not None:
        node = ObjectList([item])
    if not isinstance(node, ObjectList):
        raise _error(node, f"{name}: not an object type for struct")
    if item is None:
        raise _error(node, f"{name}: Name asked for 'key', impossible")
    plugin = Plugin(key_value(item.keys[0]) if item.keys else "", line=_pos(item)[0])
    for value in _field_nodes(node, "args"):
        plugin.args = decoder.decode(f"{name}.args", value, STRLIST, plugin.args or None)
    for value in _field_nodes(node, "config"):
        plugin.config = decoder.decode(f"{name}.config", value, MAP, plugin.config)
        plugin.config_blocks += 1
    names = {key_value(i.keys[0]) for i in node.items if i.keys}
    plugin.extra_keys = sorted(k for k in names if k.lower() not in ("args", "config"))
    return plugin


def decode_agent(src: str) -> AgentFields:
    """One agent file's data_dir, plugin_dir and plugin blocks, as ``hcl.Decode`` into Nomad's Config."""
    root = parse(src)
    out = AgentFields()
    decoder = Decoder()
    decoder.stack.append("struct")
    for value in _field_nodes(root, "data_dir"):
        out.data_dir = decoder.decode("root.data_dir", value, STR)
    for value in _field_nodes(root, "plugin_dir"):
        out.plugin_dir = decoder.decode("root.plugin_dir", value, STR)
    for value in _field_nodes(root, "plugin"):
        decoder.stack.append(LIST)
        try:
            out.plugins.extend(_plugins(decoder, value))
        finally:
            decoder.stack.pop()
    return out


def slice_items(name: str, node: Any) -> list[Any]:
    """The elements decodeSlice walks: an object list's items, one object, or a list's items."""
    if isinstance(node, ObjectList):
        return list(node.items)
    if isinstance(node, ObjectType):
        return [node]
    if isinstance(node, ListType):
        return list(node.items)
    raise _error(node, f"{name}: unknown slice type")


def _plugins(decoder: Decoder, node: Any) -> list[Plugin]:
    """decodeSlice of []*PluginConfig."""
    items = slice_items("root.plugin", node)
    plugins = []
    for index, item in enumerate(items):
        decoder.stack.extend(["ptr", "struct"])
        try:
            plugins.append(_plugin(decoder, f"root.plugin[{index}]", item))
        finally:
            del decoder.stack[-2:]
    return plugins
