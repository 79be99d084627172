"""The kernels that execute the chapters on this machine talk over IPC sockets, never TCP.

papermill (`make demo`, the tests) and the book build (jupyter-book -> myst-nb -> jupyter-cache -> nbclient) start
a kernel per chapter. Over TCP, ipykernel warns at each start that the connection is unencrypted, a line a
reader of `make demo` can do nothing about (it printed 4 times in the book step). Over IPC (files in the
runtime folder, readable by this user only) nothing is exposed on the network and there is nothing to warn
about. As a Sphinx extension (_config.yml: sphinx.extra_extensions) this module makes the book build's
executions use that kernel manager too.
"""

from __future__ import annotations

import functools


def local_kernel_manager():
    """A Jupyter kernel manager whose kernels listen on IPC sockets."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import CaselessStrEnum

    class LocalKernelManager(AsyncKernelManager):
        transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

    return LocalKernelManager


def setup(app) -> dict:
    # jupyter-cache runs each notebook with nbclient's `execute` and no kernel manager of its own, and neither
    # myst-nb nor jupyter-book has a setting for one: its `executenb` gets ours as the default.
    from jupyter_cache.executors import utils

    if not isinstance(utils.executenb, functools.partial):
        utils.executenb = functools.partial(utils.executenb, kernel_manager_class=local_kernel_manager())
    return {"parallel_read_safe": True, "parallel_write_safe": True}
