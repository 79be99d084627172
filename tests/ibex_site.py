"""An Ibex-shaped site on this machine, for the setup and rehearsal tests.

What only Ibex has is stood in by shims that record every call (JSON lines in $IBEX_SHIM_LOG):
- `module load X`: recorded; fails for a module the site does not list (SITE_MODULES);
- Miniforge: a local installer (fetched by the real curl from a file:// URL) that lays out
  `bin/conda` and `etc/profile.d/conda.sh`; `conda env create/update` makes the environment, whose
  `python`, `torchrun`, `psrecord` and `workshop` run this checkout with the test's interpreter;
  `conda activate` puts it first on PATH;
- `singularity pull` writes the image; `singularity exec IMAGE ...` refuses a missing image and stands
  in for NeMo with the tiny engines (`nemo llm finetune` -> the LoRA / tensor-parallel engine of the
  experiment, `nemo llm import` (into its output_path) and SquadDataModule -> the files they would write).
Python processes of the jobs run with the network blocked (a sitecustomize that refuses any
connection or name lookup beyond this host, and records the attempt).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from workshop_lib.sites.nemo_checkpoint import COMPLETE_FILES
from workshop_lib.sites.profiles import PROFILES_DIR

ROOT = Path(__file__).resolve().parents[1]
# Module names the stand-in site provides: the ibex profile's own (book/ibex_setup.md lists them as site facts).
SITE_MODULES = ("cuda/12.4.1", "singularity")

_RECORD = """
import json, os, sys
def record(program, argv, **extra):
    with open(os.environ["IBEX_SHIM_LOG"], "a") as log:
        log.write(json.dumps({"program": program, "argv": argv, "cwd": os.getcwd(),
                              "job": os.environ.get("SLURM_JOB_ID"), **extra}) + "\\n")
"""

MODULE = """
record("module", sys.argv[1:])
if sys.argv[1:2] == ["load"] and any(name not in {modules!r} for name in sys.argv[2:]):
    sys.exit("Lmod has detected the following error: The following module(s) are unknown: " + " ".join(sys.argv[2:]))
"""

SINGULARITY = """
import subprocess
from pathlib import Path
words = sys.argv[1:]
if words[0] == "pull":
    destination, source = words[1], words[2]
    record("singularity", words)
    if os.environ.get("IBEX_SHIM_FAIL") == "pull":  # a pull cut short (network, quota): nothing finished
        Path(destination).write_text("half an image")
        sys.exit("FATAL:   While making image from oci registry: error fetching image: connection reset")
    Path(destination).write_text("stand-in image of " + source + "\\n")
    sys.exit(0)
assert words[0] == "exec", words
words = words[1:]
while words[0].startswith("--"):
    words = words[2:] if words[0] == "--bind" else words[1:]
image, command = words[0], words[1:]
record("singularity", sys.argv[1:], image=image)
if not Path(image).is_file():
    sys.exit(f"FATAL:   could not open image {{image}}: failed to retrieve path for {{image}}: no such file")
if command[:3] == ["nemo", "llm", "import"]:
    source = next(word for word in command if word.startswith("source=hf://"))[len("source=hf://"):]
    output = next((word.split("=", 1)[1] for word in command if word.startswith("output_path=")), None)
    target = Path(output) if output else Path(os.environ["NEMO_HOME"]) / "models" / source
    if target.exists():  # as NeMo: an existing folder is left alone, complete or not
        sys.exit(0)
    for name in {complete_files!r}:  # the files the job checks before renaming the folder into place
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_text("stand-in checkpoint\\n")
elif command[:2] == ["python", "-c"] and "SquadDataModule" in command[2]:
    target = Path(os.environ["NEMO_DATASETS_CACHE"]) / "squad"
    target.mkdir(parents=True, exist_ok=True)
    (target / "training.jsonl").write_text("{{}}\\n")
elif command[:3] == ["nemo", "llm", "finetune"]:
    # Lightning runs one rank per task; the stand-in trains once, on the first task.
    if os.environ.get("SLURM_PROCID", "0") != "0":
        sys.exit(0)
    from workshop_lib.experiments import all_experiments
    from workshop_lib.sites.profiles import load_profile
    from workshop_lib.scripts import training_arguments
    experiment = next(e for e in all_experiments() if e.job_name == os.environ["SLURM_JOB_NAME"])
    arguments = training_arguments(experiment, load_profile("tiny"))
    processes = experiment.tensor_parallel * (experiment.expert_parallel or 1) if experiment.peft != "lora" else 1
    sys.exit(subprocess.call(["torchrun", "--standalone", f"--nproc_per_node={{processes}}", *arguments]))
else:
    sys.exit(f"singularity stand-in: nothing stands in for {{command}}")
"""

# What a Miniforge installer does, as far as the workshop can tell: bin/conda and conda.sh.
# srun where no cluster runs (tests/sites/test_setup.py): records its options, runs the command on "the node" here.
SRUN = """
record("srun", sys.argv[1:])
words = sys.argv[1:]
while words and words[0].startswith("-"):
    words = words[1:]
os.environ["SLURM_JOB_ID"] = "4242"
os.execvp(words[0], words)
"""

INSTALLER = """#!/bin/bash
# stand-in Miniforge installer: -b -u -p PREFIX
set -euo pipefail
while [ $# -gt 0 ]; do case "$1" in -p) prefix=$2; shift 2 ;; *) shift ;; esac; done
mkdir -p "$prefix/bin" "$prefix/etc/profile.d" "$prefix/envs"
cp "{conda}" "$prefix/bin/conda"
cat > "$prefix/etc/profile.d/conda.sh" <<EOF
conda() {{
    "$prefix/bin/conda" "\\$@"
    if [ "\\$1" = activate ]; then PATH="$prefix/envs/\\$2/bin:\\$PATH"; export CONDA_DEFAULT_ENV="\\$2"; fi
}}
EOF
"""

CONDA = """
from pathlib import Path
prefix = Path(__file__).resolve().parent.parent
words = sys.argv[1:]
record("conda", words)
if words[:1] == ["activate"]:
    if not (prefix / "envs" / words[1]).is_dir():
        sys.exit(f"EnvironmentNameNotFound: Could not find conda environment: {{words[1]}}")
    sys.exit(0)
if words[:2] in (["env", "create"], ["env", "update"]):
    name = words[words.index("-n") + 1]
    bin_dir = prefix / "envs" / name / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for program, target in {programs!r}.items():
        (bin_dir / program).write_text(target)
        (bin_dir / program).chmod(0o755)
    sys.exit(0)
sys.exit(f"conda stand-in: nothing stands in for {{words}}")
"""

# The environment's programs: this checkout with the test's interpreter. The torch check runs for real
# against the lock, without the CUDA 12 demand this CPU-only machine cannot meet; the hub download (no
# network here) stands in by laying out the cache folders and recording what it was asked for.
ENV_PYTHON = """#!/bin/bash
if [ "$1 $2 $3" = "-m workshop_lib.site_check torch" ]; then set -- "$@" --cuda-major ''; fi
if [ "$1 $2 $3" = "-m workshop_lib.site_check download" ]; then
    printf '{{"program": "hub-download", "argv": "%s"}}\\n' "${{*:4}}" >> "$IBEX_SHIM_LOG"
    shift 3
    while [ $# -gt 1 ]; do
        if [ "$1" = --model ]; then mkdir -p "$HF_HOME/hub/models--${{2//\\//--}}/snapshots"; fi
        shift 2
    done
    exit 0
fi
exec {python} "$@"
"""

SITECUSTOMIZE = """
# Network blocked for the job processes: any connection or lookup beyond this host is refused and recorded.
import json, os, socket
_LOCAL = ("127.", "::1", "localhost", "0.0.0.0")
def _refuse(what):
    with open(os.environ["IBEX_NETWORK_LOG"], "a") as log:
        log.write(json.dumps({"pid": os.getpid(), "job": os.environ.get("SLURM_JOB_ID"), "target": str(what)}) + "\\n")
    raise OSError(f"network blocked in this rehearsal: {what}")
def _is_local(host):
    return host in (None, "", socket.gethostname()) or str(host).startswith(_LOCAL)
_connect, _getaddrinfo = socket.socket.connect, socket.getaddrinfo
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
        _refuse(address)
    return _connect(self, address)
def getaddrinfo(host, *args, **kwargs):
    if not _is_local(host):
        _refuse(host)
    return _getaddrinfo(host, *args, **kwargs)
socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo
"""


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


class IbexSite:
    """Shims, a stand-in Miniforge installer and an Ibex-shaped profile under `root`."""

    def __init__(self, root: Path, real_srun: bool = False):
        self.root = root
        self.shims = root / "shims"
        self.shims.mkdir(parents=True)
        if not real_srun:  # with the local cluster running, the setup's srun is the real one
            _executable(self.shims / "srun", f"#!{sys.executable}\n" + _RECORD + SRUN)
        self.log = root / "shim_calls.jsonl"
        self.network_log = root / "network_attempts.jsonl"
        self.netblock = root / "netblock"
        self.netblock.mkdir()
        (self.netblock / "sitecustomize.py").write_text(SITECUSTOMIZE)
        header = f"#!{sys.executable}\n"
        _executable(self.shims / "module", header + _RECORD + MODULE.format(modules=SITE_MODULES))
        _executable(self.shims / "singularity", header + _RECORD + SINGULARITY.format(complete_files=COMPLETE_FILES))
        env_programs = {
            "python": ENV_PYTHON.format(python=sys.executable),
            **{name: f"#!/bin/bash\nexec {Path(sys.executable).parent / name} \"$@\"\n"
               for name in ("torchrun", "psrecord", "workshop")},
        }
        conda = _executable(root / "conda-standin", header + _RECORD + CONDA.format(programs=env_programs))
        self.installer = _executable(root / "Miniforge3-standin.sh", INSTALLER.format(conda=conda))
        self.profile_path = self._write_profile()

    def _write_profile(self) -> Path:
        """ibex.yml with its paths under root and what only Ibex has replaced (each change says why)."""
        data = yaml.safe_load((PROFILES_DIR / "ibex.yml").read_text())
        tiny = yaml.safe_load((PROFILES_DIR / "tiny.yml").read_text())
        storage = f"{self.root}/ibex/user/$USER/dist-ft-workshop"
        data["name"] = "ibex-rehearsal"
        data["cache_root"] = f"{storage}/cache"
        data["python"]["conda_root"] = f"{storage}/miniforge3"
        data["nemo"]["image"] = f"{storage}/images/nemo_25.07.sif"
        data["nemo"]["binds"] = [storage]
        data["scheduler"]["time_limits"] = tiny["scheduler"]["time_limits"]
        data["training"] = tiny["training"]  # tiny models and synthetic data: this machine has 2 cores
        data["has_nvidia_smi"] = False  # no GPU here
        data["rendezvous_host"] = "127.0.0.1"  # the local "nodes" share one address and node1 does not resolve
        data["bandwidth_check"].update(size_mb=4, iterations=3, min_bus_bandwidth_gbps=0)  # gloo over loopback
        data["limits"] = tiny["limits"]
        path = self.root / "ibex-rehearsal.yml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def environment(self, base: dict) -> dict:
        """The submitting shell's environment: shims first, the network blocked for Python processes."""
        return {**base, "PATH": f"{self.shims}:{base['PATH']}", "IBEX_SHIM_LOG": str(self.log),
                "IBEX_NETWORK_LOG": str(self.network_log),
                "PYTHONPATH": f"{self.netblock}:{ROOT}", "HF_TOKEN": "stand-in-token-never-used",
                "USER": base.get("USER") or "root",
                "JUPYTER_DATA_DIR": str(self.root / "jupyter")}  # the kernel spec stays out of this $HOME

    def calls(self, program: str | None = None) -> list[dict]:
        if not self.log.exists():
            return []
        calls = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [call for call in calls if program is None or call["program"] == program]

    def network_attempts(self) -> list[dict]:
        if not self.network_log.exists():
            return []
        return [json.loads(line) for line in self.network_log.read_text().splitlines()]


# The steps `workshop setup` runs on a login node (the import jobs need a cluster: tests/sites/test_ibex_rehearsal.py).
LOCAL_STEPS = ["folders", "miniforge", "environment", "hub-download", "nemo-image", "nemo-data"]


def run_setup(site: IbexSite, *arguments, extra_env=None, only=LOCAL_STEPS) -> subprocess.CompletedProcess:
    """`workshop setup` on the stand-in site, as a participant's shell runs it."""
    command = [sys.executable, "-m", "workshop_lib.cli", "setup", str(site.profile_path),
               "--miniforge-installer", f"file://{site.installer}", *arguments]
    for step in only or []:
        command += ["--only", step]
    env = {**site.environment(dict(os.environ)), **(extra_env or {})}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


_SET_UP: dict[str, tuple[IbexSite, subprocess.CompletedProcess]] = {}


def site_after_setup(tmp_path_factory) -> tuple[IbexSite, subprocess.CompletedProcess]:
    """A stand-in site on which the local steps ran once, and that first run: shared by the tests that only read
    what the setup left (the environment step alone costs seconds of CPU: it imports torch to check the lock).
    Whoever uses it must not change it."""
    if "site" not in _SET_UP:
        site = IbexSite(tmp_path_factory.mktemp("ibex-set-up"))
        _SET_UP["site"] = (site, run_setup(site))
    return _SET_UP["site"]
