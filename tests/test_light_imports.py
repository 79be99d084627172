"""The light entry points stay light: building the `workshop` parser, or importing any log parser, loads neither
pandas nor jinja2 nor yaml (nor torch). Every job's footer and every `workshop` command start with them, and
each of those libraries costs a second or more of CPU at start; a package face (`__init__.py`) that re-exports
eagerly is the usual culprit: make it import lazily (module `__getattr__`, as results/__init__.py does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from repo_paths import REPO

ROOT = REPO
HEAVY = ("pandas", "jinja2", "yaml", "torch")
LOG_PARSERS = sorted(f"workshop_lib.results.parse.{path.stem}"
                     for path in (ROOT / "workshop_lib" / "results" / "parse").glob("*.py") if path.stem != "__init__")


def _heavy_modules_loaded_by(code: str) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(name for name in {HEAVY!r} if name in sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_building_the_cli_parser_loads_no_heavy_library():
    assert _heavy_modules_loaded_by("from workshop_lib.cli import build_parser\nbuild_parser()") == []


@pytest.mark.parametrize("module", LOG_PARSERS)
def test_importing_a_log_parser_loads_no_heavy_library(module):
    assert _heavy_modules_loaded_by(f"import {module}") == []


def test_every_log_format_is_checked():
    assert "workshop_lib.results.parse.nvidia_smi" in LOG_PARSERS and len(LOG_PARSERS) >= 6
