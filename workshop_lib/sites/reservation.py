"""The workshop's reservation: one name that every job carries as `#SBATCH --reservation=NAME`.

It comes from the profile's `scheduler.reservation`, and $WORKSHOP_RESERVATION overrides it, so that on
the day a class exports one variable instead of copying the profile. Both pass the same rule: the name
reaches the scripts bare on an #SBATCH line, so anything else is refused, never escaped.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import NamedTuple

from workshop_lib.core.errors import WorkshopError
from workshop_lib.sites.profiles import Profile
from workshop_lib.sites.schema import RESERVATION

RESERVATION_VARIABLE = "WORKSHOP_RESERVATION"
LIST_COMMAND = "scontrol show reservation"


class ReservationError(WorkshopError):
    """The reservation name is not one SLURM could hold; the message says where it came from."""


class Reservation(NamedTuple):
    name: str
    origin: str  # where the name was set, in words a participant can act on


def find_reservation(profile: Profile, environ: dict | None = None) -> Reservation | None:
    """$WORKSHOP_RESERVATION when set and not empty, else the profile's scheduler.reservation, else None."""
    environ = os.environ if environ is None else environ
    value = environ.get(RESERVATION_VARIABLE, "").strip()
    if value:
        origin = f"${RESERVATION_VARIABLE}"
        fix = (f"export {RESERVATION_VARIABLE}=NAME with a name it lists, or unset it to use the profile's "
               "scheduler.reservation")
    elif profile.scheduler.reservation:
        # Checked again here: a Profile built in code never passed the schema.
        value, origin = profile.scheduler.reservation, f"scheduler.reservation of profile {profile.name!r}"
        fix = "set scheduler.reservation in the profile to a name it lists"
    else:
        return None
    if not re.fullmatch(RESERVATION.pattern, value):
        raise ReservationError(f"{origin} is {value!r}, which is not {RESERVATION.expected}. "
                               f"`{LIST_COMMAND}` lists the reservations you may use; {fix}")
    return Reservation(value, origin)


def reservation_for(profile: Profile, environ: dict | None = None) -> str | None:
    """The reservation name every job of this profile carries, or None."""
    found = find_reservation(profile, environ)
    return found.name if found else None


def describe_reservation(profile: Profile, environ: dict | None = None) -> str:
    """One line for people: which reservation jobs will carry and where that name was set."""
    found = find_reservation(profile, environ)
    if found is None:
        return (f"jobs carry no reservation (on the workshop day: export {RESERVATION_VARIABLE}=NAME with the "
                f"name the instructor announced; `{LIST_COMMAND} NAME` shows it)")
    return f"jobs carry --reservation={found.name} (set by {found.origin})"


def start_if_not_started(name: str) -> str | None:
    """The StartTime of reservation NAME when SLURM holds it and it has not started yet; else None (it has started,
    SLURM does not know the name, or there is no SLURM to ask: jobs then meet what SLURM says)."""
    try:
        shown = subprocess.run(["scontrol", "--oneliner", "show", "reservation", name], capture_output=True,
                               text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(word.split("=", 1) for word in shown.stdout.split() if "=" in word)
    if shown.returncode != 0 or fields.get("State") != "INACTIVE":
        return None
    return fields.get("StartTime", "a later time")
