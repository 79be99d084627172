"""This environment's kernels start without the unencrypted-TCP warning (issue 41, item 6), and log the rest.

A real kernel is started with the config `make setup` writes (workshop_lib.sites.lab_settings), placed in a
throwaway IPython profile so the test leaves the environment alone; its own stderr is what the book build prints.
"""

from __future__ import annotations

import os
import sys

from jupyter_client.manager import KernelManager

from workshop_lib.sites.lab_settings import KERNEL_CONFIG, install_kernel_config

WARNING = "running over TCP without encryption"


def _kernel_stderr(tmp_path, config: str) -> str:
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    # The config under test, and one warning of the kernel's own logger that must still come through.
    (profile / "ipython_kernel_config.py").write_text(
        config + '\nlogging.getLogger("IPKernelApp").warning("workshop: another warning")\n')
    stderr = tmp_path / "kernel.err"
    manager = KernelManager(kernel_cmd=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    with stderr.open("w") as sink:
        manager.start_kernel(stderr=sink, env={**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")})
        client = manager.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=120)
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    return stderr.read_text()


def test_without_the_filter_the_kernel_warns(tmp_path):
    # The profile's config runs after the environment's (which `make setup` wrote): it takes the filter off again.
    unfiltered = 'import logging\nlogging.getLogger("IPKernelApp").filters.clear()\n'
    assert WARNING in _kernel_stderr(tmp_path, unfiltered)


def test_with_it_that_line_is_gone_and_other_warnings_stay(tmp_path):
    err = _kernel_stderr(tmp_path, KERNEL_CONFIG)
    assert WARNING not in err
    assert "workshop: another warning" in err


def test_setup_writes_it_into_the_environment(tmp_path):
    written = install_kernel_config(tmp_path)
    assert written == tmp_path / "etc" / "ipython" / "ipython_kernel_config.py"
    assert written.read_text() == KERNEL_CONFIG
