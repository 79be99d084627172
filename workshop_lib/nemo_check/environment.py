"""The NeMo checking environment: NeMo 2.4.1 in its own virtual environment, built once and cached.

    python -m workshop_lib.nemo_check.environment      # build (or find) it and print its folder
    make nemo-env                                      # the same

NeMo's `llm finetune` resolves a command line without a GPU (``--dryrun``), so the commands the book
hands participants are checked by NeMo itself. Its dependencies clash with the project's (numpy < 2,
transformers 4.51), hence a separate environment: the project's CPU torch (its pin in requirements.lock) plus the
pinned list ``nemo.lock.txt`` installed without resolving, and ``onnx_alias.py`` as a .pth file.
The folder is keyed by a hash of those inputs and the Python version, so a changed lock builds anew
and an unchanged one is reused (about 2.5 min and 2.4 GB the first time).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import SOURCE_ROOT

HERE = Path(__file__).resolve().parent  # this package's own files (the lock, the alias module)
LOCK = HERE / "nemo.lock.txt"
ALIAS_MODULE = HERE / "onnx_alias.py"
PROJECT_LOCK = SOURCE_ROOT / "requirements.lock"  # the project's one lock; only its torch pin is used here
COMPLETE = ".complete"
# nvidia-modelopt[torch] drags PyPI's torchvision, which is linked against CUDA torch and fails to import.
UNWANTED = ("torchvision",)
BUILD_STEPS_VERSION = "1"  # raise when _build changes: the key then names a new folder


def cache_root() -> Path:
    """Where environments are kept: $WORKSHOP_NEMO_VENV_ROOT, else ~/.cache/workshop/nemo-venv."""
    configured = os.environ.get("WORKSHOP_NEMO_VENV_ROOT")
    return Path(configured) if configured else Path.home() / ".cache" / "workshop" / "nemo-venv"


def environment_key() -> str:
    """A hash of everything the environment is built from."""
    digest = hashlib.sha256()
    for path in (LOCK, ALIAS_MODULE):
        digest.update(path.read_bytes())
    digest.update(torch_pin().encode())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor} {BUILD_STEPS_VERSION}".encode())
    return digest.hexdigest()[:16]


def torch_pin() -> str:
    """The project's torch requirement (``torch==X``) as requirements.lock pins it."""
    from workshop_lib.sites.site_check import locked_version

    return f"torch=={locked_version(PROJECT_LOCK, 'torch')}"


def environment_path() -> Path:
    return cache_root() / environment_key()


def environment_python(build: bool = True) -> Path:
    """The interpreter of the NeMo environment; builds the environment when missing and ``build``."""
    folder = environment_path()
    if not (folder / COMPLETE).exists():
        if not build:
            raise WorkshopError(f"the NeMo checking environment is not built yet ({folder}); "
                                "run `make nemo-env` (about 2.5 min, 2.4 GB)")
        build_environment(folder)
    return folder / "bin" / "python"


def build_environment(folder: Path) -> None:
    """Build into ``folder`` under a file lock, so that two test processes do not build it twice."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.with_suffix(".lock")):
        if (folder / COMPLETE).exists():
            return
        if folder.exists():  # an earlier build broke off
            shutil.rmtree(folder)
        try:
            _build(folder)
        except subprocess.CalledProcessError as error:
            raise WorkshopError(f"building the NeMo checking environment failed at `{' '.join(error.cmd)}` "
                                f"(exit {error.returncode}); its output is above. The lock is {LOCK.name}: "
                                "a package missing from the index or a wrong pin shows there") from error
        (folder / COMPLETE).write_text(environment_key() + "\n")


def _build(folder: Path) -> None:
    base_python = getattr(sys, "_base_executable", sys.executable)
    _run([base_python, "-m", "venv", str(folder)])
    pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run(pip + [torch_pin()])  # the project's own CPU torch, first
    _run(pip + ["--no-deps", "-r", str(LOCK)])
    for package in UNWANTED:
        _run([str(folder / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", package], check=False)
    site_packages = Path(subprocess.run(
        [str(folder / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    shutil.copy(ALIAS_MODULE, site_packages / "workshop_onnx_alias.py")
    (site_packages / "workshop_onnx_alias.pth").write_text("import workshop_onnx_alias; workshop_onnx_alias.install()\n")
    # The import that failed before the alias: proof that the environment works.
    _run([str(folder / "bin" / "python"), "-c", "import nemo_run; from nemo.collections import llm"])


def _run(command: list[str], check: bool = True) -> None:
    print("+ " + " ".join(command), flush=True)
    subprocess.run(command, check=check)


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main() -> int:
    print(environment_python(build=True).parent.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
