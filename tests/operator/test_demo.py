"""`demo --json` as a subprocess: groups, reservation env and devices, numeric stats, health flip."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_json_shows_the_whole_tour() -> None:
    result = subprocess.run(
        [str(REPO / ".venv/bin/nomad-device-lingjun"), "demo", "--json", "--seconds", "2"],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ok"] and doc["elapsed_s"] < 30
    assert [g["name"] for g in doc["groups"]] == ["NVIDIA H800"]
    assert len(doc["groups"][0]["devices"]) == 8
    assert doc["groups"][0]["attributes"]["memory"] == {"value": 81559, "unit": "MiB"}
    res = doc["reservation"]
    assert res["group"] == "nvidia/gpu/NVIDIA H800" and len(res["ids"]) == 1
    envs = res["envs"]
    assert envs["LINGJUN_GRANT_ID"] and envs["LINGJUN_DEVICE_IDS"] == res["ids"][0]
    assert envs["NVIDIA_VISIBLE_DEVICES"] == res["ids"][0]
    assert "/dev/nvidiactl" in [d["host_path"] for d in res["devices"]]
    stats = doc["stats"]
    assert stats["samples"] >= 2
    (inst,) = stats["instances"]
    assert inst["device_id"] == res["ids"][0]
    assert isinstance(inst["summary"]["value"], int) and inst["summary"]["unit"] == "MiB"
    assert isinstance(inst["stats"]["GPU utilization"]["value"], (int, float))
    assert isinstance(inst["stats"]["Temperature"]["value"], (int, float))
    health = doc["health"]
    assert health["device_id"] not in res["ids"]
    assert "XID 79" in health["unhealthy_description"]
    assert health["unhealthy_after_s"] < 2.0
    assert 1.5 <= health["healthy_again_after_s"] < 10  # health_recovery_delay = 2s
    assert doc["shutdown"] == {"plugin_exit_code": 0, "temp_dir_removed": True}


def test_demo_text_has_the_nomad_cli_sections() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nomad_plugin", "demo", "--seconds", "1"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for needle in ("nomad node status -verbose", "Device Group Attributes: nvidia/gpu/NVIDIA H800", "LINGJUN_GRANT_ID",
                   "Device Stats (latest):", "healthy again", "removed"):  # fmt: skip
        assert needle in result.stdout
    assert "\x1b[" not in result.stdout
