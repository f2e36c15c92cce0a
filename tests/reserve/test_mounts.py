"""``container_mounts``: the option, the task lookup against the Nomad API double, the policy."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest

from nomad_plugin.config.decode import decode_config
from nomad_plugin.config.model import ConfigError
from nomad_plugin.config.options import CARD_BLOCK, OPTIONS
from nomad_plugin.nomad.reserve import MountDecision, MountPolicy
from nomad_plugin.reconcile.alloc_volumes import AllocVolumeLookup, VolumeVerdict
from nomad_plugin.reconcile.nomad_api import NomadApiSettings, NomadClient
from tests.doubles.nomad_api import NomadApiDouble
from tests.doubles.nomad_jobs import HostVolume, NodeListWithoutJobs, add_alloc_with_job

IDS = ["GPU-aaaa", "GPU-bbbb"]


def _decode(**values: object) -> str:
    obj: dict[str, object] = {opt.name: None for opt in OPTIONS}
    obj[CARD_BLOCK] = []
    obj.update(values)
    return decode_config(msgpack.packb(obj)).container_mounts


def test_option_defaults_to_auto_and_accepts_the_three_modes() -> None:
    assert _decode() == "auto"
    for mode in ("auto", "always", "never"):
        assert _decode(container_mounts=mode) == mode


def test_option_rejects_other_values_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r'"container_mounts": value \'sometimes\''):
        _decode(container_mounts="sometimes")


def test_xdm_mounts_is_no_option() -> None:
    with pytest.raises(ConfigError, match="xdm_mounts"):
        _decode(xdm_mounts=True)


@pytest.fixture
def api() -> Iterator[NomadApiDouble]:
    with NomadApiDouble() as double:
        yield double


def _lookup(api: NomadApiDouble, token: str = "", **kw: object) -> AllocVolumeLookup:
    client = NomadClient(NomadApiSettings(address=api.address, token=token, timeout=30.0))
    return AllocVolumeLookup(client, **kw)  # type: ignore[arg-type]


def test_lookup_finds_a_pending_task_with_a_host_volume(api: NomadApiDouble) -> None:
    add_alloc_with_job(api, "a1", IDS, "pending", volumes=[HostVolume()])
    verdict = _lookup(api).lookup(IDS)
    assert verdict == VolumeVerdict(True, True, "task a1/task has volume_mount")


def test_lookup_finds_a_task_without_volumes(api: NomadApiDouble) -> None:
    add_alloc_with_job(api, "a1", IDS)
    assert _lookup(api).lookup(list(reversed(IDS))).has_volume_mounts is False
    assert _lookup(api).lookup(IDS).known


def test_lookup_reads_the_allocation_when_the_list_has_no_job() -> None:
    with NodeListWithoutJobs() as api:
        add_alloc_with_job(api, "a1", IDS, "pending", volumes=[HostVolume()])
        verdict = _lookup(api).lookup(IDS)
        assert verdict.known and verdict.has_volume_mounts
        assert any(path.startswith("/v1/allocation/a1") for path, _ in api.requests)


def test_lookup_needs_the_exact_device_block(api: NomadApiDouble) -> None:
    add_alloc_with_job(api, "a1", IDS)
    verdict = _lookup(api, attempts=1).lookup(IDS[:1])  # a subset is another device block
    assert not verdict.known and "no live allocation" in verdict.reason


def test_lookup_retries_until_the_allocation_is_visible(api: NomadApiDouble) -> None:
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the allocation shows up while the plugin waits
        slept.append(seconds)
        add_alloc_with_job(api, "late", IDS, "pending", volumes=[HostVolume()])

    verdict = _lookup(api, sleep=sleep).lookup(IDS)
    assert slept and verdict.known and verdict.has_volume_mounts


def test_lookup_cannot_tell_when_forbidden_and_says_so(api: NomadApiDouble) -> None:
    add_alloc_with_job(api, "a1", IDS)
    api.require_token("secret-token")
    verdict = _lookup(api, token="wrong").lookup(IDS)
    assert not verdict.known
    assert "403" in verdict.reason and "secret-token" not in verdict.reason


def test_lookup_cannot_tell_when_candidates_disagree(api: NomadApiDouble) -> None:
    add_alloc_with_job(api, "a1", IDS, "running", volumes=[HostVolume()])
    add_alloc_with_job(api, "a2", IDS, "pending")
    verdict = _lookup(api).lookup(IDS)
    assert not verdict.known and "disagree" in verdict.reason


def test_lookup_cannot_tell_on_a_drifted_shape(api: NomadApiDouble) -> None:
    add_alloc_with_job(api, "a1", IDS)
    with api._cond:
        api._allocs["a1"]["AllocatedResources"]["Tasks"]["task"]["Devices"][0]["DeviceIDs"] = "GPU-aaaa"
    verdict = _lookup(api).lookup(IDS)
    assert not verdict.known and "unexpected shape" in verdict.reason


def test_policy_modes_and_a_failing_lookup() -> None:
    seen: list[str] = []

    def boom(ids: object) -> VolumeVerdict:
        raise RuntimeError("bug")

    assert MountPolicy("always").decide(IDS).passed
    assert not MountPolicy("never").decide(IDS).passed
    decision = MountPolicy("auto", boom, lambda d: seen.append(d.outcome)).decide(IDS)
    assert (decision.passed, decision.outcome) == (False, "unknown")
    assert seen == ["unknown"]
    assert MountPolicy("auto", lambda ids: VolumeVerdict(True, False, "x")).decide(IDS).passed
    assert MountPolicy("auto", lambda ids: VolumeVerdict(True, True, "x")).decide(IDS).outcome == "volumes"
    with pytest.raises(ValueError, match="container_mounts"):
        MountPolicy("sometimes")


def test_after_close_auto_asks_nothing_and_the_other_modes_still_decide() -> None:
    asked: list[object] = []
    seen: list[str] = []

    def lookup(ids: object) -> VolumeVerdict:
        asked.append(ids)
        return VolumeVerdict(True, False, "task a/t has no volume_mount")

    policy = MountPolicy("auto", lookup, lambda d: seen.append(d.outcome))
    assert policy.decide(IDS).passed and len(asked) == 1
    policy.close()
    assert policy.decide(IDS) == MountDecision(False, "unknown", "the plugin is shutting down")
    assert len(asked) == 1, "a question was asked after close()"
    assert seen == ["passed", "unknown"], "every decision used is counted"
    never = MountPolicy("never")
    never.close()
    assert never.decide(IDS).outcome == "never"
