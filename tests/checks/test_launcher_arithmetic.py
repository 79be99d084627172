"""The launchers' own arithmetic, where only the launcher can show it: the linter's verdict on DeepSpeed batch
sizes against DeepSpeed's and transformers' own checks (the versions the lock installs), torchrun's port on one
node against the real torchrun, and Megatron's global-batch rule (Megatron-core's microbatch calculator, which
NeMo 2 runs; NeMo is not installed here, so that one rests on its source, cited in the rule)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest

from workshop_lib.checks import versions
from workshop_lib.checks.launcher_arithmetic import Batches, deepspeed_batch_problem
from workshop_lib.checks.lint import lint_script

# (DeepSpeed config batch numbers, world size): written for one GPU count, run on another.
DEEPSPEED_CASES = [
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}, 4),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}, 8),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16}, 4),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16}, 2),
    ({"train_batch_size": 24, "gradient_accumulation_steps": 2}, 4),
    ({"train_batch_size": 6}, 8),
    ({"train_batch_size": 64}, 8),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 8),
]
# (config, per_device_train_batch_size, gradient_accumulation_steps, world size) for the HF Trainer.
TRAINER_CASES = [
    ({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}, 4, 1, 8),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}, 4, 1, 4),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}, 4, 1, 8),
    ({"train_micro_batch_size_per_gpu": 8}, 4, 1, 2),
    ({"gradient_accumulation_steps": 4, "train_batch_size": "auto"}, 2, 4, 4),
]

_REAL_CHECKS = textwrap.dedent("""
    import json, sys
    from deepspeed.runtime import config as ds_config
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    ds_config.dist.get_rank = lambda *args, **kwargs: 0  # one process: the batch check does not use the rank

    class DataParallel:  # what DeepSpeed asks an mpu for: the data-parallel world size
        def __init__(self, size):
            self.size = size
        def get_data_parallel_world_size(self):
            return self.size
        def get_sequence_parallel_world_size(self):
            return 1

    cases = json.loads(sys.argv[1])
    deepspeed = []
    for config, world in cases["deepspeed"]:
        try:
            ds_config.DeepSpeedConfig(dict(config), mpu=DataParallel(world))
            deepspeed.append(True)
        except AssertionError:
            deepspeed.append(False)
    trainer = []
    for config, micro, accumulation, world in cases["trainer"]:
        Args = type("Args", (TrainingArguments,), {"world_size": world})
        args = Args(output_dir=sys.argv[2], per_device_train_batch_size=micro,
                    gradient_accumulation_steps=accumulation, report_to="none")
        hf = HfTrainerDeepSpeedConfig(dict(config))
        hf.trainer_config_process(args)
        trainer.append(not hf.mismatches)
    print(json.dumps({"deepspeed": deepspeed, "trainer": trainer}))
""")


def _trainer_script(micro: int, accumulation: int, world: int) -> str:
    return (f"#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-node={world}\n#SBATCH --output=slurm-%j.out\n"
            f"torchrun --nproc_per_node={world} run_clm.py --per_device_train_batch_size {micro} "
            f"--gradient_accumulation_steps {accumulation} --deepspeed ds.json --output_dir out\n")


@pytest.mark.slow
def test_deepspeed_batch_verdicts_match_deepspeed_and_transformers(tmp_path):
    """deepspeed 0.19.8 (DeepSpeedConfig._batch_assertion) and transformers 5.23
    (HfTrainerDeepSpeedConfig.trainer_config_process) decide; the linter must agree on every case."""
    cases = {"deepspeed": DEEPSPEED_CASES, "trainer": TRAINER_CASES}
    result = subprocess.run([sys.executable, "-c", _REAL_CHECKS, json.dumps(cases), str(tmp_path / "hf")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    real = json.loads(result.stdout.strip().splitlines()[-1])
    linter = [deepspeed_batch_problem(Batches.of(config), world) is None for config, world in DEEPSPEED_CASES]
    assert linter == real["deepspeed"] and False in linter and True in linter
    verdicts = []
    for config, micro, accumulation, world in TRAINER_CASES:
        (tmp_path / "ds.json").write_text(json.dumps(config))
        findings = lint_script(_trainer_script(micro, accumulation, world), submit_dir=tmp_path)
        verdicts.append(not any(f.rule == "deepspeed-batch-size-mismatch" for f in findings))
    assert verdicts == real["trainer"] and False in verdicts and True in verdicts


def test_deepspeed_batch_arithmetic_without_the_library():
    assert deepspeed_batch_problem(Batches(16, 4, 1), 4) is None
    assert "16 != " not in (deepspeed_batch_problem(Batches(16, 4, 1), 8) or "")
    assert "= 32" in deepspeed_batch_problem(Batches(16, 4, 1), 8)
    assert "smaller than one sample" in deepspeed_batch_problem(Batches(32, 16, None), 4)
    assert deepspeed_batch_problem(Batches(None, 4, 2), 8) is None  # DeepSpeed computes the total itself


@pytest.mark.parametrize("gpus, tensor_parallel, global_batch, fails", [
    (8, 1, 12, True), (8, 1, 16, False), (8, 4, 6, False), (8, 2, 6, True), (4, 1, 12, False)])
def test_nemo_global_batch_is_a_multiple_of_micro_batch_times_data_parallel(gpus, tensor_parallel, global_batch,
                                                                            fails):
    peft = "" if tensor_parallel == 1 else "(peft_scheme=None)"
    script = (f"#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node={gpus}\n#SBATCH --gpus-per-node={gpus}\n"
              "#SBATCH --constraint=a100\n#SBATCH --output=slurm-%j.out\n"
              f"srun singularity exec --nv \"$NEMO_IMAGE\" nemo llm finetune --factory \"llama31_8b{peft}\" "
              f"trainer.devices={gpus} trainer.strategy.tensor_model_parallel_size={tensor_parallel} "
              f"data.global_batch_size={global_batch} data.micro_batch_size=1 -y\n")
    rules = {finding.rule for finding in lint_script(script)}
    assert ("nemo-global-batch-mismatch" in rules) is fails


# ---------------------------------------------------------------------------------------------
# torchrun's port on one node (the fixed-port warning's condition)
# ---------------------------------------------------------------------------------------------
_WORKER = ("import os, torch.distributed as dist; dist.init_process_group('gloo'); "
           "print('port', os.environ['MASTER_PORT'])")


@pytest.mark.slow
def test_single_node_torchrun_ignores_master_port_and_picks_a_free_one(tmp_path):
    """torch 2.13's torchrun on one node, given no port, rendezvous on a free one even when MASTER_PORT names a
    busy port, so the fixed-port warning does not apply. (Handed a busy port with --master_port it stops with
    'EADDRINUSE': the warning's case, left out here because torch takes half a minute to start twice.)"""
    assert versions.at_least("torch", (2, 13))
    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=1"]
        environment = {"MASTER_PORT": str(port), "MASTER_ADDR": "127.0.0.1", "PATH": "/usr/bin:/bin",
                       "OMP_NUM_THREADS": "1"}
        free = subprocess.run([*torchrun, str(worker)], capture_output=True, text=True, timeout=180, env=environment)
        assert free.returncode == 0, free.stderr[-2000:]
        assert f"port {port}" not in free.stdout and "port " in free.stdout
    script = ("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-node=2\n#SBATCH --output=slurm-%j.out\n"
              "export MASTER_PORT=29500\n{launch}\n")
    quiet = lint_script(script.format(launch="torchrun --nproc_per_node=2 train.py"))
    warned = lint_script(script.format(launch="torchrun --nproc_per_node=2 --master_port=$MASTER_PORT train.py"))
    assert quiet == [] and [f.rule for f in warned] == ["fixed-rendezvous-port"]
