"""How an entry point reads its flags and ends on a user's mistake: one line ``error: ...``, exit status 2.

A bad flag, a bad value or a setting that cannot work here (a WorkshopError) is the user's to fix, so it
ends the process with the message that says how, never with a traceback on every rank. argparse's own
complaints (an unknown flag, a value of the wrong type or out of its choices) take the same way.
Standard library and core only: the rehearsal job and the NeMo stand-in run where torch may be missing.
"""

from __future__ import annotations

import argparse
import sys

from workshop_lib.core.errors import WorkshopError

USER_ERROR = 2  # the exit status of a command line to fix (argparse's own)


class FlagParser(argparse.ArgumentParser):
    """argparse for an entry point run as ``python -m MODULE``: its complaints raise a WorkshopError."""

    def __init__(self, module: str, description: str | None = None, **options):
        super().__init__(prog=f"python -m {module}", description=description, **options)

    def error(self, message: str):
        raise WorkshopError(f"{message}; `{self.prog} --help` lists the flags and their values")


def report_user_error(error: Exception) -> int:
    """Print the error on one line of stderr (every rank prints its own) and return the status to exit with."""
    print(f"error: {error}", file=sys.stderr, flush=True)
    return USER_ERROR


def check_positive(**values: int) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise WorkshopError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
