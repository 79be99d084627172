"""The kernels that execute the chapters on this machine talk over IPC sockets, never TCP.

papermill (`make demo`, the tests) and the book build (jupyter-book -> myst-nb -> jupyter-cache -> nbclient) start
a kernel per chapter. Over TCP, ipykernel warns at each start that the connection is unencrypted, a line a
reader of `make demo` can do nothing about (it printed 4 times in the book step). Over IPC (files in the
runtime folder, readable by this user only) nothing is exposed on the network and there is nothing to warn
about. Not used by the book build: there jupyter-cache starts the kernel in the notebook's folder, where the
IPC kernel did not answer within 60 s when a cell failed (the build then reported that instead of the cell's
error, tests/test_book_config.py); the book build's kernels keep TCP (on the loopback), and the environment's
kernel config drops their warning (workshop_lib.sites.lab_settings, written by `make setup`).
"""

from __future__ import annotations


def local_kernel_manager():
    """A Jupyter kernel manager whose kernels listen on IPC sockets."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import CaselessStrEnum

    class LocalKernelManager(AsyncKernelManager):
        transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

    return LocalKernelManager

