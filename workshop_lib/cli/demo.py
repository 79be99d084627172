"""`make demo`: the workshop end to end on this machine (tiny profile, local SLURM cluster).

Steps: start the cluster, check it with a sample job, execute every chapter notebook with papermill,
build the book, stop the cluster. Prints how long each step took, how many jobs each chapter ran
(submitted now or reused), the wall time of each job, and where to open the book.

The book build only re-reads results ($WORKSHOP_SUBMIT=0): every job ran in the papermill step, and the
build must not submit or wait for anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.core.paths import SOURCE_ROOT
from workshop_lib.core.run_directory import RunDirectory

ROOT = SOURCE_ROOT


class Timer:
    def __init__(self):
        self.steps: list[tuple[str, float]] = []

    def run(self, label: str, action):
        print(f"\n==> {label}", flush=True)
        started = time.monotonic()
        result = action()
        self.steps.append((label, time.monotonic() - started))
        print(f"    done in {self.steps[-1][1]:.1f} s", flush=True)
        return result

    def report(self) -> str:
        width = max(len(label) for label, _ in self.steps)
        lines = [f"  {label:<{width}}  {seconds:7.1f} s" for label, seconds in self.steps]
        total = sum(seconds for _, seconds in self.steps)
        return "\n".join(["time per step:", *lines, f"  {'total':<{width}}  {total:7.1f} s"])


def sample_job() -> None:
    """Submit one small job through workshop_lib and read its final state back."""
    from workshop_lib import jobs as cluster

    folder = Path(tempfile.mkdtemp(prefix="workshop-sample-"))
    script = folder / "sample.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=sample\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n"
                      f"#SBATCH --output={folder}/sample-%j.out\n#SBATCH --time=00:05:00\n"
                      'echo "sample job $SLURM_JOB_ID on $(hostname) ($SLURM_JOB_NODELIST)"\n')
    job = cluster.submit(script)
    [info] = cluster.wait_for([job], timeout=120)
    job.raise_for_state()
    print(f"    {info.describe()}\n    log: {job.log_tail(3)}")


def chapter_notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


def chapter_number(path: Path) -> int:
    return int(path.name[:2])


def notebook_parameters(path: Path) -> dict:
    """The values of a chapter's parameters cell (tagged "parameters"), as the notebook defines them."""
    import jupytext

    for cell in jupytext.read(path).cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            values: dict = {}
            exec(cell.source, {}, values)  # a few plain assignments, written by us
            return values
    return {}


def execute_chapter(path: Path, profile: str, output_dir: Path, parameters: dict | None = None) -> Path:
    """Run one chapter notebook with papermill; returns the executed .ipynb."""
    import jupytext
    import papermill

    from workshop_lib.book.pages.kernels import local_kernel_manager

    output_dir.mkdir(parents=True, exist_ok=True)
    output = output_dir / f"{path.stem}.ipynb"
    _jobs_find_this_python()
    papermill.execute_notebook(jupytext.read(path), str(output), parameters={"profile": profile, **(parameters or {})},
                               kernel_name="python3", language="python", cwd=str(ROOT), progress_bar=False,
                               kernel_manager_class=local_kernel_manager())
    return output


class JobProgress:
    """While a chapter executes, one terminal line whenever one of its runs moves on (submitted, its
    latest training step, ended), read from the run folders alone: no scheduler is asked. The notebook's
    own progress bar lives inside the executed notebook, out of a terminal's sight."""

    def __init__(self, experiments, runs_dir: Path, interval_s: float = 10.0, echo=print):
        self.experiments, self.runs_dir, self.interval_s, self.echo = list(experiments), runs_dir, interval_s, echo
        self.shown: dict[str, str] = {}
        self._stop = None
        self._thread = None

    def __enter__(self):
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="job-progress")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
        self.poll()  # the last word on each run

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        for experiment in self.experiments:
            line = run_progress(self.runs_dir / experiment.id)
            if line and self.shown.get(experiment.id) != line:
                self.shown[experiment.id] = line
                self.echo(f"    {experiment.id:<42} {line}", flush=True)


def run_progress(directory: Path) -> str:
    """'job 41: step 12 (loss 2.31)', 'job 41: ended, exit status 0 after 00:01:07', or '' before submission."""
    from workshop_lib.jobs.footer import parse_footer
    from workshop_lib.runs import RunRecord
    from workshop_lib.runs.record import DamagedRecord

    try:
        record = RunRecord.load(directory)
    except (DamagedRecord, OSError):  # the run table after the chapter says why
        return ""
    if record is None:
        return ""
    log = directory / record.stdout if record.stdout else RunDirectory(directory).stdout(record.job_id)
    try:
        footer = parse_footer(log.read_text(errors="replace")) if log.is_file() else None
    except OSError:
        footer = None
    if footer is not None and footer.exit_status is not None:
        took = f" after {footer.total_time_text}" if footer.total_time_text else ""
        return f"job {record.job_id}: ended, exit status {footer.exit_status}{took}"
    step = _last_step(RunDirectory(directory).metrics)
    if step:
        return f"job {record.job_id}: training, step {step['step']} (loss {step['loss']:.3f})"
    return f"job {record.job_id}: " + ("started" if log.is_file() else "submitted, waiting to start")


def _last_step(path: Path) -> dict | None:
    import json

    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("kind") == "step":
            return record
    return None


def _jobs_find_this_python() -> None:
    # papermill's kernelspec starts `python` from PATH: make it this environment's interpreter.
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


@dataclass
class ChapterRun:
    """What executing one chapter did: its jobs and how long it took."""

    notebook: Path
    seconds: float
    jobs: dict[str, str]  # experiment id -> job id of its run after execution
    submitted: list[str]  # experiment ids whose job is new (not reused)
    states: dict[str, str]  # experiment id -> final state
    job_seconds: dict[str, float]  # experiment id -> the job's total time from its footer


def run_snapshot(chapter: int, runs_dir: Path) -> dict[str, str]:
    """experiment id -> job id of the run recorded in runs/<id>/job.json, for one chapter."""
    from workshop_lib.experiments import chapter_experiments
    from workshop_lib.runs import RunRecord

    found = {}
    for experiment in chapter_experiments(chapter):
        record = RunRecord.load(runs_dir / experiment.id)
        if record is not None:
            found[experiment.id] = record.job_id
    return found


def execute_and_account(path: Path, profile: str, output_dir: Path, runs_dir: Path,
                        parameters: dict | None = None, show_progress: bool = False, echo=print) -> ChapterRun:
    """Execute a chapter and report which jobs it submitted or reused and how long each took; with
    `show_progress`, a line through `echo` whenever one of its jobs moves on (JobProgress)."""
    from workshop_lib.book.chapter.selection import select
    from workshop_lib.book.chapter.your_runs import chapter_results_for

    chapter = chapter_number(path)
    before = run_snapshot(chapter, runs_dir)
    chosen = {**notebook_parameters(path), **(parameters or {})}
    selection = select(chapter, profile, chosen.get("experiments"))
    started = time.monotonic()
    if show_progress:
        with JobProgress(selection.runnable, runs_dir, echo=echo):
            execute_chapter(path, profile, output_dir, parameters)
    else:
        execute_chapter(path, profile, output_dir, parameters)
    seconds = time.monotonic() - started
    results = chapter_results_for(selection, runs_dir)
    after = run_snapshot(chapter, runs_dir)
    ids = [experiment.id for experiment in selection.runnable]
    return ChapterRun(
        notebook=path, seconds=seconds, jobs={i: after.get(i, "") for i in ids},
        submitted=[i for i in ids if i in after and after[i] != before.get(i)],
        states=dict(zip(results["id"], results["state"])),
        job_seconds={row.id: float(row.total_time_s) for row in results.itertuples()
                     if row.total_time_s is not None and row.total_time_s == row.total_time_s})


def chapter_report(runs: list[ChapterRun]) -> str:
    from workshop_lib.jobs.states import COMPLETED

    lines = ["chapters:"]
    for run in runs:
        done = sum(state == COMPLETED for state in run.states.values())
        # No time here: the chapter's line in "time per step" is its time (a second figure for it differed).
        lines.append(f"  {run.notebook.stem:<24} {len(run.jobs)} job(s): "
                     f"{len(run.submitted)} submitted, {len(run.jobs) - len(run.submitted)} reused; {done} completed")
        for experiment_id, seconds in run.job_seconds.items():
            lines.append(f"      {experiment_id:<40} {seconds:6.0f} s  {run.states.get(experiment_id, '')}")
    return "\n".join(lines)


def failed_runs(runs: list[ChapterRun]) -> list[str]:
    from workshop_lib.jobs.states import COMPLETED

    return [f"{experiment_id} ({state})" for run in runs for experiment_id, state in run.states.items()
            if state != COMPLETED]


def build_book(read_only: bool = True, output: Path | None = None) -> Path:
    """jupyter-book build with warnings as errors; the chapters it executes only read results. The book
    goes to `output`/_build/html (default: the checkout's _build/html, what `make demo` shows); the tests
    pass a temporary folder so that they never replace the book a user built. Returns the html folder."""
    from workshop_lib.book.chapter.your_runs import SUBMIT_VARIABLE

    env = dict(os.environ)
    if read_only:
        env[SUBMIT_VARIABLE] = "0"
    base = Path(output) if output is not None else ROOT
    # The execution cache is keyed on the notebooks' code, and Sphinx rebuilds only pages whose source
    # changed, not on the runs they read: either would keep the tables of an earlier execution. So the
    # cache goes and every page is rebuilt (--all); re-reading results takes seconds per chapter.
    shutil.rmtree(base / "_build" / ".jupyter_cache", ignore_errors=True)
    command = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT), "--all", "-W", "--keep-going",
               *(["--path-output", str(base)] if output is not None else [])]
    subprocess.run(command, check=True, cwd=ROOT, env=env)
    return base / "_build" / "html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--keep-cluster", action="store_true",
                        help="leave the local cluster running (it is always left running if it was up before)")
    args = parser.parse_args(argv)

    from workshop_lib.jobs.local_cluster import LocalCluster

    timer = Timer()
    use_cluster = os.geteuid() == 0 and os.environ.get("WORKSHOP_BACKEND", "auto") != "local"
    local = LocalCluster()
    # A cluster that was already running (someone else's session, a test run) is left running.
    already_running = use_cluster and local.status().running
    if use_cluster:
        timer.run("start the local SLURM cluster", lambda: print(local.up(nodes=2).describe()))
    else:
        print("not root: jobs run with the local executor (no SLURM). `sudo make demo` uses a real local cluster.")
        os.environ["WORKSHOP_BACKEND"] = "local"
    from workshop_lib.book.chapter.your_runs import resolve_runs_dir

    runs_dir = resolve_runs_dir()
    chapters: list[ChapterRun] = []
    try:
        timer.run("sample job", sample_job)
        for notebook in chapter_notebooks():
            chapters.append(timer.run(f"chapter {notebook.stem}", lambda nb=notebook: execute_and_account(
                nb, args.profile, ROOT / "_build" / "executed", runs_dir, show_progress=True)))
        if (ROOT / "_config.yml").exists():
            timer.run("build the book (reads results only)", build_book)
    finally:
        if use_cluster and not args.keep_cluster and not already_running:
            timer.run("stop the local SLURM cluster", local.down)
        elif already_running:
            print("\nthe local SLURM cluster was running before the demo: left running (`make cluster-down` stops it)")
    print("\n" + timer.report())
    print("\n" + chapter_report(chapters) + f"\n  runs in {runs_dir}")
    index = ROOT / "_build" / "html" / "index.html"
    if index.exists():
        print(f"\nopen the book: {index}  (or: python -m http.server -d _build/html 8000)")
    failed = failed_runs(chapters)
    if failed:
        print(f"\n{len(failed)} run(s) did not complete: {', '.join(failed)}. Their logs are in the run folders; "
              "re-running `make demo` resubmits only those.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
