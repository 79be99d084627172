"""The experiment builder and the job monitor, through their Python API (no frontend needed).

Fast tests change controls (by name and through the ipywidgets controls themselves) and check that the
validator's messages, the script and the estimate follow; the cluster test submits a cheap experiment on
the tiny profile to the local SLURM cluster and watches it with the monitor; slow tests execute a notebook
under papermill (the static fallback) and take the JupyterLab screenshot.
"""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from workshop_lib.checks.findings import ValidationError
from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import get_experiment
from workshop_lib.runs import RunRecord, load_run
from workshop_lib.widgets import ExperimentBuilder, JobMonitor, live_widgets
from workshop_lib.widgets.frontend import WIDGETS_VARIABLE


@pytest.fixture
def builder(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_SUBMIT", "1")
    return ExperimentBuilder(chapter=3, profile="tiny", runs_dir=tmp_path / "runs", interactive=False)


def test_starts_from_the_chapter_row_with_a_custom_id(builder):
    experiment = builder.experiment
    assert experiment.id == "custom/ch3/bloom-560m-1x2gpu-zero2-b4"
    assert (experiment.chapter, experiment.group, experiment.zero_stage, experiment.gpus) == (3, "custom", 2, 2)
    assert builder.valid and builder.can_submit and builder.validation_messages == []
    assert "#SBATCH --gpus-per-node=2" in builder.script_text and "zero2.json" in builder.script_text
    assert builder.estimate is not None and "ZeRO-2" in builder.estimate_text


def test_changing_a_control_changes_the_id_script_and_estimate(builder):
    before_script, before_states = builder.script_text, builder.estimate.model_states
    builder.set(zero_stage=3)
    assert builder.experiment.id == "custom/ch3/bloom-560m-1x2gpu-zero3-b4"
    assert "zero3.json" in builder.script_text and builder.script_text != before_script
    assert builder.estimate.model_states < before_states  # ZeRO-3 also shards the 16-bit parameters
    assert "ZeRO-3" in builder.estimate_text
    builder.set(gpus=4)
    assert builder.experiment.gpus_per_node == 4 and "#SBATCH --gpus-per-node=4" in builder.script_text
    on_four = builder.estimate.model_states
    builder.set(offload=True, pin_memory=True)
    assert "zero3_offload_pinned.json" in builder.script_text
    assert builder.estimate.model_states < on_four and builder.estimate.cpu_total > 0
    assert "parameters offload" in builder.estimate_text


def test_a_linter_warning_is_shown_but_does_not_block(builder, monkeypatch):
    from workshop_lib.checks.findings import WARNING, Finding
    from workshop_lib.widgets import builder as builder_module

    warning = Finding("several-options-per-line", WARNING, "two options on one line.", "one per line.", 3)
    monkeypatch.setattr(builder_module, "lint_script", lambda text: [warning])
    builder.set(per_device_batch=2)
    assert builder.validation_messages == [warning.format()] and builder.can_submit
    assert "several-options-per-line" in builder.findings_html()


INVALID = [
    (dict(chapter=3, zero_stage=0, offload=True), "offload-with-zero0", "nothing to offload"),
    (dict(chapter=3, zero_stage=None, pin_memory=True), "pinned-without-offload", "pinned memory only applies"),
    (dict(chapter=4, fsdp="HYBRID_SHARD"), "hybrid-shard-single-node", "HYBRID_SHARD shards inside a node"),
    (dict(chapter=2, gpus=4, tensor_parallel=4, expert_parallel=2), "parallel-sizes-mismatch",
     "TP x EP x PP = 4 x 2 x 1 = 8 does not divide the 4 GPUs"),
    (dict(chapter=1, model="mixtral-8x7b"), "mixtral-without-ep", "without an expert-parallel size"),
    (dict(chapter=3, gpus=8), "outside-profile-grid", "runs at most 4"),
]


@pytest.mark.parametrize("changes, rule, words", INVALID, ids=[case[1] for case in INVALID])
def test_an_invalid_combination_shows_the_validators_message_and_blocks_submit(builder, changes, rule, words):
    builder.set(**changes)
    assert not builder.valid and not builder.can_submit
    message = next(text for text in builder.validation_messages if f"[{rule}]" in text)
    assert words in message and "Fix:" in message
    assert builder.script_text == ""
    assert rule in builder.findings_html() and "fix before submitting" in builder.summary_html()
    with pytest.raises(ValidationError, match=rule):
        builder.submit()


def test_the_widget_controls_drive_the_builder_and_disable_submit(builder):
    pytest.importorskip("ipywidgets")
    controls = builder.controls
    assert controls["tensor_parallel"].disabled and not controls["zero_stage"].disabled  # chapter 3 knobs
    controls["zero_stage"].value = 3
    assert builder.experiment.zero_stage == 3 and "zero3.json" in builder._views["script"].value
    controls["zero_stage"].value = 0
    controls["offload"].value = True
    assert builder.submit_button.disabled
    assert "offload-with-zero0" in builder._views["findings"].value
    controls["zero_stage"].value = 1
    assert not builder.submit_button.disabled and builder.experiment.id.endswith("zero1-offload-b4")
    controls["chapter"].value = 4  # resets to the chapter's start row; the FSDP knob turns on
    assert builder.experiment.fsdp == "FULL_SHARD" and not controls["fsdp"].disabled
    assert controls["zero_stage"].disabled and controls["start"].value == "fsdp/multi-gpu/2-gpus"
    controls["fsdp"].value = "HYBRID_SHARD"
    assert builder.submit_button.disabled and "hybrid-shard-single-node" in builder._views["findings"].value
    controls["nodes"].value = 2
    assert not builder.submit_button.disabled


def test_submitting_switched_off_disables_submit(builder, monkeypatch):
    monkeypatch.setenv("WORKSHOP_SUBMIT", "0")
    assert builder.valid and not builder.can_submit
    with pytest.raises(WorkshopError, match="WORKSHOP_SUBMIT=0"):
        builder.submit()


def test_start_row_and_errors_of_the_api(builder):
    builder.set(start="zero/single-gpu/zero2-offload-pinned")
    assert (builder.values["gpus_per_node"], builder.values["offload"], builder.values["pin_memory"]) == (1, True, True)
    with pytest.raises(WorkshopError, match="unknown control"):
        builder.set(stage=3)
    with pytest.raises(WorkshopError, match="chapter 4"):
        builder.set(fsdp="FULL_SHARD")  # a chapter 4 knob in chapter 3
    with pytest.raises(WorkshopError, match="choose one of"):
        builder.set(zero_stage=5)
    with pytest.raises(WorkshopError, match="spread evenly"):
        builder.set(nodes=2, gpus=3)


def test_custom_gpt_in_chapter_4_gets_its_own_shape_estimated(builder):
    builder.set(chapter=4, model="gpt", fsdp=None, gpus=1)
    experiment = builder.experiment
    assert experiment.engine == "gpt" and experiment.gpt is not None
    assert experiment.id == "custom/ch4/gpt-1x1gpu-b1" and "workshop_lib.train.gpt" in builder.script_text
    assert builder.estimate.model == "gpt"


def test_static_fallback_is_informative(builder):
    builder.set(zero_stage=0, offload=True)
    view = builder.static_view()
    assert "static view" in view.html and "zero_stage" in view.html and "stage 0, stage 1" in view.html
    assert "offload-with-zero0" in view.html and "offload-with-zero0" in repr(view)
    builder.set(offload=False)
    html = builder.static_html()
    assert "#SBATCH --nodes=1" in html and "Memory estimate" in html


def test_live_widgets_detection(monkeypatch):
    monkeypatch.delenv(WIDGETS_VARIABLE, raising=False)
    assert live_widgets() is False  # no kernel here
    assert live_widgets(True) is True
    monkeypatch.setenv(WIDGETS_VARIABLE, "1")
    assert live_widgets() is True and live_widgets(False) is False


def _recorded_run(root, experiment_id: str, state: str | None, log: str):
    run = load_run(get_experiment(experiment_id), root)
    run.directory.mkdir(parents=True)
    RunRecord(experiment_id=experiment_id, content_hash="x", profile="tiny", job_id="local-7", backend="local",
              submitted_at="2026-01-01T00:00:00+00:00", stdout="slurm-7.out", final_state=state,
              exit_code=0 if state else None).save(run.directory)
    (run.directory / "slurm-7.out").write_text(log)
    return run


def test_monitor_shows_a_chapters_recorded_runs_with_state_and_log_tail(tmp_path):
    _recorded_run(tmp_path, "zero/single-gpu/zero1", "COMPLETED", "\n".join(f"step {i}" for i in range(20)))
    monitor = JobMonitor(chapter=3, runs_dir=tmp_path, log_lines=3, interactive=False)
    rows = monitor.refresh()
    assert [(row.experiment_id, row.state) for row in rows] == [("zero/single-gpu/zero1", "COMPLETED")]
    assert rows[0].log_tail.splitlines() == ["step 17", "step 18", "step 19"]
    assert monitor.all_finished
    view = monitor.static_view()
    assert "COMPLETED" in view.html and "step 19" in view.html and "zero/single-gpu/zero1" in repr(view)


def test_monitor_refreshes_in_the_background_until_stopped(tmp_path):
    _recorded_run(tmp_path, "zero/single-gpu/zero1", "COMPLETED", "done\n")
    monitor = JobMonitor(chapter=3, runs_dir=tmp_path, interval_s=0.05, stop_when_done=False, interactive=False)
    has_widgets = importlib.util.find_spec("ipywidgets") is not None
    if has_widgets:
        monitor.widget  # the live view the thread keeps up to date
    monitor.start()
    try:
        deadline = time.monotonic() + 5
        while monitor.refreshed_at is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert monitor.running and monitor.rows[0].state == "COMPLETED"
        if has_widgets:
            assert "COMPLETED" in monitor._table.value and "refreshing every" in monitor._status.value
    finally:
        monitor.stop()
    assert not monitor.running
    empty = JobMonitor(chapter=4, runs_dir=tmp_path, interactive=False)
    empty.refresh()
    assert "No submitted run chapter 4" in empty.html()


@pytest.mark.cluster
def test_submit_runs_a_job_in_the_local_cluster_and_the_monitor_follows_it(local_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_SUBMIT", "1")
    builder = ExperimentBuilder(chapter=3, profile="tiny", runs_dir=tmp_path / "runs", backend="slurm",
                                interactive=False)
    # A cheap run: the plain HF Trainer (no DeepSpeed, whose ops compile on first use), one process,
    # the tiny BLOOM stand-in, 3 steps.
    builder.set(zero_stage=None, gpus=1, per_device_batch=2)
    run = builder.submit()
    assert run.submitted_now and run.record.backend == "slurm"
    assert run.directory == (tmp_path / "runs" / builder.experiment.id).resolve()
    assert json.loads((run.directory / "job.json").read_text())["experiment_id"] == builder.experiment.id
    monitor = builder.monitor
    monitor.interval_s = 1.0
    monitor.start()
    try:
        deadline = time.monotonic() + 240
        while not monitor.all_finished and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        monitor.stop()
    row = monitor.refresh()[0]
    assert row.experiment_id == builder.experiment.id and row.job_id == run.record.job_id
    assert row.state == "COMPLETED", row.log_tail
    assert row.elapsed_s is not None and row.log_tail
    assert "COMPLETED" in monitor.html()
    again = builder.submit()  # the same experiment completed: reused, not resubmitted
    assert not again.submitted_now and "reused" in again.note


@pytest.mark.slow
def test_papermill_gets_the_static_fallback(tmp_path, monkeypatch):
    papermill = pytest.importorskip("papermill")
    nbformat = pytest.importorskip("nbformat")
    for name in (WIDGETS_VARIABLE, "JPY_SESSION_NAME", "VSCODE_PID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORKSHOP_RUNS_DIR", str(tmp_path / "runs"))
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from workshop_lib.widgets import ExperimentBuilder, JobMonitor\n"
                                  "ExperimentBuilder(chapter=3, profile='tiny').set(zero_stage=0, offload=True)"),
        nbformat.v4.new_code_cell("JobMonitor(chapter=3)"),
    ])
    executed = papermill.execute_notebook(notebook, str(tmp_path / "out.ipynb"), kernel_name="python3",
                                          language="python", progress_bar=False, cwd=str(tmp_path))
    outputs = [cell.outputs for cell in executed.cells]
    for cell_outputs in outputs:
        assert cell_outputs and all("application/vnd.jupyter.widget-view+json" not in output.get("data", {})
                                    for output in cell_outputs)
    builder_html = outputs[0][0]["data"]["text/html"]
    assert "static view" in builder_html and "offload-with-zero0" in builder_html
    assert "No submitted run chapter 3" in outputs[1][0]["data"]["text/html"]


@pytest.mark.slow
def test_screenshot_of_the_builder_in_jupyterlab():
    from workshop_lib.core.paths import repository_root
    from workshop_lib.widgets.screenshot import DEFAULT_OUTPUT, find_chromium, take_screenshot

    if find_chromium() is None:
        pytest.skip("no Chromium here")
    pytest.importorskip("websocket")
    output = repository_root() / DEFAULT_OUTPUT
    invalid = output.with_name("widget_builder_invalid.png")
    take_screenshot(output, invalid_output=invalid)
    for path in (output, invalid):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
