"""Record what the Nomad agent reads in each corpus file: Go's HCL v1, through the conformance host.

``make go-tools && python tests/corpus/agent/record.py`` runs ``conformance-host agent-file`` (hcl.Decode into the
agent's data_dir, plugin_dir and plugin fields, Debian's golang-github-hashicorp-hcl-dev) over every
file listed in sources.json and writes expected.json and SOURCES.md from its answers.
tests/operator/test_agent_corpus.py checks the Python reading and doctor against expected.json,
and, where Go is installed, that expected.json is still Go's reading.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent.parent))

from tests.conformance.hostlib import built_host  # noqa: E402


def go_reading(paths: list[Path]) -> dict[str, dict[str, object]]:
    """file name -> Go HCL v1's reading of it (the host's JSON, less its path)."""
    proc = subprocess.run(
        [str(built_host()), "agent-file", *map(str, paths)], capture_output=True, text=True, check=True, timeout=300
    )
    readings = {}
    for line in proc.stdout.splitlines():
        doc = json.loads(line)
        readings[Path(doc.pop("file")).name] = doc
    return readings


def _outcome(doc: dict[str, object]) -> str:
    if not doc["ok"]:
        return f"refused: `{doc['error']}`"
    plugins = ", ".join(str(p["name"]) for p in doc["plugins"]) or "none"  # type: ignore[attr-defined]
    effective = doc["effective_plugin_dir"] or "none (needs -plugin-dir or -data-dir)"
    return f"parses; plugin blocks: {plugins}; plugin dir: `{effective}`"


def main() -> None:
    sources = json.loads((HERE / "sources.json").read_text())
    readings = go_reading([HERE / s["file"] for s in sources])
    (HERE / "expected.json").write_text(json.dumps(readings, indent=1, sort_keys=True) + "\n")
    lines = [
        "# Agent configuration corpus",
        "",
        'Real Nomad agent files from public repositories, byte for byte. "What the agent reads" is Go\'s HCL v1',
        "(`hcl.Decode`, as command/agent/config_parse.go calls it) into the agent's `data_dir`, `plugin_dir`",
        "and `plugin` fields, recorded by record.py through the conformance host; the plugin dir is the",
        "agent's default rule (command/agent/command.go): `plugin_dir`, else `<data_dir>/plugins`.",
        "",
        "| File | Repository | Path | Commit | What the agent reads |",
        "|---|---|---|---|---|",
    ]
    for s in sources:
        outcome = _outcome(readings[s["file"]]).replace("|", "\\|")
        lines.append(f"| {s['file']} | {s['repository']} | {s['path']} | {s['commit']} | {outcome} |")
    (HERE / "SOURCES.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
