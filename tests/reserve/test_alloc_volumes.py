"""``reconcile/alloc_volumes.py`` in detail: which allocation and task a Reserve is for, and every verdict.

``container_mounts = "auto"`` passes XDM's mounts only when the starting
task has no ``volume_mount``; when the lookup cannot tell, the mounts are
withheld and the verdict's reason is logged. So each candidate rule (exact
device block, terminal allocations skipped, replacements preferred over
stopping ones, the right group and task) decides what a task gets mounted,
and each reason is what an operator reads. test_mounts.py drives the
option end to end; this file pins the rules one by one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nomad_plugin.reconcile.alloc_volumes import AllocVolumeLookup, VolumeVerdict, find_candidates, task_volume_mounts
from nomad_plugin.reconcile.nomad_api import AllocPage, NomadApiSettings, NomadClient, parse_alloc
from tests.doubles.nomad_api import NomadApiDouble
from tests.doubles.nomad_jobs import HostVolume, NodeListWithoutJobs, add_alloc_with_job
from tests.doubles.reserve_fakes import Clock

IDS = ["GPU-aaaa", "GPU-bbbb"]


def alloc(alloc_id: str, ids: list[str], status: str = "running", desired: str | None = None, task: str = "t") -> dict:
    out: dict[str, Any] = {
        "ID": alloc_id,
        "ClientStatus": status,
        "AllocatedResources": {"Tasks": {task: {"Devices": [{"DeviceIDs": ids}]}}},
    }
    if desired is not None:
        out["DesiredStatus"] = desired
    return out


def found(allocs: list[Any], ids: list[str] = IDS) -> list[tuple[str, str]]:
    return [(c.alloc_id, c.task) for c in find_candidates(allocs, ids)]


# -- find_candidates -------------------------------------------------------------


def test_terminal_allocations_are_skipped_and_do_not_end_the_search() -> None:
    allocs = [alloc("old", IDS, "complete"), alloc("gone", IDS, "failed"), "not a map", alloc("new", IDS, "pending")]
    assert found(allocs) == [("new", "t")]


def test_an_allocation_without_a_client_status_is_live() -> None:
    live = alloc("a1", IDS)
    del live["ClientStatus"]
    assert found([live]) == [("a1", "t")]


def test_the_replacement_wins_over_the_allocation_still_stopping() -> None:
    stopping, starting = alloc("old", IDS, desired="stop"), alloc("new", IDS, "pending", desired="run")
    assert found([stopping, starting]) == [("new", "t")]
    assert found([starting, stopping]) == [("new", "t")]


def test_no_desired_status_counts_as_run() -> None:
    assert found([alloc("old", IDS, desired="stop"), alloc("new", IDS)]) == [("new", "t")]


def test_only_stopping_candidates_are_still_candidates() -> None:
    assert found([alloc("a", IDS, desired="stop"), alloc("b", IDS, desired="evict")]) == [("a", "t"), ("b", "t")]


def test_several_running_candidates_are_all_kept() -> None:
    assert found([alloc("a", IDS), alloc("b", list(reversed(IDS)), desired="run")]) == [("a", "t"), ("b", "t")]


def test_device_block_shapes_that_hold_nothing() -> None:
    """null and missing parts are empty, not errors: such an allocation is simply not a candidate."""
    shapes: list[dict[str, Any]] = [
        {"ID": "a", "AllocatedResources": None},
        {"ID": "b", "AllocatedResources": {"Tasks": None}},
        {"ID": "c", "AllocatedResources": {"Tasks": {"t": None}}},
        {"ID": "d", "AllocatedResources": {"Tasks": {"t": {"Devices": None}}}},
        {"ID": "e", "AllocatedResources": {"Tasks": {"t": {"Devices": [None]}}}},
    ]
    assert found(shapes) == []
    assert found(shapes, []) == [("e", "t")]  # the one block with no IDs matches an empty request


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (["Tasks"], "allocation 'a': AllocatedResources is not an object"),
        ({"Tasks": ["t"]}, "allocation 'a': AllocatedResources.Tasks is not an object"),
        ({"Tasks": {"t": ["GPU-aaaa"]}}, "allocation 'a': a task's resources are not an object"),
        ({"Tasks": {"t": "GPU-aaaa"}}, "allocation 'a': a task's resources are not an object"),
        ({"Tasks": {"t": {"Devices": {"DeviceIDs": IDS}}}}, "allocation 'a': a task's Devices is not a list"),
        ({"Tasks": {"t": {"Devices": ["GPU-aaaa"]}}}, "allocation 'a': a Devices entry is not an object"),
        (
            {"Tasks": {"t": {"Devices": [{"DeviceIDs": "GPU-aaaa"}]}}},
            "allocation 'a': DeviceIDs is not a list of strings",
        ),
        ({"Tasks": {"t": {"Devices": [{"DeviceIDs": [1]}]}}}, "allocation 'a': DeviceIDs is not a list of strings"),
    ],
)
def test_a_drifted_shape_is_an_error_naming_the_part(resources: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        find_candidates([{"ID": "a", "AllocatedResources": resources}], IDS)
    assert str(info.value) == message


# -- task_volume_mounts ------------------------------------------------------------


def job(*groups: tuple[str, list[tuple[str, Any]]]) -> dict[str, Any]:
    return {
        "TaskGroups": [
            {"Name": name, "Tasks": [{"Name": t, "VolumeMounts": m} for t, m in tasks]} for name, tasks in groups
        ]
    }


def test_the_task_is_looked_up_in_its_own_group() -> None:
    other = ("other", [("t", [{"Volume": "x"}])])
    mine = ("g", [("sidecar", [{"Volume": "y"}]), ("t", [{"Volume": "z"}])])
    allocation = {"TaskGroup": "g", "Job": job(other, mine)}
    assert task_volume_mounts(allocation, "t") == [{"Volume": "z"}]
    assert task_volume_mounts(allocation, "sidecar") == [{"Volume": "y"}]


def test_odd_entries_are_skipped_and_null_mounts_are_none() -> None:
    allocation = {"TaskGroup": "g", "Job": {"TaskGroups": ["x", {"Name": "g", "Tasks": ["y", {"Name": "t"}]}]}}
    assert task_volume_mounts(allocation, "t") == []


def test_a_task_or_job_that_is_not_there_is_none() -> None:
    allocation = {"TaskGroup": "g", "Job": job(("g", [("t", None)]))}
    assert task_volume_mounts(allocation, "missing") is None
    assert task_volume_mounts({**allocation, "TaskGroup": "nope"}, "t") is None
    assert task_volume_mounts({"TaskGroup": "g"}, "t") is None
    assert task_volume_mounts({"TaskGroup": "g", "Job": "train"}, "t") is None


def test_mounts_that_are_not_a_list_are_an_error() -> None:
    with pytest.raises(ValueError) as info:
        task_volume_mounts({"TaskGroup": "g", "Job": job(("g", [("t", {"Volume": "x"})]))}, "t")
    assert str(info.value) == "task 't': VolumeMounts is not a list"


# -- AllocVolumeLookup verdicts, against the API double -----------------------------


@pytest.fixture
def api() -> Iterator[NomadApiDouble]:
    with NomadApiDouble() as double:
        yield double


def lookup(api: NomadApiDouble, *, timeout: float = 30.0, **kw: Any) -> AllocVolumeLookup:
    return AllocVolumeLookup(NomadClient(NomadApiSettings(address=api.address, timeout=timeout)), **kw)


def paths(api: NomadApiDouble) -> list[str]:
    return [p.split("?", 1)[0] for p, _ in api.requests]


def test_known_verdicts_in_full_and_no_extra_request(api: NomadApiDouble) -> None:
    add_alloc_with_job(api, "a1", IDS)
    assert lookup(api).lookup(IDS) == VolumeVerdict(True, False, "task a1/task has no volume_mount")
    add_alloc_with_job(api, "b1", ["GPU-cccc"], volumes=[HostVolume()])
    add_alloc_with_job(api, "b2", ["GPU-cccc"], "pending", volumes=[HostVolume()])
    assert lookup(api).lookup(["GPU-cccc"]) == VolumeVerdict(True, True, "task b1/task, b2/task has volume_mount")
    assert not [p for p in paths(api) if p.startswith("/v1/allocation/")], "the list already had the job"


def test_disagreeing_candidates_in_full(api: NomadApiDouble) -> None:
    add_alloc_with_job(api, "a1", IDS, volumes=[HostVolume()])
    add_alloc_with_job(api, "a2", IDS, "pending")
    add_alloc_with_job(api, "a3", IDS, "pending")
    add_alloc_with_job(api, "a4", IDS, volumes=[HostVolume()])
    assert lookup(api).lookup(IDS) == VolumeVerdict(
        False, False, "allocations disagree: a1/task, a4/task mount volumes, a2/task, a3/task do not"
    )


def test_no_allocation_yet_in_full_after_every_attempt(api: NomadApiDouble) -> None:
    slept: list[float] = []
    verdict = lookup(api, attempts=3, retry_delay=0.25, sleep=slept.append).lookup(IDS)
    assert verdict == VolumeVerdict(
        False, False, f"no live allocation on node {api.node_id} holds device IDs GPU-aaaa, GPU-bbbb yet"
    )
    assert slept == [0.25, 0.25], "a pause between tries, none after the last"
    assert paths(api).count(f"/v1/node/{api.node_id}/allocations") == 3


def test_one_attempt_means_one_request_and_no_pause(api: NomadApiDouble) -> None:
    slept: list[float] = []
    assert not lookup(api, attempts=1, sleep=slept.append).lookup(IDS).known
    assert slept == []
    assert paths(api).count(f"/v1/node/{api.node_id}/allocations") == 1
    slept.clear()
    assert not lookup(api, attempts=0, sleep=slept.append).lookup(IDS).known  # at least one try
    assert slept == []
    assert paths(api).count(f"/v1/node/{api.node_id}/allocations") == 2


def test_a_given_node_id_is_used_as_is_and_quoted(api: NomadApiDouble) -> None:
    assert not lookup(api, node_id="odd/node id", attempts=1).lookup(IDS).known
    assert paths(api) == ["/v1/node/odd%2Fnode%20id/allocations"], "the agent was asked for its node id"


def test_the_node_id_is_asked_of_the_agent_once(api: NomadApiDouble) -> None:
    finder = lookup(api, attempts=1)
    finder.lookup(IDS)
    finder.lookup(IDS)
    assert paths(api).count("/v1/agent/self") == 1


def test_api_error_verdict_in_full(api: NomadApiDouble) -> None:
    api.require_token("secret")
    verdict = lookup(api, node_id="n1").lookup(IDS)
    assert verdict == VolumeVerdict(
        False,
        False,
        "the Nomad API could not be asked (Nomad API /v1/node/n1/allocations: 403 Permission denied "
        "(the token needs node:read))",
    )


def test_the_client_timeout_bounds_each_request(api: NomadApiDouble) -> None:
    api.set_latency(30.0)
    verdict = lookup(api, node_id="n1", timeout=0.5).lookup(IDS)
    assert verdict == VolumeVerdict(
        False, False, "the Nomad API could not be asked (Nomad API /v1/node/n1/allocations: timed out after 0.5s)"
    )


def test_shape_error_verdict_in_full(api: NomadApiDouble) -> None:
    add_alloc_with_job(api, "a1", IDS)
    with api._cond:
        api._allocs["a1"]["AllocatedResources"]["Tasks"]["task"]["Devices"] = "GPU-aaaa"
    assert lookup(api).lookup(IDS) == VolumeVerdict(
        False, False, "the Nomad API answer has an unexpected shape (allocation 'a1': a task's Devices is not a list)"
    )


class ScriptedAllocation(NodeListWithoutJobs):
    """The list leaves the job out; ``/v1/allocation/<id>`` answers ``self.full`` (any JSON)."""

    full: Any = None

    def _serve(self, path: str, token: str) -> tuple[int, Any, int] | None:
        if path.startswith("/v1/allocation/"):
            with self._cond:
                self.requests.append((path, token))
                return 200, self.full, self._index
        return super()._serve(path, token)


@pytest.mark.parametrize("full", [[], 7, {"TaskGroup": "web", "Job": {"TaskGroups": []}}])
def test_a_task_missing_from_the_full_allocation_is_unknown(full: Any) -> None:
    with ScriptedAllocation() as api:
        api.full = full
        add_alloc_with_job(api, "a/1", IDS)
        verdict = lookup(api).lookup(IDS)
    assert verdict == VolumeVerdict(False, False, "allocation a/1: task 'task' is not in the allocation's job")
    assert "/v1/allocation/a%2F1" in paths(api)


def test_a_node_list_that_is_not_a_list_is_a_shape_error() -> None:
    class NotAList(NomadApiDouble):
        def _node_allocs(self, *args: Any, **kwargs: Any) -> tuple[int, Any, int]:
            return 200, {"allocs": []}, self.index

    with NotAList() as api:
        verdict = lookup(api).lookup(IDS)
    assert verdict == VolumeVerdict(
        False, False, "the Nomad API answer has an unexpected shape (node allocations answer is not a list)"
    )


# -- after a timeout, the agent is not asked again for a while ------------------------


def allocation_requests(api: NomadApiDouble) -> int:
    return paths(api).count(f"/v1/node/{api.node_id}/allocations")


def test_after_a_timeout_the_agent_is_not_asked_until_the_backoff_ends(api: NomadApiDouble) -> None:
    clock = Clock()
    finder = lookup(api, node_id=api.node_id, timeout=0.3, backoff=10.0, clock=clock)
    api.set_latency(30.0)
    first = finder.lookup(IDS)
    assert (
        first.reason
        == f"the Nomad API could not be asked (Nomad API /v1/node/{api.node_id}/allocations: timed out after 0.3s)"
    )
    assert allocation_requests(api) == 1
    api.set_latency(0.0)
    add_alloc_with_job(api, "a1", IDS)
    clock.now += 9.94
    assert finder.lookup(IDS) == VolumeVerdict(
        False,
        False,
        f"the Nomad API could not be asked (Nomad API /v1/node/{api.node_id}/allocations: timed out after 0.3s, "
        "9.9 s ago; "
        "asked again 10 s after a timeout)",
    )
    assert allocation_requests(api) == 1, "asked again inside the backoff"
    clock.now += 0.06
    assert finder.lookup(IDS) == VolumeVerdict(True, False, "task a1/task has no volume_mount")
    assert allocation_requests(api) == 2
    assert finder.lookup(IDS).known
    assert allocation_requests(api) == 3


def test_fast_failures_are_asked_again_every_time(api: NomadApiDouble) -> None:
    finder = lookup(api, node_id=api.node_id, clock=Clock())
    api.require_token("secret")
    finder.lookup(IDS)
    assert "403" in finder.lookup(IDS).reason
    assert allocation_requests(api) == 2, "a 403 is not a timeout"
    api.set_down(True)  # the connection closes without an answer: unreachable, not a timeout
    assert "could not be asked" in finder.lookup(IDS).reason
    assert "s ago" not in finder.lookup(IDS).reason


# -- parse_alloc keeps what the lookup needs ------------------------------------------


def test_parse_alloc_keeps_each_device_block_with_its_task() -> None:
    raw = alloc("a1", IDS, desired="stop", task="train")
    raw["AllocatedResources"]["Tasks"]["log"] = {"Devices": [{"DeviceIDs": ["GPU-cccc"]}, {"DeviceIDs": []}]}
    view = parse_alloc(raw)
    assert view.task_devices == (
        ("train", frozenset(IDS)),
        ("log", frozenset(["GPU-cccc"])),
        ("log", frozenset()),
    )
    assert view.device_ids == frozenset([*IDS, "GPU-cccc"])
    drifted = alloc("a3", IDS, desired=7)  # type: ignore[arg-type]
    assert parse_alloc(drifted).device_ids == frozenset(IDS), "a drifted DesiredStatus fails nothing"
    assert found([drifted, alloc("a4", IDS)]) == [("a4", "t")], "and it is not read as run"


# -- the reconciler's last page names the allocation ---------------------------------


def page_of(api: NomadApiDouble) -> AllocPage:
    """The node's allocations as the reconciler's blocking query last answered."""
    return NomadClient(NomadApiSettings(address=api.address)).node_allocations(api.node_id)


def test_the_allocation_the_page_names_is_read_alone(api: NomadApiDouble) -> None:
    add_alloc_with_job(api, "a1", IDS, volumes=[HostVolume()])
    add_alloc_with_job(api, "b1", ["GPU-cccc"])
    page = page_of(api)
    api.requests.clear()
    assert lookup(api, recent=lambda: page).lookup(IDS) == VolumeVerdict(True, True, "task a1/task has volume_mount")
    assert paths(api) == ["/v1/agent/self", "/v1/allocation/a1"], "the node's ID, then the one allocation"


def test_a_page_from_before_the_replacement_falls_back_to_the_whole_list(api: NomadApiDouble) -> None:
    """The page names the old holder; Nomad has since asked it to stop and placed the replacement."""
    add_alloc_with_job(api, "old", IDS)
    page = page_of(api)
    add_alloc_with_job(api, "old", IDS, desired_status="stop")
    add_alloc_with_job(api, "new", IDS, "pending", volumes=[HostVolume()])
    api.requests.clear()
    assert lookup(api, recent=lambda: page).lookup(IDS) == VolumeVerdict(True, True, "task new/task has volume_mount")
    assert paths(api)[-1] == f"/v1/node/{api.node_id}/allocations"


@pytest.mark.parametrize("change", ["complete", "gone"])
def test_a_named_allocation_that_ended_or_is_gone_falls_back_to_the_whole_list(
    api: NomadApiDouble, change: str
) -> None:
    add_alloc_with_job(api, "old", IDS)
    page = page_of(api)
    if change == "gone":
        api.remove_alloc("old")
    else:
        api.set_status("old", change)
    add_alloc_with_job(api, "new", IDS, "pending")
    assert lookup(api, recent=lambda: page).lookup(IDS) == VolumeVerdict(
        True, False, "task new/task has no volume_mount"
    )
    assert paths(api)[-1] == f"/v1/node/{api.node_id}/allocations"


def test_a_page_that_names_no_holder_falls_back_to_the_whole_list(api: NomadApiDouble) -> None:
    page = page_of(api)
    add_alloc_with_job(api, "a1", IDS)
    assert lookup(api, recent=lambda: page).lookup(IDS) == VolumeVerdict(
        True, False, "task a1/task has no volume_mount"
    )
    assert paths(api)[-1] == f"/v1/node/{api.node_id}/allocations"
