"""Every GPU watched: one monitor block in every template starts nvidia-smi on every node of the job
(one file per node, named by the node) and stops it after training. The run test drives the block with
the local executor's srun, two emulated nodes and a fake nvidia-smi."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from workshop_lib.core.paths import SOURCE_ROOT
from workshop_lib.experiments import get_experiment
from workshop_lib.scripts import render_script, template_for
from workshop_lib.sites.profiles import load_profile

MONITOR_STEP = ('srun --overlap --quiet --nodes="$SLURM_NNODES" --ntasks-per-node=1 --cpus-per-task=1 '
                'bash -c "$GPU_MONITOR_TASK" &')
# A 2-node job of each template.
MULTI_NODE = {"nemo_finetune.sbatch.j2": "model-parallel/mixtral/tp2-pp4-ep2-sp",
              "torchrun_multi_node.sbatch.j2": "fsdp/multi-node/2-nodes"}


def _block(text: str) -> str:
    """The monitor's start (here-document and srun) and stop lines, as the script runs them."""
    start = text[text.index("IFS= read -r -d '' GPU_MONITOR_TASK"):text.index("GPU_MONITOR_PID=$!") + 18]
    stop = text[text.index('kill "$GPU_MONITOR_PID"'):]
    return start + "\nsleep 1\n" + "\n".join(stop.splitlines()[:2]) + "\n"


@pytest.mark.parametrize("experiment_id", ["zero/single-gpu/zero3-offload", *MULTI_NODE.values()])
def test_every_template_starts_one_monitor_per_node_and_stops_it_after_training(experiment_id):
    experiment = get_experiment(experiment_id)
    text = render_script(experiment, "ibex")
    assert text.count(MONITOR_STEP) == 1 and text.count("nvidia-smi ") == 1
    training = text.index("TRAIN_STATUS=0")
    assert text.index(MONITOR_STEP) < training < text.index('kill "$GPU_MONITOR_PID"') < text.index("Job finished")
    assert 'wait "$GPU_MONITOR_PID"' in text
    if experiment.nodes > 1:
        assert MULTI_NODE[template_for(experiment, load_profile("ibex"))] == experiment_id


def test_a_site_without_nvidia_smi_has_no_monitor():
    text = render_script(get_experiment("fsdp/multi-node/2-nodes"), "tiny")
    assert "GPU_MONITOR" not in text and "no GPU memory monitor" in text


FAKE_NVIDIA_SMI = """#!/bin/bash
echo $$ >> "$MONITOR_PIDS"
echo "timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]"
while true; do echo "2025/01/01 00:00:00.000, 0, NVIDIA A100, 50, 1000, 81920"; sleep 0.1; done
"""


def test_the_block_writes_one_file_per_node_and_leaves_no_monitor_running(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    block = _block(render_script(get_experiment("model-parallel/mixtral/tp2-pp4-ep2-sp"), "ibex"))
    shims = SOURCE_ROOT / "workshop_lib" / "jobs" / "local_shims"
    env = {**os.environ, "PATH": f"{shims}:{fake}:{os.environ['PATH']}", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "gpu201-02,gpu201-03", "MONITOR_PIDS": str(tmp_path / "pids")}
    subprocess.run(["bash", "-c", "set -eo pipefail\n" + block], cwd=tmp_path, env=env, check=True, timeout=30)
    for node in ("gpu201-02", "gpu201-03"):
        lines = (tmp_path / f"gpu_memory_{node}.csv").read_text().splitlines()
        assert lines[0].startswith("timestamp") and len(lines) > 2, node
    pids = [int(pid) for pid in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 2
    time.sleep(0.3)
    assert not [pid for pid in pids if _running(pid)]  # stopped with the job's monitor step


def _running(pid: int) -> bool:
    # An ended process whose parent is gone may stay a zombie here (a container's PID 1 need not reap it).
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
