"""check-job reads HCL2 as Nomad's jobspec2 does, through the real command on an H800 profile.

``dynamic`` blocks are expanded (a Tesla T4 request is not placed on H800s), variables, locals,
operators, templates and functions are evaluated (``-var``, ``-var-file``, ``NOMAD_VAR_*`` as
``nomad job run`` takes them), Nomad's runtime references stay ``${...}`` for the scheduler, syntax
Nomad refuses is refused with HCL's message and position, and anything check-job does not evaluate
makes it say it cannot tell (exit 2), never a verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.hostlib import real_plugin

H800 = ["--profile", "h800-8", "--no-agent", "--node-value", "node.pool=default"]  # scope.py: the pool decides


def check(tmp_path: Path, text: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    job = tmp_path / "job.nomad.hcl"
    job.write_text(text)
    proc = subprocess.run(
        [str(real_plugin()), "check-job", str(job), *H800, *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "default", **(env or {})},
        cwd=tmp_path,
    )
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout + proc.stderr


def check_json(tmp_path: Path, text: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any]:
    code, out = check(tmp_path, text, "--json", *args, env=env)
    return code, json.loads(out)


def rules(request: dict[str, Any], kind: str = "constraints") -> list[tuple[str, str]]:
    """A device block's constraints (or affinities) as decided against the node's first device group."""
    return [(rule["attribute"], rule["value"]) for rule in request["groups"][0][kind]]


def job(resources: str, top: str = "") -> str:
    return f"""{top}
job "j" {{
  group "g" {{
    task "t" {{
      driver = "docker"
      resources {{
{resources}
      }}
    }}
  }}
}}
"""


DYNAMIC_T4 = """
        dynamic "device" {
          for_each = ["nvidia/gpu/Tesla T4"]
          labels   = [device.value]
          content { count = 1 }
        }
"""


def test_dynamic_device_block_is_expanded_and_not_placed_on_h800(tmp_path: Path) -> None:
    code, out = check(tmp_path, job(DYNAMIC_T4))
    assert code == 1, out
    assert "1 device block(s)" in out and 'device "nvidia/gpu/Tesla T4"' in out
    assert "Nomad would not place it on this node" in out


def test_dynamic_task_and_dynamic_constraint_in_a_device_are_expanded(tmp_path: Path) -> None:
    text = """
job "j" {
  group "g" {
    dynamic "task" {
      for_each = { a = 1, b = 2 }
      labels   = ["t-${task.key}"]
      content {
        driver = "docker"
        resources {
          device "nvidia/gpu" {
            count = task.value
            dynamic "constraint" {
              for_each = ["70 GiB", "80 GiB"]
              iterator = floor
              content {
                attribute = "${device.attr.memory}"
                operator  = ">="
                value     = floor.value
              }
            }
          }
        }
      }
    }
  }
}
"""
    code, doc = check_json(tmp_path, text)
    requests = doc["requests"]
    assert [(r["task"], r["count"]) for r in requests] == [("t-a", 1), ("t-b", 2)], requests
    memory = "${device.attr.memory}"
    assert rules(requests[0]) == [(memory, "70 GiB"), (memory, "80 GiB")]
    assert code == 1 and doc["outcome"] != "place"  # 80 GiB > the H800's 79.6 GiB


VARIABLES = """
variable "gpus" {
  type    = number
  default = 2
}
variable "mem" {
  default = "79 GiB"
}
locals {
  min_mem = "70 GiB"
}
"""

EXPRESSIONS = """
        device "nvidia/gpu" {
          count = var.gpus + 1 - 1
          constraint {
            attribute = device.attr.memory
            operator  = ">="
            value     = local.min_mem
          }
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "${var.mem}"
          }
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "${format("%d GiB", 79)}"
          }
          affinity {
            attribute = "${device.model}"
            value     = upper(join(" ", ["nvidia", "h800"]))
            weight    = var.gpus > 1 ? 50 : 10
          }
        }
"""


def test_variables_locals_operators_templates_and_functions_are_evaluated(tmp_path: Path) -> None:
    code, doc = check_json(tmp_path, job(EXPRESSIONS, VARIABLES))
    assert code == 0 and doc["outcome"] == "place", doc["verdict"]
    (request,) = doc["requests"]
    assert request["count"] == 2
    memory = "${device.attr.memory}"
    assert rules(request) == [(memory, "70 GiB"), (memory, "79 GiB"), (memory, "79 GiB")]
    (affinity,) = request["groups"][0]["affinities"]
    assert (affinity["value"], affinity["weight"], affinity["passed"]) == ("NVIDIA H800", 50, True)


def test_var_var_file_and_nomad_var_environment(tmp_path: Path) -> None:
    text = job('        device "nvidia/gpu" { count = var.gpus }', 'variable "gpus" {\n  type = number\n}')
    code, out = check(tmp_path, text)
    assert code == 2 and 'Unset variable "gpus"' in out, out
    code, doc = check_json(tmp_path, text, env={"NOMAD_VAR_gpus": "3"})
    assert code == 0 and doc["requests"][0]["count"] == 3
    (tmp_path / "vars.hcl").write_text("gpus = 4\n")
    code, doc = check_json(tmp_path, text, "-var-file", "vars.hcl", env={"NOMAD_VAR_gpus": "3"})
    assert code == 0 and doc["requests"][0]["count"] == 4  # a file wins over the environment
    code, doc = check_json(tmp_path, text, "-var-file=vars.hcl", "-var", "gpus=5")
    assert code == 0 and doc["requests"][0]["count"] == 5  # -var wins over a file
    code, out = check(tmp_path, text, "-var=gpus=many")
    assert code == 2 and "not compatible with the variable's type constraint: a number is required" in out


def test_interpolated_values_are_placed_like_nomad(tmp_path: Path) -> None:
    for value in ('"${var.mem}"', '"${format("%d GiB", 79)}"'):
        resources = f"""
        device "nvidia/gpu" {{
          constraint {{
            attribute = "${{device.attr.memory}}"
            operator  = ">="
            value     = {value}
          }}
        }}
"""
        code, out = check(tmp_path, job(resources, 'variable "mem" {\n  default = "79 GiB"\n}'))
        assert code == 0 and "Nomad would place this" in out, out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'job "vllm-${JOB_UUID}" {\n}\n',
            'job.nomad.hcl:1,11-13: Invalid string literal; Template sequences are not allowed in this string. To include a literal "$", double it (as "$$") to escape it.',
        ),
        (
            job('        device "nvidia/gpu/${var.model}" {\n        }'),
            "job.nomad.hcl:7,28-30: Invalid string literal;",
        ),
        (
            job('        device "nvidia/gpu" {\n          constraint { attribute = "${device.model}" value = "x" }\n        }'),
            "job.nomad.hcl:8,54-59: Invalid single-argument block definition; A single-line block definition must end with a closing brace immediately after its single argument definition.",
        ),
        (job('        device "nvidia/gpu" { count = nope(1) }'), 'Call to unknown function; There is no function named "nope".'),
        (job('        device "nvidia/gpu" { count = var.missing }'), 'Unsupported attribute; This object does not have an attribute named "missing".'),
    ],
)  # fmt: skip
def test_syntax_and_evaluation_errors_are_nomads(tmp_path: Path, text: str, message: str) -> None:
    code, out = check(tmp_path, text)
    assert code == 2, out
    assert message in out, out


def test_what_is_not_evaluated_is_cannot_tell_and_named(tmp_path: Path) -> None:
    resources = """
        device "nvidia/gpu" {
          count = length(uuidv4())
        }
"""
    code, out = check(tmp_path, job(resources))
    assert code == 2, out
    assert "check-job does not implement function uuidv4" in out
    assert "would place" not in out and "would not place" not in out


def test_runtime_references_keep_their_text(tmp_path: Path) -> None:
    resources = """
        device "nvidia/gpu" {
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "${   meta.min_mem  }"
          }
        }
"""
    code, doc = check_json(tmp_path, job(resources))
    assert rules(doc["requests"][0]) == [("${device.attr.memory}", "${   meta.min_mem  }")]
    assert code == 1  # the value is not a size: Nomad's device check fails on this node
