"""The versions of the launchers the workshop's profile installs, for rules that hold only on some versions.

The project's lock (requirements.lock: the versions `make setup`, CI and the Ibex environment install) is the
source; without a checkout (an installed package), the versions installed next to the linter stand in.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import metadata

from workshop_lib.core.paths import SOURCE_ROOT

LOCK_FILE = SOURCE_ROOT / "requirements.lock"
Version = tuple[int, ...]


def parse_version(text: str) -> Version | None:
    """(2, 13, 0) from `2.13.0+cpu`; None when there is no leading number."""
    numbers = re.match(r"(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(part) for part in numbers.group(1).split(".")) if numbers else None


@lru_cache(maxsize=None)
def profile_version(package: str) -> Version | None:
    """The version of ``package`` the profile installs (the lock's pin), else the installed one, else None."""
    if LOCK_FILE.is_file():
        pin = re.search(rf"^{re.escape(package)}==(\S+)", LOCK_FILE.read_text(), re.MULTILINE | re.IGNORECASE)
        if pin:
            return parse_version(pin.group(1))
    try:
        return parse_version(metadata.version(package))
    except metadata.PackageNotFoundError:
        return None


def at_least(package: str, minimum: Version) -> bool:
    """True when the profile's ``package`` is known and at least ``minimum``."""
    version = profile_version(package)
    return version is not None and version >= minimum
