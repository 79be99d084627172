"""A real SLURM cluster on this machine: munge, MariaDB, slurmdbd, slurmctld and one slurmd per node.

Off Ibex the notebooks still submit with `sbatch`; this module starts the daemons that answer.
Everything lives in one state folder (`.state/slurm` in the checkout, or $WORKSHOP_STATE_DIR);
daemons are stopped by the PID files they wrote there, never by name.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from workshop_lib.core.errors import ClusterError
from workshop_lib.core.paths import SLURM_DIR, SOURCE_ROOT

CLUSTER_NAME = "workshop"
GPUS_PER_NODE = 8
CPUS_PER_NODE = 64
MEMORY_MIB_PER_NODE = 512 * 1024
# The default nodes stand in for both of Ibex's A100 shapes (4-GPU and 8-GPU nodes), so a script rendered for
# Ibex (--constraint=a100,4gpus or a100,8gpus) is accepted here as it would be there.
DEFAULT_FEATURES = "a100,4gpus,8gpus"
MAX_NODES = 32


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one shape: how many, their GPUs, cores, memory and SLURM features (slurm.conf's Feature=)."""

    count: int
    gpus: int = GPUS_PER_NODE
    cpus: int = CPUS_PER_NODE
    memory_mib: int = MEMORY_MIB_PER_NODE
    features: str = DEFAULT_FEATURES
APT_PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
APT_ACCOUNTING_PACKAGES = ["slurmdbd", "mariadb-server"]
# The executables each daemon runs as; checked in /proc/PID/comm before any signal is sent.
DAEMON_COMMANDS = {
    "munged": "munged",
    "mariadbd": "mariadbd",
    "slurmdbd": "slurmdbd",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
}
TEMPLATES = SLURM_DIR / "local"


def default_state_dir() -> Path:
    """Where the cluster keeps its configuration, logs and databases."""
    if os.environ.get("WORKSHOP_STATE_DIR"):
        return Path(os.environ["WORKSHOP_STATE_DIR"]).resolve() / "slurm"
    if (SOURCE_ROOT / "pyproject.toml").exists():
        return SOURCE_ROOT / ".state" / "slurm"
    return Path.home() / ".cache" / "workshop" / "slurm"


@dataclass(frozen=True)
class Ports:
    """Loopback ports of the daemons; move them all with $WORKSHOP_SLURM_PORT_BASE."""

    base: int = 16817

    @property
    def slurmctld(self) -> int:
        return self.base

    @property
    def slurmdbd(self) -> int:
        return self.base + 1

    @property
    def mariadb(self) -> int:
        return self.base + 2

    @property
    def slurmd_first(self) -> int:
        return self.base + 10

    def slurmd(self, node_index: int) -> int:
        return self.slurmd_first + node_index

    def all(self, nodes: int) -> tuple[int, ...]:
        return (self.slurmctld, self.slurmdbd, self.mariadb, *(self.slurmd(index) for index in range(nodes)))

    @classmethod
    def first_free(cls, nodes: int = 2, start: int = 16817, step: int = 1000, tries: int = 40) -> "Ports":
        """The first base from `start` (in steps of `step`) whose ports nothing listens on: a second checkout's
        test session beside another's running cluster (`make demo` in a second clone) takes the next range."""
        for base in range(start, start + step * tries, step):
            if base + 10 + nodes <= 65000 and not any(_port_open(port) for port in cls(base).all(nodes)):
                return cls(base)
        raise ClusterError(f"no free range of loopback ports for a local cluster from {start} on (tried {tries}); "
                           "stop other local clusters (`workshop cluster down` in their checkouts)")

    @classmethod
    def from_environment(cls) -> "Ports":
        value = os.environ.get("WORKSHOP_SLURM_PORT_BASE", "16817")
        if not value.isdigit() or not 1024 <= int(value) <= 65000:
            raise ClusterError(
                f"WORKSHOP_SLURM_PORT_BASE={value!r} is not a port number between 1024 and 65000; "
                "unset it or pick a free range, e.g. export WORKSHOP_SLURM_PORT_BASE=26817"
            )
        return cls(int(value))


@dataclass
class DaemonState:
    name: str  # e.g. "slurmd-node2"
    pid: int | None
    running: bool


@dataclass
class ClusterStatus:
    state_dir: Path
    conf: Path
    daemons: list[DaemonState] = field(default_factory=list)
    nodes: dict[str, str] = field(default_factory=dict)  # node -> sinfo state

    @property
    def running(self) -> bool:
        names = {d.name for d in self.daemons if d.running}
        return "slurmctld" in names and any(n.startswith("slurmd-") for n in names)

    def describe(self) -> str:
        lines = [f"state folder: {self.state_dir}", f"SLURM_CONF={self.conf}"]
        for daemon in self.daemons:
            mark = f"running (pid {daemon.pid})" if daemon.running else "stopped"
            lines.append(f"  {daemon.name:<16} {mark}")
        if self.nodes:
            lines.append("nodes: " + ", ".join(f"{n} {s}" for n, s in sorted(self.nodes.items())))
        return "\n".join(lines)


class LocalCluster:
    """Start, inspect and stop the project's own SLURM cluster."""

    def __init__(self, state_dir: Path | None = None, ports: Ports | None = None):
        self.state = (state_dir or default_state_dir()).resolve()
        self.ports = ports or Ports.from_environment()

    # ---- paths --------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.state / "etc" / "slurm.conf"

    @property
    def pid_dir(self) -> Path:
        return self.state / "pids"

    @property
    def munge_socket(self) -> Path:
        return self.state / "munge" / "munge.sock"

    def environment(self) -> dict[str, str]:
        """The environment a SLURM client (sbatch, squeue, sacct) needs to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # ---- public -------------------------------------------------------------------------
    def up(self, nodes: int = 2, accounting: bool = True, timeout: float = 60.0,
           min_job_age: int = 300, groups: tuple[NodeGroup, ...] | None = None) -> ClusterStatus:
        """Start whatever is not running yet and wait until every node is idle. Idempotent.
        `min_job_age`: seconds the controller remembers an ended job (SLURM's MinJobAge).
        `groups`: nodes by shape (a class rehearsal's reservation: 4-GPU and 8-GPU nodes that jobs share);
        None: `nodes` exclusive nodes of the default shape (one job per node: this host has few cores)."""
        if groups is None:
            if nodes < 1 or nodes > 16:
                raise ClusterError(f"--nodes {nodes} is out of range: the local cluster runs 1 to 16 nodes")
            groups, exclusive = (NodeGroup(nodes),), True
        else:
            exclusive = False
            nodes = sum(group.count for group in groups)
            if not groups or nodes < 1 or nodes > MAX_NODES or any(g.count < 1 or not 1 <= g.gpus <= GPUS_PER_NODE
                                                                   for g in groups):
                raise ClusterError(f"node groups {groups} are out of range: 1 to {MAX_NODES} nodes in all, each "
                                   f"group at least one node of 1 to {GPUS_PER_NODE} GPUs")
        self._require_root()
        with self._one_at_a_time():
            was_running = self.state.is_dir() and any(daemon.running for daemon in self.status().daemons)
            try:
                return self._up(nodes, groups, exclusive, accounting, timeout, min_job_age)
            except BaseException:
                # A start that fails half-way (a port taken, a daemon that dies) leaves nothing behind: a munged
                # left running made the next `up` take the cluster for running, and its `down` never came.
                if not was_running:
                    self._down()
                raise

    def _up(self, nodes: int, groups: tuple[NodeGroup, ...], exclusive: bool, accounting: bool, timeout: float,
            min_job_age: int) -> ClusterStatus:
        self._install_packages(accounting)
        for folder in ("etc", "pids", "logs", "munge", "ctld", "dev", "spool"):
            (self.state / folder).mkdir(parents=True, exist_ok=True)
        self._make_fake_gpus()
        changed = self._write_config(groups, exclusive, accounting, min_job_age)
        if changed:
            # A different node count or accounting choice: restart the SLURM daemons on the new config.
            for name in self._slurm_daemon_names():
                self._stop(name)
        self._start_munge()
        if accounting:
            self._start_mariadb()
            self._start_slurmdbd()
        self._start_slurmctld()
        for index in range(nodes):
            self._start_slurmd(f"node{index + 1}", index)
        self._wait_for_idle_nodes(nodes, timeout)
        return self.status()

    def down(self) -> list[str]:
        """Cancel the cluster's jobs, running ones included (their ids end up in `self.cancelled`), and stop
        every daemon this project started; returns once each is gone and its port is free (an `up` right
        after finds them free). Returns what was stopped; `self.cancelled` holds (job id, its state)."""
        self.cancelled: list[tuple[str, str]] = []
        if not self.state.is_dir():
            return []  # never started here
        with self._one_at_a_time():
            return self._down()

    @contextmanager
    def _one_at_a_time(self):
        """`up` and `down` of one state folder, one process at a time: two at once would each start the daemons
        the other is starting (a second munged that `down` never learns of, a slurmdbd that refuses the
        sacctmgr of the other). The later one waits, says so, and then finds the daemons running."""
        self.state.mkdir(parents=True, exist_ok=True)
        with open(self.state / "cluster.lock", "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"waiting for another `workshop cluster up` or `down` of {self.state} to finish ...",
                      file=sys.stderr, flush=True)
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _down(self) -> list[str]:
        if self._pid_of("slurmctld"):
            listed = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=self.environment(), capture_output=True,
                                    text=True, timeout=30)
            self.cancelled = [tuple(line.split()[:2]) for line in listed.stdout.splitlines() if len(line.split()) > 1]
            subprocess.run(["scancel", "--full", "--user", _username()], env=self.environment(),
                           capture_output=True, timeout=30)
        stopped = []
        for name in self._slurm_daemon_names() + ["slurmdbd", "mariadbd", "munged"]:
            if self._stop(name):
                stopped.append(name)
        ports = [self.ports.slurmctld, self.ports.slurmdbd, self.ports.mariadb]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_port_open(port) for port in ports):
            time.sleep(0.1)
        return stopped

    def controller_running(self) -> bool:
        return self._pid_of("slurmctld") is not None

    def status(self) -> ClusterStatus:
        status = ClusterStatus(self.state, self.conf)
        names = ["munged", "mariadbd", "slurmdbd", "slurmctld"] + self._slurmd_names()
        for name in names:
            pid = self._pid_of(name)
            status.daemons.append(DaemonState(name, pid, pid is not None))
        if status.running:
            status.nodes = self._node_states()
        return status

    # ---- installation and configuration -------------------------------------------------
    def _require_root(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError(
                "the local SLURM cluster needs root (it installs Debian's SLURM packages and runs slurmd, "
                "which starts jobs). Run `sudo workshop cluster up`, or run the notebooks without a "
                "scheduler: export WORKSHOP_BACKEND=local (jobs then run with bash on this machine)."
            )

    def _install_packages(self, accounting: bool) -> None:
        needed = ["munged", "slurmctld", "slurmd", "sbatch"] + (["slurmdbd", "mariadbd"] if accounting else [])
        missing = [tool for tool in needed if not _which(tool)]
        if not missing:
            return
        if not shutil.which("apt-get"):
            raise ClusterError(
                f"{', '.join(missing)} not found and this is not a Debian/Ubuntu machine: install SLURM "
                "(slurmctld, slurmd, slurm-client, munge; slurmdbd and mariadb for accounting) with your "
                "package manager, or export WORKSHOP_BACKEND=local to run jobs without a scheduler."
            )
        packages = APT_PACKAGES + (APT_ACCOUNTING_PACKAGES if accounting else [])
        print(f"installing {' '.join(packages)} (missing: {', '.join(missing)}) ...", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update", "-qq"],
                        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
            result = subprocess.run(command, env=env, capture_output=True, text=True)
            if result.returncode != 0:
                raise ClusterError(f"`{' '.join(command)}` failed:\n{result.stderr[-2000:]}")

    def _make_fake_gpus(self) -> None:
        # SLURM tracks GPUs through device files; character devices with NVIDIA's major number stand in.
        for index in range(GPUS_PER_NODE):
            device = self.state / "dev" / f"nvidia{index}"
            if not device.exists():
                os.mknod(device, 0o600 | 0o020000, os.makedev(195, index))

    def _write_config(self, groups: tuple[NodeGroup, ...], exclusive: bool, accounting: bool,
                      min_job_age: int = 300) -> bool:
        """Render slurm.conf, gres.conf (and slurmdbd.conf); True if slurm.conf changed."""
        environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                                         keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
        nodes = sum(group.count for group in groups)
        ranges, first = [], 1
        for group in groups:  # node1..nodeN numbered across the groups, in order
            ranges.append(dict(group=group, first=first, last=first + group.count - 1))
            first += group.count
        values = dict(
            cluster_name=CLUSTER_NAME, hostname=socket.gethostname(), state=str(self.state), nodes=nodes,
            groups=ranges, exclusive=exclusive, accounting=accounting,
            ports=dict(slurmctld=self.ports.slurmctld, slurmdbd=self.ports.slurmdbd, mariadb=self.ports.mariadb,
                       slurmd_first=self.ports.slurmd(0), slurmd_last=self.ports.slurmd(nodes - 1)),
            db_password=self._db_password() if accounting else "", min_job_age=min_job_age,
        )
        new_conf = environment.get_template("slurm.conf.j2").render(**values)
        old_conf = self.conf.read_text() if self.conf.exists() else None
        self.conf.write_text(new_conf)
        (self.state / "etc" / "gres.conf").write_text(environment.get_template("gres.conf.j2").render(**values))
        if accounting:
            dbd = self.state / "etc" / "slurmdbd.conf"
            dbd.write_text(environment.get_template("slurmdbd.conf.j2").render(**values))
            dbd.chmod(0o600)  # slurmdbd refuses a config others can read (it holds the DB password)
        (self.state / "etc" / "nodes").write_text(str(nodes))
        return old_conf is not None and old_conf != new_conf

    def _db_password(self) -> str:
        # Generated once per state folder; the database only listens on 127.0.0.1.
        path = self.state / "etc" / "db_password"
        if not path.exists():
            path.write_text(secrets.token_hex(16))
            path.chmod(0o600)
        return path.read_text().strip()

    # ---- daemons ------------------------------------------------------------------------
    def _start_munge(self) -> None:
        if self._pid_of("munged"):
            return
        key = self.state / "munge" / "munge.key"
        if not key.exists():
            _run(["mungekey", "--create", f"--keyfile={key}"], "creating the munge key")
            key.chmod(0o600)
        self._spawn("munged", ["munged", f"--key-file={key}", f"--socket={self.munge_socket}",
                               f"--pid-file={self._pid_file('munged')}",
                               f"--log-file={self.state / 'logs' / 'munged.log'}",
                               f"--seed-file={self.state / 'munge' / 'seed'}", "--force"])

    def _start_mariadb(self) -> None:
        if self._pid_of("mariadbd"):
            return
        data = self.state / "db" / "data"
        if not (data / "mysql").exists():
            _run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                  "--auth-root-authentication-method=normal", "--skip-test-db"], "initialising MariaDB")
        self._check_port_free(self.ports.mariadb, "MariaDB")
        socket_path = self.state / "db" / "mysqld.sock"
        self._spawn("mariadbd", ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={socket_path}",
                                 f"--pid-file={self._pid_file('mariadbd')}", f"--port={self.ports.mariadb}",
                                 "--bind-address=127.0.0.1", "--user=root", "--innodb-buffer-pool-size=32M",
                                 f"--log-error={self.state / 'logs' / 'mariadbd.log'}"], foreground=True)
        _wait(lambda: socket_path.exists() and self._pid_of("mariadbd"), 30, "MariaDB to accept connections",
              self.state / "logs" / "mariadbd.log")
        password = self._db_password()
        statements = "".join(
            f"CREATE USER IF NOT EXISTS 'slurm'@'{host}' IDENTIFIED BY '{password}'; "
            f"ALTER USER 'slurm'@'{host}' IDENTIFIED BY '{password}'; "
            f"GRANT ALL ON slurm_acct_db.* TO 'slurm'@'{host}'; "
            for host in ("127.0.0.1", "localhost"))
        _run(["mariadb", "--no-defaults", f"--socket={socket_path}", "-u", "root", "-e", statements],
             "creating the accounting database user")

    def _start_slurmdbd(self) -> None:
        if not self._pid_of("slurmdbd"):
            self._check_port_free(self.ports.slurmdbd, "slurmdbd")
            self._spawn("slurmdbd", ["slurmdbd"])
            _wait(lambda: _port_open(self.ports.slurmdbd), 30, "slurmdbd to listen",
                  self.state / "logs" / "slurmdbd.log")
        # The controller registers with accounting only if the cluster exists there.
        listed = subprocess.run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"],
                                env=self.environment(), capture_output=True, text=True, timeout=30)
        if CLUSTER_NAME not in listed.stdout.split():
            _run(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME], "registering the cluster in accounting",
                 env=self.environment())

    def _start_slurmctld(self) -> None:
        if self._pid_of("slurmctld"):
            return
        self._check_port_free(self.ports.slurmctld, "slurmctld")
        self._spawn("slurmctld", ["slurmctld", "-i"])
        _wait(lambda: _port_open(self.ports.slurmctld), 30, "slurmctld to listen",
              self.state / "logs" / "slurmctld.log")

    def _start_slurmd(self, node: str, index: int) -> None:
        if self._pid_of(f"slurmd-{node}"):
            return
        self._check_port_free(self.ports.slurmd(index), f"slurmd of {node}")
        (self.state / "spool" / node).mkdir(parents=True, exist_ok=True)
        self._spawn(f"slurmd-{node}", ["slurmd", "-N", node])

    def _spawn(self, name: str, command: list[str], foreground: bool = False) -> None:
        """Start a daemon detached from this process (it outlives `workshop cluster up`)."""
        log = self.state / "logs" / f"{name}.stdout"
        command = [_which(command[0]) or command[0], *command[1:]]  # daemons live in /usr/sbin
        with open(log, "ab") as output:
            process = subprocess.Popen(command, env=self.environment(), stdin=subprocess.DEVNULL, stdout=output,
                                       stderr=subprocess.STDOUT, start_new_session=True, cwd=self.state)
        if foreground:
            return  # it writes its own PID file; nothing to reap
        # Forking daemons exit once their child is ready; a non-zero status means it never started.
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return
        if code != 0:
            raise ClusterError(f"{name} failed to start (exit {code}); its log:\n{_tail(self._log_of(name))}")
        _wait(lambda: self._pid_of(name), 15, f"{name} to write its PID file", self._log_of(name))

    def _stop(self, name: str, timeout: float = 15.0) -> bool:
        pid = self._pid_of(name)
        if pid is None:
            self._pid_file(name).unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        self._pid_file(name).unlink(missing_ok=True)
        return True

    # ---- inspection ---------------------------------------------------------------------
    def _pid_file(self, name: str) -> Path:
        return self.pid_dir / f"{name}.pid"

    def _log_of(self, name: str) -> Path:
        log = self.state / "logs" / f"{name}.log"
        return log if log.exists() else self.state / "logs" / f"{name}.stdout"

    def _pid_of(self, name: str) -> int | None:
        """The PID in NAME's PID file if that process is alive and is the expected program."""
        try:
            pid = int(self._pid_file(name).read_text().split()[0])
            command = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            return None
        expected = DAEMON_COMMANDS[name.split("-")[0]]
        return pid if command == expected else None

    def _slurmd_names(self) -> list[str]:
        return sorted(p.stem for p in self.pid_dir.glob("slurmd-*.pid")) if self.pid_dir.exists() else []

    def _slurm_daemon_names(self) -> list[str]:
        return self._slurmd_names() + ["slurmctld"]

    def _node_states(self) -> dict[str, str]:
        result = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.environment(),
                                capture_output=True, text=True, timeout=30)
        pairs = (line.split() for line in result.stdout.splitlines() if line.strip())
        return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}

    def _wait_for_idle_nodes(self, nodes: int, timeout: float) -> None:
        wanted = {f"node{i + 1}" for i in range(nodes)}

        def all_idle() -> bool:
            states = self._node_states()
            return wanted <= states.keys() and all(states[n] in ("idle", "mixed", "allocated") for n in wanted)

        _wait(all_idle, timeout, f"{nodes} node(s) to become idle in sinfo", self.state / "logs" / "slurmctld.log")

    def _check_port_free(self, port: int, what: str) -> None:
        if _port_open(port):
            raise ClusterError(
                f"port {port} on 127.0.0.1, needed by {what}, is already in use by another program. "
                f"Stop that program, or move the local cluster's ports: export WORKSHOP_SLURM_PORT_BASE="
                f"{self.ports.base + 1000} (then `workshop cluster up` again)."
            )


# ---- small helpers ----------------------------------------------------------------------
def _username() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def _alive(pid: int) -> bool:
    """Whether any thread of the process still runs: a daemon's main thread can be a zombie while its
    other threads are still shutting down (and holding its port)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        tasks = [Path(f"/proc/{pid}")]
    for task in tasks:
        try:
            if (task / "stat").read_text().split(") ")[-1][:1] != "Z":
                return True
        except OSError:
            continue
    return False


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _wait(condition, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    detail = f"\nlast lines of {log}:\n{_tail(log)}" if log else ""
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}.{detail}")


def _run(command: list[str], what: str, env: dict[str, str] | None = None) -> None:
    command = [_which(command[0]) or command[0], *command[1:]]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    if result.returncode != 0:
        raise ClusterError(f"{what} failed: `{command[0]}` exited {result.returncode}:\n"
                           f"{(result.stderr or result.stdout)[-2000:]}")
