"""DeepSpeed's compiled ops: one build folder per Python environment, and no silent wait on a build's lock.

torch builds an op on first use under $TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions/py311_cpu,
which every environment of the user shares: a second clone rebuilt the first one's op over it (its
build.ninja then named the other clone's venv), and a build killed mid-way left its `lock` file, on which
every later job waited until its time limit with no word in its log. Here:
- the folder belongs to the environment (<environment>/torch_extensions), unless the site names one
  ($TORCH_EXTENSIONS_DIR, e.g. the Ibex profile's cache root); `make setup` prebuilds into the same folder;
- builds in one folder take turns on an flock, which the kernel releases when its holder dies;
- with the turn held, a `lock` no running process holds open was left by a dead build: it is removed,
  with a line in the job's log saying so; a build that is alive is waited for, with a line every 30 s.
Standard library here; DeepSpeed is imported only by `load_deepspeed_comm_op`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

EXTENSIONS_VARIABLE = "TORCH_EXTENSIONS_DIR"
FOLDER_NAME = "torch_extensions"
TURN_FILE = "workshop-build-turn"  # the flock builds take turns on; it names its holder
TORCH_LOCK = "lock"  # torch's FileBaton: made when a build starts, removed when it ends
SAY_EVERY_S = 30.0
# Where the turn cannot be taken (a file system without flock) a lock nobody on this machine holds may be
# another node's live build: only a lock this old is then taken for a dead build's (a build takes minutes).
STALE_WITHOUT_TURN_S = 30 * 60
SHM_COMM_BUILDER = "ShareMemCommBuilder"  # the op DeepSpeed's CPU communication loads (shared-memory all-reduce)


def environment_extensions_dir(prefix: str | None = None) -> Path:
    """This environment's build folder: inside it where it is writable, else the user's cache keyed by its path
    (a read-only environment, such as a class's staged one)."""
    prefix = prefix or sys.prefix
    if os.access(prefix, os.W_OK):
        return Path(prefix) / FOLDER_NAME
    key = hashlib.sha256(os.path.realpath(prefix).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / FOLDER_NAME / f"{Path(prefix).name}-{key}"


def use_environment_extensions_dir(environ=None) -> Path:
    """Point torch's op builds at this environment's folder, unless the site already chose one."""
    environ = os.environ if environ is None else environ
    if not environ.get(EXTENSIONS_VARIABLE):
        environ[EXTENSIONS_VARIABLE] = str(environment_extensions_dir())
    return Path(environ[EXTENSIONS_VARIABLE])


def say(line: str) -> None:
    print(f"workshop: {line}", flush=True)


@contextmanager
def build_turn(folder: Path, tell=say, say_every_s: float = SAY_EVERY_S):
    """Hold the folder's build turn; yields False where the file system cannot lock (then nobody takes turns)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / TURN_FILE, "a+") as handle:
        held = _take_turn(handle, folder, tell, say_every_s)
        if held:
            handle.seek(0)
            handle.truncate()
            handle.write(f"process {os.getpid()} on {socket.gethostname()}\n")
            handle.flush()
        try:
            yield held
        finally:
            if held:
                handle.truncate(0)
                fcntl.flock(handle, fcntl.LOCK_UN)


def _take_turn(handle, folder: Path, tell, say_every_s: float) -> bool:
    started = said = time.monotonic()
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        except OSError as error:
            if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return False
            raise
        if time.monotonic() - said >= say_every_s:
            said = time.monotonic()
            handle.seek(0)
            tell(f"waiting {said - started:.0f} s for the build turn in {folder}, held by "
                 f"{handle.read().strip() or 'another process'} (a DeepSpeed op is being built or loaded)")
        time.sleep(0.2)


def processes_holding(path: Path) -> list[int] | None:
    """Ids of this machine's processes that hold `path` open (torch's build keeps its lock open while it
    builds); None where /proc cannot tell."""
    target = os.path.realpath(path)
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    holders = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (entry / "fd").iterdir()):
                holders.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to look at
            continue
    return holders


def settle_build_locks(folder: Path, turn_held: bool, tell=say, say_every_s: float = SAY_EVERY_S) -> list[Path]:
    """Return once no op's build lock in `folder` stands in the way: locks of dead builds removed (saying so),
    live builds waited for (saying who, every `say_every_s`). Returns the locks removed."""
    removed: list[Path] = []
    started = said = time.monotonic()
    while True:
        waiting = []
        for lock in sorted(folder.glob(f"*/{TORCH_LOCK}")):
            holders = processes_holding(lock)
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:
                continue  # its build just ended
            dead = not holders and (turn_held and holders is not None or age > STALE_WITHOUT_TURN_S)
            if dead:
                lock.unlink(missing_ok=True)
                removed.append(lock)
                tell(f"removed the stale build lock {lock}, left {age:.0f} s ago by a build of "
                     f"{lock.parent.name} that was stopped (no process holds it); the op is built where that build left off")
            else:
                waiting.append((lock, holders))
        if not waiting:
            return removed
        if time.monotonic() - said >= say_every_s:
            said = time.monotonic()
            for lock, holders in waiting:
                who = f"process {', '.join(map(str, holders))}" if holders else "a process on another machine"
                tell(f"waiting {said - started:.0f} s for {who} building {lock.parent.name} (lock {lock}); if no "
                     f"such build is running, delete {lock} and this job goes on")
        time.sleep(0.5)


def load_deepspeed_comm_op(tell=say):
    """DeepSpeed's shared-memory communication op, built or loaded in this environment's folder, in turn; DeepSpeed
    then finds it loaded. None where DeepSpeed would not load it (a GPU, a CPU without the instructions)."""
    folder = use_environment_extensions_dir()
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(SHM_COMM_BUILDER)
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return None
    with build_turn(folder, tell) as turn_held:
        settle_build_locks(folder, turn_held, tell)
        return builder.load(verbose=False)


def settle_environment_locks(tell=say) -> None:
    """Before DeepSpeed builds any op (CUDA ones on GPUs): no dead build's lock left in this environment's folder."""
    folder = use_environment_extensions_dir()
    if folder.is_dir():
        with build_turn(folder, tell) as turn_held:
            settle_build_locks(folder, turn_held, tell)
