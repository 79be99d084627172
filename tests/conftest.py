"""Shared fixtures. `local_cluster` starts the project's real SLURM cluster once per test session.

Nothing a test does lands in the checkout: the session's runs folder, the local executor's job records
and (unless one is already running) the cluster's state live in a temporary folder.
Markers: `cluster` needs the local SLURM cluster, `train` runs real training, `slow` takes more than a
few seconds; `make test-fast` runs none of them.
"""

from __future__ import annotations

import os

import pytest

_SESSION: dict[str, object] = {}
_VARIABLES = ("WORKSHOP_RUNS_DIR", "WORKSHOP_STATE_DIR", "SLURM_CONF")


@pytest.fixture(scope="session", autouse=True)
def outside_the_checkout(tmp_path_factory):
    """Runs and state of the whole session in a temporary folder, never in the repository."""
    from workshop_lib.jobs.local_cluster import LocalCluster

    base = tmp_path_factory.mktemp("workshop")
    saved = {name: os.environ.get(name) for name in _VARIABLES}
    running = LocalCluster()  # where `workshop cluster up` keeps it: reuse a cluster that already runs there
    _SESSION["cluster_state"] = running.state if running.status().running else base / "state" / "slurm"
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
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found: dict[str, tuple[int, ...] | None] = {}
    for name in ("_build/html", "_build/html/index.html", "runs"):
        path = root / name
        found[name] = (path.stat().st_mtime_ns, len(list(path.iterdir())) if path.is_dir() else 0) \
            if path.exists() else None
    return found


@pytest.fixture(scope="session")
def local_cluster(outside_the_checkout):
    """A running 2-node local SLURM cluster with accounting; stopped at the end if this session started it."""
    from workshop_lib.jobs.local_cluster import LocalCluster

    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (CI runs as root)")
    cluster = LocalCluster(state_dir=_SESSION["cluster_state"])
    already_running = cluster.status().running
    cluster.up(nodes=2, accounting=True)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    if not already_running:
        cluster.down()


@pytest.fixture
def job_dir(tmp_path):
    """A folder for job scripts and their logs that slurmd (same host, root) can write to."""
    return tmp_path
