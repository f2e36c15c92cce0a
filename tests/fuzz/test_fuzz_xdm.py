"""XDM responses: random bytes and mutated valid encodings through the adapter's deserialisers and mappers.

Only DecodeError may come out of a deserialiser (gRPC reports it as an
INTERNAL status the client classifies); the mappers never raise on a parsed
message; an AllocateResponse never yields a grant that is handed to a task
unless it matches the request and carries clean paths.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nomad_plugin._proto.lingjun import api_outer_pb2 as pb
from nomad_plugin._proto.lingjun import config_service_pb2 as cpb
from tests.fuzz.checks import MAPPERS, check_allocate_response, check_xdm_response, valid_allocate_response
from tests.fuzz.strategies import DEADLINE, EXAMPLES, mutated

VALID = {
    "ListSupportedXPUType": pb.XPUTypeResponse(xpuTypes=["nvidia", "ppu"]),
    "ListAndWatch": pb.ListAndWatchResponse(
        devices=[
            pb.Device(
                minor=0,
                uuid="GPU-0",
                model="NVIDIA H800",
                xpuType="nvidia",
                health="Healthy",
                totalMemory=81559,
                totalCore=100,
                pciBusId="0000:18:00.0",
                extenderResources={"topology": '{"numaNodes": [{"id": 0, "devices": [0]}]}'},
            )
        ]
    ),
    "ListGpuInfo": pb.ListGpuInfoResponse(gpuInfos=[pb.GpuInfo(minor=0, uuid="GPU-0", totalMemory=81559, numaNode=1)]),
    "ExporterGetDataList": pb.ExporterDataResponse(
        dataList=[pb.MetricData(device="0", metricId=1, value=42.5, timestamp=1, labels={"a": "b"})]
    ),
    "ExporterGetConfig": pb.ExporterGetConfigResponse(collectIntervalMs=1000, metricIds=[1, 2]),
    "ExporterGetStatus": pb.ExporterGetStatusResponse(running=True, state="running"),
    "QueryStatus": cpb.QueryStatusResponse(enabled=True),
    "Release": pb.ReleaseResponse(status=0),
}
METHODS = sorted(MAPPERS)


@pytest.mark.parametrize("method", METHODS)
def test_every_response_type_survives_random_bytes(method):
    @settings(max_examples=EXAMPLES // 3, deadline=DEADLINE)
    @given(st.binary(max_size=200))
    def run(data):
        check_xdm_response(method, data)

    run()


@pytest.mark.parametrize("method", METHODS)
def test_every_response_type_survives_mutation(method):
    seed = VALID[method].SerializeToString()

    @settings(max_examples=EXAMPLES // 3, deadline=DEADLINE)
    @given(mutated(seed))
    def run(data):
        check_xdm_response(method, data)

    run()


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(mutated(valid_allocate_response()))
def test_mutated_allocate_response_never_hands_out_a_bad_grant(data):
    check_allocate_response(data)


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(st.binary(max_size=200))
@example(b"")  # zero bytes = "success" in any message (R3): no evidence -> mismatch
def test_random_allocate_response(data):
    assert check_allocate_response(data) in ("undecodable", "refused", "mismatch", "rejected", "granted")


_paths = st.one_of(
    st.sampled_from(["/dev/nvidia0", "/dev/../etc/shadow", "dev/nvidia0", "/etc/passwd", "//dev/x", "/dev/./x", "/"]),
    st.text(max_size=30),
)


@settings(max_examples=EXAMPLES, deadline=DEADLINE)
@given(_paths, _paths, _paths, _paths, st.text(max_size=5), st.dictionaries(st.text(max_size=12), st.text(max_size=12)))
def test_crafted_allocate_paths_and_envs(node_host, node_task, mount_host, mount_task, perms, envs):
    base = pb.AllocateResponse.FromString(valid_allocate_response())
    del base.deviceSpecs[:]
    base.deviceSpecs.add(containerPath=node_task, hostPath=node_host, permissions=perms)
    del base.mounts[:]
    base.mounts.add(containerPath=mount_task, hostPath=mount_host)
    base.envs.clear()
    base.envs.update(envs)
    check_allocate_response(base.SerializeToString())
