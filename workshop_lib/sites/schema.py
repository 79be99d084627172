"""The schema of a site profile: types from the dataclasses in profiles.py, rules for the values.

Every value of a profile ends up in a job script (an #SBATCH line, a path, a command word), so each key
has a rule for what it may hold. Types come from the dataclass annotations; `RULES` adds the ranges and
the shapes of strings. Errors name the file, the key (dotted) and what was expected.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments.matrix import CHAPTERS


class ProfileError(WorkshopError):
    """A profile is missing, malformed, or cannot realise an experiment (profiles.py re-exports it)."""

# Keys a profile must set itself; everything else has a default.
REQUIRED = ("name", "scheduler", "python", "training")

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"


class Rule(typing.NamedTuple):
    """What one key may hold beyond its type: a pattern for strings, a range for numbers, a set of words."""

    expected: str
    pattern: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()


# Shell path: plain text in double quotes in the script, where only $NAME / ${NAME} may expand.
SHELL_PATH = Rule("a path (variables such as $USER allowed; no quotes, backquotes, backslashes or $( ))",
                  rf"(?:[^$\"`\\\x00-\x1f\x7f]|\$(?:{_IDENTIFIER}|\{{{_IDENTIFIER}\}}))+")
# The class's staged folder: absolute (every participant's jobs read it from their own run folders).
ABSOLUTE_SHELL_PATH = Rule("an absolute path (variables such as $USER allowed; no spaces, quotes, backquotes, "
                           "backslashes or $( ))",
                           rf"(?:/|\$(?:{_IDENTIFIER}|\{{{_IDENTIFIER}\}}))"
                           rf"(?:[^$\"`\\\s\x00-\x1f\x7f]|\$(?:{_IDENTIFIER}|\{{{_IDENTIFIER}\}}))*")
# One word on an #SBATCH line: no spaces, no quotes.
SLURM_WORD = Rule("a SLURM name (letters, digits and _ . , : & | [ ] - only)", r"[A-Za-z0-9_.,:&|\[\]*+-]+")
# Text that is quoted with shlex.quote wherever it reaches a script: anything printable.
# A reservation name as `scontrol show reservation` prints it (also what $WORKSHOP_RESERVATION may hold).
RESERVATION = Rule("a SLURM reservation name (letters, digits, _ . - only)", r"[A-Za-z0-9_.-]+")
TEXT = Rule("text on one line", r"[^\x00-\x1f\x7f]+")
MODULE = Rule("an environment module name such as cuda/12.4.1", r"[A-Za-z0-9_.+/-]+")
TIME = Rule("a time limit in quotes, \"HH:MM:SS\" or \"D-HH:MM:SS\"", r"(?:\d+-)?\d{1,3}:\d{2}:\d{2}")
COUNT = Rule("a whole number of at least 1", minimum=1)

RULES: dict[str, Rule] = {
    "name": Rule("a profile name (letters, digits, _ . -)", r"[A-Za-z0-9_.-]+"),
    "description": TEXT,
    "scheduler.constraint": SLURM_WORD,
    "scheduler.partition": SLURM_WORD,
    "scheduler.account": SLURM_WORD,
    "scheduler.reservation": RESERVATION,
    "scheduler.time_limits.*": TIME,
    # A time limit per chapter of the registry (its numbers run without gaps).
    "scheduler.time_limits.<key>": Rule(f"a chapter number ({min(CHAPTERS)} to {max(CHAPTERS)})",
                                        minimum=min(CHAPTERS), maximum=max(CHAPTERS)),
    "scheduler.gpu_node_features.*": Rule("a SLURM node feature (letters, digits, _ . - only)", r"[A-Za-z0-9_.-]+"),
    "scheduler.gpu_node_features.<key>": Rule("GPUs per node of that node shape (1 to 16)", minimum=1, maximum=16),
    "cache_root": SHELL_PATH,
    # Absolute: every participant's jobs read it from their own run folders.
    "shared_root": ABSOLUTE_SHELL_PATH,
    "gpu_monitor_interval_s": Rule("seconds between samples, 1 to 3600", minimum=1, maximum=3600),
    "cpu_monitor_interval_s": Rule("seconds between samples, 1 to 3600", minimum=1, maximum=3600),
    "rendezvous_host": Rule("a host name or IP address", r"[A-Za-z0-9_.:-]+"),
    "nemo.modules.*": MODULE,
    "nemo.image": SHELL_PATH,
    "nemo.command": TEXT,  # split on spaces, each word shell-quoted where the script runs it
    "nemo.image_source": Rule("a container reference such as docker://nvcr.io/nvidia/nemo:25.07",
                              r"(?:docker|library|oras|shub)://[A-Za-z0-9_./:@-]+"),
    "nemo.binds.*": SHELL_PATH,
    "nemo.factories.*": TEXT,
    "nemo.hub_ids.*": Rule("a Hugging Face repository id, owner/name", r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+"),
    "nemo.hf_token_variable": Rule("an environment variable name", _IDENTIFIER),
    "python.modules.*": MODULE,
    "python.conda_root": SHELL_PATH,
    "python.conda_environment": Rule("a conda environment name (letters, digits, _ . -)", r"[A-Za-z0-9_.-]+"),
    "python.python": TEXT,
    "python.torchrun": TEXT,
    "python.psrecord": TEXT,
    # srun options, each --name=value with a plain value: they reach `srun` as separate words.
    "python.build_allocation": Rule("srun options such as \"--time=01:00:00 --cpus-per-task=8\"",
                                    r"--[a-z][a-z-]*=[A-Za-z0-9_.,:-]+(?: --[a-z][a-z-]*=[A-Za-z0-9_.,:-]+)*"),
    "training.data": TEXT,
    "training.models.*": TEXT,
    "training.precision": Rule("one of fp32, fp16, bf16", choices=("fp32", "fp16", "bf16")),
    "training.max_steps": COUNT,
    "training.eval_samples": COUNT,
    "training.max_length": COUNT,
    "training.threads_per_process": Rule("threads, 1 to 256", minimum=1, maximum=256),
    "training.gpt_shape.*": COUNT,
    "training.gpt_shape.<key>": Rule("one of hidden, heads, ffn, vocab, seq_len, layers",
                                     choices=("hidden", "heads", "ffn", "vocab", "seq_len", "layers")),
    "bandwidth_check.tool": Rule("torch or nccl-tests", choices=("torch", "nccl-tests")),
    "bandwidth_check.min_bus_bandwidth_gbps": Rule("GB/s, 0 or more", minimum=0),
    "bandwidth_check.size_mb": Rule("megabytes, 1 to 65536", minimum=1, maximum=65536),
    "bandwidth_check.iterations": Rule("a count, 1 to 1000", minimum=1, maximum=1000),
    "bandwidth_check.environment.*": TEXT,
    "bandwidth_check.environment.<key>": Rule("an environment variable name", _IDENTIFIER),
    "bandwidth_check.nccl_tests_modules.*": MODULE,
    "bandwidth_check.nccl_tests_command": TEXT,
    "bandwidth_check.nccl_tests_arguments.*": TEXT,
    "rehearsal.sleep_s": Rule("seconds each rehearsal job sleeps, 0 to 600", minimum=0, maximum=600),
    "rehearsal.staged": SHELL_PATH,
    "jupyter.login_host": Rule("a host name", r"[A-Za-z0-9_.-]+"),
    "jupyter.node_domain": Rule("a DNS domain such as ibex.kaust.edu.sa", r"[A-Za-z0-9_.-]+"),
    "jupyter.time": TIME,
    "jupyter.cpus": Rule("a number of cores, 1 to 128", minimum=1, maximum=128),
    "jupyter.memory": Rule("host memory such as 16G", r"\d+[KMGT]?"),
    "limits.max_gpus": COUNT,
    "limits.max_nodes": COUNT,
}


def build(cls, data, where: str, prefix: str = "", source: Path | None = None):
    """An instance of the dataclass `cls` from `data`, or a ProfileError naming the file and the key."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: {prefix.rstrip('.') or 'the file'} must be a mapping of keys, "
                           f"got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    known = {item.name for item in fields(cls)} - {"source"}
    unknown = sorted(set(map(str, data)) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {', '.join(repr(prefix + key) for key in unknown)}; "
                           f"known keys{' of ' + prefix.rstrip('.') if prefix else ''}: {', '.join(sorted(known))}")
    if not prefix:
        for required in REQUIRED:
            if required not in data:
                raise ProfileError(f"{where}: the key {required!r} is missing (see slurm/profiles/ibex.yml)")
    values = {}
    for item in fields(cls):
        if item.name == "source":
            continue
        key = prefix + item.name
        if item.name in data:
            values[item.name] = _convert(data[item.name], hints[item.name], key, where)
        elif item.default is MISSING and item.default_factory is MISSING:
            if is_dataclass(_unwrap_optional(hints[item.name])):
                values[item.name] = _unwrap_optional(hints[item.name])()
            else:
                values[item.name] = ""  # only description: optional text
    if source is not None:
        values["source"] = source
    return cls(**values)


def _convert(value, annotation, key: str, where: str):
    """Check `value` against the annotation and RULES[key]; lists become tuples (profiles stay hashable)."""
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in arguments:
        if value is None:
            return None
        return _convert(value, _unwrap_optional(annotation), key, where)
    if is_dataclass(annotation):
        return build(annotation, value, where, prefix=key + ".")
    if origin is tuple:
        if not isinstance(value, list):
            raise _error(where, key, "a list (one item per line, each starting with '- ')", value)
        return tuple(_convert(item, arguments[0], f"{key}.*", where) for item in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise _error(where, key, "a mapping of keys to values", value)
        return {_convert(name, arguments[0], f"{key}.<key>", where): _convert(item, arguments[1], f"{key}.*", where)
                for name, item in value.items()}
    return _check_scalar(value, annotation, key, where)


def _check_scalar(value, annotation, key: str, where: str):
    rule = RULES.get(key) or RULES.get(_generic(key))
    expected = rule.expected if rule else {bool: "true or false", int: "a whole number", float: "a number",
                                          str: "text"}[annotation]
    if annotation is bool and not isinstance(value, bool):
        raise _error(where, key, f"{expected} (a boolean)", value)
    if annotation is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _error(where, key, f"{expected} (an integer)", value)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _error(where, key, f"{expected} (a number)", value)
        value = float(value)
    if annotation is str and not isinstance(value, str):
        raise _error(where, key, f"{expected} (a string)", value)
    if rule is None:
        return value
    if rule.choices and value not in rule.choices:
        raise _error(where, key, rule.expected, value)
    if rule.pattern and not re.fullmatch(rule.pattern, value):
        raise _error(where, key, rule.expected, value)
    if rule.minimum is not None and value < rule.minimum or rule.maximum is not None and value > rule.maximum:
        raise _error(where, key, rule.expected, value)
    return value


def _generic(key: str) -> str:
    # scheduler.time_limits.* covers every chapter's value; the keys themselves are checked as <key>.
    return re.sub(r"\.\*(\.\*)+", ".*", key)


def _unwrap_optional(annotation):
    arguments = [argument for argument in typing.get_args(annotation) if argument is not type(None)]
    return arguments[0] if typing.get_origin(annotation) in (typing.Union, types.UnionType) else annotation


def _describe(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _error(where: str, key: str, expected: str, value) -> ProfileError:
    shown = key.replace(".*", "[]").replace(".<key>", " (a key)")
    return ProfileError(f"{where}: {shown}: expected {expected}, got {_describe(value)}. "
                        "Fix the value in the profile (slurm/profiles/ibex.yml shows each key in use)")
