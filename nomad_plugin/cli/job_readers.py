"""Who reads check-job's job file: Nomad itself when it can be reached (its own HCL2 evaluation, ``jobspec2``),
check-job's own reader otherwise.

- ``nomad job run -output JOB`` (``command/job_run.go``) parses locally, with ``-var`` and ``-var-file``, and
  prints ``{"Job": {...}}`` (the API form); a file it cannot read: "Error getting job struct: ..." and status 1.
- The agent's ``POST /v1/jobs/parse`` (``JobsParseRequest``, ``command/agent/job_endpoint.go``) takes the HCL
  and the variables as one variables file's content and answers the canonicalised API form, or 400 "Failed to
  parse job: ...". It has no file system functions (``guardFS``, ``jobspec2/functions.go``), which ``nomad
  job run`` has: a job calling them is left to the next reader. A ``-var`` goes to it as ``KEY = "VALUE"``, the
  literal ``nomad job run`` makes for a string, number or untyped variable (``expressionFromVariableDefinition``,
  ``jobspec2/types.variables.go``), or as the expression itself when the value starts with ``[`` or ``{``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from nomad_plugin.config.options import hcl_string
from nomad_plugin.jobspec import Inputs, JobParseError, ParsedJob, parse_and_validate
from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient
from nomad_plugin.util.text import printable

PARSE_PATH = "/v1/jobs/parse"
BUILT_IN = "check-job's own reader (python-hcl2)"


class NotRead(Exception):
    """A Nomad reader that could not read the job (not there, no right, not Nomad's refusal)."""


@dataclass(frozen=True)
class Reading:
    job: ParsedJob
    reader: str  # "nomad-cli", "nomad-agent" or "built-in"
    detail: str  # who read it, in words
    skipped: tuple[str, ...] = ()  # why each Nomad reader tried before it did not read the job

    def to_json(self) -> dict[str, object]:
        return {"name": self.reader, "detail": self.detail, "skipped": list(self.skipped)}


def refused(answer: str) -> ParsedJob:
    """Nomad's refusal to read the job file, in its own words (one problem per line)."""
    lines = [printable(line, 400) for line in answer.strip().splitlines() if line.strip()][:40]
    return ParsedJob("", "service", [], [], tuple(lines or ["(no message)"]))


def from_api_form(text: str, source: str) -> ParsedJob:
    try:
        return parse_and_validate(text, source)
    except JobParseError as exc:
        raise NotRead(f"{source} gave no job: {exc}") from None


def read_with_cli(
    nomad: str, path: str, variables: Sequence[str], var_files: Sequence[str], timeout: float
) -> ParsedJob:
    """``nomad job run -output`` with the ``-var`` and ``-var-file`` flags, as a person would run it."""
    flags = [flag for v in variables for flag in ("-var", v)] + [flag for f in var_files for flag in ("-var-file", f)]
    command = [nomad, "job", "run", "-output", *flags, path]
    try:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise NotRead(f"{nomad} job run -output did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise NotRead(f"cannot run {nomad}: {exc.strerror or exc}") from None
    if done.returncode == 0:
        return from_api_form(done.stdout, f"`{nomad} job run -output`")
    if done.stderr.lstrip().startswith("Error getting job struct:"):
        return refused(done.stderr)
    first = next((line for line in done.stderr.splitlines() if line.strip()), "")
    raise NotRead(f"{nomad} job run -output exited with status {done.returncode}: {printable(first, 300)}")


def variables_file(variables: Sequence[str], var_files: Sequence[str]) -> str:
    """The ``-var`` and ``-var-file`` values as one variables file's content (see the module's note)."""
    parts = [Path(f).read_text(encoding="utf-8") for f in var_files]
    for item in variables:
        key, _, value = item.partition("=")
        parts.append(f"{key.strip()} = {value if value.lstrip()[:1] in ('[', '{') else hcl_string(value)}")
    return "\n".join(parts) + ("\n" if parts else "")


def read_with_agent(settings: NomadApiSettings, text: str, variables: str) -> ParsedJob:
    namespace = os.environ.get("NOMAD_NAMESPACE") or "default"
    payload = {"JobHCL": text, "Variables": variables, "Canonicalize": True}
    with closing(NomadClient(settings)) as client:
        try:
            body = client.post(PARSE_PATH, payload, {"namespace": namespace})
        except NomadApiError as exc:
            if exc.status == 400 and "filesystem function" not in exc.answer:
                return refused(exc.answer)
            raise NotRead(f"the Nomad agent at {settings.address} did not read it: {exc}") from None
        except OSError as exc:  # the TLS files (nomad_ca_cert, ...) cannot be read
            raise NotRead(f"the Nomad agent at {settings.address} was not asked: {exc}") from None
    return from_api_form(json.dumps(body), f"the Nomad agent at {settings.address}")


def read_job(
    path: str,
    *,
    nomad: str | None,
    settings: NomadApiSettings | None,
    variables: Sequence[str] = (),
    var_files: Sequence[str] = (),
    timeout: float = 20.0,
) -> Reading:
    """The job as the first reader that can read it reads it: ``--nomad``, the agent (``settings``; None: not
    asked), ``nomad`` on PATH, then check-job's own. OSError or UnicodeDecodeError when
    check-job's own reader cannot read the file."""
    text = Path(path).read_text(encoding="utf-8")
    skipped: list[str] = []
    readers = (nomad, settings, None if nomad else shutil.which("nomad"))
    for how in readers if not text.lstrip().startswith("{") else ():  # a JSON job is the API form already
        try:
            if isinstance(how, NomadApiSettings):
                job = read_with_agent(how, text, variables_file(variables, var_files))
                detail = f"the Nomad agent at {how.address} (POST {PARSE_PATH})"
                return Reading(job, "nomad-agent", detail, tuple(skipped))
            if how:
                job = read_with_cli(how, path, variables, var_files, timeout)
                return Reading(job, "nomad-cli", f"`{how} job run -output`", tuple(skipped))
        except NotRead as exc:
            skipped.append(str(exc))
    files = [(name, Path(name).read_text(encoding="utf-8")) for name in var_files]
    inputs = Inputs(list(variables), files, {k: v for k, v in os.environ.items() if k.startswith("NOMAD_VAR_")})
    try:
        job = parse_and_validate(text, path, inputs)
    except JobParseError as exc:  # what jobspec2 refuses (syntax, an unset variable, a failing function): Nomad's words
        job = refused(str(exc))
    return Reading(job, "built-in", BUILT_IN, tuple(skipped))
