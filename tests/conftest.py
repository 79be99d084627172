"""Shared fixtures. `local_cluster` starts the project's real SLURM cluster once per test session.

Nothing a test does lands in the checkout: the session's runs folder, the local executor's job records
and (unless one is already running) the cluster's state live in a temporary folder.
Markers: `cluster` needs the local SLURM cluster, `train` runs real training, `slow` takes more than a
few seconds; `make test-fast` runs none of them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Test modules in the folders below import the shared helpers beside this file (repo_paths, ibex_site,
# book_fixtures, browser_cdp) by name, whichever folder pytest put on sys.path for them.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

_SESSION: dict[str, object] = {}
_VARIABLES = ("WORKSHOP_RUNS_DIR", "WORKSHOP_STATE_DIR", "SLURM_CONF", "WORKSHOP_SLURM_PORT_BASE")


@pytest.fixture(scope="session", autouse=True)
def outside_the_checkout(tmp_path_factory):
    """Runs and state of the whole session in a temporary folder, never in the repository."""
    from workshop_lib.jobs.local_cluster import LocalCluster

    base = tmp_path_factory.mktemp("workshop")
    saved = {name: os.environ.get(name) for name in _VARIABLES}
    users_cluster = LocalCluster()  # where `workshop cluster up` keeps it: reuse a cluster that already runs there
    reuse = users_cluster.status().running
    _SESSION["cluster_state"] = users_cluster.state if reuse else base / "state" / "slurm"
    if not reuse and "WORKSHOP_SLURM_PORT_BASE" not in os.environ:
        # A session cluster of its own takes loopback ports nothing listens on: another checkout's cluster (a
        # `make demo` running beside `make test`) holds the default ones. Jobs and notebooks inherit the choice.
        from workshop_lib.jobs.local_cluster import Ports

        os.environ["WORKSHOP_SLURM_PORT_BASE"] = str(Ports.first_free().base)
    os.environ["WORKSHOP_RUNS_DIR"] = str(base / "runs")
    os.environ["WORKSHOP_STATE_DIR"] = str(base / "state")
    before = _users_own_files()
    yield base
    after = _users_own_files()
    assert after == before, (f"the tests changed what the user built or ran in the checkout: {before} -> {after}; "
                             "tests must write into temporary folders")
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _users_own_files() -> dict[str, tuple[int, ...] | None]:
    """The checkout's book (_build/html) and runs folder (runs/, its run folders): what `make demo`, `make
    book` and the notebooks made for the user, to be left exactly as they were."""
    root = Path(__file__).resolve().parents[1]
    found: dict[str, tuple[int, ...] | None] = {}
    for name in ("_build/html", "_build/html/index.html", "runs"):
        path = root / name
        found[name] = (path.stat().st_mtime_ns, len(list(path.iterdir())) if path.is_dir() else 0) \
            if path.exists() else None
    return found


@pytest.fixture(scope="session")
def local_cluster(outside_the_checkout, request):
    """A running 2-node local SLURM cluster with accounting; stopped at the end if this session started it."""
    from workshop_lib.jobs.local_cluster import LocalCluster

    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (CI runs as root)")
    cluster = LocalCluster(state_dir=_SESSION["cluster_state"])
    already_running = cluster.status().running
    say = _terminal_line(request.config)
    say("starting the local SLURM cluster for the cluster tests (slurmctld, slurmd, slurmdbd, munge; about a "
        "minute the first time, when it installs SLURM's packages)" if not already_running else
        "using the local SLURM cluster that is already running")
    cluster.up(nodes=2, accounting=True)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    if not already_running:
        cluster.down()


@pytest.fixture
def job_dir(tmp_path):
    """A folder for job scripts and their logs that slurmd (same host, root) can write to."""
    return tmp_path


def _terminal_line(config):
    """Write a line to the terminal at once, through pytest's output capture (`make test` runs -q): the long
    fixtures (the cluster, the chapters) would otherwise leave pytest silent for minutes."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def say(line: str, flush: bool = True) -> None:  # JobProgress passes flush=
        if reporter is None or capture is None:
            print(line, flush=True)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"[workshop] {line.strip()}")
            reporter.flush()
    return say


@pytest.fixture(scope="session")
def progress_line(pytestconfig):
    """`say(line)`: a progress line in the terminal while a long fixture or test works."""
    return _terminal_line(pytestconfig)


# What a skipped test needs, by a word of its reason, and the one command that provides it. `make test` installs
# the tools as root where apt-get exists (as CI's .ci/run does); elsewhere the end of the run says this.
_SKIP_REMEDIES = (
    ("chromium", "Chromium", "apt-get install -y chromium   (as root; `make test` does it when run as root)"),
    ("shellcheck", "shellcheck", "apt-get install -y shellcheck   (as root; `make test` does it when run as root)"),
    ("root", "root (the local SLURM cluster)", "sudo make test"),
    ("gpu", "a GPU", "run on a GPU machine"),
    ("cuda", "a GPU", "run on a GPU machine"),
)


# Seconds and tests by tier, so a full run (CI's `make test`) also states what `make test-fast` would take.
_TIER_MARKERS = ("slow", "cluster", "train")
_TIERS: dict[str, list] = {"fast": [set(), 0.0], "slow, cluster or train": [set(), 0.0]}


def pytest_runtest_logreport(report):
    tier = _TIERS["slow, cluster or train" if any(m in report.keywords for m in _TIER_MARKERS) else "fast"]
    tier[0].add(report.nodeid)
    tier[1] += report.duration


def _report_tiers(terminalreporter) -> None:
    if not _TIERS["fast"][0]:
        return
    terminalreporter.section("time by tier")
    for name, (tests, seconds) in _TIERS.items():
        terminalreporter.write_line(f"{name:>24}: {len(tests):5d} tests, {seconds:7.0f} s of setup, call and "
                                    "teardown")


def pytest_terminal_summary(terminalreporter):
    _report_tiers(terminalreporter)
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    needs: dict[tuple[str, str], int] = {}
    for report in skipped:
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
        what = next(((need, remedy) for word, need, remedy in _SKIP_REMEDIES if word in reason.lower()),
                    (reason.removeprefix("Skipped: "), ""))
        needs[what] = needs.get(what, 0) + 1
    terminalreporter.section("what this run did not cover")
    for (need, remedy), count in sorted(needs.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{count:4d} skipped: need {need}" + (f"; enable with: {remedy}" if remedy
                                                                           else ""))


# Only the training tests (tests/train) may import torch when pytest collects them: it costs seconds of every
# session, so a module elsewhere that imports it (or a library module that does) at its top fails to collect.
_TORCH_MAY_LOAD_UNDER = Path(__file__).resolve().parent / "train"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    torch_was_loaded = "torch" in sys.modules
    report = yield
    if isinstance(collector, pytest.Module) and not torch_was_loaded and "torch" in sys.modules and \
            _TORCH_MAY_LOAD_UNDER not in collector.path.parents and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{collector.path}: importing this test module imported torch; import torch (or the "
                           "library module that needs it) inside the tests that use it, or move the module "
                           "to tests/train")
    return report
