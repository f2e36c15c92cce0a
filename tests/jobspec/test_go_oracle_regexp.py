"""golang.py (RE2 through google-re2) accepts, refuses and matches exactly as Go's regexp does.

The Go oracle compiles each pattern with ``regexp.Compile`` and runs
``MatchString`` on each text; the Python side is ``golang.compile_error`` and
``golang.search``. Refusals are compared word for word (Nomad prints Go's
error). Texts use characters whose Unicode properties have not changed for
many Unicode versions, so the two engines' table versions cannot decide a case.

The oracle runs the local Go toolchain's regexp (Debian's Go in CI), which
may be older than the Go that Nomad is built with. Go 1.22 added
``(?<name>re)``: with an older oracle a pattern holding ``(?<`` is compared
only by its verdict for lookbehinds and not at all for named groups
(``GO_RELEASE_GAPS``); golang.py follows the newer Go there, as Nomad does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nomad_plugin.jobspec import golang
from tests.jobspec.oracle.client import GoOracle

TEXTS = [
    "", "a", "ab", "abc", "aaa", "A", "K", "k", "\u212a", "s", "S", "\u017f", "ß", "ẞ", "é", "É", "1", "42", "\u0663",
    "\uff11", "中", "日本", "x\ny", "\n", "\r\n", " ", "\t", "\u00a0", "\u3000", "Σ", "\u03c3", "ς", "ǅ", "ǆ", "H800",
    "NVIDIA H800", "nvidia/gpu", "GPU-0a1b", "a.b", "a*b", "[x]", "\\", "\x00", "\ufffd", "\ue000", "😀", "a😀b",
    "_", "-", "{2}", "\u0301", "e\u0301",
]  # fmt: skip

PATTERNS = [
    # Go refuses, RE2 accepts (fixed in golang.py)
    r"\C", r"a\C", r"[\C]", r"\Q\C\E", r"\\C", r"(?P<é>x)", r"(?P<名>x)", r"(?P<a-b>x)", r"(?P<a b>x)",
    "(" * 1000 + ")" * 1000, "(" * 999 + ")" * 999, "(" * 1000 + "a" + ")" * 1000, "(?:" * 1001 + "a" + ")" * 1001,
    # refused by both
    r"H(?=800)", r"(?!a)", r"(?<=a)b", r"(?<!a)b", r"(a)\1", r"\1", r"\8", r"\Z", r"\e", r"\cA", r"\N{DIGIT ONE}",
    r"\X", r"\R", r"\h", r"\K", r"\G", r"(?#comment)", r"(*ANY)a", r"(?|a)", r"(?>a)", r"a**", r"a*+", r"a++",
    r"a{2}{3}", r"a{2}*", r"(?x) a", r"(?-)a", r"(?)", r"(?i-)", r"(?P<>x)", r"(?P<n>a)(?P<n>b)", r"(?P<n", r"(?P=n)",
    r"\x{110000}", r"\x{D800}", r"\x{}", r"\x4", r"\xg1", r"[z-a]", r"[[:foo:]]", r"[[.a.]]", r"[[=a=]]", "\\",
    r"a\\\\\\", r"(", r")", r"(()", r"())", r"[", r"[]", r"[^]", r"]", r"*", r"+a", r"?", r"{1}", r"a{1001}",
    r"a{1000,1001}", r"a{5,3}", r"(a{1000}){2}", r"((a{10}){10}){11}", r"(a{1000}){500}", r"\p{Foo}", r"\pX",
    r"\p{Letter}", r"\p{letter}", r"\p{greek}", r"\p{ASCII}", r"\p{Assigned}", r"\p{L&}", r"\p{IsGreek}", r"\p{",
    r"\P{", r"\p", r"\q", r"\y", r"\i", r"[\q]", r"[a-\d]", r"[\d-z]", r"x{2,1001}", r"\Q", r"a|*", r"(|*)", "\ud800",
    # accepted by both
    r"[[:alpha:]]+", r"[[:^alpha:]]", r"[[:word:]]", r"[[:digit:][:upper:]]", r"[[:space:]]", r"\pN", r"\p{N}",
    r"\PN", r"\p{^N}", r"\P{^N}", r"\pL", r"\p{Lu}", r"\p{Ll}", r"\p{Greek}", r"\p{Han}", r"\p{Latin}", r"\p{Any}",
    r"\pZ", r"\p{Zs}", r"\pC", r"\p{Cc}", r"\p{Co}", r"\p{Cs}", r"(?i)\p{Lu}", r"(?i)k", r"(?i)K", r"(?i)s",
    r"(?i)ß", r"(?i)ẞ", "(?i)\u03c3", r"(?i)Σ", r"(?i)ǅ", r"(?i)é", r"(?i)[k]", r"(?i)[a-z]", r"(?i)[^k]", r"(?i:a)b",
    r"(?i)a(?-i)b", r"(?U)a+", r"(?U)a+?", r"(?s).", r"(?s:.)", r".", r"^$", r"(?m)^a$", r"(?m)^$", r"^a", r"a$",
    r"\Aa", r"a\z", r"\b", r"\B", r"\bH800\b", r"\d", r"\D", r"\w", r"\W", r"\s", r"\S", r"[\d_]", r"[^\n]", r"\v",
    r"\a", r"\f", r"\t", r"\x41", r"\x{41}", r"\x{212A}", r"\x{10FFFF}", r"\0", r"\08", r"\101", r"\1234", r"\_",
    r"\-", r"\ ", r"\.", r"\*", r"\Qa.b\E", r"\Qab", r"\Q\E", r"\E", r"[\Q]\E]", r"[]a]", r"[^]a]", r"[a-]", r"[-a]",
    r"[a\]]", r"[^\x00-\x{10FFFF}]", r"[\x00-\x{10FFFF}]", r"a{,5}", r"a{5,}", r"a{0}", r"a{0,0}", r"a{1000}",
    r"(a{100}){10}", r"a{01}", r"a{1,2}?", r"a*?", r"a??", r"a|", r"|", r"()", r"(?:)", r"(a)|b", r"(?P<n>a)",
    r"(?P<n1_>a)", r"(?P<1>a)", r"\pL{1000}", r"(\pL|\pN){1000}", "a\x00b", r"é+", r"中", r"😀", r".😀.", r"\x{1F600}",
    r"^NVIDIA H\d{3}$", r"GPU-[0-9a-f]+", r"nvidia/gpu", r"H(800|100)", r"(?i)nvidia",
]  # fmt: skip

GO_RELEASE_GAPS = (("(?<", (1, 22), "Go 1.22 added (?<name>re); older Go words a lookbehind's refusal differently"),)


def _go_release(oracle: GoOracle) -> tuple[int, int]:
    found = re.match(r"go(\d+)\.(\d+)", oracle.info["go"])
    assert found, oracle.info
    return int(found.group(1)), int(found.group(2))


def _gap(pattern: str, release: tuple[int, int]) -> str:
    for marker, since, why in GO_RELEASE_GAPS:
        if marker in pattern and release < since:
            return why
    return ""


def compare(oracle: GoOracle, patterns: list[str], texts: list[str]) -> tuple[list[str], int, int]:
    """(disagreements, cases compared, cases skipped for the oracle's Go release)."""
    release = _go_release(oracle)
    answers = oracle.ask({"op": "regexp", "s": p, "texts": texts} for p in patterns)
    found: list[str] = []
    compared = skipped = 0
    for pattern, go in zip(patterns, answers, strict=True):
        gap = _gap(pattern, release)
        error = golang.compile_error(pattern)
        if gap and not (error and not go["ok"]):
            skipped += 1  # the oracle's Go predates the syntax; where both refuse, the verdict is compared
            continue
        compared += 1
        if bool(error) == go["ok"]:
            found.append(
                f"{pattern[:60]!r}: python {'refuses: ' + error if error else 'accepts'}; Go {go.get('err') or 'accepts'}"
            )
        elif error and error != go["err"] and not gap:
            found.append(f"{pattern[:60]!r}: python says {error[:120]!r}, Go {go['err'][:120]!r}")
        elif not error:
            ours = [golang.search(pattern, t) for t in texts]
            wrong = [t for t, a, b in zip(texts, ours, go["matches"], strict=True) if a != b]
            compared += len(texts)
            found += [
                f"{pattern[:60]!r} on {t!r}: python {not m}, Go {m}"
                for t, m in zip(texts, go["matches"], strict=True)
                if t in wrong
            ]
    return found, compared, skipped


def test_hostile_patterns(go_oracle: GoOracle) -> None:
    found, compared, skipped = compare(go_oracle, PATTERNS, TEXTS)
    assert compared > 5000 and skipped <= 4, (compared, skipped)
    assert not found, f"{len(found)} disagreements with Go's regexp:\n" + "\n".join(found[:40])


STABLE = "abcxyzABKkSs\u017fßé中1٣ _-.\n\t\\*[]"
ATOMS = [
    "a", "b", "k", "K", "s", "ß", "é", "中", "1", ".", r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", r"\b", r"\B", "^",
    "$", r"\A", r"\z", r"\pL", r"\pN", r"\PL", r"\p{Greek}", r"\p{^Han}", "[[:alpha:]]", "[[:^digit:]]", "[a-z]",
    "[^a]", r"[\d_]", "[]a]", r"\x41", r"\x{212A}", r"\101", r"\Q.*\E", r"\C", r"\.", r"\_", r"\-", r"\q", r"\1",
    r"\Z", "(?i)", "(?s)", "(?m)", "(?U)", "(?-i)", "(?x)", "\\", "[", "]", ")", "{", "}", "|", "*",
]  # fmt: skip
QUANTIFIERS = [
    "",
    "",
    "",
    "*",
    "+",
    "?",
    "*?",
    "+?",
    "{2}",
    "{1,3}",
    "{2,}",
    "{,2}",
    "{0}",
    "{1001}",
    "**",
    "*+",
    "{2}{3}",
]
OPENERS = ["(", "(?:", "(?i:", "(?P<n>", "(?<n>", "(?=", "(?!", "(?<=", "(?P<é>", "(?P<>"]


def _patterns() -> st.SearchStrategy[str]:
    piece = st.tuples(st.sampled_from(ATOMS), st.sampled_from(QUANTIFIERS)).map("".join)
    return st.recursive(
        st.lists(piece, min_size=1, max_size=4).map("".join),
        lambda inner: st.one_of(
            st.tuples(st.sampled_from(OPENERS), inner, st.sampled_from([")", ")", ")*", ")+", "){2}", ""])).map(
                "".join
            ),
            st.lists(inner, min_size=2, max_size=3).map("|".join),
            st.lists(inner, min_size=2, max_size=3).map("".join),
        ),
        max_leaves=6,
    )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_patterns(), min_size=1, max_size=6),
    st.lists(st.text(alphabet=STABLE, max_size=8), min_size=1, max_size=6),
)
def test_generated_patterns(go_oracle: GoOracle, patterns: list[str], texts: list[str]) -> None:
    found, _, _ = compare(go_oracle, patterns, texts)
    assert not found, "\n".join(found[:20])


def test_release_gaps_are_only_skipped_where_the_oracle_is_older(go_oracle: GoOracle) -> None:
    """The one syntax gap is real on this oracle (or it is new enough to compare it)."""
    answer: dict[str, Any] = go_oracle.one(op="regexp", s="(?<n>a)", texts=["a"])
    if _go_release(go_oracle) >= (1, 22):
        assert answer["ok"] and answer["matches"] == [True]
    else:
        assert not answer["ok"] and "(?<" in answer["err"]
    assert golang.compile_error("(?<n>a)") == "" and golang.search("(?<n>a)", "a")


# Differences golang.py cannot remove (docs/operator.md, "Where check-job differs from Nomad"):
# each really differs from Go, and golang.caveat names it, so check-job warns.
KNOWN_DIFFERENCES = [
    r"\pL{1000}" * 6,  # RE2 runs out of its memory budget; Go's size limit counts a class as one instruction
]


def test_known_differences_are_real_and_warned(go_oracle: GoOracle) -> None:
    for pattern, go in zip(
        KNOWN_DIFFERENCES,
        go_oracle.ask({"op": "regexp", "s": p, "texts": ["a"]} for p in KNOWN_DIFFERENCES),
        strict=True,
    ):
        assert go["ok"] and golang.compile_error(pattern), (pattern, go)
        assert golang.caveat(pattern).startswith("regexp"), pattern


def test_caveats_name_what_check_job_cannot_settle() -> None:
    assert "Letter" in golang.caveat(r"\p{Letter}") and "`\\P{ascii}`" in golang.caveat(r"[\P{ascii}]")
    assert "nests 300" in golang.caveat("(?:" * 300 + "a" + ")" * 300)
    assert golang.caveat("(?:" * 249 + "a" + ")" * 249) == ""
    assert golang.caveat("(" * 1000 + ")" * 1000) == ""  # Go surely refuses it, and so does compile_error
    for plain in (r"^NVIDIA H\d{3}$", r"\p{Greek}", r"(?P<n>a)", r"\pL{1000}"):
        assert golang.caveat(plain) == "", plain


def test_the_comparison_catches_a_wrong_engine(go_oracle: GoOracle, monkeypatch: pytest.MonkeyPatch) -> None:
    """RE2 alone (without golang.py's Go rules) disagrees with Go, and the comparison says where."""
    monkeypatch.setattr(golang, "compile_error", lambda pattern: golang._re2(pattern)[1])
    found, _, _ = compare(go_oracle, [r"\C", r"(?P<é>x)", r"a"], ["a"])
    assert len(found) == 2 and found[0].startswith("'\\\\C'") and "é" in found[1]


def test_check_job_warns_where_it_may_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real command prints the caveat next to Nomad's outcome, and keeps the outcome's exit status."""
    from nomad_plugin.cli import check_job
    from nomad_plugin.nomad_view.types import Attribute, Device, DeviceGroup
    from tests.jobspec.tables import fingerprint_json
    from tests.jobspec.test_nomad_tables import device_hcl

    group = DeviceGroup("nvidia", "gpu", "H800", (Device("GPU-0", True),), {"model": Attribute("H800")})
    (tmp_path / "fp.json").write_text(fingerprint_json([group]))
    for pattern, code in ((r"\\p{Letter}", 2), ("(?:" * 300 + "H" + ")" * 300, 0), (r"H\\d+", 0)):
        job = tmp_path / "job.hcl"
        job.write_text(
            device_hcl(
                f'constraint {{\n  attribute = "${{device.model}}"\n  operator = "regexp"\n  value = "{pattern}"\n}}'
            )
        )
        fp = str(tmp_path / "fp.json")
        assert check_job.main([str(job), "--fingerprint", fp, "--node-value", "node.pool=default"]) == code
        out = capsys.readouterr().out
        assert ("check-job may differ from Nomad here" in out) == (pattern != r"H\\d+"), out
