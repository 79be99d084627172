"""Sentences about measurements, written from the reference data when the book builds.

Every ordering and figure the chapters state about real-GPU runs (which ZeRO stage has the lowest peak,
what offload costs, efficiency at N GPUs, what sharding does per rank) is computed here from
``book/reference/*.json``, so re-running the references rewrites the text with them. Each function takes the
results frame of `workshop_lib.book.reference.chapter_views.reference_results` and returns Markdown; tests/test_book_claims.py
recomputes the same facts from the JSON and checks the sentences.
"""

from __future__ import annotations

import math

import pandas as pd

from workshop_lib.book.measurements.series import row_engine, same_series
from workshop_lib.book.pages.cells import is_missing
from workshop_lib.core.vocabulary import GPT, HF, NEMO
from workshop_lib.experiments import known_id
from workshop_lib.results import COMPLETED

MIB = 2**20


def gib(mib: float) -> str:
    """MiB as the text says it: GiB with one decimal."""
    return f"{mib / 1024:.1f} GiB"


def times(ratio: float) -> str:
    return f"{ratio:.1f}×"


def percent(value: float) -> str:
    return f"{value:.0f} %"


class RunsById(dict):
    """Values by experiment id whose lookups (``[id]``, ``get``, ``in``) first check the id against the experiments
    (`experiments.known_id`): a misspelt id raises, naming the closest ids, instead of reading as "not measured"
    and silently dropping the sentence it feeds."""

    def __getitem__(self, experiment_id: str):
        return super().__getitem__(known_id(experiment_id))

    def get(self, experiment_id: str, default=None):
        return super().get(known_id(experiment_id), default)

    def __contains__(self, experiment_id) -> bool:
        return super().__contains__(known_id(experiment_id))


def _runs(results: pd.DataFrame, engine: str) -> RunsById:
    """The completed runs of ``engine`` by id, refused (MixedSeriesError) where they ran on two kinds of card:
    every sentence here divides or orders these runs, which only one series may do (`book.measurements.series`)."""
    done = results[results["state"] == COMPLETED]
    records = [record for record in done.to_dict("records") if row_engine(record) == engine]
    same_series(*records)
    return RunsById((record["id"], record) for record in records)


def _stage_name(record: dict) -> str:
    stage = record.get("zero_stage")
    name = "no DeepSpeed" if is_missing(stage) else f"ZeRO-{int(stage)}"
    if record.get("offload"):
        name += " + offload" + (" (pinned)" if record.get("pin_memory") else "")
    return name


# ---- chapter 3 -------------------------------------------------------------------------------------


def zero_one_gpu(results: pd.DataFrame) -> str:
    """The single-GPU comparison: which setup has the lowest peak, what stages 1-3 do alone, what offload
    and pinned memory cost."""
    runs = _runs(results, HF)
    single = [r for r in runs.values() if r["group"] == "single-gpu"]
    lowest = min(single, key=lambda r: r["allocated_peak_mib"])
    lowest_smi = min(single, key=lambda r: r["gpu0_peak_mib"])
    plain = [r for r in single if not r["offload"]]
    stage0 = runs["zero/single-gpu/zero0"]
    text = (f"On one GPU the lowest peak is **{_stage_name(lowest)}**: {gib(lowest['allocated_peak_mib'])} allocated "
            f"by PyTorch against {gib(stage0['allocated_peak_mib'])} for ZeRO-0")
    if lowest_smi["id"] == lowest["id"]:
        text += f" ({gib(lowest_smi['gpu0_peak_mib'])} against {gib(stage0['gpu0_peak_mib'])} in nvidia-smi). "
    else:
        text += f"; in nvidia-smi the lowest is {_stage_name(lowest_smi)} ({gib(lowest_smi['gpu0_peak_mib'])}). "
    low, high = (min(r["allocated_peak_mib"] for r in plain), max(r["allocated_peak_mib"] for r in plain))
    text += (f"Without offload, stages 0–3 all allocate between {gib(low)} and {gib(high)}: with one GPU there is "
             "nobody to share the model states with. ")
    costs = []
    for stage in (1, 2, 3):
        without, with_ = runs.get(f"zero/single-gpu/zero{stage}"), runs.get(f"zero/single-gpu/zero{stage}-offload")
        if without and with_:
            costs.append(f"stage {stage} {times(without['train_samples_per_s'] / with_['train_samples_per_s'])}")
    if costs:
        text += f"Offload costs time: with it, {', '.join(costs)} fewer samples per second. "
    plain_two, offloaded_two = runs.get("zero/single-gpu/zero2"), runs.get("zero/single-gpu/zero2-offload")
    if plain_two and offloaded_two:
        gpu_drop = (plain_two["gpu0_peak_mib"] - offloaded_two["gpu0_peak_mib"]) / 1024
        host_rise = (offloaded_two["cpu_peak_mib"] - plain_two["cpu_peak_mib"]) / 1024
        text += (f"Offload moves memory from the GPU to the host, but not one for one: for ZeRO-2 the GPU peak "
                 f"(nvidia-smi) falls by {gpu_drop:.1f} GiB and the host peak (psrecord) rises by {host_rise:.1f} GiB. "
                 "The two tools count different things (nvidia-smi the CUDA context and PyTorch's cache too, "
                 "psrecord the whole processes' resident memory), and on the host the CPU optimizer also keeps an "
                 "fp32 copy of the gradients. ")
    text += pinned_memory(results)
    three, two = runs.get("zero/single-gpu/zero3-offload"), runs.get("zero/single-gpu/zero2-offload")
    if three and two and three["allocated_peak_mib"] > two["allocated_peak_mib"]:
        text += (f" Stage 3 + offload, which offloads the parameters too, still peaks higher than stage 2 + offload "
                 f"({gib(three['allocated_peak_mib'])} against {gib(two['allocated_peak_mib'])}): the peak is not "
                 "the model states but the activations and logits, which no stage offloads, plus the buffers "
                 "ZeRO-3 gathers each layer into.")
    return text


def pinned_memory(results: pd.DataFrame) -> str:
    """What pinned memory wins for ZeRO-2 + offload, and why it is stage 2's per-micro-batch gradient traffic
    rather than pinning in general (ZeRO-1 + offload runs as fast unpinned)."""
    runs = _runs(results, HF)
    pinned, unpinned = runs.get("zero/single-gpu/zero2-offload-pinned"), runs.get("zero/single-gpu/zero2-offload")
    stage_1 = runs.get("zero/single-gpu/zero1-offload")
    if not pinned or not unpinned:
        return ""
    rate = {key: record["train_samples_per_s"] for key, record in
            (("pinned", pinned), ("unpinned", unpinned), ("stage 1", stage_1)) if record}
    same = abs(pinned["allocated_peak_mib"] - unpinned["allocated_peak_mib"]) < 0.01 * unpinned["allocated_peak_mib"]
    text = (f"Pinned host memory takes ZeRO-2 + offload from {rate['unpinned']:.1f} to {rate['pinned']:.1f} samples/s "
            f"({times(rate['pinned'] / rate['unpinned'])})" + (" for the same GPU memory" if same else "")
            + f", while the job's host memory peak grows from {gib(unpinned['cpu_peak_mib'])} to "
            f"{gib(pinned['cpu_peak_mib'])} (psrecord).")
    if stage_1 is None or not unpinned.get("grad_accum"):
        return text
    accumulation = int(unpinned["grad_accum"])
    gradient_gb = 2 * int(unpinned["total_params"]) / 1e9  # fp16 gradients, 2 bytes each
    copies = 2 * accumulation - 1
    text += (f" That is not pinning in general: ZeRO-1 + offload, unpinned, already runs at {rate['stage 1']:.1f}. "
             "The difference is what stage 2 does with each micro-batch (DeepSpeed's `stage_1_and_2.py`, "
             "`copy_grads_in_partition`): it reduces gradients after every backward pass, and with offload it "
             "keeps the running sum on the host, copying each micro-batch's fp16 gradients there and, from the "
             f"second micro-batch on, the sum back to the GPU to add the next. With accumulation {accumulation} "
             f"that is {copies} copies of {gradient_gb:.1f} GB, about {copies * gradient_gb:.0f} GB over PCIe per "
             "optimizer step, which stage 1 (gradients summed on the GPU, sent to the host once per step) never "
             "makes. From pageable memory each copy is staged through a driver buffer and waits; from pinned memory "
             "it goes by DMA. So pinning buys back the round trips stage 2 added: pinned ZeRO-2 + offload is "
             f"{percent(100 * rate['pinned'] / rate['stage 1'])} of ZeRO-1 + offload's speed, and keeps stage 2's "
             f"lower GPU peak ({gib(pinned['allocated_peak_mib'])} allocated against "
             f"{gib(stage_1['allocated_peak_mib'])}).")
    return text


def zero_two_gpus(results: pd.DataFrame) -> str:
    """The 2-GPU stage comparison: the order of the peaks and what stage 3 costs in throughput."""
    runs = _runs(results, HF)
    plain = sorted((r for r in runs.values() if r["group"] == "two-gpus" and not r["offload"]),
                   key=lambda r: r["zero_stage"])
    peaks = ", ".join(f"stage {int(r['zero_stage'])} {gib(r['gpu0_peak_mib'])}" for r in plain)
    allocated = ", ".join(f"{gib(r['allocated_peak_mib'])}" for r in plain)
    lowest = min(plain, key=lambda r: r["allocated_peak_mib"])
    by_stage = {int(r["zero_stage"]): r for r in plain}
    text = (f"On two GPUs without offload, the peak per GPU reads {peaks} in nvidia-smi ({allocated} allocated by "
            f"PyTorch): the lowest allocation is **stage {int(lowest['zero_stage'])}**'s")
    lower = [by_stage[s]["gpu0_peak_mib"] for s in (1, 2) if s in by_stage]
    if 3 in by_stage and any(by_stage[3]["gpu0_peak_mib"] > peak for peak in lower):
        text += ", and stage 3 sits *above* stages 1–2, not below them"
    text += ". "
    if 1 in by_stage and 3 in by_stage:
        text += (f"Stage 3 also runs at {by_stage[3]['train_samples_per_s']:.1f} samples/s against "
                 f"{by_stage[1]['train_samples_per_s']:.1f} for stage 1 "
                 f"({times(by_stage[1]['train_samples_per_s'] / by_stage[3]['train_samples_per_s'])} slower). ")
    offloaded = [r for r in runs.values() if r["group"] == "two-gpus" and r["offload"]]
    if offloaded:
        best = min(offloaded, key=lambda r: r["allocated_peak_mib"])
        text += (f"With offload the lowest is stage {int(best['zero_stage'])} + offload "
                 f"({gib(best['allocated_peak_mib'])} allocated).")
    return text


def model_states_versus_peak(results: pd.DataFrame, experiment_id: str = "zero/two-gpus/zero3") -> str:
    """Why the measured peak is far above the formula's model states: the estimator's breakdown of one run."""
    from workshop_lib.book.measurements.memory_predictions import predict_record

    record = _runs(results, HF)[experiment_id]
    estimate = predict_record(record)
    parameters = int(record["total_params"])
    states = estimate.model_states / MIB
    return (f"The table of stages counts **model states** only. For ZeRO-3 on {int(record['gpus'])} GPUs they come to "
            f"{gib(states)} per GPU (16 bytes × {parameters / 1e6:.0f} M parameters / {int(record['gpus'])}), yet the "
            f"run allocated {gib(record['allocated_peak_mib'])}. The memory estimator (`workshop estimate`) puts the "
            f"rest in the activations ({gib(estimate.activations / MIB)}), the logits over BLOOM's 250,880-word "
            f"vocabulary ({gib(estimate.logits / MIB)} for {int(record['per_device_batch'])} × 512 tokens) and "
            f"temporaries such as ZeRO-3's gathered layers and buckets ({gib(estimate.temporaries / MIB)}). No ZeRO "
            "stage divides activations or logits, so at this batch they, not the model states, decide the peak.")


def zero_weak_scaling(results: pd.DataFrame) -> str:
    """Multi-GPU weak scaling with ZeRO-0 on one node, from the per-step time."""
    runs = _runs(results, HF)
    one = runs.get("zero/single-gpu/zero0")
    multi = sorted((r for r in runs.values() if r["group"] == "multi-gpu"), key=lambda r: r["gpus"])
    if not one or not multi:
        return ""
    parts = [f"{int(r['gpus'])} GPUs {r['mean_step_time_s']:.3f} s "
             f"({percent(100 * one['mean_step_time_s'] / r['mean_step_time_s'])})" for r in multi]
    return (f"Each GPU does the same work, so the step time should stay flat: {one['mean_step_time_s']:.3f} s on one "
            f"GPU (ZeRO-0), {', '.join(parts)} efficiency (mean step time over the 30 steps). The total throughput "
            f"grows from {one['train_samples_per_s']:.1f} to "
            f"{multi[-1]['train_samples_per_s']:.1f} samples/s.")


def engine_scaling(results: pd.DataFrame) -> str:
    """DDP, ZeRO-2 and FSDP FULL_SHARD on 1, 2 and 4 GPUs: efficiency from the median step time."""
    runs = _runs(results, HF)
    steps = RunsById((key, runs[key]["median_step_time_s"]) for key in runs)

    def efficiency(engine: str, gpus: int) -> float:
        return 100 * steps[f"scaling/{engine}/1-gpu"] / steps[f"scaling/{engine}/{gpus}-gpu{'s' if gpus > 1 else ''}"]

    ddp, zero2, fsdp = (efficiency(e, 4) for e in ("ddp", "zero2", "full-shard"))
    zero2_base = steps["scaling/zero2/1-gpu"] / steps["scaling/ddp/1-gpu"]
    return (f"At 4 GPUs the median step time gives **DDP {percent(ddp)}**, **ZeRO-2 {percent(zero2)}** and **FSDP "
            f"FULL_SHARD {percent(fsdp)}** weak-scaling efficiency. ZeRO-2's figure is against its *own* one-GPU step, "
            f"which is {times(zero2_base)} DDP's ({steps['scaling/zero2/1-gpu']:.3f} s against "
            f"{steps['scaling/ddp/1-gpu']:.3f} s): its optimizer step works on 1/N of the parameters, so the slow "
            f"baseline shrinks as GPUs are added"
            + (", which is how it passes 100 %" if zero2 > 100 else "")
            + f". In absolute terms ZeRO-2's 4-GPU step ({steps['scaling/zero2/4-gpus']:.3f} s) is still "
            f"{'slower' if steps['scaling/zero2/4-gpus'] > steps['scaling/ddp/4-gpus'] else 'faster'} than DDP's "
            f"({steps['scaling/ddp/4-gpus']:.3f} s)."
            + (f" DDP above 100 % is not a gain from adding GPUs: its 4-GPU median step is "
               f"{1000 * (steps['scaling/ddp/1-gpu'] - steps['scaling/ddp/4-gpus']):.0f} ms shorter than its 1-GPU one "
               f"({steps['scaling/ddp/1-gpu']:.3f} s), each from a single run, and no work is removed by DDP. A few "
               "per cent is what separate runs of the same job can differ by (clocks, which GPU of the machine, "
               "what else ran), so read it as no measurable overhead." if ddp > 100 else ""))


def losses_differ(results: pd.DataFrame) -> str:
    """The train losses of the same 30 steps under different engines, and what can and cannot explain them."""
    runs = _runs(results, HF)
    single = sorted((r for r in runs.values() if r["group"] in ("baseline", "single-gpu") and not r["offload"]),
                    key=lambda r: (-1 if is_missing(r.get("zero_stage")) else r["zero_stage"]))
    values = ", ".join(f"{_stage_name(r)} {r['train_loss']:.3f}" for r in single)
    return (f"The train losses after the same 30 steps on one GPU: {values}. The weights are random and the steps "
            "few, so these are not quality figures, but the same updates should give the same loss. ZeRO-1 and -2 "
            "follow the Trainer's own run closely: they shard the same arithmetic. ZeRO-3 sums gradients in another "
            "order and drifts a little. ZeRO-0 is the odd one: it is the one stage that DeepSpeed runs through its "
            "separate fp16 optimizer instead of the ZeRO optimizer, with its own dynamic loss scaling, which skips "
            "a step whose gradients overflow. Skipped steps were not recorded, so this workshop has not shown that "
            "they are the cause; the multi-GPU runs, which also use stage 0, end at the same higher loss.")


def steps_per_epoch(samples: int, per_device_batch: int, grad_accum: int, gpus: int = 1) -> tuple[int, int]:
    """(batches per epoch per GPU, optimizer steps per epoch) as the Trainer counts them: both rounded up."""
    batches = math.ceil(samples / (per_device_batch * gpus))
    return batches, math.ceil(batches / grad_accum)


# ---- chapter 4 -------------------------------------------------------------------------------------


def fsdp_single_gpu(results: pd.DataFrame) -> str:
    """FSDP FULL_SHARD on one GPU against the plain Trainer: nothing to shard with, what it costs and saves."""
    runs = _runs(results, HF)
    plain, fsdp = runs.get("fsdp/baseline"), runs.get("fsdp/single-gpu/full-shard")
    if not plain or not fsdp:
        return ""
    slower = 100 * (1 - fsdp["train_samples_per_s"] / plain["train_samples_per_s"])
    return (f"On one GPU FSDP has no other rank to shard with: the model states stay whole "
            f"({gib(fsdp['rank0_model_state_mib'])} on the rank, as without FSDP: "
            f"{gib(plain['rank0_model_state_mib'])}), yet every unit is still gathered before and freed after "
            f"each pass. FULL_SHARD trains {fsdp['train_samples_per_s']:.1f} samples/s against the plain "
            f"Trainer's {plain['train_samples_per_s']:.1f} ({percent(slower)} fewer). Its allocated peak during "
            f"a training step is {gib(fsdp['allocated_peak_mib'])} against {gib(plain['allocated_peak_mib'])}: what "
            f"it saves is in the step's passing tensors, not in the model states, and the nvidia-smi peak, which "
            f"counts the allocator's cache, reads {gib(fsdp['gpu0_peak_mib'])} against {gib(plain['gpu0_peak_mib'])}. FSDP on one GPU is a rehearsal of the code path, not a saving.")


def fsdp_strategies(results: pd.DataFrame) -> str:
    """The strategy comparison on 2 × 2 GPUs: model states per rank, SHARD_GRAD_OP vs FULL_SHARD, offload."""
    runs = _runs(results, HF)
    full, grad_op = runs.get("fsdp/strategies/full-shard"), runs.get("fsdp/strategies/shard-grad-op")
    offload = runs.get("fsdp/strategies/full-shard-offload")
    if not full or not grad_op:
        return ""
    parameters = int(full["total_params"])
    ranks = int(full["gpus"])
    text = (f"Every rank holds {full['rank0_model_state_mib']:,.0f} MiB of model states: 16 bytes × "
            f"{parameters / 1e6:.0f} M parameters / {ranks} = {16 * parameters / ranks / MIB:,.0f} MiB, on its GPU "
            "in the rows without offload and in host memory in the offload rows. "
            f"SHARD_GRAD_OP runs at {grad_op['train_samples_per_s']:.1f} samples/s against FULL_SHARD's "
            f"{full['train_samples_per_s']:.1f} "
            f"({percent(100 * (grad_op['train_samples_per_s'] / full['train_samples_per_s'] - 1))} faster) for "
            f"{(grad_op['allocated_peak_mib'] - full['allocated_peak_mib']) / 1024:.1f} GiB more allocated per GPU, "
            "because it keeps the gathered parameters from the forward to the backward pass. ")
    if offload:
        text += (f"CPU offload takes FULL_SHARD from {full['train_samples_per_s']:.1f} to "
                 f"{offload['train_samples_per_s']:.1f} samples/s "
                 f"({times(full['train_samples_per_s'] / offload['train_samples_per_s'])} slower) and its GPU peak "
                 f"from {gib(full['allocated_peak_mib'])} to {gib(offload['allocated_peak_mib'])} allocated per GPU; "
                 f"the processes of one node then peak at {gib(offload['cpu_peak_mib'])} of host memory (psrecord: "
                 "the whole training processes, Python and CUDA included, not only what offload moved).")
    return text


def fsdp_one_node(results: pd.DataFrame) -> str:
    """FULL_SHARD on 1, 2 and 4 GPUs: model states per rank fall as 1/N, the step time does not."""
    runs = _runs(results, HF)
    rows = [runs[key] for key in ("fsdp/single-gpu/full-shard", "fsdp/multi-gpu/2-gpus", "fsdp/multi-gpu/4-gpus")
            if key in runs]
    if len(rows) < 2:
        return ""
    states = ", ".join(f"{r['rank0_model_state_mib']:,.0f}" for r in rows)
    step = ", ".join(f"{r['mean_step_time_s']:.3f}" for r in rows)
    last = rows[-1]
    gpus = ", ".join(str(int(r["gpus"])) for r in rows)
    return (f"With FULL_SHARD the model states per GPU fall as 1/N: {states} MiB on {gpus} "
            f"GPUs, and the allocated peak from {gib(rows[0]['allocated_peak_mib'])} to "
            f"{gib(last['allocated_peak_mib'])}. The mean step time goes {step} s: each GPU does the same work "
            f"(30 steps of the same batch per GPU), so weak-scaling efficiency at {int(last['gpus'])} GPUs is "
            f"{percent(100 * rows[0]['mean_step_time_s'] / last['mean_step_time_s'])}; every micro-batch gathers "
            "the parameters again.")


def gpt_parameter_counts(hidden: int, ffn: int, vocab: int, seq_len: int, layers: int) -> dict[str, int]:
    """Parameters of the custom GPT (`workshop_lib/train/gpt_model.py`) by part; the output layer is tied
    to the token embedding and adds none."""
    block = (3 * hidden * hidden + 3 * hidden) + (hidden * hidden + hidden) + (hidden * ffn + ffn) \
        + (ffn * hidden + hidden) + 2 * 2 * hidden  # qkv, proj, two feed-forward layers, two LayerNorms
    parts = {"token embedding": vocab * hidden, "position embedding": seq_len * hidden,
             "blocks": layers * block, "final norm": 2 * hidden}
    parts["total"] = sum(parts.values())
    return parts


def gpt_architecture(results: pd.DataFrame, experiment_id: str = "fsdp/gpt/1-gpu") -> str:
    """The custom GPT's shape as the reference ran it, and where its parameters are."""
    record = _runs(results, GPT)[experiment_id]
    shape = {key: int(record["run_settings"][key]) for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len")}
    parts = gpt_parameter_counts(shape["hidden"], shape["ffn"], shape["vocab"], shape["seq_len"], shape["layers"])
    block = parts["blocks"] // shape["layers"]
    return (f"As the reference ran it: {shape['layers']} blocks of width {shape['hidden']} with {shape['heads']} attention heads "
            f"and a feed-forward layer of {shape['ffn']}, a vocabulary of {shape['vocab']:,} and {shape['seq_len']} "
            f"positions: {parts['total'] / 1e6:.1f} M parameters ({int(record['total_params']) / 1e6:.1f} M counted "
            f"by the run). The token embedding holds {parts['token embedding'] / 1e6:.1f} M of them, each block "
            f"{block / 1e6:.1f} M, so doubling the layers does not double the model.")


def gpt_depth(results: pd.DataFrame) -> str:
    """Weak scaling by depth and the two ways of counting throughput."""
    runs = _runs(results, GPT)
    two, four = runs.get("fsdp/weak-scaling/2-gpus"), runs.get("fsdp/weak-scaling/4-gpus")
    one = runs.get("fsdp/gpt/1-gpu")
    text = ""
    if two and four:
        text += (f"Weak scaling by depth, from the mean step time: {two['mean_step_time_s']:.3f} s with "
                 f"{int(two['gpt_layers'])} layers on 2 GPUs, {four['mean_step_time_s']:.3f} s with "
                 f"{int(four['gpt_layers'])} layers on 4: "
                 f"{percent(100 * two['mean_step_time_s'] / four['mean_step_time_s'])} efficiency. ")
    if one:
        text += (f"The custom GPT on one GPU reports {one['train_samples_per_s']:.1f} samples/s over its whole run "
                 f"and {one['step_samples_per_s']:.1f} from the timed steps alone: the whole run includes start-up, "
                 "the first steps (CUDA kernels loaded and memory allocated) and evaluation.")
    return text


__all__ = ["engine_scaling", "fsdp_one_node", "fsdp_single_gpu", "fsdp_strategies", "gib", "gpt_architecture", "gpt_depth",
           "gpt_parameter_counts", "losses_differ",
           "model_states_versus_peak", "pinned_memory", "steps_per_epoch", "zero_one_gpu", "zero_two_gpus", "zero_weak_scaling"]


# ---- chapters 1-2: NeMo itself -------------------------------------------------------------------


def _card(record: dict) -> str:
    return str(record.get("run_gpu") or "one kind of card").removeprefix("NVIDIA ")


def nemo_data_parallel(results: pd.DataFrame, model: str = "llama") -> str:
    """Chapter 1's measured data-parallel speed-up: NeMo's mean step time on 1, 2 and 4 GPUs of one card."""
    runs = _runs(results, NEMO)
    series = sorted((r for r in runs.values() if r.get("group") == model and not is_missing(r.get("mean_step_time_s"))),
                    key=lambda r: r["gpus"])
    if len(series) < 2:
        return ""
    base = series[0]
    steps = ", ".join(f"{int(r['gpus'])} GPU{'s' if r['gpus'] > 1 else ''} {r['mean_step_time_s']:.2f} s"
                      for r in series)
    speedups = ", ".join(f"{times(base['mean_step_time_s'] / r['mean_step_time_s'])} on {int(r['gpus'])}"
                         for r in series[1:])
    peaks = [r["gpu_peak_max_mib"] for r in series if not is_missing(r.get("gpu_peak_max_mib"))]
    memory = ""
    if len(peaks) == len(series) and all(is_missing(r.get("expert_parallel")) for r in series):
        memory = (f" Every GPU holds the whole frozen model and its adapters, so the peak per GPU stays near "
                  f"{gib(min(peaks))}–{gib(max(peaks))} whatever the GPU count.")
    elif len(peaks) == len(series):
        memory = (" The experts are spread over the GPUs (EP = GPUs), so the peak per GPU falls with their count: "
                  + ", ".join(f"{gib(peak)} on {int(r['gpus'])}" for peak, r in zip(peaks, series)) + ".")
    plural = "s" if base["gpus"] > 1 else ""
    return (f"NeMo {base.get('nemo_version') or ''} itself, one optimizer step of the same global batch (8 records) "
            f"on {_card(base)}: {steps}. Against {int(base['gpus'])} GPU{plural}, that is {speedups} GPUs: each GPU computes "
            f"a smaller share of the micro-batches, and the gradient all-reduce of the small LoRA adapters costs "
            f"little.{memory}")


def nemo_packing(results: pd.DataFrame, unpacked_id: str = "lora/llama/1-gpu",
                 packed_id: str = "lora/llama/1-gpu-packed") -> str:
    """The packing lesson in numbers: real tokens per step, step time, tokens/s, GPU busy and memory."""
    runs = _runs(results, NEMO)
    plain, packed = runs.get(unpacked_id), runs.get(packed_id)
    if not (plain and packed) or any(is_missing(r.get("tokens_per_s")) for r in (plain, packed)):
        return ""
    same_series(plain, packed)
    speedup = packed["tokens_per_s"] / plain["tokens_per_s"]
    more_tokens = packed["tokens_per_step"] / plain["tokens_per_step"]
    busy = [r.get("gpu0_util_busy_avg_pct") for r in (plain, packed)]
    busy_text = (f"; the GPU was busy {percent(busy[0])} of the time without packing and {percent(busy[1])} with it"
                 if not any(is_missing(b) for b in busy) else "")
    return (f"Packing, measured by NeMo on one {_card(plain)}: without it each of the step's 8 micro-batches is one "
            f"record, {plain['tokens_per_step']:,.0f} real tokens per step in {plain['mean_step_time_s']:.2f} s "
            f"({plain['tokens_per_s']:,.0f} tokens/s); packed into sequences of 2,048 tokens, the same 8 micro-batches "
            f"carry {packed['tokens_per_step']:,.0f} real tokens in {packed['mean_step_time_s']:.2f} s "
            f"({packed['tokens_per_s']:,.0f} tokens/s): {times(speedup)} the tokens per second{busy_text}. The step "
            f"takes {times(packed['mean_step_time_s'] / plain['mean_step_time_s'])} as long for "
            f"{times(more_tokens)} the tokens, because the unpacked step was "
            f"waiting on kernel launches, not on arithmetic. Peak memory grows from {gib(plain['gpu_peak_max_mib'])} to "
            f"{gib(packed['gpu_peak_max_mib'])} (longer sequences hold more activations). Per step, the packed run also "
            f"learns from about {more_tokens:.0f} times as many records, so its "
            f"loss falls faster per step; per token trained it falls slower (the figure), because the unpacked run "
            f"takes that many more optimizer steps for the same tokens, and in a 60-step run with a 50-step warm-up "
            f"the steps set the pace. Packing shortens an epoch in steps: with it, revisit the global batch and the "
            f"learning-rate schedule.")


def nemo_tensor_parallel(results: pd.DataFrame) -> str:
    """Chapter 2's measured Llama layouts on 4 GPUs: TP 2 x DP 2 against TP 4."""
    runs = _runs(results, NEMO)
    pair = [runs.get("model-parallel/llama/tp2-dp2"), runs.get("model-parallel/llama/tp4")]
    if not all(pair) or any(is_missing(r.get("mean_step_time_s")) for r in pair):
        return ""
    tp2, tp4 = pair
    return (f"Measured by NeMo on 4 {_card(tp2)} GPUs, full fine-tune: TP 2 × DP 2 took {tp2['mean_step_time_s']:.2f} s "
            f"per step at {gib(tp2['gpu_peak_max_mib'])} per GPU, TP 4 {tp4['mean_step_time_s']:.2f} s at "
            f"{gib(tp4['gpu_peak_max_mib'])}. Splitting every layer four ways saves memory "
            f"({gib(tp2['gpu_peak_max_mib'] - tp4['gpu_peak_max_mib'])} per GPU) but costs "
            f"{times(tp4['mean_step_time_s'] / tp2['mean_step_time_s'])} the step time: each layer now waits on "
            f"all-reduces among four GPUs, on matrices a quarter as wide, while TP 2 × DP 2 splits the batch instead "
            f"and exchanges gradients once per step. Use the smallest TP that fits; add GPUs as data parallel.")


def nemo_reduced_mixtral(results: pd.DataFrame) -> str:
    """Chapter 2's reduced-depth Mixtral layouts: what tensor x expert and pipeline x expert cost."""
    runs = _runs(results, NEMO)
    rows = [r for r in runs.values() if r.get("group") == "mixtral-reduced" and not is_missing(r.get("mean_step_time_s"))]
    if len(rows) < 2:
        return ""
    by_layout = {("PP" if int(r.get("pipeline_parallel") or 1) > 1 else "TP"): r for r in rows}
    tp, pp = by_layout.get("TP"), by_layout.get("PP")
    if not (tp and pp):
        return ""
    layers = int(tp.get("num_layers") or 0)
    return (f"At Mixtral's full width with {layers} of its 32 layers (so that it fits 4 GPUs; not the 16-GPU layouts), "
            f"NeMo measured on {_card(tp)}: TP 2 × EP 2 with sequence parallelism {tp['mean_step_time_s']:.2f} s per "
            f"step, PP 2 × EP 2 {pp['mean_step_time_s']:.2f} s, both near {gib(tp['gpu_peak_max_mib'])} per GPU. With "
            f"tensor parallelism every layer does two all-reduces (or, with SP, all-gathers and reduce-scatters) in "
            f"the forward pass and two in the backward, besides the experts' all-to-all; the pipeline sends one "
            f"activation tensor per micro-batch between the two stages and pays a bubble instead. At this depth and "
            f"batch the pipeline's cost is the smaller one; with all 32 layers and the 16-GPU layouts, both grow.")
