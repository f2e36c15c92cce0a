"""visibility.py: which token policies prove the allocation list complete."""

from __future__ import annotations

import json

import pytest

from nomad_plugin.reconcile.nomad_api import (
    RECOMMENDED_POLICY,
    NomadApiSettings,
    NomadClient,
    check_visibility,
    judge_policies,
)
from tests.doubles.nomad_api import NomadApiDouble

NODE = 'node { policy = "read" }\nagent { policy = "read" }\n'


@pytest.mark.parametrize(
    ("rules", "complete"),
    [
        ({"p": RECOMMENDED_POLICY}, True),
        ({"p": 'namespace "*" { policy = "read" }\n' + NODE}, True),
        ({"p": 'namespace "*" { policy = "write" }\n' + NODE}, True),
        ({"p": 'namespace "*" { policy = "scale" }\n' + NODE}, False),  # scale has no read-job
        ({"p": 'namespace "*" { capabilities = ["list-jobs"] }\n' + NODE}, False),
        ({"p": 'namespace "default" { policy = "read" }\n' + NODE}, False),  # no "*" rule
        ({"p": NODE}, False),
        ({"p": RECOMMENDED_POLICY, "q": 'namespace "team-a" { policy = "deny" }'}, False),  # deny wins
        ({"p": RECOMMENDED_POLICY, "q": 'namespace "team-*" { capabilities = ["list-jobs"] }'}, False),
        ({"p": RECOMMENDED_POLICY, "q": 'namespace "team-a" { policy = "write" }'}, True),
        ({"p": json.dumps({"namespace": {"*": {"policy": "read"}}, "node": {"policy": "read"}})}, True),
        ({"p": "namespace {{{ not hcl"}, False),
        ({}, False),
    ],
)
def test_judge_policies(rules, complete):
    verdict = judge_policies(rules)
    assert verdict.complete is complete, verdict.reason
    assert verdict.reason


def test_check_visibility_against_the_double():
    with NomadApiDouble() as api:
        client = NomadClient(NomadApiSettings(address=api.address))
        assert check_visibility(client).complete  # ACLs disabled
        api.enable_acls()
        api.add_policy("narrow", 'namespace "default" { policy = "read" }\n' + NODE)
        api.add_policy("wide", RECOMMENDED_POLICY)
        api.add_role("role-1", "readers", ["wide"])
        api.add_token("narrow-t", ["narrow"])
        api.add_token("role-t", ["narrow"], roles=["role-1"])
        api.add_token("mgmt-t", management=True)
        verdicts = {
            t: check_visibility(NomadClient(NomadApiSettings(address=api.address, token=t)))
            for t in ("narrow-t", "role-t", "mgmt-t")
        }
        assert not verdicts["narrow-t"].complete and '"*"' in verdicts["narrow-t"].reason
        assert verdicts["role-t"].complete  # the role brings the wide policy
        assert verdicts["mgmt-t"].complete and "management" in verdicts["mgmt-t"].reason
