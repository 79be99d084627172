"""Hostile profile values: the schema refuses what cannot be quoted, and the rest reaches scripts quoted.

Every string key of the schema gets values with spaces, quotes, `$(...)`, backquotes, `;`, `&` and
newlines. A key whose rule refuses them must say so naming the file and the key; the keys that accept
them are all set at once, every template is rendered with that profile and each script is run with
shims for srun, module, singularity, conda, torchrun and the rest. The proof that nothing extra ran:
no `touch pwned` took effect, and each hostile word arrived at the program it was meant for as one
intact argument or program name.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
import yaml

from workshop_lib.core.vocabulary import NEMO
from workshop_lib.experiments import all_experiments
from workshop_lib.scripts import nemo_factory, render_import_script, render_script
from workshop_lib.sites.nemo_checkpoint import COMPLETE_FILES
from workshop_lib.sites.profiles import PROFILES_DIR, Profile, ProfileError, load_profile
from workshop_lib.sites.schema import RULES, SHELL_PATH, TEXT

HOSTILE = "it's \"so\" $(touch pwned) `touch pwned`; touch pwned & echo \\ end"
HOSTILE_VALUES = [HOSTILE, "two words", "a'b", 'a"b', "$(touch pwned)", "x; touch pwned", "line\ntouch pwned"]


def _string_keys() -> list[str]:
    """Dotted keys (with .* for list and mapping values) whose values are strings."""
    keys = []

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for item in fields(cls):
            if item.name == "source":
                continue
            annotation = hints[item.name]
            if typing.get_origin(annotation) in (typing.Union, types.UnionType):
                annotation = next(argument for argument in typing.get_args(annotation) if argument is not type(None))
            origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
            key = prefix + item.name
            if is_dataclass(annotation):
                walk(annotation, key + ".")
            elif annotation is str:
                keys.append(key)
            elif (origin is tuple and arguments[0] is str) or (origin is dict and arguments[1] is str):
                keys.append(key + ".*")
    walk(Profile, "")
    return keys


def _set(data: dict, key: str, value) -> None:
    *parents, last = key.split(".")
    target = data
    for parent in parents:
        if parent == "*":
            break
        if not isinstance(target.get(parent), dict):
            target[parent] = {}
        target = target[parent]
    if last == "*":
        name = parents[-1]
        current = data
        for parent in parents[:-1]:
            current = current[parent]
        if isinstance(current.get(name), dict) and current[name]:
            current[name] = {entry: value for entry in current[name]}
        elif name in ("factories", "hub_ids", "models", "environment"):
            current[name] = {"llama-3.1-8b" if name != "environment" else "SOME_VARIABLE": value}
        else:
            current[name] = [value]
    else:
        target[last] = value


def _base(name: str) -> dict:
    return yaml.safe_load((PROFILES_DIR / f"{name}.yml").read_text())


STRING_KEYS = _string_keys()


def test_every_string_key_has_a_rule():
    assert "python.torchrun" in STRING_KEYS and "nemo.binds.*" in STRING_KEYS and "cache_root" in STRING_KEYS
    assert [key for key in STRING_KEYS if key not in RULES] == []


@pytest.mark.parametrize("key", STRING_KEYS)
def test_hostile_values_are_refused_by_name_or_accepted_for_quoting(tmp_path, key):
    for value in HOSTILE_VALUES:
        data = _base("ibex")
        _set(data, key, value)
        path = tmp_path / "hostile.yml"
        path.write_text(yaml.safe_dump(data))
        if _must_refuse(RULES[key], value):
            shown = key.replace(".*", "[]")
            with pytest.raises(ProfileError) as raised:
                load_profile(path)
            assert str(raised.value).startswith(f"{path}: {shown}") and ": expected " in str(raised.value)
        else:
            assert load_profile(path)  # text keys take anything on one line: the scripts quote them


def _must_refuse(rule, value: str) -> bool:
    if "\n" in value:
        return True
    if rule is TEXT:
        return False  # quoted with shlex.quote wherever it reaches a script
    if rule is SHELL_PATH:
        # Inside double quotes: spaces and single quotes are harmless; $( ), backquotes, " and \ are not.
        return any(part in value for part in ("$(", "`", '"', "\\"))
    return True  # names, modules, times, choices: every hostile value breaks their shape


# ---- rendering and running every template with every accepted key hostile ----------------------
# Every program a script calls, as one bash script (a Python shim per call made this test take minutes: ~400
# calls). It records its name, folder and arguments NUL-separated, the call ended by \x1e, holding a lock (the
# background monitors' calls would interleave), and does what the scripts expect of the real program.
SHIM = """#!/bin/bash
name=${{0##*/}}
{{ flock 9 && printf '%s\\0' "$name" "$PWD" "$@" $'\\036' >> "$SHIM_LOG"; }} 9>> "$SHIM_LOG.lock"
case $name in
srun)
    while [ $# -gt 0 ] && [ "${{1#-}}" != "$1" ]; do shift; done
    exec "$@" ;;
scontrol)
    echo node1 ;;
singularity)  # `nemo llm import`: the files of a complete checkpoint
    importing= output=
    for word in "$@"; do
        [ "$word" = import ] && importing=1
        case $word in output_path=*) output=${{word#output_path=}} ;; esac
    done
    if [ -n "$importing" ]; then
        for relative in {complete_files}; do
            mkdir -p "$(dirname "$output/$relative")" && printf '{{}}' > "$output/$relative"
        done
    fi ;;
python*)
    [ "$1" = -c ] && echo 29400 ;;
torchrun*)
    for word in "$@"; do
        [ "$word" = workshop_lib.train.bandwidth ] && echo "# Avg bus bandwidth    : 100.0"
    done ;;
esac
exit 0
"""


def _shim_calls(log: Path) -> list[dict]:
    calls = []
    for record in log.read_bytes().split(b"\x1e\0")[:-1]:
        program, cwd, *argv = (field.decode() for field in record.split(b"\0")[:-1])
        calls.append({"program": program, "argv": argv, "cwd": cwd})
    return calls


def _hostile_site(tmp_path: Path, base: str) -> tuple[Profile, Path]:
    """The base profile with every text key hostile, paths with spaces, and shims for every program."""
    data = _base(base)
    for key in STRING_KEYS:
        if RULES[key] is TEXT and key != "description":
            _set(data, key, HOSTILE if not key.startswith("python.") else f"{key.split('.')[-1]} {HOSTILE}")
    root = tmp_path / "site root's"
    if base == "ibex":
        data["cache_root"] = f"{root}/cache of $USER"
        data["python"]["conda_root"] = f"{root}/mini forge"
        data["nemo"]["image"] = f"{root}/images/nemo 25.07.sif"
        data["nemo"]["binds"] = [f"{root}", "/ibex/user/$USER"]
    path = tmp_path / "hostile.yml"
    path.write_text(yaml.safe_dump(data))
    profile = load_profile(path)
    shims = tmp_path / "shims"
    shims.mkdir()
    programs = ["srun", "scontrol", "module", "singularity", "nvidia-smi", "workshop",
                profile.python.python, profile.python.torchrun, profile.python.psrecord]
    for program in programs:
        shim = shims / program
        shim.write_text(SHIM.format(complete_files=" ".join(shlex.quote(name) for name in COMPLETE_FILES)))
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    if base == "ibex":
        # What `workshop setup` would have made: the image, conda and every step's marker.
        user = os.environ.get("USER", "root")
        cache = Path(profile.cache_root.replace("$USER", user))
        (cache / "setup").mkdir(parents=True)
        for step in ("environment", "hub-download", "nemo-data", "nemo-import-llama-3.1-8b",
                     "nemo-import-mixtral-8x7b"):
            (cache / "setup" / f"{step}.done").write_text("ok\n")
        image = Path(profile.nemo.image)
        image.parent.mkdir(parents=True)
        image.write_text("image\n")
        conda = Path(profile.python.conda_root) / "etc" / "profile.d"
        conda.mkdir(parents=True)
        (conda / "conda.sh").write_text('conda() { echo "conda $*" >> "$SHIM_LOG.conda"; }\n')
    return profile, shims


# The hostile words come from the profile, so one experiment per template and model (the profile maps models to
# factories and hub names) shows them quoted (the fast tier);
# every experiment's script (dozens, a bash run each) is the slow variant.
@pytest.mark.parametrize("base, every_experiment", [
    ("ibex", False), ("tiny", False),
    pytest.param("ibex", True, marks=pytest.mark.slow), pytest.param("tiny", True, marks=pytest.mark.slow)])
def test_every_template_runs_hostile_values_as_plain_words(tmp_path, base, every_experiment):
    profile, shims = _hostile_site(tmp_path, base)
    experiments = [experiment for experiment in all_experiments() if profile.supports(experiment)]
    if not every_experiment:
        experiments = list({_shape(experiment, profile): experiment for experiment in experiments}.values())
    scripts = {experiment.id: render_script(experiment, profile) for experiment in experiments}
    if profile.nemo.enabled:
        scripts.update({f"import/{model}": render_import_script(model, profile) for model in profile.nemo.hub_ids})
    templates = {"nemo_finetune", "nemo_import", "torchrun_single_node", "torchrun_multi_node"}
    log = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "SHIM_LOG": str(log), "USER": "root",
           "SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "hostile", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "2",
           "SLURM_NODEID": "0", "SLURM_CPUS_PER_TASK": "4", "SLURMD_NODENAME": "node1"}
    seen_templates = set()
    for index, (experiment_id, text) in enumerate(sorted(scripts.items())):
        run_dir = tmp_path / "runs" / f"job {index}"
        run_dir.mkdir(parents=True)
        (run_dir / "job.sbatch").write_text(text)
        result = subprocess.run(["bash", "job.sbatch"], cwd=run_dir, env=env, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, f"{experiment_id}:\n{result.stdout}\n{result.stderr}"
        seen_templates |= {name for name in templates if f"{name}" in _template_of(experiment_id, profile)}
    assert not list(tmp_path.rglob("pwned")), "a hostile value was executed"
    calls = _shim_calls(log)
    programs = {call["program"] for call in calls}
    assert {profile.python.torchrun, "srun"} <= programs  # the hostile names ran as one program name each
    training = [call["argv"] for call in calls if call["program"] == profile.python.torchrun
                and "workshop_lib.train.bandwidth" not in call["argv"]]
    assert training and all(HOSTILE in argv for argv in training)  # model / data arrive as one argument
    if base == "ibex":
        assert seen_templates == templates
        assert any(call["program"] == "singularity" and HOSTILE in call["argv"] for call in calls)  # the factory
        assert profile.python.psrecord in programs and profile.python.python in programs
    else:
        assert seen_templates == templates - {"nemo_finetune", "nemo_import"}


def _shape(experiment, profile: Profile) -> tuple:
    """What decides where the profile's words land in a script: the template, the model (the profile maps it to a
    factory and a hub name), whether the NeMo factory is called bare (then it is one argument by itself) and the
    template's branches (psrecord follows the training when the CPU memory is monitored)."""
    bare_factory = experiment.engine == NEMO and nemo_factory(experiment, "factory") == "factory"
    return (_template_of(experiment.id, profile), experiment.model, bare_factory, experiment.monitor_cpu_memory,
            experiment.nodes > 1)


def _template_of(experiment_id: str, profile: Profile) -> str:
    from workshop_lib.experiments import get_experiment
    from workshop_lib.scripts import template_for

    if experiment_id.startswith("import/"):
        return "nemo_import"
    return template_for(get_experiment(experiment_id), profile)
