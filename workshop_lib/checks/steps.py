"""The job steps a script starts with `srun`, read the way srun reads its command line: the step's own
options (which win over the job's for that step), the program it runs, and whether the batch shell starts
it in the background (`srun ... &`) or inside a loop."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Iterator

from workshop_lib.checks.sbatch import heredoc_lines
from workshop_lib.checks.script import Script

# srun's options that take a value as the next word (`-n 2`, `--gres gpu:2`); any other `--name` without
# `=` is a flag. From srun(1), slurm-wlm 22.05.
_SHORT_VALUES = {"n": "ntasks", "N": "nodes", "c": "cpus-per-task", "G": "gpus", "w": "nodelist", "o": "output",
                 "e": "error", "J": "job-name", "t": "time", "p": "partition", "C": "constraint", "x": "exclude",
                 "m": "distribution", "D": "chdir", "i": "input"}
_LONG_VALUES = {"ntasks", "nodes", "cpus-per-task", "gpus", "gpus-per-node", "gpus-per-task", "gres", "nodelist",
                "export", "ntasks-per-node", "mem", "mem-per-cpu", "mem-per-gpu", "output", "error", "job-name",
                "time", "partition", "constraint", "gpu-bind", "cpu-bind", "mpi", "distribution", "exclude",
                "chdir", "cpus-per-gpu", "ntasks-per-gpu", "input"}
_SRUN = re.compile(r"(?<![\w./$-])srun(?![\w.-])")


@dataclass(frozen=True)
class Step:
    """One `srun` in the batch shell."""

    line: int
    options: dict[str, str]  # long names; a flag maps to ""
    program: str  # the first word after the options ('' when none)
    words: tuple[str, ...]  # the program and its arguments
    background: bool  # `srun ... &`
    in_loop: bool  # inside for/while ... done: it may run several times

    def has(self, *names: str) -> bool:
        return any(name in self.options for name in names)


def _words(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote (a string that goes on): its plain words
        return command.split()


def _parse(words: list[str]) -> tuple[dict[str, str], int]:
    """srun's options from its words (after `srun`), and the index of the program."""
    options: dict[str, str] = {}
    index = 0
    while index < len(words):
        word = words[index]
        if word.startswith("--"):
            name, equals, value = word[2:].partition("=")
            if not equals and name in _LONG_VALUES and index + 1 < len(words):
                value, index = words[index + 1], index + 1
            options[name] = value
        elif word.startswith("-") and len(word) >= 2:
            letter = word[1]
            if letter in _SHORT_VALUES:
                value = word[2:].lstrip("=")
                if not value and index + 1 < len(words):
                    value, index = words[index + 1], index + 1
                options[_SHORT_VALUES[letter]] = value
            else:
                options[{"l": "label", "u": "unbuffered"}.get(letter, letter)] = ""
        else:
            break
        index += 1
    return options, index


def step_options(srun_text: str) -> dict[str, str]:
    """srun's options (long names) in the text of an srun command (`srun --ntasks-per-node=1 -c 8 ...`)."""
    words = _words(srun_text)
    return _parse(words[1:])[0] if words and words[0] == "srun" else {}


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line, command) with backslash continuations joined."""
    buffer, start = [], None
    for number, line in enumerate(text.split("\n"), start=1):
        start = start or number
        if line.rstrip().endswith("\\"):
            buffer.append(line.rstrip()[:-1])
            continue
        buffer.append(line)
        yield start, " ".join(buffer)
        buffer, start = [], None
    if buffer:
        yield start or 1, " ".join(buffer)


def batch_code(script: Script) -> str:
    """The batch shell's code: comments and heredoc bodies (data, or a job of its own) blanked."""
    data = heredoc_lines(script.code)
    return "\n".join("" if number in data else line for number, line in enumerate(script.code.split("\n"), 1))


def steps_of(script: Script) -> list[Step]:
    """Every srun the batch shell runs, in order."""
    steps = []
    depth = 0
    for number, text in logical_lines(batch_code(script)):
        text = re.sub(r"&>", ">", text)  # `&> file` redirects both streams: no background
        words = _words(text)
        depth += sum(word == "do" for word in words)
        for match in _SRUN.finditer(text):
            before = text[:match.start()]
            if re.search(r"\b(?:echo|printf)\b[^;&|]*$", before) or before.count('"') % 2 or before.count("'") % 2:
                continue  # srun inside a message or a string another command runs
            rest = _words(text[match.end():])
            end = next((i for i, word in enumerate(rest) if word in (";", "&", "&&", "|", "||", ";;")
                        and not (word == "&" and i and rest[i - 1].endswith((">", "<")))), len(rest))
            options, program = _parse(rest[:end])
            command = rest[program:end]
            steps.append(Step(number, options, command[0] if command else "", tuple(command),
                              end < len(rest) and rest[end] == "&", depth > 0))
        depth -= sum(word == "done" for word in words)
        depth = max(depth, 0)
    return steps


def exported(script: Script, name: str) -> str | None:
    """The value the script exports (or sets) for ``name``, last one written."""
    values = re.findall(rf"^\s*(?:export\s+)?{re.escape(name)}=(\"[^\"]*\"|'[^']*'|\S*)", script.code, re.MULTILINE)
    return values[-1].strip("\"'") if values else None
