"""The reconciler's details an operator reads or relies on, pinned one by one.

What Nomad's answers become (namespace, job, modify time), what each error
says and which kind it is (the reconciler decides on the kind), the ACL
endpoints' quoting and messages, the visibility verdicts in full (doctor and
the startup warning print them), the reconciler thread's name, daemon flag
and stop, and claimed allocations that left the list without Nomad
confirming their end (kept, each with an info line).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nomad_plugin.config.model import PluginConfig
from nomad_plugin.journal import Journal
from nomad_plugin.nomad.reserve import Reserver
from nomad_plugin.reconcile.nomad_api import (
    AllocPage,
    AllocView,
    NomadApiError,
    NomadApiSettings,
    NomadClient,
    Visibility,
    judge_policies,
    namespace_rules,
    parse_alloc,
    required_capability,
)
from nomad_plugin.reconcile.reconciler import Reconciler, ReconcilerState
from nomad_plugin.util.threads import Backoff
from tests.doubles.nomad_api import NomadApiDouble
from tests.doubles.reserve_fakes import Clock, FakeBackend, card_uuid, catalog, whole_group
from tests.waiting import wait_until

CAT = catalog(whole_group(4))


# -- parse_alloc: the fields besides the devices ------------------------------------


def raw(**extra: Any) -> dict[str, Any]:
    return {"ID": "a1", "ClientStatus": "running", **extra}


@pytest.mark.parametrize(
    ("extra", "namespace", "job", "modify_time"),
    [
        ({}, "default", "", 0.0),
        ({"Namespace": None, "JobID": None, "ModifyTime": None}, "default", "", 0.0),
        ({"Namespace": "", "JobID": "", "ModifyTime": 0}, "default", "", 0.0),
        (
            {"Namespace": "team-a", "JobID": "train", "ModifyTime": 1_700_000_000_500_000_000},
            "team-a",
            "train",
            1.7e9 + 0.5,
        ),
        ({"ModifyTime": 2.5e9}, "default", "", 2.5),
        ({"ModifyTime": True}, "default", "", 0.0),  # a bool is no time
        ({"ModifyTime": "1700000000"}, "default", "", 0.0),
    ],
)
def test_parse_alloc_namespace_job_and_modify_time(extra, namespace, job, modify_time) -> None:
    view = parse_alloc(raw(**extra))
    assert (view.namespace, view.job, view.modify_time) == (namespace, job, modify_time)


@pytest.mark.parametrize("extra", [{"Namespace": 7}, {"JobID": ["train"]}, {"Namespace": {"n": 1}, "JobID": "x"}])
def test_parse_alloc_refuses_a_namespace_or_job_that_is_not_a_string(extra) -> None:
    with pytest.raises(ValueError) as info:
        parse_alloc(raw(**extra))
    assert str(info.value) == "allocation 'a1': Namespace/JobID is not a string"


def test_required_capability_per_endpoint() -> None:
    assert required_capability("/v1/agent/self") == "agent:read (or set nomad_node_id to skip /v1/agent/self)"
    assert required_capability("/v1/node/n1/allocations") == "node:read"
    assert required_capability("/v1/allocation/a1") == "node:read"


# -- the client's ACL and allocation endpoints -------------------------------------------


class Scripted(NomadApiDouble):
    """Answers ``self.answers[path]`` (status, body) for the paths it holds; the double does the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[str, tuple[int, Any]] = {}

    def _serve(self, path: str, token: str) -> tuple[int, Any, int] | None:
        if path in self.answers:
            with self._cond:
                self.requests.append((path, token))
            status, body = self.answers[path]
            return status, body, self.index
        return super()._serve(path, token)


@pytest.fixture
def api() -> Iterator[Scripted]:
    double = Scripted().start()
    try:
        yield double
    finally:
        double.stop()


def client(api: NomadApiDouble, token: str = "", timeout: float = 30.0) -> NomadClient:
    return NomadClient(NomadApiSettings(address=api.address, token=token, timeout=timeout))


def paths(api: NomadApiDouble) -> list[str]:
    return [p for p, _ in api.requests]


def test_policy_and_role_names_are_quoted_whole(api: Scripted) -> None:
    api.answers["/v1/acl/policy/team%2Fa%20b"] = (200, {"Name": "team/a b", "Rules": "x"})
    api.answers["/v1/acl/role/r%2F1"] = (200, {"Policies": [{"Name": "p"}, "junk", {"Name": 3}]})
    api.answers["/v1/allocation/a%2F1"] = (404, "alloc not found")
    c = client(api)
    assert c.acl_policy_rules("team/a b") == "x"
    assert c.acl_role_policies("r/1") == ["p"]
    assert c.allocation("a/1") is None
    assert paths(api) == ["/v1/acl/policy/team%2Fa%20b", "/v1/acl/role/r%2F1", "/v1/allocation/a%2F1"]


def test_a_refused_acl_read_says_the_token_must_be_valid(api: Scripted) -> None:
    api.answers["/v1/acl/policy/p"] = (403, "Permission denied")
    api.answers["/v1/acl/role/r"] = (403, "Permission denied")
    c = client(api)
    for call, path in ((lambda: c.acl_policy_rules("p"), "policy/p"), (lambda: c.acl_role_policies("r"), "role/r")):
        with pytest.raises(NomadApiError) as info:
            call()
        assert str(info.value) == (
            f"Nomad API /v1/acl/{path}: 403 Permission denied (the token needs to be a valid ACL token)"
        )
        assert info.value.kind == "forbidden"


@pytest.mark.parametrize("body", [{"Name": "p"}, {"Rules": 3}, ["Rules"], 5])
def test_a_policy_answer_without_rules_is_a_bad_response(api: Scripted, body: Any) -> None:
    api.answers["/v1/acl/policy/p"] = (200, body)
    with pytest.raises(NomadApiError) as info:
        client(api).acl_policy_rules("p")
    assert (str(info.value), info.value.kind) == ("ACL policy 'p': no Rules in the answer", "bad-response")


@pytest.mark.parametrize("body", [{"ID": "r"}, {"Policies": "p"}, [{"Name": "p"}], 5])
def test_a_role_answer_without_policies_is_a_bad_response(api: Scripted, body: Any) -> None:
    api.answers["/v1/acl/role/r"] = (200, body)
    with pytest.raises(NomadApiError) as info:
        client(api).acl_role_policies("r")
    assert (str(info.value), info.value.kind) == ("ACL role 'r': no Policies in the answer", "bad-response")


def test_an_allocation_answer_of_the_wrong_shape_is_a_bad_response(api: Scripted) -> None:
    api.answers["/v1/allocation/a1"] = (200, {"ID": 5})
    with pytest.raises(NomadApiError) as info:
        client(api).allocation("a1")
    assert (str(info.value), info.value.kind) == ("allocation answer: allocation without an ID", "bad-response")


def test_an_answer_that_is_not_json_is_a_bad_response(api: Scripted) -> None:
    api.answers["/v1/allocation/a1"] = (200, "not json")  # the double sends a str as text
    with pytest.raises(NomadApiError) as info:
        client(api).allocation("a1")
    assert (str(info.value), info.value.kind) == ("Nomad API /v1/allocation/a1: answer is not JSON", "bad-response")


@pytest.mark.parametrize("call", ["acl_policy_rules", "acl_role_policies", "allocation"])
def test_every_endpoint_gives_up_after_the_client_timeout(api: Scripted, call: str) -> None:
    api.set_latency(30.0)
    with pytest.raises(NomadApiError) as info:
        getattr(client(api, timeout=0.5), call)("x")
    assert info.value.kind == "timeout" and str(info.value).endswith("timed out after 0.5s")


# -- visibility verdicts in full ----------------------------------------------------------

NODE = 'node { policy = "read" }\nagent { policy = "read" }\n'
STAR = 'namespace "*" { policy = "read" }\n'


@pytest.mark.parametrize(
    ("rules", "verdict"),
    [
        ({}, Visibility(False, "the token has no policies, so it reads no namespace")),
        (
            {"p": NODE},
            Visibility(False, 'no policy of the token has a namespace "*" rule, so some namespaces are unread'),
        ),
        (
            {"p": STAR, "q": 'namespace "team-b" { policy = "deny" }\nnamespace "team-a" { policy = "scale" }'},
            Visibility(False, "namespace rule(s) 'team-a', 'team-b' do not grant read-job"),
        ),
        (
            {"p": STAR, "q": 'namespace "team-a" { policy = "read"\n capabilities = ["deny"] }'},
            Visibility(False, "namespace rule(s) 'team-a' do not grant read-job"),
        ),
        ({"q": STAR, "p": NODE + STAR}, Visibility(True, "policies p, q grant read-job on every namespace")),
        (
            {"p": 'namespace "**" { policy = "write" }'},
            Visibility(True, "policies p grant read-job on every namespace"),
        ),
    ],
)
def test_judge_policies_verdicts_in_full(rules: dict[str, str], verdict: Visibility) -> None:
    assert judge_policies(rules) == verdict


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"namespace": ["default"]}', "a namespace block is not an object"),
        ('{"namespace": {"default": "read"}}', "namespace 'default' is not a block"),
        ('{"namespace": {"default": {"capabilities": "read-job"}}}', "namespace 'default': capabilities is not a list"),
    ],
)
def test_namespace_rules_errors_name_the_part(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        namespace_rules(text)
    assert str(info.value) == message


def test_unparsable_hcl_is_a_value_error_naming_the_parser_error() -> None:
    with pytest.raises(ValueError) as info:
        namespace_rules("namespace {{{ not hcl")
    text = str(info.value)
    assert re.match(r"^[A-Za-z_]+: \S", text) and len(text) <= 200 + 40, text
    assert not text.startswith("ValueError"), "the parser's own exception type is named"


def test_a_long_parser_error_is_cut_at_200_characters() -> None:
    with pytest.raises(ValueError) as info:
        namespace_rules("namespace " + "{" * 500)
    kind, _, detail = str(info.value).partition(": ")
    assert kind and len(detail) <= 200


def test_json_rules_with_leading_whitespace_are_json() -> None:
    assert namespace_rules('\n  {"namespace": {"*": {"policy": "read"}}}  ') == {"*": {"read-job"}}


def test_policy_deny_and_quoted_values() -> None:
    assert namespace_rules(
        '{"namespace": {"a": {"policy": "deny"}, "b": {}, "\\"c\\"": {"policy": "\\"read\\""}}}'
    ) == {
        "a": {"deny"},
        "b": set(),
        "c": {"read-job"},
    }


def test_quotes_are_stripped_only_from_a_quoted_string() -> None:
    assert namespace_rules('{"namespace": {"\\"": {}, "\\"\\"": {}, "x\\"": {}}}') == {
        '"': set(),
        "": set(),
        'x"': set(),
    }


# -- the reconciler thread and claims Nomad does not confirm --------------------------------


def setup(tmp_path, api: NomadApiDouble | None, **kw: Any) -> tuple[Reserver, FakeBackend, Reconciler]:
    backend = FakeBackend()
    reserver = Reserver(backend, lambda: CAT, Journal(tmp_path), PluginConfig(), path_exists=lambda p: False)
    nomad = None if api is None else client(api, token=kw.pop("token", ""), timeout=30.0)
    rec = Reconciler(reserver, nomad, lambda: CAT, backoff=Backoff(initial=0.05, cap=0.2), **kw)
    return reserver, backend, rec


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_the_thread_is_a_named_daemon_and_stop_joins_it(tmp_path) -> None:
    _, _, rec = setup(tmp_path, None, grace=5, max_wait=5.0, idle_period=0.05)
    before = set(threads_named("grant-reconciler"))
    rec.start()
    (thread,) = set(threads_named("grant-reconciler")) - before
    assert thread.daemon, "the reconciler must not keep a stopping plugin alive"
    wait_until(lambda: rec.rounds >= 0 and thread.is_alive(), "the reconciler thread to run")
    rec.stop()  # joins for max_wait + 10 s; an idle round ends at once on stop
    assert not thread.is_alive(), "stop() returned before the thread ended"


def test_a_failed_round_is_recorded_and_logged_with_its_retry(tmp_path, caplog) -> None:
    with NomadApiDouble() as api:
        api.require_token("right")
        reserver, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, token="wrong")
        with caplog.at_level("WARNING"):
            rec.start()
            try:
                wait_until(lambda: reserver.counters.nomad_api_errors >= 1, "a failed round")
                wait_until(lambda: rec.last_error, "the error to be recorded")
            finally:
                rec.stop()
    assert rec.last_error.startswith("Nomad API /v1/agent/self: 403 Permission denied"), rec.last_error
    pattern = re.compile(
        r"reconciler: Nomad API /v1/agent/self: 403 Permission denied \(the token needs agent:read .*\); "
        r"retrying in \d+\.\ds \(no grant is released meanwhile\)"
    )
    assert [r for r in caplog.records if pattern.fullmatch(r.getMessage())], caplog.text


def test_claims_nomad_will_not_confirm_are_all_kept_each_with_a_line(tmp_path, caplog) -> None:
    """Two claimed allocations leave the list and their reads are refused (the policy narrowed): no evidence."""
    with NomadApiDouble() as api:
        api.enable_acls()
        api.add_policy(
            "plugin", 'namespace "default" { policy = "read" }\nnamespace "team-b" { policy = "read" }\n' + NODE
        )
        api.add_token("t", ["plugin"])
        clock = Clock()
        reserver, backend, rec = setup(tmp_path, api, grace=5, max_wait=0.2, token="t", clock=clock)
        grants = [reserver.reserve([card_uuid(i)]).container_res.envs["LINGJUN_GRANT_ID"] for i in (0, 1)]
        api.add_alloc("b-1", [card_uuid(0)], namespace="team-b", job="train")
        api.add_alloc("b-2", [card_uuid(1)], namespace="team-b", job="serve")
        rec.round()
        assert not rec.view_complete
        api.add_policy("plugin", 'namespace "default" { policy = "read" }\n' + NODE)  # team-b no longer readable
        with caplog.at_level("INFO"):
            for _ in range(3):
                rec.round()
                clock.now += 60  # far past grace
        assert all(g in backend.grants for g in grants), "a grant was released without evidence"
        for alloc in ("b-1", "b-2"):
            line = (
                f"reconciler: allocation {alloc} left the list but Nomad did not confirm it ended: "
                f"Nomad API /v1/allocation/{alloc}: 403 Permission denied"
            )
            assert [r for r in caplog.records if r.getMessage().startswith(line)], caplog.text


class HidesFromList(NomadApiDouble):
    """Leaves ``hidden`` allocations out of the node list; ``/v1/allocation/<id>`` still answers them."""

    hidden: frozenset[str] = frozenset()

    def _node_allocs(self, *args: Any, **kwargs: Any) -> tuple[int, Any, int]:
        status, body, index = super()._node_allocs(*args, **kwargs)
        if status == 200 and isinstance(body, list):
            body = [a for a in body if a["ID"] not in self.hidden]
        return status, body, index


def test_a_claim_read_directly_counts_like_a_list_entry(tmp_path) -> None:
    with HidesFromList() as api:
        api.enable_acls()
        api.add_policy("plugin", 'namespace "default" { policy = "read" }\n' + NODE)
        api.add_token("t", ["plugin"])
        clock = Clock()
        reserver, backend, rec = setup(tmp_path, api, grace=5, max_wait=0.2, token="t", clock=clock)
        live, ended = (reserver.reserve([card_uuid(i)]).container_res.envs["LINGJUN_GRANT_ID"] for i in (0, 1))
        api.add_alloc("a-live", [card_uuid(0)], job="web")
        api.add_alloc("a-ended", [card_uuid(1)], job="batch")
        rec.round()
        api.hidden = frozenset({"a-live", "a-ended"})
        api.set_status("a-ended", "complete")
        for _ in range(3):
            rec.round()
            clock.now += 60
        assert live in backend.grants, "a running allocation read directly was taken as gone"
        assert ended not in backend.grants, "the ended allocation read directly was not released"


def test_parse_alloc_builds_the_whole_view() -> None:
    view = parse_alloc(
        raw(
            Namespace="team-a",
            JobID="train",
            ModifyTime=1_700_000_000_500_000_000,
            DesiredStatus="stop",
            AllocatedResources={
                "Tasks": {
                    "t": {"Devices": [{"DeviceIDs": ["U2", "U1"]}, {"DeviceIDs": ["U3"]}]},
                    "w": {"Devices": [{"DeviceIDs": ["U4"]}]},
                }
            },
            TaskStates={"t": {"State": "running", "StartedAt": "2026-12-01T07:00:00Z"}, "w": {"State": "pending"}},
        )
    )
    assert view == AllocView(
        "a1",
        "running",
        frozenset({"U1", "U2", "U3", "U4"}),
        "team-a",
        "train",
        1.7e9 + 0.5,
        (("t", frozenset({"U1", "U2"})), ("t", frozenset({"U3"})), ("w", frozenset({"U4"}))),
        frozenset({"U4"}),
    )


# -- what the reconciler writes for `grants`, and the reason of a release without a claim ---------


def test_an_answer_of_the_same_bytes_is_the_page_already_known() -> None:
    with NomadApiDouble() as api:
        nomad = client(api, timeout=30.0)
        api.add_alloc("a1", [card_uuid(0)])
        page = nomad.node_allocations(api.node_id)
        again = nomad.node_allocations(api.node_id, page.index, 0.1, known=page)  # the wait ran out
        assert again.allocs is page.allocs and again.index == page.index
        threading.Timer(0.1, api.add_alloc, ("a2", [card_uuid(1)])).start()
        moved = nomad.node_allocations(api.node_id, page.index, 5.0, known=page)
        assert moved.index > page.index and sorted(a.id for a in moved.allocs) == ["a1", "a2"]
        other = AllocPage(allocs=(), index=moved.index, content=b"[]")  # other bytes: parsed afresh
        assert nomad.node_allocations(api.node_id, moved.index, 0.1, known=other).allocs == moved.allocs


def test_a_round_that_changed_nothing_leaves_the_state_file_alone(tmp_path) -> None:
    with NomadApiDouble() as api:
        path = tmp_path / "reconciler-state.json"
        reserver, _, rec = setup(tmp_path, api, grace=5, max_wait=0.1, state_path=path)
        reserver.reserve([card_uuid(0)])
        api.add_alloc("a1", [card_uuid(0)])
        rec.round()
        written = path.stat().st_ino
        rec.round()  # the blocking query times out: the same answer
        assert path.stat().st_ino == written, "an unchanged state is not written again"
        api.set_status("a1", "complete")
        rec.round()
        assert path.stat().st_ino != written and ReconcilerState.load(path) is not None


def test_the_state_written_after_a_round(tmp_path, caplog) -> None:
    from nomad_plugin.reconcile.reconciler import Claim, ReconcilerState

    with NomadApiDouble() as api:
        clock = Clock()
        path = tmp_path / "reconciler-state.json"
        reserver, backend, rec = setup(
            tmp_path, api, grace=5, max_wait=0.2, clock=clock, wall_clock=lambda: 5000.0, state_path=path
        )
        claimed, orphan = (reserver.reserve([card_uuid(i)]).container_res.envs["LINGJUN_GRANT_ID"] for i in (0, 1))
        api.add_alloc("a1", [card_uuid(0)], namespace="team-a", job="web")
        api.add_alloc("stray", [card_uuid(3)], job="other")  # our device, no grant: a leak
        rec.round()
        state = ReconcilerState.load(path)
        assert state is not None
        assert (state.updated_at, state.grace, state.view_complete) == (5000.0, 5.0, True)
        assert state.view_reason == "ACLs are disabled on this cluster: every allocation is visible"
        assert state.claims == {claimed: Claim("a1", "team-a", "web")}
        assert state.release_at == {orphan: 5005.0}  # wall time + what is left of the grace period
        assert state.unverifiable == [] and state.leaked == []
        assert sorted(a.id for a in state.allocs) == ["a1", "stray"]
        clock.now += 2
        rec.round()
        assert ReconcilerState.load(path).release_at == {orphan: 5003.0}
        clock.now += 4  # past grace: the orphan goes, the leak is reported
        with caplog.at_level("INFO"):
            rec.round()
        state = ReconcilerState.load(path)
        assert state.release_at == {} and state.leaked == ["stray"] and orphan not in backend.grants
        reason = "no live allocation on this node holds its devices (the token sees every namespace)"
        assert f"grant {orphan} released: {reason}" in [r.getMessage() for r in caplog.records]


def test_an_unwritable_state_file_is_a_warning_not_a_failed_round(tmp_path, caplog) -> None:
    with NomadApiDouble() as api:
        path = tmp_path / "no-such-dir" / "reconciler-state.json"
        _, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, state_path=path)
        with caplog.at_level("WARNING"):
            rec.round()
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [x for x in lines if x.startswith(f"reconciler: could not write {path}: [Errno 2] ")], lines


def test_the_state_of_an_incomplete_view_lists_the_unverifiable_grants(tmp_path) -> None:
    from nomad_plugin.reconcile.reconciler import ReconcilerState

    with NomadApiDouble() as api:
        api.enable_acls()
        api.add_policy("plugin", 'namespace "default" { policy = "read" }\n' + NODE)
        api.add_token("t", ["plugin"])
        path = tmp_path / "reconciler-state.json"
        reserver, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, token="t", clock=Clock(), state_path=path)
        unclaimed = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
        rec.round()
    state = ReconcilerState.load(path)
    assert state is not None and not state.view_complete
    assert state.view_reason == 'no policy of the token has a namespace "*" rule, so some namespaces are unread'
    assert state.unverifiable == [unclaimed] and state.release_at == {}


def test_lines_for_an_unverifiable_grant_once_and_for_a_leak(tmp_path, caplog) -> None:
    with NomadApiDouble() as api:
        api.enable_acls()
        api.add_policy("plugin", 'namespace "default" { policy = "read" }\n' + NODE)
        api.add_token("t", ["plugin"])
        clock = Clock()
        reserver, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, token="t", clock=clock)
        unclaimed = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
        api.add_alloc("stray", [card_uuid(3), card_uuid(2)], job="other")
        with caplog.at_level("INFO"):
            for _ in range(3):
                rec.round()
                clock.now += 6
    messages = [r.getMessage() for r in caplog.records]
    kept = (
        f"grant {unclaimed} is kept: no allocation visible to the token has claimed its devices and the view is "
        "incomplete, so its end cannot be seen (check it with `nomad-device-lingjun grants`)"
    )
    assert messages.count(kept) == 1, "the kept-grant warning is given once per grant, not every round"
    leak = (
        f"allocation stray is running with devices {card_uuid(2)}, {card_uuid(3)} but the journal has no grant for "
        "them (journal lost or corrupt?); its XDM grant cannot be released by the plugin"
    )
    assert messages.count(leak) == 1


def test_a_released_claim_leaves_the_state_in_the_same_round(tmp_path) -> None:
    from nomad_plugin.reconcile.reconciler import ReconcilerState

    with NomadApiDouble() as api:
        clock = Clock()
        path = tmp_path / "reconciler-state.json"
        reserver, backend, rec = setup(tmp_path, api, grace=5, max_wait=0.2, clock=clock, state_path=path)
        gid = reserver.reserve([card_uuid(0)]).container_res.envs["LINGJUN_GRANT_ID"]
        api.add_alloc("a1", [card_uuid(0)], job="web")
        rec.round()
        assert set(ReconcilerState.load(path).claims) == {gid}
        api.set_status("a1", "complete")
        rec.round()
        clock.now += 6
        rec.round()
        assert gid not in backend.grants
        state = ReconcilerState.load(path)
        assert state.claims == {} and state.release_at == {}, state


def test_visibility_lines_once_per_change_and_a_failed_check(tmp_path, caplog) -> None:
    from nomad_plugin.reconcile.nomad_api import RECOMMENDED_POLICY

    api = Scripted().start()
    try:
        clock = Clock()
        _, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, clock=clock, visibility_period=60.0)
        with caplog.at_level("INFO"):
            rec.round()
            rec.round()
            api.answers["/v1/acl/token/self"] = (500, "boom")
            clock.now += 61
            rec.round()
            clock.now += 29  # a failed check is retried after min(30 s, the period)
            rec.round()
            clock.now += 2
            rec.round()
    finally:
        api.stop()
    messages = [r.getMessage() for r in caplog.records]
    complete = (
        "reconciler: the allocation view is complete (ACLs are disabled on this cluster: every allocation is visible)"
    )
    assert messages.count(complete) == 1, messages
    failed = [m for m in messages if m.startswith("reconciler: could not check what the Nomad token can see (")]
    assert len(failed) == 2 and all(m.endswith("; keeping the last answer") for m in failed), failed
    assert [p for p, _ in api.requests].count("/v1/acl/token/self") == 3
    assert rec.view_complete, "a failed check keeps the last answer"
    assert " ".join(RECOMMENDED_POLICY.split()) not in " ".join(messages)


def test_the_incomplete_warning_in_full(tmp_path, caplog) -> None:
    from nomad_plugin.reconcile.nomad_api import RECOMMENDED_POLICY

    with NomadApiDouble() as api:
        api.enable_acls()
        api.add_policy("plugin", 'namespace "default" { policy = "read" }\n' + NODE)
        api.add_token("t", ["plugin"])
        reserver, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, token="t", clock=Clock())
        with caplog.at_level("INFO"):
            rec.round()
    warning = (
        'reconciler: the allocation view is INCOMPLETE (no policy of the token has a namespace "*" rule, so some '
        "namespaces are unread): Nomad leaves out allocations in namespaces the token cannot read, so a grant is "
        "released only after the allocation that held it is seen to end, never because it is absent. Give the "
        "token this policy: " + " ".join(RECOMMENDED_POLICY.split())
    )
    assert [r.levelname for r in caplog.records if r.getMessage() == warning] == ["WARNING"]
    assert reserver.counters.view_incomplete == 1


def test_a_first_failed_check_counts_as_incomplete(tmp_path, caplog) -> None:
    api = Scripted().start()
    try:
        api.answers["/v1/acl/token/self"] = (500, "boom")
        reserver, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, clock=Clock())
        with caplog.at_level("WARNING"):
            rec.round()
    finally:
        api.stop()
    assert reserver.counters.view_incomplete == 1 and not rec.view_complete
    line = (
        "reconciler: could not check what the Nomad token can see (Nomad API /v1/acl/token/self: HTTP 500 boom); "
        "until it can, grants are released only on evidence"
    )
    assert line in [r.getMessage() for r in caplog.records]


def test_close_closes_the_http_client_and_a_second_close_is_harmless(api: Scripted) -> None:
    import httpx

    api.answers["/v1/acl/policy/p"] = (200, {"Name": "p", "Rules": "x"})
    c = client(api)
    handed_in = httpx.Client(base_url=api.address)
    c._client = handed_in
    c.close()
    assert handed_in.is_closed
    c.close()
    assert c.acl_policy_rules("p") == "x", "a request after close() makes a new client"
    c.close()


def test_a_parser_error_is_named_by_the_parsers_exception_type_and_its_text() -> None:
    import hcl2

    text = "namespace {{{ not hcl"
    with pytest.raises(Exception) as direct:
        hcl2.loads(text)
    with pytest.raises(ValueError) as info:
        namespace_rules(text)
    assert str(info.value) == f"{type(direct.value).__name__}: {str(direct.value)[:200]}"


def test_before_the_token_could_be_checked_the_state_says_so(tmp_path: Any, api: Scripted) -> None:
    from nomad_plugin.reconcile.reconciler import ReconcilerState

    api.answers["/v1/acl/token/self"] = (500, "boom")  # Nomad cannot say what the token sees (yet)
    path = tmp_path / "reconciler-state.json"
    _, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, clock=Clock(), state_path=path)
    api.add_alloc("a1", [card_uuid(0)])
    rec.round()
    state = ReconcilerState.load(path)
    assert state is not None
    assert (state.view_complete, state.view_reason) == (False, "not checked yet")
    assert [a.id for a in state.allocs] == ["a1"]


def test_visibility_is_checked_again_exactly_when_due_and_an_unchanged_answer_is_not_logged_again(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    api = Scripted().start()
    try:
        clock = Clock()
        _, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, clock=clock, visibility_period=60.0)
        checks = lambda: [p for p, _ in api.requests].count("/v1/acl/token/self")  # noqa: E731
        with caplog.at_level("INFO"):
            rec.round()
            start = clock.now
            clock.now = start + 60.0  # due exactly now
            rec.round()
            assert checks() == 2
            api.answers["/v1/acl/token/self"] = (500, "boom")
            clock.now = start + 120.0
            rec.round()
            clock.now = start + 150.0  # a failed check is due again exactly 30 s later
            rec.round()
            assert checks() == 4
    finally:
        api.stop()
    complete = (
        "reconciler: the allocation view is complete (ACLs are disabled on this cluster: every allocation is visible)"
    )
    assert [r.getMessage() for r in caplog.records].count(complete) == 1, "the same answer twice is logged once"


def test_the_token_self_read_refused_bad_or_slow_is_an_error_in_full(api: Scripted) -> None:
    api.answers["/v1/acl/token/self"] = (403, "Permission denied")
    with pytest.raises(NomadApiError) as info:
        client(api).token_self()
    assert (str(info.value), info.value.kind) == (
        "Nomad API /v1/acl/token/self: 403 Permission denied (the token needs to be a valid ACL token)",
        "forbidden",
    )
    api.answers["/v1/acl/token/self"] = (200, ["not", "an", "object"])
    with pytest.raises(NomadApiError) as info:
        client(api).token_self()
    assert (str(info.value), info.value.kind) == ("ACL token answer is not an object", "bad-response")
    del api.answers["/v1/acl/token/self"]  # the double's own answer, late
    api.set_latency(30.0)
    with pytest.raises(NomadApiError) as info:
        client(api, timeout=0.5).token_self()
    assert info.value.kind == "timeout" and str(info.value).endswith("timed out after 0.5s")


def test_check_visibility_verdicts_from_the_token_and_its_roles(api: Scripted) -> None:
    from nomad_plugin.reconcile.nomad_api import check_visibility

    token = "/v1/acl/token/self"
    api.answers[token] = (200, {"Type": "management"})
    assert check_visibility(client(api)) == Visibility(
        True, "the token is a management token: every allocation is visible"
    )
    api.answers[token] = (200, {"Type": "client", "Roles": [{"ID": 5}]})
    assert check_visibility(client(api)) == Visibility(False, "the token's roles could not be read")
    api.answers[token] = (200, {"Type": "client", "Roles": [{"ID": "r"}]})
    api.answers["/v1/acl/role/r"] = (403, "Permission denied")
    assert check_visibility(client(api)) == Visibility(False, "the token's role r could not be read (forbidden)")
    api.answers[token] = (200, {"Type": "client", "Policies": ["p"]})
    api.answers["/v1/acl/policy/p"] = (403, "Permission denied")
    assert check_visibility(client(api)) == Visibility(False, "the token's policy 'p' could not be read (forbidden)")


@pytest.mark.parametrize("fault", ["timeout", "unreachable"])
@pytest.mark.parametrize("token", [{"Type": "client", "Roles": [{"ID": "r"}]}, {"Type": "client", "Policies": ["p"]}])
def test_a_role_or_policy_that_cannot_be_read_for_now_is_an_error_not_a_verdict(
    api: Scripted, fault: str, token: dict[str, Any]
) -> None:
    from nomad_plugin.reconcile.nomad_api import check_visibility

    api.answers["/v1/acl/token/self"] = (200, token)
    if fault == "timeout":
        api.set_latency(30.0)  # the double's own role answer comes late
    else:
        api.set_down(True)  # the double closes the connection without an answer
    with pytest.raises(NomadApiError) as info:
        check_visibility(client(api, timeout=0.5))
    assert info.value.kind == fault


def test_before_its_first_round_the_reconciler_knows_nothing_and_uses_the_production_timings(tmp_path: Any) -> None:
    _, _, rec = setup(tmp_path, None, grace=5)
    assert (rec.last_page, rec.unverifiable, rec.visibility, rec.node_id, rec.last_error) == (None, (), None, "", "")
    # Blocking queries wait at most 10 s (stop() joins within max_wait + 10 s); without Nomad a round idles 5 s.
    assert (rec.max_wait, rec.idle_period) == (10.0, 5.0)


def test_a_configured_node_id_is_used_without_asking_the_agent(tmp_path: Any, api: Scripted) -> None:
    node = "4c1a2b3d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
    api.answers[f"/v1/node/{node}"] = (200, {"ID": node, "Name": "n", "Attributes": {"unique.hostname": api.hostname}})
    _, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, clock=Clock(), node_id=node)
    rec.round()
    asked = paths(api)
    assert "/v1/agent/self" not in asked
    assert f"/v1/node/{node}" in asked, "the configured node is proven to exist first"
    assert any(p.startswith(f"/v1/node/{node}/allocations") for p in asked), asked


def test_the_node_id_learned_from_the_agent_is_logged_once(tmp_path: Any, api: Scripted, caplog: Any) -> None:
    _, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, clock=Clock())
    with caplog.at_level("INFO", logger="nomad_plugin"):
        rec.round()
        rec.round()
    line = f"reconciler: watching allocations of Nomad node {api.node_id}"
    assert [r.getMessage() for r in caplog.records].count(line) == 1
    assert rec.node_id == api.node_id


def test_a_successful_round_clears_the_last_error_and_a_plain_read_is_not_blocking(
    tmp_path: Any, api: Scripted
) -> None:
    _, _, rec = setup(tmp_path, api, grace=5, max_wait=0.2, clock=Clock())
    rec.last_error = "an earlier round failed"
    rec.round()
    assert rec.last_error == ""
    page = client(api).node_allocations(api.node_id)
    assert page.allocs == () and paths(api)[-1] == f"/v1/node/{api.node_id}/allocations", paths(api)[-1]


def test_an_api_error_without_an_http_answer_has_status_0(api: Scripted) -> None:
    api.set_latency(30.0)
    with pytest.raises(NomadApiError) as info:
        client(api, timeout=0.5).token_self()
    assert (info.value.kind, info.value.status) == ("timeout", 0)


def test_an_error_answer_is_quoted_up_to_200_characters(api: Scripted) -> None:
    """A proxy's HTML error page must not flood the log: the body is cut at 200 characters."""
    long_body = "x" * 199 + "LAST" + "y" * 100
    api.answers["/v1/acl/policy/p"] = (403, long_body)
    api.answers["/v1/allocation/a"] = (500, long_body)
    c = client(api)
    with pytest.raises(NomadApiError) as refused:
        c.acl_policy_rules("p")
    assert str(refused.value) == (
        f"Nomad API /v1/acl/policy/p: 403 {'x' * 199}L (the token needs to be a valid ACL token)"
    )
    with pytest.raises(NomadApiError) as failed:
        c.allocation("a")
    assert str(failed.value) == f"Nomad API /v1/allocation/a: HTTP 500 {'x' * 199}L"
    assert failed.value.kind == "http"
