"""Nomad job ``device`` blocks: parse them and evaluate them against a fingerprint.

Pure functions with Nomad's scheduler semantics (name forms, count, unit-aware
constraints and affinities); ``check-job`` and ``demo`` build on them.
"""

from __future__ import annotations

from nomad_plugin.jobspec.evaluate import (
    OUTCOME_TEXT,
    PLACE,
    REFUSE,
    UNKNOWN,
    GroupVerdict,
    RequestVerdict,
    RuleResult,
    evaluate_job,
    evaluate_request,
    verdicts_json,
    verdicts_text,
)
from nomad_plugin.jobspec.node import (
    NODE_FIELDS,
    NodeDocument,
    NodeFileError,
    NodeValues,
    PluginKeys,
    evaluate_placement,
    final_outcome,
    node_from_json,
    placement_json,
    placement_text,
    verdict_detail,
)
from nomad_plugin.jobspec.operators import compare, parse_attribute
from nomad_plugin.jobspec.parse import (
    DeviceRequest,
    JobParseError,
    ParsedJob,
    Rule,
    go_strings,
    parse_job,
    parse_job_text,
)

__all__ = [
    "NODE_FIELDS", "OUTCOME_TEXT", "PLACE", "REFUSE", "UNKNOWN", "DeviceRequest", "GroupVerdict", "JobParseError",
    "NodeDocument", "NodeFileError", "NodeValues", "ParsedJob", "PluginKeys", "RequestVerdict", "Rule", "RuleResult",
    "compare", "evaluate_job", "evaluate_placement", "evaluate_request", "final_outcome", "go_strings",
    "node_from_json", "parse_attribute", "parse_job", "parse_job_text", "placement_json", "placement_text",
    "verdict_detail", "verdicts_json", "verdicts_text",
]  # fmt: skip
