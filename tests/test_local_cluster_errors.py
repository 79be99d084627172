"""The local cluster refuses clearly where it cannot start."""

from __future__ import annotations

import os
import socket

import pytest

from workshop_lib.core.errors import ClusterError
from workshop_lib.jobs.local_cluster import LocalCluster, Ports


def test_not_root_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="sudo workshop cluster up.*WORKSHOP_BACKEND=local"):
        LocalCluster(state_dir=tmp_path).up(nodes=1)


def test_bad_port_base_and_node_count(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_SLURM_PORT_BASE", "99")
    with pytest.raises(ClusterError, match="WORKSHOP_SLURM_PORT_BASE"):
        Ports.from_environment()
    with pytest.raises(ClusterError, match="1 to 16 nodes"):
        LocalCluster(state_dir=tmp_path, ports=Ports(30817)).up(nodes=0)


@pytest.mark.cluster
def test_port_taken_by_another_program(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    ports = Ports(31817)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", ports.slurmctld))
        squatter.listen()
        cluster = LocalCluster(state_dir=tmp_path, ports=ports)
        try:
            with pytest.raises(ClusterError, match=f"port {ports.slurmctld}.*WORKSHOP_SLURM_PORT_BASE"):
                cluster.up(nodes=1, accounting=False)
        finally:
            cluster.down()
    assert not cluster.status().running
    assert all(not daemon.running for daemon in cluster.status().daemons)  # munged it started is stopped too
