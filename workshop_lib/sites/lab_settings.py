"""This environment's Jupyter settings: JupyterLab opens the .py chapters as notebooks (jupytext), and its
kernels do not warn about TCP on this machine's loopback.

Kernels of this environment read <prefix>/etc/ipython/ipython_kernel_config.py (IPython's per-environment
config folder). Each kernel the book build, papermill or JupyterLab starts here listens on 127.0.0.1 over TCP
and printed "Kernel is running over TCP without encryption" at every start (4 times in `make demo`'s book step),
a line its reader can do nothing about; the filter drops that one line and nothing else the kernel logs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OVERRIDES = {
    "@jupyterlab/docmanager-extension:plugin": {
        "defaultViewers": {"python": "Jupytext Notebook"},
    }
}


KERNEL_CONFIG = """\
# Written by `make setup` (workshop_lib/sites/lab_settings.py): kernels of this environment listen on this
# machine's loopback; their start-up warning about unencrypted TCP is dropped, every other log line kept.
import logging


class _NoLoopbackTcpWarning(logging.Filter):
    def filter(self, record):
        return "running over TCP without encryption" not in record.getMessage()


logging.getLogger("IPKernelApp").addFilter(_NoLoopbackTcpWarning())
"""


def install_kernel_config(prefix: Path = Path(sys.prefix)) -> Path:
    target = prefix / "etc" / "ipython" / "ipython_kernel_config.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(KERNEL_CONFIG)
    return target


def install(prefix: Path = Path(sys.prefix)) -> Path:
    """Write JupyterLab's overrides.json under PREFIX (merging with what is there)."""
    target = prefix / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(target.read_text()) if target.exists() else {}
    current.update(OVERRIDES)
    target.write_text(json.dumps(current, indent=2) + "\n")
    return target


if __name__ == "__main__":
    print(f"JupyterLab opens .py files as notebooks: {install()}")
    print(f"kernels keep quiet about loopback TCP: {install_kernel_config()}")
