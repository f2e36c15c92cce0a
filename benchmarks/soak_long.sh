#!/usr/bin/env bash
# Long chaos soak: the real plugin under the conformance host against the
# simulator and the Nomad API double, with XDM restarts/crashes, health flips, latency,
# Reserve storms, allocation ends, Nomad API outages and SIGKILL + relaunch.
#
#   benchmarks/soak_long.sh [MINUTES] [SEED] [LOG] [SOAK ARGS...]   (defaults: 35, 7, /tmp/soak-long.log)
#
# Extra arguments go to the soak, e.g. "--kill-weight 0" for one long-lived plugin
# process (the memory/descriptor flatness run) or "--profile 810e-16".
#
# Runs in the background under nohup; the last line of LOG is the JSON summary
# (faults by type, invariant checks, violations, leaked grants). Exit status of the
# soak is appended as "exit=N".
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES="${1:-35}"
SEED="${2:-7}"
LOG="${3:-/tmp/soak-long.log}"
shift $(($# < 3 ? $# : 3))
EXTRA="$*"
.venv/bin/python tests/conformance/build.py >/dev/null
nohup bash -c ".venv/bin/python -m tests.soak.soak --minutes '$MINUTES' --seed '$SEED' $EXTRA -v; echo exit=\$?" >"$LOG" 2>&1 &
echo "soak started: pid $! minutes=$MINUTES seed=$SEED log=$LOG"
