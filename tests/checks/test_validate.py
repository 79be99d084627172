"""The validator and the linter: each rule trips on a bad script and stays quiet on a good one."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from pathlib import Path

import pytest
from repo_paths import REPO, TESTS

from workshop_lib.checks.experiment_rules import raise_for_experiment, validate_experiment
from workshop_lib.checks.findings import ValidationError
from workshop_lib.checks.lint import lint_file, lint_script
from workshop_lib.cli import main
from workshop_lib.experiments import get_experiment
from workshop_lib.sites.profiles import load_profile, profile_from_dict

SAMPLES = TESTS / "lint_samples"
# A rule's folder holds bad*.sbatch scripts that trip it and good*.sbatch scripts that must stay clean;
# a folder rule (env-var-mismatch) holds bad/ and good/ job folders instead.
RULES = sorted(path.name for path in SAMPLES.iterdir() if (path / "bad.sbatch").is_file())
FOLDER_RULES = sorted(path.name for path in SAMPLES.iterdir() if (path / "bad").is_dir())
BAD = sorted(SAMPLES.glob("*/bad*.sbatch"))
GOOD = sorted(SAMPLES.glob("*/good*.sbatch"))
WARNING_RULES = {"fixed-rendezvous-port", "several-options-per-line", "option-given-twice",
                 "ntasks-caps-tasks-per-node"}
# Samples whose finding is a warning although their rule also has errors.
WARNING_SAMPLES = {"cuda-visible-devices-pinned/bad-every-gpu-by-number.sbatch",
                   "directive-look-alike/bad-space.sbatch", "variable-in-directive/bad-job-name.sbatch",
                   "slurm-variable-unset/bad-array-index.sbatch"}
# Samples written in the shape of the original workshop's scripts (kaust-rccl/Dist-DL-training): the line
# each finding belongs on.
EXPECTED_LINES = {
    "glued-directives/bad-no-space.sbatch": 4,
    "model-parallel-with-lora/bad-mixtral.sbatch": 13,
    "kill-unset-pid/bad-reported-on-the-kill-line.sbatch": 16,
    "output-folder-missing/bad-mkdir-inside-the-job.sbatch": 3,
    "module-purge-after-load/bad.sbatch": 9,
    "sequence-parallel-without-tp/bad.sbatch": 12,
    # participants' launch mistakes (issue 28): the line of the option that is wrong
    "rank-expanded-in-batch-shell/bad-double-quotes.sbatch": 7,
    "workers-gpus-mismatch/bad-accelerate-per-machine.sbatch": 8,
    "launcher-nodes-mismatch/bad-nemo.sbatch": 10,
    "relative-path-after-cd/bad.sbatch": 7,
    "time-looks-like-hours/bad.sbatch": 4,
    "rendezvous-localhost/bad-variable.sbatch": 9,
    "parallel-sizes-mismatch/bad-context-parallel.sbatch": 10,
}


# Issue 38: each rule derived from SLURM's or a launcher's semantics, and the test that shows its defect on the
# real cluster (tests/checks/test_lint_on_cluster.py) or with the launcher itself
# (tests/checks/test_launcher_arithmetic.py).
EVIDENCE = {
    "exclusive-options": "test_lint_on_cluster.py::test_request_rules_match_what_sbatch_refuses",
    "gpus-per-task-without-tasks": "test_lint_on_cluster.py::test_request_rules_match_what_sbatch_refuses",
    "gpu-type-contradicts-constraint": "test_lint_on_cluster.py::test_request_rules_match_what_sbatch_refuses",
    "invalid-directive": "test_lint_on_cluster.py::test_request_rules_match_what_sbatch_refuses",
    "counts-contradict": "test_lint_on_cluster.py::test_request_rules_match_what_sbatch_refuses",
    "missing-shebang": "test_lint_on_cluster.py::test_a_script_without_its_interpreter_line_is_refused",
    "ntasks-caps-tasks-per-node": "test_lint_on_cluster.py::test_ntasks_wins_over_tasks_per_node",
    "launcher-missing-on-nodes":
        "test_lint_on_cluster.py::test_a_step_with_fewer_tasks_than_nodes_leaves_nodes_without_a_launcher",
    "step-exceeds-job": "test_lint_on_cluster.py::test_a_step_cannot_ask_for_more_nodes_than_the_job",
    "option-given-twice": "test_lint_on_cluster.py::test_an_option_given_twice_takes_the_last_value",
    "nemo-needs-a100": "test_lint_on_cluster.py::test_a_typed_a100_request_needs_no_constraint",
    "variable-in-directive": "test_lint_on_cluster.py::test_variable_in_an_output_path_is_taken_literally_and_the_job_fails",
    "output-folder-missing": "test_lint_on_cluster.py::test_a_folder_named_by_the_job_id_cannot_exist_and_the_job_fails",
    "directive-look-alike": "test_lint_on_cluster.py::test_directive_look_alikes_are_comments_to_sbatch",
    "slurm-variable-unset": "test_lint_on_cluster.py::test_a_variable_the_request_form_does_not_set_is_empty",
    "gpu-list-as-count": "test_lint_on_cluster.py::test_the_gpu_id_variables_hold_a_list_not_a_count",
    "srun-export-drops-environment": "test_lint_on_cluster.py::test_srun_export_without_all_loses_path_and_exports",
    "background-step-not-waited": "test_lint_on_cluster.py::test_a_background_step_nobody_waits_for_is_killed",
    "parallel-steps-serialize": "test_lint_on_cluster.py::test_background_steps_without_exact_run_one_after_the_other",
    "workers-gpus-mismatch": "test_lint_on_cluster.py::test_a_step_s_own_gpu_request_is_what_its_launcher_sees",
    "local-rank-vs-bound-gpu": "test_lint_on_cluster.py::test_a_task_bound_to_its_gpu_sees_one_device",
    "array-shared-output": "test_lint_on_cluster.py::test_array_tasks_sharing_an_output_file_lose_logs",
    "array-shared-port": "test_lint_on_cluster.py::test_array_tasks_on_a_fixed_port_collide",
    "array-shared-folder": "test_lint_on_cluster.py::test_array_tasks_writing_one_folder_overwrite_each_other",
    "array-index-out-of-range": "test_lint_on_cluster.py::test_an_array_index_past_the_end_of_its_list_reads_nothing",
    "relative-path-after-cd": "test_lint_on_cluster.py::test_a_relative_path_after_cd_into_a_user_folder",
    "deepspeed-batch-size-mismatch": "test_launcher_arithmetic.py::test_deepspeed_batch_verdicts_match_deepspeed_and_transformers",
    "nemo-global-batch-mismatch": "test_launcher_arithmetic.py::test_nemo_global_batch_is_a_multiple_of_micro_batch_times_data_parallel",
    "fixed-rendezvous-port": "test_launcher_arithmetic.py::test_single_node_torchrun_ignores_master_port_and_picks_a_free_one",
}


def test_every_semantic_rule_has_samples_and_names_its_evidence():
    for rule, test in EVIDENCE.items():
        module, function = test.split("::")
        assert (SAMPLES / rule / "bad.sbatch").is_file() and (SAMPLES / rule / "good.sbatch").is_file(), rule
        assert f"def {function}(" in (Path(__file__).parent / module).read_text(), test


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_every_rule_has_samples():
    assert len(RULES) >= 32 and FOLDER_RULES == ["env-var-mismatch", "job-name-reused"]
    for rule in RULES:
        assert (SAMPLES / rule / "good.sbatch").is_file()
    for rule in FOLDER_RULES:
        assert (SAMPLES / rule / "good").is_dir()


@pytest.mark.parametrize("sample", BAD, ids=_name)
def test_bad_sample_trips_its_rule_and_nothing_else(sample):
    rule = sample.parent.name
    findings = lint_file(sample)
    assert {finding.rule for finding in findings} == {rule}
    finding = findings[0]
    assert finding.line and finding.message and finding.fix
    assert finding.severity == ("warning" if rule in WARNING_RULES or _name(sample) in WARNING_SAMPLES else "error")
    if _name(sample) in EXPECTED_LINES:
        assert [f.line for f in findings] == [EXPECTED_LINES[_name(sample)]]


@pytest.mark.parametrize("sample", GOOD, ids=_name)
def test_good_sample_is_clean(sample):
    assert lint_file(sample) == []


def test_check_command_exit_status_follows_errors_not_warnings(capsys):
    assert main(["check", str(SAMPLES / "kill-unset-pid" / "bad.sbatch")]) == 1
    out = capsys.readouterr().out
    assert "bad.sbatch:" in out and "[kill-unset-pid]" in out and "Fix:" in out
    assert main(["check", str(SAMPLES / "fixed-rendezvous-port" / "bad.sbatch")]) == 0
    assert main(["check", *(str(sample) for sample in GOOD)]) == 0


def test_kill_in_the_shell_that_set_the_pid_is_fine_across_scopes():
    script = "\n".join([
        "#!/bin/bash", "#SBATCH --nodes=2", "sleep 100 &", "OUTER=$!",
        "srun bash -c 'sleep 5 & inner=$!; kill \"$OUTER\"; kill \"$inner\"'", "kill \"$OUTER\""])
    findings = lint_script(script)
    assert [(f.rule, f.line) for f in findings] == [("kill-unset-pid", 5)]


def _broken(experiment_id: str, **changes):
    return dataclasses.replace(get_experiment(experiment_id), **changes)


@pytest.mark.parametrize("rule, experiment", [
    ("parallel-sizes-mismatch", _broken("model-parallel/llama/tp4", tensor_parallel=3)),
    ("mixtral-without-ep", _broken("lora/mixtral/4-gpus", expert_parallel=None)),
    ("model-parallel-with-lora", _broken("model-parallel/llama/tp2", peft="lora")),
    ("offload-with-zero0", _broken("zero/single-gpu/zero0", offload=True)),
    ("offload-without-sharding", _broken("zero/baseline", offload=True)),
    ("pinned-without-offload", _broken("zero/single-gpu/zero2", pin_memory=True)),
    ("hybrid-shard-single-node", _broken("fsdp/single-gpu/full-shard", fsdp="HYBRID_SHARD")),
    ("fsdp-and-deepspeed", _broken("fsdp/multi-gpu/2-gpus", zero_stage=2)),
    ("sequence-parallel-without-tp", _broken("lora/mixtral/2-gpus", sequence_parallel=True)),
    ("two-dataset-sizes", _broken("zero/multi-gpu/2-gpus", samples=500)),
])
def test_experiment_rules(rule, experiment):
    assert rule in {finding.rule for finding in validate_experiment(experiment)}
    with pytest.raises(ValidationError, match=rule):
        raise_for_experiment(experiment)


V100_NEMO_SITE = {"name": "v100-site", "scheduler": {"constraint": "v100"}, "python": {}, "training": {},
                  "nemo": {"enabled": True, "image": "/images/nemo.sif", "factories": {"llama-3.1-8b": "llama31_8b"}}}


@pytest.mark.parametrize("rule, experiment, profile", [
    ("parallel-sizes-mismatch", _broken("model-parallel/llama/tp4", nodes=1, gpus_per_node=2), None),
    ("model-parallel-with-lora", _broken("model-parallel/llama/tp2", nodes=1, gpus_per_node=2, peft="lora"), None),
    ("sequence-parallel-without-tp", _broken("lora/mixtral/2-gpus", sequence_parallel=True), None),
    ("hybrid-shard-single-node", _broken("fsdp/single-gpu/full-shard", fsdp="HYBRID_SHARD"), None),
    ("nemo-needs-a100", get_experiment("lora/llama/1-gpu"), V100_NEMO_SITE),
])
def test_a_pitfall_reads_the_same_in_an_experiment_and_in_a_script(rule, experiment, profile):
    """One function per pitfall (checks.pitfalls): the experiment rules and the linter say the same."""
    profile = profile_from_dict(profile) if profile else None
    (declared,) = [f for f in validate_experiment(experiment, profile) if f.rule == rule]
    (written,) = lint_file(SAMPLES / rule / "bad.sbatch")
    assert (declared.message, declared.fix) == (written.message, written.fix)
    assert declared.line is None and written.line


def test_a_parallel_size_known_only_at_run_time_silences_the_layout_pitfalls():
    script = (SAMPLES / "model-parallel-with-lora" / "bad.sbatch").read_text()
    assert {f.rule for f in lint_script(script)} == {"model-parallel-with-lora"}
    unknown = script.replace("tensor_model_parallel_size=2", 'tensor_model_parallel_size="$1"')
    assert "tensor_model_parallel_size=\"$1\"" in unknown and lint_script(unknown) == []


def test_nemo_needs_an_a100_profile():
    data = copy.deepcopy(V100_NEMO_SITE)
    profile = profile_from_dict(data)
    rules = {finding.rule for finding in validate_experiment(get_experiment("lora/llama/1-gpu"), profile)}
    assert rules == {"nemo-needs-a100"}
    # NeMo installed without the container (a GPU workstation): the container's A100 reason does not apply
    data["nemo"]["image"] = None
    assert validate_experiment(get_experiment("lora/llama/1-gpu"), profile_from_dict(data)) == []
    assert validate_experiment(get_experiment("lora/llama/1-gpu"), load_profile("ibex")) == []


def test_check_of_a_folder_compares_env_vars_with_the_python(capsys):
    assert main(["check", str(SAMPLES / "env-var-mismatch" / "bad")]) == 1
    out = capsys.readouterr().out
    assert "train.py:6: error [env-var-mismatch] train.py reads PER_DEVICE_BATCH_SIZE (default 1)" in out
    assert "env_vars.sh:4 exports BATCH_SIZE=8, which nothing reads" in out
    assert "train.py:7: error [env-var-mismatch]" in out and "GRAD_ACC=2" in out
    assert "env_vars.sh exports 5 names, train.py reads 6; 2 match, 2 differ" in out
    assert "1 script checked: 2 errors, 0 warnings" in out
    assert main(["check", str(SAMPLES / "env-var-mismatch" / "good")]) == 0
    assert "4 match, all agree" in capsys.readouterr().out


def test_mixtral_needs_an_ep_only_where_the_recipe_default_does_not_fit():
    eight = _broken("lora/mixtral/8-gpus", expert_parallel=None)
    four = _broken("lora/mixtral/4-gpus", expert_parallel=None)
    assert "mixtral-without-ep" not in {finding.rule for finding in validate_experiment(eight)}
    (finding,) = [f for f in validate_experiment(four) if f.rule == "mixtral-without-ep"]
    assert "EP = 8" in finding.message and "4 GPUs" in finding.message


# The original workshop's job scripts (kaust-rccl/Dist-DL-training), when a checkout is named by
# WORKSHOP_DIST_DL_TRAINING: every real defect is flagged and nothing else. CI has no copy; the
# samples above encode each of these cases.
ORIGINAL = Path(os.environ.get("WORKSHOP_DIST_DL_TRAINING", "/nonexistent"))


@pytest.mark.skipif(not (ORIGINAL / "nemo").is_dir(), reason="set WORKSHOP_DIST_DL_TRAINING to a checkout")
def test_the_original_workshop_scripts():
    from workshop_lib.checks.env_vars import check_folder

    found = {}
    for folder in ("nemo", "deepspeed", "fsdp"):
        results, _ = check_folder(ORIGINAL / folder)
        for path, findings in results:
            for finding in findings:
                found.setdefault(finding.rule, set()).add(str(path.relative_to(ORIGINAL)))
    scripts = {str(path.relative_to(ORIGINAL)) for folder in ("nemo", "deepspeed", "fsdp")
               for path in (ORIGINAL / folder).rglob("*.slurm")}
    assert set(found) == {"output-folder-missing", "glued-directives", "model-parallel-with-lora",
                          "kill-unset-pid", "module-purge-after-load", "env-var-mismatch",
                          "cuda-visible-devices-pinned", "does-not-fit"}
    assert found["output-folder-missing"] == scripts  # log/ and logs/ are not in the repository
    assert found["glued-directives"] == {f"nemo/models/{name}.slurm" for name in (
        "llama31_8b/import_llama31_8b", "mixtral_8x7b/import_mixtral_8x7b", "template/template_impot_model")}
    assert found["model-parallel-with-lora"] == {f"nemo/experiments/model_parallel/mixtral_8x7b/{n}_gpus/{n}_gpus.slurm"
                                                 for n in (4, 8)}
    assert found["kill-unset-pid"] == {f"deepspeed/experiments/deepspeed-multi-node/{n}_nodes/deepspeed_{n}_nodes.slurm"
                                       for n in (2, 4, 8)}
    assert found["module-purge-after-load"] == {f"fsdp/custom_model/multi_node/{n}_nodes/multi_node.slurm"
                                                for n in (2, 4, 8)}
    assert len(found["env-var-mismatch"]) == 17  # every FSDP folder but the BLOOM baseline
    # Hand-set CUDA_VISIBLE_DEVICES: =0 on 2-GPU nodes hides a GPU (error); =0,1 / =0,...,3 names every GPU
    # of the job by number (a warning).
    assert found["cuda-visible-devices-pinned"] == {f"fsdp/{model}/{kind}/{n}/{kind}.slurm" for model in (
        "bloom", "custom_model") for kind, n in [("multi_gpu", "2_gpus"), ("multi_gpu", "4_gpus"), ("multi_node", "2_nodes"),
                                                 ("multi_node", "4_nodes"), ("multi_node", "8_nodes")]} | {
        f"fsdp/custom_model/weak_scaling/{n}/weak_scaling.slurm" for n in ("2_gpus", "4_gpus")}
    # TP=2 full fine-tune of Llama 3.1 8B on 2 A100-80GB: the estimate the experiments use refuses it (the
    # workshop's own TP=2 experiment runs on 4 GPUs).
    assert found["does-not-fit"] == {"nemo/experiments/model_parallel/llama31_8b/2_gpus/2_gpus.slurm"}


def test_a_rule_listed_with_the_others_runs_with_them(monkeypatch):
    """The rules are explicit lists (no registration on import): a rule added there is checked by both entries."""
    from workshop_lib.checks import experiment_rules, lint
    from workshop_lib.checks.findings import ERROR, WARNING, Finding

    def too_many_gpus(experiment, profile):
        if experiment.gpus > 4:
            yield Finding("example-rule", ERROR, f"{experiment.gpus} GPUs.", "use fewer.")

    def no_echo(script):
        if "echo" in script.code:
            yield Finding("example-script-rule", WARNING, "an echo.", "say nothing.", script.line_of("echo"))

    monkeypatch.setattr(experiment_rules, "EXPERIMENT_RULES", [*experiment_rules.EXPERIMENT_RULES, too_many_gpus])
    monkeypatch.setattr(lint, "SCRIPT_RULES", [*lint.SCRIPT_RULES, no_echo])
    assert "example-rule" in {f.rule for f in validate_experiment(get_experiment("lora/llama/8-gpus"))}
    assert [(f.rule, f.line) for f in lint_script("#!/bin/bash\n#SBATCH --nodes=1\necho hi\n")] == [
        ("example-script-rule", 3)]
    assert validate_experiment(get_experiment("lora/llama/1-gpu")) == []


# ---------------------------------------------------------------------------------------------
# Issue 28: the launch mistakes of hand-written multi-GPU, multi-node scripts, and bad input
# ---------------------------------------------------------------------------------------------
ERROR_SAMPLES = [sample for sample in BAD if sample.parent.name not in WARNING_RULES
                 and _name(sample) not in WARNING_SAMPLES]


@pytest.mark.parametrize("sample", ERROR_SAMPLES, ids=_name)
def test_check_exits_non_zero_on_every_defect(sample, capsys):
    assert main(["check", str(sample)]) == 1
    out = capsys.readouterr().out
    assert f"[{sample.parent.name}]" in out and "Fix:" in out


@pytest.mark.parametrize("sample", GOOD, ids=_name)
def test_check_exits_zero_on_every_correct_form(sample, capsys):
    assert main(["check", str(sample)]) == 0
    assert "no findings" in capsys.readouterr().out


def test_accelerate_num_processes_is_the_total_over_machines():
    (finding,) = lint_file(SAMPLES / "workers-gpus-mismatch" / "bad-accelerate-per-machine.sbatch")
    assert "--num_processes=4 over --num_machines=2 (2 per machine)" in finding.message
    assert "total over all machines" in finding.message and "--num_processes=8" in finding.fix


def test_torchrun_started_by_the_batch_shell_on_several_nodes_names_the_idle_nodes():
    script = (SAMPLES / "launcher-without-srun" / "bad.sbatch").read_text().replace("--nodes=2", "--nodes=4")
    (finding,) = [f for f in lint_script(script) if f.rule == "launcher-without-srun"]
    assert "the other 3 nodes sit idle" in finding.message and "srun --ntasks-per-node=1 torchrun" in finding.fix


def test_heredoc_sbatch_lines_are_data_not_directives():
    from workshop_lib.checks.sbatch import read_header

    header = read_header((SAMPLES / "directive-after-command" / "good-heredoc.sbatch").read_text())
    assert header.get("nodes") == "1" and header.get("gpus-per-node") == "1"
    assert header.after_command_lines == () and header.first_command_line == 6


def test_fixed_port_advice_works_on_several_nodes():
    (finding,) = lint_file(SAMPLES / "fixed-rendezvous-port" / "bad.sbatch")
    assert "SLURM_JOB_ID" in finding.fix and "--standalone" not in finding.fix


@pytest.mark.parametrize("name, content, said", [
    ("model.sbatch", b"\x7fELF\x02\x01\x01\x00\x00\x00" * 40, "a binary file (it holds NUL bytes)"),
    ("train.sbatch", bytes(range(128, 256)) * 8, "not UTF-8 text"),
    ("train.py", b"#!/usr/bin/env python\nimport torch\n", "a script for another interpreter"),
    ("empty.sbatch", b"\n\n", "empty, nothing to check"),
    ("ds_config.json", b'{"zero_optimization": {"stage": 2}}\n', "neither a #! line nor any #SBATCH directive"),
])
def test_a_file_that_is_not_a_job_script_is_an_error_that_says_so(tmp_path, capsys, name, content, said):
    path = tmp_path / name
    path.write_bytes(content)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert said in out and "no findings" not in out and "1 error" in out


def test_a_binary_file_in_a_checked_folder_is_reported_and_the_rest_still_checked(tmp_path, capsys):
    (tmp_path / "broken.slurm").write_bytes(b"\x00\x01\x02" * 100)
    (tmp_path / "good.sbatch").write_text((SAMPLES / "launcher-without-srun" / "good.sbatch").read_text())
    assert main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "broken.slurm: error [not-a-job-script] a binary file" in out
    assert "2 scripts checked: 1 error, 0 warnings" in out


def test_job_names_reused_in_one_folder(capsys):
    assert main(["check", str(SAMPLES / "job-name-reused" / "bad")]) == 1
    out = capsys.readouterr().out
    assert "train-1node.sbatch:2: error [job-name-reused] --job-name=train is also the job name of train-2node.sbatch" in out
    assert "train-2node.sbatch:2: error [job-name-reused]" in out and "2 scripts checked: 2 errors" in out
    assert main(["check", str(SAMPLES / "job-name-reused" / "good")]) == 0


def test_the_same_job_name_in_two_folders_is_fine(tmp_path):
    from workshop_lib.checks.env_vars import check_folder

    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "job.sbatch").write_text((SAMPLES / "job-name-reused" / "bad" / "train-1node.sbatch").read_text())
    results, _ = check_folder(tmp_path)
    assert [findings for _, findings in results] == [[], []]


def test_a_local_cluster_script_says_its_nodes_share_one_host():
    """The workshop's tiny profile runs every "node" on one machine: its rendered job says so, and only
    then is a 127.0.0.1 rendezvous right."""
    from workshop_lib.checks.launches import ONE_HOST_PRAGMA
    from workshop_lib.scripts import render_script

    text = render_script(get_experiment("fsdp/multi-node/2-nodes"), "tiny")
    assert ONE_HOST_PRAGMA in text and [f for f in lint_script(text) if f.is_error] == []
    flagged = lint_script(text.replace(ONE_HOST_PRAGMA, "nodes share an address"))
    assert {f.rule for f in flagged if f.is_error} == {"rendezvous-localhost"}


def test_nemo_fit_uses_the_experiments_estimate():
    """A hand-written NeMo script is checked like the workshop's own experiment with the same layout."""
    from workshop_lib.checks.fit import fit_findings

    (finding,) = lint_file(SAMPLES / "does-not-fit" / "bad.sbatch")
    one_gpu_full = _broken("lora/llama/1-gpu", peft="none")
    (expected,) = fit_findings(one_gpu_full, load_profile("ibex"))
    assert finding.message.split(" needs ")[1] == expected.message.split(" needs ")[1].replace(
        "the profile's", "ibex's")
    assert finding.fix == expected.fix


def test_what_a_path_rule_cannot_decide_here_is_said_not_silenced(capsys):
    """Issue 38: a path on a file system this machine lacks is neither an error nor silence: `workshop check`
    prints a note (and exits 0); the library's findings leave notes out unless asked."""
    samples = [SAMPLES / "output-folder-missing" / "good-another-machine.sbatch",
               SAMPLES / "relative-path-after-cd" / "good-another-machine.sbatch"]
    assert main(["check", *map(str, samples)]) == 0
    out = capsys.readouterr().out
    assert "note [output-folder-missing]" in out and "note [relative-path-after-cd]" in out
    assert "2 undecided here" in out
    assert [f.severity for sample in samples for f in lint_file(sample, notes=True)] == ["note", "note"]
    assert all(lint_file(sample) == [] for sample in samples)


def test_every_rule_the_slurm_primer_names_exists():
    page = (REPO / "book" / "slurm_primer.md").read_text()
    named = {name for row in page.splitlines() if row.startswith("| `")
             for name in re.findall(r"`([a-z0-9]+(?:-[a-z0-9]+)+)`", row.split("|")[1])}
    assert len(named) >= 40 and named <= set(RULES) | set(FOLDER_RULES)


def test_a_scripts_layout_is_read_once_for_the_pitfalls_and_the_fit_check():
    """checks.layout.script_layout is the one reading of a script's layout: the GPUs per node as the launch
    rules read the request (--gpus over the nodes), the NeMo factory, sizes and depth; the fit check reads it
    too, so a depth known only at run time keeps it silent rather than guessing."""
    from workshop_lib.checks.layout import script_layout
    from workshop_lib.checks.lint import lint_script
    from workshop_lib.checks.sbatch import read_header
    from workshop_lib.checks.script import Script

    text = (SAMPLES / "does-not-fit" / "bad.sbatch").read_text()
    assert [f.rule for f in lint_script(text) if f.is_error] == ["does-not-fit"]
    spread = text.replace("--nodes=1", "--nodes=2").replace("--gpus-per-node=1", "--gpus=8")
    layout = script_layout(Script(spread, read_header(spread), None, "spread.sbatch"))
    assert (layout.nodes, layout.gpus_per_node, layout.gpus, layout.model) == (2, 4, 8, "llama31_8b")
    unknown_depth = text.replace("trainer.devices=1 \\", "trainer.devices=1 model.config.num_layers=$LAYERS \\")
    layout = script_layout(Script(unknown_depth, read_header(unknown_depth), None, "depth.sbatch"))
    assert "num_layers" in layout.unknown and layout.lora is False
    assert not [f for f in lint_script(unknown_depth) if f.rule == "does-not-fit"]
