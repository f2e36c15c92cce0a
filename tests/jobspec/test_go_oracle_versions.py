"""golang.py reads versions and constraints exactly as hashicorp/go-version does.

The Go oracle answers with go-version itself (``NewVersion``, ``NewSemver``,
``NewConstraint``, ``Check``; Debian's package). Each version is read as
Nomad's ``checkVersionMatch`` reads it (``NewVersion``), then checked. Nomad's
own semver constraints (``helper/constraints/semver``) are not packaged, so
they are checked by the rows of Nomad's tests in tests/jobspec/nomad_tables.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nomad_plugin.jobspec import golang
from tests.jobspec.oracle.client import GoOracle

SEGMENTS = (
    "1", "1.2", "1.2.3", "1.2.3.4", "1.2.3.4.5.6", "v1.2.3", "V1.2.3", "vv1", "01.02", "1..2", ".1", "1.", "0", "0.0.0",
    "9223372036854775807", "9223372036854775808", "1.9223372036854775808", "535.104.05", "2.1", "2.0.0", "10.0",
    "\u0661.2", "1.2\u0663", "", "v", "x",
)  # fmt: skip
PRERELEASES = (
    "", "-beta", "-beta.1", "-1", "-01", "-0", "-rc.1", "-x.7.z.92", "-alpha-1", "-~", "beta", "rc2", "~rc", "-",
    "-.", "-a..b", "-a.", "-a_b", "-\u00e4", "-1a", "--", "-beta-", ".beta", "a.1", "-9223372036854775808",
)  # fmt: skip
METADATA = ("", "+meta", "+build.1", "+001", "+", "+a+b", "+a.b.c", "+\u00e4", "+-", "+a..b", "+a.")
WRAPS = ("", " ", "\t", "\n", "\u00a0")


def _versions() -> list[str]:
    out = {s + p + m for s, p, m in itertools.product(SEGMENTS, PRERELEASES, METADATA)}
    out |= {w + v + w2 for w, w2, v in itertools.product(WRAPS, WRAPS, ("1.2.3", "1.2.3-beta+m", "v1"))}
    return sorted(out)


VERSIONS = _versions()
CHECKED = [
    "0", "0.9", "1", "1.0", "1.0.0", "1.0.0.0", "1.0.0.1", "1.1", "1.2", "1.2.0", "1.2.3", "1.2.3.4", "1.2.4", "1.3",
    "2", "2.0", "2.0.0", "2.0.0-beta", "2.1.0-beta", "2.1.0-beta.2", "2.1.0-rc.1", "2.1.0", "2.1", "v2.1", "2.1.0+meta",
    "2.1.0-beta+meta", "2.1rc1", "3.0-0", "10.0", "535.104.05", "550.54.15", "1.2.3-alpha.10", "1.2.3-alpha.9",
    "1.2.3-alpha", "1.2.3-alpha.beta", "1.2.3-1", "1.2.3-01", "not a version", "",
]  # fmt: skip
OPERATORS = ("", "=", "!=", ">", ">=", "<", "<=", "~>", "==", "=>", "=<", "<>", "~", "^", ">>")
SPACES = ("", " ", "  ", "\t", "\v", "\u00a0", "\n", "\r\n")
CLAUSE_VERSIONS = (
    "1", "1.2", "1.2.3", "1.2.3.4", "2.1.0-beta", "2.0", "v1.2", "1.0beta1", "1.0-beta.1", "1.2.3+meta", "1.2+m",
    "535.104", "x", "", "1.2.", "9223372036854775808", "1.2.3-beta.9223372036854775808",
)  # fmt: skip


def _constraints() -> list[str]:
    out = {
        f"{s1}{op}{s2}{v}{s1}" for op, s1, s2, v in itertools.product(OPERATORS, SPACES[:4], SPACES, CLAUSE_VERSIONS)
    }
    out |= {
        "", ",", " , ", ">1,<2", ">1 ,<2", ">1, <2", ">1,,<2", ">= 1.0, < 2.0", "1.0 - 2.0", ">1 <2", ">= 1.0 ,",
        ",>= 1.0", "~> 1.2, != 1.2.5", ">= 2.0.0-beta, < 2.1", "~> 2.1.0-beta", "~> 1", "~> 1.2.3.4", "> 1.0 !",
        "=v1.2", ">=\u00e9", "~>1.2.3-beta.1+meta",
    }  # fmt: skip
    return sorted(out)


CONSTRAINTS = _constraints()


def _message(text: str) -> str:
    """go-version before 1.4 capitalised its messages (Debian's 1.3.0), 1.9.0, which Nomad pins, does
    not (the releases decide alike): the first letter is not compared."""
    return text[:1].lower() + text[1:]


def _version_disagreement(text: str, strict: bool, go: dict[str, Any]) -> str:
    py = golang.parse_version(text, strict=strict)
    name = "NewSemver" if strict else "NewVersion"
    if (py is not None) != go["ok"]:
        return f"{name}({text!r}): python {'reads it' if py else 'refuses'}, Go {go.get('string') or go['err']!r}"
    if py is not None and (py.text(), list(py.segments), py.pre, py.meta) != (
        go["string"],
        go["segments"],
        go["pre"],
        go["meta"],
    ):
        return f"{name}({text!r}): python {py}, Go {go}"
    return ""


def test_versions(go_oracle: GoOracle) -> None:
    answers = go_oracle.ask({"op": "version", "s": v} for v in VERSIONS)
    found = []
    for text, go in zip(VERSIONS, answers, strict=True):
        found += [_version_disagreement(text, False, go), _version_disagreement(text, True, go["semver"])]
    found = [f for f in found if f]
    assert not found, f"{len(found)} of {2 * len(VERSIONS)} disagree:\n" + "\n".join(found[:40])


def constraint_disagreements(oracle: GoOracle, constraints: list[str], versions: list[str]) -> list[str]:
    answers = oracle.ask({"op": "constraint", "s": c, "versions": versions} for c in constraints)
    read = [golang.parse_version(v) for v in versions]
    found = []
    for text, go in zip(constraints, answers, strict=True):
        parsed = golang.parse_constraints(text, semver=False)
        if isinstance(parsed, str) or not go["ok"]:
            ours = parsed if isinstance(parsed, str) else "accepts"
            theirs = "accepts" if go["ok"] else go["err"]
            if _message(ours) != _message(theirs):
                found.append(f"version constraint {text!r}: python {ours!r}, Go {theirs!r}")
            continue
        ours = [None if v is None else parsed.check(v) for v in read]
        found += [
            f"{text!r} on {v!r}: python {a}, Go {b}"
            for v, a, b in zip(versions, ours, go["checks"], strict=True)
            if a != b
        ]
    return found


def test_version_constraints(go_oracle: GoOracle) -> None:
    found = constraint_disagreements(go_oracle, CONSTRAINTS, CHECKED)
    assert not found, f"{len(found)} disagree with go-version:\n" + "\n".join(found[:40])


VERSIONISH = st.text(alphabet="0123456789.-+v~abrc ", max_size=12)
CLAUSE = st.tuples(st.sampled_from(OPERATORS), st.sampled_from(SPACES[:3]), VERSIONISH).map("".join)
CONSTRAINT = st.lists(CLAUSE, min_size=1, max_size=3).map(",".join)


def _generated(oracle: GoOracle, constraints: list[str], versions: list[str]) -> None:
    answers = oracle.ask({"op": "version", "s": v} for v in versions)
    found = [
        _version_disagreement(v, strict, a["semver"] if strict else a)
        for v, a in zip(versions, answers, strict=True)
        for strict in (False, True)
    ]
    found = [f for f in found if f] + constraint_disagreements(oracle, constraints, versions)
    assert not found, "\n".join(found[:20])


@settings(max_examples=100, deadline=None)
@given(st.lists(CONSTRAINT, min_size=1, max_size=4), st.lists(VERSIONISH, min_size=1, max_size=6))
def test_generated_versions(go_oracle: GoOracle, constraints: list[str], versions: list[str]) -> None:
    _generated(go_oracle, constraints, versions)
