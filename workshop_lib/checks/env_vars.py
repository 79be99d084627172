"""`workshop check DIR`: the checks that need a whole folder of job files.

The seeds' FSDP jobs pass their settings through an `env_vars.sh` that the job script sources and
the Python it runs reads with `os.getenv`. A name exported under one spelling and read under another
(`BATCH_SIZE` vs `PER_DEVICE_BATCH_SIZE`) fails silently: the run uses the Python default, and
editing env_vars.sh changes nothing. This module compares the two sides, per folder."""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.checks.findings import ERROR, Finding
from workshop_lib.checks.lint import lint_file
from workshop_lib.checks.sbatch import read_header
from workshop_lib.checks.script import NotAJobScript

SCRIPT_SUFFIXES = (".slurm", ".sbatch", ".sh")
_SOURCE = re.compile(r"^\s*(?:source|\.)\s+[\"']?([\w./-]+\.sh)[\"']?", re.MULTILINE)
_EXPORT = re.compile(r"^\s*export\s+([A-Za-z_]\w*)=(.*)$")
_PYTHON_FILE = re.compile(r"(?<![\w/.-])([\w./-]+\.py)\b")
_SHELL_READ = re.compile(r"\$\{?([A-Za-z_]\w*)")


@dataclass(frozen=True)
class EnvRead:
    """One `os.getenv("NAME", default)` (or `os.environ[...]`) in a Python file."""

    name: str
    path: Path
    line: int
    default: str | None  # the default as written, None when there is none


@dataclass(frozen=True)
class EnvComparison:
    """What a folder's env files export and what its Python reads, compared name by name."""

    folder: Path
    env_files: list[Path]
    python_files: list[Path]
    exported: dict[str, tuple[Path, int, str]] = field(default_factory=dict)  # name -> (file, line, value)
    reads: list[EnvRead] = field(default_factory=list)
    mismatches: list[tuple[EnvRead, str]] = field(default_factory=list)  # (read, the exported name meant)

    @property
    def matched(self) -> list[str]:
        return sorted({read.name for read in self.reads} & set(self.exported))

    def summary(self, root: Path | None = None) -> str:
        where = self.folder
        if root is not None and self.folder != root and self.folder.is_relative_to(root):
            where = self.folder.relative_to(root)
        env = ", ".join(path.name for path in self.env_files)
        python = ", ".join(path.name for path in self.python_files)
        count = len(self.mismatches)
        verdict = "all agree" if not count else ("1 differs" if count == 1 else f"{count} differ")
        return (f"{where}/: {env} exports {len(self.exported)} names, {python} reads "
                f"{len({read.name for read in self.reads})}; {len(self.matched)} match, {verdict}")


def python_env_reads(path: Path) -> list[EnvRead]:
    """The environment variables a Python file reads by a literal name."""
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except SyntaxError:
        return []
    reads = []
    for node in ast.walk(tree):
        name_node, default = None, None
        if isinstance(node, ast.Call) and node.args and _is_env_getter(node.func):
            name_node = node.args[0]
            if len(node.args) > 1:
                default = ast.unparse(node.args[1])
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            name_node = node.slice
        if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str):
            reads.append(EnvRead(name_node.value, path, node.lineno, default))
    return reads


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
        (isinstance(node, ast.Name) and node.id == "environ")


def _is_env_getter(func: ast.AST) -> bool:
    """os.getenv(...), getenv(...), os.environ.get(...), environ.get(...)."""
    if isinstance(func, ast.Name):
        return func.id == "getenv"
    if isinstance(func, ast.Attribute):
        return func.attr == "getenv" or (func.attr == "get" and _is_environ(func.value))
    return False


def shell_exports(path: Path) -> dict[str, tuple[Path, int, str]]:
    exports = {}
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if match := _EXPORT.match(line):
            exports[match.group(1)] = (path, number, match.group(2).split(" #")[0].strip())
    return exports


def _meant(name: str, unread_exports: list[str]) -> str | None:
    """The unread exported name that a read name most likely is (one is the other plus words, or a near spelling)."""
    words = set(name.split("_"))
    contained = [other for other in unread_exports
                 if set(other.split("_")) <= words or words <= set(other.split("_"))]
    if len(contained) == 1:
        return contained[0]
    close = difflib.get_close_matches(name, unread_exports, n=1, cutoff=0.75)
    return close[0] if close else None


def compare_folder(folder: Path) -> EnvComparison | None:
    """Compare the env files the folder's job scripts source with what the Python they run reads;
    None when no script in the folder sources an env file."""
    scripts = [path for path in sorted(folder.iterdir()) if path.suffix in SCRIPT_SUFFIXES and path.is_file()]
    env_files, python_files, script_texts = [], [], []
    for script in scripts:
        text = script.read_text(errors="replace")
        script_texts.append(text)
        env_files += [folder / name for name in _SOURCE.findall(text) if (folder / name).is_file()]
        python_files += [folder / name for name in _PYTHON_FILE.findall(text) if (folder / name).is_file()]
    env_files, python_files = sorted(set(env_files)), sorted(set(python_files))
    if not env_files or not python_files:
        return None
    exported: dict[str, tuple[Path, int, str]] = {}
    for env_file in env_files:
        exported.update(shell_exports(env_file))
    reads = [read for path in python_files for read in python_env_reads(path)]
    job_scripts = [text for script, text in zip(scripts, script_texts) if script not in env_files]
    set_by_scripts = {name for text in job_scripts for name in re.findall(r"^\s*export\s+([A-Za-z_]\w*)=", text, re.M)}
    used_by_scripts = {name for text in job_scripts for name in _SHELL_READ.findall(text)}
    read_names = {read.name for read in reads}
    unread = sorted(name for name in exported if name not in read_names and name not in used_by_scripts)
    mismatches = []
    for read in reads:
        if read.name in exported or read.name in set_by_scripts:
            continue
        meant = _meant(read.name, unread)
        if meant:
            mismatches.append((read, meant))
    return EnvComparison(folder, env_files, python_files, exported, reads, mismatches)


def mismatch_findings(comparison: EnvComparison) -> list[tuple[Path, Finding]]:
    """One error per name the Python reads under a spelling the env file does not export."""
    findings = []
    for read, meant in comparison.mismatches:
        env_file, line, value = comparison.exported[meant]
        default = f" (default {read.default})" if read.default is not None else ""
        findings.append((read.path, Finding(
            "env-var-mismatch", ERROR,
            f"{read.path.name} reads {read.name}{default}, which {env_file.name} does not export; "
            f"{env_file.name}:{line} exports {meant}={value}, which nothing reads. The setting has no effect: "
            "the run uses the Python default.",
            f"use one name on both sides: export {read.name} in {env_file.name}, or read {meant} in "
            f"{read.path.name}.", read.line)))
    return findings


def job_scripts_in(folder: Path) -> list[Path]:
    """Every sbatch script under a folder (a `.sh` counts when it has #SBATCH lines)."""
    found = []
    for path in sorted(folder.rglob("*")):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue  # .git, .venv, caches: nobody's job scripts
        if path.is_file() and path.suffix in SCRIPT_SUFFIXES:
            if path.suffix != ".sh" or "#SBATCH" in path.read_text(errors="replace"):
                found.append(path)
    return found


def job_name_findings(scripts: list[Path]) -> dict[Path, list[Finding]]:
    """One error per script whose --job-name another script of the same folder also uses."""
    by_name: dict[tuple[Path, str], list[tuple[Path, int | None]]] = {}
    for script in scripts:
        header = read_header(script.read_text(errors="replace"))
        if header.get("job-name"):
            by_name.setdefault((script.parent, header.get("job-name")), []).append((script, header.line("job-name")))
    findings: dict[Path, list[Finding]] = {}
    for (_, name), users in by_name.items():
        if len(users) < 2:
            continue
        for script, line in users:
            others = ", ".join(other.name for other, _ in users if other != script)
            findings.setdefault(script, []).append(Finding(
                "job-name-reused", ERROR,
                f"--job-name={name} is also the job name of {others} in this folder: squeue, sacct and "
                "`scancel --name` cannot tell these jobs apart, and --dependency=singleton makes them wait for "
                "each other.",
                f"give each script its own name (e.g. --job-name={script.stem}, or drop --job-name: SLURM then "
                "uses the script's file name).", line))
    return findings


def check_folder(root: Path) -> tuple[list[tuple[Path, list[Finding]]], list[EnvComparison]]:
    """Lint every job script under `root`, compare each folder's env file with its Python, and report job
    names reused inside a folder. A file that is not a job script is one error of its own."""
    scripts = job_scripts_in(root)
    results, readable = [], []
    for script in scripts:
        try:
            results.append((script, lint_file(script)))
            readable.append(script)
        except NotAJobScript as refused:
            results.append((script, [Finding("not-a-job-script", ERROR, str(refused).split(": ", 1)[-1] + ".",
                                             "keep only sbatch scripts under the .slurm/.sbatch names.", None)]))
    for script, findings in job_name_findings(readable).items():
        next(found for path, found in results if path == script).extend(findings)
    comparisons = [comparison for folder in sorted({script.parent for script in scripts})
                   if (comparison := compare_folder(folder)) is not None]
    by_file: dict[Path, list[Finding]] = {}
    for comparison in comparisons:
        for path, finding in mismatch_findings(comparison):
            by_file.setdefault(path, []).append(finding)
    return results + sorted(by_file.items()), comparisons
