"""A plain training loop for the engines HF Trainer cannot run: FSDP on CPU, LoRA+DDP,
tensor/expert parallel and the custom GPT. It writes the same metrics as the Trainer callbacks."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from workshop_lib.train.cli import autocast_dtype
from workshop_lib.train.metrics import MetricsWriter
from workshop_lib.train.runtime import Runtime
from workshop_lib.train.tensor_census import MemoryProbe


@dataclass(frozen=True)
class LoopSettings:
    epochs: float
    max_steps: int  # -1: no limit
    micro_batch: int  # samples per rank per forward pass
    grad_accum: int
    learning_rate: float
    weight_decay: float
    warmup_steps: int
    precision: str
    seed: int
    data_rank: int  # this rank's slice of the data (ranks of one TP group share a slice)
    data_world: int
    clip_norm: float | None = 1.0


@dataclass(frozen=True)
class LoopResult:
    steps: int
    samples_processed: int
    train_runtime_s: float
    final_loss: float
    step_times: list[float]
    eval_loss: float | None
    eval_em: float | None
    eval_f1: float | None
    memory: dict | None = None  # MemoryProbe.outcome(): model-state bytes and step peak of this rank

    def outcome(self) -> dict:
        """The loop's share of the summary record (metrics.jsonl); the entry point adds the rest."""
        return {"train_runtime_s": self.train_runtime_s, "final_loss": self.final_loss,
                "samples_processed": self.samples_processed, "step_times": self.step_times,
                "eval_loss": self.eval_loss, "eval_em": self.eval_em, "eval_f1": self.eval_f1,
                **(self.memory or {})}


def default_loss(model, batch) -> torch.Tensor:
    return model(**batch).loss


def linear_schedule(optimizer, warmup_steps: int, total_steps: int):
    """Linear warm-up then linear decay to zero (the Trainer's default schedule)."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _mean_over_ranks(value: float, device) -> float:
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor) / dist.get_world_size()


def _synchronize(runtime: Runtime) -> None:
    if runtime.device_kind == "cuda":
        torch.cuda.synchronize()


def evaluate_loss(model, dataset, runtime: Runtime, settings: LoopSettings, loss_fn) -> float:
    sampler = DistributedSampler(dataset, num_replicas=settings.data_world, rank=settings.data_rank,
                                 shuffle=False)
    loader = DataLoader(dataset, batch_size=settings.micro_batch, sampler=sampler)
    model.eval()
    losses = []
    with torch.no_grad(), torch.autocast(runtime.device_kind, dtype=autocast_dtype(settings.precision),
                                         enabled=autocast_dtype(settings.precision) is not None):
        for batch in loader:
            batch = {k: v.to(runtime.device) for k, v in batch.items()}
            losses.append(float(loss_fn(model, batch)))
    model.train()
    return _mean_over_ranks(sum(losses) / max(1, len(losses)), runtime.device)


def run_loop(model, optimizer, train_dataset, eval_dataset, runtime: Runtime, writer: MetricsWriter,
             settings: LoopSettings, loss_fn: Callable = default_loss,
             clip: Callable | None = None, answer_quality: Callable | None = None) -> LoopResult:
    """Train ``model`` (already wrapped by its engine). ``clip`` clips gradients the engine's way;
    ``answer_quality()`` returns (EM, F1) and runs once, at the final evaluation."""
    sampler = DistributedSampler(train_dataset, num_replicas=settings.data_world,
                                 rank=settings.data_rank, shuffle=True, seed=settings.seed, drop_last=True)
    loader = DataLoader(train_dataset, batch_size=settings.micro_batch, sampler=sampler, drop_last=True)
    steps_per_epoch = max(1, len(loader) // settings.grad_accum)
    total_steps = math.ceil(settings.epochs * steps_per_epoch)
    if settings.max_steps > 0:
        total_steps = min(total_steps, settings.max_steps)
    scheduler = linear_schedule(optimizer, settings.warmup_steps, total_steps)
    global_batch = settings.micro_batch * settings.grad_accum * settings.data_world
    dtype = autocast_dtype(settings.precision)
    probe = MemoryProbe(device_kind=runtime.device_kind)  # tensor bytes of one step, what the estimator predicts

    model.train()
    step, step_times, last_loss = 0, [], float("nan")
    eval_loss = eval_em = eval_f1 = None
    _synchronize(runtime)
    started = time.perf_counter()
    epoch = 0
    while step < total_steps:
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(steps_per_epoch):
            if step >= total_steps:
                break
            probe.begin(step + 1, model, optimizer)  # its census before the clock starts
            step_started = time.perf_counter()
            micro_losses = []
            for _ in range(settings.grad_accum):
                batch = {k: v.to(runtime.device) for k, v in next(batches).items()}
                with torch.autocast(runtime.device_kind, dtype=dtype, enabled=dtype is not None):
                    loss = loss_fn(model, batch)
                (loss / settings.grad_accum).backward()
                micro_losses.append(float(loss.detach()))
            if clip is not None and settings.clip_norm:
                clip(settings.clip_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            probe.end(step + 1)
            _synchronize(runtime)
            step += 1
            step_time = time.perf_counter() - step_started
            step_times.append(step_time)
            last_loss = _mean_over_ranks(sum(micro_losses) / len(micro_losses), runtime.device)
            writer.step(step, last_loss, scheduler.get_last_lr()[0], step_time, global_batch,
                        epoch + min(1.0, (step - epoch * steps_per_epoch) / steps_per_epoch))
        epoch += 1
        if eval_dataset is not None and len(eval_dataset):
            eval_loss = evaluate_loss(model, eval_dataset, runtime, settings, loss_fn)
            if step >= total_steps and answer_quality is not None:
                eval_em, eval_f1 = answer_quality()
            writer.evaluation(step, eval_loss, eval_em, eval_f1)
    _synchronize(runtime)
    runtime_s = time.perf_counter() - started
    return LoopResult(step, step * global_batch, runtime_s, last_loss, step_times, eval_loss, eval_em, eval_f1,
                      probe.outcome())
