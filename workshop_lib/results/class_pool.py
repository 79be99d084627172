"""The class pool: each participant publishes their completed runs' rows into their own folder of the class
folder, and every participant's tables read everyone's.

The layout makes the operating system, not this code, keep each participant's results their own:

    <class folder>/                  the instructor's, group = the class's group, mode 3770 (`prepare_class_folder`):
                                     group members may add entries; the sticky bit (1000) lets only an entry's
                                     owner rename or delete it; setgid (2000) gives every entry the class's group
        <user>/                      <user>'s, mode 2750: the group reads it, nobody else writes in it
            chapter<N>.<profile>.json    mode 0640, replaced whole (a temporary file renamed over it)

Only rows are published (the numbers the tables read, `pool_rows`), never checkpoints or logs: a chapter's file
is a few kilobytes. The pool is input from other people, so `read_pool` trusts nothing in it: a folder must be
a real folder owned by the user it is named after, a file a regular file of at most MAX_FILE_BYTES, not a link,
whose JSON names its owner, chapter and profile and whose rows pass `pool_rows.row_problem`. Anything else is
one line in `Pool.problems` (the file and what is wrong) and that file is skipped; the others fill the tables.
"""

from __future__ import annotations

import datetime
import errno
import grp
import json
import os
import pwd
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import Experiment
from workshop_lib.jobs.states import COMPLETED
from workshop_lib.results.pool_rows import publishable_row, result_of, row_problem
from workshop_lib.results.read import RunResult, read_run
from workshop_lib.runs import load_run, records_this_experiment

FORMAT = 1
FILE_KEYS = ("format", "user", "chapter", "profile", "published_at", "rows")
MAX_FILE_BYTES = 1 << 20  # a chapter's rows take a few kilobytes; more is not a chapter's rows
CLASS_FOLDER_MODE = 0o3770  # sticky + setgid + rwx for the instructor and the group
USER_FOLDER_MODE = 0o2750  # setgid + the owner writes, the group reads
FILE_MODE = 0o640
PROFILE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # as the profile schema's `name`
INIT_HINT = "the instructor makes it with `workshop class init FOLDER --group GROUP` (GROUP: the class's Unix group)"


class PoolError(WorkshopError):
    """The class folder is missing or not laid out for sharing; the message says who fixes it and how."""


@dataclass(frozen=True)
class PooledRun:
    user: str
    experiment: Experiment
    result: RunResult


@dataclass(frozen=True)
class Pool:
    """What the class folder held for one chapter on one profile: the runs that passed every check, one line
    per file that did not (and was skipped), and who published."""

    folder: Path
    runs: tuple[PooledRun, ...]
    problems: tuple[str, ...]
    users: tuple[str, ...]  # whose files were read, in name order


def pool_file_name(chapter: int, profile_name: str) -> str:
    if not PROFILE_NAME.fullmatch(profile_name):
        raise PoolError(f"profile name {profile_name!r} cannot name a class file: use a profile whose name has "
                        "letters, digits, _ . - only")
    return f"chapter{int(chapter)}.{profile_name}.json"


def current_user() -> str:
    """Who this process runs as, from the user database (never $USER, which anyone may set)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


# ---- the instructor -------------------------------------------------------------------------------------
def prepare_class_folder(folder: Path | str, group: str | None = None) -> Path:
    """Make the class folder (or fix an existing one of yours): the class's group, mode 3770."""
    folder = Path(folder)
    gid = -1
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise PoolError(f"there is no group {group!r} on this machine: name the class's Unix group (`id` lists "
                            "yours; on Ibex the project's group, e.g. the one owning /ibex/project/<id>)") from None
    folder.mkdir(parents=True, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise PoolError(f"{folder} is not a folder: give a folder path for the class folder")
    try:
        os.chown(folder, -1, gid)
        os.chmod(folder, CLASS_FOLDER_MODE)
    except PermissionError:
        raise PoolError(f"you ({current_user()}) may not give {folder} to group {group!r} or change its mode: make "
                        "the class folder as its owner, in a group you belong to (`id` lists yours)") from None
    return folder


def class_folder_problem(folder: Path) -> str | None:
    """Why participants could not share `folder` safely, or None: it must be a folder with the sticky and setgid
    bits and a group that may write in it. (Its place is the instructor's to choose: a link to it is followed.)"""
    try:
        info = folder.stat()
    except FileNotFoundError:
        return f"the class folder {folder} does not exist: {INIT_HINT}"
    if not stat.S_ISDIR(info.st_mode):
        return f"the class folder {folder} is not a folder: {INIT_HINT}"
    mode = stat.S_IMODE(info.st_mode)
    missing = [word for bit, word in ((stat.S_ISVTX, "sticky bit"), (stat.S_ISGID, "setgid bit"),
                                       (stat.S_IWGRP | stat.S_IXGRP, "group write")) if mode & bit != bit]
    if missing:
        return (f"the class folder {folder} has mode {mode:o}, without the {', '.join(missing)} (it needs "
                f"{CLASS_FOLDER_MODE:o}, so that nobody can replace or delete another's results): {INIT_HINT}, "
                f"or its owner runs `chmod {CLASS_FOLDER_MODE:o} {folder}`")
    if mode & stat.S_IWOTH:
        return (f"the class folder {folder} is writable by every user (mode {mode:o}): its owner runs "
                f"`chmod {CLASS_FOLDER_MODE:o} {folder}`")
    return None


# ---- a participant publishes ------------------------------------------------------------------------------
def published_rows(experiments: Iterable[Experiment], profile, runs_dir: Path) -> list[dict]:
    """The rows of the experiments' runs that completed on this profile (the same experiment, by content hash)."""
    rows = []
    for experiment in experiments:
        run = load_run(experiment, runs_dir)
        record = run.record
        if (record is None or record.final_state != COMPLETED
                or not records_this_experiment(record, experiment, profile)):
            continue
        result = read_run(run.directory, experiment.id)
        if result.state == COMPLETED:
            rows.append(publishable_row(experiment, result))
    return rows


def publish(folder: Path, chapter: int, profile_name: str, rows: Sequence[dict]) -> Path:
    """Write the rows as this user's file for the chapter and profile, replacing the previous one whole."""
    problem = class_folder_problem(folder)
    if problem:
        raise PoolError(problem)
    user = current_user()
    own = folder / user
    try:
        own.mkdir(mode=0o700)  # opened to the group below, once it is surely ours
    except FileExistsError:
        pass
    except PermissionError:
        raise PoolError(f"you ({user}) may not add a folder to the class folder {folder}: you are not in its group "
                        f"({_group_name(folder.stat().st_gid)}); ask the instructor to add you, then log in again"
                        ) from None
    info = own.lstat()
    if stat.S_ISLNK(info.st_mode) and info.st_uid == os.geteuid():
        raise PoolError(f"{own} is a link, not a folder, so readers would skip it: remove it (`rm {own}`) and "
                        "publish again")
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        owner = _user_name(info.st_uid)
        raise PoolError(f"{own} belongs to {owner}, not to you ({user}), so you cannot publish there: ask the "
                        f"instructor to remove it (`rm -r {own}` as its owner or root), then publish again")
    os.chmod(own, USER_FOLDER_MODE)
    document = {"format": FORMAT, "user": user, "chapter": int(chapter), "profile": profile_name,
                "published_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "rows": list(rows)}
    text = json.dumps(document, indent=1, allow_nan=False)
    if len(text.encode()) > MAX_FILE_BYTES:
        raise PoolError(f"chapter {chapter}'s rows take {len(text.encode())} bytes, more than a reader accepts "
                        f"({MAX_FILE_BYTES}): this is a bug in the workshop, please report it")
    target = own / pool_file_name(chapter, profile_name)
    descriptor, temporary = tempfile.mkstemp(dir=own, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)  # whatever the umask: the group reads it
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)  # readers see the old file or the new one, never half of one
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


# ---- everyone reads ----------------------------------------------------------------------------------------
def read_pool(folder: Path, chapter: int, profile_name: str, experiments: Sequence[Experiment]) -> Pool:
    """Every participant's runs of `experiments` (a chapter on one profile) that pass every check; one line
    in `problems` per skipped file or folder."""
    folder = Path(folder)
    problem = class_folder_problem(folder)
    if problem and not folder.is_dir():
        raise PoolError(problem)
    by_id = {experiment.id: experiment for experiment in experiments}
    name = pool_file_name(chapter, profile_name)
    runs: list[PooledRun] = []
    # A folder without the sticky bit may have had files replaced by others: read, validated, but say so.
    problems: list[str] = [problem] if problem else []
    users: list[str] = []
    try:
        entries = sorted(os.scandir(folder), key=lambda item: item.name)
    except PermissionError:
        raise PoolError(f"you ({current_user()}) may not read the class folder {folder}: you are not in its group "
                        f"({_group_name(folder.stat().st_gid)}); ask the instructor to add you, then log in again"
                        ) from None
    for entry in entries:
        if entry.name.startswith("."):
            continue
        shown = _printable(entry.name)
        try:
            # The folder itself, never a link in its place; the file is then opened inside this very folder.
            folder_descriptor = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as error:
            kind = "is not a folder (a link or a file)" if error.errno in (errno.ELOOP, errno.ENOTDIR) else (
                f"cannot be read ({error.strerror}: its owner runs `workshop class publish` again, which makes it "
                "readable by the class)")
            problems.append(f"{shown}: {kind}; skipped")
            continue
        try:
            owner = _user_name(os.fstat(folder_descriptor).st_uid)
            if entry.name != owner:
                problems.append(f"{shown}/: is owned by {owner}, not by {shown}; skipped (the instructor may remove "
                                "it)")
                continue
            document = _load(folder_descriptor, name)
        except FileNotFoundError:
            continue  # this participant has not published this chapter on this profile
        except _Skipped as skipped:
            problems.append(f"{shown}/{name}: {skipped}; skipped")
            continue
        except OSError as error:
            problems.append(f"{shown}/{name}: cannot be read ({error.strerror}: its owner runs `workshop class "
                            f"publish` again, which makes it readable by the class); skipped")
            continue
        finally:
            os.close(folder_descriptor)
        found = _document_problem(document, owner, chapter, profile_name, by_id)
        if found:
            problems.append(f"{shown}/{name}: {found}; skipped")
            continue
        users.append(owner)
        runs += [PooledRun(owner, by_id[row["id"]], result_of(row)) for row in document["rows"]]
    return Pool(folder, tuple(runs), tuple(problems), tuple(users))


class _Skipped(Exception):
    """A file that is not a pool file (a link, a pipe, too large, not JSON)."""


def _load(folder_descriptor: int, name: str):
    """The JSON of a pool file in an open folder, read without following a link and without reading more than
    MAX_FILE_BYTES."""
    try:
        # O_NONBLOCK: a named pipe planted under the file's name must not hang the reader.
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_descriptor)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _Skipped("is a link, not a file") from None
        raise
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _Skipped("is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise _Skipped(f"is {info.st_size} bytes, more than a chapter's rows can be ({MAX_FILE_BYTES})")
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise _Skipped(f"grew past {MAX_FILE_BYTES} bytes while it was read")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise _Skipped(f"is not valid JSON ({_printable(str(error))[:120]})") from None


def _refuse_constant(word: str):
    raise ValueError(f"{word} is not a number JSON allows")


def _document_problem(document, owner: str, chapter: int, profile_name: str,
                      experiments: dict[str, Experiment]) -> str | None:
    if not isinstance(document, dict):
        return f"holds a {type(document).__name__}, not a mapping"
    if set(document) != set(FILE_KEYS):
        return f"has the keys {sorted(map(_printable, document))[:8]}, not {list(FILE_KEYS)}"
    if type(document["format"]) is not int or document["format"] != FORMAT:
        return f"is format {_printable(repr(document['format']))[:20]}, not {FORMAT} (published by another version)"
    if document["user"] != owner:
        return f"claims to be by {_printable(repr(document['user']))[:40]}, but its folder belongs to {owner}"
    if type(document["chapter"]) is not int or document["chapter"] != chapter:
        return f"says chapter {_printable(repr(document['chapter']))[:20]}, not {chapter}"
    if document["profile"] != profile_name:
        return f"says profile {_printable(repr(document['profile']))[:40]}, not {profile_name}"
    rows = document["rows"]
    if not isinstance(rows, list):
        return "its rows are not a list"
    if len(rows) > len(experiments):
        return f"has {len(rows)} rows, more than the {len(experiments)} experiments of the chapter"
    seen = set()
    for row in rows:
        if problem := row_problem(row, experiments):
            return problem
        if row["id"] in seen:
            return f"{row['id']} appears twice"
        seen.add(row["id"])
    return None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def _printable(text: str) -> str:
    """A name from the pool as a message may show it: control characters replaced, at most 80 characters."""
    text = re.sub(r"[^\x20-\x7e]", "?", str(text))
    return text if len(text) <= 80 else text[:77] + "..."
