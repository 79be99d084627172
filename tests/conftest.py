"""Shared fixtures. `local_cluster` starts the project's real SLURM cluster once per test session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def local_cluster():
    """A running 2-node local SLURM cluster with accounting; stopped at the end if this session started it."""
    from workshop_lib.local_cluster import LocalCluster

    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (CI runs as root)")
    cluster = LocalCluster()
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
