"""No input to ``check-job`` prints a Python traceback or a Python warning.

Hostile job files (Go literals Python reads differently, out-of-range numbers,
patterns RE2 refuses, wrong types for every field, broken encodings, deep
nesting) and hostile saved fingerprints go through the real command: one
interpreter started with ``-W always`` runs the command's entry point once
per input (so every warning prints, every time), and a few inputs also go
through ``python -m nomad_plugin check-job`` itself. Any "Traceback" or
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
