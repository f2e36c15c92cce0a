"""Nomad job ``device`` blocks: parse them and evaluate them against a fingerprint.

Pure functions with Nomad's scheduler semantics (name forms, count, unit-aware
constraints and affinities); ``check-job`` and ``demo`` build on them.
"""

from __future__ import annotations

from nomad_plugin.jobspec.evaluate import GroupVerdict, RequestVerdict, RuleResult, evaluate_job, evaluate_request
from nomad_plugin.jobspec.parse import DeviceRequest, JobParseError, Rule, parse_job_text
from nomad_plugin.jobspec.units import compare, parse_attribute

__all__ = [
    "DeviceRequest",
    "GroupVerdict",
    "JobParseError",
    "RequestVerdict",
    "Rule",
    "RuleResult",
    "compare",
    "evaluate_job",
    "evaluate_request",
    "parse_attribute",
    "parse_job_text",
]
