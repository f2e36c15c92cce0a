"""Metric samples from XDM's exporter (or NVML), as plain data."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

NO_LABELS: Mapping[str, str] = MappingProxyType({})


class MetricSample(NamedTuple):
    """One reading: ``device`` is the card minor or UUID as XDM reports it, ``labels`` may carry a
    grant's allocation id. A named tuple: hundreds arrive every second."""

    device: str
    metric_id: int
    name: str
    value: float
    timestamp_ms: int
    labels: Mapping[str, str] = NO_LABELS


# The metric catalogue. XDM's real metric IDs are unknown (the reference's
# tables were lost); these IDs are the reconstruction's GUESS and the
# simulator serves exactly these. Names are what every other layer uses.
METRIC_NAMES: dict[int, str] = {
    1: "core_util_percent",
    2: "memory_used_mib",
    3: "memory_total_mib",
    4: "temperature_c",
    5: "power_w",
    6: "health",
    7: "xid_errors",
    8: "power_limit_w",
    9: "memory_util_percent",
    10: "ecc_sbe_total",
    11: "ecc_dbe_total",
    12: "sm_clock_mhz",
    13: "memory_clock_mhz",
    14: "nvlink_errors_total",
    15: "throttle_reasons",
    16: "remapped_rows_total",
}
# NVML-only readings (the NVML backend, or NVML as the stats fallback): not in
# the XDM catalogue guess above (the simulator serves only that); they fill
# nomad-device-nvidia's encoder/decoder, BAR1 and per-location ECC stats.
NVML_METRIC_NAMES: dict[int, str] = {
    101: "encoder_util_percent",
    102: "decoder_util_percent",
    103: "bar1_used_mib",
    104: "bar1_total_mib",
    105: "ecc_l1_corrected",
    106: "ecc_l2_corrected",
    107: "ecc_memory_corrected",
    # Which official readings NVML answered NotSupported for, as a bit mask of
    # UNSUPPORTED_BITS: nomad-device-nvidia shows those as 0, the stats layout too.
    108: "nvml_unsupported",
}
#: Bits of ``nvml_unsupported``, by the reading NVML does not support on the card.
UNSUPPORTED_BITS: dict[str, int] = {
    "temperature_c": 0x1,
    "power_w": 0x2,
    "ecc_l1_corrected": 0x4,
    "ecc_l2_corrected": 0x8,
    "ecc_memory_corrected": 0x10,
}
ALL_METRIC_NAMES: dict[int, str] = {**METRIC_NAMES, **NVML_METRIC_NAMES}
METRIC_IDS: dict[str, int] = {name: mid for mid, name in ALL_METRIC_NAMES.items()}
# Label on per-grant samples (shares and MIG units) naming XDM's allocation id.
GRANT_LABEL = "allocation_id"
