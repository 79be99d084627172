"""Every `workshop` command given bad arguments ends with a message and a non-zero status, never a traceback.

Each command is run over inputs a user can mistype: missing and unreadable paths, folders where files are
expected and files where folders are, binary files, ids that do not exist, numbers out of range. The test
fails on any exception that escapes `main`, on a zero status, and on output that holds a traceback.
"""

from __future__ import annotations

import os
import traceback

import pytest

from workshop_lib.cli import build_parser, main


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Bad things to point a command at; nothing here can reach a scheduler or the checkout."""
    monkeypatch.setenv("WORKSHOP_BACKEND", "local")
    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("WORKSHOP_RUNS_DIR", str(tmp_path / "runs"))
    binary = tmp_path / "random.bin"
    binary.write_bytes(bytes(range(256)) * 40 + os.urandom(2048))
    folder = tmp_path / "a-folder"
    folder.mkdir()
    empty = tmp_path / "empty.sbatch"
    empty.write_text("")
    a_file = tmp_path / "a-file.txt"
    a_file.write_text("not a folder\n")
    return {"missing": str(tmp_path / "no" / "such" / "thing"), "missing_too": str(tmp_path / "not" / "there"), "folder": str(folder), "binary": str(binary),
            "empty": str(empty), "file": str(a_file), "proc": "/proc/version", "file_child": str(a_file / "x")}


BAD_IDS = ["no/such/experiment", "", "../../etc/passwd", "zero/baseline; rm -rf /", "\x00"]


def cases(places: dict[str, str]) -> list[list[str]]:
    p = places
    # `submit` makes a runs folder it is given; the reading commands get one that stays missing.
    runs_places = [p["missing"], p["file"], p["binary"], p["proc"], p["file_child"]]
    read_places = [p["missing_too"], p["file"], p["binary"], p["proc"], p["file_child"]]
    found = []
    # experiments
    found += [["experiments", "--chapter", value] for value in ("0", "9", "-1", "x")]
    found += [["experiments", "--profile", value] for value in (p["missing"], p["folder"], p["binary"], p["empty"],
                                                                 "no-such-profile")]
    # render
    found += [["render", value] for value in BAD_IDS]
    found += [["render", "zero/baseline", "-o", value] for value in (p["folder"], p["proc"], p["file_child"])]
    found += [["render", "zero/baseline", "--profile", value] for value in (p["missing"], p["folder"], p["binary"])]
    found += [["render", "--import-model", value] for value in ("no-such-model", "")]
    found += [["render"]]
    # check
    found += [["check", value] for value in (p["missing"], p["binary"], p["empty"], p["proc"], "/dev/null")]
    # submit and status
    found += [["submit", value] for value in BAD_IDS]
    found += [["submit", "--chapter", value] for value in ("0", "9", "-2")]
    found += [["submit", "zero/baseline", "--profile", value] for value in (p["missing"], p["folder"], p["binary"])]
    found += [["submit", "zero/baseline", "--runs-dir", value] for value in runs_places]
    found += [["submit", "zero/baseline", "--wait", "--timeout", "-5"]]
    found += [["submit"]]
    found += [["status", value] for value in BAD_IDS]
    found += [["status", "--chapter", value] for value in ("0", "9")]
    found += [["status", "zero/baseline", "--runs-dir", value] for value in read_places]
    # cancel
    found += [["cancel", value] for value in BAD_IDS]
    found += [["cancel", "--chapter", value] for value in ("0", "9")]
    found += [["cancel", "--job", value] for value in ("", "no-such-job", "local-999999", "-3")]
    found += [["cancel", "zero/baseline", "--runs-dir", value] for value in read_places]
    found += [["cancel"]]
    # collect and memory
    found += [["collect", "--runs", value] for value in read_places + [p["folder"]]]
    found += [["collect", "--chapter", value] for value in ("0", "5")]
    found += [["memory", value] for value in (p["missing"], p["binary"], p["empty"], p["folder"], p["proc"])]
    found += [["memory", p["file"], "--busy-fraction", value] for value in ("2", "-1", "nan", "x")]
    # estimate
    for option, values in {"--gpus": ("0", "-1"), "--nodes": ("0", "-2"), "--batch": ("0", "-1"),
                           "--seq-len": ("0", "-5"), "--tp": ("0", "3"), "--ep": ("0", "-1"), "--pp": ("0",),
                           "--lora-rank": ("0", "-4"), "--micro-batches": ("0",), "--zero": ("7",)}.items():
        found += [["estimate", "--model", "tiny-llama", option, value] for value in values]
    found += [["estimate", "--model", value] for value in ("no-such-model", p["missing"], p["folder"], p["binary"],
                                                            p["empty"])]
    found += [["estimate", "--model", "tiny-llama", "--lora-rank", "8", "--lora-modules", ",,"]]
    # setup
    found += [["setup", value, "--list"] for value in ("no-such-site", p["missing"], p["folder"], p["binary"])]
    found += [["setup", "tiny", "--only", "no-such-step", "--list"], ["setup", "tiny", "--from", "nope", "--list"]]
    # lab (--print-only: a case that passed the checks would print the script, never submit it)
    found += [["lab"], ["lab", "--ibex", "--batch"]]
    found += [["lab", "--batch", "--print-only", "--profile", value] for value in (p["missing"], p["folder"],
                                                                                    p["binary"], p["empty"])]
    found += [["lab", "--ibex", "--print-only", "--wait", value] for value in ("0", "-5", "nan", "x")]
    # class (no class folder is set here: publish and pool say how to set one)
    found += [["class", verb, "--chapter", value] for verb in ("publish", "pool") for value in ("0", "9", "x")]
    found += [["class", verb, "--chapter", "1"] for verb in ("publish", "pool")]
    found += [["class", "pool", "--chapter", "1", "--profile", value] for value in (p["missing"], p["binary"])]
    found += [["class", "init", value] for value in (p["file"], p["file_child"], p["proc"])]
    found += [["class", "init", p["folder"], "--group", "no-such-group"], ["class", "init"], ["class"]]
    # class plan (no --reservation that exists: nothing here reaches a scheduler)
    found += [["class", "plan"]]
    found += [["class", "plan", "--participants", value] for value in ("0", "-3", "x", "")]
    found += [["class", "plan", "--participants", "3", option, value]
              for option, values in {"--nodes-4gpu": ("-1", "x"), "--nodes-8gpu": ("-2",), "--hours": ("0", "-1", "nan"),
                                     "--reservation": ("", "a b", "x;rm", "../../etc")}.items() for value in values]
    found += [["class", "plan", "--participants", "3", "--nodes-4gpu", "0", "--nodes-8gpu", "0"],
              ["class", "plan", "--participants", "3", "--reservation", "r", "--nodes-8gpu", "1"],
              ["class", "plan", "--participants", "3", "--profile", p["binary"]]]
    # the cluster and jobs
    found += [["cluster", "up", "--nodes", value] for value in ("0", "-1", "99", "x")]
    found += [["cluster", "up", "--timeout", value] for value in ("0", "-1", "nan")]
    found += [["jobs", value] for value in ("", "no-such-job", "local-999999", "-3")]
    found += [["jobs", "--backend", "nope", "1"], ["no-such-command"], ["cluster", "nope"]]
    return found


def test_every_command_is_covered(places):
    """A command added later gets its bad inputs here too."""
    names = set(build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001
    covered = {argv[0] for argv in cases(places)}
    assert names and names <= covered, f"no bad-input cases for: {sorted(names - covered)}"


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_bad_arguments_end_in_a_message_and_a_non_zero_status(places, capsys):
    broken = []
    for argv in cases(places):
        try:
            status = main(list(argv))
        except SystemExit as exit_:  # argparse: its usage line and message, status 2
            status = exit_.code
        except BaseException as error:  # noqa: BLE001 - the point: nothing may escape
            broken.append(f"{argv}: {type(error).__name__}: {error}\n{traceback.format_exc()[-800:]}")
            continue
        out, err = capsys.readouterr()
        if "Traceback (most recent call last)" in out + err:
            broken.append(f"{argv}: printed a traceback:\n{(out + err)[-800:]}")
        elif not status:
            broken.append(f"{argv}: status {status!r}, output {(out + err)[-300:]!r}")
        elif "error" not in (out + err).lower():
            broken.append(f"{argv}: status {status} but no error message; output {(out + err)[-300:]!r}")
    assert not broken, f"{len(broken)} of {len(cases(places))} bad inputs misbehaved:\n\n" + "\n\n".join(broken)
