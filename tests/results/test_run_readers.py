"""A run folder's files are named once (core/run_directory.py): the job scripts write them under those names,
and the readers find them there."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from repo_paths import REPO, TESTS

from workshop_lib.core import run_directory as names
from workshop_lib.core.run_directory import RunDirectory
from workshop_lib.experiments import all_experiments
from workshop_lib.runs import Run, RunRecord
from workshop_lib.scripts import render_script

TEMPLATES = REPO / "slurm" / "templates"
MULTI_NODE = next(e for e in all_experiments() if e.multi_node and e.monitor_cpu_memory)


def test_the_templates_type_no_file_name_of_a_run_folder():
    typed = {name for name in (names.CPU_MEMORY_LOG, names.NCCL_LOG, names.RECORD_NAME, names.METRICS_NAME,
                               names.TRAINER_STATE_NAME, names.STDOUT_PATTERN)}
    typed |= {pattern.split("{")[0] for pattern in (names.GPU_LOG_OF_NODE, names.CPU_LOG_OF_NODE)}  # gpu_memory_...
    found = [f"{path.relative_to(TEMPLATES)}: {name}" for path in sorted(TEMPLATES.rglob("*.j2"))
             for name in typed if name in _text_outside_jinja(path.read_text())]
    assert not found, "file names typed in a template (take them from the render context): " + "; ".join(found)


def _text_outside_jinja(template: str) -> str:
    """The template's own text: what it types, without the names of its variables and tags."""
    return re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", "", template, flags=re.DOTALL)


@pytest.mark.parametrize("profile", ["ibex", "tiny"])
def test_the_monitor_logs_a_multi_node_job_writes_are_the_ones_the_readers_find(tmp_path, profile):
    script = render_script(MULTI_NODE, profile)
    written = [Path(shlex.split(line.split(">")[-1] if "nvidia-smi" in line else line.split("--log")[-1])[0])
               for line in script.splitlines() if re.search(r"(nvidia-smi .*> |psrecord .*--log )\S+ &$", line)]
    assert len(written) == (2 if profile == "ibex" else 1)  # the tiny profile has no nvidia-smi
    for node in ("node1", "node2"):  # what each node's shell makes of the name
        for name in written:
            (tmp_path / str(name).replace("${node}", node)).write_text("")
    run = RunDirectory(tmp_path)
    assert [path.name for path in run.cpu_logs()] == ["cpu_memory_node1.txt", "cpu_memory_node2.txt"]
    assert len(run.gpu_logs()) == (2 if profile == "ibex" else 0)


def test_a_run_names_its_paths_through_its_run_directory(tmp_path):
    record = RunRecord(experiment_id=MULTI_NODE.id, content_hash=MULTI_NODE.content_hash, profile="tiny",
                       job_id="42", backend="slurm", submitted_at="2026-01-01T00:00:00+00:00")
    run = Run(MULTI_NODE, tmp_path, record)
    assert run.files == RunDirectory(tmp_path)
    assert run.stdout_path == run.files.stdout("42") == tmp_path / "slurm-42.out"
    (tmp_path / "slurm-42.out").write_text("")
    assert run.files.stdout_logs() == [run.stdout_path]  # what the readers glob is what the job wrote
    named = Run(MULTI_NODE, tmp_path, replace(record, stdout="own-42.log"))
    assert named.stdout_path == tmp_path / "own-42.log"  # the --output the script asked for wins


# ---- reading a run: an ordered list of readers (results/read.py READERS) -----------------------------------
SAMPLES = TESTS / "samples"


def _run_folder(tmp_path: Path, **files: str) -> Path:
    """A run folder holding `files` (name -> text; `train__x` is train/x)."""
    for name, text in files.items():
        path = tmp_path / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_readers_run_in_order_and_a_later_one_overrides_or_fills(tmp_path):
    from workshop_lib.results.read import READERS, read_run

    kinds = [reader.kind for reader in READERS]
    assert kinds.index("metrics") < kinds.index("nemo") < kinds.index("trainer")
    folder = _run_folder(tmp_path, **{"train__metrics.jsonl": (SAMPLES / "metrics" / "metrics.jsonl").read_text(),
                                      "slurm-3.out": (SAMPLES / "nemo" / "llama_lora_2gpus.out").read_text()})
    both = read_run(folder)
    assert both.train_step_time_s == 1.608  # NeMo's last step line overrides the metrics' last step (0.296)
    assert both.mean_step_time_s == 0.327  # the job's own summary keeps its mean: NeMo only fills an empty one
    (folder / "train" / "metrics.jsonl").unlink()
    assert read_run(folder).mean_step_time_s == pytest.approx(1.5148, abs=1e-4)


def test_notes_of_one_file_from_several_readers_come_together_in_line_order(tmp_path):
    from workshop_lib.results.read import read_run

    log = "\n".join(["Start time: 2026-01-01 00:00:00", "{'loss': 1.5, 'epoch': oops}", "Total time: soon",
                     "Exit status: 0"]) + "\n"
    folder = _run_folder(tmp_path, **{"slurm-3.out": log, "train__metrics.jsonl": "{not json\n"})
    result = read_run(folder)
    assert [lines.file for lines in result.unreadable] == ["slurm-3.out", str(Path("train", "metrics.jsonl"))]
    job_log = result.unreadable[0]
    assert [problem.line for problem in job_log.problems] == sorted(problem.line for problem in job_log.problems)
    assert {problem.line for problem in job_log.problems} >= {2, 3}  # the trainer's dict and the footer's time
    assert result.skipped_lines == sum(lines.skipped_lines for lines in result.unreadable)


def test_a_reader_gets_only_files_that_exist_and_the_job_log_is_read_once(tmp_path, monkeypatch):
    from workshop_lib.results import read, readers

    calls: list[tuple[str, list[Path]]] = []
    reads: list[Path] = []
    original_read_log = readers.read_log
    monkeypatch.setattr(readers, "read_log", lambda path, keywords: reads.append(path) or original_read_log(
        path, keywords))
    spy = [read.RunReader(reader.kind, reader.files,
                          lambda reading, paths, reader=reader: calls.append((reader.kind, paths)) or reader.read(
                              reading, paths), reader.log_keywords) for reader in read.READERS]
    monkeypatch.setattr(read, "READERS", tuple(spy))
    folder = _run_folder(tmp_path, **{"slurm-3.out": (SAMPLES / "nemo" / "llama_lora_2gpus.out").read_text(),
                                      "nccl_allreduce.txt": (SAMPLES / "nccl" / "all_reduce_2nodes.txt").read_text()})
    result = read.read_run(folder)
    assert [kind for kind, _ in calls] == ["footer", "nemo", "trainer", "nccl"]  # no metrics, no monitors
    assert dict(calls)["trainer"] == [folder / "slurm-3.out"]  # no trainer_state.json: only the log is passed
    assert reads == [folder / "slurm-3.out"]
    assert result.nccl_bus_bandwidth_gbps is not None and result.loss_by_step
