"""The class pool (workshop_lib.results.class_pool): participants publish their completed runs' rows into their own
folder of the class folder; every participant's tables read everyone's, and a hostile file is named and skipped.

The fast tests run as whoever runs pytest. The multi-user tests create Linux users in one group (as
tests/class_plan/test_class_rehearsal.py does; they need root, which CI has) and act as each of them in a forked
process, so that what stops one participant from touching another's results is the operating system, not our code.
"""

from __future__ import annotations

import contextlib
import grp
import io
import json
import os
import pickle
import pwd
import select as select_module
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from repo_paths import REPO, TESTS

from workshop_lib.book.chapter.class_runs import class_results, whole_chapter
from workshop_lib.book.chapter.selection import select
from workshop_lib.cli import main
from workshop_lib.experiments import get_experiment
from workshop_lib.results.class_pool import (
    CLASS_FOLDER_MODE,
    FILE_MODE,
    MAX_FILE_BYTES,
    USER_FOLDER_MODE,
    PoolError,
    current_user,
    prepare_class_folder,
    publish,
    read_pool,
)
from workshop_lib.runs import RunRecord
from workshop_lib.sites.class_folder import CLASS_DIR_VARIABLE, class_folder_of
from workshop_lib.sites.profiles import SHARED_ROOT_VARIABLE, ProfileError, load_profile

SAMPLES = TESTS / "samples"
CHAPTER = 1
TINY = "tiny"
CHILD_TIMEOUT_S = 60


def completed_run(runs: Path, experiment_id: str, total: str = "00:01:40", profile: str = TINY) -> Path:
    """A run folder as a completed tiny job leaves it: the record, the trainer's metrics, the job's footer."""
    experiment = get_experiment(experiment_id)
    folder = runs / experiment_id
    (folder / "train").mkdir(parents=True)
    shutil.copy(SAMPLES / "metrics" / "metrics.jsonl", folder / "train" / "metrics.jsonl")
    (folder / "slurm-7.out").write_text(f"Start time: 2026-11-27 10:00:00\nTotal time: {total}\n")
    RunRecord(experiment_id, experiment.content_hash, profile, "7", "slurm", "2026-11-27T10:00:00",
              stdout="slurm-7.out", final_state="COMPLETED", exit_code=0).save(folder)
    return folder


def experiments():
    return whole_chapter(select(CHAPTER, TINY)).runnable


def own_file(folder: Path) -> Path:
    return folder / current_user() / f"chapter{CHAPTER}.{TINY}.json"


# ---- where the class folder is ---------------------------------------------------------------------------
def test_the_class_folder_is_the_variable_else_class_in_the_staged_folder_else_none():
    tiny = load_profile(TINY)
    assert class_folder_of(tiny, {}) is None
    staged = class_folder_of(tiny, {SHARED_ROOT_VARIABLE: "/project/c1/ws/"})
    assert staged.path == Path("/project/c1/ws/class") and "staged folder" in staged.origin
    chosen = class_folder_of(tiny, {SHARED_ROOT_VARIABLE: "/project/c1/ws", CLASS_DIR_VARIABLE: "/elsewhere/pool"})
    assert chosen.path == Path("/elsewhere/pool") and CLASS_DIR_VARIABLE in chosen.origin
    assert class_folder_of(tiny, {CLASS_DIR_VARIABLE: "/p/$GROUP/pool", "GROUP": "c1"}).path == Path("/p/c1/pool")
    with pytest.raises(ProfileError, match=r"names \$GROUP, which is not set here"):
        class_folder_of(tiny, {CLASS_DIR_VARIABLE: "/p/$GROUP/pool"})
    with pytest.raises(ProfileError, match="not an absolute path"):
        class_folder_of(tiny, {CLASS_DIR_VARIABLE: "pool"})


def test_the_class_verbs_join_a_class_group_another_area_made_first():
    import argparse

    from workshop_lib.cli import class_pool

    parser = argparse.ArgumentParser(prog="workshop")
    commands = parser.add_subparsers(dest="command")
    group = commands.add_parser("class")  # as the class plan's module makes it
    group.add_subparsers(dest="class_command").add_parser("plan").set_defaults(handler="plan")
    class_pool.register(commands)
    assert parser.parse_args(["class", "plan"]).handler == "plan"
    assert parser.parse_args(["class", "pool", "--chapter", "2"]).handler is class_pool.run_pool


# ---- one participant: publish, then read -------------------------------------------------------------------
@pytest.fixture
def class_folder(tmp_path, monkeypatch):
    folder = prepare_class_folder(tmp_path / "class")
    monkeypatch.setenv(CLASS_DIR_VARIABLE, str(folder))
    return folder


def test_publish_writes_only_completed_rows_of_this_profile_with_the_pools_modes(class_folder, tmp_path, capsys):
    runs = tmp_path / "runs"
    completed_run(runs, "lora/llama/1-gpu")
    completed_run(runs, "lora/llama/2-gpus", profile="ibex")  # another profile's run is not this table's
    old = os.umask(0o077)  # whatever the participant's umask, the group reads what is published
    try:
        assert main(["class", "publish", "--chapter", "1", "--profile", TINY, "--runs-dir", str(runs)]) == 0
    finally:
        os.umask(old)
    assert "published 1 completed run(s)" in capsys.readouterr().out
    path = own_file(class_folder)
    assert stat.S_IMODE(class_folder.stat().st_mode) == CLASS_FOLDER_MODE
    assert stat.S_IMODE(path.parent.stat().st_mode) == USER_FOLDER_MODE
    assert stat.S_IMODE(path.stat().st_mode) == FILE_MODE
    document = json.loads(path.read_text())
    assert document["user"] == current_user() and [row["id"] for row in document["rows"]] == ["lora/llama/1-gpu"]
    assert "run_dir" not in document["rows"][0]  # a path of the publisher's machine stays home
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind

    assert main(["class", "pool", "--chapter", "1", "--profile", TINY, "--format", "json"]) == 0
    printed = capsys.readouterr()
    llama = json.loads(printed.out)[0]["rows"]
    assert llama[0]["Total job time (HH:MM:SS)"] == "00:01:40" and llama[1]["Total job time (HH:MM:SS)"] == "MISSING"
    assert "1 run(s) from 1 participant(s)" in printed.err


def test_with_no_completed_run_nothing_is_published(class_folder, tmp_path, capsys):
    assert main(["class", "publish", "--chapter", "1", "--profile", TINY, "--runs-dir", str(tmp_path / "none")]) == 0
    assert "nothing published: no completed run of chapter 1 on profile tiny" in capsys.readouterr().err
    assert not any(class_folder.iterdir())


def test_publish_refuses_a_class_folder_others_could_tamper_with(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "class"
    folder.mkdir(mode=0o770)
    folder.chmod(0o770)
    monkeypatch.setenv(CLASS_DIR_VARIABLE, str(folder))
    completed_run(tmp_path / "runs", "lora/llama/1-gpu")
    assert main(["class", "publish", "--chapter", "1", "--profile", TINY, "--runs-dir", str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err
    assert "without the sticky bit, setgid bit" in error and "workshop class init" in error
    monkeypatch.setenv(CLASS_DIR_VARIABLE, str(tmp_path / "nowhere"))
    assert main(["class", "pool", "--chapter", "1", "--profile", TINY]) == 2
    assert "does not exist" in capsys.readouterr().err
    monkeypatch.delenv(CLASS_DIR_VARIABLE)
    monkeypatch.delenv(SHARED_ROOT_VARIABLE, raising=False)
    assert main(["class", "pool", "--chapter", "1", "--profile", TINY]) == 2
    assert f"export {CLASS_DIR_VARIABLE}=FOLDER" in capsys.readouterr().err


def _good_document(user: str) -> dict:
    experiment = get_experiment("lora/llama/1-gpu")
    row = {"id": experiment.id, "hash": experiment.content_hash, "state": "COMPLETED", "total_time_s": 100,
           "run_model": "tiny-llama", "run_settings": {"max_steps": 3}}
    return {"format": 1, "user": user, "chapter": CHAPTER, "profile": TINY, "published_at": "now", "rows": [row]}


def _with_row(**changes) -> dict:
    document = _good_document(current_user())
    document["rows"][0].update(changes)
    return document


HOSTILE = {  # what a participant's file holds -> what the one line about it says
    "not JSON": (b"{\"format\": 1, ", "is not valid JSON"),
    "NaN": (json.dumps(_with_row(last_loss=float("nan"))).encode(), "NaN is not a number JSON allows"),
    "infinity by overflow": (json.dumps(_with_row(last_loss=12345.5)).replace("12345.5", "1e999").encode(),
                             "inf is not a finite number"),
    "a string for a number": (json.dumps(_with_row(total_time_s="100")).encode(), "'100' is not a whole number"),
    "a negative time": (json.dumps(_with_row(total_time_s=-5)).encode(), "outside 0 to"),
    "markup in a name": (json.dumps(_with_row(run_model="<script>alert(1)</script>")).encode(),
                         "is not a plain name"),
    "markdown in a setting": (json.dumps(_with_row(run_settings={"config": "a|b**c**"})).encode(),
                              "is not a plain name"),
    "a word where the book reads a number": (json.dumps(_with_row(run_settings={"max_steps": "x"})).encode(),
                                             "'x' is not a number"),
    "path traversal in an id": (json.dumps(_with_row(id="../../etc/passwd")).encode(),
                                "is not an experiment of this chapter"),
    "another chapter's experiment": (json.dumps(_with_row(id="zero/baseline")).encode(),
                                     "is not an experiment of this chapter"),
    "another version of the experiment": (json.dumps(_with_row(hash="0" * 16)).encode(), "another version"),
    "a key no run records": (json.dumps(_with_row(gpus=64)).encode(), "keys no run records: 'gpus'"),
    "a row naming another user": (json.dumps(_with_row(user="someone-else")).encode(), "keys no run records: 'user'"),
    "a failed run": (json.dumps(_with_row(state="FAILED")).encode(), "only completed runs are pooled"),
    "another user's name": (json.dumps(_good_document("someone-else")).encode(), "claims to be by 'someone-else'"),
    "another profile": (json.dumps({**_good_document(current_user()), "profile": "ibex"}).encode(),
                        "says profile 'ibex'"),
    "a list": (b"[1, 2]", "holds a list"),
    "too large": (b" " * (MAX_FILE_BYTES + 1), "more than a chapter's rows can be"),
    "deeply nested": (b"[" * 100000 + b"]" * 100000, "is not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_is_named_in_one_line_and_skipped(class_folder, case):
    content, said = HOSTILE[case]
    path = own_file(class_folder)
    path.parent.mkdir()
    path.write_bytes(content)
    pool = read_pool(class_folder, CHAPTER, TINY, experiments())
    assert pool.runs == () and len(pool.problems) == 1, pool.problems
    line = pool.problems[0]
    assert line.startswith(f"{current_user()}/{path.name}: ") and said in line and "\n" not in line, line
    assert "<script>" not in line or case == "markup in a name"  # shown escaped wherever the line is shown


@pytest.mark.parametrize("chapter", [1, 2, 3, 4])
def test_every_real_gpu_run_of_the_reference_publishes_a_row_every_reader_accepts(chapter):
    """The book's reference rows are real runs (A100/H100, every engine): as published rows they pass the readers'
    checks, and the numbers the tables read come back unchanged."""
    import dataclasses

    from workshop_lib.results.pool_rows import publishable_row, result_of, row_problem
    from workshop_lib.results.read import RunResult

    document = json.loads((REPO / "book" / "reference" / f"chapter{chapter}.json").read_text())
    names = {item.name for item in dataclasses.fields(RunResult)}
    checked = 0
    for row in document["results"]:
        if row["state"] != "COMPLETED":
            continue
        experiment = get_experiment(row["id"])
        values = {key: value for key, value in row.items() if key in names and value is not None}
        values["eval_loss_by_epoch"] = {int(k): v for k, v in (values.get("eval_loss_by_epoch") or {}).items()}
        result = RunResult(**{**values, "experiment_id": experiment.id})
        published = json.loads(json.dumps(publishable_row(experiment, result), allow_nan=False))
        assert row_problem(published, {experiment.id: experiment}) is None
        back = result_of(published)
        for key in ("total_time_s", "mean_step_time_s", "gpu0_peak_mib", "train_samples_per_s", "eval_loss",
                    "allocated_peak_mib", "run_model"):
            assert getattr(back, key) == getattr(result, key), (experiment.id, key)
        assert back.run_settings.get("max_steps") == result.run_settings.get("max_steps"), experiment.id
        checked += 1
    assert checked >= 1


def test_links_pipes_and_folders_in_the_wrong_place_are_skipped(class_folder, tmp_path):
    secret = tmp_path / "elsewhere.json"
    secret.write_text(json.dumps(_good_document(current_user())))
    own = class_folder / current_user()
    own.mkdir()
    (own / f"chapter{CHAPTER}.{TINY}.json").symlink_to(secret)
    assert read_pool(class_folder, CHAPTER, TINY, experiments()).problems[0].endswith("is a link, not a file; skipped")
    (own / f"chapter{CHAPTER}.{TINY}.json").unlink()
    os.mkfifo(own / f"chapter{CHAPTER}.{TINY}.json")  # would hang a reader that waits for a writer
    assert "is not a regular file" in read_pool(class_folder, CHAPTER, TINY, experiments()).problems[0]
    shutil.rmtree(own)
    (class_folder / current_user()).symlink_to(tmp_path)  # the user's folder itself replaced by a link
    (class_folder / "not-a-user-here").mkdir()  # named after someone else than its owner
    problems = read_pool(class_folder, CHAPTER, TINY, experiments()).problems
    assert any(line.startswith(f"{current_user()}: is not a folder") for line in problems), problems
    with pytest.raises(PoolError, match=r"is a link, not a folder, so readers would skip it: remove it"):
        publish(class_folder, CHAPTER, TINY, [])
    assert any(line.startswith(f"not-a-user-here/: is owned by {current_user()}") for line in problems), problems


def test_the_class_row_is_the_median_run_and_says_who_ran_what():
    from workshop_lib.results.class_pool import Pool, PooledRun
    from workshop_lib.results.read import RunResult

    experiment = get_experiment("lora/llama/1-gpu")
    runs = tuple(PooledRun(user, experiment, RunResult(experiment.id, "COMPLETED", total_time_s=seconds))
                 for user, seconds in (("ann", 100), ("bea", 9000), ("cid", 110)))  # bea's is an outlier
    pooled = class_results(Pool(Path("/class"), runs, (), ("ann", "bea", "cid")), experiments())
    row = pooled.results.set_index("id").loc["lora/llama/1-gpu"]
    assert row["total_time_s"] == 110
    who = pooled.who.set_index("experiment").loc["lora/llama/1-gpu"]
    assert who["runs pooled"] == 3 and who["participants"] == "ann, bea, cid" and who["row shown from"] == "cid"
    assert pooled.results.set_index("id").loc["lora/llama/2-gpus"]["state"] == "MISSING"


def test_the_chapter_cell_publishes_your_runs_and_shows_the_class_table(class_folder, tmp_path, capsys):
    from workshop_lib.book.chapter import facade as nb

    runs = tmp_path / "runs"
    completed_run(runs, "lora/llama/2-gpus")
    # The participant chose one experiment; the class table is the whole chapter's.
    tables = nb.show_class_results(nb.select(CHAPTER, TINY, ["lora/llama/1-gpu"]), runs)
    out = capsys.readouterr().out
    assert "Published 1 completed run(s)" in out and own_file(class_folder).is_file()
    assert "the class's runs (tiny)" in out and "1 participant(s)" in out and "Who ran what" in out
    llama = tables[0].frame.to_dict("records")
    assert [row["Total job time (HH:MM:SS)"] for row in llama[:2]] == ["MISSING", "00:01:40"]
    # Published and read back, the runs fill the very tables they fill at home: nothing lost on the way.
    from workshop_lib.book.chapter.your_runs import for_profile, selection_tables

    whole = whole_chapter(nb.select(CHAPTER, TINY))
    at_home = [for_profile(table, whole.profile) for table in selection_tables(whole, runs)]
    assert [table.frame.to_json() for table in tables] == [table.frame.to_json() for table in at_home]


def test_a_chapter_without_a_class_folder_shows_one_note_and_publishes_nothing(monkeypatch, tmp_path, capsys):
    from workshop_lib.book.chapter import facade as nb

    monkeypatch.delenv(CLASS_DIR_VARIABLE, raising=False)
    monkeypatch.delenv(SHARED_ROOT_VARIABLE, raising=False)
    assert nb.show_class_results(nb.select(CHAPTER, TINY), tmp_path) == []
    out = capsys.readouterr().out
    assert out.count("workshop-note") == 1 and "no class folder is set here" in out and "workshop-warning" not in out
    assert not any(tmp_path.iterdir())


# ---- several real users --------------------------------------------------------------------------------------
def as_user(user: str, function, *args):
    """`function(*args)` in a forked process running as `user` (its groups, a strict umask); returns its value,
    or ("raised", exception type name, message) when it raised."""
    entry = pwd.getpwnam(user)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the user, run, send the outcome back, and never return into pytest
        try:
            os.close(reader)
            os.setgroups(os.getgrouplist(user, entry.pw_gid))
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.umask(0o077)
            try:
                outcome = ("returned", function(*args))
            except Exception as error:  # noqa: BLE001 - the parent asserts on it
                outcome = ("raised", type(error).__name__, str(error))
            with os.fdopen(writer, "wb") as handle:
                handle.write(pickle.dumps(outcome))
        finally:
            os._exit(0)
    os.close(writer)
    data = b""
    with os.fdopen(reader, "rb") as handle:
        while True:  # until the child closes its end, or a minute: a child stuck at a lock fails the test, not CI
            ready, _, _ = select_module.select([handle], [], [], CHILD_TIMEOUT_S)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"the process acting as {user} gave no answer in {CHILD_TIMEOUT_S} s")
            chunk = os.read(handle.fileno(), 1 << 16)
            if not chunk:
                break
            data += chunk
    os.waitpid(pid, 0)
    assert data, f"the process acting as {user} ended without an answer (could it become {user}?)"
    outcome = pickle.loads(data)
    return outcome[1] if outcome[0] == "returned" else outcome


@pytest.fixture(scope="module")
def classroom():
    """Users of one group (the class), a class folder the instructor (root) made, each user's completed runs."""
    if os.geteuid() != 0:
        pytest.skip("creating Linux users needs root (CI runs as root)")
    tag = f"wsp{os.getpid() % 100000}"
    group = f"{tag}g"
    names = {role: f"{tag}{role[0]}" for role in ("alice", "bob", "carol", "dave", "mallory")}
    base = Path(tempfile.mkdtemp(prefix="workshop-class-pool-"))
    base.chmod(0o755)  # every user reaches the class folder and their runs
    created = []
    try:
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        for name in names.values():
            subprocess.run(["useradd", "--no-create-home", "--user-group", "--groups", group, name], check=True,
                           capture_output=True)
            created.append(name)
        folder = prepare_class_folder(base / "class", group)
        runs = {}
        for role, experiment_id, total in (("alice", "lora/llama/1-gpu", "00:01:40"),
                                           ("bob", "lora/llama/2-gpus", "00:00:55")):
            runs[role] = base / role
            completed_run(runs[role], experiment_id, total)
            entry = pwd.getpwnam(names[role])
            for path in [runs[role], *runs[role].rglob("*")]:
                os.chown(path, entry.pw_uid, entry.pw_gid)
        yield {"folder": folder, "names": names, "runs": runs, "group": group}
    finally:
        for name in created:
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _publish(folder: Path, runs: Path):
    from workshop_lib.book.chapter.class_runs import publish_own

    return publish_own(select(CHAPTER, TINY), folder, runs)


def _read(folder: Path):
    return read_pool(folder, CHAPTER, TINY, experiments())


def _attack(folder: Path, victim: str) -> dict[str, str]:
    """Every way a participant might change another's published results, tried with plain system calls."""
    theirs = folder / victim / f"chapter{CHAPTER}.{TINY}.json"
    mine = folder / current_user()
    mine.mkdir(exist_ok=True)
    decoy = mine / "decoy.json"
    decoy.write_text("{}")
    attempts = {
        "overwrite": lambda: theirs.open("w").close(),
        "add a file": lambda: (folder / victim / "extra.json").write_text("{}"),
        "rename over": lambda: os.replace(decoy, theirs),
        "delete the file": lambda: theirs.unlink(),
        "rename the folder": lambda: os.rename(folder / victim, folder / f"{victim}-gone"),
        "delete the folder": lambda: shutil.rmtree(folder / victim),
        "open the folder": lambda: os.chmod(folder / victim, 0o2777),
        "open the file": lambda: os.chmod(theirs, 0o666),
    }
    outcomes = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            outcomes[name] = "allowed"
        except PermissionError:
            outcomes[name] = "refused"
    return outcomes


def test_participants_pool_their_runs_and_each_sees_the_whole_table(classroom):
    folder, names = classroom["folder"], classroom["names"]
    assert as_user(names["alice"], _publish, folder, classroom["runs"]["alice"])[1] == 1
    assert as_user(names["bob"], _publish, folder, classroom["runs"]["bob"])[1] == 1
    mine = folder / names["alice"]
    assert (mine.stat().st_uid, stat.S_IMODE(mine.stat().st_mode)) == (pwd.getpwnam(names["alice"]).pw_uid,
                                                                       USER_FOLDER_MODE)
    assert grp.getgrgid(mine.stat().st_gid).gr_name == classroom["group"]  # the class's group, by setgid
    pool = as_user(names["carol"], _read, folder)  # carol published nothing and reads everyone's
    assert not isinstance(pool, tuple), pool
    assert {(run.user, run.experiment.id) for run in pool.runs} == {(names["alice"], "lora/llama/1-gpu"),
                                                                    (names["bob"], "lora/llama/2-gpus")}


def test_no_participant_can_change_or_delete_anothers_results_the_os_refuses(classroom):
    folder, names = classroom["folder"], classroom["names"]
    as_user(names["alice"], _publish, folder, classroom["runs"]["alice"])
    before = (folder / names["alice"] / f"chapter{CHAPTER}.{TINY}.json").read_bytes()
    outcomes = as_user(names["mallory"], _attack, folder, names["alice"])
    assert outcomes == dict.fromkeys(outcomes, "refused"), outcomes
    assert (folder / names["alice"] / f"chapter{CHAPTER}.{TINY}.json").read_bytes() == before


def test_a_hostile_participant_is_named_and_skipped_and_the_others_tables_stand(classroom):
    from workshop_lib.book.chapter.class_runs import show_class_results

    folder, names = classroom["folder"], classroom["names"]
    as_user(names["alice"], _publish, folder, classroom["runs"]["alice"])
    as_user(names["bob"], _publish, folder, classroom["runs"]["bob"])

    def plant(folder: Path, victim: str) -> None:
        own = folder / current_user()
        own.mkdir(exist_ok=True)
        own.chmod(0o2750)
        document = _good_document(victim)  # claims to be alice's, with made-up numbers and markup
        document["rows"][0]["run_model"] = "<img src=x onerror=alert(1)>"
        path = own / f"chapter{CHAPTER}.{TINY}.json"
        path.write_text(json.dumps(document))
        path.chmod(0o640)
        (folder / "squatted").mkdir()  # a folder named after someone else
        (folder / "squatted").chmod(0o2750)

    assert as_user(names["mallory"], plant, folder, names["alice"]) is None
    pool = as_user(names["carol"], _read, folder)
    assert {run.user for run in pool.runs} == {names["alice"], names["bob"]}
    assert len(pool.problems) == 2, pool.problems
    assert any(line.startswith(f"{names['mallory']}/chapter1.tiny.json: claims to be by '{names['alice']}'")
               for line in pool.problems)
    assert any(line.startswith(f"squatted/: is owned by {names['mallory']}") for line in pool.problems)

    def page(folder: Path):
        os.environ[CLASS_DIR_VARIABLE] = str(folder)
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            tables = show_class_results(select(CHAPTER, TINY), "/nonexistent", publish_mine=False)
        return [table.frame.to_dict("records") for table in tables], shown.getvalue()

    outcome = as_user(names["carol"], page, folder)
    assert outcome[0] != "raised", outcome
    tables, html = outcome
    assert [row["Total job time (HH:MM:SS)"] for row in tables[0][:2]] == ["00:01:40", "00:00:55"]
    assert "the class's runs (tiny)" in html and html.count("workshop-warning") == 2  # one line per skipped entry
    assert "<img" not in html and "onerror" not in html  # mallory's markup never reaches the page


def test_a_folder_squatted_under_your_name_stops_your_publish_with_what_to_do(classroom):
    folder, names = classroom["folder"], classroom["names"]

    def squat(folder: Path, name: str) -> None:
        (folder / name).mkdir()

    as_user(names["mallory"], squat, folder, names["dave"])
    outcome = as_user(names["dave"], _publish, folder, classroom["runs"]["alice"])
    assert outcome[:2] == ("raised", "PoolError") and f"belongs to {names['mallory']}" in outcome[2]
    assert "ask the instructor to remove it" in outcome[2]
