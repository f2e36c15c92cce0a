#!/usr/bin/env bash
# Run pytest N times in a row with CPU hogs (busy loops, one per core) beside
# it: a flaky, speed-dependent test shows up here before it turns CI red.
#
#   tools/stress_suite.sh                 # the whole suite, 5 rounds, one hog per core
#   ROUNDS=20 HOGS=2 tools/stress_suite.sh tests/hardening/test_xdm_paths.py -k real_plugin
#
# Extra arguments go to pytest (default: the whole suite). Stops at the first
# failing round and exits with its status; the hogs are always killed. Each
# round's output is kept in $LOG_DIR (default: a fresh /tmp directory).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
HOGS=${HOGS:-$(nproc)}
LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/stress_suite.XXXXXX)}
mkdir -p "$LOG_DIR"
PYTEST=${PYTEST:-.venv/bin/pytest}
export CI=${CI:-1} # the CI hypothesis profile: derandomized, so rounds differ only in timing

hogs=()
cleanup() {
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
for _ in $(seq "$HOGS"); do
  sh -c 'while :; do :; done' &
  hogs+=("$!")
done
echo "stress_suite: $ROUNDS rounds, $HOGS busy loops (pids ${hogs[*]}), logs in $LOG_DIR"

for round in $(seq "$ROUNDS"); do
  start=$(date +%s)
  if "$PYTEST" -q -p no:cacheprovider "$@" >"$LOG_DIR/round$round.log" 2>&1; then
    echo "round $round/$ROUNDS: passed in $(($(date +%s) - start)) s ($(tail -n 1 "$LOG_DIR/round$round.log"))"
  else
    rc=$?
    echo "round $round/$ROUNDS: FAILED (rc=$rc) after $(($(date +%s) - start)) s; tail of $LOG_DIR/round$round.log:"
    tail -n 40 "$LOG_DIR/round$round.log"
    exit "$rc"
  fi
done
echo "stress_suite: all $ROUNDS rounds passed"
