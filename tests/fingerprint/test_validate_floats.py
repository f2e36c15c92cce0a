"""Non-finite float attributes never reach Nomad: NaN, +inf and -inf alike.

A constraint like ``${device.attr.power} < 500`` cannot be judged against
an infinite value; the attribute is removed and reported, the rest of the
group stays.
"""

from __future__ import annotations

import math

import pytest

from nomad_plugin._proto.nomad import attribute_pb2, device_pb2
from nomad_plugin.nomad.fingerprint import attribute_problem, sanitize


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_float_is_a_problem(value):
    problem = attribute_problem("power", attribute_pb2.Attribute(float_val=value, unit="W"))
    assert problem is not None and "non-finite" in problem and "power" in problem


@pytest.mark.parametrize("value", [0.0, -1.5, 1e308, -1e308, 5e-324])
def test_finite_floats_are_fine(value):
    assert attribute_problem("power", attribute_pb2.Attribute(float_val=value, unit="W")) is None


@pytest.mark.parametrize("value", [math.inf, -math.inf])
def test_sanitize_drops_only_the_infinite_attribute(value):
    group = device_pb2.DeviceGroup(vendor="nvidia", device_type="gpu", device_name="H800")
    group.devices.add(ID="GPU-0", healthy=True)
    group.attributes["power"].CopyFrom(attribute_pb2.Attribute(float_val=value, unit="W"))
    group.attributes["memory"].CopyFrom(attribute_pb2.Attribute(int_val=80, unit="GiB"))
    cleaned, found = sanitize(device_pb2.FingerprintResponse(device_group=[group]))
    assert len(found) == 1 and "power" in found[0], found
    (out,) = cleaned.device_group
    assert set(out.attributes) == {"memory"} and [d.ID for d in out.devices] == ["GPU-0"]
