#!/bin/bash
# One device session on a machine with a real NVIDIA GPU (the device tool's `run`; see
# BENCHMARKS.md "GPU check"). What CI cannot run, because CI has no GPU:
#   1. the SHIPPED executable (dist/nomad-device-lingjun) with backend = "nvml" and "auto",
#      under the Go conformance host, launched with no Python reachable (as test_dist does);
#   2. XDM with NVML enrichment from real NVML: the simulator's --nvml-mirror presents the
#      real cards as an XDM node and the shipped executable serves them (backend = "xdm");
#   3. `doctor` and `check-job` of the shipped executable against the real cards, for every
#      job in tests/operator/official_jobs/ (jobs written for hashicorp/nomad-device-nvidia);
#   4. the drop-in comparison with the restated nomad-device-nvidia on the real NVML
#      (benchmarks/dropin_compare.py: what the NVML double could not predict);
#   5. the GPU-marked pytest tests (tests/nvml, tests/sim/test_nvml_mirror.py).
# Needs: .devcarry/conformance-host (tests/conformance/bin/conformance-host built here),
# dist/ (make dist) and .whl/ (wheels the device's Python lacks). Writes its evidence to $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD
HOST=$PWD/.devcarry/conformance-host
E=/tmp/evidence # everything lands here; $OUT gets the log and one tarball of it
mkdir -p $E
nvidia-smi -L | tee "$E/nvidia-smi.txt"
getconf GNU_LIBC_VERSION
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

# An empty directory as PATH: the executable's launcher needs no tool, and no python can be found.
np=/tmp/np
mkdir -p $np/bin $np/empty $np/home
cp dist/nomad-device-lingjun $np/nomad-device-lingjun
TIMEOUT=$(command -v timeout)
nopy() {
  env -i PATH=$np/bin PYTHONHOME=$np/empty PYTHONPATH=$np/empty HOME=$np/home LANG=C.UTF-8 \
    LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" "$@"
}
block() { # name backend extra-lines
  printf 'plugin "nomad-device-lingjun" {\n  config {\n    backend = "%s"\n    data_dir = "%s/data-%s"\n    reconcile = false\n%b  }\n}\n' \
    "$2" $np "$1" "$3" >$np/$1.hcl
}
host() { # name
  local t0=$(date +%s%N)
  nopy "$TIMEOUT" 150 "$HOST" --plugin $np/nomad-device-lingjun --config $np/$1.hcl --phase all --duration 15 \
    --stats-detail --reserve-count 1 --first-fp-timeout 90 >"$E/host-$1.jsonl" 2>"$E/host-$1.err"
  echo "=== host $1: rc=$? in $((($(date +%s%N) - t0) / 1000000)) ms"
  python3 benchmarks/device_summary.py "$E/host-$1.jsonl"
}

echo "=== the shipped executable's bundle line and --self-check (ssl, ctypes, NVML bindings, zlib), no Python reachable"
tail -n 1 $np/nomad-device-lingjun
nopy "$TIMEOUT" 60 $np/nomad-device-lingjun --self-check

block nvml nvml ""
block auto auto ""
host nvml
host auto

echo "=== XDM simulator mirroring the real GPU, served by the shipped executable with NVML enrichment"
mkdir -p /tmp/xs
python3 -m nomad_plugin.cli.main xdm-sim --nvml-mirror --socket-dir /tmp/xs >"$E/sim.log" 2>&1 &
sim=$!
for _ in $(seq 100); do [ -S /tmp/xs/dp2mgr.sock ] && break; sleep 0.1; done
block xdm xdm "    xdm_socket = \"/tmp/xs/dp2mgr.sock\"\n    config_socket = \"/tmp/xs/config-daemon.sock\"\n    nvml_enrich = true\n"
host xdm
kill $sim; wait $sim 2>/dev/null

echo "=== doctor (shipped executable, backend = nvml)"
nopy "$TIMEOUT" 60 $np/nomad-device-lingjun doctor --set backend=nvml --set data_dir=$np/data-doctor 2>&1 | tail -25
echo "=== check-job, official plugin's jobs, against the real cards"
for job in tests/operator/official_jobs/*; do
  nopy "$TIMEOUT" 90 $np/nomad-device-lingjun check-job --set backend=nvml --set data_dir=$np/data-cj "$PWD/$job" >"$E/cj-$(basename "$job").txt" 2>&1
  rc=$?
  echo "$(basename "$job"): exit $rc | $(grep -m1 -i -E 'placed|cannot|error' "$E/cj-$(basename "$job").txt")"
done

echo "=== nomad-device-nvidia restated, against the shipped executable, on the real NVML (docs/nvidia-dropin.md)"
timeout 120 python3 benchmarks/dropin_compare.py --host "$HOST" --plugin $np/nomad-device-lingjun --out "$E" 2>&1 | tail -40

echo "=== pytest (GPU-marked and NVML tests)"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/nvml tests/sim/test_nvml_mirror.py 2>&1 | tail -12
tar -C /tmp -czf "$OUT/evidence.tgz" evidence
