"""What a check reports: a Finding (where, which rule, what is wrong, how to fix it), and the error raised when
an experiment or a script breaks a rule that would make its job fail. Errors stop a submission; warnings do not;
a note says what a rule could not decide here (a path on another machine's file system), and is shown only
where asked for (`workshop check`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from workshop_lib.core.errors import WorkshopError

ERROR = "error"
WARNING = "warning"
NOTE = "note"


@dataclass(frozen=True)
class Finding:
    """One problem: where, which rule, what is wrong, and the fix."""

    rule: str
    severity: str
    message: str
    fix: str
    line: int | None = None

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    @property
    def is_note(self) -> bool:
        return self.severity == NOTE

    def format(self, source: str = "") -> str:
        where = f"{source}:{self.line}" if self.line else (source or "experiment")
        return f"{where}: {self.severity} [{self.rule}] {self.message} Fix: {self.fix}"


class ValidationError(WorkshopError):
    """An experiment or a script breaks a rule that would make the job fail."""

    def __init__(self, subject: str, findings: list[Finding]):
        self.findings = findings
        details = "\n".join("  " + finding.format() for finding in findings)
        super().__init__(f"{subject} cannot run as declared:\n{details}")


def errors_in(findings: Iterable[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.is_error]
