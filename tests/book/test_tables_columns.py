"""Every table carries exactly the seeds' columns (plus the documented derived extras), and the derived
columns follow the definitions: time/memory scaling (seeds 000/001), strong-scaling speedup and efficiency,
weak-scaling efficiency."""

import json
import os
import re
from pathlib import Path

import pytest
from repo_paths import REPO

from workshop_lib.book.tables import ADDED_COLUMNS, SEED_COLUMNS, chapter_tables

# The source material sits beside the checkout (../shared/seeds) in the team's workspace.
SEEDS = Path(os.environ.get("WORKSHOP_SEEDS_DIR", REPO.parent / "shared" / "seeds"))


def _seed_headers(pattern: str) -> list[list[str]]:
    """Header rows of the markdown tables in a seed file (cells stripped of ** and spaces)."""
    [path] = SEEDS.glob(pattern)
    lines = path.read_text().splitlines()
    headers = []
    for line, below in zip(lines, lines[1:]):
        line = line.strip()
        if line.startswith("|") and re.match(r"^\|[\s:|-]+\|?$", below.strip()):
            headers.append([cell.strip().strip("*").strip() for cell in line.strip().strip("|").split("|")])
    return headers


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the seeds are not on this machine")
def test_declared_column_sets_are_the_seeds_own():
    nemo = [h for h in _seed_headers("000_*.txt") + _seed_headers("001_*.txt") if h[0] == "GPUs"]
    assert {tuple(h[:8]) for h in nemo} == {tuple(SEED_COLUMNS["nemo"][:8])}
    zero = _seed_headers("002_*.txt")
    assert SEED_COLUMNS["zero-baseline"] in zero
    assert SEED_COLUMNS["zero-single-gpu"] in zero
    fsdp = _seed_headers("003_*.txt")
    for key in ("fsdp-scaling", "gpt-scaling", "weak-scaling"):
        assert SEED_COLUMNS[key] in fsdp, key
    # seed 003's baseline list: Metric | Log Location & Extraction | Your Value
    assert SEED_COLUMNS["fsdp-baseline"] in fsdp


def _empty_tables(tmp_path):
    return {chapter: {t.title: t.frame for t in chapter_tables(chapter, tmp_path)} for chapter in (1, 2, 3, 4)}


def _seed_then_added(columns, key: str) -> bool:
    """The seed's columns in the seed's order, every other column one of the documented extras."""
    seed = [c for c in columns if c in SEED_COLUMNS[key]]
    extra = [c for c in columns if c not in SEED_COLUMNS[key]]
    return seed == SEED_COLUMNS[key] and set(extra) <= set(ADDED_COLUMNS.get(key, []))


def test_tables_carry_the_seed_columns(tmp_path):
    tables = _empty_tables(tmp_path)
    # Nothing completed: the ratio columns name the chapter's smallest layout (chapter 2: 4 GPUs, TP=2 x DP=2).
    # Chapter 2 names each row's layout first: two of its layouts use 4 GPUs.
    for chapter, baseline, first in ((1, 1, []), (2, 4, ["Layout"])):
        frame = next(iter(tables[chapter].values()))
        seed = [c.replace("{n}", str(baseline)) for c in SEED_COLUMNS["nemo"]]
        assert list(frame.columns) == first + seed + ADDED_COLUMNS["nemo"]
    three, four = tables[3], tables[4]
    assert list(three["Baseline: HF Trainer without DeepSpeed"].columns) == SEED_COLUMNS["zero-baseline"]
    assert _seed_then_added(three["ZeRO stages on one GPU (with and without CPU offload)"].columns, "zero-single-gpu")
    assert list(four["Baseline: HF Trainer without FSDP"].columns) == SEED_COLUMNS["fsdp-baseline"]
    for title in ("BLOOM-560m, FSDP on one node", "BLOOM-560m, FSDP across nodes"):
        assert _seed_then_added(four[title].columns, "fsdp-scaling")
        assert "Parallel Efficiency (%)" in four[title].columns  # no run: the seed's meaning, strong scaling
    for title in ("Custom GPT, FSDP on one node", "Custom GPT, FSDP across nodes"):
        assert _seed_then_added(four[title].columns, "gpt-scaling")
    assert _seed_then_added(four["Custom GPT weak scaling by depth"].columns, "weak-scaling")
    assert list(four["BLOOM-560m, FSDP across nodes"]["Setup"]) == ["Single Node", "2 Node", "4 Node", "8 Node"]


def _summary_run(runs: Path, experiment_id: str, **summary) -> None:
    folder = runs / experiment_id / "train"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"kind": "summary", **summary}) + "\n")


def test_strong_scaling_factors_and_efficiency(tmp_path):
    # FSDP on one node, fixed data set: T_1 = 100 s, T_2 = 60 s, T_4 = 40 s.
    for experiment_id, runtime, rate, gpus in (("fsdp/single-gpu/full-shard", 100.0, 5.0, 1),
                                               ("fsdp/multi-gpu/2-gpus", 60.0, 8.0, 2),
                                               ("fsdp/multi-gpu/4-gpus", 40.0, 12.5, 4)):
        _summary_run(tmp_path, experiment_id, train_runtime_s=runtime, samples_per_s=rate, final_loss=1.0,
                     world_size=gpus)
    table = {t.title: t.frame for t in chapter_tables(4, tmp_path)}["BLOOM-560m, FSDP on one node"]
    rows = table.set_index("Total GPUs")
    assert list(rows["Runtime Scale Factor"])[:3] == [1.0, round(100 / 60, 2), 2.5]  # speedup T_1 / T_N
    assert list(rows["Samples/s Scale Factor"])[:3] == [1.0, 1.6, 2.5]  # S_N / S_1
    assert list(rows["Parallel Efficiency (%)"])[:3] == [100.0, round(100 * 100 / (2 * 60), 1), 62.5]
    assert rows.loc[8, "Parallel Efficiency (%)"] == "MISSING"


def test_weak_scaling_rows_of_chapter_3(tmp_path):
    # Equal work per GPU: the one-GPU ZeRO-0 run is the reference (T_1 = 10 s).
    # Efficiency from the per-step time (T_1 = 0.4 s, T_2 = 0.5 s), not from the runtimes (start-up included).
    _summary_run(tmp_path, "zero/single-gpu/zero0", train_runtime_s=10.0, mean_step_time_s=0.4, samples_per_s=4.0,
                 world_size=1)
    _summary_run(tmp_path, "zero/multi-gpu/2-gpus", train_runtime_s=9.0, mean_step_time_s=0.5, samples_per_s=6.0,
                 world_size=2)
    table = {t.title: t.frame for t in chapter_tables(3, tmp_path)}["Multi-GPU weak scaling (500 samples per GPU)"]
    rows = table.set_index("Metric")
    assert rows.loc["Weak Scaling Efficiency vs 1 GPU (%)", "2 GPUs"] == 80.0  # T_1 / T_N
    assert rows.loc["Throughput Scaling vs 1 GPU", "2 GPUs"] == 1.5
    assert rows.loc["Weak Scaling Efficiency vs 1 GPU (%)", "4 GPUs"] == "MISSING"


def test_tiny_stand_ins_fill_the_nemo_table_from_metrics(tmp_path):
    """Chapter 1 on the tiny profile: no NeMo log, no nvidia-smi — metrics.jsonl and the footer fill it."""
    for experiment_id, total, peak, step in (("lora/llama/1-gpu", "00:00:20", 700.0, 0.5),
                                             ("lora/llama/2-gpus", "00:00:10", 560.0, 0.25)):
        folder = tmp_path / experiment_id
        (folder / "train").mkdir(parents=True)
        lines = [{"kind": "step", "step": 3, "loss": 6.23456, "lr": 0.0, "step_time_s": step, "samples_per_s": 1.0,
                  "epoch": 1.0},
                 {"kind": "summary", "engine": "lora", "world_size": 1, "final_loss": 6.2, "samples_per_s": 1.0,
                  "peak_memory_mib_per_rank": [peak, 1.0], "peak_memory_kind": "cpu_max_rss"}]
        (folder / "train" / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
        (folder / "slurm-1.out").write_text(f"===\n Job finished\n End time   : 2026-11-21 15:37:13\n"
                                            f" Total time : {total}\n Exit status: 0\n===\n")
    [llama, _] = chapter_tables(1, tmp_path)
    one, two = llama.frame.to_dict("records")[:2]
    assert one["Train step time (s)"] == 0.5 and one["Last reduced_train_loss"] == 6.2346
    assert one["GPU 0 Peak (MiB)"] == 700.0 and two["GPU 0 Peak (MiB)"] == 560.0
    assert two["Time scaling vs 1 GPU"] == 2.0 and two["Peak memory scaling vs 1 GPU"] == 1.25
    assert "resident set size" in llama.note


def test_fixed_step_runs_are_labelled_weak_scaling_with_step_time_efficiency(tmp_path):
    # Three runs capped at the same number of optimizer steps with the same batch per GPU: equal work per GPU.
    for experiment_id, runtime, step, gpus in (("fsdp/single-gpu/full-shard", 30.0, 0.40, 1),
                                               ("fsdp/multi-gpu/2-gpus", 20.0, 0.50, 2),
                                               ("fsdp/multi-gpu/4-gpus", 25.0, 0.64, 4)):
        _summary_run(tmp_path, experiment_id, train_runtime_s=runtime, mean_step_time_s=step, samples_per_s=1.0,
                     final_loss=1.0, world_size=gpus, settings={"max_steps": 30, "per_device_batch": 1})
    [table] = [t for t in chapter_tables(4, tmp_path) if t.title == "BLOOM-560m, FSDP on one node"]
    rows = table.frame.set_index("Total GPUs")
    assert "Parallel Efficiency (%)" not in table.frame.columns
    assert list(rows["Weak Scaling Efficiency (%)"])[:3] == [100.0, 80.0, 62.5]  # 0.40 / step time
    assert list(rows["Mean Step Time (s)"])[:3] == [0.4, 0.5, 0.64]
    assert "weak scaling" in table.note and "30 optimizer steps" in table.note


def test_a_data_set_that_grows_with_the_gpus_is_weak_scaling_too(tmp_path):
    for experiment_id, step, gpus in (("fsdp/gpt/1-gpu", 0.1, 1), ("fsdp/gpt/2-gpus", 0.125, 2)):
        _summary_run(tmp_path, experiment_id, engine="gpt", train_runtime_s=10.0, mean_step_time_s=step,
                     samples_per_s=1.0, world_size=gpus, settings={"samples_per_gpu": 500})
    [table] = [t for t in chapter_tables(4, tmp_path) if t.title == "Custom GPT, FSDP on one node"]
    assert list(table.frame["Weak Scaling Efficiency (%)"])[:2] == [100.0, 80.0]
    assert "500 samples per GPU" in table.note


def test_a_tiny_table_names_its_model_as_a_stand_in_and_drops_what_nobody_recorded(tmp_path):
    from workshop_lib.book.tables import drop_unrecorded, for_stand_ins
    from workshop_lib.sites.profiles import load_profile

    _summary_run(tmp_path, "fsdp/single-gpu/full-shard", train_runtime_s=3.0, samples_per_s=2.0, final_loss=1.0,
                 world_size=1, model_state_bytes_per_rank=[2 * 2**20])
    [table] = [t for t in chapter_tables(4, tmp_path) if t.key == "multi-gpu"]
    shown = drop_unrecorded(for_stand_ins(table, load_profile("tiny")))
    assert shown.title == "tiny-bloom (stand-in for BLOOM-560m), FSDP on one node"
    assert for_stand_ins(shown, load_profile("tiny")).title == shown.title  # never twice
    assert for_stand_ins(table, load_profile("ibex")).title == table.title  # the real model keeps its name
    done = shown.frame.iloc[0]
    assert done["Model States per Rank (MiB)"] == 2.0  # the census, where GPU memory would be
    assert "GPU Memory Allocated (GB)" not in shown.frame.columns  # n/a on every completed row… and MISSING
    assert "GPU Memory Allocated (GB)" in table.frame.columns
