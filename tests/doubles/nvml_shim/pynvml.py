"""Test shim: the real plugin process imports this as ``pynvml``.

Put this directory first on the plugin's PYTHONPATH and describe the node's
GPUs in ``FAKE_NVML_GPUS`` (JSON: a list of GPUs, or an object with ``gpus``,
``driver_version``, ``init_error``; see ``fake_from_spec`` in
tests/doubles/fake_pynvml.py), or in the file ``FAKE_NVML_GPUS_FILE``
names, which is re-read whenever it changes (cards coming and going). The
import then yields a ``FakeNvml`` in place of NVIDIA's bindings, so production
code paths that need NVML (backend "nvml" or "auto", NVML enrichment) run
unchanged inside the real executable.

``FAKE_NVML_INIT_ERROR`` (an NVML return code) makes ``nvmlInit`` fail, as on
a node whose driver is not loaded. ``FAKE_NVML_PROC_ROOT`` points the NVML
backend's reading of the MIG capability files
(``<root>/driver/nvidia/capabilities/...``) at a test directory.
"""

import json
import os
import sys

from tests.doubles.fake_pynvml import fake_from_spec, follow

_file = os.environ.get("FAKE_NVML_GPUS_FILE")
if _file:
    with open(_file) as _f:
        _fake = fake_from_spec(json.load(_f))
    follow(_fake, _file)
else:
    _fake = fake_from_spec(json.loads(os.environ.get("FAKE_NVML_GPUS", "[]")))
if os.environ.get("FAKE_NVML_INIT_ERROR"):
    _fake.init_error = int(os.environ["FAKE_NVML_INIT_ERROR"])
if os.environ.get("FAKE_NVML_PROC_ROOT"):
    from nomad_plugin.nvml import backend as _backend

    _backend.PROC_ROOT = os.environ["FAKE_NVML_PROC_ROOT"]
sys.modules[__name__] = _fake
