"""`nemo llm finetune` as a job script writes it: one reading of the script's words, two views of them.

The script is split into shell words by shlex, one command at a time (backslash continuations joined), and each
word keeps the line it is on. The linter asks for an override wherever the script writes it (``nemo_overrides``:
``value`` and ``line`` of `trainer.devices=4`, also inside a quoted list of arguments such as ARGS="...");
nemo_check takes the finetune command apart (``command_from_script``: factory, overrides, flags) to resolve it
with NeMo itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workshop_lib.checks.sbatch import shell_words
from workshop_lib.core.errors import WorkshopError

STRATEGY = "trainer.strategy."
# The overrides the linter reads: the job's size, Megatron's parallel layout, PEFT and the batch sizes.
LINTED_KEYS = ("trainer.devices", "trainer.num_nodes", f"{STRATEGY}tensor_model_parallel_size",
               f"{STRATEGY}expert_model_parallel_size", f"{STRATEGY}pipeline_model_parallel_size",
               f"{STRATEGY}context_parallel_size", f"{STRATEGY}sequence_parallel", "peft",
               "data.global_batch_size", "data.micro_batch_size", "model.config.num_layers")
_LINTED = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, LINTED_KEYS)) + r")=(\S+)")


@dataclass(frozen=True)
class Word:
    """One shell word (quotes removed) and the line of the script it is on."""

    text: str
    line: int


def shell_commands(text: str) -> list[tuple[Word, ...]]:
    """Each command of ``text``, continuation lines joined, as its shell words."""
    commands: list[tuple[Word, ...]] = []
    words: list[Word] = []
    for number, line in enumerate(text.split("\n"), start=1):
        continued = line.rstrip().endswith("\\")
        words += [Word(word, number) for word in _split(line.rstrip().removesuffix("\\") if continued else line)]
        if not continued:
            commands.append(tuple(words))
            words = []
    if words:
        commands.append(tuple(words))
    return commands


def _split(line: str) -> list[str]:
    return shell_words(line)


# --- the linter's view ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NemoOverrides:
    """The linted overrides a script writes: key -> the last value written, with its line."""

    found: dict[str, Word]

    def value(self, key: str) -> str | None:
        found = self.found.get(key)
        return found.text.strip("\"'") if found else None

    def line(self, key: str) -> int | None:
        found = self.found.get(key)
        return found.line if found else None


def nemo_overrides(code: str) -> NemoOverrides:
    """The overrides of ``LINTED_KEYS`` written anywhere in ``code`` (a script without its comments), where
    a Lightning/NeMo command would take them; the last one of a key wins."""
    found = {}
    for command in shell_commands(code):
        for word in command:
            for match in _LINTED.finditer(word.text):
                found[match.group(1)] = Word(match.group(2), word.line)
    return NemoOverrides(found)


# --- nemo_check's view ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NemoCommand:
    """`nemo llm finetune --factory FACTORY OVERRIDES... [flags]` as a job script runs it."""

    factory: str
    overrides: tuple[str, ...]
    flags: tuple[str, ...]

    @property
    def arguments(self) -> list[str]:
        return ["--factory", self.factory, *self.overrides, *self.flags]


def command_from_script(script: str) -> NemoCommand:
    """The finetune command of a rendered job script: the words after `nemo llm finetune`, up to `||`."""
    for command in shell_commands(script):
        texts = [word.text for word in command]
        start = next((index + 3 for index in range(len(texts) - 2)
                      if texts[index:index + 3] == ["nemo", "llm", "finetune"]), None)
        if start is not None:
            break
    else:
        raise WorkshopError("the script has no `nemo llm finetune` line; render a chapter 1-2 experiment "
                            "with a NeMo profile (--profile ibex)")
    words = texts[start:]
    if "||" in words:
        words = words[:words.index("||")]
    factory, overrides, flags = None, [], []
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--factory":
            factory, index = words[index + 1], index + 2
            continue
        (flags if word.startswith("-") else overrides).append(word)
        index += 1
    if factory is None:
        raise WorkshopError("the finetune command has no --factory; the templates always render one")
    return NemoCommand(factory, tuple(overrides), tuple(flags))
