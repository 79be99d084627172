"""Reading what SLURM's tools print (scontrol, sacct) and what a job script asks for (--output)."""

from __future__ import annotations

import getpass
import re
from collections.abc import Sequence
from pathlib import Path

from workshop_lib.checks.sbatch import sbatch_request
from workshop_lib.core.durations import parse_duration
from workshop_lib.jobs.states import (
    ACTIVE_STATES,
    COMPLETED,
    PENDING,
    RUNNING,
    UNKNOWN,
    JobInfo,
)

SACCT_FIELDS = "JobID,JobName,State,ExitCode,ElapsedRaw,NodeList,Reason,TimelimitRaw"


def normalise_state(raw: str) -> str:
    """'CANCELLED by 0' -> 'CANCELLED'; 'COMPLETED+' -> 'COMPLETED'."""
    word = raw.strip().split(" ")[0] if raw.strip() else UNKNOWN
    return word.rstrip("+").upper()


def parse_exit_code(raw: str | None) -> tuple[int | None, int | None]:
    """SLURM's 'EXIT:SIGNAL' -> (exit code, signal or None)."""
    if not raw or ":" not in raw:
        return None, None
    code, signal = raw.split(":", 1)
    try:
        return int(code), (int(signal) or None)
    except ValueError:
        return None, None


def parse_wait_status(raw: str | None) -> tuple[int | None, int | None]:
    """squeue's exit_code (a wait status: exit code << 8 | signal) -> (exit code, signal or None)."""
    try:
        status = int(str(raw).strip())
    except ValueError:
        return None, None
    return (status >> 8) & 0xFF, (status & 0x7F) or None


def parse_elapsed(raw: str | None) -> float | None:
    """sacct's ElapsedRaw (seconds) or scontrol's RunTime ('1-02:03:04') -> seconds; None if unreadable."""
    try:
        return parse_duration(raw, bare_unit="seconds")
    except ValueError:
        return None


def parse_scontrol_record(line: str) -> dict[str, str]:
    """One line of `scontrol show job -o` -> {key: value}. Values may contain spaces (e.g. Command)."""
    fields: dict[str, str] = {}
    key = None
    for token in line.strip().split(" "):
        if "=" in token and re.match(r"^[A-Za-z][A-Za-z0-9_:/]*=", token):
            key, value = token.split("=", 1)
            fields[key] = value
        elif key is not None:
            fields[key] += " " + token
    return fields


def job_info_from_scontrol(job_id: str, output: str) -> JobInfo:
    """scontrol's answer for a job (one line per array task) -> JobInfo (aggregated for arrays)."""
    records = [parse_scontrol_record(line) for line in output.splitlines() if line.strip()]
    infos = [_info_from_scontrol_fields(r) for r in records if "JobId" in r]
    if len(infos) == 1 and not records[0].get("ArrayTaskId"):
        return infos[0]
    return aggregate_array(job_id, infos)


def _info_from_scontrol_fields(fields: dict[str, str]) -> JobInfo:
    exit_code, signal = parse_exit_code(fields.get("ExitCode"))
    task = fields.get("ArrayTaskId")
    job_id = f"{fields['ArrayJobId']}_{task}" if task and fields.get("ArrayJobId") else fields["JobId"]
    stdout = fields.get("StdOut")
    return JobInfo(
        job_id=job_id,
        state=normalise_state(fields.get("JobState", UNKNOWN)),
        exit_code=exit_code,
        signal=signal,
        elapsed_s=parse_elapsed(fields.get("RunTime")),
        reason=fields.get("Reason"),
        stdout_path=Path(stdout) if stdout and stdout != "(null)" else None,
        name=fields.get("JobName"),
        node_list=fields.get("NodeList") if fields.get("NodeList") not in (None, "(null)") else None,
        time_limit_s=parse_elapsed(fields.get("TimeLimit")),
    )


def job_infos_from_sacct(output: str) -> dict[str, JobInfo]:
    """`sacct -n -P -X -o SACCT_FIELDS` -> {job id: JobInfo}; array tasks also roll up under their array id."""
    infos: dict[str, JobInfo] = {}
    for line in output.splitlines():
        parts = line.split("|")
        if len(parts) < 5 or not parts[0]:
            continue
        job_id, name, state, exit_raw, elapsed = parts[:5]
        node_list = parts[5] if len(parts) > 5 else None
        reason = parts[6] if len(parts) > 6 else None
        limit_minutes = parts[7] if len(parts) > 7 else ""
        exit_code, signal = parse_exit_code(exit_raw)
        infos[job_id] = JobInfo(
            job_id=job_id, state=normalise_state(state), exit_code=exit_code, signal=signal,
            elapsed_s=parse_elapsed(elapsed), name=name or None,
            node_list=node_list if node_list not in (None, "", "None assigned") else None,
            reason=reason or None,
            time_limit_s=float(limit_minutes) * 60 if limit_minutes.isdigit() else None,
        )
    arrays: dict[str, list[JobInfo]] = {}
    for job_id, info in infos.items():
        match = re.match(r"^(\d+)_(\d+|\[.*\])$", job_id)
        if match:
            arrays.setdefault(match.group(1), []).append(info)
    for array_id, tasks in arrays.items():
        infos[array_id] = aggregate_array(array_id, tasks)
    return infos


def aggregate_array(array_id: str, tasks: Sequence[JobInfo]) -> JobInfo:
    """One state for a whole array: active while any task is; COMPLETED only if all are."""
    if not tasks:
        return JobInfo(job_id=array_id, state=UNKNOWN)
    states = [t.state for t in tasks]
    if any(s in ACTIVE_STATES for s in states):
        state = RUNNING if any(s != PENDING for s in states) else PENDING
    elif all(s == COMPLETED for s in states):
        state = COMPLETED
    else:
        state = next(s for s in states if s != COMPLETED)
    worst_exit = max((t.exit_code for t in tasks if t.exit_code is not None), default=None)
    longest = max((t.elapsed_s for t in tasks if t.elapsed_s is not None), default=None)
    return JobInfo(job_id=array_id, state=state, exit_code=worst_exit, elapsed_s=longest,
                   name=tasks[0].name, tasks=tuple(sorted(tasks, key=lambda t: t.job_id)))


# ---- what the script asks for ----------------------------------------------------------------
def expand_filename_pattern(pattern: str, job_id: str, job_name: str, node: str = "node1") -> str:
    """SLURM's %j %x %u %N %A %a %% replacements in --output names."""
    array_id, _, task = job_id.partition("_")
    replacements = {"j": job_id, "J": job_id, "x": job_name, "u": getpass.getuser(), "N": node, "n": "0",
                    "A": array_id, "a": task or "4294967294", "%": "%"}
    return re.sub(r"%(\w|%)", lambda m: replacements.get(m.group(1), m.group(0)), pattern)


def expected_stdout(script: Path, workdir: Path, job_id: str, sbatch_args: Sequence[str] = ()) -> Path:
    """Where SLURM writes the job's stdout: --output if given (command line wins), else slurm-%j.out."""
    request = sbatch_request(script.read_text(errors="replace"), sbatch_args)
    pattern = request.get("output") or "slurm-%j.out"
    name = request.get("job-name") or script.name
    path = Path(expand_filename_pattern(pattern, job_id, name))
    return path if path.is_absolute() else workdir / path


def tail(path: Path | None, lines: int = 20) -> str:
    from workshop_lib.core.log_text import read_tail

    if path is None:
        return "(no log file known for this job)"
    if not Path(path).is_file():
        return f"(log {path} does not exist yet)"
    return "\n".join(line for _, line in read_tail(path, most=256 * 2**10).lines[-lines:])
