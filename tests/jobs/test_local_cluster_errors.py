"""The local cluster refuses clearly where it cannot start."""

from __future__ import annotations

import os
import socket
from pathlib import Path

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
            # The failed start itself stops the munged it had started: no `down` needed, none left running.
            assert not cluster.status().running
            assert all(not daemon.running for daemon in cluster.status().daemons)
            assert daemons_of(tmp_path) == {}
        finally:
            cluster.down()


def daemons_of(state) -> dict[int, str]:
    """The running processes whose arguments name this state folder (munged, slurmd, …): pid -> command."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    command = handle.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(state) in command and "workshop_lib.cli" not in command:
                found[int(entry)] = command
    return found


@pytest.mark.cluster
@pytest.mark.slow
def test_two_cluster_ups_at_once_start_one_cluster_and_down_stops_it_all(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    import shutil
    import subprocess
    import sys

    base = Ports.from_environment().base + 200  # clear of the session's cluster
    # A munged that takes 3 s to start, as on a busy machine: the second `up` comes while the first waits for it.
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "munged").write_text(f"#!/bin/bash\nsleep 3\nexec {shutil.which('munged', path='/usr/sbin:/sbin')} "
                                  '"$@"\n')
    (shims / "munged").chmod(0o755)
    env = {**os.environ, "WORKSHOP_STATE_DIR": str(tmp_path / "state"), "WORKSHOP_SLURM_PORT_BASE": str(base),
           "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SLURM_CONF", None)
    command = [sys.executable, "-m", "workshop_lib.cli", "cluster", "up", "--nodes", "1", "--no-accounting"]
    ups = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for _ in range(2)]
    said = [up.communicate(timeout=120)[0] for up in ups]
    state = tmp_path / "state" / "slurm"
    try:
        assert [up.returncode for up in ups] == [0, 0], said
        munged = [line for line in daemons_of(state).values() if Path(line.split()[0]).name == "munged"]
        assert len(munged) == 1, munged
    finally:
        down = subprocess.run([sys.executable, "-m", "workshop_lib.cli", "cluster", "down"], env=env,
                              capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    left = daemons_of(state)
    for pid in left:  # a daemon `down` did not know of: stopped here, so that a failure leaks nothing
        os.kill(pid, 9)
    assert left == {}


@pytest.mark.cluster
def test_a_test_session_beside_another_clusters_ports_takes_the_next_free_range():
    """`make test` in one checkout while `make demo`'s cluster of another holds the default ports."""
    ports = Ports(35817)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", ports.mariadb))
        squatter.listen()
        chosen = Ports.first_free(nodes=2, start=35817)
    assert chosen.base == 36817
    assert Ports.first_free(nodes=2, start=35817).base == 35817  # free again once the other cluster stops
