"""Whole-job validation at submission, in Nomad's words, on the job's API form (``api.Job`` JSON).

Nomad's HTTP agent canonicalises a submitted job (``Job.Canonicalize``, ``TaskGroup.Canonicalize`` in
``api/jobs.go``, ``api/tasks.go``: type service, priority 50, count 1, the type's restart policy merged
with the group's, the job's update, migrate and reschedule blocks merged into each group), then the job
endpoint validates it (``jobValidate.Validate``, ``nomad/job_endpoint_hooks.go``: ``Job.Validate``,
``TaskGroup.Validate``, ``validateNetworks``, ``Task.Validate``, ``Resources.Validate`` and
``RestartPolicy.Validate`` of ``nomad/structs/structs.go``, then the priority range). Checked here: what a
job file gets wrong by hand (type, ID, datacenters, priority, periodic and parameterized types, group and
task names, counts, the blocks a type refuses, restart mode, drivers, leaders, main tasks, CPU, cores,
memory, ports). Constraints, affinities, spreads and devices are ``parse.py``'s. An HCL job is
brought to the API form by ``api_form``; a value check-job does not evaluate is named, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nomad_plugin.jobspec.hcl2_job import Inputs
from nomad_plugin.jobspec.parse import ParsedJob, ValueProblem, dicts, number_value, parse_job, string_value
from nomad_plugin.util.hcl import is_meta, labelled, plain, unlabelled

JOB_TYPES = ("service", "batch", "system", "sysbatch")
MIN_PRIORITY, DEFAULT_MAX_PRIORITY = 1, 100  # structs.JobMinPriority; a server's job_max_priority by default
UNEVALUATED = object()  # a value check-job does not evaluate (a variable, a function)
_ZERO = re.compile(r"0+(\.0*)?[a-zµ]*")  # a zero number or Go duration ("0", "0s")


def _dict(raw: Any) -> dict[str, Any]:
    return raw if isinstance(raw, dict) else {}


def _str(raw: Any) -> str:
    return raw if isinstance(raw, str) else ""


def _int(raw: Any, default: int) -> int:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else default


def _unique(items: list[dict[str, Any]], missing: str, redefines: str) -> list[str]:
    """Names given and unique: ``missing`` takes the 1-based index, ``redefines`` it, the name and the first's."""
    errors, seen = [], dict[str, int]()
    for index, item in enumerate(items, start=1):
        name = _str(item.get("Name"))
        if name == "" or name in seen:
            errors.append(missing.format(index) if name == "" else redefines.format(index, name, seen[name]))
        seen.setdefault(name, index)
    return errors


def _set(block: Any) -> bool:
    """``UpdateStrategy.Empty`` and the like: a block with any non-zero value."""
    if not isinstance(block, dict):
        return False
    return any(
        v not in (None, False, "", 0) and not (isinstance(v, str) and _ZERO.fullmatch(v)) for v in block.values()
    )


def validate_job(job: dict[str, Any]) -> list[str]:
    """Nomad's refusals of the job at submission, each prefixed with where it is.

    A ``Type`` that is no string (a value check-job does not evaluate) leaves out the checks that depend on it.
    """
    errors = []
    kind: str | None = "service" if job.get("Type") is None else job["Type"] if isinstance(job["Type"], str) else None
    job_id = _str(job.get("ID"))
    if job_id == "":
        errors.append("Missing job ID")
    elif " " in job_id:
        errors.append("Job ID contains a space")
    elif "\0" in job_id:
        errors.append("Job ID contains a null character")
    if kind == "":
        errors.append("Missing job type")
    elif kind == "_core":
        errors.append("job type cannot be core")
    elif kind is not None and kind not in JOB_TYPES:
        errors.append(f'Invalid job type: "{kind}"')
    errors += ["Job datacenter must be non-empty string" for dc in job.get("Datacenters") or [] if dc == ""]
    priority = _int(job.get("Priority"), 50)
    if not MIN_PRIORITY <= priority <= DEFAULT_MAX_PRIORITY:  # a server's job_max_priority may raise the maximum
        errors.append(f"job priority must be between [{MIN_PRIORITY}, {DEFAULT_MAX_PRIORITY}]")
    groups = dicts(job.get("TaskGroups"))
    if not groups:
        errors.append("Missing job task groups")
    for what, block in (("Periodic", "Periodic"), ("Parameterized job", "ParameterizedJob")):
        enabled = block != "Periodic" or (job.get("Periodic") or {}).get("Enabled") is not False
        if isinstance(job.get(block), dict) and enabled and kind not in (None, "batch", "sysbatch"):
            errors.append(f'{what} can only be used with "batch" or "sysbatch" scheduler')
    errors += _unique(groups, "Job task group {} missing name", "Job task group {} redefines '{}' from group {}")
    in_groups: list[str] = []
    for group in groups:
        name, count = _str(group.get("Name")), _int(group.get("Count"), 1)
        if kind == "system" and count > 1:
            errors.append(f"Job task group {name} has count {count}. Count cannot exceed 1 with system scheduler")
        in_groups += _group(job, group, kind, count)
    return [*(f"job: {e}" for e in errors), *in_groups]


def _group(job: dict[str, Any], group: dict[str, Any], kind: str | None, count: int) -> list[str]:
    """``TaskGroup.Validate`` after ``TaskGroup.Canonicalize`` merged the job's blocks into the group's."""
    tasks, restart = dicts(group.get("Tasks")), _dict(group.get("RestartPolicy"))
    mode = restart.get("Mode") if restart.get("Mode") is not None else "fail"
    attempts = _int(restart.get("Attempts"), 2)  # the default is 2 or 3, by type: never 0
    errors = [
        message
        for wrong, message in (
            ("\0" in str(group.get("Name", "")), "Task group name contains null character"),
            (count < 0, "Task group count can't be negative"),
            (not tasks, "Missing tasks for task group"),
            (mode not in ("delay", "fail"), f'Unsupported restart mode: "{mode}"'),
            (attempts == 0 and mode != "fail", f'Restart policy "{mode}" with 0 attempts is ambiguous'),
        )
        if wrong
    ]
    if kind is None:
        kind = ""  # not evaluated: no rule that depends on it
    elif kind in ("system", "sysbatch") and (
        isinstance(group.get("ReschedulePolicy"), dict) or isinstance(job.get("Reschedule"), dict)
    ):
        errors.append("System or sysbatch jobs should not have a reschedule policy")
    if kind in ("service", "batch"):
        errors += _reschedule(kind, _dict(job.get("Reschedule")), _dict(group.get("ReschedulePolicy")))
    if kind not in ("", "service", "system") and (isinstance(group.get("Update"), dict) or _set(job.get("Update"))):
        errors.append(f'Job type "{kind}" does not allow update block')
    if kind not in ("", "service") and (isinstance(group.get("Migrate"), dict) or isinstance(job.get("Migrate"), dict)):
        errors.append(f'Job type "{kind}" does not allow migrate block')
    errors += _unique(tasks, "Task {} missing name", "Task {} redefines '{}' from task {}")
    if sum(1 for t in tasks if t.get("Leader") is True) > 1:
        errors.append("Only one task may be marked as leader")
    if tasks and all(isinstance(t.get("Lifecycle"), dict) and t["Lifecycle"].get("Hook") for t in tasks):
        errors.append(f"Task group {group.get('Name', '')} must have at least one main task")
    errors += [f"Task group network validation failed: {e}" for e in _ports(dicts(group.get("Networks")))]
    where = f'group "{group.get("Name", "")}"'
    errors = [f"{where}: {e}" for e in errors]
    for task in tasks:
        errors += [f'{where} task "{task.get("Name", "")}": {e}' for e in _task(task)]
    return errors


def _reschedule(kind: str, *given: dict[str, Any]) -> list[str]:
    """``ReschedulePolicy.Validate`` on the type's default (``NewDefaultReschedulePolicy``) merged with the job's,
    then the group's policy: the delay function and attempts beside ``unlimited`` (durations are not checked)."""
    service = kind == "service"
    policy = {"Attempts": int(not service), "Unlimited": service, "DelayFunction": "constant"}
    policy["DelayFunction"] = "exponential" if service else "constant"
    for fields in given:
        policy.update({key: value for key, value in fields.items() if key in policy and value is not None})
    attempts, unlimited, errors = _int(policy["Attempts"], 0), policy["Unlimited"] is True, []
    if attempts > 0 and unlimited:
        errors.append("If Attempts >0, Unlimited cannot also be set to true")
    if (attempts > 0 or unlimited) and policy["DelayFunction"] not in ("constant", "exponential", "fibonacci"):
        errors.append(
            f'Invalid delay function "{policy["DelayFunction"]}", must be one of ["constant" "exponential" "fibonacci"]'
        )
    return errors


def _ports(networks: list[dict[str, Any]]) -> list[str]:
    """``TaskGroup.validateNetworks``: labels, static ports and mapped ports of the group's networks."""
    errors = []
    labels: set[str] = set()
    static: dict[tuple[str, int], str] = {}
    for net in networks:
        for port in dicts(net.get("ReservedPorts")) + dicts(net.get("DynamicPorts")):
            label, value, to = str(port.get("Label", "")), _int(port.get("Value"), 0), _int(port.get("To"), 0)
            if label in labels:
                errors.append(f"Port label {label} already in use by taskgroup network")
            labels.add(label)
            where = (str(port.get("HostNetwork") or "default"), value)
            if value and where in static:
                errors.append(f"Static port {value} already reserved by {static[where]}")
            elif value > 65535:
                errors.append(f"Port {label} ({value}) cannot be greater than 65535")
            elif value:
                static[where] = f"taskgroup network:{label}"
            if to < -1:
                errors.append(f'Port "{label}" cannot be mapped to negative value {to}')
            elif to > 65535:
                errors.append(f'Port "{label}" cannot be mapped to a port ({to}) greater than 65535')
    return errors


def _task(task: dict[str, Any]) -> list[str]:
    """``Task.Validate`` and ``Resources.Validate`` (after ``Resources.Canonicalize``: cpu 100, memory 300).

    A task's ``disk`` never reaches ``Resources.Validate``: ``ApiResourcesToStructs``
    (``command/agent/job_endpoint.go``) does not copy ``DiskMB`` from the API form, so Nomad accepts it.
    """
    name, resources = str(task.get("Name", "")), _dict(task.get("Resources"))
    cores, memory = _int(resources.get("Cores"), 0), _int(resources.get("MemoryMB"), 300)
    cpu = _int(resources.get("CPU"), 100 if resources.get("Cores") is None else 0)
    return [
        message
        for wrong, message in (
            (name == "alloc", 'Task cannot be named "alloc"'),
            ("/" in name or "\\" in name, "Task name cannot include slashes"),
            (not task.get("Driver"), "Missing task driver"),
            (cores > 0 and cpu > 0, "Task can only ask for 'cpu' or 'cores' resource, not both."),
            (cores < 0, f"cores value ({cores}) cannot be negative"),
            (cpu < 1 and cores == 0, f"minimum CPU value is 1; got {cpu}"),
            (memory < 10, f"minimum MemoryMB value is 10; got {memory}"),
        )
        if wrong
    ]  # fmt: skip


# --- an HCL job in the API form, with the fields validated above ----------------------------------


class _Reader:
    """Values of an HCL body converted as gohcl converts them; refusals and unevaluated values collected."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.unsupported: list[str] = []

    def value(self, body: dict[str, Any], key: str, convert: Callable[[Any, str], Any], where: str) -> Any:
        """The converted value; None when absent or refused; ``UNEVALUATED`` when check-job cannot evaluate it."""
        if body.get(key) is None:
            return None
        try:
            return convert(body[key], key)
        except ValueProblem as exc:
            (self.unsupported if exc.unsupported else self.problems).append(f"{where}: {exc}")
            return UNEVALUATED if exc.unsupported else None

    def whole(self, body: dict[str, Any], key: str, where: str) -> int | None:
        """A number decoded into a Go int field (None when absent, refused or not evaluated: the default applies)."""
        number = self.value(body, key, number_value, where)
        if number is None or number is UNEVALUATED:
            return None
        if number != number.to_integral_value():
            self.problems.append(f"{where}: {key} = {number}: Unsuitable value: value must be a whole number")
            return None
        return int(number)


def _block(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    """A plain block's values under the API's names (``delay_function``: ``DelayFunction``)."""
    blocks = unlabelled(body.get(key, []))
    if not blocks:
        return None
    return {
        "".join(w.capitalize() for w in str(k).split("_")): plain(v) for k, v in blocks[0].items() if not is_meta(k)
    }


def validated(job: ParsedJob) -> ParsedJob:
    """``job`` with its refusals at submission and the values check-job does not evaluate added.

    An HCL job is brought to the API form first (``api_form``); what the HCL2 reading could not evaluate
    (anywhere in the job) it has named already (``hcl2_job``).
    """
    if job.api_form is not None:
        return replace(job, problems=(*job.problems, *validate_job(job.api_form)))
    body = job.hcl_body
    if body is None:
        return job
    read = _Reader()
    read.problems += _unexpected(body)
    refused_type = any(p.startswith("type: ") for p in job.problems)
    decoded = None if body.get("type") is None else UNEVALUATED if refused_type or not job.type_known else job.type
    refusals = validate_job(api_form(job.name, body, decoded, read))
    return replace(
        job, problems=(*job.problems, *read.problems, *refusals), unsupported=(*job.unsupported, *read.unsupported)
    )


#: What jobspec2 decodes in a job, group and task body: the ``hcl`` tags of ``api.Job``, ``api.TaskGroup``
#: and ``api.Task`` (``api/jobs.go``, ``api/tasks.go``), with the blocks ``decodeJob`` (``vault``, ``secret``,
#: ``task``, ``meta``: ``jobspec2/types.config.go``), ``decodeTaskGroup`` (``vault``, ``secret``, ``meta``)
#: and ``decodeTask`` (``env``, ``meta``, ``scaling``: ``jobspec2/hcl_conversions.go``) take themselves.
BODY_KEYS = {
    "job": frozenset(
        "region namespace id name type priority all_at_once datacenters node_pool constraint affinity group update "
        "multiregion spread periodic parameterized reschedule migrate meta ui vault secret task".split()
    ),
    "group": frozenset(
        "count constraint affinity task spread volume restart disconnect reschedule ephemeral_disk update migrate "
        "network meta service shutdown_delay max_run_duration stop_after_client_disconnect max_client_disconnect "
        "scaling consul prevent_reschedule_on_lost vault secret".split()
    ),
    "task": frozenset(
        "driver user lifecycle config constraint affinity env service resources restart meta kill_timeout logs "
        "artifact vault consul template dispatch_payload volume_mount csi_plugin leader shutdown_delay kill_signal "
        "kind scaling secret identity action schedule".split()
    ),
}


def _unexpected(job: dict[str, Any]) -> list[str]:
    """A block or argument a job, group or task body has no field for (a ``device`` outside ``resources``, a
    ``network`` in a task): gohcl's decode refuses the file (``decodeJob``, ``jobspec2/types.config.go``)."""
    bodies = [("job", "job", job)]
    for group_name, group in labelled(job.get("group", [])):
        bodies.append((f'group "{group_name}"', "group", group))
        bodies += [(f'group "{group_name}" task "{t}"', "task", task) for t, task in labelled(group.get("task", []))]
    errors = []
    for where, level, body in bodies:
        for key, value in body.items():
            if is_meta(key) or key in BODY_KEYS[level] or (level == "task" and key == "spread"):
                continue  # a task's spread: parse.py says it
            items = (
                [i for v in value if isinstance(v, dict) for i in (v, *v.values())] if isinstance(value, list) else []
            )
            block = any(isinstance(i, dict) and "__is_block__" in i for i in items)  # unlabelled, or labelled
            errors.append(
                f'{where}: Unsupported block type; Blocks of type "{key}" are not expected here.'
                if block
                else f'{where}: Unsupported argument; An argument named "{key}" is not expected here.'
            )
    return errors


def parse_and_validate(text: str, source: str = "job", inputs: Inputs | None = None) -> ParsedJob:
    """``parse_job``, then the whole job validated as Nomad validates it at submission."""
    return validated(parse_job(text, source, inputs))


def api_form(label: str, body: dict[str, Any], job_type: Any, read: _Reader) -> dict[str, Any]:
    """The job block's validated fields in the API form, as ``jobspec2`` decodes them."""
    job: dict[str, Any] = {"ID": label, "Type": job_type, "Priority": read.whole(body, "priority", "job")}
    datacenters = body.get("datacenters")
    if isinstance(datacenters, list):
        job["Datacenters"] = [read.value({"datacenters": d}, "datacenters", string_value, "job") for d in datacenters]
    for key, field in (("update", "Update"), ("migrate", "Migrate"), ("reschedule", "Reschedule")):
        job[field] = _block(body, key)
    periodic = _block(body, "periodic")
    job["Periodic"] = None if periodic is None else {"Enabled": periodic.get("Enabled") not in (False, "false")}
    job["ParameterizedJob"] = _block(body, "parameterized")
    job["TaskGroups"] = [_api_group(name, group, read) for name, group in labelled(body.get("group", []))]
    return job


def _api_group(name: str, body: dict[str, Any], read: _Reader) -> dict[str, Any]:
    where = f'group "{name}"'
    group: dict[str, Any] = {"Name": name, "Count": read.whole(body, "count", where), "Networks": []}
    for key, field in (("update", "Update"), ("migrate", "Migrate"), ("reschedule", "ReschedulePolicy")):
        group[field] = _block(body, key)
    restart = _block(body, "restart")
    if restart is not None:
        mode, attempts = read.value(restart, "Mode", string_value, where), read.whole(restart, "Attempts", where)
        group["RestartPolicy"] = {"Mode": mode, "Attempts": attempts}
    for network in unlabelled(body.get("network", [])):
        ports = [
            {"Label": label, "Value": read.whole(port, "static", f'{where} port "{label}"') or 0,
             "To": read.whole(port, "to", f'{where} port "{label}"') or 0,
             "HostNetwork": plain(port.get("host_network"))}
            for label, port in labelled(network.get("port", []))
        ]  # fmt: skip
        group["Networks"].append(
            {"ReservedPorts": [p for p in ports if p["Value"]], "DynamicPorts": [p for p in ports if not p["Value"]]}
        )
    group["Tasks"] = [_api_task(task_name, task, where, read) for task_name, task in labelled(body.get("task", []))]
    return group


def _api_task(name: str, body: dict[str, Any], group: str, read: _Reader) -> dict[str, Any]:
    where = f'{group} task "{name}"'
    resources = unlabelled(body.get("resources", []))
    fields = {"cpu": "CPU", "cores": "Cores", "memory": "MemoryMB"}
    amounts = {field: read.whole(resources[0], key, where) for key, field in fields.items()} if resources else {}
    return {
        "Name": name,
        "Driver": read.value(body, "driver", string_value, where),
        "Leader": read.value(body, "leader", lambda raw, _: plain(raw) in (True, "true"), where),
        "Lifecycle": _block(body, "lifecycle"),
        "Resources": amounts,
    }
