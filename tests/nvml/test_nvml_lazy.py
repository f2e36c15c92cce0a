"""pynvml is optional: importing the backend must not import it; using it must."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nomad_plugin.nvml.lib import nvml_available, nvml_unavailable_reason
from tests.doubles.fake_pynvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeNvml

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_importing_the_nvml_package_does_not_import_pynvml() -> None:
    proc = _run(
        """
        import sys
        import nomad_plugin.nvml.backend, nomad_plugin.nvml.companion, nomad_plugin.nvml.lib
        from nomad_plugin.nvml.backend import NvmlBackend
        backend = NvmlBackend()
        print("pynvml" in sys.modules)
        backend.start()
        backend.wait_ready(0.5)
        import time
        deadline = time.time() + 10
        while "pynvml" not in sys.modules and time.time() < deadline:
            time.sleep(0.01)
        print("pynvml" in sys.modules)
        backend.stop()
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


def test_missing_bindings_give_an_install_hint() -> None:
    proc = _run(
        """
        import sys
        sys.modules["pynvml"] = None  # as if nvidia-ml-py were not installed
        from nomad_plugin.nvml.lib import nvml_unavailable_reason
        print(nvml_unavailable_reason())
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "nvidia-ml-py" in proc.stdout


def test_probe_with_fake() -> None:
    fake = FakeNvml()
    assert nvml_available(fake) and fake.init_count == 0  # initialised, then shut down again
    fake.init_error = NVML_ERROR_LIBRARY_NOT_FOUND
    assert not nvml_available(fake)
    assert "nvmlInit failed: NVML Shared Library Not Found" in nvml_unavailable_reason(fake)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this node has an NVIDIA driver")
def test_probe_on_a_node_without_nvidia_driver() -> None:
    assert nvml_available() is False
    assert nvml_unavailable_reason() != ""


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this node has an NVIDIA driver")
def test_without_the_nvml_library_the_probe_leaves_the_bindings_unimported() -> None:
    proc = _run(
        """
        import sys
        from nomad_plugin.nvml.lib import nvml_unavailable_reason
        print(nvml_unavailable_reason())
        print("pynvml" in sys.modules)
        """
    )
    assert proc.returncode == 0, proc.stderr
    reason, imported = proc.stdout.strip().splitlines()
    assert reason.startswith("NVML Shared Library Not Found (libnvidia-ml.so.1"), reason
    assert imported == "False"


def test_once_the_library_opens_the_probe_imports_the_bindings_and_initialises() -> None:
    # libc stands in for libnvidia-ml.so.1: the pre-check passes, so pynvml is imported and
    # nvmlInit runs, and fails on this node in pynvml's own words; where a driver is installed
    # the same code finds NVML usable.
    proc = _run(
        """
        import sys
        from nomad_plugin.nvml import lib
        from nomad_plugin.nvml.lib import nvml_unavailable_reason
        lib.NVML_LIBRARY = "libc.so.6"
        print(repr(nvml_unavailable_reason()))
        print("pynvml" in sys.modules)
        """
    )
    assert proc.returncode == 0, proc.stderr
    reason, imported = proc.stdout.strip().splitlines()
    assert imported == "True"
    if shutil.which("nvidia-smi") is None:
        assert reason.startswith("'nvmlInit failed:"), reason
