"""No input to ``check-job`` prints a Python traceback or a Python warning.

Hostile job files (Go literals Python reads differently, out-of-range numbers,
patterns RE2 refuses, wrong types for every field, broken encodings, deep
nesting) and hostile saved fingerprints go through the real command: one
interpreter started with ``-W always`` runs the command's entry point once
per input (so every warning prints, every time), and a few inputs also go
through ``python -m nomad_plugin check-job`` itself. Node-level rules get
hostile blocks at every level, hostile node files (``--node``), stated values
(``--node-value``), saved plugin keys and an agent that is not there. Any "Traceback" or
"Warning" on stdout or stderr fails the test, as does an exit status other
than check-job's documented 0, 1 and 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("Traceback", "Warning:", "Error:\n", "Exception ignored")


def device(body: str, name: str = "nvidia/gpu") -> str:
    return (
        f'job "j" {{\n  group "g" {{\n    task "t" {{\n      driver = "raw_exec"\n      resources {{\n'
        f'        device "{name}" {{\n{body}\n        }}\n      }}\n    }}\n  }}\n}}\n'
    )


def node_level(job_body: str = "", group_body: str = "", task_body: str = "") -> str:
    """A job whose job, group and task levels hold the given blocks (node-level rules)."""
    return (
        f'job "j" {{\n{job_body}\n  group "g" {{\n{group_body}\n    task "t" {{\n      driver = "raw_exec"\n'
        f"{task_body}\n    }}\n  }}\n}}\n"
    )


def rule(attribute: str, operator: str, value: str) -> str:
    return f'constraint {{\n attribute = "{attribute}"\n operator = "{operator}"\n value = "{value}"\n}}'


MEM = "${device.attr.memory}"
HCL_JOBS: dict[str, str] = {
    "inf": device(rule(MEM, ">=", "inf")),
    "minus-inf-unit": device(rule(MEM, ">=", "-Inf GiB")),
    "nan": device(rule("${device.attr.minor}", "<", "nan")),
    "nan-unit": device(rule(MEM, "=", "nan MiB")),
    "huge-float": device(rule(MEM, ">=", "1e400 GiB")),
    "huge-int": device(rule(MEM, ">=", "99999999999999999999999999 EiB")),
    "eib-overflow": device(rule(MEM, ">=", "9 EiB")),
    "underscore": device(rule("${device.attr.minor}", ">=", "1_000")),
    "hex-float": device(rule("${device.attr.minor}", ">=", "0x1p4")),
    "posix-class": device(rule("${device.model}", "regexp", "[[:alpha:]]+")),
    "lookahead": device(rule("${device.model}", "regexp", "H(?=800)")),
    "backreference": device(rule("${device.model}", "regexp", "(a)\\\\1")),
    "huge-repeat": device(rule("${device.model}", "regexp", "a{1001}")),
    "nested-repeat": device(rule("${device.model}", "regexp", "((a{1000}){1000}){1000}")),
    "python-only-flag": device(rule("${device.model}", "regexp", "(?x) a # comment")),
    "ids-regexp": device(rule("${device.ids}", "regexp", "GPU-.*")),
    "ids-order": device(rule("${device.ids}", "<", "Z")),
    "semver-pessimistic": device(rule("${device.attr.driver_version}", "semver", "~> 535.0")),
    "version-float": device(rule("${device.attr.driver_version}", "version", "1.0")),
    "version-prerelease": device(rule("${device.attr.driver_version}", "version", ">= 2.0.0-beta")),
    "version-garbage": device(rule("${device.attr.driver_version}", "version", ">= \u00e9")),
    "bool-order": device(rule("${device.attr.runtime_kit}", ">", "true")),
    "set-contains-any-key": device('constraint {\n attribute = "${device.model}"\n set_contains_any = "a,b"\n}'),
    "affinity-is-set": device('affinity {\n attribute = "${device.model}"\n operator = "is_set"\n}'),
    "weight-huge": device('affinity {\n attribute = "${device.model}"\n value = "x"\n weight = 1e30\n}'),
    "weight-text": device('affinity {\n attribute = "${device.model}"\n value = "x"\n weight = "heavy"\n}'),
    "weight-list": device('affinity {\n attribute = "${device.model}"\n value = "x"\n weight = [1]\n}'),
    "count-huge": device("count = 1e30"),
    "count-float": device("count = 2.5"),
    "count-bool": device("count = true"),
    "count-list": device("count = [1]"),
    "count-zero": device("count = 0"),
    "count-negative": device("count = -3"),
    "count-variable": device("count = var.n"),
    "value-list": device(f'constraint {{\n attribute = "{MEM}"\n value = [1, 2]\n}}'),
    "value-object": device(f'constraint {{\n attribute = "{MEM}"\n value = {{ a = 1 }}\n}}'),
    "value-null": device(f'constraint {{\n attribute = "{MEM}"\n value = null\n}}'),
    "distinct-hosts-text": device('constraint {\n distinct_hosts = "maybe"\n}'),
    "nested-block": device(f'constraint {{\n attribute = "{MEM}"\n value = "1"\n inner {{ x = 1 }}\n}}'),
    "misspelled": device("cout = 2"),
    "empty-name": device("count = 1", name=""),
    "slashes": device("count = 1", name="a/b/c/d/e"),
    "unicode-name": device("count = 1", name="nvidia/gpu/\u2603 \u0000"),
    "bad-target": device(rule("$attr.x", "=", "1")),
    "open-target": device(rule("${device.attr.memory", "=", "1")),
    "unknown-operator": device(rule(MEM, "~=", "1")),
    "no-job": 'variable "x" {}\n',
    "syntax": 'job "j" {{{\n',
    "unterminated": 'job "j" {\n group "g" {\n',
    "empty": "",
    "nul-bytes": "job \x00 {}",
    "crlf": device("count = 1").replace("\n", "\r\n"),
    "node-lookahead": node_level(group_body=rule("${meta.rack}", "regexp", "r(?=1)")),
    "node-posix": node_level(group_body=rule("${attr.kernel.name}", "regexp", "[[:alpha:]]+")),
    "node-inf-order": node_level(group_body=rule("${meta.lingjun.card_count}", ">=", "inf")),
    "node-nan-order": node_level(group_body=rule("${meta.lingjun.card_count}", "<", "nan")),
    "node-huge-order": node_level(group_body=rule("${meta.lingjun.card_count}", ">", "1e400")),
    "node-underscore": node_level(group_body=rule("${meta.lingjun.card_count}", ">", "1_0")),
    "node-version-garbage": node_level(job_body=rule("${attr.nomad.version}", "version", ">= \u00e9")),
    "node-semver-pessimistic": node_level(job_body=rule("${attr.nomad.version}", "semver", "~> 1.0")),
    "node-unknown-operator": node_level(group_body=rule("${meta.rack}", "~=", "x")),
    "node-open-target": node_level(group_body=rule("${meta.rack", "=", "x")),
    "node-device-target": node_level(group_body=rule("${device.attr.memory}", ">=", "1 GiB")),
    "node-unicode": node_level(group_body=rule("${meta.\u2603}", "=", "\u2603 \u0000")),
    "node-empty-meta-key": node_level(group_body=rule("${meta.}", "is_set", "")),
    "node-variable": node_level(group_body='constraint {\n attribute = "${meta.rack}"\n value = var.rack\n}'),
    "node-value-list": node_level(job_body='constraint {\n attribute = "${meta.rack}"\n value = [1]\n}'),
    "node-distinct-text": node_level(group_body='constraint {\n distinct_hosts = "maybe"\n}'),
    "node-distinct-task": node_level(task_body='constraint {\n distinct_property = "${meta.rack}"\n value = "x"\n}'),
    "node-affinity-huge-weight": node_level(
        group_body='affinity {\n attribute = "${meta.a}"\n value = "x"\n weight = 1e30\n}'
    ),
    "node-affinity-is-set": node_level(task_body='affinity {\n attribute = "${meta.a}"\n operator = "is_set"\n}'),
    "spread-huge-weight": node_level(job_body='spread {\n attribute = "${meta.a}"\n weight = 1e30\n}'),
    "spread-text-weight": node_level(group_body='spread {\n attribute = "${meta.a}"\n weight = "x"\n}'),
    "spread-negative-percent": node_level(
        group_body='spread {\n attribute = "${meta.a}"\n target "x" { percent = -1 }\n}'
    ),
    "spread-huge-percent": node_level(
        group_body='spread {\n attribute = "${meta.a}"\n target "x" { percent = 1e30 }\n}'
    ),
    "spread-unlabelled-target": node_level(group_body='spread {\n attribute = "${meta.a}"\n target { percent = 5 }\n}'),
    "spread-target-attribute": node_level(group_body='spread {\n attribute = "${meta.a}"\n target = "x"\n}'),
    "spread-misspelled": node_level(group_body='spread {\n atribute = "${meta.a}"\n}'),
    "spread-variable": node_level(group_body="spread {\n attribute = var.a\n}"),
    "spread-in-task": node_level(task_body='spread {\n attribute = "${meta.a}"\n}'),
    "type-number": node_level(job_body="type = 5"),
    "type-variable": node_level(job_body="type = var.t"),
    "type-system-affinity": node_level(
        job_body='type = "system"', group_body='affinity {\n attribute = "${meta.a}"\n value = "x"\n}'
    ),
}
JSON_JOBS: dict[str, str] = {
    "json-nan": '{"Job": {"TaskGroups": [{"Tasks": [{"Resources": {"Devices": [{"Name": "gpu", "Count": NaN}]}}]}]}}',
    "json-deep": "{" + '"a":[' * 50000 + "]" * 50000 + "}",
    "json-surrogate": json.dumps(
        {
            "Job": {
                "TaskGroups": [
                    {
                        "Tasks": [
                            {
                                "Resources": {
                                    "Devices": [
                                        {
                                            "Name": "gpu\udcff",
                                            "Constraints": [
                                                {"LTarget": "${device.model}", "Operand": "regexp", "RTarget": "\udcff"}
                                            ],
                                        }
                                    ]
                                }
                            }
                        ]
                    }
                ]
            }
        }
    ),
    "json-types": json.dumps(
        {
            "Job": {
                "TaskGroups": [
                    {
                        "Tasks": [
                            {
                                "Resources": {
                                    "Devices": [
                                        {
                                            "Name": 5,
                                            "Count": "2",
                                            "Constraints": [{"LTarget": 1, "Operand": None, "RTarget": [1]}],
                                            "Affinities": [
                                                {
                                                    "LTarget": "${device.model}",
                                                    "Operand": "=",
                                                    "RTarget": "x",
                                                    "Weight": 1000,
                                                }
                                            ],
                                        }
                                    ]
                                }
                            }
                        ]
                    }
                ]
            }
        }
    ),
    "json-list-root": "[1, 2, 3]",
    "json-wrong-shapes": '{"Job": {"TaskGroups": [1, {"Tasks": "x"}, {"Tasks": [{"Resources": []}]}]}}',
    "json-empty-operand": json.dumps(
        {
            "Job": {
                "TaskGroups": [
                    {
                        "Tasks": [
                            {
                                "Resources": {
                                    "Devices": [
                                        {"Name": "gpu", "Constraints": [{"LTarget": "${device.model}", "RTarget": "x"}]}
                                    ]
                                }
                            }
                        ]
                    }
                ]
            }
        }
    ),
}
JSON_JOBS.update(
    {
        "json-node-types": json.dumps(
            {
                "Job": {
                    "Type": 5,
                    "Constraints": [{"LTarget": 1, "Operand": None, "RTarget": [1]}, "x"],
                    "Affinities": "x",
                    "Spreads": [{"Attribute": None, "Weight": "x", "SpreadTarget": [{"Value": 1, "Percent": "50"}]}, 7],
                    "TaskGroups": [
                        {
                            "Name": None,
                            "Constraints": {"a": 1},
                            "Affinities": [{"LTarget": "${meta.a}", "Operand": "=", "RTarget": "x", "Weight": 1e30}],
                            "Spreads": [{"Attribute": "${meta.a}", "SpreadTarget": "x"}],
                            "Tasks": [{"Name": 5, "Constraints": [{"Operand": "distinct_hosts"}], "Affinities": None}],
                        }
                    ],
                }
            }
        ),
        "json-node-percent": json.dumps(
            {
                "Job": {
                    "TaskGroups": [
                        {
                            "Name": "g",
                            "Spreads": [
                                {
                                    "Attribute": "${meta.a}",
                                    "SpreadTarget": [{"Value": "x", "Percent": -5}, {"Percent": 300}],
                                }
                            ],
                            "Constraints": [{"LTarget": "${meta.a}", "Operand": ">", "RTarget": "1e999"}],
                        }
                    ]
                }
            }
        ),
    }
)
NODE_LEVEL_JOB = node_level(
    job_body=rule("${attr.kernel.name}", "=", "linux"),
    group_body=rule("${meta.lingjun.point_of_delivery}", "=", "pod-a01-p1") + "\n" + rule("${node.class}", "!=", "x"),
)
NODE_FILES: dict[str, str] = {
    "not-json": "{{",
    "list": "[1, 2]",
    "empty-list": "[]",
    "attributes-numbers": '{"ID": "x", "Attributes": {"kernel.name": 1}, "Meta": {}}',
    "meta-list": '{"ID": "x", "Attributes": {}, "Meta": ["a"]}',
    "meta-null": '{"ID": "x", "Attributes": {}, "Meta": null}',
    "id-number": '{"ID": 5, "Attributes": {}, "Meta": {}}',
    "fields-wrong-types": '{"ID": "x", "Datacenter": [1], "NodeClass": null, "Attributes": {}, "Meta": {}}',
    "nan": '{"ID": "x", "Attributes": {"a": NaN}, "Meta": {}}',
    "surrogate": '{"ID": "\\udcff", "Attributes": {"kernel.name": "\\udcff"}, "Meta": {"\\udcff": "x"}}',
    "deep": "[" * 50000 + "]" * 50000,
}
NODE_VALUES = ["=", "meta.=x", "attr.", "node.region=x", "${meta.rack}=r1", "meta.rack=\u2603\u0000", "x" * 5000]
PLUGIN_KEYS: dict[str, str] = {
    "keys-list": '{"groups": [], "plugin_keys": {"keys": [], "prefix": "lingjun.", "node_meta": true}}',
    "keys-numbers": '{"groups": [], "plugin_keys": {"keys": {"lingjun.a": 1}, "prefix": "lingjun.", "node_meta": true}}',
    "prefix-number": '{"groups": [], "plugin_keys": {"keys": {}, "prefix": 5, "node_meta": true}}',
    "node-meta-text": '{"groups": [], "plugin_keys": {"keys": {}, "prefix": "lingjun.", "node_meta": "yes"}}',
    "not-object": '{"groups": [], "plugin_keys": "x"}',
    "error-object": '{"groups": [], "plugin_keys": null, "plugin_keys_error": {"a": 1}}',
    "problems-text": '{"groups": [], "plugin_keys": {"keys": {}, "prefix": "", "node_meta": true, "problems": "x"}}',
}
BINARY_JOBS: dict[str, bytes] = {"latin-1": b'job "\xe9" {}\n', "garbage": bytes(range(256)) * 4}
FINGERPRINTS: dict[str, str] = {
    "not-json": "{{",
    "list-of-strings": '["a", "b"]',
    "missing-keys": '{"groups": [{"vendor": "nvidia"}]}',
    "attr-list": '{"groups": [{"vendor": "nvidia", "type": "gpu", "name": "x", "attributes": {"memory": {"value": [1]}}}]}',
    "nan-attr": '{"groups": [{"vendor": "nvidia", "type": "gpu", "name": "x", "devices": [{"id": "a"}],'
    ' "attributes": {"minor": {"value": NaN}}}]}',
    "surrogate": '{"groups": [{"vendor": "nvidia", "type": "gpu", "name": "\\udcff", "devices": [{"id": "\\udcff"}]}]}',
    "deep": "[" * 50000 + "]" * 50000,
}

DRIVER = """
import sys, traceback
from nomad_plugin.cli.main import main
for line in sys.stdin.read().splitlines():
    args = line.split("\\t")
    print("=== " + args[0], flush=True)
    print("=== " + args[0], file=sys.stderr, flush=True)
    try:
        code = main(["check-job", *args])
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = "crashed"
    print(f"=== exit {code}", flush=True)
    sys.stdout.flush(); sys.stderr.flush()
"""


@pytest.fixture(scope="module")
def saved_fingerprint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fp") / "fp.json"
    result = subprocess.run(
        [sys.executable, "-m", "nomad_plugin", "fingerprint", "--profile", "h800-8", "--json"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    path.write_text(result.stdout)
    return path


def inputs(tmp: Path, fingerprint: Path) -> list[list[str]]:
    argvs: list[list[str]] = []
    for name, text in {**HCL_JOBS, **JSON_JOBS}.items():
        path = tmp / (name + (".json" if name.startswith("json") else ".hcl"))
        path.write_text(text, errors="surrogatepass")
        argvs += [
            [str(path), "--fingerprint", str(fingerprint)],
            [str(path), "--fingerprint", str(fingerprint), "--json"],
        ]
    for name, data in BINARY_JOBS.items():
        path = tmp / f"{name}.hcl"
        path.write_bytes(data)
        argvs.append([str(path), "--fingerprint", str(fingerprint)])
    good_job = tmp / "good.hcl"
    good_job.write_text(device("count = 1"))
    for name, text in FINGERPRINTS.items():
        path = tmp / f"fp-{name}.json"
        path.write_text(text, errors="surrogatepass")
        argvs += [[str(good_job), "--fingerprint", str(path)], [str(good_job), "--fingerprint", str(path), "--json"]]
    node_job = tmp / "node-level.hcl"
    node_job.write_text(NODE_LEVEL_JOB)
    for name, text in NODE_FILES.items():
        path = tmp / f"node-{name}.json"
        path.write_text(text, errors="surrogatepass")
        argvs += [
            [str(node_job), "--fingerprint", str(fingerprint), "--node", str(path)],
            [str(node_job), "--fingerprint", str(fingerprint), "--node", str(path), "--json"],
        ]
    for value in NODE_VALUES:
        argvs.append([str(node_job), "--fingerprint", str(fingerprint), "--node-value", value])
    for name, text in PLUGIN_KEYS.items():
        path = tmp / f"keys-{name}.json"
        path.write_text(text)
        argvs += [[str(node_job), "--fingerprint", str(path)], [str(node_job), "--fingerprint", str(path), "--json"]]
    argvs.append([str(node_job), "--fingerprint", str(fingerprint), "--node", str(tmp / "missing-node.json")])
    argvs.append(
        [str(node_job), "--fingerprint", str(fingerprint), "--agent", "--set", 'nomad_address="http://127.0.0.1:9"']
    )
    argvs.append([str(node_job), "--fingerprint", str(fingerprint), "--agent", "--set", "nomad_address=5"])
    argvs.append([str(tmp / "missing.hcl"), "--fingerprint", str(fingerprint)])
    argvs.append([str(good_job), "--fingerprint", str(tmp / "missing.json")])
    argvs.append([str(good_job), "--bogus-flag"])
    return argvs


def _clean(text: str) -> list[str]:
    return [word for word in FORBIDDEN if word in text]


def test_hostile_inputs_print_no_traceback_and_no_warning(tmp_path: Path, saved_fingerprint: Path) -> None:
    argvs = inputs(tmp_path, saved_fingerprint)
    result = subprocess.run(
        [sys.executable, "-W", "always", "-c", DRIVER],
        input="\n".join("\t".join(a) for a in argvs), capture_output=True, text=True, timeout=600, cwd=REPO,
        errors="backslashreplace",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    codes = [line.split()[-1] for line in result.stdout.splitlines() if line.startswith("=== exit")]
    assert len(codes) == len(argvs), result.stdout[-2000:]
    assert set(codes) <= {"0", "1", "2"}, [c for c in codes if c not in ("0", "1", "2")]
    for stream in (result.stdout, result.stderr):
        found = _clean(stream)
        if found:
            index = stream.index(found[0])
            pytest.fail(f"{found}: ...{stream[max(0, index - 1500) : index + 500]}")


@pytest.mark.parametrize("name", ["nan", "lookahead", "json-deep", "fp-not-json"])
def test_the_installed_command_too(name: str, tmp_path: Path, saved_fingerprint: Path) -> None:
    fingerprint, job = saved_fingerprint, tmp_path / "job.hcl"
    if name.startswith("fp-"):
        fingerprint = tmp_path / "fp.json"
        fingerprint.write_text(FINGERPRINTS[name[3:]])
        job.write_text(device("count = 1"))
    elif name.startswith("json"):
        job = tmp_path / "job.json"
        job.write_text(JSON_JOBS[name])
    else:
        job.write_text(HCL_JOBS[name])
    result = subprocess.run(
        [sys.executable, "-W", "always", "-m", "nomad_plugin", "check-job", str(job), "--fingerprint", str(fingerprint)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode in (1, 2), (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert not _clean(result.stdout + result.stderr), result.stdout + result.stderr
