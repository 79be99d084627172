"""One lock (requirements.lock) for `make setup`, CI and environment.yml: what CI tests is what Ibex runs."""

from __future__ import annotations

import re
import sys
from importlib import metadata

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from repo_paths import REPO

from workshop_lib.sites import site_check

ROOT = REPO
LOCK = ROOT / "requirements.lock"


def _locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line)
            assert match, f"requirements.lock: {line!r} is not name==version"
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def test_this_environment_is_the_lock():
    """CI installs with -c requirements.lock: every locked package is here at exactly its version."""
    wrong = {}
    for name, version in _locked().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong[name] = (version, "not installed")
            continue
        if Version(installed).public != Version(version).public:
            wrong[name] = (version, installed)
    assert wrong == {}, "installed versions differ from requirements.lock (run `make setup` again)"


def test_every_declared_dependency_is_locked_inside_its_declared_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in ("train", "book", "test"):
        declared += project["optional-dependencies"][extra]
    pins = _locked()
    for text in declared:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is declared in pyproject.toml but not locked"
        assert requirement.specifier.contains(Version(pins[name]), prereleases=True), \
            f"locked {name}=={pins[name]} is outside pyproject.toml's {requirement}"


def test_tested_versions_are_the_lower_bounds_of_the_engines():
    # transformers 5.17 breaks the tensor-parallel engine (DistributedConfig has no ep_size): an install
    # without the lock must not be able to pick a version older than the tested one.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _locked()
    for text in project["optional-dependencies"]["train"]:
        requirement = Requirement(text)
        if requirement.name == "psrecord":
            continue
        tested = Version(pins[canonicalize_name(requirement.name)])
        assert not requirement.specifier.contains(Version(f"{tested.major}.{tested.minor - 1}"
                                                          if tested.minor else f"{tested.major - 1}.99")), text


def test_environment_yml_installs_the_locked_torch_built_for_cuda_12():
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = next(item for item in environment["dependencies"] if isinstance(item, str) and item.startswith("python="))
    assert python == f"python={sys.version_info.major}.{sys.version_info.minor}"  # the lock's interpreter
    pip = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    assert "-c requirements.lock" in pip
    torch_pin = next(line for line in pip if line.startswith("torch=="))
    version, label = torch_pin.removeprefix("torch==").split("+")
    assert version == _locked()["torch"] == site_check.locked_version(LOCK, "torch")
    assert re.fullmatch(r"cu12\d", label), "the A100 nodes run a CUDA 12 driver"
    assert f"--extra-index-url https://download.pytorch.org/whl/{label}" in pip
    # The CPU wheel CI tests is the same torch release.
    import torch

    assert torch.__version__.split("+")[0] == version


def test_make_setup_installs_from_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    assert "-c requirements.lock" in makefile and "$(STAMP): pyproject.toml requirements.lock" in makefile
    assert not (ROOT / "constraints.txt").exists()  # one lock, not two files that drift apart


def test_torch_check_accepts_the_locked_cpu_build_and_refuses_it_for_cuda_12(capsys):
    assert "as locked in" in site_check.check_torch(LOCK, cuda_major=None)
    with pytest.raises(SystemExit, match=r"built for CUDA none \(CPU only\), but the A100 nodes run a CUDA 12"):
        site_check.check_torch(LOCK, cuda_major="12")


def test_torch_check_refuses_a_version_the_lock_does_not_name(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("torch==2.99.0\n")
    with pytest.raises(SystemExit, match="pins 2.99.0: the environment was not built from the lock"):
        site_check.check_torch(lock, cuda_major=None)
