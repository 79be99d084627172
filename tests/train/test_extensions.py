"""DeepSpeed's op build folder belongs to the environment, and a build's lock never stops a job silently.

The locks here are real: torch's own FileBaton (loaded from torch's file, without importing torch) taken by
another process, which is then killed or told to let go; every wait is on a line that process prints.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import venv
from pathlib import Path

import pytest

from workshop_lib.train.extensions import (
    EXTENSIONS_VARIABLE,
    TORCH_LOCK,
    build_turn,
    processes_holding,
    settle_build_locks,
)

REPO = Path(__file__).resolve().parents[2]
FILE_BATON = Path(importlib.util.find_spec("torch").submodule_search_locations[0]) / "utils" / "file_baton.py"

# Takes the lock as torch's extension builder does (and keeps it open while "building") until told to let go.
TORCH_BUILD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("file_baton", sys.argv[2])
file_baton = importlib.util.module_from_spec(spec)
spec.loader.exec_module(file_baton)
baton = file_baton.FileBaton(sys.argv[1])
assert baton.try_acquire()
print("building", flush=True)
sys.stdin.readline()
baton.release()
"""
# Holds the folder's build turn until told to let go.
TURN_HOLDER = """
import sys
from pathlib import Path
from workshop_lib.train.extensions import build_turn
with build_turn(Path(sys.argv[1])) as held:
    print("turn" if held else "no turn", flush=True)
    sys.stdin.readline()
"""


def started(script: str, *arguments, ready: str) -> subprocess.Popen:
    """A Python process running `script`, returned once it printed `ready` (it then waits on its stdin)."""
    process = subprocess.Popen([sys.executable, "-c", script, *map(str, arguments)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert process.stdout.readline().strip() == ready
    return process


def op_lock(tmp_path: Path) -> Path:
    (tmp_path / "deepspeed_shm_comm").mkdir(parents=True)
    return tmp_path / "deepspeed_shm_comm" / TORCH_LOCK


def in_background(action):
    """Run `action` in a thread; returns (thread, result holder)."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(value=action()), daemon=True)
    thread.start()
    return thread, result


def test_a_lock_left_by_a_killed_build_is_removed_with_a_line_saying_so(tmp_path):
    lock = op_lock(tmp_path)
    build = started(TORCH_BUILD, lock, FILE_BATON, ready="building")
    assert processes_holding(lock) == [build.pid]
    build.send_signal(signal.SIGKILL)
    build.wait()
    assert lock.exists() and processes_holding(lock) == []  # torch would wait on it forever
    lines: list[str] = []
    with build_turn(tmp_path, lines.append) as held:
        assert held
        assert settle_build_locks(tmp_path, held, lines.append) == [lock]
    assert not lock.exists()
    [line] = lines
    assert f"removed the stale build lock {lock}" in line and "deepspeed_shm_comm" in line


def test_a_live_build_is_waited_for_with_lines_naming_it_and_never_removed(tmp_path):
    lock = op_lock(tmp_path)
    build = started(TORCH_BUILD, lock, FILE_BATON, ready="building")
    said = threading.Event()
    lines: list[str] = []

    def tell(line):
        lines.append(line)
        said.set()

    thread, result = in_background(lambda: settle_build_locks(tmp_path, True, tell, say_every_s=0))
    assert said.wait(60)
    assert lock.exists() and thread.is_alive()
    assert f"process {build.pid} building deepspeed_shm_comm" in lines[0] and f"delete {lock}" in lines[0]
    build.communicate("done\n", timeout=60)  # the build ends and takes its lock away
    thread.join(60)
    assert not thread.is_alive() and result["value"] == []


def test_builds_take_turns_and_a_killed_holders_turn_passes_on(tmp_path):
    holder = started(TURN_HOLDER, tmp_path, ready="turn")
    said = threading.Event()
    lines: list[str] = []

    def tell(line):
        lines.append(line)
        said.set()

    def take_turn():
        with build_turn(tmp_path, tell, say_every_s=0) as held:
            return held

    thread, result = in_background(take_turn)
    assert said.wait(60)
    assert thread.is_alive() and f"held by process {holder.pid} on " in lines[0]
    holder.send_signal(signal.SIGKILL)  # killed mid-build: the kernel lets go of its flock
    holder.wait()
    thread.join(60)
    assert not thread.is_alive() and result["value"] is True


def _extensions_dir_seen_by(python: Path, **env) -> Path:
    code = "from workshop_lib.train.extensions import use_environment_extensions_dir as f; print(f())"
    environment = {key: value for key, value in os.environ.items() if key != EXTENSIONS_VARIABLE}
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True,
                            env={**environment, "PYTHONPATH": str(REPO), **env})
    return Path(result.stdout.strip())


def test_each_environment_builds_into_its_own_folder_unless_the_site_names_one(tmp_path):
    other = tmp_path / "second clone" / ".venv"
    venv.create(other, with_pip=False)
    mine = _extensions_dir_seen_by(Path(sys.executable))
    theirs = _extensions_dir_seen_by(other / "bin" / "python")
    assert mine == Path(sys.prefix) / "torch_extensions"
    assert theirs == other / "torch_extensions"
    site = tmp_path / "project cache" / "torch_extensions"
    assert _extensions_dir_seen_by(other / "bin" / "python", **{EXTENSIONS_VARIABLE: str(site)}) == site


def test_a_read_only_environment_builds_in_the_users_cache_keyed_by_its_path(tmp_path, monkeypatch):
    from workshop_lib.train import extensions

    monkeypatch.setattr(extensions.os, "access", lambda path, mode: False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first, second = (extensions.environment_extensions_dir(f"/staged/{name}/env") for name in ("a", "b"))
    assert first.parent == second.parent == tmp_path / "cache" / "torch_extensions" and first != second


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_nobody_holds_a_lock_file_that_is_only_on_disk(tmp_path):
    lock = op_lock(tmp_path)
    lock.touch()
    assert processes_holding(lock) == []
    with open(lock) as handle:
        assert handle and processes_holding(lock) == [os.getpid()]
