"""The Nomad API double's ``/v1/client/metadata`` behaves as Nomad's does.

Each test restates one behaviour from Nomad's source (hashicorp/nomad main,
aa026cc) or its API docs (developer.hashicorp.com/nomad/api-docs/client,
"Read Dynamic Node Metadata" / "Update Dynamic Node Metadata"); the double is
exercised over HTTP, as the plugin reaches it:

- command/agent/http.go routes ``/v1/client/metadata`` to
  ``NodeMetaRequest`` (command/agent/meta_endpoint.go): GET reads, POST
  applies, any other method is 405 "Invalid method";
- client/meta_endpoint.go ``NodeMeta.Read`` needs ``AllowNodeRead`` and
  answers Meta (merged), Dynamic and Static; ``NodeMeta.Apply`` needs
  ``AllowNodeWrite`` (acl/acl.go: node policy "write" or management) and only
  then validates (nomad/structs/node.go ``NodeMetaApplyRequest.Validate``);
- a null value unsets a key; a null for a static key is kept in Dynamic as a
  tombstone (client/meta_endpoint_test.go ``TestNodeMeta_unset``);
- dynamic metadata is persisted and read back at agent start
  (client/client.go setupNode), where a tombstone with no static key to hide
  is forgotten;
- changes reach the servers batched: "up to 10 seconds"
  (client/client.go watchNodeUpdates; the API docs).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient
from tests.doubles.nomad_api import NOMAD_STATIC_META, NomadApiDouble
from tests.waiting import wait_until

PATH = "/v1/client/metadata"


def _post(api: NomadApiDouble, body: Any, token: str = "", raw: bytes | None = None) -> httpx.Response:
    headers = {"X-Nomad-Token": token} if token else {}
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(api.address + PATH, content=content, headers=headers, timeout=5)


def _get(api: NomadApiDouble, token: str = "", params: dict[str, str] | None = None) -> httpx.Response:
    headers = {"X-Nomad-Token": token} if token else {}
    return httpx.get(api.address + PATH, headers=headers, params=params, timeout=5)


def test_read_answers_meta_dynamic_and_static_without_an_index() -> None:
    with NomadApiDouble(static_meta={"rack": "r1"}) as api:
        resp = _get(api)
        assert resp.status_code == 200 and "X-Nomad-Index" not in resp.headers
        body = resp.json()
        assert body == {"Meta": {**NOMAD_STATIC_META, "rack": "r1"}, "Dynamic": {}, "Static": body["Meta"]}


def test_apply_sets_and_unsets_like_nomads_own_test() -> None:
    """TestNodeMeta_unset, step by step."""
    with NomadApiDouble(static_meta={"static_meta": "true"}) as api:
        body = _post(api, {"Meta": {"dynamic_meta": "true"}}).json()
        assert body["Static"]["static_meta"] == "true" and body["Meta"]["static_meta"] == "true"
        assert body["Dynamic"]["dynamic_meta"] == "true" and body["Meta"]["dynamic_meta"] == "true"

        body = _post(api, {"Meta": {"static_meta": None}}).json()
        assert body["Static"]["static_meta"] == "true"
        assert "static_meta" not in body["Meta"]
        assert "static_meta" in body["Dynamic"] and body["Dynamic"]["static_meta"] is None  # the tombstone
        assert body["Dynamic"]["dynamic_meta"] == "true"

        body = _post(api, {"Meta": {"dynamic_meta": None}}).json()
        assert "dynamic_meta" not in body["Dynamic"] and "dynamic_meta" not in body["Meta"]
        assert _get(api).json() == body


def test_validation_errors_are_400_with_nomads_texts() -> None:
    """TestNodeMeta_Validation and NodeMetaApplyRequest.Validate."""
    with NomadApiDouble() as api:
        for meta, text in (
            ({}, "missing required Meta"),
            ({"": "bad"}, "must not be empty"),
            ({"*": "bad"}, '"*" is invalid; metadata keys must be valid dotted hcl identifiers'),
            ({"foo..invalid": "x"}, "dotted hcl identifiers"),
            ({"invalid.": "x"}, "dotted hcl identifiers"),
            ({"-x": "x"}, "dotted hcl identifiers"),
        ):
            resp = _post(api, {"Meta": meta})
            assert resp.status_code == 400 and text in resp.text, (meta, resp.text)
        assert _post(api, None, raw=b"").text == "Request body is empty"
        assert _post(api, None, raw=b"{nope").status_code == 400
        assert _post(api, {"Meta": {"a": 1}}).status_code == 400  # map[string]*string: a number does not decode
        assert _post(api, {"Meta": {"ok.key_1-x": "v", "_u": "w"}}).status_code == 200
        assert api.meta.posts == [{"ok.key_1-x": "v", "_u": "w"}]  # nothing else was applied


def test_other_methods_are_405_and_another_node_404() -> None:
    with NomadApiDouble() as api:
        assert httpx.put(api.address + PATH, content=b"{}", timeout=5).status_code == 405
        assert httpx.delete(api.address + PATH, timeout=5).text == "Invalid method"
        assert _get(api, params={"node_id": "someone-else"}).status_code == 404
        assert _get(api, params={"node_id": api.node_id}).status_code == 200


def test_acls_read_needs_node_read_and_apply_node_write_before_validation() -> None:
    with NomadApiDouble() as api:
        api.enable_acls()
        api.add_policy("reader", 'node { policy = "read" }')
        api.add_policy("writer", 'node { policy = "write" }')
        api.add_policy("denied", 'node { policy = "deny" }')
        api.add_token("read-token", ["reader"])
        api.add_token("write-token", ["writer"])
        api.add_token("both-denied", ["writer", "denied"])
        api.add_token("mgmt", management=True)
        assert _get(api).status_code == 403  # anonymous: no policy
        assert _get(api, "read-token").status_code == 200
        assert _get(api, "nope").text == "ACL token not found"
        forbidden = _post(api, {"Meta": {}}, "read-token")  # the ACL check comes before Validate
        assert (forbidden.status_code, forbidden.text) == (403, "Permission denied")
        assert _post(api, {"Meta": {"a": "b"}}, "both-denied").status_code == 403  # deny wins
        assert _post(api, {"Meta": {"a": "b"}}, "write-token").status_code == 200
        assert _post(api, {"Meta": {"c": "d"}}, "mgmt").status_code == 200
        assert _post(api, {"Meta": {}}, "write-token").status_code == 400


def test_servers_see_a_change_only_after_the_batching_delay() -> None:
    with NomadApiDouble(meta_batch=(0.4, 0.2)) as api:
        assert _post(api, {"Meta": {"lingjun.a": "1"}}).status_code == 200
        assert _get(api).json()["Meta"]["lingjun.a"] == "1"  # the client's copy at once
        assert "lingjun.a" not in api.registered_meta()  # not yet on the servers
        _post(api, {"Meta": {"lingjun.b": "2"}})  # rides along in the same node update
        wait_until(lambda: "lingjun.b" in api.registered_meta(), "the batched node update")
        assert api.registered_meta()["lingjun.a"] == "1" and api.meta.registrations == 1


def test_dynamic_meta_survives_an_agent_restart_and_tombstones_are_tidied() -> None:
    with NomadApiDouble(static_meta={"rack": "r1", "gone": "x"}) as api:
        _post(api, {"Meta": {"lingjun.a": "1", "rack": None, "gone": None, "never": None}})
        assert _get(api).json()["Dynamic"] == {"lingjun.a": "1", "rack": None, "gone": None}
        api.restart_agent(static_meta={"rack": "r1"})  # "gone" removed from the agent config meanwhile
        body = _get(api).json()
        assert body["Dynamic"] == {"lingjun.a": "1", "rack": None}
        assert body["Meta"] == {**NOMAD_STATIC_META, "lingjun.a": "1"}
        assert api.registered_meta() == body["Meta"]  # the node registers at start
        api.restart_agent(lose_state=True)  # a wiped client data dir
        assert "lingjun.a" not in _get(api).json()["Meta"]


def test_the_plugins_client_reads_and_applies_and_names_the_capability() -> None:
    with NomadApiDouble() as api:
        client = NomadClient(NomadApiSettings(address=api.address, token="read-token"))
        try:
            api.enable_acls()
            api.add_policy("reader", 'node { policy = "read" }')
            api.add_token("read-token", ["reader"])
            assert client.node_meta().dynamic == {}
            with pytest.raises(NomadApiError) as caught:
                client.apply_node_meta({"lingjun.a": "1"})
            assert caught.value.kind == "forbidden" and "node:write" in str(caught.value)
            api.add_policy("writer", 'node { policy = "write" }')
            api.add_token("write-token", ["writer"])
            client.settings = NomadApiSettings(address=api.address, token="write-token")
            client.close()
            view = client.apply_node_meta({"lingjun.a": "1", "lingjun.b": None})
            assert view.meta["lingjun.a"] == "1" and view.dynamic == {"lingjun.a": "1"}
        finally:
            client.close()
