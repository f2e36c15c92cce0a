"""The Nomad token stays secret; the Prometheus endpoint is loopback-only by default; every outbound call has a timeout."""

from __future__ import annotations

import json
import math
import shutil
import socket
import tempfile
from pathlib import Path

import grpc
import httpx
import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.sim import Simulator
from tests.conformance.hostlib import built_host, real_plugin, start_host
from tests.doubles.nomad_api import NomadApiDouble
from tests.waiting import wait_until

TOKEN = "s3cr3t-7f1e9c4a-TOKEN"


@pytest.fixture
def sim():
    d = Path(tempfile.mkdtemp(prefix="hsec", dir="/tmp"))
    s = Simulator(d / "s", profile="h800-8").start()
    yield s, d
    s.stop()
    shutil.rmtree(d, ignore_errors=True)


def _host_args(sim_dir: Path, address: str, extra: dict[str, str]) -> list[str]:
    sets = {
        "backend": '"xdm"',
        "xdm_socket": json.dumps(str(sim_dir / "s" / "dp2mgr.sock")),
        "config_socket": json.dumps(str(sim_dir / "s" / "config-daemon.sock")),
        "data_dir": json.dumps(str(sim_dir / "data")),
        "nomad_address": json.dumps(address),
        "nvml_enrich": "false",
        **extra,
    }
    args = ["--plugin", str(real_plugin()), "--config", "plugin.hcl", "--phase", "all", "--duration", "0"]
    args += ["--reserve-count", "1", "--expect-reserve", "any"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return args


@pytest.mark.parametrize("where", ["config", "env", "file"])
@pytest.mark.parametrize("failure", ["forbidden", "unreachable"])
@pytest.mark.timeout(90)
def test_nomad_token_never_in_logs_or_errors(sim, where, failure):
    if shutil.which("go") is None:
        pytest.skip("go is missing (conformance host)")
    built_host()
    _s, d = sim
    with NomadApiDouble() as api:
        api.require_token("a-different-token")  # every call is answered 403
        address = api.address if failure == "forbidden" else "http://127.0.0.1:9"  # discard port: refused
        extra = {"nomad_token": json.dumps(TOKEN)} if where == "config" else {}
        if where == "file":  # nomad_token_file: only the plugin's user may read it
            token_file = d / "nomad.token"
            token_file.write_text(TOKEN + "\n")
            token_file.chmod(0o600)
            extra = {"nomad_token_file": json.dumps(str(token_file))}
        env = {"NOMAD_TOKEN": TOKEN} if where == "env" else None
        proc = start_host(_host_args(d, address, extra), env=env)
        try:
            # Wait for the reconciler to have met the failure, not for a fixed time. Reserve's
            # container_mounts lookup may meet the same failure first, so wait for the reconciler's line.
            if failure == "forbidden":
                wait_until(lambda: any(tok == TOKEN for _, tok in api.requests), "the plugin to send the token")
            wanted = "403" if failure == "forbidden" else "Nomad API"
            wait_until(
                lambda: any("reconciler" in line and wanted in line for line in proc.stderr_text().splitlines()),
                f"the reconciler to log the {failure} Nomad API ({wanted!r})",
            )
            proc.wait_for(lambda e: e["event"] == "reserve")
        finally:
            run = proc.finish()
    # The host's own config_file/config_decoded events echo the agent config it was given
    # (that is Nomad's side); everything else - the plugin's log lines on stderr, SetConfig,
    # Reserve and stream errors - is the plugin's output.
    plugin_events = [e for e in run if e.get("event") not in ("config_file", "config_decoded")]
    text = run.stderr + "\n".join(json.dumps(e) for e in plugin_events)
    assert "reconciler" in run.stderr, "the reconciler never ran: nothing was tested"
    assert ("403" in run.stderr) if failure == "forbidden" else ("Nomad API" in run.stderr)
    assert TOKEN not in text, "the Nomad token leaked into the plugin's output"
    assert TOKEN[:12] not in text


def test_token_not_in_settings_repr():
    from nomad_plugin.reconcile.nomad_api import NomadApiSettings

    settings = NomadApiSettings.from_config(PluginConfig(nomad_token=TOKEN))
    assert settings.token == TOKEN and TOKEN not in repr(settings)


def test_prometheus_endpoint_binds_loopback_by_default():
    from nomad_plugin.metrics import PluginMetrics
    from nomad_plugin.metrics.prometheus import start_endpoint
    from nomad_plugin.model.card import Inventory
    from nomad_plugin.stats.feed import MetricsCache

    assert PluginConfig().metrics_bind == "127.0.0.1"
    assert PluginConfig().metrics_port == 0  # off unless asked for
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = PluginConfig(metrics_port=port)
    endpoint = start_endpoint(config, PluginMetrics.for_config(config), MetricsCache(), lambda: Inventory())
    assert endpoint is not None
    try:
        listening = _listeners(port)
        assert listening and all(addr.startswith("127.") for addr in listening), listening
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
    finally:
        endpoint.stop()


def _listeners(port: int) -> list[str]:
    """Local addresses listening on ``port`` (from /proc/net/tcp{,6})."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            host, hexport = local.rsplit(":", 1)
            if int(hexport, 16) == port and state == "0A":
                if len(host) == 8:
                    found.append(socket.inet_ntoa(bytes.fromhex(host)[::-1]))
                else:
                    found.append("v6:" + host)
    return found


# --- timeouts ---------------------------------------------------------------------------------


class RecordingChannel:
    """Wraps a real grpc channel and records the kwargs of every call made through it."""

    def __init__(self, inner: grpc.Channel, calls: list[tuple[str, str, dict]]) -> None:
        self._inner, self._calls = inner, calls

    def _wrap(self, kind: str, method: str, multi):
        def call(request, **kwargs):
            self._calls.append((kind, method, dict(kwargs)))
            return multi(request, **kwargs)

        return call

    def unary_unary(self, method, *a, **k):
        return self._wrap("unary_unary", method, self._inner.unary_unary(method, *a, **k))

    def unary_stream(self, method, *a, **k):
        return self._wrap("unary_stream", method, self._inner.unary_stream(method, *a, **k))

    def stream_stream(self, method, *a, **k):
        return self._wrap("stream_stream", method, self._inner.stream_stream(method, *a, **k))

    def stream_unary(self, method, *a, **k):
        return self._wrap("stream_unary", method, self._inner.stream_unary(method, *a, **k))

    def close(self):
        self._inner.close()


@pytest.mark.timeout(60)
def test_every_unary_xdm_call_has_a_deadline(sim, monkeypatch):
    from nomad_plugin.model.grant import DeviceAsk, GrantRequest
    from nomad_plugin.xdm import client as client_mod

    s, d = sim
    calls: list[tuple[str, str, dict]] = []
    real = grpc.insecure_channel
    monkeypatch.setattr(client_mod.grpc, "insecure_channel", lambda *a, **k: RecordingChannel(real(*a, **k), calls))
    config = PluginConfig(
        xdm_socket=str(s.dp2mgr_path),
        config_socket=str(s.config_path),
        xdm_call_timeout=1.5,
        xdm_allocate_timeout=7.0,
        data_dir=str(d / "x"),
    )
    c = client_mod.XdmClient(config)
    try:
        c.list_supported_xpu_types()
        c.list_gpu_info()
        c.exporter_get_data_list()
        c.exporter_get_config()
        c.exporter_get_status()
        c.query_status()
        grant = c.allocate(GrantRequest("7d7f2f0e-0000-4000-8000-000000000001", (DeviceAsk(minor=0),)))
        c.release(grant.grant_id)
        sub = c.list_and_watch()
        next(iter(sub))
        sub.cancel()
    finally:
        c.close()
    unary = [(m, k) for kind, m, k in calls if kind != "unary_stream"]
    methods = {m.rsplit("/", 1)[-1] for m, _ in unary}
    assert {"Allocate", "Release", "ListGpuInfo", "QueryStatus"} <= methods, methods
    for method, kwargs in unary:
        timeout = kwargs.get("timeout")
        limit = 7.0 if method.endswith("/Allocate") else 1.5  # Allocate has its own deadline
        assert timeout is not None and 0 < timeout <= limit, f"{method} called with timeout={timeout}"
        assert not method.endswith("/Allocate") or timeout == 7.0, "Allocate waits xdm_allocate_timeout"


@pytest.mark.timeout(60)
def test_hung_xdm_call_returns_within_its_deadline(sim):
    from nomad_plugin.model.errors import PluginError
    from nomad_plugin.xdm.client import XdmClient

    s, _d = sim
    c = XdmClient(PluginConfig(xdm_socket=str(s.dp2mgr_path), config_socket=str(s.config_path), xdm_call_timeout=1.0))
    s.set_latency("ListGpuInfo", math.inf)  # XDM never answers
    try:
        with pytest.raises(PluginError, match="timed out"):  # returning at all proves the deadline
            c.list_gpu_info()
    finally:
        s.set_latency("ListGpuInfo", 0)
        c.close()


def test_nomad_http_client_has_timeouts():
    from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient

    with NomadApiDouble() as api:
        api.set_latency(3.0)
        c = NomadClient(NomadApiSettings(address=api.address, timeout=0.5))
        t = c._http.timeout
        assert None not in (t.connect, t.read, t.write, t.pool), t
        with pytest.raises(NomadApiError) as err:
            c.node_id()
        # "timeout" proves the client gave up before the double's 3 s answer.
        assert err.value.kind == "timeout"
        c.close()
        api.set_latency(0)
