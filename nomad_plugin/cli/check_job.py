"""``nomad-device-lingjun check-job JOB.hcl``: dry-run a job's device blocks against this node.

Gets the live fingerprint by launching the real plugin as Nomad would
(against XDM, a socket directory, or an embedded simulator with
``--profile``), then evaluates every ``device`` block with Nomad's scheduler
rules and prints which group would serve it and why every other group was
rejected. Exit status: 0 every block can be placed, 1 at least one cannot,
2 usage / job file / plugin errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nomad_plugin.cli.helptext import help_text
from nomad_plugin.jobspec import JobParseError, evaluate_job, parse_job_text
from nomad_plugin.jobspec.report import verdicts_json, verdicts_text
from nomad_plugin.launcher import LauncherConfigError, LaunchError
from nomad_plugin.launcher.live import LiveNode
from nomad_plugin.nomad_view.render import Style
from nomad_plugin.nomad_view.types import DeviceGroup, group_from_json

EPILOG = """\
examples:
  nomad-device-lingjun check-job examples/jobs/whole-card.nomad.hcl --profile h800-8
  nomad-device-lingjun check-job examples/jobs/tdm-share.nomad.hcl --profile h800-8 --set default_mode='"tdm"'
  nomad-device-lingjun check-job job.hcl --plugin-config /etc/nomad.d/plugin.hcl      # on a node
  nomad-device-lingjun fingerprint --json > fp.json; nomad-device-lingjun check-job job.hcl --fingerprint fp.json
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nomad-device-lingjun check-job",
        description=help_text(__doc__, 1),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job", help="the job file: HCL2, or JSON as `nomad job run -output` prints it")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", help="start an embedded XDM simulator with this profile (e.g. h800-8)")
    src.add_argument("--socket-dir", help="XDM socket directory (dp2mgr.sock, config-daemon.sock)")
    src.add_argument("--fingerprint", metavar="FILE", help="a saved `fingerprint --json` instead of a live plugin")
    p.add_argument("--plugin-config", help="agent file with the plugin block (e.g. plugin.hcl)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='override a config option (HCL literal, e.g. default_mode="tdm")',
    )
    p.add_argument("--plugin", help="plugin executable to launch (default: this program)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for devices (default 20)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p


def _saved_fingerprint(path: str) -> list[DeviceGroup]:
    data = json.loads(Path(path).read_text())
    groups = data["groups"] if isinstance(data, dict) else data
    return [group_from_json(g) for g in groups]


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    style = Style(sys.stdout)
    try:
        requests = parse_job_text(Path(args.job).read_text(), args.job)
    except (OSError, UnicodeDecodeError, JobParseError) as exc:
        sys.stderr.write(f"check-job: {exc}\n")
        return 2
    try:
        if args.fingerprint:
            groups, source = _saved_fingerprint(args.fingerprint), f"saved fingerprint {args.fingerprint}"
        else:
            node = LiveNode(args.plugin_config, args.set, args.profile, args.socket_dir, args.plugin)
            node.device_timeout = args.timeout
            with node:
                groups, source = node.devices(), node.source
    except (LaunchError, LauncherConfigError, ValueError, KeyError, OSError) as exc:
        sys.stderr.write(f"check-job: cannot get the fingerprint: {exc}\n")
        return 2
    verdicts = evaluate_job(requests, groups)
    ok = all(v.ok for v in verdicts)  # a job without device blocks needs nothing from this node
    if args.json:
        doc = {
            "job_file": args.job,
            "fingerprint": {"source": source, "groups": [g.to_json() for g in groups]},
            "requests": verdicts_json(verdicts),
            "ok": ok,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0 if ok else 1
    devices = sum(len(g.devices) for g in groups)
    lines = [
        f"{args.job}: {len(requests)} device block(s); fingerprint: {len(groups)} group(s), {devices} devices ({source})",
        "",
    ]
    lines += verdicts_text(verdicts, style)
    if not requests:
        verdict = "the job has no device blocks: it asks nothing of this plugin"
    elif ok:
        verdict = "every device block can be placed on this node"
    else:
        verdict = "some device block cannot be placed on this node"
    lines.append(style(verdict, "green" if ok else "red", "bold"))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if ok else 1
