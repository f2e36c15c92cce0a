"""(a)-(e): the real plugin binds XDM's real schema at run time.

The real plugin runs under the Go conformance host (--stdin: streams stay open)
against the simulator serving the reconstruction's names with other field
numbers (``renumbered``) or also another package (``foreign``), with or
without server reflection. What Nomad would see (devices, attributes, Reserve)
must equal the built-in baseline whenever the plugin is given the real schema,
and be a loud mismatch (no healthy device, Reserve refused, no grant) when it
is not.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.hostlib import Event, HostProcess, run_host, start_host
from tests.doubles.drifted_schemas import served_schema
from tests.integration.harness import Node, assert_conformant, group_attrs, group_map, reserve, set_of, sim_node

PROFILE = "h800-8"
MISMATCH = "XDM schema mismatch"
RESERVE_CARD = 2
Opened = Callable[..., tuple[Node, HostProcess]]


@pytest.fixture
def node_with(conformance_host: Path) -> Iterator[Opened]:
    """``node_with(schema, reflection, *sets)`` -> (node, host) in --stdin mode; cleaned up after."""
    opened: list[tuple[Any, HostProcess]] = []

    def _open(schema: str, reflection: bool, *sets: str, emit: bool = False) -> tuple[Node, HostProcess]:
        ctx = sim_node(PROFILE, schema=served_schema(schema), reflection=reflection)
        node = ctx.__enter__()
        extra = list(sets)
        if emit:
            node.sim.schema.emit(node.root / "official")
        extra = [s.replace("@OFFICIAL@", str(node.root / "official")) for s in extra]
        args = [*node.plugin_args(*extra, phase="run"), "--duration", "0", "--stats-interval", "0.5"]
        proc = start_host(args, binary=conformance_host)
        opened.append((ctx, proc))
        return node, proc

    yield _open
    for ctx, proc in opened:
        if proc.proc.poll() is None:
            proc.finish(timeout=10)
        ctx.__exit__(None, None, None)


def devices(fp: Event) -> dict[str, dict[str, Any]]:
    if fp.get("event") != "fingerprint":
        return {}
    return {d["id"]: d for g in fp["groups"] for d in g["devices"]}


def settled(fp: Event) -> bool:
    """Every card advertised, healthy and fully described (runtime kit read)."""
    devs = devices(fp)
    if len(devs) != 8:
        return False
    attrs = next(iter(group_attrs(fp).values()), {})
    return all(d["healthy"] and not d["health_description"] for d in devs.values()) and bool(attrs)


def view(node: Node, proc: HostProcess, tag: str) -> dict[str, Any]:
    """What Nomad sees: groups with device IDs and attributes, and one Reserve's container spec."""
    try:
        fp = proc.wait_for(lambda e: settled(e) and _runtime_known(e), timeout=30)
    except TimeoutError:
        raise AssertionError(f"the node never settled healthy; stderr:\n{''.join(proc._stderr)[-3000:]}") from None
    groups = {k: sorted(d["id"] for d in v) for k, v in group_map(fp).items()}
    attrs = group_attrs(fp)
    device_id = node.sim.cards[RESERVE_CARD].uuid
    answer = reserve(proc, [device_id], tag=tag, expect="ok")
    assert answer["ok"], answer
    spec = {k: answer[k] for k in ("envs", "devices", "mounts")}
    grant_id = spec["envs"].pop("LINGJUN_GRANT_ID", "")  # a fresh UUID per Reserve, by design
    assert re.fullmatch(r"[0-9a-f-]{36}", grant_id), spec["envs"]
    return {"groups": groups, "attrs": attrs, "reserve": spec}


def same(seen: dict[str, Any], baseline: dict[str, Any]) -> None:
    """Equal views, with a message that names what differs."""
    diffs = [k for k in baseline if seen.get(k) != baseline[k]]
    envs_a, envs_b = seen["reserve"]["envs"], baseline["reserve"]["envs"]
    env_diff = {k: (envs_a.get(k), envs_b.get(k)) for k in set(envs_a) | set(envs_b) if envs_a.get(k) != envs_b.get(k)}
    assert not diffs, f"differs from the builtin baseline in {diffs}; envs {env_diff}"


def _runtime_known(fp: Event) -> bool:
    if fp.get("event") != "fingerprint":
        return False
    attrs = next(iter(group_attrs(fp).values()), {})
    return all("unknown" not in str(v) for k, v in attrs.items() if "runtime" in k)


@pytest.fixture(scope="module")
def baseline(conformance_host: Path) -> dict[str, Any]:
    """The built-in schema served and used: what every correctly bound run must equal."""
    with sim_node(PROFILE) as node:
        args = [*node.plugin_args(phase="run"), "--duration", "0", "--stats-interval", "0.5"]
        proc = start_host(args, binary=conformance_host)
        try:
            seen = view(node, proc, "baseline")
        finally:
            run = proc.finish(timeout=10)
        assert_conformant(run)
        return seen


def _finish_clean(proc: HostProcess) -> None:
    run = proc.finish()
    assert_conformant(run)
    assert run.of("run_end")[-1]["reason"] == "stop command"  # the Fingerprint stream never ended on its own


def _report_logged(proc: HostProcess, pattern: str, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = "".join(proc._stderr)
        if re.search(pattern, text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"no log line matching {pattern!r}; stderr tail:\n{''.join(proc._stderr)[-3000:]}")


def test_a_renumbered_with_reflection_default_config(node_with: Opened, baseline: dict[str, Any]) -> None:
    node, proc = node_with("renumbered", True)
    same(view(node, proc, "a"), baseline)
    _report_logged(proc, r"XDM schema binding \(source reflection")
    _finish_clean(proc)


def test_b_renumbered_with_the_official_proto_directory(node_with: Opened, baseline: dict[str, Any]) -> None:
    aliases = set_of("xdm_field_aliases", [{"Device.totalMemory": "totalMemory"}])  # Nomad's HCL1 map shape
    node, proc = node_with("renumbered", False, set_of("xdm_schema", "@OFFICIAL@"), aliases, emit=True)
    same(view(node, proc, "b"), baseline)
    _report_logged(proc, r"XDM schema binding \(source /\S+/official,")
    _report_logged(proc, r"Device\.totalMemory -> xdm\.Device\.totalMemory #\d+ int64 \(xdm_field_aliases\)")
    _finish_clean(proc)


def test_c_renumbered_with_the_descriptor_set(node_with: Opened, baseline: dict[str, Any]) -> None:
    node, proc = node_with("renumbered", False, set_of("xdm_schema", "@OFFICIAL@/descriptor_set.pb"), emit=True)
    same(view(node, proc, "c"), baseline)
    _report_logged(proc, r"XDM schema binding \(source /\S+/descriptor_set\.pb")
    _finish_clean(proc)


def test_bad_schema_path_fails_setconfig_naming_the_file_and_the_parser(conformance_host: Path, tmp_path: Path) -> None:
    broken = tmp_path / "api_outer.proto"
    broken.write_text('syntax = "proto3";\nmessage Device { int32 minor = 1 }\n')
    with sim_node(PROFILE) as node:
        args = [*node.plugin_args(set_of("xdm_schema", str(broken)), phase="all"), "--duration", "1"]
        run = run_host(args, binary=conformance_host)
    failed = [e for e in run.of("set_config") if not e["ok"]]
    assert failed, run.describe()
    assert {e["code"] for e in failed} == {"InvalidArgument"}
    message = failed[0]["message"]
    assert message.startswith('config option "xdm_schema": ') and str(broken) in message and 'Expected ";"' in message


def test_d_renumbered_read_with_the_builtin_guess_is_a_loud_mismatch(node_with: Opened) -> None:
    node, proc = node_with("renumbered", False, set_of("xdm_schema", "builtin"))

    def loud(e: Event) -> bool:
        devs = devices(e) if e["event"] == "fingerprint" else {}
        return bool(devs) and all(not d["healthy"] and MISMATCH in str(d["health_description"]) for d in devs.values())

    try:
        fp = proc.wait_for(loud, timeout=30)
    except TimeoutError:
        raise AssertionError(f"no mismatch fingerprint; stderr:\n{''.join(proc._stderr)[-3000:]}") from None
    healthy = [e for e in proc.events if e["event"] == "fingerprint" and any(d["healthy"] for d in devices(e).values())]
    assert healthy == [], "a device was advertised healthy on a wrong schema"
    device_id = next(iter(devices(fp)))
    answer = reserve(proc, [device_id], tag="d", expect="error")
    assert not answer["ok"] and MISMATCH in answer["message"], answer
    assert node.sim.grants() == {}, "an Allocate reached XDM"
    _report_logged(proc, MISMATCH)
    _finish_clean(proc)


def test_e_xdm_restarts_with_another_schema_and_the_plugin_rebinds(node_with: Opened, baseline: dict[str, Any]) -> None:
    node, proc = node_with("renumbered", True)
    same(view(node, proc, "e1"), baseline)
    node.sim.restart(0.5, schema=served_schema("foreign"), reflection=True)
    text = _report_logged(proc, r"rpc ListAndWatch -> /ljrk\.dp2mgr\.v1\.", timeout=40)
    assert text.count("XDM schema binding (source reflection") >= 2
    back = time.time_ns()
    try:
        proc.wait_for(lambda e: e["event"] == "fingerprint" and e["recv_unix_ns"] >= back and settled(e), timeout=30)
    except TimeoutError:
        pass  # the fingerprint may not change at all: the same cards, still healthy
    card = node.sim.cards[5].uuid
    answer = reserve(proc, [card], tag="e2", expect="ok")
    assert answer["ok"], answer
    assert len(node.sim.grants()) == 2  # the grant from before the restart survived; the new one was made
    _finish_clean(proc)
