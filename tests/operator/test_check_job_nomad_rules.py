"""check-job agrees with Nomad: key checks, MIG sizes, JSON jobs, errors, edge counts.

Nomad's jobspec2 decoders (hcl_conversions.go) fix the keys a device,
constraint and affinity block may hold; RequestedDevice.Count is unsigned,
so 0 decodes and validates, but the device allocator refuses a request of
zero devices (scheduler/feasible/device.go), so the job is never placed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nomad_plugin.cli import check_job, fingerprint
from nomad_plugin.jobspec import JobParseError, parse_job_text

FP_ARGS = ["--profile", "h800-8"]
POOL = ["--node-value", "node.pool=default"]  # the node pool decides where a job may run (jobspec/scope.py)


def device_job(device_body: str, name: str = "nvidia/gpu") -> str:
    return f"""
job "j" {{
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      config {{ command = "true" }}
      resources {{
        device "{name}" {{
{device_body}
        }}
      }}
    }}
  }}
}}
"""


def check(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, *extra: str) -> tuple[int, dict]:
    job = tmp_path / "job.hcl"
    job.write_text(text)
    code = check_job.main([str(job), *FP_ARGS, *POOL, *extra, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("body", "key", "suggestion"),
    [
        ("cout = 2", "cout", "count"),
        ('constraint {\n atribute = "${device.attr.memory}"\n value = "1 GiB"\n}', "atribute", "attribute"),
        (
            'constraint {\n attribute = "${device.attr.memory}"\n operater = ">="\n value = "1 GiB"\n}',
            "operater",
            "operator",
        ),
        ('affinity {\n attribute = "${device.model}"\n value = "x"\n wieght = 50\n}', "wieght", "weight"),
    ],
)
def test_misspelled_keys_are_rejected_like_nomad(body: str, key: str, suggestion: str) -> None:
    (request,) = parse_job_text(device_job(body))
    (problem,) = request.problems
    assert f'an argument named "{key}" is not expected here. Did you mean "{suggestion}"?' in problem


def test_misspelled_key_fails_the_whole_check_without_claiming_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(device_job("cout = 2"))
    assert check_job.main([str(job), *FP_ARGS]) == 2  # a job-file error
    out = capsys.readouterr().out
    assert "INVALID" in out and "REFUSED" in out and "OK served" not in out
    assert out.rstrip().endswith("Nomad would refuse this job at submission")


def test_constraint_sugar_follows_nomads_decoder() -> None:
    body = (
        'constraint {\n attribute = "${device.model}"\n set_contains = "NVIDIA H800"\n}\n'
        'affinity {\n attribute = "${device.model}"\n set_contains_any = "NVIDIA H800,X"\n weight = 20\n}'
    )
    (request,) = parse_job_text(device_job(body))
    assert not request.problems
    assert request.constraints[0].operator == "set_contains" and request.affinities[0].operator == "set_contains_any"


@pytest.mark.parametrize(("count", "ok"), [(1, True), (3, True), (7, True), (5, False), (6, False)])
def test_mig_count_outside_slice_sizes_is_rejected_as_reserve_would(
    count: int, ok: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = check(tmp_path, capsys, device_job(f"count = {count}", "nvidia/gpu-mig"), "--set", "default_mode=mig")
    assert (code == 0) is ok and doc["ok"] is ok
    said = json.dumps(doc["requests"])
    assert (f"count {count} is no MIG slice size (1, 2, 3, 4, 7)" in said) is not ok


def test_count_zero_is_never_placed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = check(tmp_path, capsys, device_job("count = 0"))
    (req,) = doc["requests"]
    assert code == 1 and not doc["ok"] and req["outcome"] == "not_placed" and req["chosen"] is None
    assert "invalid request of zero devices" in req["why"][0]
    job = tmp_path / "job.hcl"
    assert check_job.main([str(job), *FP_ARGS]) == 1
    out = capsys.readouterr().out
    assert out.rstrip().endswith("Nomad would not place it on this node")


def test_negative_count_is_rejected_and_a_quoted_count_converts() -> None:
    (request,) = parse_job_text(device_job("count = -1"))
    assert any("whole number from 0" in p for p in request.problems)
    (request,) = parse_job_text(device_job("count = 1.5"))
    assert any("must be a whole number" in p for p in request.problems)
    (request,) = parse_job_text(device_job('count = "2"'))
    assert request.count == 2 and not request.problems
    (request,) = parse_job_text(device_job('count = "two"'))
    assert any("a number is required" in p for p in request.problems)


def test_job_without_device_blocks_is_not_a_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.hcl"
    job.write_text('job "j" {\n group "g" {\n  task "t" {\n   driver = "raw_exec"\n  }\n }\n}\n')
    assert check_job.main([str(job), *FP_ARGS, *POOL]) == 0
    out = capsys.readouterr().out
    assert "no device blocks" in out and "cannot be placed" not in out
    assert check_job.main([str(job), *FP_ARGS, *POOL, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["requests"] == []


def nomad_output_json() -> str:
    """What `nomad job run -output` prints for a job with one device block (Nomad's API JSON)."""
    return json.dumps(
        {
            "Job": {
                "ID": "gpu-json",
                "Name": "gpu-json",
                "TaskGroups": [
                    {
                        "Name": "smi",
                        "Count": 1,
                        "Tasks": [
                            {
                                "Name": "smi",
                                "Driver": "docker",
                                "Resources": {
                                    "CPU": 100,
                                    "MemoryMB": 300,
                                    "Devices": [
                                        {
                                            "Name": "nvidia/gpu",
                                            "Count": 2,
                                            "Constraints": [
                                                {
                                                    "LTarget": "${device.attr.memory}",
                                                    "RTarget": "40 GiB",
                                                    "Operand": ">=",
                                                }
                                            ],
                                            "Affinities": [
                                                {
                                                    "LTarget": "${device.model}",
                                                    "RTarget": "NVIDIA H800",
                                                    "Operand": "=",
                                                    "Weight": 50,
                                                }
                                            ],
                                        }
                                    ],
                                },
                            }
                        ],
                    }
                ],
            }
        },
        indent=2,
    )


def test_json_job_in_nomad_output_form_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = check(tmp_path, capsys, nomad_output_json())
    (req,) = doc["requests"]
    assert code == 0 and req["ok"] and req["count"] == 2 and len(req["picked_ids"]) == 2
    assert req["chosen"] == "nvidia/gpu/NVIDIA H800"
    (request,) = parse_job_text(nomad_output_json())
    assert (request.job, request.group, request.task) == ("gpu-json", "smi", "smi")
    rule = request.constraints[0]
    assert (rule.attribute, rule.operator, rule.value) == ("${device.attr.memory}", ">=", "40 GiB")
    assert request.affinities[0].weight == 50


def test_json_job_without_task_groups_is_a_readable_error() -> None:
    with pytest.raises(JobParseError) as err:
        parse_job_text('{"Job": {"ID": "x"}}', "job.json")
    assert "TaskGroups" in str(err.value) and "-output" in str(err.value)
    with pytest.raises(JobParseError) as err:
        parse_job_text('{"Job": ', "job.json")
    assert str(err.value).startswith("job.json:1:")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        # HashiCorp's parser's words and ranges (hclsyntax, through pygohcl), as Nomad prints them
        ('job "j" {\n  group "g" {\n    count = 2 2\n  }\n}\n', "job.hcl:3,15-16: Missing newline after argument"),
        ('job "j" {\n  group "g" {\n', "job.hcl:2,13-14: Unclosed configuration block"),
        ('job "j" {\n  meta { a = "unclosed }\n}\n', "job.hcl:2,25-3,1: Invalid multi-line string"),
    ],
)
def test_hcl_errors_are_readable(text: str, needle: str) -> None:
    with pytest.raises(JobParseError) as err:
        parse_job_text(text, "job.hcl")
    message = str(err.value)
    assert needle in message
    assert "Token(" not in message and "STRING_CHARS" not in message and "* " not in message


def test_plugin_config_from_an_agent_directory_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--plugin-config` takes what `nomad agent -config` takes: a directory of *.hcl / *.json files."""
    conf = tmp_path / "nomad.d"
    conf.mkdir()
    (conf / "client.hcl").write_text("client {\n  enabled = true\n}\n")
    (conf / "lingjun.json").write_text(
        json.dumps({"plugin": {"nomad-device-lingjun": {"config": {"default_mode": "mig"}}}})
    )
    code, doc = check(tmp_path, capsys, device_job("count = 3", "nvidia/gpu-mig"), "--plugin-config", str(conf))
    assert code == 0 and doc["ok"] and doc["requests"][0]["chosen"].startswith("nvidia/gpu-mig/")


def test_mig_asked_on_cards_that_cannot_run_it_names_the_fallback_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(device_job("count = 3", "nvidia/gpu-mig"))
    code = check_job.main([str(job), "--profile", "l20-8", "--set", "default_mode=mig"])
    out = capsys.readouterr().out
    assert code == 1
    assert 'NOT PLACED default_mode = "mig" fell back to whole cards here: NVIDIA L20 is not MIG-capable' in out
    assert 'Fix: ask for device "nvidia/gpu" (whole cards)' in out
    assert out.rstrip().endswith("Nomad would not place it on this node")


def test_group_by_renaming_the_groups_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(device_job("count = 1", "nvidia/gpu/NVIDIA H800"))
    code = check_job.main([str(job), *FP_ARGS, "--set", "group_by=numaNodes"])
    out = capsys.readouterr().out
    assert code == 1
    assert "group_by = \"numaNodes\" names the groups 'NVIDIA H800 numa0', 'NVIDIA H800 numa1'" in out
    assert 'constraint { attribute = "${device.attr.model}" value = "NVIDIA H800" }' in out


def test_identical_per_card_rejections_are_one_line_with_the_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(device_job("count = 9", "nvidia/gpu-mig"))
    code = check_job.main([str(job), *FP_ARGS, "--set", "default_mode=mig"])
    out = capsys.readouterr().out
    assert code == 1
    rejected = [line for line in out.splitlines() if line.strip().startswith("rejected")]
    assert rejected == [
        "  rejected 8 groups (nvidia/gpu-mig/NVIDIA H800 card0, nvidia/gpu-mig/NVIDIA H800 card1, ... "
        "nvidia/gpu-mig/NVIDIA H800 card7): count 9 larger than the free healthy instances (7; 7 healthy of 7)"
    ]


def test_a_mig_count_reserve_refuses_is_nomads_place_plus_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = check(tmp_path, capsys, device_job("count = 5", "nvidia/gpu-mig"), "--set", "default_mode=mig")
    (req,) = doc["requests"]
    assert code == 1 and req["outcome"] == "place" and req["warnings"]
    assert doc["verdict"] == "Nomad would place this, but the plugin would refuse it at task start (WARNING above)"


def test_ids_constraints_take_the_instance_as_the_right_operand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nomad's row "meets constraints requirement multiple count": set_contains "A,B" on IDs keeps A and B."""
    fp = tmp_path / "fp.json"
    assert fingerprint.main(["--profile", "h800-8", "--json"]) == 0
    fp.write_text(capsys.readouterr().out)
    ids = [d["id"] for d in json.loads(fp.read_text())["groups"][0]["devices"]]
    body = f'count = 2\nconstraint {{\n attribute = "${{device.ids}}"\n set_contains = "{ids[5]},{ids[2]}"\n}}'
    job = tmp_path / "job.hcl"
    job.write_text(device_job(body))
    assert check_job.main([str(job), "--fingerprint", str(fp), *POOL, "--json"]) == 0
    (req,) = json.loads(capsys.readouterr().out)["requests"]
    assert sorted(req["picked_ids"]) == sorted([ids[5], ids[2]])
