"""The plugin loaded the way Nomad's client loads it (Go go-plugin client).

Positive tests run the real executable; the host's own ability to catch
Nomad-rule violations is proven against the fixture plugin in
fixtures/fake_plugin.py, one misbehaviour at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conformance.hostlib import FAKE_PLUGIN_HCL, REPO, HostProcess, HostRun, fake_plugin_args

Host = Callable[..., HostRun]
Interactive = Callable[..., HostProcess]


def _is_stats(seq: int) -> Callable[[dict], bool]:
    """The stats stream's message number ``seq``: it keeps delivering, whatever the box's speed."""
    return lambda e: e["event"] == "stats" and e["seq"] >= seq


def _assert_clean_shutdowns(run: HostRun, launches: int) -> None:
    shutdowns = run.of("shutdown")
    assert [s["launch"] for s in shutdowns] == list(range(1, launches + 1)), run.describe()
    for s in shutdowns:
        assert s["graceful"] is True, s
        assert s["seconds"] < 2.0, s
        assert s["socket_removed"] is True, s


# ---------------------------------------------------------------- real plugin


def test_real_plugin_passes_all_three_launches(
    interactive_host: Interactive, plugin_executable: Path, tmp_path: Path
) -> None:
    proc = interactive_host(
        [
            "--plugin", str(plugin_executable), "--config", str(REPO / "plugin.hcl"),
            "--phase", "all", "--duration", "0", "--stats-interval", "0.5",
            "--set", f'data_dir="{tmp_path / "data"}"',  # never the default, a real node's journal
        ]
    )  # fmt: skip
    proc.wait_for(_is_stats(2), timeout=60)
    run = proc.finish()
    assert run.returncode == 0, run.describe()
    assert run.summary["violations"] == 0

    info = run.of("plugin_info")[0]
    assert info["type"] == "DEVICE"
    assert info["name"] == "nomad-device-lingjun"
    assert info["api_version_selected"] == "v0.1.0"

    assert run.of("config_file")[0]["found"] is True
    decoded = run.of("config_decoded")[0]
    assert decoded["ok"] is True
    assert isinstance(decoded["value"], dict) and decoded["value"], decoded

    calls = [(s["launch"], s["call"], s["nomad_config"], s["ok"]) for s in run.of("set_config")]
    assert calls == [(2, 1, False, True), (2, 2, False, True), (3, 1, True, True)]

    fingerprints = run.of("fingerprint")
    assert fingerprints and fingerprints[0]["seq"] == 1 and fingerprints[0]["valid"] is True
    stats = run.of("stats")
    assert stats[0]["t_mono_ns"] >= fingerprints[0]["t_mono_ns"]
    _assert_clean_shutdowns(run, 3)


def test_real_plugin_rejects_invalid_option_at_validation(host: Host, plugin_executable: Path) -> None:
    run = host(
        [
            "--plugin", str(plugin_executable), "--config", str(REPO / "plugin.hcl"),
            "--phase", "validate", "--set", 'backend="bogus"', "--expect-set-config", "error",
        ]
    )  # fmt: skip
    assert run.returncode == 0, run.describe()
    (call,) = run.of("set_config")
    assert call["ok"] is False
    assert call["code"] == "InvalidArgument"
    assert "backend" in call["message"]


def test_host_fails_when_a_rejection_was_expected_but_config_accepted(host: Host, plugin_executable: Path) -> None:
    run = host(["--plugin", str(plugin_executable), "--phase", "validate", "--expect-set-config", "error"])
    assert run.returncode == 1
    assert run.rules == {"set_config.accepted"}


# ------------------------------------------------------ host self-tests (fake)


def test_fake_plugin_config_pipeline_matches_nomad(interactive_host: Interactive, tmp_path: Path) -> None:
    record = tmp_path / "setconfig.jsonl"
    args, env = fake_plugin_args("good")
    proc = interactive_host(
        [
            *args, "--config", str(FAKE_PLUGIN_HCL), "--plugin-name", "fake-device",
            "--set", 'socket_dir="/tmp/other-xdm"', "--duration", "0", "--stats-interval", "0.3",
            "--reserve-count", "2",
        ],
        env={**env, "FAKE_PLUGIN_RECORD": str(record)},
    )  # fmt: skip
    proc.wait_for(lambda e: e["event"] == "reserve", timeout=60)
    proc.wait_for(_is_stats(2), timeout=60)
    run = proc.finish()
    assert run.returncode == 0, run.describe()
    # HCL v1 shape: a nested block becomes a list holding one map.
    assert run.of("config_decoded")[0]["hcl_json"]["tags"] == [{"rack": "r1"}]

    received = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["has_nomad_config"] for r in received] == [False, False, True]
    assert all(r["plugin_api_version"] == "v0.1.0" for r in received)
    config = received[0]["config"]
    # cty/msgpack: 0.1 is not exact in float64, so it travels as a string.
    assert config == {"enabled": True, "ratio": "0.1", "socket_dir": "/tmp/other-xdm", "tags": {"rack": "r1"}}
    assert received[1]["config"] == config == received[2]["config"]

    (reserve,) = run.of("reserve")
    assert reserve["ok"] is True and reserve["nomad_would_call"] is True
    assert reserve["ids"] == ["card-0", "card-1"]
    assert reserve["envs"] == {"FAKE_VISIBLE_DEVICES": "card-0,card-1"}
    # go-plugin forwarded the plugin's hclog lines to the host's logger.
    assert "fake plugin serving" in run.stderr
    assert run.summary["logs"]["launch3"]["not_json"] == 0
    _assert_clean_shutdowns(run, 3)


@pytest.mark.parametrize(
    ("mode", "extra", "rules"),
    [
        ("unit_percent", [], {"fingerprint.attribute_unknown_unit"}),
        ("unit_c", [], {"fingerprint.attribute_unknown_unit"}),
        ("empty_attr", [], {"fingerprint.attribute_no_value"}),
        # the stats then name card-1, which no longer has a fingerprinted ID
        ("empty_id", [], {"fingerprint.device_id_empty", "stats.unknown_instance"}),
        ("dup_group", [], {"fingerprint.duplicate_group"}),
        ("end_stream", [], {"fingerprint.stream_ended"}),
        ("stats_unknown_id", ["--stats-interval", "0.2"], {"stats.unknown_instance"}),
        ("no_container_res", ["--reserve-count", "1"], {"reserve.container_res_missing"}),
        ("relative_path", ["--reserve-count", "1"], {"reserve.path_not_absolute"}),
        ("bad_api_version", [], {"plugin_info.api_version_no_overlap"}),
        ("reject_config", [], {"set_config.rejected"}),
        ("unnamed_default_attr", [], {"config_schema.convert"}),
    ],
)
def test_host_catches_violation(interactive_host: Interactive, mode: str, extra: list[str], rules: set[str]) -> None:
    args, env = fake_plugin_args(mode)
    proc = interactive_host([*args, "--phase", "run", "--duration", "0", *extra], env=env)
    seen: set[str] = set()

    def all_expected_rules_seen(e: dict) -> bool:
        if e["event"] == "violation":
            seen.add(e["rule"])
        return rules <= seen

    try:
        proc.wait_for(all_expected_rules_seen, timeout=60)
    except EOFError:
        pass  # the host ended by itself (stream ended, config refused): judged below
    run = proc.finish()
    assert run.returncode == 1, run.describe()
    assert run.rules == rules, run.describe()
    assert run.summary["violations"] == len(run.violations) >= 1


def test_host_flags_a_plugin_that_ignores_shutdown(host: Host) -> None:
    args, env = fake_plugin_args("slow_shutdown")
    run = host([*args, "--phase", "info"], env=env)
    assert run.returncode == 1
    assert run.rules == {"shutdown.not_graceful", "shutdown.socket_left"}
    (shutdown,) = run.of("shutdown")
    assert shutdown["graceful"] is False and shutdown["signal"] == "killed"


def test_host_flags_missing_plugin_block(host: Host) -> None:
    args, env = fake_plugin_args("good")
    run = host([*args, "--config", str(FAKE_PLUGIN_HCL), "--plugin-name", "not-there", "--phase", "info"], env=env)
    assert run.returncode == 1
    assert run.rules == {"config.plugin_block_missing"}


def test_interactive_reserve_while_streams_stay_open(interactive_host: Callable[..., HostProcess]) -> None:
    args, env = fake_plugin_args("good")
    proc = interactive_host([*args, "--phase", "run", "--duration", "0", "--stats-interval", "0.2"], env=env)
    proc.wait_for(lambda e: e["event"] == "fingerprint")
    proc.send({"op": "reserve", "ids": ["card-1"], "expect": "ok", "tag": "a"})
    ok = proc.wait_for(lambda e: e["event"] == "reserve")
    proc.send({"op": "reserve", "ids": ["nope"], "expect": "error", "tag": "b"})
    refused = proc.wait_for(lambda e: e["event"] == "reserve")
    proc.send({"op": "echo", "data": {"n": 1}})
    proc.wait_for(lambda e: e["event"] == "echo" and e["data"] == {"n": 1})
    proc.wait_for(_is_stats(1))  # the stats stream runs beside the commands
    run = proc.finish()

    assert (ok["tag"], ok["ok"], ok["envs"]) == ("a", True, {"FAKE_VISIBLE_DEVICES": "card-1"})
    assert (refused["tag"], refused["ok"], refused["code"]) == ("b", False, "NotFound")
    assert refused["nomad_would_call"] is False
    assert run.of("run_end")[0]["reason"] == "stop command"
    assert run.returncode == 0, run.describe()
