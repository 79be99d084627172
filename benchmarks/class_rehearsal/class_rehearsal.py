"""The class rehearsal: N participants, each a Linux user running a chapter's cells at the same moment.

    sudo WORKSHOP_SLURM_PORT_BASE=... python benchmarks/class_rehearsal/class_rehearsal.py --users 30 \
        [--chapter 1] [--nodes 16] [--sleep 3] [--output benchmarks/results/class_rehearsal/30-users.json]

What it sets up, as the workshop day would have it:
- one SLURM controller: the project's local cluster (its own state folder and ports, `--nodes` exclusive
  nodes), or the cluster $SLURM_CONF names;
- N Linux users (`useradd`, removed afterwards), with accounting associations when the cluster enforces them;
- a real reservation for those users on every node (`scontrol create reservation`), passed to the notebooks
  the way a class gets it: `export WORKSHOP_RESERVATION=NAME`;
- one shared, read-only staged folder (root-owned; a manifest of files with SHA-256) that every job reads.

Each participant's notebook process executes the chapter's jupytext .py with papermill, as that user, with
the parameters cell set to the rehearsal profile (slurm/profiles/rehearsal.yml: jobs read the staged folder,
sleep and write the files a run leaves, so the tables fill) and the user's own runs folder. All processes
import first and then start together. Polling is the shared-cluster policy ($WORKSHOP_POLL_POLICY=shared),
what a notebook on Ibex does.

Measured: the controller's RPCs (`sdiag -r` at the start, `sdiag` by user and by message type at the end,
plus a sample every `--sample-s` seconds for each notebook's busiest minute), per notebook and in total;
jobs submitted against experiments (sacct: every job of every participant, its run folder and reservation;
no duplicate, none lost); whether every table of every executed notebook is filled; the time from the
start until each notebook ended (its last table is the last output it shows).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
USER_PREFIX = "wsr"  # workshop rehearsal participant
SUBMISSION_RPCS_PER_JOB = 2  # REQUEST_SUBMIT_BATCH_JOB (sbatch --hold) + REQUEST_UPDATE_JOB (scontrol release)
SDIAG_LINE = re.compile(r"^\s+(\S+)\s+\(\s*(\d+)\)\s+count:(\d+)")
# What a table cell shows instead of a number when its run did not complete (workshop_lib.book.tables).
STATE_WORDS = {"MISSING", "FAILED", "TIMEOUT", "CANCELLED", "INCOMPLETE", "NOT SUBMITTED", "UNKNOWN",
               "OUT_OF_MEMORY", "NODE_FAIL", "PENDING", "RUNNING", "LOST"}
# Run as each participant: import, wait for the common start, execute the chapter, say when it ended.
PARTICIPANT = r"""
import json, sys, time
from pathlib import Path
import jupytext, papermill
chapter, profile, runs_dir, output, go, done = sys.argv[1:7]
notebook = jupytext.read(chapter)
Path(done).with_name("ready").write_text("ready")
while not Path(go).exists():
    time.sleep(0.05)
started = time.time()
error = None
try:
    papermill.execute_notebook(notebook, output, parameters={"profile": profile, "runs_dir": runs_dir,
                               "wait_timeout_s": 900}, kernel_name="python3", language="python",
                               cwd=str(Path(runs_dir).parent), progress_bar=False)
except Exception as failure:
    text = f"{type(failure).__name__}: {failure}"
    error = text if len(text) <= 4000 else text[:1000] + " … " + text[-3000:]  # the end names the exception
Path(done).write_text(json.dumps({"started": started, "ended": time.time(), "error": error}))
"""


@dataclass
class Participant:
    user: str
    home: Path
    created: bool  # by this rehearsal (removed at the end)
    started: float = 0.0
    ended: float = 0.0
    error: str | None = None
    rpcs: int = 0
    busiest_minute_rpcs: int = 0
    jobs: list[dict] = field(default_factory=list)
    tables: int = 0
    table_problems: list[str] = field(default_factory=list)

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def output(self) -> Path:
        return self.home / "chapter.ipynb"


def run(command: list[str], env: dict | None = None, check: bool = True) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    if check and result.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed ({result.returncode}): {result.stderr.strip()[-1500:]}")
    return result.stdout


# ---- the class ---------------------------------------------------------------------------------
def add_users(count: int, folder: Path) -> list[Participant]:
    participants = []
    for index in range(1, count + 1):
        name = f"{USER_PREFIX}{index:02d}"
        home = folder / "home" / name
        try:
            pwd.getpwnam(name)
            created = False
        except KeyError:
            run(["useradd", "--home-dir", str(home), "--no-create-home", "--shell", "/bin/bash", "--user-group",
                 name])
            created = True
        home.mkdir(parents=True, exist_ok=True)
        entry = pwd.getpwnam(name)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        participants.append(Participant(name, home, created))
    return participants


def remove_users(participants: list[Participant]) -> None:
    for participant in participants:
        if participant.created:
            run(["userdel", participant.user], check=False)


def ensure_associations(participants: list[Participant], env: dict) -> bool:
    """Accounting associations for the users, where the cluster enforces them; True if it does."""
    config = run(["scontrol", "show", "config"], env)
    enforce = re.search(r"AccountingStorageEnforce\s*=\s*(\S+)", config)
    if not enforce or enforce.group(1) == "none":
        return False
    cluster = re.search(r"ClusterName\s*=\s*(\S+)", config).group(1)
    run(["sacctmgr", "-i", "add", "account", "rehearsal", f"cluster={cluster}"], env, check=False)
    for participant in participants:
        run(["sacctmgr", "-i", "add", "user", participant.user, "account=rehearsal", f"cluster={cluster}"], env,
            check=False)
    return True


def create_reservation(name: str, participants: list[Participant], env: dict) -> None:
    users = ",".join(participant.user for participant in participants)
    run(["scontrol", "create", "reservation", f"ReservationName={name}", "StartTime=now", "Duration=60",
         f"Users={users}", "Nodes=ALL", "Flags=IGNORE_JOBS"], env)


def stage_folder(folder: Path) -> Path:
    """A root-owned, read-only folder of files with a manifest, as an instructor stages one for the class."""
    staged = folder / "staged"
    files = {"images/nemo_25.07.sif": os.urandom(2 << 20), "models/llama-3.1-8b/config.json": b'{"layers": 32}\n',
             "data/squad/training.jsonl": b'{"input": "q", "output": "a"}\n' * 1000}
    manifest = {}
    for name, content in files.items():
        path = staged / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        manifest[name] = {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    (staged / "manifest.json").write_text(json.dumps({"files": manifest}, indent=1))
    for path in sorted(staged.rglob("*"), reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    staged.chmod(0o555)
    return staged


def rehearsal_profile(folder: Path, staged: Path, sleep_s: float) -> Path:
    import yaml

    data = yaml.safe_load((REPOSITORY / "slurm" / "profiles" / "rehearsal.yml").read_text())
    data["rehearsal"] = {"sleep_s": sleep_s, "staged": str(staged)}
    path = folder / "rehearsal.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    path.chmod(0o644)
    return path


def reachable_by_all(path: Path) -> bool:
    """Whether any user may execute `path` (every folder above it searchable by others)."""
    real = Path(os.path.realpath(path))
    return all(os.stat(folder).st_mode & 0o001 for folder in real.parents) and bool(os.stat(real).st_mode & 0o001)


def participant_python(folder: Path) -> Path:
    """The interpreter the participants run: this one when every user may execute it; else a virtual
    environment on a system Python of the same version that reads this environment's packages (a
    `python -m venv` under /root is root's alone)."""
    if reachable_by_all(Path(sys.executable)):
        return Path(sys.executable)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    if system is None or not reachable_by_all(Path(system)):
        raise SystemExit(f"{sys.executable} is not executable by other users and no system {version} is: "
                         "run the rehearsal from an environment built on a Python every user may run")
    bridge = folder / "participant-venv"
    run([system, "-m", "venv", "--without-pip", str(bridge)])
    import sysconfig

    packages = sysconfig.get_paths()["purelib"]
    own = next(bridge.glob("lib/python*/site-packages"))
    (own / "workshop-rehearsal.pth").write_text(f"import site; site.addsitedir({packages!r})\n")
    return bridge / "bin" / "python"


def participant_environment(participant: Participant, env: dict, reservation: str) -> dict:
    entry = pwd.getpwnam(participant.user)
    keep = {name: env[name] for name in ("PATH", "PYTHONPATH", "SLURM_CONF", "LANG", "LC_ALL", "TZ") if name in env}
    return {**keep, "HOME": str(participant.home), "USER": participant.user, "LOGNAME": participant.user,
            "SHELL": entry.pw_shell, "WORKSHOP_RESERVATION": reservation, "WORKSHOP_POLL_POLICY": "shared",
            "MPLBACKEND": "agg"}


# ---- sdiag ---------------------------------------------------------------------------------------
def sdiag_sections(env: dict) -> tuple[dict[str, int], dict[str, int]]:
    """(RPC counts by message type, by user) from sdiag."""
    output = run(["sdiag"], env)
    by_type = output.split("Remote Procedure Call statistics by message type", 1)[1]
    by_type, by_user = by_type.split("Remote Procedure Call statistics by user", 1)
    by_user = by_user.split("Pending RPC statistics", 1)[0]

    def counts(section: str) -> dict[str, int]:
        return {match.group(1): int(match.group(3)) for match in map(SDIAG_LINE.match, section.splitlines()) if match}

    return counts(by_type), counts(by_user)


# ---- what the class got ------------------------------------------------------------------------
def jobs_by_user(env: dict, users: set[str], since: float) -> dict[str, list[dict]]:
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 5))
    output = run(["sacct", "-a", "-X", "-n", "-P", "-S", start, "-o", "JobID,User,JobName,State,Reservation,WorkDir"],
                 env)
    found: dict[str, list[dict]] = {user: [] for user in users}
    for line in output.splitlines():
        job_id, user, name, state, reservation, workdir = (line.split("|") + [""] * 6)[:6]
        if user in found:
            found[user].append({"job_id": job_id, "name": name, "state": state.split()[0], "reservation": reservation,
                                "workdir": workdir})
    return found


def table_cells(notebook_path: Path) -> tuple[int, list[str]]:
    """(participant tables shown, problems) in an executed notebook: each table needs numbers and no state."""
    from html.parser import HTMLParser

    import nbformat

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tables, self.depth, self.cell = [], 0, None

        def handle_starttag(self, tag, attrs):
            classes = (dict(attrs).get("class") or "").split()
            if tag == "div" and "workshop-participant" in classes:
                self.depth = 1
                self.tables.append([])
            elif tag == "div" and self.depth:
                self.depth += 1
            elif tag == "td" and self.depth:
                self.cell = ""

        def handle_endtag(self, tag):
            if tag == "div" and self.depth:
                self.depth -= 1
            elif tag == "td" and self.cell is not None:
                self.tables[-1].append(self.cell.strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    if not notebook_path.is_file():
        return 0, ["no executed notebook"]
    parser = Cells()
    for cell in nbformat.read(str(notebook_path), as_version=4).cells:
        for output in cell.get("outputs", []):
            text = output.get("data", {}).get("text/html")
            if text:
                parser.feed("".join(text))
    problems = []
    for index, cells in enumerate(parser.tables):
        states = sorted({cell for cell in cells if cell in STATE_WORDS})
        numbers = [cell for cell in cells if re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?|\d{2}:\d{2}:\d{2}", cell)]
        if states:
            problems.append(f"table {index + 1} shows {states}")
        if not numbers:
            problems.append(f"table {index + 1} has no number")
    if not parser.tables:
        problems.append("no table of the participant's runs")
    return len(parser.tables), problems


def expected_experiments(chapter: int, profile: Path) -> list[str]:
    from workshop_lib.book.chapter.facade import select

    return [experiment.id for experiment in select(chapter, str(profile)).runnable]


def account(participants: list[Participant], jobs: dict[str, list[dict]], expected: list[str],
            reservation: str) -> dict:
    """Jobs against experiments: one completed job per experiment and participant, each in the reservation."""
    duplicates, lost, outside, not_completed = [], [], [], []
    for participant in participants:
        participant.jobs = jobs.get(participant.user, [])
        by_folder: dict[str, list[dict]] = {}
        for job in participant.jobs:
            by_folder.setdefault(job["workdir"], []).append(job)
            if job["reservation"] != reservation:
                outside.append(f"{participant.user} job {job['job_id']} ({job['reservation'] or 'no reservation'})")
        for experiment_id in expected:
            folder = str(participant.runs_dir / experiment_id)
            found = by_folder.pop(folder, [])
            if not found:
                lost.append(f"{participant.user}: {experiment_id}")
            elif len(found) > 1:
                duplicates.append(f"{participant.user}: {experiment_id} ({', '.join(j['job_id'] for j in found)})")
            if found and found[-1]["state"] != "COMPLETED":
                not_completed.append(f"{participant.user}: {experiment_id} {found[-1]['state']}")
        for folder, extra in by_folder.items():
            duplicates.append(f"{participant.user}: job(s) {', '.join(j['job_id'] for j in extra)} in {folder}, "
                              "no experiment of the chapter")
    return {"experiments": len(expected) * len(participants),
            "jobs_submitted": sum(len(participant.jobs) for participant in participants),
            "duplicates": duplicates, "lost": lost, "not_completed": not_completed, "outside_reservation": outside}


# ---- the rehearsal -------------------------------------------------------------------------------
def rehearse(users: int, chapter: int = 1, nodes: int = 16, sleep_s: float = 3.0, sample_s: float = 10.0,
             keep: bool = False, timeout_s: float = 1200.0) -> dict:
    if os.geteuid() != 0:
        raise SystemExit("the rehearsal creates Linux users and a SLURM reservation: run it as root")
    from workshop_lib.jobs.local_cluster import LocalCluster, Ports

    folder = Path(tempfile.mkdtemp(prefix="class-rehearsal-"))
    folder.chmod(0o755)  # participants reach their homes, the profile, the staged folder and the cluster's socket
    local = None
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if not env.get("SLURM_CONF"):
        # Its own cluster beside any other (ports 40 above the base), in a folder every participant can reach.
        local = LocalCluster(state_dir=folder / "slurm", ports=Ports(Ports.from_environment().base + 40))
        local.up(nodes=nodes, accounting=True)
        env["SLURM_CONF"] = str(local.conf)
    reservation = f"rehearsal-{os.getpid()}"
    participants: list[Participant] = []
    processes: list[subprocess.Popen] = []
    try:
        participants = add_users(users, folder)
        enforced = ensure_associations(participants, env)
        create_reservation(reservation, participants, env)
        staged = stage_folder(folder)
        profile = rehearsal_profile(folder, staged, sleep_s)
        chapter_path = sorted((REPOSITORY / "notebooks").glob(f"{chapter:02d}_*.py"))[0]
        python = participant_python(folder)
        env["PATH"] = os.pathsep.join([str(python.parent), env["PATH"]])
        go = folder / "go"
        for participant in participants:
            entry = pwd.getpwnam(participant.user)
            command = [str(python), "-c", PARTICIPANT, str(chapter_path), str(profile), str(participant.runs_dir),
                       str(participant.output), str(go), str(participant.home / "done.json")]
            processes.append(subprocess.Popen(
                command, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd=participant.home,
                env=participant_environment(participant, env, reservation),
                stdout=open(participant.home / "participant.log", "wb"), stderr=subprocess.STDOUT))
        # Every participant has imported papermill and read the chapter: all start together.
        deadline = time.time() + 300
        while not all((participant.home / "ready").exists() for participant in participants):
            if time.time() > deadline or any(process.poll() is not None for process in processes):
                raise RuntimeError("a participant did not get ready; its log is participant.log in its home")
            time.sleep(0.2)
        run(["sdiag", "-r"], env)
        started = time.time()
        go.write_text("go")
        samples = []  # (seconds since start, {user: count})
        next_sample = started + sample_s
        while any(process.poll() is None for process in processes):
            if time.time() - started > timeout_s:
                for process in processes:
                    process.kill()
                break
            if time.time() >= next_sample:
                samples.append((time.time() - started, sdiag_sections(env)[1]))
                next_sample += sample_s
            time.sleep(0.5)
        wall = time.time() - started
        by_type, by_user = sdiag_sections(env)
        samples.append((wall, by_user))
        expected = expected_experiments(chapter, profile)
        report_accounting = account(participants, jobs_by_user(env, {p.user for p in participants}, started),
                                    expected, reservation)
        for participant in participants:
            done_path = participant.home / "done.json"
            done = json.loads(done_path.read_text()) if done_path.is_file() else {"error": "no done.json"}
            participant.started, participant.ended = done.get("started", 0.0), done.get("ended", 0.0)
            participant.error = done.get("error")
            participant.rpcs = by_user.get(participant.user, 0)
            participant.busiest_minute_rpcs = busiest_minute(samples, participant.user)
            participant.tables, participant.table_problems = table_cells(participant.output)
        return summarise(participants, by_type, by_user, wall, report_accounting, dict(
            users=users, chapter=chapter, nodes=nodes if local else None, sleep_s=sleep_s, reservation=reservation,
            accounting_enforced=enforced, staged_files=len(json.loads((staged / "manifest.json").read_text())["files"]),
            experiments_per_notebook=len(expected), polling="shared (WORKSHOP_POLL_POLICY=shared)"))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        run(["scontrol", "delete", f"ReservationName={reservation}"], env, check=False)
        for participant in participants:
            run(["scancel", "--user", participant.user], env, check=False)
        remove_users(participants)
        if local is not None:
            local.down()
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"kept {folder}", file=sys.stderr)


def busiest_minute(samples: list[tuple[float, dict[str, int]]], user: str) -> int:
    """The most RPCs of one user in any 60 s between two samples (sampled every few seconds)."""
    points = [(0.0, 0)] + [(seconds, counts.get(user, 0)) for seconds, counts in samples]
    best = 0
    for index, (start, count) in enumerate(points):
        for later, later_count in points[index + 1:]:
            if later - start > 60.0 + 1e-6:
                break
            best = max(best, later_count - count)
    return best


def summarise(participants: list[Participant], by_type: dict, by_user: dict, wall: float, accounting: dict,
              setup: dict) -> dict:
    notebooks = []
    for participant in participants:
        minutes = max(participant.ended - participant.started, 1e-6) / 60
        # Each job costs the notebook two RPCs to submit (sbatch --hold, then scontrol release once its run folder
        # is ready: the run state machine); the rest is polling.
        polling = participant.rpcs - SUBMISSION_RPCS_PER_JOB * len(participant.jobs)
        notebooks.append({"user": participant.user, "seconds": round(participant.ended - participant.started, 1),
                          "rpcs": participant.rpcs, "rpcs_per_minute": round(participant.rpcs / minutes, 2),
                          "polling_rpcs": polling, "polling_rpcs_per_minute": round(polling / minutes, 2),
                          "busiest_minute_rpcs": participant.busiest_minute_rpcs, "jobs": len(participant.jobs),
                          "tables": participant.tables, "table_problems": participant.table_problems,
                          "error": participant.error})
    participant_users = {participant.user for participant in participants}
    participant_rpcs = sum(count for user, count in by_user.items() if user in participant_users)
    last_table = max((p.ended for p in participants), default=0.0) - min((p.started for p in participants), default=0.0)
    return {
        "setup": setup,
        "wall_s": round(wall, 1),
        "time_to_last_table_s": round(last_table, 1),
        "rpcs_total": sum(by_type.values()),
        "rpcs_total_per_minute": round(sum(by_type.values()) * 60 / wall, 1),
        "rpcs_of_notebooks": participant_rpcs,
        "rpcs_of_notebooks_per_minute": round(participant_rpcs * 60 / wall, 1),
        "rpcs_per_notebook_per_minute_max": max(n["rpcs_per_minute"] for n in notebooks),
        "rpcs_per_notebook_per_minute_mean": round(sum(n["rpcs_per_minute"] for n in notebooks) / len(notebooks), 2),
        "busiest_minute_of_a_notebook": max(n["busiest_minute_rpcs"] for n in notebooks),
        "polling_rpcs_per_notebook_per_minute_max": max(n["polling_rpcs_per_minute"] for n in notebooks),
        "polling_rpcs_per_notebook_per_minute_mean": round(
            sum(n["polling_rpcs_per_minute"] for n in notebooks) / len(notebooks), 2),
        "rpcs_by_type": by_type,
        "rpcs_by_user": by_user,
        **accounting,
        "tables_filled": all(not n["table_problems"] and not n["error"] for n in notebooks),
        "notebooks": notebooks,
    }


def describe(report: dict) -> str:
    setup = report["setup"]
    lines = [
        f"{setup['users']} participants, chapter {setup['chapter']} ({setup['experiments_per_notebook']} experiments "
        f"each), one controller, reservation {setup['reservation']}, staged folder of {setup['staged_files']} files",
        f"time to the last table: {report['time_to_last_table_s']} s (wall {report['wall_s']} s)",
        f"controller RPCs: {report['rpcs_total']} in total = {report['rpcs_total_per_minute']}/min "
        f"(notebooks: {report['rpcs_of_notebooks_per_minute']}/min)",
        f"per notebook: mean {report['rpcs_per_notebook_per_minute_mean']}/min, max "
        f"{report['rpcs_per_notebook_per_minute_max']}/min over its run; busiest minute of any notebook "
        f"{report['busiest_minute_of_a_notebook']} RPCs; polling alone: mean "
        f"{report['polling_rpcs_per_notebook_per_minute_mean']}/min, max {report['polling_rpcs_per_notebook_per_minute_max']}/min "
        f"(submitting costs {SUBMISSION_RPCS_PER_JOB} RPCs per job)",
        f"jobs submitted {report['jobs_submitted']} for {report['experiments']} experiments: "
        f"{len(report['duplicates'])} duplicate(s), {len(report['lost'])} lost, {len(report['not_completed'])} "
        f"not completed, {len(report['outside_reservation'])} outside the reservation",
        f"every table filled: {report['tables_filled']}",
        f"RPCs by type: {report['rpcs_by_type']}",
    ]
    for problem in (report["duplicates"] + report["lost"] + report["not_completed"] + report["outside_reservation"])[:10]:
        lines.append(f"  ! {problem}")
    for notebook in report["notebooks"]:
        if notebook["table_problems"] or notebook["error"]:
            lines.append(f"  ! {notebook['user']}: {notebook['error'] or ''} {notebook['table_problems']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--chapter", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=16, help="nodes of the rehearsal's own cluster (1-16)")
    parser.add_argument("--sleep", type=float, default=3.0, help="seconds each job 'trains' on one GPU")
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep the rehearsal's folder (homes, runs, notebooks)")
    parser.add_argument("--output", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    report = rehearse(args.users, args.chapter, args.nodes, args.sleep, args.sample_s, args.keep)
    print(describe(report))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    ok = report["tables_filled"] and not (report["duplicates"] or report["lost"] or report["not_completed"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
