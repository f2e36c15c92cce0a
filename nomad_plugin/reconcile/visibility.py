"""Can the token see every allocation on this node? (Release only on evidence.)

Nomad's ``GET /v1/node/:id/allocations`` needs ``node:read`` and then
silently leaves out allocations in namespaces where the token lacks the
``read-job`` capability, still answering 200 (``Node.GetAllocs`` in
hashicorp/nomad nomad/node_endpoint.go; the ACL table of "List Node
Allocations" in website/content/api-docs/nodes.mdx says
``node:read,namespace:read-job``). An allocation missing from the answer is
therefore evidence of nothing unless the view is *complete*:

- ACLs are disabled (``/v1/acl/token/self`` answers "ACL support disabled"),
- the token is a ``management`` token, or
- the token's own policies (directly and through its roles) grant
  ``read-job`` on every namespace: a namespace rule whose label is only
  ``*`` globs (it matches every name), and no namespace rule in any of the
  policies that lacks ``read-job`` or carries ``deny``. Nomad applies to a
  namespace the exact rule, else the closest glob, and merges the same label
  across policies (union of capabilities, ``deny`` wins), so when every
  label grants ``read-job`` every namespace does. ``policy = "read"`` and
  ``"write"`` include ``read-job``; ``"scale"`` and ``"deny"`` do not.

Any valid token may read itself (``/v1/acl/token/self``) and the policies
and roles attached to it (``/v1/acl/policy/:name``, ``/v1/acl/role/:id``),
so the check needs no more rights than the plugin already has. Anything the
check cannot read or parse counts as incomplete: the safe answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadClient

#: The policy the docs recommend; doctor and the warning name it.
RECOMMENDED_POLICY = (
    'namespace "*" { capabilities = ["read-job"] }\nnode { policy = "read" }\nagent { policy = "read" }'
)
_READ_JOB_POLICIES = frozenset({"read", "write"})


@dataclass(frozen=True)
class Visibility:
    """Whether the allocation list is complete, and why (one sentence, no secrets)."""

    complete: bool
    reason: str


def check_visibility(client: NomadClient) -> Visibility:
    """Ask Nomad about the token itself; raises ``NomadApiError`` only when Nomad cannot answer."""
    token = client.token_self()
    if token is None:
        return Visibility(True, "ACLs are disabled on this cluster: every allocation is visible")
    if token.get("Type") == "management":
        return Visibility(True, "the token is a management token: every allocation is visible")
    names = [p for p in token.get("Policies") or [] if isinstance(p, str)]
    roles = [r.get("ID") for r in token.get("Roles") or [] if isinstance(r, dict)]
    for role_id in roles:
        if not isinstance(role_id, str):
            return Visibility(False, "the token's roles could not be read")
        try:
            names.extend(client.acl_role_policies(role_id))
        except NomadApiError as exc:
            if exc.kind in ("unreachable", "timeout"):
                raise
            return Visibility(False, f"the token's role {role_id} could not be read ({exc.kind})")
    rules: dict[str, str] = {}
    for name in dict.fromkeys(names):
        try:
            rules[name] = client.acl_policy_rules(name)
        except NomadApiError as exc:
            if exc.kind in ("unreachable", "timeout"):
                raise
            return Visibility(False, f"the token's policy {name!r} could not be read ({exc.kind})")
    return judge_policies(rules)


def judge_policies(rules: dict[str, str]) -> Visibility:
    """Pure: do these policies (name -> rules text) grant read-job on every namespace?"""
    if not rules:
        return Visibility(False, "the token has no policies, so it reads no namespace")
    merged: dict[str, set[str]] = {}
    for name, text in rules.items():
        try:
            namespaces = namespace_rules(text)
        except ValueError as exc:
            return Visibility(False, f"policy {name!r} could not be parsed ({exc})")
        for label, caps in namespaces.items():
            merged.setdefault(label, set()).update(caps)
    if not any(label and set(label) == {"*"} for label in merged):
        return Visibility(False, 'no policy of the token has a namespace "*" rule, so some namespaces are unread')
    lacking = sorted(label for label, caps in merged.items() if "deny" in caps or "read-job" not in caps)
    if lacking:
        return Visibility(False, f"namespace rule(s) {', '.join(repr(x) for x in lacking)} do not grant read-job")
    return Visibility(True, f"policies {', '.join(sorted(rules))} grant read-job on every namespace")


def namespace_rules(text: str) -> dict[str, set[str]]:
    """Namespace label -> capabilities of one policy (HCL or JSON rules); ``ValueError`` if unreadable."""
    try:
        doc = parse_rules(text)
    except ValueError:
        raise
    except Exception as exc:  # the HCL parser raises its own exception types
        raise ValueError(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise ValueError("rules are not an object")
    blocks = doc.get("namespace") or []
    if isinstance(blocks, dict):
        blocks = [blocks]
    out: dict[str, set[str]] = {}
    for block in blocks:
        if not isinstance(block, dict):
            raise ValueError("a namespace block is not an object")
        for label, body in block.items():
            if not isinstance(body, dict):
                raise ValueError(f"namespace {label!r} is not a block")
            caps = out.setdefault(_unquote(label), set())
            policy = _unquote(body.get("policy", ""))
            if policy == "deny":
                caps.add("deny")
            elif policy in _READ_JOB_POLICIES:
                caps.add("read-job")
            raw_caps = body.get("capabilities") or []
            if not isinstance(raw_caps, list):
                raise ValueError(f"namespace {label!r}: capabilities is not a list")
            caps.update(_unquote(c) for c in raw_caps if isinstance(c, str))
    return out


def parse_rules(text: str) -> Any:
    """One ACL policy's rules, written in JSON or HCL, as a document (python-hcl2's shape for HCL)."""
    if text.lstrip().startswith("{"):
        return json.loads(text)
    import hcl2

    return hcl2.loads(text)


def _unquote(value: Any) -> str:
    """python-hcl2 >= 5 keeps string quotes in values and block labels."""
    text = str(value)
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return text
