"""Make JupyterLab open the .py chapters as notebooks (jupytext), for this environment only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

OVERRIDES = {
    "@jupyterlab/docmanager-extension:plugin": {
        "defaultViewers": {"python": "Jupytext Notebook"},
    }
}


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
