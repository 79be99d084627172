"""Where each part of a hand-written job script runs and what it launches there: torchrun, DeepSpeed's and
Accelerate's launchers, and NeMo, as participants write them after the workshop (``launches_of``), and what each
launch asks for (its own GPUs, its workers per node, its Accelerate settings). The rules that judge them are
``checks.launch_rules``.

The batch shell runs once, on the first node. A launcher started there without `srun` runs on that node
only; `srun` starts one copy per task; the batch shell expands `$SLURM_NODEID` (always 0 there) before
`srun` sees the line unless single quotes (or a quoted heredoc) keep it for the task's shell. So each
launch is read with where it runs: the batch shell, a `bash -c '...'` string, or a heredoc that `srun`
runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from workshop_lib.checks.sbatch import HEREDOC
from workshop_lib.checks.script import Script, shell_scopes

# A launcher as a command word (never `--deepspeed cfg.json`, which is the Trainer's flag).
_LAUNCHER = re.compile(
    r"(?P<torchrun>(?<![\w.-])torchrun\b|\bpython[\d.]*\s+-m\s+torch\.distributed\.(?:run|launch)\b)"
    r"|(?P<accelerate>(?<![\w.-])accelerate\s+launch\b)"
    r"|(?P<deepspeed>(?<![\w.-])deepspeed(?=\s+(?:-|\S+\.py\b)))"
    r"|(?P<nemo>(?<![\w.-])nemo\s+llm\b)")  # NeMo (Lightning): srun starts its ranks, one task per GPU
_INSTALLING = re.compile(r"\b(?:pip|conda|mamba|install)\b")
_SRUN = re.compile(r"(?<![\w./-])srun\b")
_RANK_VARIABLE = re.compile(r"\$\{?(SLURM_NODEID|SLURM_PROCID|SLURM_LOCALID)\b")
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0")
# A script whose "nodes" are processes of one machine (the workshop's local cluster) says so with this
# comment; there a localhost rendezvous is the right one.
ONE_HOST_PRAGMA = "workshop check: nodes share one host"


def _option(text: str, *names: str) -> tuple[str, int] | None:
    """The value of the last `--name=value` / `--name value` among ``names`` (with _ or -), and its offset."""
    found = None
    for name in names:
        pattern = re.escape(name).replace("_", "[_-]")
        for match in re.finditer(rf"(?<![\w-]){pattern}(?:=|\s+)(\"[^\"]*\"|'[^']*'|[^\s;&|]+)", text):
            if found is None or match.start() > found[1]:
                found = (match.group(1).strip("\"'"), match.start())
    return found


def _has_flag(text: str, *names: str) -> bool:
    return any(re.search(rf"(?<![\w-]){re.escape(name).replace('_', '[_-]')}(?![\w-])", text) for name in names)


@dataclass(frozen=True)
class Region:
    """Code that runs in one shell: the batch shell, or a string/heredoc another command runs."""

    text: str  # comments and other regions blanked, line breaks kept
    first_line: int
    under_srun: bool  # the whole region runs as an srun task
    expanded: bool  # the batch shell expands `$` in it before that task runs
    srun_text: str = ""  # the srun command that runs it


@dataclass(frozen=True)
class Launch:
    kind: str  # torchrun, accelerate, deepspeed
    line: int
    args: str  # the launcher's command line from its name on (continuations joined)
    under_srun: bool
    srun_text: str  # the srun command that starts it ('' when none)
    region: Region

    def line_of(self, offset: int) -> int:
        return self.line + self.args.count("\n", 0, offset)


def _logical_lines(text: str, first_line: int) -> list[tuple[int, str]]:
    """(line, command) with backslash continuations joined (the newline kept so offsets give lines)."""
    result, buffer, start = [], [], None
    for number, line in enumerate(text.split("\n"), start=first_line):
        if start is None:
            start = number
        if line.rstrip().endswith("\\"):
            buffer.append(line.rstrip()[:-1] + " ")
            continue
        buffer.append(line)
        result.append((start, "\n".join(buffer)))
        buffer, start = [], None
    if buffer:
        result.append((start, "\n".join(buffer)))
    return result


def _segment_before(line: str, offset: int) -> str:
    """The command a word at ``offset`` belongs to: the text since the last `;`, `&&`, `||` or `|`."""
    return re.split(r";|&&|\|\||\|", line[:offset])[-1]


@dataclass(frozen=True)
class _Heredoc:
    opener: int  # the line with `<<`
    body: tuple[int, ...]
    quoted: bool  # `<<'EOF'`: nothing in it is expanded
    target: str | None  # the variable (read -d '' VAR, VAR=$(cat <<) or file (cat > FILE) it fills


def _heredocs(lines: list[str], skip: set[int]) -> list[_Heredoc]:
    found, index = [], 0
    while index < len(lines):
        line = lines[index]
        match = HEREDOC.search(line) if index + 1 not in skip and not line.lstrip().startswith("#") else None
        if not match:
            index += 1
            continue
        delimiter, body = match.group(2), []
        index += 1
        while index < len(lines) and lines[index].strip() != delimiter:
            body.append(index + 1)
            index += 1
        target = re.search(r"\bread\b[^<]*?([A-Za-z_]\w*)\s*<<", line) or re.search(r"([A-Za-z_]\w*)=\$\(\s*cat", line) \
            or re.search(r">\s*[\"']?([\w./${}-]+)", line)
        found.append(_Heredoc(index - len(body), tuple(body), bool(match.group(1)),
                              target.group(1) if target else None))
        index += 1
    return found


class ScriptLaunches:
    """Where each region of a script runs, and every launcher started in it."""

    def __init__(self, script: Script):
        self.script = script

    @cached_property
    def regions(self) -> list[Region]:
        script = self.script
        code_lines = script.code.split("\n")
        heredocs = _heredocs(code_lines, script.other_job_lines)
        in_heredoc = {number for heredoc in heredocs for number in heredoc.body}
        batch_lines = ["" if number in in_heredoc else line for number, line in enumerate(code_lines, start=1)]
        batch_text = "\n".join(batch_lines)
        self.batch_lines = _logical_lines(batch_text, 1)  # bash -c strings kept: where a stored command is used
        scopes = shell_scopes(batch_text)
        outer = scopes[0][0]
        regions = [Region(outer, 1, False, True)]
        logical = _logical_lines(batch_text, 1)
        for scope_text, offset in scopes[1:]:
            opener_line = batch_text.count("\n", 0, offset) + 1
            opener = next((text for start, text in reversed(logical) if start <= opener_line), "")
            command = opener[:opener.find("bash -c")] if "bash -c" in opener else opener
            srun = _SRUN.search(_segment_before(command, len(command)))
            quote = batch_text[offset - 1]
            variable = re.fullmatch(r"\s*\$\{?([A-Za-z_]\w*)\}?\s*", scope_text)
            if variable:  # `srun bash -c "$NODE_TASK"`: the heredoc below holds the code
                continue
            regions.append(Region(scope_text, opener_line, srun is not None, quote == '"',
                                  command[srun.start():] if srun else ""))
        for heredoc in heredocs:
            if not heredoc.target or not heredoc.body:
                continue
            name = re.escape(heredoc.target)
            runner = next(((start, text) for start, text in logical if start > heredoc.body[-1] + 1
                           and re.search(rf"\$\{{?{name}\b|(?<![\w.-]){name}(?![\w.-])", text)), None)
            if runner is None:
                continue  # written and never run from here (a config, a Python file, a job for sbatch)
            use = re.search(rf"\$\{{?{name}\b|(?<![\w.-]){name}(?![\w.-])", runner[1]).start()
            srun = _SRUN.search(_segment_before(runner[1], use))
            body = "\n".join(code_lines[number - 1] for number in heredoc.body)
            regions.append(Region(body, heredoc.body[0], srun is not None, not heredoc.quoted,
                                  _segment_before(runner[1], use)[srun.start():] if srun else ""))
        return regions

    @cached_property
    def launches(self) -> list[Launch]:
        found = []
        for region in self.regions:  # (computing the regions also sets batch_lines)
            lines = _logical_lines(region.text, region.first_line)
            for start, text in lines:
                for match in _LAUNCHER.finditer(text):
                    kind = match.lastgroup
                    before = _segment_before(text, match.start())
                    if _INSTALLING.search(before):
                        continue  # `pip install deepspeed ...`: a package, not a launch
                    stored = re.match(r"\s*(?:export\s+)?([A-Za-z_]\w*)=[\"']", before)
                    if stored:  # LAUNCHER="torchrun ...": it runs where $LAUNCHER is used
                        user = next((t for s_, t in self.batch_lines if s_ > start and re.search(
                            rf"\$\{{?{stored.group(1)}\b", t) and not re.match(r"\s*(?:export\s+)?\w+=", t)), None)
                        if user is None:
                            continue
                        before = user[:re.search(rf"\$\{{?{stored.group(1)}\b", user).start()]
                    srun = _SRUN.search(before)
                    under = region.under_srun or srun is not None
                    srun_text = region.srun_text if region.under_srun else (before[srun.start():] if srun else "")
                    found.append(Launch(kind, start + text.count("\n", 0, match.start()), text[match.start():],
                                        under, srun_text, region))
        return found

    # --- what the job asked for --------------------------------------------------------------
    @cached_property
    def nodes(self) -> int | None:
        return self.script.number(self.script.header.get("nodes") or "1")

    @cached_property
    def gpus_per_task(self) -> int | None:
        return _count(self.script.header.get("gpus-per-task"))

    @cached_property
    def gpus_total(self) -> int | None:
        """--gpus=N (or -G N): GPUs for the whole job, placed by SLURM wherever they fit."""
        return _count(self.script.header.get("gpus"))

    @cached_property
    def gpus_per_node(self) -> int | None:
        header = self.script.header
        for option in ("gpus-per-node", "gres"):
            if header.get(option):
                return _count(header.get(option))
        if self.gpus_total and self.nodes:
            return self.gpus_total // self.nodes if self.gpus_total % self.nodes == 0 else None
        if self.gpus_per_task:
            tasks = self.tasks_per_node()
            return self.gpus_per_task * tasks if tasks else None
        return None

    def tasks_per_node(self, srun_text: str = "") -> int | None:
        """Tasks (so launchers) per node of a step: srun's own options win over the job's."""
        script, header = self.script, self.script.header
        nodes = self.nodes
        if srun_text:
            per_node = _option(srun_text, "--ntasks-per-node")
            if per_node:
                return script.number(per_node[0])
            tasks = _option(srun_text, "--ntasks") or _short(srun_text, "n")
            if tasks:
                step_nodes = _option(srun_text, "--nodes") or _short(srun_text, "N")
                total, on = script.number(tasks[0]), script.number(step_nodes[0]) if step_nodes else nodes
                return -(-total // on) if total and on else None
        if header.get("ntasks-per-node"):
            return script.number(header.get("ntasks-per-node"))
        if header.get("ntasks"):
            total = script.number(header.get("ntasks"))
            return -(-total // nodes) if total and nodes else None
        return 1

    def value_of(self, name: str) -> str | None:
        """The last literal value a script assigns to a shell variable."""
        values = re.findall(rf"^\s*(?:export\s+)?{re.escape(name)}=(\"[^\"]*\"|'[^']*'|\S*)", self.script.code, re.M)
        return values[-1].strip("\"'") if values else None


def _count(value: str | None) -> int | None:
    """GPUs in `4`, `a100:4`, `gpu:a100:4` (the first of a comma list)."""
    if not value:
        return None
    match = re.search(r"(\d+)$", value.split(",")[0])
    return int(match.group(1)) if match else 1


def _short(text: str, letter: str) -> tuple[str, int] | None:
    match = None
    for match in re.finditer(rf"(?<![\w-])-{letter}\s*(\"[^\"]*\"|[^\s\"-][^\s]*)", text):
        pass
    return (match.group(1).strip("\""), match.start()) if match else None


def launches_of(script: Script) -> ScriptLaunches:
    """One ScriptLaunches per Script, kept on it (the rules below share it)."""
    return script.__dict__.setdefault("_launches", ScriptLaunches(script))


def _name(kind: str) -> str:
    return {"torchrun": "torchrun", "accelerate": "accelerate launch", "deepspeed": "the deepspeed launcher",
            "nemo": "nemo llm"}[kind]


def _launchers(job: ScriptLaunches) -> list[Launch]:
    """The launchers that start their own workers on each node (NeMo's ranks are srun's tasks)."""
    return [launch for launch in job.launches if launch.kind != "nemo"]


_STEP_GPUS = re.compile(r"(?<![\w-])(?:--gres(?:=|\s+)gpu:(?:[A-Za-z]\w*:)?|--gpus(?:-per-node|-per-task)?(?:=|\s+)"
                        r"(?:[A-Za-z]\w*:)?|-G\s*)(\d+)")
_DEVICES_PREFIX = re.compile(r"(?<![\w$])CUDA_VISIBLE_DEVICES=[\"']?(\d+(?:,\d+)*)[\"']?\s+(?:\S+=\S*\s+)*$")


def own_gpus(script: Script, launch: Launch) -> int | None:
    """The GPUs this launch alone sees, where it is given its own: `CUDA_VISIBLE_DEVICES=2,3 torchrun ...`, or
    srun's GPU options on its step (srun(1) 22.05: a step's --gres/--gpus* win over the job's for that step)."""
    line = script.lines[launch.line - 1] if launch.line <= len(script.lines) else ""
    word = launch.args.split()[0] if launch.args.split() else ""
    start = line.find(word) if word else -1
    if start > 0:
        prefix = _DEVICES_PREFIX.search(_segment_before(line, start))
        if prefix:
            return len(prefix.group(1).split(","))
    step = _STEP_GPUS.search(launch.srun_text)
    return int(step.group(1)) if step else None


def _in_background(launch: Launch) -> bool:
    return re.search(r"(?<![&>|])&\s*$", launch.args.rstrip()) is not None


def workers_per_node(script: Script, launch: Launch) -> tuple[int, int, str] | None:
    """(workers the launcher starts on each node, offset of the option, the option as said in a message)."""
    if launch.kind == "torchrun":
        found = _option(launch.args, "--nproc_per_node")
        if not found or found[0] in ("gpu", "auto"):
            return None
        number = script.number(found[0])
        return (number, found[1], f"--nproc_per_node={number}") if number else None
    if launch.kind == "deepspeed":
        found = _option(launch.args, "--num_gpus")
        number = script.number(found[0]) if found else None
        if number:
            return number, found[1], f"--num_gpus={number}"
        # no --num_gpus: the hostfile's slots=N (deepspeed 0.19.8, launcher/runner.py: fetch_hostfile)
        slots = set(re.findall(r"\bslots=(\d+)\b", script.code)) if _option(launch.args, "--hostfile", "-H") else set()
        if len(slots) != 1:
            return None
        count = int(slots.pop())
        return count, 0, f"slots={count} in its hostfile"
    found = accelerate_setting(script, launch, "num_processes")
    machines = accelerate_setting(script, launch, "num_machines")
    number = script.number(found[0]) if found else None
    machine_count = script.number(machines[0]) if machines else 1
    if not number or not machine_count or number % machine_count:
        return None
    if machine_count == 1:
        return number, found[1], f"--num_processes={number}"
    return (number // machine_count, found[1],
            f"--num_processes={number} over --num_machines={machine_count} ({number // machine_count} per machine)")


def accelerate_setting(script: Script, launch: Launch, key: str) -> tuple[str, int] | None:
    """An `accelerate launch` setting: its command-line option, else its --config_file (accelerate 1.15,
    `accelerate launch --help`: options on the command line override the config file). The offset of a
    config file's value is the option --config_file's."""
    found = _option(launch.args, f"--{key}")
    if found:
        return found
    config = _option(launch.args, "--config_file")
    if not config:
        return None
    settings = _read_yaml(config[0], script)
    value = settings.get(key) if isinstance(settings, dict) else None
    return (str(value), config[1]) if isinstance(value, int) else None


def _read_yaml(name: str, script: Script) -> object:
    import yaml  # only for scripts that name an Accelerate config file

    candidates = [Path(name)] + ([Path(script.submit_dir) / name] if script.submit_dir else [])
    for candidate in candidates:
        if "$" not in name and candidate.is_file():
            try:
                return yaml.safe_load(candidate.read_text())
            except (OSError, yaml.YAMLError):
                return None
    return None
