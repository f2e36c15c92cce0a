"""check-job's overall verdict, whole-job validation and who reads the job, through the real command.

- The job's outcome follows its scheduler: a system or sysbatch job runs each group on every node where
  the group's rules hold (``SystemScheduler.computePlacements`` skips a filtered node without a failure),
  a service or batch job places each group on some feasible node (``GenericScheduler``), so on this node
  it is placed whole, in part, or not at all.
- A rule that was evaluated and fails decides "would not place it" beside a value check-job does not
  evaluate (``count = var.gpus``, until the HCL2 evaluator reads it).
- Whole-job validation is ``Job.Validate`` and its callees (nomad/structs/structs.go) after the API's
  canonicalisation, with the job endpoint's priority range (nomad/job_endpoint_hooks.go), in Nomad's words.
- Nomad reads the job when it can: the agent's ``POST /v1/jobs/parse`` (the API double serves it as
  command/agent/job_endpoint.go does) or ``nomad job run -output`` (a stand-in executable printing what
  command/job_run.go prints: ``{"Job": ...}`` indented by four spaces, as in Nomad's
  command/testdata/example-short.json).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nomad_plugin.cli import check_job
from tests.doubles.nomad_api import NomadApiDouble

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "examples" / "jobs"
POOL = ["--node-value", "node.pool=default"]  # the node pool decides where a job may run (jobspec/scope.py)


@pytest.fixture(scope="module")
def fp(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The h800-8 profile's live fingerprint, saved by `fingerprint --json` (check-job reads it back)."""
    path = tmp_path_factory.mktemp("fp") / "fp.json"
    result = subprocess.run(
        [sys.executable, "-m", "nomad_plugin", "fingerprint", "--profile", "h800-8", "--json"],
        capture_output=True, text=True, timeout=90, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    path.write_text(result.stdout)
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    """The command twice: its JSON document and its text (the same verdict both ways)."""
    code = check_job.main([*argv, *POOL, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert check_job.main([*argv, *POOL]) == code
    out = capsys.readouterr().out
    return code, doc, out


def job_file(tmp_path: Path, body: str, name: str = "job.hcl") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


TASK = 'task "t" {\n  driver = "raw_exec"\n  config { command = "true" }\n}'


def group(name: str, rack: str, task: str = TASK) -> str:
    return f'group "{name}" {{\n constraint {{\n  attribute = "${{meta.rack}}"\n  value = "{rack}"\n }}\n{task}\n}}\n'


# --- the overall verdict --------------------------------------------------------------------------


def test_a_sysbatch_job_is_placed_where_one_of_its_groups_is(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(JOBS / "runtime-kit-controller.sysbatch.hcl")
    code, doc, out = run(capsys, job, "--profile", "h800-8", "--node-value", "meta.lj_runtimekit_enable=true")
    assert code == 0 and doc["outcome"] == "place" and doc["ok"]
    assert [(g["group"], g["outcome"]) for g in doc["groups"]] == [("enable", "place"), ("disable", "not_placed")]
    last = out.rstrip().splitlines()[-1]
    assert last.startswith('Nomad would place this: group "enable" on this node, not group "disable" (constraint')
    assert "a sysbatch job runs each group on every node where its rules hold" in last
    assert re.search(r'placed +group "enable"', out) and re.search(r'NOT HERE group "disable": constraint', out)


@pytest.mark.parametrize("kind", ["system", "sysbatch"])
def test_a_system_job_none_of_whose_groups_hold_is_not_placed(
    kind: str, tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_file(tmp_path, f'job "j" {{\n type = "{kind}"\n{group("a", "r1")}{group("b", "r2")}}}\n')
    code, doc, out = run(capsys, job, "--fingerprint", fp, "--node-value", "meta.rack=r9")
    assert code == 1 and doc["outcome"] == "not_placed"
    assert out.rstrip().endswith("= 'r2'") and 'group "a" constraint ${meta.rack}' in out.splitlines()[-1]


@pytest.mark.parametrize("kind", ["service", "batch"])
def test_a_service_or_batch_job_with_one_group_here_is_placed_only_in_part(
    kind: str, tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_file(tmp_path, f'job "j" {{\n type = "{kind}"\n{group("a", "r1")}{group("b", "r2")}}}\n')
    code, doc, out = run(capsys, job, "--fingerprint", fp, "--node-value", "meta.rack=r1")
    assert code == 1 and doc["outcome"] == "partial" and not doc["ok"]
    last = out.rstrip().splitlines()[-1]
    assert last.startswith('Nomad would place only part of it on this node: group "a" here, not group "b" (')
    assert f"Nomad places a {kind} job's groups independently" in last
    code, doc, _ = run(capsys, job, "--fingerprint", fp, "--node-value", "meta.rack=r1", "--node-value", "meta.rack=r2")
    assert code == 1 and doc["outcome"] == "partial"  # the last --node-value wins: "b" here, "a" not


def test_a_failing_rule_decides_beside_a_count_not_evaluated(
    tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    body = """
    variable "gpus" {
      type    = number
      default = 2
    }
    job "j" {
      constraint {
        attribute = "${meta.rack}"
        value     = "r9"
      }
      group "g" {
        task "t" {
          driver = "raw_exec"
          resources {
            device "nvidia/gpu" {
              count = try(var.gpus, 1)  # a function check-job does not implement: not evaluated
            }
          }
        }
      }
    }
    """
    job = job_file(tmp_path, body)
    code, doc, out = run(capsys, job, "--fingerprint", fp, "--node-value", "meta.rack=r1")
    assert code == 1 and doc["outcome"] == "not_placed", doc["verdict"]
    assert "CANNOT EVALUATE count = ${try(var.gpus, 1)}" in out
    assert out.rstrip().splitlines()[-1].startswith('Nomad would not place it on this node: group "g" constraint')
    code, doc, out = run(capsys, job, "--fingerprint", fp, "--node-value", "meta.rack=r9")
    assert code == 2 and doc["outcome"] == "unknown"  # nothing fails: the count decides, and it is not known
    assert "count = ${try(var.gpus, 1)}" in out.splitlines()[-1]


# --- whole-job validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ('job "j" {\n group "g" {\n  task "t" {\n   config { command = "true" }\n  }\n }\n}', 'group "g" task "t": Missing task driver'),
        (f'job "j" {{\n type = "batch"\n update {{ max_parallel = 2 }}\n group "g" {{\n{TASK}\n }}\n}}', 'group "g": Job type "batch" does not allow update block'),
        (f'job "j" {{\n type = "sysbatch"\n group "g" {{\n update {{ canary = 1 }}\n{TASK}\n }}\n}}', 'Job type "sysbatch" does not allow update block'),
        (f'job "j" {{\n priority = "${{PRIORITY}}"\n group "g" {{\n{TASK}\n }}\n}}', "priority = '${PRIORITY}': Unsuitable value type; a number is required"),
        (f'job "j" {{\n priority = 101\n group "g" {{\n{TASK}\n }}\n}}', "job: job priority must be between [1, 100]"),
        ('job "j" {\n group "g" {\n  task "t" {\n   driver = "raw_exec"\n   config { command = file("missing.txt") }\n  }\n }\n}', 'Call to function "file" failed: no file exists at '),
        (f'job "j" {{\n type = "web"\n group "g" {{\n{TASK}\n }}\n}}', 'job: Invalid job type: "web"'),
        (f'job "j" {{\n type = "system"\n group "g" {{\n count = 2\n{TASK}\n }}\n}}', "Job task group g has count 2. Count cannot exceed 1 with system scheduler"),
        (f'job "j" {{\n group "g" {{\n count = -1\n{TASK}\n }}\n}}', "Task group count can't be negative"),
        (f'job "j" {{\n group "g" {{\n{TASK}\n }}\n group "g" {{\n{TASK}\n }}\n}}', "job: Job task group 2 redefines 'g' from group 1"),
        (f'job "j" {{\n group "g" {{\n{TASK}\n{TASK}\n }}\n}}', "Task 2 redefines 't' from task 1"),
        (f'job "j" {{\n group "g" {{\n restart {{ mode = "never" }}\n{TASK}\n }}\n}}', 'Unsupported restart mode: "never"'),
        (f'job "j" {{\n type = "system"\n group "g" {{\n reschedule {{ attempts = 1 }}\n{TASK}\n }}\n}}', "System or sysbatch jobs should not have a reschedule policy"),
        (f'job "j" {{\n group "g" {{\n reschedule {{ delay_function = "linear" }}\n{TASK}\n }}\n}}', 'Invalid delay function "linear", must be one of ["constant" "exponential" "fibonacci"]'),
        (f'job "j" {{\n type = "batch"\n reschedule {{ unlimited = true }}\n group "g" {{\n{TASK}\n }}\n}}', "If Attempts >0, Unlimited cannot also be set to true"),
        (f'job "j" {{\n periodic {{ crons = ["* * * * *"] }}\n group "g" {{\n{TASK}\n }}\n}}', 'Periodic can only be used with "batch" or "sysbatch" scheduler'),
        (f'job "j" {{\n datacenters = [""]\n group "g" {{\n{TASK}\n }}\n}}', "Job datacenter must be non-empty string"),
        ('job "j" {\n group "g" {\n network {\n  port "http" { static = 8080 }\n  port "http" { to = 70000 }\n }\n' + TASK + "\n }\n}", "Task group network validation failed: Port label http already in use by taskgroup network"),
        ('job "j" {\n group "g" {\n  task "t" {\n   driver = "raw_exec"\n   resources {\n    cpu = 100\n    cores = 2\n   }\n  }\n }\n}', "Task can only ask for 'cpu' or 'cores' resource, not both."),
        ('job "j" {\n group "g" {\n  task "alloc" {\n   driver = "raw_exec"\n   resources { memory = 5 }\n  }\n }\n}', "minimum MemoryMB value is 10; got 5"),
        ('job "j" {\n group "g" {\n  task "t" {\n   driver = "docker"\n   lifecycle { hook = "prestart" }\n  }\n }\n}', "Task group g must have at least one main task"),
    ],
)  # fmt: skip
def test_nomad_refuses_at_submission_in_its_own_words(
    body: str, words: str, tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_file(tmp_path, body)
    code, doc, out = run(capsys, job, "--fingerprint", fp, "--no-agent")
    assert code == 2 and doc["outcome"] == "refuse", doc["verdict"]
    assert any(words in p for p in doc["node_rules"]["problems"]), doc["node_rules"]["problems"]
    assert f"INVALID {next(p for p in doc['node_rules']['problems'] if words in p)}" in out
    assert out.rstrip().endswith("Nomad would refuse this job at submission")


def test_a_valid_job_passes_validation_and_a_value_not_evaluated_is_named(
    tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    body = f"""
    job "j" {{
      type     = "batch"
      priority = 100
      update {{
        max_parallel = 0
      }}
      group "g" {{
        count = 3
        network {{
          port "http" {{ static = 8080 }}
          port "grpc" {{ to = 9090 }}
        }}
        restart {{
          mode     = "delay"
          attempts = 1
        }}
    {TASK}
      }}
    }}
    """
    code, doc, _ = run(capsys, job_file(tmp_path, body), "--fingerprint", fp)
    assert code == 0 and doc["outcome"] == "place", doc["node_rules"]["problems"]  # an empty update is not inherited
    args = 'job "j" {\n group "g" {\n  task "t" {\n   driver = "raw_exec"\n   config { args = [uuidv4()] }\n  }\n }\n}'
    code, doc, out = run(capsys, job_file(tmp_path, args, "fn.hcl"), "--fingerprint", fp)
    assert code == 2 and doc["outcome"] == "unknown"
    assert "check-job does not implement function uuidv4" in out


def test_first_available_is_an_unsupported_block_not_yet_in_nomad(
    tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    body = """
    job "j" {
      group "g" {
        task "t" {
          driver = "raw_exec"
          resources {
            device "nvidia/gpu" {
              first_available {
                count = 2
              }
              constrant {
                attribute = "${device.model}"
              }
            }
          }
        }
      }
    }
    """
    code, doc, out = run(capsys, job_file(tmp_path, body), "--fingerprint", fp)
    assert code == 2 and doc["outcome"] == "refuse"
    (req,) = doc["requests"]
    assert req["problems"][0] == (
        'device "nvidia/gpu": Unsupported block type; Blocks of type "first_available" are not expected here. '
        "(first_available, a device block's ordered list of alternative requests, is proposed Nomad work, "
        "not yet in Nomad)"
    )
    assert req["problems"][1].endswith('Blocks of type "constrant" are not expected here. Did you mean "constraint"?')
    assert "Unsupported argument" not in out


# --- who reads the job --------------------------------------------------------------------------

NOMAD_JOB = """
variable "gpus" {
  type = number
}
job "j" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      resources {
        device "nvidia/gpu" {
          count = var.gpus
        }
      }
    }
  }
}
"""


def api_job(gpus: int) -> dict[str, Any]:
    """The API form jobspec2 makes of NOMAD_JOB (the fields of command/testdata/example-short.json)."""
    task = {
        "Name": "t", "Driver": "raw_exec", "User": "", "Lifecycle": None, "Config": None, "Constraints": None,
        "Affinities": None, "Env": None, "Services": None,
        "Resources": {
            "CPU": None, "Cores": None, "MemoryMB": None, "MemoryMaxMB": None, "DiskMB": None, "Networks": None,
            "Devices": [{"Name": "nvidia/gpu", "Count": gpus, "Constraints": None, "Affinities": None}], "IOPS": None,
        },
        "RestartPolicy": None, "Meta": None, "KillTimeout": None, "Leader": False, "ShutdownDelay": 0,
    }  # fmt: skip
    return {
        "Region": None, "Namespace": None, "ID": "j", "Name": "j", "Type": None, "Priority": None,
        "Datacenters": None, "Constraints": None, "Affinities": None,
        "TaskGroups": [{"Name": "g", "Count": None, "Constraints": None, "Affinities": None, "Tasks": [task],
                        "Spreads": None, "RestartPolicy": None, "ReschedulePolicy": None, "Update": None,
                        "Migrate": None, "Networks": None}],
        "Update": None, "Spreads": None, "Periodic": None, "ParameterizedJob": None,
    }  # fmt: skip


def jobspec2_stand_in(hcl: str, variables: str) -> dict[str, Any]:
    """What Nomad's jobspec2 makes of NOMAD_JOB with ``gpus`` set; its words for a required variable unset."""
    assert hcl == NOMAD_JOB
    found = re.search(r'^gpus = "(\d+)"$', variables, re.MULTILINE)
    if not found:
        raise ValueError('input.hcl:2,1-16: Unset variable "gpus"; A used variable must be set or have a default')
    return api_job(int(found.group(1)))


@pytest.fixture
def agent() -> Iterator[NomadApiDouble]:
    double = NomadApiDouble().start()
    double.job_parser = jobspec2_stand_in
    yield double
    double.stop()


def test_the_agent_reads_the_job_with_its_variables(
    agent: NomadApiDouble, tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = job_file(tmp_path, NOMAD_JOB)
    at = f'nomad_address="{agent.address}"'
    code, doc, out = run(capsys, job, "--fingerprint", fp, "--agent", "--set", at, "--var", "gpus=9")
    assert code == 1 and doc["reader"]["name"] == "nomad-agent"  # 9 cards: more than this node has
    assert doc["requests"][0]["count"] == 9 and not doc["requests"][0]["unsupported"]
    assert f"job read by the Nomad agent at {agent.address} (POST /v1/jobs/parse)" in out
    code, doc, _ = run(capsys, job, "--fingerprint", fp, "--agent", "--set", at, "--var", "gpus=2")
    assert code == 0 and doc["requests"][0]["picked_ids"] and doc["verdict"] == "Nomad would place this"
    assert agent.parse_requests[-1] == {"JobHCL": NOMAD_JOB, "Variables": 'gpus = "2"\n', "Canonicalize": True}
    var_file = tmp_path / "vars.hcl"
    var_file.write_text('gpus = "4"\n')
    code, doc, _ = run(capsys, job, "--fingerprint", fp, "--agent", "--set", at, "--var-file", str(var_file))
    assert code == 0 and len(doc["requests"][0]["picked_ids"]) == 4
    assert agent.parse_requests[-1]["Variables"].startswith('gpus = "4"\n')
    code, doc, out = run(capsys, job, "--fingerprint", fp, "--agent", "--set", at)
    assert code == 2 and doc["outcome"] == "refuse" and doc["reader"]["name"] == "nomad-agent"
    assert 'INVALID Failed to parse job: input.hcl:2,1-16: Unset variable "gpus"' in out


def test_without_parse_job_the_agent_is_skipped_and_says_why(
    agent: NomadApiDouble, tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    agent.enable_acls()
    agent.add_policy("nodes", 'node { policy = "read" }\nagent { policy = "read" }')
    agent.add_policy("jobs", 'namespace "default" { policy = "read" }')
    token = "5f0c3a4e-0000-4000-8000-00000000000a"
    agent.add_token(token, ["nodes"])
    job = job_file(tmp_path, NOMAD_JOB)
    args = [
        "--fingerprint",
        fp,
        "--agent",
        "--set",
        f'nomad_address="{agent.address}"',
        "--set",
        f'nomad_token="{token}"',
    ]
    code, doc, out = run(capsys, job, *args)
    assert doc["reader"]["name"] == "built-in" and code == 2 and doc["outcome"] == "refuse"
    assert any('Unset variable "gpus"' in p for p in doc["node_rules"]["problems"]), doc["node_rules"]["problems"]
    (why,) = doc["reader"]["skipped"]
    assert "403" in why and "parse-job or submit-job on the namespace" in why
    assert "(not by Nomad: the Nomad agent at" in out
    reader = "5f0c3a4e-0000-4000-8000-00000000000b"
    agent.add_token(reader, ["nodes", "jobs"])  # the read policy includes parse-job
    args[-1] = f'nomad_token="{reader}"'
    code, doc, _ = run(capsys, job, *args, "--var", "gpus=1")
    assert code == 0 and doc["reader"]["name"] == "nomad-agent"


STAND_IN = """\
#!{python}
# A stand-in for `nomad job run -output` (command/job_run.go): the API form of the job as
# {{"Job": ...}}, indented by four spaces; a file it cannot read: "Error getting job struct: ..." and 1.
import json, re, sys
from pathlib import Path

args = sys.argv[1:]
Path(__file__).with_suffix(".argv").write_text(json.dumps(args))
if args[:3] != ["job", "run", "-output"]:
    sys.exit("stand-in: unexpected command")
variables = dict(args[i + 1].split("=", 1) for i in range(3, len(args) - 1) if args[i] == "-var")
if "gpus" not in variables:
    sys.stderr.write(
        "Error getting job struct: Error parsing job file from " + args[-1] + ":\\n"
        + 'job.hcl:2,1-16: Unset variable "gpus"; A used variable must be set or have a default value\\n'
    )
    sys.exit(1)
job = json.loads({job!r})
job["TaskGroups"][0]["Tasks"][0]["Resources"]["Devices"][0]["Count"] = int(variables["gpus"])
print(json.dumps({{"Job": job}}, indent=4))
"""


def test_nomad_job_run_output_reads_the_job_with_the_vars_passed_on(
    tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nomad = tmp_path / "nomad"
    nomad.write_text(STAND_IN.format(python=sys.executable, job=json.dumps(api_job(0))))
    nomad.chmod(0o755)
    job = job_file(tmp_path, NOMAD_JOB)
    code, doc, out = run(capsys, job, "--fingerprint", fp, "--nomad", str(nomad), "--var", "gpus=3")
    assert code == 0 and doc["reader"] == {"name": "nomad-cli", "detail": f"`{nomad} job run -output`", "skipped": []}
    assert len(doc["requests"][0]["picked_ids"]) == 3
    assert json.loads(nomad.with_suffix(".argv").read_text()) == ["job", "run", "-output", "-var", "gpus=3", job]
    assert f"job read by `{nomad} job run -output`" in out
    code, doc, out = run(capsys, job, "--fingerprint", fp, "--nomad", str(nomad))
    assert code == 2 and doc["outcome"] == "refuse"
    assert f"INVALID Error getting job struct: Error parsing job file from {job}:" in out
    assert 'INVALID job.hcl:2,1-16: Unset variable "gpus"' in out
    code, doc, _ = run(capsys, job, "--fingerprint", fp, "--nomad", str(tmp_path / "absent"))
    assert doc["reader"]["name"] == "built-in" and "cannot run" in doc["reader"]["skipped"][0] and code == 2


def test_the_dry_run_leaves_no_warning_and_no_traceback() -> None:
    """The real command, launching the plugin on a simulator, with every warning shown (-X dev)."""
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "default", "-m", "nomad_plugin", "check-job",
         str(JOBS / "whole-card.nomad.hcl"), "--profile", "h800-8", "--no-agent", *POOL],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert result.stdout.rstrip().endswith("Nomad would place this")


def test_a_job_calling_file_functions_is_left_by_the_agent_to_the_next_reader(
    agent: NomadApiDouble, tmp_path: Path, fp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The agent parses without file system functions (guardFS in jobspec2/functions.go); `nomad job run` has them."""

    def no_fs(hcl: str, variables: str) -> dict[str, Any]:
        raise ValueError('input.hcl:5,19-24: Error in function call; Call to function "file" failed: '
                         "filesystem function disabled.")  # fmt: skip

    agent.job_parser = no_fs
    (tmp_path / "cmd.txt").write_text("true")
    body = 'job "j" {\n group "g" {\n  task "t" {\n   driver = "raw_exec"\n   config { command = file("cmd.txt") }\n  }\n }\n}'
    job = job_file(tmp_path, body)
    code, doc, _ = run(capsys, job, "--fingerprint", fp, "--agent", "--set", f'nomad_address="{agent.address}"')
    assert doc["reader"]["name"] == "built-in" and "filesystem function disabled" in doc["reader"]["skipped"][0]
    assert code == 0 and doc["outcome"] == "place"  # the file exists: check-job's own reader reads it, as nomad does
