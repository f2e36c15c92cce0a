"""Route (b): the Nomad-API reconciler against the API double over real HTTP."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient, parse_alloc
from nomad_plugin.reconcile.reconciler import Reconciler
from nomad_plugin.util.threads import Backoff
from tests.doubles.nomad_api import NomadApiDouble
from tests.doubles.reserve_fakes import Clock, FakeBackend, card_uuid, catalog, whole_group
from tests.waiting import wait_until

CAT = catalog(whole_group(8))
TOKEN = "s3cr3t-token-0123"


@pytest.fixture
def api():
    with NomadApiDouble() as double:
        yield double


def setup(tmp_path, api, *, grace=30.0, token="", clock=None, timeout=2.0):
    backend = FakeBackend()
    reserver = Reserver(backend, lambda: CAT, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    client = NomadClient(NomadApiSettings(address=api.address, token=token, timeout=timeout))
    rec = Reconciler(
        reserver,
        client,
        lambda: CAT,
        grace=grace,
        max_wait=0.2,
        backoff=Backoff(initial=0.05, cap=0.2),
        clock=clock or time.monotonic,
    )
    return reserver, backend, rec


def grant_of(reserver, ids):
    return reserver.reserve(ids).container_res.envs["LINGJUN_GRANT_ID"]


def test_settings_from_config_then_env():
    env = {
        "NOMAD_ADDR": "https://10.0.0.1:4646",
        "NOMAD_TOKEN": "env-token",
        "NOMAD_CACERT": "/ca.pem",
        "NOMAD_CLIENT_CERT": "/c.pem",
        "NOMAD_CLIENT_KEY": "/k.pem",
        "NOMAD_TLS_SERVER_NAME": "client.global.nomad",
        "NOMAD_SKIP_VERIFY": "true",
    }
    s = NomadApiSettings.from_config(PluginConfig(), env)
    assert (s.address, s.token, s.ca_cert, s.client_cert, s.client_key, s.tls_server_name, s.skip_verify) == (
        "https://10.0.0.1:4646",
        "env-token",
        "/ca.pem",
        "/c.pem",
        "/k.pem",
        "client.global.nomad",
        True,
    )
    s = NomadApiSettings.from_config(PluginConfig(nomad_address="http://h:1", nomad_token="cfg"), env)
    assert (s.address, s.token) == ("http://h:1", "cfg")
    assert NomadApiSettings.from_config(PluginConfig(), {}).address == "http://127.0.0.1:4646"
    assert "cfg" not in repr(s)


def test_parse_alloc_shapes():
    raw = {
        "ID": "a1",
        "ClientStatus": "running",
        "AllocatedResources": {
            "Tasks": {
                "t1": {"Devices": [{"DeviceIDs": ["x", "y"]}]},
                "t2": {"Devices": None},
                "t3": {"Devices": [{"DeviceIDs": ["z"]}]},
            }
        },
    }
    v = parse_alloc(raw)
    assert v.device_ids == {"x", "y", "z"} and v.live
    assert not parse_alloc({"ID": "a", "ClientStatus": "lost", "AllocatedResources": None}).live
    with pytest.raises(ValueError):
        parse_alloc({"ClientStatus": "running"})


def test_node_id_from_agent_self_and_blocking_query(api):
    client = NomadClient(NomadApiSettings(address=api.address))
    assert client.node_id() == api.node_id
    page = client.node_allocations(api.node_id)
    assert page.allocs == () and page.index == api.index
    t0 = time.monotonic()
    again = client.node_allocations(api.node_id, page.index, wait=0.3)
    assert 0.25 <= time.monotonic() - t0 < 2 and again.index == page.index
    # a change wakes a blocking query early
    import threading

    threading.Timer(0.1, api.add_alloc, ("a1", ["d1"])).start()
    t0 = time.monotonic()
    woke = client.node_allocations(api.node_id, page.index, wait=5)
    assert time.monotonic() - t0 < 2 and woke.index > page.index
    assert [a.id for a in woke.allocs] == ["a1"]
    assert any("index=" in p and "wait=" in p for p, _ in api.requests)


def test_terminal_alloc_released_after_grace_not_before(tmp_path, api):
    clock = Clock()
    reserver, backend, rec = setup(tmp_path, api, grace=30, clock=clock)
    gid = grant_of(reserver, [card_uuid(0)])
    api.add_alloc("alloc-1", [card_uuid(0)])
    rec.round()
    assert gid in backend.grants
    api.set_status("alloc-1", "complete")
    rec.round()
    clock.now += 29
    rec.round()
    assert gid in backend.grants  # inside grace
    clock.now += 2
    rec.round()
    assert gid not in backend.grants and reserver.entries() == []
    assert reserver.counters.grants_released_by_reconcile == 1


def test_a_burst_of_changes_is_answered_once_per_min_round_interval(tmp_path, api):
    reserver, _backend, rec = setup(tmp_path, api)
    rec.min_round_interval = 0.4
    rec.round()  # the first answer: acted on at once
    gid = grant_of(reserver, [card_uuid(0)])
    api.add_alloc("alloc-1", [card_uuid(0)])
    t0 = time.monotonic()
    rec.round()
    assert time.monotonic() - t0 >= 0.35, "the next answer waits out the interval"
    assert rec.timers.claims[gid].alloc_id == "alloc-1", "and carries every change made meanwhile"
    rec.stop()
    t0 = time.monotonic()
    rec.round()  # stopped during the pause: no query
    assert time.monotonic() - t0 < 0.3


@pytest.mark.parametrize("status", ["failed", "lost"])
def test_other_terminal_statuses(tmp_path, api, status):
    clock = Clock()
    reserver, backend, rec = setup(tmp_path, api, grace=1, clock=clock)
    gid = grant_of(reserver, [card_uuid(1)])
    api.add_alloc("a", [card_uuid(1)], status=status)
    rec.round()
    clock.now += 1
    rec.round()
    assert gid not in backend.grants


def test_gone_alloc_released_live_alloc_kept(tmp_path, api):
    clock = Clock()
    reserver, backend, rec = setup(tmp_path, api, grace=5, clock=clock)
    gone = grant_of(reserver, [card_uuid(0)])
    live = grant_of(reserver, [card_uuid(1), card_uuid(2)])
    api.add_alloc("live", [card_uuid(2), card_uuid(1)])
    api.add_alloc("pending", [card_uuid(5)], status="pending")
    rec.round()
    clock.now += 10
    rec.round()
    assert gone not in backend.grants and live in backend.grants


def test_api_down_never_releases_then_recovers(tmp_path, api):
    clock = Clock()
    reserver, backend, rec = setup(tmp_path, api, grace=5, clock=clock)
    gid = grant_of(reserver, [card_uuid(0)])
    api.add_alloc("a", [card_uuid(0)])
    rec.round()
    api.remove_alloc("a")
    api.set_down(True)
    clock.now += 100
    with pytest.raises(NomadApiError) as err:
        rec.round()
    assert err.value.kind == "unreachable"
    assert gid in backend.grants
    api.set_down(False)
    rec.round()  # first good answer: orphan timer starts now
    assert gid in backend.grants
    clock.now += 5
    rec.round()
    assert gid not in backend.grants


def test_slow_api_times_out_and_releases_nothing(tmp_path, api):
    reserver, backend, rec = setup(tmp_path, api, grace=0, timeout=0.3)
    gid = grant_of(reserver, [card_uuid(0)])
    api.set_latency(1.0)
    with pytest.raises(NomadApiError) as err:
        rec.round()
    assert err.value.kind == "timeout" and gid in backend.grants


def test_token_refused_403_and_token_never_in_errors(tmp_path, api, caplog):
    api.require_token(TOKEN)
    reserver, backend, rec = setup(tmp_path, api, grace=0, token="wrong-" + TOKEN)
    gid = grant_of(reserver, [card_uuid(0)])
    with pytest.raises(NomadApiError) as err:
        rec.round()
    assert err.value.kind == "forbidden" and "Permission denied" in str(err.value)
    assert TOKEN not in str(err.value) and gid in backend.grants
    # the right token works and is sent as X-Nomad-Token
    _, _, ok = setup(tmp_path / "2", api, grace=0, token=TOKEN)
    ok.round()
    assert api.requests[-1][1] == TOKEN


def test_thread_backs_off_on_errors_logs_no_token_and_stops_cleanly(tmp_path, api, caplog):
    api.require_token(TOKEN)
    reserver, backend, rec = setup(tmp_path, api, grace=0.2, token="bad-" + TOKEN)
    gid = grant_of(reserver, [card_uuid(0)])
    started = time.monotonic()
    rec.start()
    wait_until(lambda: reserver.counters.nomad_api_errors >= 4, "four failed reconcile rounds")
    # Backed off, not a tight loop: 3 delays of at least 0.04, 0.08, 0.16 s (0.05 doubling, 20 % jitter).
    elapsed = time.monotonic() - started
    assert elapsed >= 0.28, f"4 failed rounds within {elapsed:.3f} s: no backoff"
    assert gid in backend.grants
    assert TOKEN not in caplog.text
    api.require_token(None)
    wait_until(lambda: gid not in backend.grants, "the grant's release once the token is accepted")
    rec.stop()
    assert rec._thread is None


def test_leak_reported_for_live_alloc_without_entry(tmp_path, api):
    clock = Clock()
    reserver, _backend, rec = setup(tmp_path, api, grace=5, clock=clock)
    grant_of(reserver, [card_uuid(0)])
    api.add_alloc("known", [card_uuid(0)])
    api.add_alloc("unknown", [card_uuid(3)])
    api.add_alloc("foreign", ["other-plugin-device"])
    rec.round()
    assert reserver.counters.leaked_grants_found == 0  # a Reserve may be in flight
    clock.now += 6
    rec.round()
    rec.round()
    assert reserver.counters.leaked_grants_found == 1  # reported once


def test_an_allocation_whose_task_has_not_started_is_no_leak_however_long_it_waits(tmp_path, api):
    # Nomad reserves a task's devices in its prestart, after its artifacts and the group's
    # prestart tasks: the allocation is live (pending, or running a prestart task) meanwhile.
    clock = Clock()
    reserver, _backend, rec = setup(tmp_path, api, grace=5, clock=clock)
    api.add_alloc("downloading", [card_uuid(3)], status="pending")
    for _ in range(3):
        rec.round()
        clock.now += 60
    assert reserver.counters.leaked_grants_found == 0, "a task still fetching its artifacts was called a leak"
    api.set_status("downloading", "running")  # it started: Nomad made its Reserve, and no grant is journalled
    rec.round()
    assert reserver.counters.leaked_grants_found == 0, "reported before the grace period"
    clock.now += 6
    rec.round()
    assert reserver.counters.leaked_grants_found == 1


def test_the_double_reports_task_states_as_nomad_does(api):
    import httpx

    def state():
        body = httpx.get(f"{api.address}/v1/allocation/a1", timeout=5).json()
        return body["TaskStates"][api.task]

    zero = "0001-01-01T00:00:00Z"
    api.add_alloc("a1", [card_uuid(0)], status="pending")
    assert (state()["State"], state()["StartedAt"]) == ("pending", zero)
    api.set_status("a1", "running")
    started = state()["StartedAt"]
    assert state()["State"] == "running" and started != zero
    api.set_status("a1", "pending")  # between restarts: not running, started before
    assert (state()["State"], state()["StartedAt"]) == ("pending", started)
    api.set_status("a1", "lost")  # the server's verdict on an unreachable client: the last report stays
    assert (state()["State"], state()["StartedAt"]) == ("pending", started)
    api.set_status("a1", "failed")
    assert (state()["State"], state()["Failed"], state()["StartedAt"]) == ("dead", True, started)
    assert state()["FinishedAt"] != zero


def test_wrong_shape_is_an_error_not_a_release(tmp_path, api, monkeypatch):
    reserver, backend, rec = setup(tmp_path, api, grace=0)
    gid = grant_of(reserver, [card_uuid(0)])
    monkeypatch.setattr(api, "_node_allocs", lambda node, q, acl: (200, {"not": "a list"}, 5))
    with pytest.raises(NomadApiError) as err:
        rec.round()
    assert err.value.kind == "bad-response" and gid in backend.grants


def test_plugin_client_reads_the_endpoints_the_reconciler_calls(api):
    """Through the plugin's own NomadClient: node_id, the node's allocations, the blocking index, a 404."""
    import threading

    api.add_alloc("a1", ["d"])
    client = NomadClient(NomadApiSettings(address=api.address, timeout=5.0))
    try:
        assert client.node_id() == api.node_id
        page = client.node_allocations(api.node_id)
        assert [(a.id, a.client_status, a.device_ids) for a in page.allocs] == [("a1", "running", frozenset({"d"}))]
        assert page.index == api.index
        assert client.node_allocations("another-node").allocs == ()
        # A blocking query at the current index returns the change that ends it, with a newer index.
        answer = {}
        blocked = threading.Thread(
            target=lambda: answer.update(page=client.node_allocations(api.node_id, page.index, 30.0))
        )
        blocked.start()
        wait_until(lambda: any(f"index={page.index}" in path for path, _ in api.requests), "the blocking query")
        api.set_status("a1", "complete")
        blocked.join(30)
        assert "page" in answer, "the blocking query did not return after the change"
        assert [a.client_status for a in answer["page"].allocs] == ["complete"]
        assert answer["page"].index > page.index
    finally:
        client.close()
    wrong = NomadClient(NomadApiSettings(address=api.address + "/not-nomad"))
    with pytest.raises(NomadApiError) as err:
        wrong.node_id()
    assert err.value.kind == "http" and "404" in str(err.value)
    wrong.close()


def _wait_for(condition, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


def test_settings_defaults_without_any_environment():
    assert NomadApiSettings.from_config(PluginConfig(), {}) == NomadApiSettings()


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("TRUE", True), ("yes", True), ("0", False), ("", False)])
def test_skip_verify_spellings(value, expected):
    assert NomadApiSettings.from_config(PluginConfig(), {"NOMAD_SKIP_VERIFY": value}).skip_verify is expected


def test_settings_read_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("NOMAD_ADDR", "http://from-env:4646")
    assert NomadApiSettings.from_config(PluginConfig()).address == "http://from-env:4646"


def test_an_unexpected_error_is_logged_and_the_round_retried(tmp_path, api, caplog):
    _reserver, _backend, rec = setup(tmp_path, api)
    calls = []

    def broken_catalog():
        calls.append(1)
        raise KeyError("catalog not ready")

    rec.catalog_source = broken_catalog
    with caplog.at_level("ERROR", logger="nomad_plugin.reconcile.reconciler"):
        rec.start()
        _wait_for(lambda: len(calls) >= 2, "a second round after the failed one")
        rec.stop()
    assert any(r.getMessage() == "reconciler round failed" and r.exc_info for r in caplog.records)


# --- decide(): timers restart, boundaries, deadlines ------------------------------------------------
def _granted(gid, *device_ids):
    from nomad_plugin.journal import EntryState, JournalEntry

    return JournalEntry(gid, tuple(device_ids), "g/t/n", "whole", ("C",), (), 0.0, EntryState.GRANTED)


def _alloc(alloc_id, *device_ids, status="running"):
    from nomad_plugin.reconcile.nomad_api import AllocView

    return AllocView(alloc_id, status, frozenset(device_ids))


def test_decide_reports_a_leak_exactly_at_grace_restarts_and_reports_again_after_it_went_away():
    from nomad_plugin.reconcile.reconciler import Timers, decide

    t, ours = Timers(), frozenset({"d1"})
    leaky = [_alloc("a", "d1")]
    assert decide([], leaky, ours, 100.0, 10.0, t).next_deadline == 110.0
    decide([_granted("g", "d1")], leaky, ours, 105.0, 10.0, t)  # journalled meanwhile: timer dropped
    d = decide([], leaky, ours, 106.0, 10.0, t)
    assert d.new_leaks == () and d.next_deadline == 116.0
    assert decide([], leaky, ours, 116.0, 10.0, t).new_leaks == (leaky[0],)
    assert decide([], leaky, ours, 117.0, 10.0, t).new_leaks == ()  # reported once
    decide([], [], ours, 118.0, 10.0, t)  # the allocation is gone
    decide([], leaky, ours, 119.0, 10.0, t)  # and back (same id)
    assert decide([], leaky, ours, 129.0, 10.0, t).new_leaks == (leaky[0],)


def test_decide_leaves_the_devices_of_tasks_not_started_out_of_the_leak_check():
    from nomad_plugin.reconcile.nomad_api import AllocView
    from nomad_plugin.reconcile.reconciler import Timers, decide

    t, ours = Timers(), frozenset({"d1", "d2"})
    waiting = AllocView("a", "running", frozenset({"d1", "d2"}), unstarted_ids=frozenset({"d1", "d2"}))
    assert decide([], [waiting], ours, 100.0, 10.0, t) == decide([], [], ours, 100.0, 10.0, Timers())
    assert decide([], [waiting], ours, 500.0, 10.0, t).new_leaks == ()
    half = AllocView("a", "running", frozenset({"d1", "d2"}), unstarted_ids=frozenset({"d2"}))  # one task started
    assert decide([], [half], ours, 501.0, 10.0, t).next_deadline == 511.0
    assert decide([], [half], ours, 511.0, 10.0, t).new_leaks == (half,)
    # A journalled grant on a task not started yet is still claimed by it (its Reserve came first).
    gone = decide([_granted("g", "d2")], [waiting], ours, 600.0, 10.0, t)
    assert gone.release == () and t.claims["g"].alloc_id == "a"


@pytest.mark.parametrize(
    ("states", "started"),
    [
        (None, False),  # the client has not reported the allocation's tasks yet
        ({}, False),
        ({"train": {"State": "pending", "StartedAt": "0001-01-01T00:00:00Z"}}, False),
        ({"train": {"State": "pending"}}, False),
        ({"train": {"State": "pending", "StartedAt": ""}}, False),
        ({"train": {"State": "dead", "Failed": True, "StartedAt": "0001-01-01T00:00:00Z"}}, False),  # died in prestart
        ({"train": {"State": "running", "StartedAt": "0001-01-01T00:00:00Z"}}, True),
        ({"train": {"State": "pending", "StartedAt": "2026-12-01T07:00:00Z"}}, True),  # between restarts
        ({"train": {"State": "dead", "StartedAt": "2026-12-01T07:00:00.123456789Z"}}, True),
        ({"other": {"State": "running"}}, False),  # another task's state says nothing about this one
        ({"train": "running"}, True),  # drifted shapes count as started: the leak check as before
        ({"train": {"State": "pending", "StartedAt": 1764572400}}, True),
        (["train"], True),
    ],
)
def test_parse_alloc_keeps_the_device_ids_of_tasks_not_started(states, started):
    raw = {
        "ID": "a",
        "ClientStatus": "running",
        "AllocatedResources": {"Tasks": {"train": {"Devices": [{"DeviceIDs": ["d1"]}]}, "side": {"Devices": None}}},
        "TaskStates": states,
    }
    view = parse_alloc(raw)
    assert view.device_ids == {"d1"}
    assert view.unstarted_ids == (frozenset() if started else frozenset({"d1"}))


# --- parse_alloc messages ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"ClientStatus": "running"}, "allocation without an ID"),
        ({"ID": "a1"}, "allocation 'a1' without ClientStatus"),
        (
            {"ID": "a1", "ClientStatus": "running", "AllocatedResources": "x"},
            "allocation 'a1': AllocatedResources is not an object",
        ),
        (
            {"ID": "a1", "ClientStatus": "running", "AllocatedResources": {"Tasks": "x"}},
            "allocation 'a1': AllocatedResources.Tasks is not an object",
        ),
        (
            {"ID": "a1", "ClientStatus": "running", "AllocatedResources": {"Tasks": {"t": "x"}}},
            "allocation 'a1': a task's resources are not an object",
        ),
        (
            {"ID": "a1", "ClientStatus": "running", "AllocatedResources": {"Tasks": {"t": {"Devices": "x"}}}},
            "allocation 'a1': a task's Devices is not a list",
        ),
        (
            {"ID": "a1", "ClientStatus": "running", "AllocatedResources": {"Tasks": {"t": {"Devices": ["x"]}}}},
            "allocation 'a1': a Devices entry is not an object",
        ),
        (
            {
                "ID": "x" * 70,
                "ClientStatus": "run",
                "AllocatedResources": {"Tasks": {"t": {"Devices": [{"DeviceIDs": ["a", 1]}]}}},
            },
            f"allocation {'x' * 64!r}: DeviceIDs is not a list of strings",
        ),
    ],
)
def test_parse_alloc_says_what_is_wrong(raw, message):
    with pytest.raises(ValueError) as err:
        parse_alloc(raw)
    assert str(err.value) == message


# --- the Reconciler against the API double -----------------------------------------------------------
def test_first_query_is_not_blocking_and_waits_shrink_to_the_next_deadline(tmp_path, api):
    clock = Clock()
    reserver, _backend, rec = setup(tmp_path, api, grace=5.0, clock=clock)
    rec.max_wait = 10.0
    grant_of(reserver, [card_uuid(0)])  # orphaned from the first observation: deadline 1005
    rec.round()
    first = [p for p, _ in api.requests if "/allocations" in p]
    assert "index=" not in first[0] and rec.rounds == 1
    clock.now = 1002.0
    rec.round()
    clock.now = 1004.75
    rec.round()
    waits = [p.split("wait=")[1] for p, _ in api.requests if "wait=" in p]
    assert waits == ["3010ms", "260ms"] and rec.rounds == 3


def test_without_a_client_a_round_only_retries_and_idles(tmp_path):
    reserver = Reserver(FakeBackend(), lambda: CAT, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    rec = Reconciler(reserver, None, lambda: CAT, grace=1.0, idle_period=0.01)
    rec.round()
    assert rec.rounds == 0


# --- TLS to the agent: CA, client certificate, skip_verify (real certificates from the openssl CLI) -------
def _openssl(*args, cwd):
    import subprocess

    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def tls_agent(tmp_path):
    """An HTTPS agent answering /v1/agent/self that requires a client certificate signed by the same CA."""
    import http.server
    import json
    import shutil
    import ssl
    import threading

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make test certificates")
    d = tmp_path / "pki"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=test-ca", cwd=d)  # fmt: skip
    for name, san in (("server", "subjectAltName=IP:127.0.0.1,DNS:client.global.nomad"), ("client", "")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        ext = ["-extfile", f"{name}.ext"] if san else []
        if san:
            (d / f"{name}.ext").write_text(san + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *ext, cwd=d)  # fmt: skip

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"stats": {"client": {"node_id": "tls-node"}}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sni: list[str | None] = []  # the server name each client asked for (None: none sent)
    ctx.sni_callback = lambda sock, name, context: sni.append(name)
    ctx.load_cert_chain(d / "server.pem", d / "server.key")
    ctx.load_verify_locations(d / "ca.pem")
    ctx.verify_mode = ssl.CERT_REQUIRED
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", d, sni
    finally:
        server.shutdown()
        server.server_close()


def _node_id(address, **settings):
    client = NomadClient(NomadApiSettings(address=address, timeout=10.0, **settings))
    try:
        return client.node_id()
    finally:
        client.close()


def test_tls_with_the_ca_and_a_client_certificate(tls_agent):
    address, d, _ = tls_agent
    kw = {"client_cert": str(d / "client.pem"), "client_key": str(d / "client.key")}
    assert _node_id(address, ca_cert=str(d / "ca.pem"), **kw) == "tls-node"
    assert _node_id(address, skip_verify=True, **kw) == "tls-node"  # no CA: verification off
    with pytest.raises(NomadApiError) as err:  # the system CAs do not know this server
        _node_id(address, **kw)
    assert err.value.kind == "unreachable"
    with pytest.raises(NomadApiError):  # the agent requires a client certificate
        _node_id(address, ca_cert=str(d / "ca.pem"))


def test_tls_client_key_may_live_in_the_certificate_file(tls_agent):
    address, d, _ = tls_agent
    both = d / "client-both.pem"
    both.write_text((d / "client.pem").read_text() + (d / "client.key").read_text())
    assert _node_id(address, ca_cert=str(d / "ca.pem"), client_cert=str(both)) == "tls-node"


# --- NomadClient against a scripted HTTP agent (TCP or a Unix socket) -----------------------------------
class _Scripted:
    """A tiny agent: ``answer(path) -> (status, headers, body bytes)``; records (path, headers)."""

    def __init__(self, answer, unix_path=None):
        import http.server
        import socketserver
        import threading

        self.seen = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.seen.append((self.path, dict(self.headers)))
                status, headers, body = answer(self.path)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

            def address_string(self):
                return "local"

        if unix_path is None:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            self.address = f"http://127.0.0.1:{self.server.server_address[1]}/"  # a trailing slash is fine
        else:

            class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
                daemon_threads = True

            self.server = UnixServer(unix_path, Handler)
            self.address = f"unix://{unix_path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


SELF = b'{"stats": {"client": {"node_id": "n-1"}}}'


def _agent(answer, **kw):
    return _Scripted(answer, **kw)


@contextmanager
def _client_of(answer, agent_kw=None, **settings):
    """A scripted agent and a NomadClient on it, both closed afterwards; yields (agent, client)."""
    agent = _agent(answer, **(agent_kw or {}))
    client = NomadClient(NomadApiSettings(address=agent.address, **settings))
    try:
        yield agent, client
    finally:
        client.close()
        agent.close()


def test_client_over_a_unix_socket_sends_the_token_and_reads_the_index(tmp_path):
    answer = lambda p: (200, {"X-Nomad-Index": "42"}, SELF if "self" in p else b"[]")  # noqa: E731
    with _client_of(answer, {"unix_path": str(tmp_path / "n.sock")}, token="tok") as (agent, client):
        assert client.node_id() == "n-1"
        page = client.node_allocations("a/b", 7, 0.0001)
        assert page.index == 42 and page.allocs == ()
    (p1, h1), (p2, _h2) = agent.seen
    assert p1 == "/v1/agent/self" and h1.get("X-Nomad-Token") == "tok"
    assert p2 == "/v1/node/a%2Fb/allocations?index=7&wait=1ms"


def test_client_without_token_sends_no_token_header_and_ignores_proxy_settings(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # a dead proxy: must not be used
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    answer = lambda p: (200, {"X-Nomad-Index": "not-a-number"}, SELF if "self" in p else b"[]")  # noqa: E731
    with _client_of(answer) as (agent, client):
        assert client.node_id() == "n-1"
        assert client.node_allocations("n-1").index == 0  # an unreadable index starts over
    assert all("X-Nomad-Token" not in h for _, h in agent.seen)


@pytest.mark.parametrize(
    ("status", "body", "message", "kind"),
    [
        (500, b"boom ", "Nomad API /v1/agent/self: HTTP 500 boom", "http"),
        (200, b"<html>", "Nomad API /v1/agent/self: answer is not JSON", "bad-response"),
        (
            200,
            b'{"stats": {"client": {"node_id": ""}}}',
            "the local Nomad agent did not report a client node_id (is it a client agent?); set nomad_node_id",
            "bad-response",
        ),
        (  # a server agent: no client stats at all
            200,
            b'{"stats": {}}',
            "the local Nomad agent did not report a client node_id (is it a client agent?); set nomad_node_id",
            "bad-response",
        ),
        (  # JSON, but not an object
            200,
            b'["stats"]',
            "the local Nomad agent did not report a client node_id (is it a client agent?); set nomad_node_id",
            "bad-response",
        ),
    ],
)
def test_client_errors_say_what_failed(status, body, message, kind):
    with _client_of(lambda p: (status, {}, body)) as (_, client), pytest.raises(NomadApiError) as err:
        client.node_id()
    assert (str(err.value), err.value.kind) == (message, kind)


def test_client_allocations_errors_say_what_failed():
    answer = lambda p: (200, {"X-Nomad-Index": "x"}, b'{"a": 1}' if "n-1" in p else b'[{"ID": 5}]')  # noqa: E731
    with _client_of(answer) as (_, client):
        with pytest.raises(NomadApiError) as err:
            client.node_allocations("n-1")
        assert (str(err.value), err.value.kind) == ("node allocations answer is not a list", "bad-response")
        with pytest.raises(NomadApiError) as err:
            client.node_allocations("n-2")
        assert (str(err.value), err.value.kind) == ("node allocations answer: allocation without an ID", "bad-response")


def test_client_unreachable_and_timeout_kinds(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = NomadClient(NomadApiSettings(address=f"http://127.0.0.1:{port}", timeout=2.0))
    with pytest.raises(NomadApiError) as err:
        client.node_id()
    client.close()
    assert err.value.kind == "unreachable" and str(err.value).startswith("Nomad API /v1/agent/self: cannot connect: ")

    def slow(path):
        time.sleep(3)
        return 200, {}, SELF

    with _client_of(slow, timeout=0.5) as (_, client), pytest.raises(NomadApiError) as err:
        client.node_id()
    assert (str(err.value), err.value.kind) == ("Nomad API /v1/agent/self: timed out after 0.5s", "timeout")


def test_decide_by_default_trusts_the_view_as_complete():
    from nomad_plugin.reconcile.reconciler import Timers, decide

    d = decide([_granted("g", "d1")], [], frozenset({"d1"}), 100.0, 0.0, Timers())
    assert d.release == (("g", "no live allocation on this node holds its devices (the token sees every namespace)"),)
    assert d.unverifiable == ()


def test_decide_an_unverifiable_grant_drops_its_orphan_timer_and_later_grants_are_still_judged():
    from nomad_plugin.reconcile.reconciler import Timers, decide

    t, ours = Timers(), frozenset({"d1", "d2"})
    grants = [_granted("a", "d1"), _granted("b", "d2")]
    decide(grants, [_alloc("x", "d2")], ours, 100.0, 10.0, t)  # complete view: a's orphan timer starts
    assert t.orphaned_since == {"a": 100.0}
    d = decide(grants, [_alloc("y", "d2")], ours, 105.0, 10.0, t, complete=False)
    assert d.unverifiable == ("a",) and t.orphaned_since == {}, "no evidence: the timer is dropped"
    assert t.claims["b"].alloc_id == "y", "the grant after an unverifiable one is still judged"
    d = decide(grants, [_alloc("y", "d2")], ours, 111.0, 10.0, t)
    assert d.release == () and d.next_deadline == 121.0, "the grace period starts again when evidence returns"


def test_a_blocking_query_may_take_its_wait_plus_nomads_jitter_and_a_plain_read_only_the_timeout():
    """Nomad answers a blocking query after up to wait + wait/16: the request's read timeout covers that.

    The timeout httpx applies is what the transport sees in the request (a real httpx
    feature), so this checks the budget itself, without waiting for it to run out.
    """
    import httpx

    seen: list[tuple[str, float]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.extensions["timeout"]["read"]))
        return httpx.Response(200, headers={"X-Nomad-Index": "9"}, json=[])

    client = NomadClient(NomadApiSettings(address="http://127.0.0.1:4646", timeout=2.0))
    client._client = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://127.0.0.1:4646")
    try:
        client.node_allocations("n-1")
        client.node_allocations("n-1", 5, wait=10.0)
    finally:
        client.close()
    assert [path for path, _ in seen] == ["/v1/node/n-1/allocations"] * 2
    assert seen[0][1] == pytest.approx(2.0), "a plain read waits only the client timeout"
    assert seen[1][1] == pytest.approx(2.0 + 11.0), "a 10 s blocking query may take 10 s + jitter + the timeout"


def test_tls_server_name_is_sent_and_the_certificate_checked_against_it(tls_agent):
    """``tls_server_name``: Nomad's agents carry certificates for names like client.global.nomad, not the IP."""
    address, d, sni = tls_agent
    kw = {"ca_cert": str(d / "ca.pem"), "client_cert": str(d / "client.pem"), "client_key": str(d / "client.key")}
    assert _node_id(address, **kw) == "tls-node"
    assert sni == [None], "an IP address was sent as a server name"
    assert _node_id(address, tls_server_name="client.global.nomad", **kw) == "tls-node"
    assert sni[1:] == ["client.global.nomad"]
    with pytest.raises(NomadApiError) as err:  # the certificate does not name this one
        _node_id(address, tls_server_name="server.global.nomad", **kw)
    assert err.value.kind == "unreachable" and "server.global.nomad" in str(err.value)
