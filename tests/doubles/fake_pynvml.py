"""A recorded NVML double: the ``pynvml`` functions the NVML backend uses.

An instance of ``FakeNvml`` stands in for the ``pynvml`` module. Its data is
modelled on real nodes (names, memory totals, PCI IDs, driver 550.54.15,
MIG A100 layouts as ``nvidia-smi`` shows them, GH200 and GB10 as their
``nvidia-smi -q`` shows them) and it behaves like NVML where the plugin, or
the restated nomad-device-nvidia oracle in the tests, depends on it. Each
behaviour and where it is documented:

- Calls before ``nvmlInit`` fail ``Uninitialized`` (NVML API reference,
  "Initialization and Cleanup": every call needs a prior ``nvmlInit``).
- Return shapes follow nvidia-ml-py's ``pynvml.py``: ``nvmlDeviceGetMigMode``
  gives ``[current, pending]``, the encoder/decoder utilisation calls
  ``[percent, sampling period in us]``, ``nvmlDeviceGetDetailedEccErrors`` a
  struct of ``l1Cache``/``l2Cache``/``deviceMemory``/``registerFile``,
  ``nvmlDeviceGetMemoryInfo`` ``total``/``free``/``used`` in bytes,
  ``nvmlDeviceGetPowerUsage`` milliwatts; an error is ``NVMLError`` whose
  ``value`` is the return code and whose ``str()`` is NVML's text.
- A reading a card does not have fails ``NotSupported`` (each function's
  "Return" list in the NVML API reference): scripted per card with
  ``FakeGpu.errors`` (function name -> return code), which also scripts
  other codes (``NoPermission``, ``FunctionNotFound``, ``Unknown``).
- Utilisation on a MIG-enabled card is ``NotSupported`` (NVML API reference,
  ``nvmlDeviceGetUtilizationRates``: "On MIG-enabled GPUs, querying device
  utilization rates is not currently supported"; the encoder and decoder
  calls alike).
- A MIG device handle answers its own UUID, name ("<card> MIG <profile>"),
  memory, attributes and GPU/compute instance IDs; other device queries on
  it fail ``NotSupported`` (NVML API reference, "Multi Instance GPU
  Management": MIG device handles support a subset of device queries).
  ``nvmlDeviceGetDeviceHandleFromMigDeviceHandle`` gives the parent, and
  fails ``InvalidArgument`` for a handle that is no MIG device (the code
  nomad-device-nvidia's ``nvml/driver_linux.go`` treats as "not a MIG").
- ``nvmlDeviceGetMigDeviceHandleByIndex`` fails ``NotFound`` for an empty
  slot and ``InvalidArgument`` when MIG is off (NVML API reference; both are
  the codes nomad-device-nvidia skips).
- ``nvmlDeviceGetHandleByUUID`` finds GPUs and MIG devices, else ``NotFound``.
- Unified-memory parts: GH200 and GB10 report no BAR1 (``NotSupported``;
  ``nvidia-smi -q`` shows "BAR1 Memory Usage: N/A", nomad-device-nvidia
  PR #87), GB10 no framebuffer memory and no memory clock (``NotSupported``,
  nomad-device-nvidia PR #90: "iGPU systems don't support device memory
  queries").
- A lost GPU fails every call with ``GpuIsLost``; ``nvmlEventSetWait_v2``
  blocks up to its timeout and then raises ``Timeout`` (NVML API reference,
  "Event Handling Methods").

Tests script faults with ``inject_xid``, ``inject_dbe``, ``lose_gpu``,
``fail_event_loop``; ``fake_from_spec`` builds a node from JSON (the
``FAKE_NVML_GPUS`` of tests/doubles/nvml_shim), and ``follow`` re-reads
such a JSON file when it changes, as cards come and go.
"""

from __future__ import annotations

import json
import os
import threading
import uuid as uuidlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIB = 1024 * 1024

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_UNKNOWN = 999

_ERROR_TEXT = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Like pynvml's: ``value`` is the NVML return code, ``str()`` NVML's text."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")


def _uuid(prefix: str, seed: str) -> str:
    return f"{prefix}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, seed)}"


@dataclass
class FakeMig:
    profile: str  # "1g.10gb"
    memory_total_mib: int
    gpu_instance_id: int
    compute_instance_id: int = 0
    slices: int = 1
    memory_used_mib: int = 0
    uuid: str = ""


@dataclass
class FakeGpu:
    name: str
    memory_total_mib: int
    pci_bus_id: str  # NVML form: "00000000:18:00.0"
    minor: int
    uuid: str = ""
    numa_node: int | None = None  # None: nvmlDeviceGetNumaNodeId is NotSupported
    memory_used_mib: int = 0
    util_gpu: int = 0
    util_memory: int = 0
    temperature_c: int = 34
    power_mw: int = 72_000
    power_limit_mw: int = 700_000
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    graphics_clock_mhz: int = 1980
    sm_clock_mhz: int = 1980
    memory_clock_mhz: int = 2619
    clock_event_reasons: int = 0x1  # GpuIdle
    remapped_rows: tuple[int, int] = (0, 0)
    pcie_gen: int = 5
    pcie_width: int = 16
    bar1_total_mib: int = 131072
    bar1_used_mib: int = 2
    display_mode: int = 0  # NVML_FEATURE_DISABLED: no display attached (data-centre cards)
    persistence_mode: int = 1  # NVML_FEATURE_ENABLED
    encoder_util: int = 0
    decoder_util: int = 0
    ecc_l1_corrected: int = 0
    ecc_l2_corrected: int = 0
    compute_capability: tuple[int, int] = (9, 0)
    mig_capable: bool = True
    mig_enabled: bool = False
    migs: list[FakeMig] = field(default_factory=list)
    max_mig_devices: int = 7
    events_supported: bool = True
    lost: bool = False
    ecc_register_file: int = 0
    #: NVML function name -> the return code it fails with on this card (3: NotSupported)
    errors: dict[str, int] = field(default_factory=dict)


def h100(index: int) -> FakeGpu:
    return FakeGpu(
        name="NVIDIA H100 80GB HBM3",
        memory_total_mib=81559,
        pci_bus_id=f"00000000:{0x18 + 0x11 * index:02X}:00.0",
        minor=index,
        uuid=_uuid("GPU", f"h100-{index}"),
        numa_node=None,
    )


def h200(index: int) -> FakeGpu:
    return FakeGpu(
        name="NVIDIA H200",
        memory_total_mib=143771,
        pci_bus_id=f"00000000:{0x19 + 0x20 * index:02X}:00.0",
        minor=index,
        uuid=_uuid("GPU", f"h200-{index}"),
        memory_clock_mhz=3201,
        numa_node=None,
    )


def a100_mig(index: int) -> FakeGpu:
    """An A100 80GB with MIG on and three instances (3g.40gb, 2g.20gb, 1g.10gb)."""
    gpu = FakeGpu(
        name="NVIDIA A100-SXM4-80GB",
        memory_total_mib=81920,
        pci_bus_id=f"00000000:{0x07 + 0x40 * index:02X}:00.0",
        minor=index,
        uuid=_uuid("GPU", f"a100-{index}"),
        power_limit_mw=400_000,
        graphics_clock_mhz=1410,
        sm_clock_mhz=1410,
        memory_clock_mhz=1593,
        pcie_gen=4,
        compute_capability=(8, 0),
        mig_enabled=True,
        numa_node=1,
    )
    gpu.migs = [
        FakeMig("3g.40gb", 40192, gpu_instance_id=2, slices=3, memory_used_mib=37),
        FakeMig("2g.20gb", 19968, gpu_instance_id=3, slices=2, memory_used_mib=25),
        FakeMig("1g.10gb", 9728, gpu_instance_id=9, slices=1, memory_used_mib=13),
    ]
    for mig in gpu.migs:
        mig.uuid = _uuid("MIG", f"a100-{index}-gi{mig.gpu_instance_id}")
    return gpu


def gh200(index: int) -> FakeGpu:
    """A GH200 480GB superchip's GPU: no BAR1 (nvidia-smi -q "BAR1 Memory Usage: N/A")."""
    return FakeGpu(
        name="NVIDIA GH200 480GB",
        memory_total_mib=97871,
        pci_bus_id=f"{0x0009 + index:08X}:01:00.0",
        minor=index,
        uuid=_uuid("GPU", f"gh200-{index}"),
        power_limit_mw=900_000,
        memory_clock_mhz=2619,
        errors={"nvmlDeviceGetBAR1MemoryInfo": NVML_ERROR_NOT_SUPPORTED},
        numa_node=None,
    )


def gb10() -> FakeGpu:
    """The GB10 of a DGX Spark: an iGPU on the host's memory, without BAR1 or a memory clock."""
    return FakeGpu(
        name="NVIDIA GB10",
        memory_total_mib=0,
        pci_bus_id="0000000F:01:00.0",
        minor=0,
        uuid=_uuid("GPU", "gb10-0"),
        power_mw=11_000,
        power_limit_mw=100_000,
        graphics_clock_mhz=2418,
        sm_clock_mhz=2418,
        pcie_gen=5,
        pcie_width=1,
        compute_capability=(12, 1),
        mig_capable=False,
        display_mode=1,
        errors={
            "nvmlDeviceGetMemoryInfo": NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetBAR1MemoryInfo": NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetClockInfo:2": NVML_ERROR_NOT_SUPPORTED,
        },
        numa_node=None,
    )


def l40s(index: int, ecc: bool = True) -> FakeGpu:
    """An L40S; ECC on reserves part of its memory (46068 MiB usable, 49140 MiB with ECC off)."""
    return FakeGpu(
        name="NVIDIA L40S",
        memory_total_mib=46068 if ecc else 49140,
        pci_bus_id=f"00000000:{0x41 + index:02X}:00.0",
        minor=index,
        uuid=_uuid("GPU", f"l40s-{index}"),
        power_mw=36_000,
        power_limit_mw=350_000,
        graphics_clock_mhz=2520,
        sm_clock_mhz=2520,
        memory_clock_mhz=9001,
        pcie_gen=4,
        bar1_total_mib=65536,
        compute_capability=(8, 9),
        mig_capable=False,
        numa_node=None,
    )


#: Profiles ``fake_from_spec`` knows by name (``{"profile": "h100", "index": 3, ...overrides}``).
PROFILES = {"h100": h100, "h200": h200, "a100_mig": a100_mig, "gh200": gh200, "l40s": l40s}


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _Bar1Memory:
    bar1Total: int
    bar1Free: int
    bar1Used: int


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _PciInfo:
    busId: bytes
    busIdLegacy: bytes
    domain: int
    bus: int
    device: int


@dataclass
class _Attributes:
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    memorySizeMB: int
    multiprocessorCount: int


@dataclass
class _EccCounts:
    l1Cache: int
    l2Cache: int
    deviceMemory: int
    registerFile: int


@dataclass
class EventData:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class _EventSet:
    def __init__(self) -> None:
        self.masks: dict[int, int] = {}  # id(gpu) -> event mask
        self.queue: deque[EventData] = deque()
        self.freed = False


class FakeNvml:
    """Stands in for the ``pynvml`` module; one instance = one node."""

    NVMLError = NVMLError
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_TEMPERATURE_GPU = 0
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_CLOCK_GRAPHICS = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_LOCATION_L1_CACHE = 0
    NVML_MEMORY_LOCATION_L2_CACHE = 1
    NVML_MEMORY_LOCATION_DEVICE_MEMORY = 2
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    nvmlEventTypeSingleBitEccError = 0x1
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypeXidCriticalError = 0x8
    nvmlClocksEventReasonGpuIdle = 0x1
    nvmlClocksEventReasonSwPowerCap = 0x4
    nvmlClocksEventReasonHwThermalSlowdown = 0x40

    def __init__(
        self, gpus: list[FakeGpu] | None = None, driver_version: str = "550.54.15", cuda_version: int = 12040
    ) -> None:
        self.gpus = gpus if gpus is not None else [h100(0), h200(1), a100_mig(2)]
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.init_error: int | None = None
        self.init_count = 0
        self.init_calls = 0
        self.event_failure: int | None = None
        #: when set, every call (nvmlInit included) fails with this code: driver unloaded
        self.driver_gone: int | None = None
        self.has_clock_event_reasons = True
        #: NVML function name -> the return code every call of it fails with (node-wide: system calls, enumeration)
        self.errors: dict[str, int] = {}
        self.calls: list[str] = []
        self._cond = threading.Condition()
        self._sets: list[_EventSet] = []
        self._handles: dict[tuple[int, int], _Handle] = {}

    def handle(self, gpu: FakeGpu, mig: FakeMig | None = None) -> _Handle:
        """The one handle of a GPU (or MIG device): NVML hands out stable pointers."""
        key = (id(gpu), id(mig))
        if key not in self._handles:
            self._handles[key] = _Handle(gpu, mig)
        return self._handles[key]

    # --- scripting -------------------------------------------------------------------
    def inject_xid(self, index: int, xid: int, gpu_instance: int | None = None, compute_instance: int = 0) -> int:
        """Deliver an XID event for GPU ``index``; returns how many event sets got it."""
        gi = 0xFFFFFFFF if gpu_instance is None else gpu_instance
        ci = 0xFFFFFFFF if gpu_instance is None else compute_instance
        return self._deliver(index, self.nvmlEventTypeXidCriticalError, xid, gi, ci)

    def inject_dbe(self, index: int) -> int:
        self.gpus[index].ecc_dbe += 1
        return self._deliver(index, self.nvmlEventTypeDoubleBitEccError, 0, 0xFFFFFFFF, 0xFFFFFFFF)

    def lose_gpu(self, index: int, lost: bool = True) -> None:
        """Make every call on GPU ``index`` fail with GpuIsLost (fell off the bus)."""
        self.gpus[index].lost = lost

    def fail_event_loop(self, code: int | None = NVML_ERROR_UNKNOWN) -> None:
        """Make ``nvmlEventSetWait_v2`` fail with ``code`` (None: work again)."""
        with self._cond:
            self.event_failure = code
            self._cond.notify_all()

    def registered(self, index: int) -> bool:
        gpu = self.gpus[index]
        with self._cond:
            return any(id(gpu) in s.masks and not s.freed for s in self._sets)

    def wait_registered(self, indexes: list[int], timeout: float = 5.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: all(self._registered_locked(i) for i in indexes), timeout)

    def _registered_locked(self, index: int) -> bool:
        gpu = self.gpus[index]
        return any(id(gpu) in s.masks and not s.freed for s in self._sets)

    def _deliver(self, index: int, event_type: int, data: int, gi: int, ci: int) -> int:
        gpu = self.gpus[index]
        delivered = 0
        with self._cond:
            for event_set in self._sets:
                if not event_set.freed and event_set.masks.get(id(gpu), 0) & event_type:
                    event_set.queue.append(EventData(self.handle(gpu), event_type, data, gi, ci))
                    delivered += 1
            self._cond.notify_all()
        return delivered

    # --- helpers --------------------------------------------------------------------------
    def _check(self, name: str) -> None:
        self.calls.append(name)
        if self.driver_gone is not None:
            raise NVMLError(self.driver_gone)
        if self.init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if name in self.errors:
            raise NVMLError(self.errors[name])

    def _gpu(self, name: str, handle: _Handle, mig_ok: bool = False, arg: object = None) -> FakeGpu:
        """The card behind ``handle``, or the NVMLError this call gets on it.

        ``FakeGpu.errors`` is keyed by function name, or ``name:arg`` for one
        argument value (``nvmlDeviceGetClockInfo:2``: the memory clock only).
        """
        self._check(name)
        if not isinstance(handle, _Handle):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if handle.gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if handle.mig is not None and not mig_ok:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        code = handle.gpu.errors.get(f"{name}:{arg}") if arg is not None else None
        if code is None:
            code = handle.gpu.errors.get(name)
        if code is not None:
            raise NVMLError(code)
        return handle.gpu

    # --- init / system ------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None or self.driver_gone is not None:
            raise NVMLError(self.init_error or self.driver_gone or NVML_ERROR_UNKNOWN)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    # --- enumeration ------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.handle(self.gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        self._check("nvmlDeviceGetHandleByUUID")
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            if gpu.uuid == wanted:
                return self.handle(gpu)
            for mig in gpu.migs if gpu.mig_enabled else ():
                if mig.uuid == wanted:
                    return self.handle(gpu, mig)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        gpu = self._gpu("nvmlDeviceGetUUID", handle, mig_ok=True)
        return handle.mig.uuid if handle.mig else gpu.uuid

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetMinorNumber", handle).minor

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        gpu = self._gpu("nvmlDeviceGetName", handle, mig_ok=True)
        return f"{gpu.name} MIG {handle.mig.profile}" if handle.mig else gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> _Memory:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle, mig_ok=True)
        total, used = (
            (handle.mig.memory_total_mib, handle.mig.memory_used_mib)
            if handle.mig
            else (gpu.memory_total_mib, gpu.memory_used_mib)
        )
        return _Memory(total=total * MIB, free=(total - used) * MIB, used=used * MIB)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _PciInfo:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        domain, bus, rest = gpu.pci_bus_id.split(":")
        return _PciInfo(
            busId=gpu.pci_bus_id.encode(),
            busIdLegacy=gpu.pci_bus_id[4:].encode(),
            domain=int(domain, 16),
            bus=int(bus, 16),
            device=int(rest.split(".")[0], 16),
        )

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetNumaNodeId", handle)
        if gpu.numa_node is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa_node

    # --- static facts -------------------------------------------------------------------------
    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle, arg=clock)
        return {0: gpu.graphics_clock_mhz, 1: gpu.sm_clock_mhz, 2: gpu.memory_clock_mhz}[clock]

    def nvmlDeviceGetPowerManagementLimit(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementLimit", handle).power_limit_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie_width

    def nvmlDeviceGetBAR1MemoryInfo(self, handle: _Handle) -> _Bar1Memory:
        gpu = self._gpu("nvmlDeviceGetBAR1MemoryInfo", handle)
        total, used = gpu.bar1_total_mib * MIB, gpu.bar1_used_mib * MIB
        return _Bar1Memory(bar1Total=total, bar1Free=total - used, bar1Used=used)

    def nvmlDeviceGetDisplayMode(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetDisplayMode", handle).display_mode

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPersistenceMode", handle).persistence_mode

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        return self._gpu("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    # --- MIG ----------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = self.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else self.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        return gpu.max_mig_devices if gpu.mig_capable else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.migs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self.handle(gpu, gpu.migs[index])

    def nvmlDeviceIsMigDeviceHandle(self, handle: _Handle) -> int:
        self._gpu("nvmlDeviceIsMigDeviceHandle", handle, mig_ok=True)
        return 1 if handle.mig is not None else 0

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: _Handle) -> _Handle:
        gpu = self._gpu("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle, mig_ok=True)
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.handle(gpu)

    def nvmlDeviceGetAttributes(self, handle: _Handle) -> _Attributes:
        self._gpu("nvmlDeviceGetAttributes", handle, mig_ok=True)
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mig = handle.mig
        return _Attributes(mig.slices, mig.slices, mig.memory_total_mib, 14 * mig.slices)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._gpu("nvmlDeviceGetGpuInstanceId", handle, mig_ok=True)
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        self._gpu("nvmlDeviceGetComputeInstanceId", handle, mig_ok=True)
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.compute_instance_id

    # --- readings -------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Utilization:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        if gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _Utilization(gpu.util_gpu, gpu.util_memory)

    def nvmlDeviceGetEncoderUtilization(self, handle: _Handle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetEncoderUtilization", handle)
        if gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.encoder_util, 167000]  # [percent, sampling period in us]

    def nvmlDeviceGetDecoderUtilization(self, handle: _Handle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetDecoderUtilization", handle)
        if gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.decoder_util, 167000]

    def nvmlDeviceGetMemoryErrorCounter(
        self, handle: _Handle, error_type: int, counter_type: int, location: int
    ) -> int:
        gpu = self._gpu("nvmlDeviceGetMemoryErrorCounter", handle, arg=location)
        corrected = error_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED
        by_location = {
            self.NVML_MEMORY_LOCATION_L1_CACHE: gpu.ecc_l1_corrected if corrected else 0,
            self.NVML_MEMORY_LOCATION_L2_CACHE: gpu.ecc_l2_corrected if corrected else 0,
            self.NVML_MEMORY_LOCATION_DEVICE_MEMORY: gpu.ecc_sbe if corrected else gpu.ecc_dbe,
        }
        if location not in by_location:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return by_location[location]

    def nvmlDeviceGetDetailedEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> _EccCounts:
        """Deprecated in NVML (nvidia-ml-py: "use nvmlDeviceGetMemoryErrorCounter instead")."""
        gpu = self._gpu("nvmlDeviceGetDetailedEccErrors", handle)
        if error_type != self.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return _EccCounts(0, 0, gpu.ecc_dbe, 0)
        return _EccCounts(gpu.ecc_l1_corrected, gpu.ecc_l2_corrected, gpu.ecc_sbe, gpu.ecc_register_file)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", handle).temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        return gpu.ecc_sbe if error_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else gpu.ecc_dbe

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_event_reasons

    def __getattr__(self, name: str) -> Any:
        # Older drivers/bindings lack the "EventReasons" spelling; tests switch it off.
        if name == "nvmlDeviceGetCurrentClocksEventReasons" and self.__dict__.get("has_clock_event_reasons"):
            return self._clock_event_reasons
        raise AttributeError(name)

    def _clock_event_reasons(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_event_reasons

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        gpu = self._gpu("nvmlDeviceGetRemappedRows", handle)
        return (gpu.remapped_rows[0], gpu.remapped_rows[1], 0, 0)

    # --- events -----------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> _EventSet:
        self._check("nvmlEventSetCreate")
        event_set = _EventSet()
        with self._cond:
            self._sets.append(event_set)
        return event_set

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._check("nvmlEventSetFree")
        with self._cond:
            event_set.freed = True
            self._cond.notify_all()

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetSupportedEventTypes", handle)
        if not gpu.events_supported:
            return 0
        return self.nvmlEventTypeSingleBitEccError | self.nvmlEventTypeDoubleBitEccError | 0x4 | 0x8 | 0x10

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: _EventSet) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if not gpu.events_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        with self._cond:
            event_set.masks[id(gpu)] = event_set.masks.get(id(gpu), 0) | int(event_types)
            self._cond.notify_all()

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> EventData:
        self._check("nvmlEventSetWait_v2")
        with self._cond:
            ready = self._cond.wait_for(
                lambda: (
                    bool(event_set.queue)
                    or self.event_failure is not None
                    or self.driver_gone is not None
                    or event_set.freed
                ),
                timeout_ms / 1000.0,
            )
            if self.event_failure is not None:
                raise NVMLError(self.event_failure)
            if self.driver_gone is not None:
                raise NVMLError(self.driver_gone)
            if not ready or not event_set.queue:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            return event_set.queue.popleft()


# --- nodes from JSON ------------------------------------------------------------------------------

_TUPLES = ("compute_capability", "remapped_rows")


def gpu_from_spec(spec: dict[str, Any]) -> FakeGpu:
    """One ``FakeGpu`` from JSON: a profile (``"profile": "h100", "index": 0``) and/or fields.

    ``migs`` is a list of ``FakeMig`` fields; lists stand for tuples where a field is one.
    """
    fields = dict(spec)
    profile = fields.pop("profile", None)
    index = int(fields.pop("index", 0))
    migs = [FakeMig(**m) for m in fields.pop("migs", [])]
    for name in _TUPLES:
        if name in fields:
            fields[name] = tuple(fields[name])
    if profile is None:
        gpu = FakeGpu(**fields)
    else:
        made = PROFILES[profile](index) if profile != "gb10" else gb10()
        for name, value in fields.items():
            if not hasattr(made, name):
                raise TypeError(f"FakeGpu has no field {name!r}")
            setattr(made, name, value)
        gpu = made
    if migs or "migs" in spec:
        gpu.migs = migs
    return gpu


def fake_from_spec(spec: dict[str, Any] | list[dict[str, Any]]) -> FakeNvml:
    """A node from JSON: a list of GPUs, or ``{"gpus": [...], "driver_version", "init_error", "errors"}``."""
    node: dict[str, Any] = {"gpus": spec} if isinstance(spec, list) else dict(spec)
    fake = FakeNvml(
        [gpu_from_spec(g) for g in node.get("gpus", [])],
        driver_version=str(node.get("driver_version", "550.54.15")),
        cuda_version=int(node.get("cuda_version", 12040)),
    )
    if node.get("init_error") is not None:
        fake.init_error = int(node["init_error"])
    fake.errors = {str(k): int(v) for k, v in node.get("errors", {}).items()}
    return fake


def follow(fake: FakeNvml, path: str | Path) -> None:
    """Re-read the node's GPUs from the JSON file at ``path`` whenever it changes.

    Checked on every ``nvmlDeviceGetCount``, where an enumeration starts: cards
    that left are no longer counted, new ones are, as after a hot-plug or a
    MIG reconfiguration. Handles given out earlier keep answering for the card
    they named.
    """
    seen: list[int] = [-1]
    counted = fake.nvmlDeviceGetCount

    def count() -> int:
        try:
            stamp = os.stat(path).st_mtime_ns
        except OSError:
            stamp = seen[0]
        if stamp != seen[0]:
            seen[0] = stamp
            spec = json.loads(Path(path).read_text())
            fake.gpus = fake_from_spec(spec).gpus
        return counted()

    fake.nvmlDeviceGetCount = count  # type: ignore[method-assign]


# --- fake host files ------------------------------------------------------------------------------


def write_sysfs_numa(sysfs_root: str | Path, bus_id: str, node: int) -> Path:
    """Write ``<root>/bus/pci/devices/<bus_id>/numa_node`` as the kernel shows it."""
    path = Path(sysfs_root) / "bus" / "pci" / "devices" / bus_id / "numa_node"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{node}\n")
    return path


def write_mig_caps(proc_root: str | Path, fake: FakeNvml) -> dict[str, tuple[int, int]]:
    """Write the MIG capability ``access`` files for every MIG instance in ``fake``.

    Returns MIG UUID -> (GPU-instance cap minor, compute-instance cap minor).
    The files look like the driver's: ``DeviceFileMinor``, ``DeviceFileMode``,
    ``DeviceFileModify`` lines.
    """
    minors: dict[str, tuple[int, int]] = {}
    base = Path(proc_root) / "driver" / "nvidia" / "capabilities"
    for gpu in fake.gpus:
        for mig in gpu.migs:
            gi_minor = 10 + gpu.minor * 200 + mig.gpu_instance_id * 10
            ci_minor = gi_minor + 1 + mig.compute_instance_id
            gi_dir = base / f"gpu{gpu.minor}" / "mig" / f"gi{mig.gpu_instance_id}"
            ci_dir = gi_dir / f"ci{mig.compute_instance_id}"
            ci_dir.mkdir(parents=True, exist_ok=True)
            for directory, minor in ((gi_dir, gi_minor), (ci_dir, ci_minor)):
                (directory / "access").write_text(
                    f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
                )
            minors[mig.uuid] = (gi_minor, ci_minor)
    return minors
