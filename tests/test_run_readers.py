"""A run folder's files are named once (core/run_directory.py): the job scripts write them under those names,
and the readers find them there."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from workshop_lib.core import run_directory as names
from workshop_lib.core.run_directory import RunDirectory
from workshop_lib.experiments import all_experiments
from workshop_lib.runs import Run, RunRecord
from workshop_lib.scripts import render_script

TEMPLATES = Path(__file__).resolve().parents[1] / "slurm" / "templates"
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
