"""Test shim: the real plugin process imports this as ``pynvml``.

Put this directory first on the plugin's PYTHONPATH and describe the node's
GPUs in ``FAKE_NVML_GPUS`` (a JSON list of ``FakeGpu`` keyword arguments);
the import then yields a ``FakeNvml`` (nomad_plugin/testing/fake_pynvml.py)
in place of NVIDIA's bindings, so production code paths that need NVML
(backend "auto", NVML enrichment) run unchanged inside the real executable.
``FAKE_NVML_INIT_ERROR`` (an NVML return code) makes ``nvmlInit`` fail, as on
a node whose driver is not loaded.
"""

import json
import os
import sys

from nomad_plugin.testing.fake_pynvml import FakeGpu, FakeNvml

_fake = FakeNvml([FakeGpu(**gpu) for gpu in json.loads(os.environ.get("FAKE_NVML_GPUS", "[]"))])
if os.environ.get("FAKE_NVML_INIT_ERROR"):
    _fake.init_error = int(os.environ["FAKE_NVML_INIT_ERROR"])
sys.modules[__name__] = _fake
