"""Device-block parsing and evaluation with Nomad's scheduler semantics (pure)."""

from __future__ import annotations

import pytest

from nomad_plugin.jobspec import evaluate_job, evaluate_request, parse_job_text
from nomad_plugin.jobspec.evaluate import name_matches
from nomad_plugin.jobspec.operators import check_version
from nomad_plugin.jobspec.parse import DeviceRequest, JobParseError, Rule
from nomad_plugin.nomad_view.types import Attribute, Device, DeviceGroup


def group(
    name: str = "NVIDIA H800",
    n: int = 4,
    unhealthy: int = 0,
    vendor: str = "nvidia",
    dtype: str = "gpu",
    **attrs: Attribute,
) -> DeviceGroup:
    devices = tuple(Device(f"{name}-{i}", i >= unhealthy) for i in range(n))
    base = {
        "memory": Attribute(81559, "MiB"),
        "model": Attribute("NVIDIA H800"),
        "driver_version": Attribute("535.161.08"),
    }
    return DeviceGroup(vendor, dtype, name, devices, {**base, **attrs})


def request(
    name: str = "nvidia/gpu", count: int = 1, constraints: tuple[Rule, ...] = (), affinities: tuple[Rule, ...] = ()
) -> DeviceRequest:
    return DeviceRequest("j", "g", "t", name, count, constraints, affinities)


JOB = """
job "x" {
  group "a" {
    task "one" {
      resources {
        device "nvidia/gpu" {
          count = 2
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "79 GiB"
          }
          affinity {
            attribute = "${device.attr.topology.numaNodes}"
            value     = 0
          }
        }
        device "gpu" {}
      }
    }
    task "two" {
      resources {
        device "nvidia/gpu/NVIDIA H800" {
          count = 3
          constraint {
            attribute = "${device.attr.driver_version}"
            version   = ">= 535.0"
          }
        }
      }
    }
  }
}
"""


def test_parse_finds_every_device_block_with_defaults_and_sugar() -> None:
    reqs = parse_job_text(JOB)
    assert [(r.task, r.name, r.count) for r in reqs] == [
        ("one", "nvidia/gpu", 2),
        ("one", "gpu", 1),
        ("two", "nvidia/gpu/NVIDIA H800", 3),
    ]
    assert reqs[0].constraints == (Rule("${device.attr.memory}", ">=", "79 GiB"),)
    assert reqs[0].affinities == (Rule("${device.attr.topology.numaNodes}", "=", "0", 50, True),)
    assert reqs[2].constraints[0].operator == "version"


def test_parse_errors() -> None:
    with pytest.raises(JobParseError, match=r"^job:1,6-7: Argument or block definition required; "):
        parse_job_text("job {{{")  # HashiCorp's parser, in its words
    with pytest.raises(JobParseError, match="no job"):
        parse_job_text('variable "x" {\n  default = 1\n}')
    with pytest.raises(JobParseError, match='Unset variable "x"'):
        parse_job_text('variable "x" {}')
    job = 'job "j" {\n group "g" {\n  task "t" {\n   resources {\n    device "gpu" { count = %s }\n}\n}\n}\n}'
    zero = parse_job_text(job % 0)
    assert zero[0].count == 0 and not zero[0].problems  # Nomad's Count is unsigned: 0 is a valid job
    bad = parse_job_text(job % -2)
    assert "whole number from 0" in bad[0].problems[0]


@pytest.mark.parametrize(
    ("name", "ok"),
    [("gpu", True), ("nvidia/gpu", True), ("nvidia/gpu/NVIDIA H800", True), ("ppu", False), ("alibaba/gpu", False),
     ("nvidia/gpu/H800", False), ("nvidia/gpu-share", False)],
)  # fmt: skip
def test_name_forms(name: str, ok: bool) -> None:
    assert (name_matches(name, group()) == "") is ok


def test_model_may_contain_slashes() -> None:
    g = group(name="A/B/C")
    assert name_matches("nvidia/gpu/A/B/C", g) == ""


def test_count_uses_healthy_instances_of_one_group() -> None:
    groups = [group("NVIDIA H800 numa0", 4, unhealthy=1), group("NVIDIA H800 numa1", 4)]
    v = evaluate_request(request(count=4), groups)
    assert v.ok and v.chosen is not None and v.chosen.group.name == "NVIDIA H800 numa1"
    rejected = v.groups[0]
    assert (
        not rejected.eligible
        and "count 4 larger than the free healthy instances (3; 3 healthy of 4)" in rejected.reasons[0]
    )
    assert not evaluate_request(request(count=5), groups).ok  # never across two groups


def test_unhealthy_ids_are_never_picked() -> None:
    v = evaluate_request(request(count=2), [group(n=4, unhealthy=2)])
    assert v.picked_ids == ("NVIDIA H800-2", "NVIDIA H800-3")


@pytest.mark.parametrize(
    ("rule", "passes", "reason"),
    [
        (Rule("${device.attr.memory}", ">=", "79 GiB"), True, ""),
        (Rule("${device.attr.memory}", ">=", "80 GiB"), False, ""),
        (Rule("${device.attr.memory}", "<", "100 GB"), True, ""),
        (Rule("${device.attr.memory}", ">=", "80000"), False, "has none"),
        (Rule("${device.attr.memory}", ">=", "1 GHz"), False, "unit mismatch"),
        (Rule("${device.attr.nope}", "=", "1"), False, "unknown attribute 'nope'"),
        (Rule("${device.attr.memry}", "=", "1"), False, "did you mean memory"),
        (Rule("${node.class}", "=", "x"), False, "is not found inside a device block"),
        (Rule("${device.model}", "=", "NVIDIA H800"), True, ""),
        (Rule("${device.vendor}", "!=", "amd"), True, ""),
        (Rule("${device.type}", "is", "gpu"), True, ""),
        (Rule("${device.attr.model}", "regexp", "H[0-9]+"), True, ""),
        (Rule("${device.attr.driver_version}", "version", ">= 535.0, < 600"), True, ""),
        (Rule("${device.attr.driver_version}", "version", "~> 535.100"), True, ""),
        (Rule("${device.attr.driver_version}", "version", "< 500"), False, ""),
        (Rule("${device.attr.driver_version}", "semver", ">= 1.0"), True, ""),
        (Rule("${device.attr.nope}", "is_not_set", ""), True, ""),
        (Rule("${device.attr.memory}", "is_set", ""), True, ""),
        (Rule("${device.attr.nope}", "!=", "x"), True, ""),  # one side missing: not equal
        (Rule("${device.attr.memory}", "bogus", "1"), False, "unknown operator"),
        (Rule("${device.attr.memory}", "set_contains", "1"), False, "compares strings only"),
    ],
)
def test_constraints(rule: Rule, passes: bool, reason: str) -> None:
    v = evaluate_request(request(constraints=(rule,)), [group()])
    assert v.ok is passes
    if reason:
        assert reason in " ".join(v.groups[0].reasons)


def test_set_operators() -> None:
    g = group(slice_sizes=Attribute("1,2,3,4,7"))
    ok = Rule("${device.attr.slice_sizes}", "set_contains", "1,7")
    anyof = Rule("${device.attr.slice_sizes}", "set_contains_any", "5,7")
    none = Rule("${device.attr.slice_sizes}", "set_contains_all", "5,7")
    assert evaluate_request(request(constraints=(ok, anyof)), [g]).ok
    assert not evaluate_request(request(constraints=(none,)), [g]).ok


def test_device_ids_constraint_filters_instances() -> None:
    g = group(n=4)
    rule = Rule("${device.ids}", "set_contains_any", "NVIDIA H800-1,NVIDIA H800-3")
    v = evaluate_request(request(count=2, constraints=(rule,)), [g])
    assert v.ok and v.picked_ids == ("NVIDIA H800-1", "NVIDIA H800-3")
    assert not evaluate_request(request(count=3, constraints=(rule,)), [g]).ok


def test_affinity_picks_the_best_group_and_scores() -> None:
    groups = [
        group("NVIDIA H800 numa0", **{"topology.numaNodes": Attribute(0)}),
        group("NVIDIA H800 numa1", **{"topology.numaNodes": Attribute(1)}),
    ]
    aff = (
        Rule("${device.attr.topology.numaNodes}", "=", "1", 50, True),
        Rule("${device.attr.memory}", ">", "1 TiB", -50, True),
    )
    v = evaluate_request(request(affinities=aff), groups)
    assert v.chosen is not None and v.chosen.group.name == "NVIDIA H800 numa1"
    assert v.chosen.affinity_score == pytest.approx(0.5)
    assert v.groups[0].affinity_score == pytest.approx(0.0)


def test_blocks_of_one_task_group_share_instances() -> None:
    reqs = [
        DeviceRequest("j", "g", "t1", "gpu", 3),
        DeviceRequest("j", "g", "t2", "gpu", 2),
        DeviceRequest("j", "h", "t3", "gpu", 4),
    ]
    verdicts = evaluate_job(reqs, [group(n=4)])
    assert [v.ok for v in verdicts] == [True, False, True]
    assert "taken by an earlier device block" in verdicts[1].groups[0].reasons[0]


def test_no_devices_is_a_problem() -> None:
    v = evaluate_request(request(), [])
    assert not v.ok and v.outcome == "not_placed" and "no devices" in v.why[0]


@pytest.mark.parametrize(
    ("version", "constraint", "ok"),
    [("535.161.08", ">= 535", True), ("1.2.3", "~> 1.2", True), ("2.0", "~> 1.2", False),
     ("1.2.3-beta", "< 1.2.3", False),  # go-version: a pre-release never satisfies a release's < or >=
     ("1.2.3", "= 1.2.3", True), ("1.2.3", "!= 1.2.3", False), ("1.2.3.4", ">= 1", True)],
)  # fmt: skip
def test_versions(version: str, constraint: str, ok: bool) -> None:
    assert check_version(version, constraint, semver=False).holds is ok


def test_semver_is_nomads() -> None:
    assert check_version("1.2.3.4", ">= 1", semver=True).holds  # four segments are fine
    assert check_version("1.2.3-beta", "< 1.2.3", semver=True).holds  # Semver 2.0 order
    assert "not a semver constraint" in check_version("1.0", "~> 1.0", semver=True).why
    assert "not a version constraint" in check_version("1.0", "about 1", semver=False).why
