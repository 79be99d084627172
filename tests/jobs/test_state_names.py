"""Job and run state names are typed once, in workshop_lib/jobs/states.py; everything else refers to them."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from workshop_lib.jobs import states

PACKAGE = Path(states.__file__).resolve().parents[1]
HOME = Path(states.__file__).resolve()
# Left out, each for a reason: train/ runs inside jobs and never imports the notebook side (its "FAILED" is
# nccl-tests' own word); book/ is being reorganised by concern (issue 39.7) and moves to these names then.
NOT_CHECKED = (PACKAGE / "train",)
STATE_NAMES = {value for name, value in vars(states).items() if name.isupper() and isinstance(value, str)}


def exported_names(path: Path) -> set[str]:
    """The names a package's face exports (`__all__`): names of attributes, not states, where they look alike."""
    if path.name != "__init__.py":
        return set()
    module = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
    return set(getattr(importlib.import_module(module), "__all__", ()))


def state_literals(source: str, exported: set[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, name) of each string in the source that is exactly a state name."""
    return sorted((node.lineno, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and node.value in STATE_NAMES and node.value not in exported)


def test_the_home_names_the_states_the_code_compares_with():
    assert {"COMPLETED", "FAILED", "PENDING", "RUNNING", "NOT SUBMITTED", "UNKNOWN", "DAMAGED"} <= STATE_NAMES
    assert states.FINAL_STATES.isdisjoint(states.ACTIVE_STATES)
    assert states.JobInfo("7", states.TIMEOUT).finished and not states.JobInfo("7", states.PENDING).finished


def test_no_state_name_is_typed_outside_its_home():
    sources = [path for path in sorted(PACKAGE.rglob("*.py"))
               if path != HOME and not any(path.is_relative_to(folder) for folder in NOT_CHECKED)]
    found = [f"{path.relative_to(PACKAGE.parent)}:{line} {name!r}" for path in sources
             for line, name in state_literals(path.read_text(), exported_names(path))]
    assert not found, ("state names typed outside workshop_lib/jobs/states.py (import them from there): "
                       + "; ".join(found))


def test_the_check_sees_a_typed_state_but_not_an_exported_name_or_a_sentence():
    source = 'def done(info):\n    """Whether it COMPLETED."""\n    return info.state == "COMPLETED"\n' \
             '__all__ = ["MISSING"]\n'
    assert state_literals(source, exported={"MISSING"}) == [(3, "COMPLETED")]
    assert state_literals(source) == [(3, "COMPLETED"), (4, "MISSING")]
