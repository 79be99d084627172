"""A job monitor: each run's state, elapsed time and last log lines, refreshed in the background.

    monitor = JobMonitor(chapter=3)      # the chapter's runs found under runs/
    monitor                               # in JupyterLab: a live table; elsewhere: one HTML table
    monitor.start(); ...; monitor.stop()  # background refresh (a daemon thread): the kernel stays free

The background refresh listens on the process's job watcher (`jobs.watcher`): its thread asks the scheduler
about the monitor's runs together with every waiter's jobs, one poll per interval, and the monitor shows the
answers. It updates while another cell blocks (a `wait_for` in progress) and adds no poller of its own; widget
updates from a thread are what ipywidgets documents for this. A chapter's submit cell also feeds the monitor its
waiter's states (`show_states` after each poll). The default interval is the backend's longest pause.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from workshop_lib.core.durations import format_duration
from workshop_lib.core.errors import ClusterError
from workshop_lib.experiments import Experiment, chapter_experiments
from workshop_lib.jobs import watcher
from workshop_lib.jobs.backend import PollPolicy
from workshop_lib.jobs.slurm_output import tail
from workshop_lib.jobs.states import FINAL_STATES, JobInfo
from workshop_lib.jobs.watcher import Poll, Watch
from workshop_lib.runs import NOT_SUBMITTED, Run, RunRecord, load_run, query_runs
from workshop_lib.widgets import frontend

MONITOR_CLASS = "workshop-job-monitor"


@dataclass(frozen=True)
class MonitorRow:
    """One run as the monitor shows it."""

    experiment_id: str
    job_id: str
    state: str
    elapsed_s: float | None
    log_tail: str
    log_path: Path | None
    note: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def elapsed(self) -> str:
        return format_duration(self.elapsed_s) if self.elapsed_s is not None else "—"


class JobMonitor:
    """Shows runs (given, or a chapter's runs on disk) with state, elapsed time and the tail of the log."""

    def __init__(self, runs: Iterable[Run] = (), chapter: int | None = None,
                 experiments: Iterable[Experiment] = (), runs_dir: Path | str | None = None,
                 interval_s: float | None = None, log_lines: int = 5, stop_when_done: bool = True,
                 interactive: bool | None = None):
        from workshop_lib.core.paths import runs_root

        self.runs_dir = runs_root(runs_dir)
        self.chapter = chapter
        self.interval_s = interval_s if interval_s is not None else _backend_interval()
        self.log_lines = log_lines
        self.stop_when_done = stop_when_done
        self.interactive = frontend.live_widgets(interactive)
        self._runs: dict[str, Run] = {}
        for experiment in experiments:
            self._runs[experiment.id] = load_run(experiment, self.runs_dir)
        for run in runs:
            self._runs[run.experiment.id] = run
        self.rows: list[MonitorRow] = []
        self.refreshed_at: datetime | None = None
        self.last_error: Exception | None = None
        self._elapsed_of_finished: dict[str, float | None] = {}
        self._fed = False  # shown states come from a waiter's polls (the submit cell), not from this monitor
        self._lock = threading.Lock()
        self._watch: Watch | None = None  # the registration on the process's watcher while refreshing
        self._polled_runs: list[Run] = []  # the runs whose jobs the watcher's next poll asks about
        self._widget = None
        self._table = None
        self._status = None
        self._toggle = None

    # ---- what is watched -------------------------------------------------------------------------
    def add(self, run: Run) -> None:
        """Watch one more run (the builder adds what it submits)."""
        with self._lock:
            self._runs[run.experiment.id] = run

    def watched_runs(self) -> list[Run]:
        """The given runs, plus the chapter's runs that have a job on disk (found again at each refresh)."""
        with self._lock:
            runs = dict(self._runs)
        if self.chapter is not None:
            for experiment in chapter_experiments(self.chapter):
                if experiment.id not in runs:
                    run = load_run(experiment, self.runs_dir)
                    if run.record is not None:
                        runs[experiment.id] = run
        return list(runs.values())

    # ---- one refresh -------------------------------------------------------------------------------
    def refresh(self) -> list[MonitorRow]:
        """Ask the scheduler about every watched run, update the view, return the rows."""
        runs = self._runs_now()
        # One scheduler call for all the runs (runs.query_runs), not one per run and refresh; none at all when
        # this process asked about them less than half an interval ago (a waiter in another cell).
        return self._show(list(zip(runs, query_runs(runs, max_age_s=self.interval_s / 2))))

    def _runs_now(self) -> list[Run]:
        runs = self.watched_runs()
        for run in runs:
            if run.record is None and not run.damage:  # submitted since (by a notebook cell or the CLI)?
                run.record = RunRecord.load(run.directory)
        return runs

    def show_states(self, pairs: list[tuple[Run, JobInfo]]) -> list[MonitorRow]:
        """Show states someone else asked for (a waiter's poll): no scheduler call. Returns the rows."""
        self._fed = True
        return self._show(pairs)

    def _show(self, pairs: list[tuple[Run, JobInfo]]) -> list[MonitorRow]:
        with self._lock:
            for run, _ in pairs:
                self._runs.setdefault(run.experiment.id, run)
        rows = [self._row(run, info) for run, info in pairs]
        self.rows = rows
        self.refreshed_at = datetime.now(timezone.utc)
        if self._widget is not None:
            self._table.value = self.html(with_heading=False)
            self._status.value = self._status_line()
        return rows

    def _row(self, run: Run, info) -> MonitorRow:
        if run.record is None:
            return MonitorRow(run.experiment.id, "", info.state, None, "", None, run.note)
        elapsed = info.elapsed_s
        if info.state in FINAL_STATES and elapsed is None:
            elapsed = self._finished_elapsed(run)
        elif elapsed is None and info.state not in FINAL_STATES:
            elapsed = _since(run.record.submitted_at)
        log_path = run.stdout_path
        log = tail(log_path, self.log_lines) if log_path and log_path.exists() else ""
        return MonitorRow(run.experiment.id, run.record.job_id, info.state, elapsed, log, log_path, run.note)

    def _finished_elapsed(self, run: Run) -> float | None:
        """A recorded final state carries no run time: ask the scheduler once, remember the answer."""
        job_id = run.record.job_id
        if job_id not in self._elapsed_of_finished:
            try:
                self._elapsed_of_finished[job_id] = run.job.info().elapsed_s
            except Exception:  # noqa: BLE001 - the scheduler may have forgotten the job: no time then
                self._elapsed_of_finished[job_id] = None
        return self._elapsed_of_finished[job_id]

    @property
    def all_finished(self) -> bool:
        return bool(self.rows) and all(row.finished or row.state == NOT_SUBMITTED for row in self.rows)

    # ---- background refresh ------------------------------------------------------------------------
    def start(self) -> "JobMonitor":
        """Refresh every ``interval_s`` seconds (or at every poll of a waiter in this process) until ``stop()``
        or every run has ended: the process's job watcher asks, its thread updates this view."""
        if self.running:
            return self
        policy = PollPolicy(self.interval_s, self.interval_s)
        self._watch = watcher.WATCHER.watch(self._jobs_to_ask, self._polled, policy)
        self._show_toggle()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the background refresh; returns once a refresh under way has ended."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel(timeout)
        self._show_toggle()

    @property
    def running(self) -> bool:
        return self._watch is not None and self._watch.active

    def _jobs_to_ask(self) -> list:
        """The watcher's question before each poll (on its thread): the jobs of the runs still to settle."""
        self._polled_runs = self._runs_now()
        return [run.job for run in self._polled_runs if run.record is not None and not run.record.final_state]

    def _polled(self, poll: Poll) -> None:
        """The watcher's poll is done: show its answers (no scheduler call: they are all in its cache)."""
        try:
            if poll.failure is not None and not isinstance(poll.failure, ClusterError):
                raise poll.failure  # a scheduler that does not answer is shown per run (UNKNOWN); anything else stops
            runs = self._polled_runs
            self._show(list(zip(runs, query_runs(runs, max_age_s=time.monotonic() - poll.fresh_since))))
        except Exception as error:  # noqa: BLE001 - shown in the view and kept, then the refresh ends
            self.last_error = error
            if self._status is not None:
                self._status.value = frontend.escape(f"refresh failed, stopped: {error}")
            self._end_refresh()
            return
        if self.stop_when_done and self.all_finished:
            self._end_refresh()

    def _end_refresh(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        self._watch = None
        self._show_toggle()

    # ---- views -------------------------------------------------------------------------------------
    def html(self, with_heading: bool = True) -> str:
        """The rows as an HTML table (what the widget and the static fallback show)."""
        heading = ""
        if with_heading:
            heading = (f"<p><b>Jobs</b> ({self._scope()}) &nbsp;<small>{frontend.escape(self._status_line())}"
                       "</small></p>")
        if not self.rows:
            return heading + (f"<p><em>No submitted run {self._scope()} under {frontend.escape(self.runs_dir)} "
                              "yet. Submit (the chapter's submit cell, the builder's Submit button, or "
                              "<code>workshop submit</code>) and refresh.</em></p>")
        rows = [{"experiment": row.experiment_id, "job": row.job_id, "state": frontend.Raw(frontend.state_badge(row.state)),
                 "elapsed": row.elapsed,
                 f"last {self.log_lines} log lines": frontend.Raw(
                     frontend.pre(row.log_tail or "(no output yet)", max_height="8em"))} for row in self.rows]
        return heading + frontend.table(rows, MONITOR_CLASS)

    def text(self) -> str:
        """The rows as plain text (logs, terminals, papermill's stdout)."""
        lines = [f"Jobs ({self._scope()}): {self._status_line()}"]
        for row in self.rows:
            lines.append(f"  {row.experiment_id:<40} job {row.job_id or '-':<8} {row.state:<13} {row.elapsed}")
            lines += ["      | " + line for line in row.log_tail.splitlines()]
        if not self.rows:
            lines.append(f"  no submitted run under {self.runs_dir}")
        return "\n".join(lines)

    def _scope(self) -> str:
        return f"chapter {self.chapter}" if self.chapter is not None else "these runs"

    def _status_line(self) -> str:
        if self.refreshed_at is None:
            return "not refreshed yet"
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.state] = counts.get(row.state, 0) + 1
        summary = ", ".join(f"{count} {state}" for state, count in sorted(counts.items())) or "no job"
        stamp = self.refreshed_at.astimezone().strftime("%H:%M:%S")
        if self.running:
            refreshing = f"refreshing every {self.interval_s:g} s"
        else:
            refreshing = "updated at each poll of the waiting cell" if self._fed else "not refreshing"
        return f"{summary} · refreshed {stamp} · {refreshing}"

    @property
    def widget(self):
        """The live view (ipywidgets): the table, a status line, Refresh and Start/Stop buttons."""
        if self._widget is None:
            import ipywidgets as widgets

            self._table = widgets.HTML(self.html(with_heading=False))
            self._status = widgets.HTML(frontend.escape(self._status_line()))
            refresh = widgets.Button(description="Refresh", icon="refresh", layout=widgets.Layout(width="110px"))
            refresh.on_click(lambda _: self.refresh())
            self._toggle = widgets.Button(layout=widgets.Layout(width="170px"))
            self._toggle.on_click(lambda _: self.stop() if self.running else self.start())
            self._show_toggle()
            header = widgets.HBox([widgets.HTML(f"<b>Jobs</b> ({self._scope()})"), refresh, self._toggle,
                                   self._status], layout=widgets.Layout(align_items="center"))
            self._widget = widgets.VBox([header, self._table])
            self._widget.add_class(MONITOR_CLASS)
        return self._widget

    def _show_toggle(self) -> None:
        if self._toggle is not None:
            running = self.running
            self._toggle.description = "Stop auto-refresh" if running else "Start auto-refresh"
            self._toggle.icon = "stop" if running else "play"
        if self._status is not None and self.last_error is None:
            self._status.value = frontend.escape(self._status_line())

    def static_view(self) -> frontend.StaticView:
        return frontend.StaticView(self.html(), self.text())

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.refreshed_at is None:
            self.refresh()
        if self.interactive:
            display(self.widget)
            if not self.all_finished:
                self.start()
        else:
            display(self.static_view())

    def __repr__(self) -> str:
        return self.text()


def _backend_interval() -> float:
    """The longest pause of the scheduler's poll policy (15 s on a shared cluster), at least 2 s."""
    from workshop_lib.jobs.backend import resolve_backend
    from workshop_lib.jobs.watcher import poll_policy_for

    try:
        return max(2.0, poll_policy_for(resolve_backend()).longest)
    except Exception:  # noqa: BLE001 - no scheduler known yet: the monitor still shows what is on disk
        return 15.0


def _since(timestamp: str | None) -> float | None:
    """Seconds since an ISO timestamp (job.json's submitted_at): the elapsed time of a job still queued."""
    if not timestamp:
        return None
    try:
        return max(0.0, time.time() - datetime.fromisoformat(timestamp).timestamp())
    except ValueError:
        return None

