"""Where the class pools its results: the one rule for the class folder's place.

$WORKSHOP_CLASS_DIR when set, else `class/` inside the class's staged folder ($WORKSHOP_SHARED_ROOT or the
profile's shared_root), else none: a participant working alone has no class folder and the chapters' class cells
say so and do nothing. The instructor makes the folder once (`workshop class init`); workshop_lib.results.class_pool
says what it holds and who may write where.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from workshop_lib.sites.profiles import Profile, ProfileError, shared_root_of

CLASS_DIR_VARIABLE = "WORKSHOP_CLASS_DIR"
CLASS_SUBFOLDER = "class"  # inside the staged folder
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


class ClassFolder(NamedTuple):
    path: Path
    origin: str  # where it was set, in words a participant can act on


def class_folder_of(profile: Profile, environ: dict | None = None) -> ClassFolder | None:
    """The class folder, or None where the class has none (no $WORKSHOP_CLASS_DIR, no staged folder)."""
    environ = os.environ if environ is None else environ
    value = environ.get(CLASS_DIR_VARIABLE, "").strip()
    if value:
        origin = f"${CLASS_DIR_VARIABLE}"
    else:
        staged = shared_root_of(profile, environ)
        if staged is None:
            return None
        value, origin = f"{staged[0]}/{CLASS_SUBFOLDER}", f"{CLASS_SUBFOLDER}/ in the staged folder ({staged[1]})"
    # The staged folder is a shell path ($USER may appear in it): expand what the environment defines.
    unset = [a or b for a, b in _VARIABLE.findall(value) if (a or b) not in environ]
    if unset:
        raise ProfileError(f"the class folder {value!r} (from {origin}) names ${unset[0]}, which is not set here: "
                           f"export {CLASS_DIR_VARIABLE}=/absolute/folder the instructor announced")
    expanded = _VARIABLE.sub(lambda match: environ[match.group(1) or match.group(2)], value)
    if not expanded.startswith("/") or "\x00" in expanded:
        raise ProfileError(f"the class folder {expanded!r} (from {origin}) is not an absolute path: export "
                           f"{CLASS_DIR_VARIABLE}=/absolute/folder the instructor announced, e.g. "
                           "/ibex/project/c1234/dist-ft-workshop/class")
    return ClassFolder(Path(expanded.rstrip("/") or "/"), origin)
