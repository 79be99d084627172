"""Fixtures for the training-engine tests: launch an entry point under torchrun, read its metrics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from workshop_lib.core.metrics_schema import validate_record
from workshop_lib.train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
DS_CONFIGS = REPO / "slurm" / "ds_configs"
# Small enough for 2 cores: 128-token samples, a few optimizer steps.
SMALL = ["--max-length", "128", "--epochs", "1"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Run:
    records: list[dict]
    output_dir: Path
    log: str

    @property
    def summary(self) -> dict:
        return self.records[-1]

    @property
    def steps(self) -> list[dict]:
        return [r for r in self.records if r["kind"] == "step"]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One synthetic data set and tokenizer for the whole session (made by the first run)."""
    return tmp_path_factory.mktemp("workshop-data")


@pytest.fixture
def launch(tmp_path, data_dir):
    """``launch(module, nproc, *args)`` runs ``torchrun -m workshop_lib.train.<module>`` and checks
    that metrics.jsonl ends with a summary and that every record follows the schema."""

    def run(module: str, nproc: int, *args: str, name: str = "run") -> Run:
        if "--deepspeed" in args:  # an optional engine: absent on a machine without the train extra
            pytest.importorskip("deepspeed", reason="DeepSpeed is not installed here (pip install -e '.[train]')")
        output_dir = tmp_path / name
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                   "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                   "-m", f"workshop_lib.train.{module}", "--output-dir", str(output_dir), *args]
        # CUDA_VISIBLE_DEVICES="": these runs are the CPU ones (gloo) even on a GPU machine, where several
        # ranks would otherwise share one GPU through NCCL.
        env = {**os.environ, "WORKSHOP_DATA_DIR": str(data_dir), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
               "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        log = done.stdout + done.stderr
        assert done.returncode == 0, f"{' '.join(command)} failed:\n{log[-6000:]}"
        records = read_metrics(output_dir / "metrics.jsonl")
        for record in records:
            validate_record(record)
        assert records and records[-1]["kind"] == "summary", records[-3:]
        assert sum(r["kind"] == "summary" for r in records) == 1
        assert records[-1]["world_size"] == nproc
        assert len([r for r in records if r["kind"] == "step"]) >= 1
        return Run(records, output_dir, log)

    return run


def assert_sharded(summary: dict, world_size: int) -> None:
    """Each rank holds about total/world parameters (FSDP pads flat shards slightly)."""
    local = summary["local_params_per_rank"]
    total = summary["total_params"]
    assert len(local) == world_size
    for count in local:
        assert abs(count - total / world_size) <= 0.02 * total, (local, total)


def assert_memory_as_predicted(summary: dict, model_states: bool = True, peak: bool = True):
    """Every rank's tensor bytes (workshop_lib.train.tensor_census) against workshop_lib.estimate for the
    setup that ran: model states within 15 %, the second step's peak within 25 % (the goals of
    workshop_lib.book.measurements.memory_predictions). Returns the estimate."""
    from workshop_lib.book.measurements.memory_predictions import (
        GOAL_MODEL_STATES,
        GOAL_PEAK,
        model_of_summary,
        predicted_bytes,
        setup_from_summary,
    )
    from workshop_lib.estimate import estimate_memory

    estimate = estimate_memory(model_of_summary(summary), setup_from_summary(summary))
    predicted_states, predicted_peak = predicted_bytes(estimate, summary["device"])
    measured = zip(summary["model_state_bytes_per_rank"], summary["step_peak_bytes_per_rank"])
    for rank, (states, step_peak) in enumerate(measured):
        assert states and step_peak, (rank, summary["model_state_bytes_per_rank"], summary["step_peak_bytes_per_rank"])
        if model_states:
            assert abs(predicted_states - states) <= GOAL_MODEL_STATES * states, (rank, predicted_states, states)
        if peak:
            assert abs(predicted_peak - step_peak) <= GOAL_PEAK * step_peak, (rank, predicted_peak, step_peak)
    return estimate
