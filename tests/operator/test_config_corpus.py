"""doctor's config verdict against the Nomad agent's, on a corpus of agent configs.

Three verdicts per config, each from a real program:

- doctor: ``nomad-device-lingjun doctor --config-only --json`` (the console script);
- Nomad: the conformance host with ``--agent-syntax hcl1`` reads the file with HCL v1, as the
  agent's command/agent/config_parse.go does, decodes the plugin's config with the plugin's own
  ConfigSchema through HCL v2's JSON decoder with the agent's eval context
  (hclutils.ParseHclInterface), and sends the msgpack bytes to the real plugin's SetConfig in a
  fresh launch, twice, as the agent's validation launch does;
- HCL v2: the same host with ``--agent-syntax hcl2`` (HCL v2 native syntax), a second opinion.

Each row states what the agent does, and the oracle must agree with the row, so the table is
checked, not trusted. doctor must give the agent's verdict on every row except those marked
``doctor="refused"``: there doctor is stricter than the agent (it does not evaluate HCL
templates); docs/operator.md lists them. Where HCL v2 disagrees with the agent, the row
says so: HCL v2 is not the agent's parser for agent files.

Every row points data_dir at a temporary directory of its own, except the data_dir rows, which
write data_dir in the file (``{data}`` stands for that temporary directory): SetConfig refuses a
data_dir that is empty, relative, has a ``..`` component, is a system directory or lies in a
kernel filesystem, and doctor must say so before the agent does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conformance.hostlib import built_host, real_plugin

# About 210 short runs (three per config); on a loaded 2-core box the module fixture needs minutes.
pytestmark = pytest.mark.timeout(900)

OK, REFUSED = "ok", "refused"
PLUGIN = "nomad-device-lingjun"


@dataclass(frozen=True)
class Row:
    name: str
    body: str  # the config block's body, or a whole file when it starts with "FILE:"
    nomad: str  # what the agent does: ok or refused
    hcl2: str | None = None  # HCL v2 native's verdict when it differs from the agent's
    doctor: str | None = None  # doctor's verdict when it is stricter than the agent's
    why: str = ""

    @property
    def own_data_dir(self) -> bool:
        return "data_dir" in self.body

    def text(self, data_dir: Path) -> str:
        body = self.body.replace("{data}", str(data_dir))
        if body.startswith("FILE:"):
            return body[len("FILE:") :].lstrip("\n")
        return f'plugin "{PLUGIN}" {{\n  config {{\n{body}\n  }}\n}}\n'


ROWS = [
    # --- accepted by all three -----------------------------------------------------------
    Row("empty config block", "", OK),
    Row("no config block", f'FILE:\nplugin "{PLUGIN}" {{\n}}\n', OK),
    Row("quoted mode", '    default_mode = "tdm"', OK),
    Row("tdm with shares", '    default_mode = "tdm"\n    tdm_shares = 4', OK),
    Row("comments of every kind", '    # one\n    // two\n    /* three */ default_mode = "mig"', OK),
    Row("trailing comma in a list", '    ignored_ids = ["GPU-a", "GPU-b",]', OK),
    Row("list over lines", '    include_types = [\n      "gpu",\n      "ppu",\n    ]', OK),
    Row("config as an attribute", f'FILE:\nplugin "{PLUGIN}" {{\n  config = {{\n    tdm_shares = 5\n  }}\n}}\n', OK),
    Row(
        "nested object in config as an attribute",
        f'FILE:\nplugin "{PLUGIN}" {{\n  config = {{\n    xdm_field_aliases = {{ minor = "index" }}\n  }}\n}}\n',
        OK,
    ),
    Row("bool literal", "    enabled = true\n    reconcile = false", OK),
    Row("bool as a string", '    enabled = "true"', OK, why="the schema's decoder converts the string"),
    Row("bool as 0/1 string", '    nvml_enrich = "0"', OK, why='go-cty converts "0" and "1" to bools'),
    Row("number as a string", '    tdm_shares = "4"', OK),
    Row("numbers in a string list", "    ignored_ids = [1, 2]", OK, why="numbers convert to strings"),
    Row("strings in a number list", '    xid_ignore = ["13", "31"]', OK),
    Row("float that is whole", "    tdm_shares = 4.0", OK),
    Row(
        "card blocks",
        '    card {\n      match = "3"\n      mode  = "tdm"\n      shares = 4\n    }\n'
        '    card {\n      match = "NVIDIA H800"\n      mode  = "mig"\n    }',
        OK,
    ),
    Row("card as an attribute", '    card = {\n      match = "2"\n      mode = "tdm"\n    }', OK),
    Row(
        "two config blocks merge",
        f'FILE:\nplugin "{PLUGIN}" {{\n  config {{\n    default_mode = "tdm"\n  }}\n'
        "  config {\n    tdm_shares = 4\n  }\n}\n",
        OK,
        why="HCL v1 merges them; doctor warns",
    ),
    Row("heredoc for a free string", "    nomad_tls_server_name = <<EOF\nabc\nEOF", OK),
    Row("heredoc holding a quoted name", '    nomad_tls_server_name = <<EOF\n"a.b" = 1\nEOF', OK),
    Row("unicode escape", '    default_mode = "t\\u0064m"', OK),
    Row("octal integer", "    tdm_shares = 010", OK, why="HCL v1 reads 8, HCL v2 reads 10: both accepted"),
    Row("field aliases with quoted keys", '    xdm_field_aliases = { "GpuInfo.uuid" = "card_uuid" }', OK),
    Row("field aliases as a list", '    xdm_field_aliases = [{ minor = "index" }]', OK),
    Row(
        "other agent stanzas",
        f'FILE:\ndatacenter = "dc1"\nclient {{\n  enabled = true\n  servers = ["a:4647"]\n}}\n'
        f'plugin "{PLUGIN}" {{\n  config {{\n    backend = "nvml"\n  }}\n}}\n',
        OK,
    ),
    Row("log level in capitals", '    log_level = "DEBUG"', OK),
    Row("group_by level", '    group_by = "numaNodes"', OK),
    Row("nomad address", '    nomad_address = "unix:///run/nomad.sock"', OK),
    # --- refused by all three ----------------------------------------------------------
    Row(
        "bare word", "    default_mode = tdm", REFUSED, why="HCL v1: Unknown token IDENT; HCL v2: Variables not allowed"
    ),
    Row("capitalised True", "    enabled = True", REFUSED),
    Row("bare word in a list", "    ignored_ids = [abc]", REFUSED),
    Row("function call", '    default_mode = lower("TDM")', REFUSED),
    Row("interpolated variable", '    nomad_tls_server_name = "${node.unique.id}"', REFUSED),
    Row("multi-line quoted string", '    nomad_tls_server_name = "ab\ncd"', REFUSED),
    Row("single quotes", "    default_mode = 'tdm'", REFUSED),
    Row("colon instead of equals", '    default_mode: "tdm"', REFUSED),
    Row("unknown option", '    defualt_mode = "tdm"', REFUSED),
    Row("dashed option name", '    default-mode = "tdm"', REFUSED),
    Row("shares out of range", "    tdm_shares = 0", REFUSED, why="SetConfig's range check"),
    Row("fractional shares", "    tdm_shares = 4.5", REFUSED),
    Row("mode not a choice", '    default_mode = "shared"', REFUSED),
    Row("heredoc keeps its newline", "    default_mode = <<EOF\ntdm\nEOF", REFUSED, why='the value is "tdm\\n"'),
    Row("missing xdm_schema file", '    xdm_schema = "/nonexistent/xdm/api_outer.proto"', REFUSED),
    Row("relative socket", '    xdm_socket = "dp2mgr.sock"', REFUSED),
    Row("bad nomad address", '    nomad_address = "ftp://nomad:4646"', REFUSED),
    Row("bool that is not one", '    enabled = "yes"', REFUSED),
    Row("number that is not one", '    tdm_shares = "four"', REFUSED),
    Row("number for a bool", "    enabled = 1", REFUSED),
    Row("nested list", '    ignored_ids = [["a"]]', REFUSED),
    Row("string for a list", '    ignored_ids = "GPU-a"', REFUSED),
    Row("list for a string", '    default_mode = ["tdm"]', REFUSED),
    Row(
        "one match, two modes",
        '    card {\n      match = "3"\n      mode = "tdm"\n    }\n'
        '    card {\n      match = "3"\n      mode = "mig"\n    }',
        REFUSED,
    ),
    Row("card without match", "    card {\n      shares = 4\n    }", REFUSED),
    Row("card as a list of numbers", "    card = [1]", REFUSED),
    Row("unclosed block", f'FILE:\nplugin "{PLUGIN}" {{\n  config {{\n    tdm_shares = 4\n}}\n', REFUSED),
    Row(
        "bad value in another stanza",
        f'FILE:\nclient {{\n  servers = [nomad1]\n}}\nplugin "{PLUGIN}" {{\n}}\n',
        REFUSED,
        hcl2=OK,
        why="the agent refuses the whole file; the host's HCL v2 reading evaluates the plugin block only",
    ),
    Row("duration that is not one", '    xdm_call_timeout = "5 seconds"', REFUSED),
    # --- the agent (HCL v1) and HCL v2 disagree: doctor follows the agent ----------------
    Row(
        "one-line block with two attributes",
        '    card { match = "3" mode = "tdm" }',
        OK,
        hcl2=REFUSED,
        why="HCL v2 allows one argument in a one-line block; the README's own example",
    ),
    Row(
        "attribute given twice",
        '    default_mode = "tdm"\n    default_mode = "mig"',
        OK,
        hcl2=REFUSED,
        why="HCL v1 keeps the last; doctor warns",
    ),
    Row(
        "plugin block given twice",
        f'FILE:\nplugin "{PLUGIN}" {{\n  config {{\n    tdm_shares = 3\n  }}\n}}\n'
        f'plugin "{PLUGIN}" {{\n  config {{\n    tdm_shares = 4\n  }}\n}}\n',
        OK,
        hcl2=REFUSED,
        why="the agent keeps the last block; doctor warns",
    ),
    Row("hex number", "    tdm_shares = 0x4", OK, hcl2=REFUSED),
    Row("comma between attributes", '    card { match = "3", mode = "tdm" }', OK, hcl2=REFUSED),
    Row(
        "commas in another stanza",
        f'FILE:\ntelemetry {{ collection_interval = "5s", prometheus_metrics = true }}\n'
        f'plugin "{PLUGIN}" {{\n  config {{\n    tdm_shares = 4\n  }}\n}}\n',
        OK,
        hcl2=REFUSED,
        why="HCL v1 takes a comma after any attribute; real agent files write telemetry so",
    ),
    Row(
        "template outside the plugin block",
        f'FILE:\nclient {{\n  meta {{\n    id = "${{node.unique.id}}"\n  }}\n}}\n'
        f'plugin "{PLUGIN}" {{\n  config {{\n    tdm_shares = 4\n  }}\n}}\n',
        OK,
        why="HCL v1 keeps it as text; only the plugin's config is evaluated",
    ),
    Row("quoted attribute name", '    "default_mode" = "tdm"', OK, hcl2=REFUSED),
    Row(
        "quoted option names in a client block",
        f'FILE:\nclient {{\n  options {{\n    "driver.raw_exec.enable" = "1"\n'
        f'  }}\n}}\nplugin "{PLUGIN}" {{\n  config {{\n    tdm_shares = 5\n  }}\n}}\n',
        OK,
        hcl2=REFUSED,
        why="HCL v1's way of writing client options; HCL v2 wants a name",
    ),
    Row("quoted unknown option", '    "default mode" = "tdm"', REFUSED, hcl2=REFUSED),
    Row("null", "    default_mode = null", REFUSED, hcl2=OK, why="HCL v1 has no null"),
    Row("arithmetic", "    tdm_shares = 2 + 2", REFUSED, hcl2=OK),
    Row("parentheses", "    tdm_shares = (4)", REFUSED, hcl2=OK),
    Row(
        "escaped template",
        '    nomad_tls_server_name = "$${id}"',
        OK,
        hcl2=REFUSED,
        why="HCL v1 keeps $${ and the JSON decoder unescapes it once; HCL v2 unescapes it twice",
    ),
    # --- data_dir: SetConfig's rules, which doctor applies too -------------------------
    Row("data_dir of the plugin's own", '    data_dir = "{data}/plugin"', OK),
    Row("data_dir empty", '    data_dir = ""', REFUSED, why="the journal would land in the agent's working directory"),
    Row("data_dir relative", '    data_dir = "nomad-device-lingjun"', REFUSED),
    Row("data_dir with a .. component", '    data_dir = "{data}/../elsewhere"', REFUSED),
    Row("data_dir a system directory", '    data_dir = "/var/lib"', REFUSED),
    Row("data_dir in a kernel filesystem", '    data_dir = "/proc/nomad-device-lingjun"', REFUSED),
    # --- doctor stricter than the agent (documented in docs/operator.md) --------------
    Row(
        "function in a template",
        '    default_mode = "${lower("TDM")}"',
        OK,
        hcl2=REFUSED,
        doctor=REFUSED,
        why="the agent evaluates templates with its functions; doctor does not evaluate",
    ),
    Row("template directive", '    default_mode = "%{ if true }tdm%{ endif }"', OK, doctor=REFUSED),
]


@dataclass
class Verdicts:
    doctor: str
    doctor_text: str
    nomad: str
    nomad_text: str
    nomad_stage: str
    hcl2: str
    hcl2_text: str


def _data_dir_set(data_dir: Path | None) -> list[str]:
    return [] if data_dir is None else ["--set", f'data_dir="{data_dir}"']


def _doctor(path: Path, data_dir: Path | None) -> tuple[str, str]:
    proc = subprocess.run(
        [str(real_plugin()), "doctor", "--config-only", "--json", "--plugin-config", str(path),
         *_data_dir_set(data_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    doc = json.loads(proc.stdout)
    config = [f for f in doc["findings"] if f["check"] == "config"]
    failed = [f for f in config if f["status"] == "fail"]
    return (REFUSED if failed else OK), " ".join(f["summary"] for f in config)


def _host(host: Path, path: Path, data_dir: Path | None, syntax: str) -> tuple[str, str, str]:
    proc = subprocess.run(
        [str(host), "--plugin", str(real_plugin()), "--phase", "validate", "--agent-syntax", syntax,
         "--config", str(path), *_data_dir_set(data_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for event in events:
        if event["event"] == "error":
            return REFUSED, event["error"], "file"
        if event["event"] == "config_decoded" and not event["ok"]:
            return REFUSED, event["error"], "decode"
        if event["event"] == "set_config" and not event["ok"]:
            return REFUSED, event["message"], "set_config"
    calls = [e for e in events if e["event"] == "set_config"]
    assert len(calls) == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    return OK, "", "set_config"


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Verdicts]:
    if shutil.which("go") is None:
        pytest.skip("`go` is not installed; the conformance host needs Debian's Go packages (make go-deps)")
    host = built_host()
    root = tmp_path_factory.mktemp("corpus")

    def judge(index: int, row: Row) -> tuple[str, Verdicts]:
        path = root / f"row{index:02d}.hcl"
        data_dir = root / f"data{index:02d}"
        path.write_text(row.text(data_dir))
        given = None if row.own_data_dir else data_dir
        doctor, doctor_text = _doctor(path, given)
        nomad, nomad_text, stage = _host(host, path, given, "hcl1")
        hcl2, hcl2_text, _ = _host(host, path, given, "hcl2")
        return row.name, Verdicts(doctor, doctor_text, nomad, nomad_text, stage, hcl2, hcl2_text)

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(lambda item: judge(*item), enumerate(ROWS)))


def test_corpus_is_large_and_named_once() -> None:
    assert len({r.name for r in ROWS}) == len(ROWS)
    assert sum(1 for r in ROWS if r.hcl2 is None and r.doctor is None) >= 40


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_verdicts(row: Row, verdicts: dict[str, Verdicts]) -> None:
    v = verdicts[row.name]
    shown = f"doctor={v.doctor} ({v.doctor_text[:300]})\nnomad={v.nomad} ({v.nomad_text[:300]})\nhcl2={v.hcl2} ({v.hcl2_text[:200]})"
    assert v.nomad == row.nomad, f"the row says the agent does {row.nomad}; HCL v1 + SetConfig say:\n{shown}"
    assert v.hcl2 == (row.hcl2 or row.nomad), shown
    assert v.doctor == (row.doctor or row.nomad), shown


def test_doctor_gives_setconfigs_own_words(verdicts: dict[str, Verdicts]) -> None:
    """Where the real plugin's SetConfig refuses, doctor's finding carries the plugin's message."""
    refused = [(name, v) for name, v in verdicts.items() if v.nomad_stage == "set_config" and v.nomad == REFUSED]
    assert len(refused) >= 8
    for name, v in refused:
        assert v.nomad_text in v.doctor_text, f"{name}: SetConfig said {v.nomad_text!r}; doctor said {v.doctor_text!r}"


def test_agreement_summary(verdicts: dict[str, Verdicts], capsys: pytest.CaptureFixture[str]) -> None:
    agree_all = sum(1 for v in verdicts.values() if v.doctor == v.nomad == v.hcl2)
    doctor_nomad = sum(1 for v in verdicts.values() if v.doctor == v.nomad)
    with capsys.disabled():
        sys.stderr.write(
            f"\nconfig corpus: {len(verdicts)} configs; doctor = agent on {doctor_nomad}; "
            f"doctor = agent = HCL v2 on {agree_all}\n"
        )
    assert agree_all >= 40
