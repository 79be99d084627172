"""The overrides of a `nemo llm finetune` command as a job script writes them (key -> value and line)."""

from __future__ import annotations

import re
from dataclasses import dataclass

STRATEGY = "trainer.strategy."
_OVERRIDE = re.compile(r"(?<![\w.])(trainer\.devices|trainer\.num_nodes|trainer\.strategy\.(?:tensor|expert|pipeline)"
                       r"_model_parallel_size|trainer\.strategy\.context_parallel_size|trainer\.strategy\."
                       r"sequence_parallel|peft)=(\"[^\"]*\"|'[^']*'|[^\s\\]+)")


@dataclass(frozen=True)
class NemoOverrides:
    """The overrides of a `nemo llm finetune` command: key -> (value as written, line)."""

    overrides: dict[str, tuple[str, int]]

    def value(self, key: str) -> str | None:
        found = self.overrides.get(key)
        return found[0].strip("\"'") if found else None

    def line(self, key: str) -> int | None:
        found = self.overrides.get(key)
        return found[1] if found else None


def nemo_command(code: str) -> NemoOverrides:
    """The overrides written anywhere in ``code`` (a script without its comments); the last one of a key wins."""
    return NemoOverrides({match.group(1): (match.group(2), code.count("\n", 0, match.start()) + 1)
                         for match in _OVERRIDE.finditer(code)})
