"""A job script as the linter's rules read it: its text, its #SBATCH header, its code without comments, the
numbers it sets, its shells (`bash -c` children) and the commands it runs. ``read_job_script`` refuses, saying
what it is instead, anything that is not a shell job script."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable

from workshop_lib.checks.sbatch import SbatchHeader, heredoc_lines
from workshop_lib.core.errors import WorkshopError

_NUMBER_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=[\"']?(\d+)[\"']?\s*(?:#.*)?$", re.MULTILINE)
_BASH_C = re.compile(r"\bbash\s+-c\s+(['\"])")
# SLURM's variables for what the directives asked, by the directive that sets them.
_SLURM_VARIABLES = {"SLURM_GPUS_PER_NODE": "gpus-per-node", "SLURM_GPUS_ON_NODE": "gpus-per-node",
                    "SLURM_NTASKS_PER_NODE": "ntasks-per-node", "SLURM_JOB_NUM_NODES": "nodes",
                    "SLURM_NNODES": "nodes", "SLURM_GPUS": "gpus", "SLURM_NTASKS": "ntasks",
                    "SLURM_CPUS_PER_TASK": "cpus-per-task"}


@dataclass(frozen=True)
class Script:
    """A job script as the rules see it."""

    text: str
    header: SbatchHeader
    submit_dir: Path | None = None
    name: str | None = None  # the script's file name (SLURM's default job name), when linted from a file

    @cached_property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @cached_property
    def code(self) -> str:
        """The script without full-line comments (so explanations do not trip the rules), and without the
        bodies of heredocs that write a job script of their own (their #SBATCH lines are another job's)."""
        other_jobs = self.other_job_lines
        return "\n".join("" if line.lstrip().startswith("#") or number in other_jobs else line
                         for number, line in enumerate(self.lines, start=1))

    @cached_property
    def other_job_lines(self) -> set[int]:
        """Lines of heredocs whose body holds #SBATCH directives: a second job, linted on its own."""
        body = heredoc_lines(self.text)
        blocks: list[list[int]] = []
        for number in sorted(body):
            if blocks and blocks[-1][-1] == number - 1:
                blocks[-1].append(number)
            else:
                blocks.append([number])
        return {number for block in blocks if any(self.lines[n - 1].lstrip().startswith("#SBATCH") for n in block)
                for number in block}

    def line_of(self, needle: str) -> int | None:
        for number, line in enumerate(self.lines, start=1):
            if needle in line and not line.lstrip().startswith("#") and number not in self.other_job_lines:
                return number
        return None

    def number(self, value: str | None) -> int | None:
        """An integer from a literal, a SLURM variable the directives set, or a number assigned in the script."""
        if value is None:
            return None
        value = value.strip("\"'")
        if value.isdigit():
            return int(value)
        match = re.fullmatch(r"\$\{?([A-Za-z_]\w*)\}?", value)
        if not match:
            return None
        name = match.group(1)
        if name in _SLURM_VARIABLES:
            directive = _SLURM_VARIABLES[name]
            if directive == "gpus-per-node":
                return self.header.gpus_per_node or None
            if directive == "ntasks" and self.header.get("ntasks") is None and self.header.get("ntasks-per-node"):
                per_node = self.number(self.header.get("ntasks-per-node"))
                nodes = self.number(self.header.get("nodes") or "1")
                return per_node * nodes if per_node and nodes else None  # SLURM_NTASKS = per node x nodes
            if directive == "gpus":
                match = re.search(r"(\d+)$", self.header.get("gpus") or "")
                return int(match.group(1)) if match else None
            return self.number(self.header.get(directive) or ("1" if directive == "nodes" else None))
        assigned = [int(found[1]) for found in _NUMBER_ASSIGNMENT.findall(self.text) if found[0] == name]
        return assigned[-1] if len(set(assigned)) == 1 else None


class NotAJobScript(WorkshopError):
    """The linter was given something that is not a shell job script (binary data, Python, JSON, empty)."""


_SHELL_SHEBANG = re.compile(r"^#!\s*\S*(?:/|env\s+)(?:ba|z|k|da)?sh\b")
# A job script is a few KiB (the seeds' longest is under 10); past this it is data, and checking it would take
# minutes.
LARGEST_SCRIPT_BYTES = 256 * 2**10


def read_job_script(path: Path) -> str:
    """The text of a job script; NotAJobScript (saying what the file is instead) for anything else, so a
    wrong file is never reported as a script without findings."""
    path = Path(path)
    if not path.is_file():
        raise WorkshopError(f"no script at {path}: give the path of an sbatch script (or a folder of them)")
    if path.stat().st_size > LARGEST_SCRIPT_BYTES:
        raise NotAJobScript(f"{path}: {path.stat().st_size / 2**20:.1f} MiB, far more than a job script (a few "
                            f"KiB; checked up to {LARGEST_SCRIPT_BYTES // 2**10} KiB): give the sbatch script itself")
    data = path.read_bytes()
    if b"\0" in data[:65536]:
        raise NotAJobScript(f"{path}: a binary file (it holds NUL bytes), not a job script; give the sbatch "
                            "script itself (a text file starting with #!/bin/bash and #SBATCH lines)")
    text = data.decode("utf-8", errors="replace")
    if text.count("\ufffd") > max(8, len(text) // 100):
        raise NotAJobScript(f"{path}: not UTF-8 text ({text.count(chr(0xFFFD))} undecodable bytes), not a job "
                            "script; give the sbatch script itself")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first:
        raise NotAJobScript(f"{path}: empty, nothing to check; give an sbatch script with #SBATCH lines")
    if first.startswith("#!") and not _SHELL_SHEBANG.match(first):
        raise NotAJobScript(f"{path}: starts with {first[:60]!r}, a script for another interpreter; sbatch runs "
                            "shell scripts: check the job script that starts it (#!/bin/bash, #SBATCH lines)")
    if not first.startswith("#!") and "#SBATCH" not in text:
        raise NotAJobScript(f"{path}: neither a #! line nor any #SBATCH directive, so not a job script "
                            "(sbatch refuses a script without #!); give the sbatch script itself")
    return text


def shell_scopes(text: str) -> list[tuple[str, int]]:
    """The batch shell's text and the text of each `bash -c '...'` child shell, with their offsets."""
    children: list[tuple[int, int]] = []
    position = 0
    while True:
        match = _BASH_C.search(text, position)
        if not match:
            break
        quote, start = match.group(1), match.end()
        end = start
        while end < len(text):
            if text[end] == quote and (quote == "'" or text[end - 1] != "\\"):
                break
            end += 1
        children.append((start, end))
        position = end + 1
    scopes = [(text[start:end], start) for start, end in children]
    outer, cursor = [], 0
    for start, end in children:
        outer.append(text[cursor:start])
        outer.append("\n" * text.count("\n", start, end))  # keep line numbers
        cursor = end
    outer.append(text[cursor:])
    return [("".join(outer), 0)] + scopes


_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")


def command_words(code: str) -> Iterable[tuple[int, str]]:
    """(line, command word) for the commands a script runs, `$(...)` ones included, heredoc bodies skipped."""
    delimiter = None
    for number, line in enumerate(code.splitlines(), start=1):
        if delimiter is not None:
            delimiter = None if line.strip() == delimiter else delimiter
            continue
        words = line.split()
        if words and not re.match(r"^[A-Za-z_]\w*(\[[^]]*\])?=", words[0]):
            yield number, words[0]
        for word in re.findall(r"\$\(\s*([\w./-]+)", line):
            yield number, word
        if match := _HEREDOC.search(line):
            delimiter = match.group(1)
