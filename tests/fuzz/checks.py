"""What every fuzz target must satisfy for ANY input; shared by the hypothesis properties and the corpus.

Each ``check_*`` takes one raw input, drives the real code, and raises
AssertionError (or lets an unexpected exception escape) when the target
misbehaves: an undocumented exception, a grant that fails verification but is
used, a release caused by an unreadable Nomad answer, a lost journal entry.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
import tempfile
from pathlib import Path
from typing import Any

import msgpack
from google.protobuf.message import DecodeError

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin.config.decode import decode_config
from nomad_plugin.config.model import ConfigError, PluginConfig
from nomad_plugin.journal import store as journal_store
from nomad_plugin.journal.store import FILE_NAME, Journal, JournalCorrupt, decode
from nomad_plugin.model.card import Topology, parse_topology
from nomad_plugin.model.errors import PluginError
from nomad_plugin.model.grant import DeviceAsk, GrantRequest
from nomad_plugin.model.instances import GroupKey, Instance, Kind, share_id
from nomad_plugin.nomad.container import ENV_GRANT_ID, GrantRejected, build_container
from nomad_plugin.reconcile.nomad_api import NomadApiError
from nomad_plugin.xdm import adapter
from nomad_plugin.xdm.adapter import DriftLog, grant_problem
from nomad_plugin.xdm.binder import builtin_binding
from nomad_plugin.xdm.client import inband_refusal

MAX_MESSAGE = 1200


# --- SetConfig msgpack ---------------------------------------------------------------
def check_config(data: bytes, option: str | None = None) -> None:
    """Only ConfigError may escape; its message is bounded and names the option (or the input)."""
    try:
        config = decode_config(data)
    except ConfigError as exc:
        text = str(exc)
        assert text.startswith(("config", "card[")), text  # card blocks are named card[<index>]
        assert len(text) <= MAX_MESSAGE, f"{len(text)}-char message"
        if option is not None:
            assert f'"{option}' in text or "unknown option" in text or text.startswith("config:"), text
        return
    assert isinstance(config, PluginConfig)
    # What the input did not set keeps its default: no key (or garbage) changes another option.
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # the decoder accepted it; this reader is only for naming the keys
        return
    given = set(raw) if isinstance(raw, dict) else set()
    defaults = PluginConfig()
    for field in dataclasses.fields(PluginConfig):
        if field.name in given or (field.name == "cards" and "card" in given):
            continue
        assert getattr(config, field.name) == getattr(defaults, field.name), (field.name, sorted(map(str, given)))


# --- topology JSON ---------------------------------------------------------------------
def check_topology(text: Any) -> None:
    """Never raises; levels come sorted nearest first; a text that is not a JSON object yields none and says why."""
    topo = parse_topology(text)
    assert isinstance(topo, Topology)
    assert isinstance(topo.error, str)
    keys = [(lvl.level, lvl.name) for lvl in topo.levels]
    assert keys == sorted(keys), keys
    if text is None or not str(text).strip():
        assert topo == Topology()
        return
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        assert topo.levels == () and topo.error, topo
    for lvl in topo.levels:
        assert isinstance(lvl.level, int) and lvl.name and isinstance(lvl.domain_text, str), lvl


# --- XDM responses -----------------------------------------------------------------------
MAPPERS = {
    "ListSupportedXPUType": lambda m, d: adapter.xpu_types(m),
    "ListAndWatch": adapter.cards_from_list_and_watch,
    "ListGpuInfo": lambda m, d: adapter.gpu_facts(m),
    "ExporterGetDataList": lambda m, d: adapter.metric_samples(m),
    "ExporterGetConfig": lambda m, d: adapter.exporter_config(m),
    "ExporterGetStatus": lambda m, d: adapter.exporter_status(m),
    "QueryStatus": lambda m, d: adapter.runtime_kit_status(m),
    "Release": lambda m, d: adapter.inband_status(m, builtin_binding().rpc("Release").response),
}


def parse_response(method: str, data: bytes) -> Any | None:
    """The adapter's deserializer: a message, or None for DecodeError (gRPC turns that into INTERNAL)."""
    try:
        return adapter.deserializer(builtin_binding().rpc(method), DriftLog())(data)
    except DecodeError:
        return None


def check_xdm_response(method: str, data: bytes) -> None:
    msg = parse_response(method, data)
    if msg is None:
        return
    status, text = adapter.inband_status(msg, builtin_binding().rpc(method).response)
    assert isinstance(status, int) and isinstance(text, str)
    out = MAPPERS[method](msg, DriftLog())
    RESULT_CHECKS.get(method, lambda m, o: None)(msg, out)


def _one_card_per_device(msg: Any, cards: Any) -> None:
    """Every device of a push becomes exactly one card, same minor and UUID (escaped and bounded, as every
    XDM string the plugin repeats: util/text.py), same order; no card carries a control character."""
    from nomad_plugin.util.text import has_unsafe, printable

    assert [(c.minor, c.uuid) for c in cards] == [(int(d.minor), printable(d.uuid, 128)) for d in msg.devices]
    for card in cards:
        assert not any(has_unsafe(t) for t in (card.uuid, card.model, card.health_reason, card.pci_bus_id))
    for card in cards:
        assert isinstance(card.healthy, bool) and isinstance(card.health_reason, str)
        assert card.healthy or card.health_reason, f"card {card.minor} unhealthy without a reason"


def _one_sample_per_datum(msg: Any, samples: Any) -> None:
    """Every exporter datum becomes one named sample of the same device."""
    assert [s.device for s in samples] == [d.device for d in msg.dataList]
    assert all(s.name for s in samples), [s.metric_id for s in samples if not s.name]


RESULT_CHECKS = {
    "ListSupportedXPUType": lambda m, out: _no_empty_types(m, out),
    "ListAndWatch": _one_card_per_device,
    "ExporterGetDataList": _one_sample_per_datum,
}


def _no_empty_types(msg: Any, types: Any) -> None:
    assert all(types) and set(types) <= set(msg.xpuTypes), types


GRANT_ID = "5b0c2d3e-0000-4000-8000-00000000abcd"
CARD = "GPU-00000000-0000-0000-0000-000000000000"
REQUEST = GrantRequest(GRANT_ID, (DeviceAsk(minor=0, core=50, memory_gib=40),))
INSTANCES = (
    Instance(share_id(CARD, 0), Kind.SHARE, CARD, 0, 0, 25, 20),
    Instance(share_id(CARD, 1), Kind.SHARE, CARD, 0, 1, 25, 20),
)
GROUP = GroupKey("nvidia", "gpu", "H800 share")


def valid_allocate_response() -> bytes:
    return pb.AllocateResponse(
        status=0,
        id=GRANT_ID,
        devices=[pb.AllocatedDevice(minor=0, uuid=CARD, core=50, memory=40)],
        envs={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"},
        deviceSpecs=[pb.DeviceSpec(containerPath="/dev/nvidia0", hostPath="/dev/nvidia0", permissions="rw")],
        mounts=[pb.Mount(containerPath="/usr/local/xdm", hostPath="/opt/xdm/lib", readOnly=True)],
        annotations={"xdm.amp.com/allocation-id": GRANT_ID},
    ).SerializeToString()


def _clean_path(path: str, under_dev: bool) -> None:
    assert path.startswith("/") and not path.startswith("//"), path
    assert ".." not in path.split("/") and posixpath.normpath(path) == path, path
    assert not any(ord(c) < 32 or c == "\x7f" for c in path), repr(path)
    if under_dev:
        assert path.startswith("/dev/"), path


def check_allocate_response(data: bytes) -> str:
    """Allocate answer -> outcome -> verification -> container; returns what happened.

    A grant that reaches a task must match the request card for card and carry
    only clean absolute paths (device nodes under /dev) and safe env values.
    """
    msg = parse_response("Allocate", data)
    if msg is None:
        return "undecodable"
    outcome = adapter.allocate_outcome(msg, GRANT_ID)
    if inband_refusal(outcome.status, outcome.message, "Allocate") is not None:
        return "refused"
    if grant_problem(REQUEST, outcome.grant, outcome.error_code_hints) is not None:
        return "mismatch"  # the client releases it at once
    grant = outcome.grant
    assert grant.grant_id in ("", GRANT_ID)
    if grant.devices:
        assert sorted(d.minor for d in grant.devices) == [0]
        d = grant.devices[0]
        assert (d.core, d.memory_gib, d.slices) == (50, 40, 0)
    try:
        spec = build_container(grant, INSTANCES, GROUP, path_exists=lambda p: True)
    except GrantRejected as exc:
        assert str(exc), "empty rejection message"
        return "rejected"
    for node in spec.devices:
        _clean_path(node.host_path, True)
        _clean_path(node.container_path, True)
        assert node.permissions and set(node.permissions) <= set("rwm")
    for m in spec.mounts:
        _clean_path(m.host_path, False)
        _clean_path(m.container_path, False)
        assert m.host_path != "/"
    for key, value in spec.envs.items():
        assert key and (key[0].isalpha() or key[0] == "_") and all(c.isalnum() or c == "_" for c in key), key
        assert "${" not in value and "\n" not in value and "\x00" not in value, (key, value)
    assert spec.envs[ENV_GRANT_ID] == GRANT_ID
    return "granted"


# --- Nomad API allocation pages ---------------------------------------------------------------
def check_nomad_page(body: bytes, held_ids: tuple[str, ...], contains_live_holder: bool) -> str:
    """Feed ``body`` as the allocations answer through the real client and reconciler (grace 0).

    Never an exception other than NomadApiError; an unreadable answer releases
    nothing; an answer that still shows a live allocation holding the grant's
    IDs releases nothing.
    """
    from tests.fuzz.nomad_rig import ReconcileRig

    with ReconcileRig(held_ids) as rig:
        try:
            rig.round(body)
        except NomadApiError as exc:
            assert exc.kind == "bad-response", exc.kind
            assert not rig.released, f"unreadable answer released {rig.released}"
            return "error"
        if contains_live_holder:
            assert not rig.released, f"released {rig.released} although a live allocation holds them"
        return "released" if rig.released else "kept"


# --- journal file ----------------------------------------------------------------------------------
def check_journal_bytes(data: bytes, directory: Path | None = None) -> str:
    """decode() raises only JournalCorrupt; opening the file never crashes and never loses data silently."""
    try:
        entries = decode(data)
        decoded: list[Any] | None = [e.to_json() for e in entries]
    except JournalCorrupt as exc:
        assert str(exc)
        decoded = None
    with tempfile.TemporaryDirectory(prefix="jfz-", dir=directory) as tmp:
        d = Path(tmp) / "data"
        d.mkdir(mode=0o700)
        (d / FILE_NAME).write_bytes(data)
        records: list[logging.LogRecord] = []
        handler = _ListHandler(records)
        logger = journal_store.log  # the module logger, under the plugin tree
        logger.addHandler(handler)
        try:
            journal = Journal(d)
        finally:
            logger.removeHandler(handler)
        if decoded is None:
            assert journal.corrupt_set_aside is not None, "corrupt journal not set aside"
            said = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
            assert any(str(journal.corrupt_set_aside) in m for m in said), f"set aside silently: {said}"
            assert journal.corrupt_set_aside.read_bytes() == data, "set-aside copy differs from the original"
            assert len(journal) == 0
            assert decode((d / FILE_NAME).read_bytes()) == []
            return "set-aside"
        assert journal.corrupt_set_aside is None
        assert [e.to_json() for e in journal.entries()] == decoded, "a valid entry was lost on open"
        # Still writable and re-readable after whatever was there.
        if entries:
            journal.remove(entries[0].grant_id)
            assert len(Journal(d)) == len(entries) - 1
        return "loaded"


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record)


def as_json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


__all__ = [
    "PluginError",
    "check_allocate_response",
    "check_config",
    "check_journal_bytes",
    "check_nomad_page",
    "check_topology",
    "check_xdm_response",
]
