"""``nomad-device-lingjun check-job JOB.hcl``: dry-run a job against this node.

Gets the live fingerprint by launching the real plugin as Nomad would (against XDM, a socket
directory, or an embedded simulator with ``--profile``), then decides every ``device`` block as
Nomad does (decoding, job validation, the scheduler's device checks) and every job-, group- and
task-level constraint and affinity on this node's values (its meta, the plugin's own keys
included, attributes and fields), the job's datacenters and node pool and its host volumes, and says Nomad's outcome: it would place the job, refuse it at
submission, or not place it on this node, with the group that would serve each block, why every
other group was rejected, and each node-level rule that fails. Spreads, distinct hosts and
distinct properties need the cluster and are shown, not decided. Each task group gets its outcome,
and the job the one its scheduler gives (a system job runs where any group does). Exit status: 0
Nomad would place it (and the plugin would serve it), 1 Nomad would not place it on this node, or
only part of it, or the plugin would refuse it at task start, 2 Nomad would refuse the job file,
check-job cannot tell (a value it does not know), or a usage, fingerprint or plugin error.

Nomad reads the job file when it can (``nomad job run -output`` or the agent's ``/v1/jobs/parse``,
``job_readers.py``), check-job's own reader otherwise; the output says which.

Node values come from ``--node FILE`` (Nomad's node JSON), the local Nomad agent (``--agent``; by
default when the fingerprint is this node's own plugin config), ``--node-value`` and the plugin's
keys, computed from the same inventory as the fingerprint (docs/operator.md, "check-job").
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

from nomad_plugin.cli.common import add_config_options, command_parser, described, fail, plugin_config
from nomad_plugin.cli.fingerprint import plugin_keys, schema_mismatch
from nomad_plugin.cli.job_readers import read_job
from nomad_plugin.config.decode import decode_config
from nomad_plugin.jobspec import (
    NODE_FIELDS,
    OUTCOME_TEXT,
    PLACE,
    REFUSE,
    UNKNOWN,
    JobParseError,
    NodeDocument,
    NodeFileError,
    NodeValues,
    ParsedJob,
    PluginKeys,
    evaluate_job,
    evaluate_placement,
    final_outcome,
    go_strings,
    group_outcomes,
    groups_json,
    groups_text,
    node_from_json,
    numa,
    placement_json,
    placement_text,
    releases,
    scope_checks,
    verdict_detail,
    verdicts_json,
    verdicts_text,
)
from nomad_plugin.launcher import LauncherConfigError, LaunchError
from nomad_plugin.launcher.config import msgpack_config
from nomad_plugin.launcher.process import LiveNode
from nomad_plugin.model.errors import PluginError
from nomad_plugin.nomad_view.types import DeviceGroup, Style, group_from_json
from nomad_plugin.reconcile.nomad_api import NomadApiError, NomadApiSettings, NomadClient

EPILOG = """\
examples:
  nomad-device-lingjun check-job examples/jobs/whole-card.nomad.hcl --profile h800-8
  nomad-device-lingjun check-job examples/jobs/tdm-share.nomad.hcl --profile h800-8 --set default_mode='"tdm"'
  nomad-device-lingjun check-job job.hcl --plugin-config /etc/nomad.d/plugin.hcl      # on a node
  nomad-device-lingjun fingerprint --json > fp.json; nomad-device-lingjun check-job job.hcl --fingerprint fp.json
  nomad-device-lingjun check-job examples/jobs/multi-node-training.nomad.hcl --profile h800-8 --set node_meta=true
  nomad node status -self -json > node.json; nomad-device-lingjun check-job job.hcl --profile h800-8 --node node.json
"""


def parser() -> argparse.ArgumentParser:
    p = command_parser("check-job", __doc__ or "", paragraph=1, epilog=EPILOG)
    p.add_argument("job", help="the job file: HCL2, or JSON as `nomad job run -output` prints it")
    source = add_config_options(p, node=True)
    assert source is not None
    source.add_argument("--fingerprint", metavar="FILE", help="a saved `fingerprint --json` instead of a live plugin")
    p.add_argument("--plugin", help="plugin executable to launch (default: this program)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for devices (default 20)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    reader = p.add_argument_group(
        "who reads the job file, and its HCL2 variables as `nomad job run` takes them "
        "(and NOMAD_VAR_<name> from the environment); Nomad itself reads it when it can: docs/operator.md"
    )
    reader.add_argument("--nomad", metavar="PATH", help="read it with this `nomad` executable (default: one on PATH)")
    reader.add_argument("-var", "--var", action="append", default=[], metavar="NAME=VALUE", help="a variable")
    reader.add_argument(
        "-var-file",
        "--var-file",
        action="append",
        default=[],
        metavar="FILE",
        help="a file of variable values (HCL or JSON)",
    )
    p.add_argument("--nomad-edition", choices=numa.EDITIONS, default="ce", help="Nomad's edition (default ce)")
    p.add_argument("--sysfs-root", default="/", help="where sys/bus/pci/devices is, for numa blocks (default /)")
    node = p.add_argument_group("this node's values (for job-, group- and task-level constraint and affinity)")
    node.add_argument(
        "--node",
        metavar="FILE",
        help="the node as Nomad holds it: `nomad node status -self -json` or GET /v1/node/<id> saved to a file",
    )
    agent = node.add_mutually_exclusive_group()
    agent.add_argument(
        "--agent",
        action="store_true",
        default=None,
        help="read this node from the local Nomad agent (/v1/agent/self, /v1/node/<id>) with the plugin config's "
        "nomad_* settings or NOMAD_ADDR/NOMAD_TOKEN (default: only when checking this node's own plugin config)",
    )
    agent.add_argument("--no-agent", dest="agent", action="store_false", help="never ask the Nomad agent")
    node.add_argument(
        "--node-value",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="state one value: meta.<key>, attr.<key>, node.datacenter, node.class, node.pool, node.unique.name or "
        "node.unique.id (wins over every other source)",
    )
    return p


def _read_json(path: str) -> Any:
    try:
        return go_strings(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path} is not JSON ({type(exc).__name__}: {exc})") from None


def _saved_fingerprint(path: str) -> tuple[list[DeviceGroup], PluginKeys | None, str]:
    """A file written by ``fingerprint --json`` (or its ``groups`` list), with its ``plugin_keys`` or why
    there are none; ValueError when it is not one."""
    data = _read_json(path)
    try:
        groups = data["groups"] if isinstance(data, dict) else data
        devices = [group_from_json(g) for g in groups]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"{path} is not a saved `fingerprint --json` ({type(exc).__name__}: {exc})") from None
    saved = data.get("plugin_keys") if isinstance(data, dict) else None
    if saved is None:
        why = data.get("plugin_keys_error") if isinstance(data, dict) else None
        return devices, None, str(why or f"{path} holds none (save it again with `fingerprint --json`)")
    try:
        return devices, PluginKeys.from_json(saved), ""
    except NodeFileError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _stated(items: list[str]) -> dict[str, str]:
    """``--node-value KEY=VALUE`` items; ValueError naming a key Nomad does not resolve."""
    fields = {t[2:-1] for t in NODE_FIELDS}
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if key.startswith("${") and key.endswith("}"):
            key = key[2:-1]
        if not sep or not (key in fields or key.startswith(("attr.", "meta."))) or key in ("attr.", "meta."):
            raise ValueError(
                f"--node-value {item!r}: write meta.<key>=VALUE, attr.<key>=VALUE or {', '.join(sorted(fields))}=VALUE"
            )
        out[key] = value
    return out


def _asks_agent(args: argparse.Namespace) -> bool:
    """--agent, or by default when checking this node's own plugin config (no simulator, sockets or saved file)."""
    own_node = not (args.profile or args.socket_dir or args.fingerprint)
    return bool(args.agent if args.agent is not None else own_node)


def _agent_settings(args: argparse.Namespace) -> NomadApiSettings | None:
    """The agent's address and token for reading the job, when the agent is asked (None when not, or unusable)."""
    if not _asks_agent(args):
        return None
    try:
        return NomadApiSettings.from_config(plugin_config(args.plugin_config, args.set))
    except (ValueError, PluginError, OSError):
        return None  # the same config fails the fingerprint, which says why


def _agent_node(args: argparse.Namespace, config_map: dict[str, Any] | None) -> NodeDocument:
    """This node from the local agent: /v1/agent/self for its ID (unless nomad_node_id), then /v1/node/<id>;
    ValueError (``NodeFileError`` included) when it does not come."""
    config = decode_config(msgpack_config(config_map)) if config_map else plugin_config(args.plugin_config, args.set)
    settings = NomadApiSettings.from_config(config)
    with closing(NomadClient(settings)) as client:
        try:
            node_id = config.nomad_node_id or client.node_id()
            doc = client.node_record(node_id)
        except (NomadApiError, OSError) as exc:  # OSError: the TLS files (nomad_ca_cert, ...) cannot be read
            raise ValueError(
                f"the Nomad agent at {settings.address} did not give this node: {described(exc)}"
            ) from None
    return node_from_json(doc, f"Nomad at {settings.address}, /v1/node/{node_id}")


def _node_values(
    args: argparse.Namespace,
    job: ParsedJob,
    plugin: PluginKeys | None,
    plugin_why: str,
    config_map: dict[str, Any] | None,
) -> NodeValues:
    """What check-job knows of this node (ValueError for a --node file or --node-value that is not usable)."""
    stated = _stated(args.node_value)
    node: NodeDocument | None = None
    node_why = ""
    if args.node:
        node = node_from_json(_read_json(args.node), f"node file {args.node}")
    else:
        ask = _asks_agent(args)
        if ask and any(g.has_rules or scope_checks(job, g.group, NodeValues().resolve, None) for g in job.groups):
            try:
                node = _agent_node(args, config_map)
            except (ValueError, PluginError, OSError) as exc:
                node_why = described(exc)
        elif not ask:
            node_why = "" if args.agent is None else "--no-agent"
    # The simulated node is a Nomad client with its defaults: datacenter dc1 and node pool default
    # (command/agent/config.go DefaultConfig; Node.Register makes an empty pool "default").
    simulated = {"node.datacenter": "dc1", "node.pool": "default"} if args.profile else {}
    return NodeValues(node, plugin, plugin_why, stated, node_why, simulated)


EXIT = {PLACE: 0, REFUSE: 2, UNKNOWN: 2}  # anything else (not placed on this node, or only in part): 1


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")  # any text a job holds prints on any terminal
    style = Style(sys.stdout)
    try:
        reading = read_job(
            args.job, nomad=args.nomad, settings=_agent_settings(args), variables=args.var, var_files=args.var_file
        )
        text = Path(args.job).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, JobParseError) as exc:
        return fail("check-job", described(exc))
    job = reading.job
    asks = numa.read_numa(job)
    requests = job.requests
    node_rules = any(g.has_rules for g in job.groups)
    config = None
    plugin: PluginKeys | None = None
    plugin_why = "the job has no node-level rules" if not node_rules else ""
    try:
        if args.fingerprint:
            groups, saved, why = _saved_fingerprint(args.fingerprint)
            source = f"saved fingerprint {args.fingerprint}"
            if node_rules:
                plugin, plugin_why = saved, why
        else:
            with LiveNode(
                args.plugin_config, args.set, args.profile, args.socket_dir, args.plugin, device_timeout=args.timeout
            ) as live:
                groups, source, config = live.devices(), live.source, dict(live.config)
                mismatch = schema_mismatch(groups)  # groups read with the wrong schema: no verdict on them
                if mismatch:
                    raise ValueError(mismatch)
                if node_rules:
                    plugin, plugin_why = plugin_keys(config, args.timeout)
    except (LaunchError, LauncherConfigError, ValueError, KeyError, OSError) as exc:
        return fail("check-job", f"cannot get the fingerprint: {described(exc)}")
    try:
        values = _node_values(args, job, plugin, plugin_why, config)
    except ValueError as exc:
        return fail("check-job", str(exc))
    verdicts = evaluate_job(requests, groups, config)
    placement = evaluate_placement(job, values)
    by_group = group_outcomes(verdicts, placement)
    outcome = final_outcome(by_group, job)
    buses, bus_source = numa.bus_numa_map(args.sysfs_root), str(numa.sysfs_devices(args.sysfs_root))
    if asks and args.node and (recorded := numa.node_bus_map(_read_json(args.node))):
        buses, bus_source = recorded, f"node file {args.node}"
    numa_result = numa.decide_numa(asks, verdicts, groups, args.nomad_edition, buses, bus_source)
    outcome = numa.merged(outcome, numa_result)
    problems = [*job.problems, *(p for g in job.groups for p in g.problems), *(p for v in verdicts for p in v.problems)]
    notes = [releases.modelled(args.nomad_edition), *releases.release_lines(problems, text)]
    notes += releases.shared_state_notes(_read_json(args.fingerprint)) if args.fingerprint else []
    refused_at_start = outcome == PLACE and any(v.warnings for v in verdicts)
    ok = outcome == PLACE and not refused_at_start
    code = 1 if refused_at_start else EXIT.get(outcome, 1)
    if refused_at_start:
        verdict = f"{OUTCOME_TEXT[PLACE]}, but the plugin would refuse it at task start (WARNING above)"
    else:
        detail = verdict_detail(placement, by_group, outcome)
        verdict = OUTCOME_TEXT[outcome] + (f": {detail}" if detail else "")
    if args.json:
        doc = {
            "job_file": args.job,
            "reader": reading.to_json(),
            "fingerprint": {"source": source, "groups": [g.to_json() for g in groups]},
            "requests": verdicts_json(verdicts),
            "node_rules": placement_json(placement, values),
            "groups": groups_json(by_group),
            "numa": numa.numa_json(numa_result),
            "nomad": notes,
            "outcome": outcome,
            "verdict": verdict,
            "ok": ok,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return code
    devices = sum(len(g.devices) for g in groups)
    lines = [
        f"{args.job}: {len(requests)} device block(s); fingerprint: {len(groups)} group(s), {devices} devices ({source})",
        f"job read by {reading.detail}",
        *(f"  (not by Nomad: {why})" for why in reading.skipped),
        "",
    ]
    lines += placement_text(placement, values, style)
    lines += verdicts_text(verdicts, style)
    lines += groups_text(by_group, style)
    lines += [*numa.numa_text(numa_result, style), *notes, ""]
    if not requests and outcome == PLACE:
        verdict += ": the job has no device blocks, it asks nothing of this plugin"
    lines.append(style(verdict, "green" if ok else "red", "bold"))
    sys.stdout.write("\n".join(lines) + "\n")
    return code
