"""The whole tree is lint-clean with ruff (pyflakes, statement rules, sorted imports; pyproject.toml's [tool.ruff]).

`ruff check --fix .` repairs what this finds, import order included.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from repo_paths import REPO

ROOT = REPO


def test_ruff_finds_nothing_in_the_tree():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is part of the test extra (`make setup` installs it): run `make setup`"
    result = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"ruff found problems (fix with `ruff check --fix .`):\n{result.stdout[-4000:]}"
