"""Where things are: the repository (the workshop's folder) and the runs folder, decided in one place.

Whichever way a chapter runs (JupyterLab, papermill from the repository root, Jupyter Book executing it
from ``notebooks/``, ``workshop submit`` from any folder inside the checkout), runs land in, and are read
from, the same absolute folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from workshop_lib.core.errors import WorkshopError

ROOT_VARIABLE = "WORKSHOP_ROOT"
RUNS_VARIABLE = "WORKSHOP_RUNS_DIR"
# The folder this library was installed from (an editable install: the checkout).
SOURCE_ROOT = Path(__file__).resolve().parents[2]
# What the checkout ships for jobs: templates, site profiles, DeepSpeed configs.
SLURM_DIR = SOURCE_ROOT / "slurm"
DS_CONFIGS_DIR = SLURM_DIR / "ds_configs"
# What the checkout ships for the book: measurements on real GPUs and NeMo's resolved recipes. The data comes
# with the library's own checkout, so it is found from SOURCE_ROOT (never from $WORKSHOP_ROOT or the cwd).
REFERENCE_DIR = SOURCE_ROOT / "book" / "reference"


def repository_root(start: Path | str | None = None) -> Path:
    """The workshop's folder: $WORKSHOP_ROOT, else the first parent of ``start`` (default: the current
    folder) holding the workshop's pyproject.toml, else the folder this library was installed from."""
    if os.environ.get(ROOT_VARIABLE):
        return Path(os.environ[ROOT_VARIABLE]).expanduser().resolve()
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if _is_workshop_root(folder):
            return folder
    if _is_workshop_root(SOURCE_ROOT):
        return SOURCE_ROOT
    raise WorkshopError(f"cannot find the workshop folder above {here}: start inside the repository, "
                        f"or set {ROOT_VARIABLE}=/path/to/the/repository")


def _is_workshop_root(folder: Path) -> bool:
    project = folder / "pyproject.toml"
    return project.is_file() and 'name = "workshop-lib"' in project.read_text(errors="replace")


def runs_root(runs_dir: Path | str | None = None) -> Path:
    """Absolute runs folder: the argument, else $WORKSHOP_RUNS_DIR, else <repository>/runs."""
    chosen = runs_dir or os.environ.get(RUNS_VARIABLE) or repository_root() / "runs"
    root = Path(chosen).expanduser().resolve()
    if root.exists() and not root.is_dir():  # every run would read as missing, and no submission could write
        from workshop_lib.core.errors import WorkshopError

        given = f"--runs-dir {runs_dir}" if runs_dir else f"${RUNS_VARIABLE}={chosen}" \
            if os.environ.get(RUNS_VARIABLE) else str(root)
        raise WorkshopError(f"the runs folder {given} is a file, not a folder: point it at a folder (it is made "
                            f"when missing), e.g. `export {RUNS_VARIABLE}=$HOME/workshop-runs`")
    return root


def existing_runs_root(runs_dir: Path | str | None) -> Path:
    """`runs_root` for reading: a folder named on the command line must exist (a typo would otherwise show
    every run as missing); the default one may not exist yet (nothing was submitted)."""
    from workshop_lib.core.errors import WorkshopError

    root = runs_root(runs_dir)
    if runs_dir and not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise WorkshopError(f"runs folder {runs_dir} {what}: give the folder that holds the run directories "
                            f"(the one you submitted with; default ${RUNS_VARIABLE} or <repository>/runs)")
    return root
