#!/bin/bash
# One device session: NVML gpu_check (Python path), the Go conformance host against the
# real plugin with backend=nvml, and the GPU-marked NVML tests.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi -L | tee $OUT/nvidia-smi.txt
python3 -c "import grpc, google.protobuf, pynvml; print('grpc', grpc.__version__, 'pb', google.protobuf.__version__)"
echo "=== gpu_check"
timeout 220 python3 benchmarks/gpu_check.py --out $OUT/gpucheck --duration 30 --budget 200 --plugin-path grpc 2>&1 | tail -15
echo "=== conformance host, backend=nvml"
mkdir -p /tmp/gc && cat > /tmp/gc/nomad-device-lingjun <<W
#!/bin/sh
PYTHONPATH="$PYTHONPATH" exec python3 -m nomad_plugin "\$@"
W
chmod +x /tmp/gc/nomad-device-lingjun
printf 'plugin "nomad-device-lingjun" {\n  config {\n    backend = "nvml"\n    data_dir = "/tmp/gc/data"\n    reconcile = false\n  }\n}\n' > /tmp/gc/agent.hcl
t0=$(date +%s.%N)
timeout 120 .devcarry/conformance-host --plugin /tmp/gc/nomad-device-lingjun --config /tmp/gc/agent.hcl --phase all --duration 30 --stats-detail --reserve-count 1 --first-fp-timeout 60 > $OUT/host.jsonl 2> $OUT/host.err
echo "host rc=$?"
python3 - <<'P'
import json, os
ev=[json.loads(l) for l in open(os.environ['OUT']+'/host.jsonl') if l.startswith('{')]
for e in ev:
    k=e['event']
    if k=='fingerprint': print('FP', e['seq'], [(g['vendor'],g['type'],g['name'],[(d['id'],d['healthy'],d.get('pci_bus_id')) for d in g['devices']], g['attributes']) for g in e['groups']])
    elif k in ('reserve','violation','summary','shutdown'): print(k.upper(), json.dumps(e)[:1500])
st=[e for e in ev if e['event']=='stats']
print('STATS messages', len(st)); print('LAST STATS', json.dumps(st[-1])[:2500] if st else None)
P
echo "=== pytest -m gpu"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/nvml/test_nvml_gpu.py 2>&1 | tail -5
