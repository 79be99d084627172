"""HF Trainer callbacks that feed ``metrics.jsonl`` (seed 003's speed and memory callbacks, folded
into the one metrics writer)."""

from __future__ import annotations

import gc
import time

from transformers import TrainerCallback

from workshop_lib.train.metrics import MetricsWriter


class MetricsCallback(TrainerCallback):
    """Times each optimizer step and writes step and eval records as the Trainer logs them."""

    def __init__(self, writer: MetricsWriter, global_batch: int, device_kind: str):
        self.writer = writer
        self.global_batch = global_batch
        self.device_kind = device_kind
        self.step_started = None
        self.last_step_time = None

    def _synchronize(self):
        if self.device_kind == "cuda":  # CUDA work is asynchronous; time what actually ran
            import torch

            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, **kwargs):
        self._synchronize()
        self.step_started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._synchronize()
        self.last_step_time = time.perf_counter() - self.step_started

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs and self.last_step_time is not None:
            self.writer.step(state.global_step, logs["loss"], logs.get("learning_rate", 0.0),
                             self.last_step_time, self.global_batch, logs.get("epoch", state.epoch or 0.0))
        if "eval_loss" in logs:
            self.writer.evaluation(state.global_step, logs["eval_loss"])


class ShardSizeCallback(TrainerCallback):
    """Counts this rank's resident parameters after the first optimizer step.

    Between steps every FSDP unit is resharded, so the count is the shard. Counted after training
    instead, the root unit (BLOOM's 257 M-parameter embedding) may still be gathered from the last
    evaluation forward, and the count would overstate what the rank keeps.
    """

    def __init__(self, count_parameters):
        self.count_parameters = count_parameters
        self.local_params: int | None = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.local_params is None and model is not None:
            self.local_params = self.count_parameters(model)


class MemoryProbeCallback(TrainerCallback):
    """Measures the second optimizer step's tensor bytes (see ``workshop_lib.train.tensor_census``).

    on_step_begin comes before the step's first forward, on_step_end after its ``zero_grad``; the model
    states are counted inside, by a hook on the optimizer that really updates (DeepSpeed steps inside
    the backward of the last micro-batch, before the Trainer's own ``optimizer.step()`` call).
    """

    def __init__(self, probe):
        self.probe = probe

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is not None and optimizer is not None:
            self.probe.begin(state.global_step + 1, model, optimizer)

    def on_step_end(self, args, state, control, **kwargs):
        self.probe.end(state.global_step)  # global_step already counts this step


class GcFreezeCallback(TrainerCallback):
    """The recipe's ``gc-freeze``: at train begin, collect once and freeze the survivors; unfreeze at
    train end. A CPU-bound step (the tuned recipe's is) otherwise pays for full collections that walk
    every object of torch, transformers and the model."""

    def on_train_begin(self, args, state, control, **kwargs):
        gc.collect()
        gc.freeze()

    def on_train_end(self, args, state, control, **kwargs):
        gc.unfreeze()
