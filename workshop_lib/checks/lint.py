"""The linter: every rule on one job script, rendered or hand-written, in one explicit order.

The rules live with what they check: the seeds' own scripts (``script_rules``), hand-written launches
(``launches``), what a job asks SLURM for (``requests``), sbatch's own semantics of the request
(``directive_rules``), job steps and arrays (``step_rules``), and the launchers' arithmetic against the request
(``launcher_arithmetic``). Findings are sorted by line, then rule id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from workshop_lib.checks import directive_rules, launch_rules, launcher_arithmetic, requests, script_rules, step_rules
from workshop_lib.checks.findings import Finding
from workshop_lib.checks.sbatch import read_header
from workshop_lib.checks.script import Script, read_job_script

ScriptRule = Callable[[Script], Iterable[Finding]]
SCRIPT_RULES: list[ScriptRule] = [*script_rules.RULES, *launch_rules.RULES, *requests.RULES, *directive_rules.RULES,
                                  *step_rules.RULES, *launcher_arithmetic.RULES]


def lint_file(path: Path, notes: bool = False) -> list[Finding]:
    """Lint a script on disk; --output folders are checked relative to the script's directory."""
    path = Path(path)
    return lint_script(read_job_script(path), submit_dir=path.parent, notes=notes, name=path.name)


def lint_script(text: str, submit_dir: Path | None = None, notes: bool = False,
                name: str | None = None) -> list[Finding]:
    """Every finding for one script, sorted by line. ``submit_dir`` is where sbatch will be called, ``name`` the
    script's file name; ``notes`` adds what a rule could not decide here."""
    script = Script(text, read_header(text), submit_dir, name)
    findings = [finding for rule in SCRIPT_RULES for finding in rule(script) if notes or not finding.is_note]
    return sorted(findings, key=lambda finding: (finding.line or 0, finding.rule))
