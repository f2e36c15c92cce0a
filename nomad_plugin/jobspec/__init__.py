"""Nomad job ``device`` blocks and node-level rules, decided as Nomad's scheduler decides them (``check-job``)."""

from __future__ import annotations

from nomad_plugin.jobspec.evaluate import (
    OUTCOME_TEXT,
    PLACE,
    REFUSE,
    UNKNOWN,
    evaluate_job,
    evaluate_request,
    verdicts_json,
    verdicts_text,
)
from nomad_plugin.jobspec.hcl2_job import Inputs
from nomad_plugin.jobspec.node import (
    NodeDocument,
    NodeFileError,
    NodeValues,
    PluginKeys,
    evaluate_placement,
    final_outcome,
    group_outcomes,
    groups_json,
    groups_text,
    node_from_json,
    placement_json,
    placement_text,
    verdict_detail,
)
from nomad_plugin.jobspec.parse import NODE_FIELDS, JobParseError, ParsedJob, go_strings, parse_job, parse_job_text
from nomad_plugin.jobspec.scope import scope_checks
from nomad_plugin.jobspec.validate import parse_and_validate

__all__ = [
    "NODE_FIELDS", "OUTCOME_TEXT", "PLACE", "REFUSE", "UNKNOWN", "Inputs", "JobParseError", "NodeDocument",
    "NodeFileError", "NodeValues", "ParsedJob", "PluginKeys", "evaluate_job", "evaluate_placement", "evaluate_request",
    "final_outcome", "go_strings", "group_outcomes", "groups_json", "groups_text", "node_from_json",
    "parse_and_validate", "parse_job", "parse_job_text", "placement_json", "placement_text", "scope_checks", "verdict_detail",
    "verdicts_json", "verdicts_text",
]  # fmt: skip
