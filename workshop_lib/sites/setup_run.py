"""Running a setup plan: each step's bash program, which steps to run, whether one is done, and the run
itself, which records each success in a marker file (a second run does nothing; an interrupted run
resumes at the step that failed). `--dry-run` prints the same programs without running them.
"""

from __future__ import annotations

import os
import subprocess
import time

from workshop_lib.sites.requirements import SETUP_COMMAND, SetupError
from workshop_lib.sites.reservation import describe_reservation
from workshop_lib.sites.setup_plan import Plan, Step


# ---- running it ---------------------------------------------------------------------------------
def step_program(plan: Plan, step: Step, with_marker: bool = True) -> str:
    """The bash program of one step: variables, its commands, then its marker on success."""
    body = [plan.preamble, "set -euo pipefail", *step.commands]
    if with_marker:
        body.append(f'mkdir -p "$SETUP_STATE" && echo {step.fingerprint} > "$SETUP_STATE/{step.name}.done"')
    return "\n".join(body) + "\n"


def select(plan: Plan, only: list[str] | None = None, start: str | None = None) -> list[Step]:
    names = [step.name for step in plan.steps]
    for name in (only or []) + ([start] if start else []):
        if name not in names:
            raise SetupError(f"no setup step {name!r}; the steps are: {', '.join(names)}")
    steps = plan.steps
    if start:
        steps = steps[names.index(start):]
    if only:
        steps = [step for step in steps if step.name in only]
    return steps


def is_done(plan: Plan, step: Step) -> bool:
    program = f"{plan.preamble}\n{step.done_test}\n"
    return subprocess.run(["bash", "-c", program], capture_output=True).returncode == 0


def describe(plan: Plan, steps: list[Step]) -> str:
    """The dry run: each step, whether it is done, and the commands it would run."""
    lines = [f"# {SETUP_COMMAND} --dry-run, profile {plan.profile.name!r} ({plan.profile.source or 'built in'})",
             f"# Batch jobs: {describe_reservation(plan.profile)}",
             "# Variables every step starts with:"]
    lines += [f"    {line}" for line in plan.preamble.splitlines()]
    for number, step in enumerate(steps, 1):
        state = "done, skipped" if is_done(plan, step) else "would run"
        lines.append(f"[{number}/{len(steps)}] {step.name}: {step.title} ({state})")
        if step.requires_environment:
            lines.append(f"    needs: {', '.join('$' + name for name in step.requires_environment)} set in this shell")
        lines += ["    " + command.replace("\n", "\n    ") for command in step.commands]
        lines.append(f"    then: {_marker_note(step)}")
    return "\n".join(lines)


def _marker_note(step: Step) -> str:
    return f"record $SETUP_STATE/{step.name}.done"


def run(plan: Plan, steps: list[Step], force: bool = False, echo=print, env: dict | None = None) -> list[str]:
    """Run the steps in order, skipping done ones; returns the names of the steps that ran."""
    env = dict(os.environ if env is None else env)
    # The import steps submit batch jobs: a bad reservation name stops the setup before anything runs.
    echo(f"Batch jobs: {describe_reservation(plan.profile, env)}")
    ran = []
    for number, step in enumerate(steps, 1):
        prefix = f"[{number}/{len(steps)}] {step.name}"
        if not force and is_done(plan, step):
            echo(f"{prefix}: already done, skipped")
            continue
        missing = [name for name in step.requires_environment if not env.get(name)]
        if missing:
            raise SetupError(f"{prefix}: set {', '.join(missing)} first (`read -rs {missing[0]} && export {missing[0]}`: "
                             f"the gated models need your Hugging Face token), then run `{SETUP_COMMAND}` again; "
                             "it resumes at this step")
        echo(f"{prefix}: {step.title} ...")
        started = time.monotonic()
        result = subprocess.run(["bash", "-c", step_program(plan, step)], env=env, cwd=str(plan.checkout))
        if result.returncode != 0:
            raise SetupError(f"{prefix} failed (exit status {result.returncode}); its output is above. Fix the cause "
                             f"and run `{SETUP_COMMAND}` again: finished steps are skipped, it resumes here. "
                             f"`{SETUP_COMMAND} --dry-run` shows the commands of every step")
        echo(f"{prefix}: done in {time.monotonic() - started:.1f} s")
        ran.append(step.name)
    return ran
