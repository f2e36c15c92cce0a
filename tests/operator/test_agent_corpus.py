"""Real agent files, read by the product as the Nomad agent's HCL v1 reads them.

tests/corpus/agent/ holds real client agent files from public repositories (SOURCES.md cites each)
and expected.json, Go's HCL v1 reading of each (record.py): parses or refused; data_dir, plugin_dir,
the plugin dir the agent derives; every plugin block with its args and config. Here:

- the Python reader (nomad_plugin/util/hcl1.py via the launcher) gives that reading for every file;
- the real ``nomad-device-lingjun doctor`` reaches the same verdict: a file Go refuses fails the
  config check, a file Go reads is read (its plugin blocks are the ones doctor names), and doctor
  checks the plugin dir the agent would use;
- where Go and Debian's HCL v1 are installed, expected.json is still Go's reading, and the reader
  agrees with Go on HCL v1's own test fixtures and on seeded random files.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin.launcher.config import (
    AgentSyntaxError,
    LauncherConfigError,
    PluginBlocks,
    agent_plugin_dir,
    find_plugin_blocks,
    read_agent_text,
)
from tests.conformance.hostlib import HostNotBuilt, built_host, real_plugin

CORPUS = Path(__file__).resolve().parent.parent / "corpus" / "agent"
EXPECTED: dict[str, dict[str, Any]] = json.loads((CORPUS / "expected.json").read_text())
SOURCES: list[dict[str, str]] = json.loads((CORPUS / "sources.json").read_text())
FILES = sorted(EXPECTED)
HCL1_SOURCE = Path("/usr/share/gocode/src/github.com/hashicorp/hcl")

pytestmark = pytest.mark.timeout(600)


def python_reading(path: Path) -> dict[str, Any]:
    """The product's reading of one file, in the host's JSON shape."""
    try:
        agent = read_agent_text(path.read_text(), str(path))
    except AgentSyntaxError as exc:
        return {"ok": False, "error": str(exc)}
    plugins = [{"name": b.label, "args": b.args, "config": b.config or None} for b in agent.plugins]
    try:
        effective, _ = agent_plugin_dir(PluginBlocks(data_dir=agent.data_dir, plugin_dir=agent.plugin_dir))
    except LauncherConfigError:  # relative: the agent refuses to start (the corpus has none)
        effective = None
    out = {"ok": True, "data_dir": agent.data_dir, "plugin_dir": agent.plugin_dir, "plugins": plugins}
    return {**out, "effective_plugin_dir": effective}


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """A reading less the error's wording (both refuse is agreement), with JSON's own values."""
    if not doc["ok"]:
        return {"ok": False}
    plugins = [{**p, "config": p["config"] or None} for p in doc["plugins"]]
    return dict(json.loads(json.dumps({**doc, "plugins": plugins})))


def test_corpus_is_large_cited_and_recorded() -> None:
    assert len(FILES) >= 25
    on_disk = sorted(p.name for p in CORPUS.glob("*.hcl"))
    assert on_disk == FILES == sorted(s["file"] for s in SOURCES)
    cited = (CORPUS / "SOURCES.md").read_text()
    for source in SOURCES:
        assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), source
        assert f"| {source['file']} | {source['repository']} | {source['path']} | {source['commit']} |" in cited
    # the v1-only forms the corpus must hold: commas between attributes, a quoted "plugin" = { ... } key,
    # a plugin_dir, a plugin dir derived from data_dir, a file the agent refuses
    texts = {name: (CORPUS / name).read_text() for name in FILES}
    assert any(re.search(r'^\s*\w+ = "[^"]*",\s*$', t, re.M) for t in texts.values())
    assert any('"plugin" = {' in t for t in texts.values())
    readings = [EXPECTED[n] for n in FILES]
    assert any(r["ok"] and r["plugin_dir"] for r in readings)
    assert any(r["ok"] and not r["plugin_dir"] and r["effective_plugin_dir"] for r in readings)
    assert any(not r["ok"] for r in readings)


@pytest.mark.parametrize("name", FILES)
def test_python_reads_as_go(name: str) -> None:
    assert _comparable(python_reading(CORPUS / name)) == _comparable(EXPECTED[name])


def test_a_directory_of_agent_files_merges_as_the_agent(tmp_path: Path) -> None:
    """Sorted files, the last plugin_dir or data_dir set wins; editors' backup files are skipped."""
    for name in FILES:
        if EXPECTED[name]["ok"]:
            shutil.copyfile(CORPUS / name, tmp_path / name)
    (tmp_path / "zz.hcl~").write_text("this is not HCL {")
    blocks = find_plugin_blocks(tmp_path)
    readings = [EXPECTED[n] for n in sorted(p.name for p in tmp_path.glob("*.hcl"))]
    assert blocks.data_dir == next(r["data_dir"] for r in reversed(readings) if r["data_dir"])
    assert blocks.plugin_dir == next(r["plugin_dir"] for r in reversed(readings) if r["plugin_dir"])
    assert set(blocks.names()) == {p["name"] for r in readings for p in r["plugins"]}


# --- the real doctor on every corpus file ----------------------------------------------------------


def _doctor(path: Path, root: Path) -> tuple[int, dict[str, list[dict[str, str]]]]:
    proc = subprocess.run(
        [str(real_plugin()), "doctor", "--json", "--plugin-config", str(path), "--root", str(root)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    found: dict[str, list[dict[str, str]]] = {}
    for finding in doc["findings"]:
        found.setdefault(finding["check"], []).append(finding)
    found["summary"] = [{"summary": doc["summary"]}]
    return proc.returncode, found


@pytest.fixture(scope="module")
def doctor_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict[str, list[dict[str, str]]]]]:
    root = tmp_path_factory.mktemp("root")
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(FILES, pool.map(lambda n: _doctor(CORPUS / n, root), FILES), strict=True))


@pytest.mark.parametrize("name", FILES)
def test_doctor_reads_as_go(name: str, doctor_runs: dict[str, tuple[int, dict[str, list[dict[str, str]]]]]) -> None:
    code, found = doctor_runs[name]
    expected = EXPECTED[name]
    config = found["config"][0]
    plugin_dir = found["plugin dir"][0]
    assert code == 1 and "can run the plugin" not in found["summary"][0]["summary"]
    if not expected["ok"]:
        assert config["status"] == "fail" and "not valid HCL" in config["summary"], config
        assert "Nomad refuses to start" in config["next_step"]
        assert plugin_dir["status"] == "skip" and "could not be read" in plugin_dir["summary"]
        return
    # none of these files has this plugin's block: doctor says so and names the blocks Go reads
    names = sorted({p["name"] for p in expected["plugins"]})
    assert config["status"] == "fail" and "no plugin" in config["summary"], config
    assert f"plugin blocks found: {', '.join(repr(n) for n in names) or 'none'}" in config["summary"]
    effective = expected["effective_plugin_dir"]
    if not effective:
        assert plugin_dir["status"] == "skip" and "sets neither plugin_dir nor data_dir" in plugin_dir["summary"]
        return
    assert plugin_dir["summary"].startswith(f"{effective} ("), plugin_dir
    assert ("plugin_dir in" if expected["plugin_dir"] else "data_dir") in plugin_dir["summary"]
    assert plugin_dir["status"] in ("fail", "ok")


# --- against Go's HCL v1 itself ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def host() -> Path:
    """The host ``make go-tools`` built (never built under a test's timeout); skips only outside CI without Go."""
    if shutil.which("go") is None and not os.environ.get("CI"):
        pytest.skip("`go` is not installed; the conformance host needs Debian's Go packages (make go-deps)")
    try:
        return built_host()
    except HostNotBuilt as exc:
        why = str(exc)
    pytest.fail(why, pytrace=False)


def go_readings(host: Path, paths: list[Path]) -> dict[Path, dict[str, Any]]:
    proc = subprocess.run(
        [str(host), "agent-file", *map(str, paths)], capture_output=True, text=True, check=True, timeout=300
    )
    docs = [json.loads(line) for line in proc.stdout.splitlines()]
    return {Path(doc.pop("file")): doc for doc in docs}


def test_expected_is_still_gos_reading(host: Path) -> None:
    readings = go_readings(host, [CORPUS / n for n in FILES])
    for name in FILES:
        assert readings[CORPUS / name] == EXPECTED[name], f"{name}: run tests/corpus/agent/record.py"


def test_hcl1_fixtures_accepted_and_refused_as_go(host: Path) -> None:
    fixtures = sorted(HCL1_SOURCE.glob("test-fixtures/*.hcl")) + sorted(
        HCL1_SOURCE.glob("hcl/parser/test-fixtures/*.hcl")
    )
    assert len(fixtures) >= 60, f"HCL v1's fixtures are missing under {HCL1_SOURCE}"
    readings = go_readings(host, fixtures)
    for path in fixtures:
        assert python_reading(path)["ok"] == readings[path]["ok"], (path, readings[path])


KEYS = ("config", "CONFIG", "card", "match", "x.y-z", "a", '"quoted key"', '"k"', "plugin", "Plugin")
LITERALS = (
    '"tdm"', '"a\\u00e9"', '"\\x41\\101"', '"${x("y")}"', '"$${x}"', '"tab\\there"', "1", "-1", "010", "0x1F",
    "4.5", ".5", "1.", "1e3", "2E-2", "true", "false", "<<EOF\nabc\nEOF\n", "<<-EOF\n  a\n   b\n  EOF\n",
)  # fmt: skip
LABELS = ('"p"', '"q" "r"', "")
NOISE = ("tdm", "null", "(", ")", ":", "-", "08", '"\\q"', "'", "}", "]", "=", ",", '"', "/*", "#c\n", "<<")


def _value(rnd: random.Random, depth: int) -> str:
    kind = rnd.random()
    if depth > 2 or kind < 0.6:
        return rnd.choice(LITERALS)
    if kind < 0.8:
        items = [_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
        return "[" + ", ".join(items) + rnd.choice(("", ",")) + "]"
    return "{" + _body(rnd, depth + 1) + "}"


def _body(rnd: random.Random, depth: int) -> str:
    """A body; an attribute's key is not repeated in it (a second value for a key decodes into the first,
    and for a string or bool that is where Debian's v1.0.0 and Nomad's fork differ: see the test below)."""
    items = []
    unused = rnd.sample(KEYS, len(KEYS))
    for _ in range(rnd.randint(0, 4)):
        keys = " ".join(rnd.choice(KEYS) for _ in range(rnd.choice((1, 1, 2, 3))))
        if depth == 0 and rnd.random() < 0.4:
            # a FLOAT or bool in args is where Debian's v1.0.0 and Nomad's fork differ (test below)
            args = f"args = [{rnd.choice(LITERALS[:9])}]\n" if rnd.random() < 0.3 else ""
            label = rnd.choice(LABELS)
            items.append(f"plugin {label} {{\n{args}config {{\n{_body(rnd, 1)}\n}}\n}}")
        elif rnd.random() < 0.4 and depth < 3:
            items.append(f"{keys} {{\n{_body(rnd, depth + 1)}\n}}")
        elif unused:
            items.append(f"{unused.pop()} = {_value(rnd, depth)}")
    return rnd.choice(("\n", ", ", "\n  ")).join(items)


def test_random_files_read_as_go(host: Path, tmp_path: Path) -> None:
    """Seeded random agent files: mostly well formed (blocks, labels, commas, every literal form), one in
    three with a stray token. Go's verdict on each, and where it reads one, the same values."""
    rnd = random.Random(38)
    paths = []
    for index in range(1500):
        text = _body(rnd, 0)
        if index % 3 == 0:
            at = rnd.randint(0, len(text))
            text = text[:at] + f" {rnd.choice(NOISE)} " + text[at:]
        if text.lstrip().startswith("{"):
            text = "x = 1\n" + text  # HCL v1 reads a text that opens with "{" as JSON: not what this test is about
        path = tmp_path / f"{index:04d}.hcl"
        path.write_text(text + "\n")
        paths.append(path)
    readings = go_readings(host, paths)
    accepted = 0
    for path in paths:
        mine, theirs = python_reading(path), readings[path]
        mine.pop("effective_plugin_dir", None)
        theirs.pop("effective_plugin_dir", None)
        assert _comparable(mine) == _comparable(theirs), (path.read_text(), theirs)
        accepted += theirs["ok"]
    assert 300 < accepted < len(paths) - 300, accepted  # both verdicts well represented


def test_numbers_and_bools_read_as_strings_as_nomads_fork_does() -> None:
    """Nomad pins github.com/hashicorp/hcl v1.0.1-nomad-1, whose decodeString takes NUMBER, FLOAT and BOOL
    as their text (Debian's v1.0.0, the oracle above, takes NUMBER only): the fork is the reference."""
    agent = read_agent_text('data_dir = 4.5\nplugin_dir = true\nplugin "p" {\n  args = [1, 2.5, false]\n}\n', "a.hcl")
    assert (agent.data_dir, agent.plugin_dir, agent.plugins[0].args) == ("4.5", "true", ["1", "2.5", "false"])
    # a second value for a key decodes into the first: into a string (the fork's decodeString) and into a
    # bool (the fork's decodeBool: "1", "0", "true", "false" in any case, quoted or not)
    text = 'plugin "p" {\n  config {\n    a = "s"\n    a = 2.5\n    b = true\n    b = "0"\n  }\n}\n'
    assert read_agent_text(text, "b.hcl").plugins[0].config == {"a": "2.5", "b": False}
