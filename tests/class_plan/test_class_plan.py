"""The class plan: runs dealt out to a class, the day's jobs packed on node shapes as SLURM packs them, the
reservation read from `scontrol`, and `workshop class plan`'s errors."""

from __future__ import annotations

import os
import stat

import pytest

from workshop_lib.class_plan import (
    CLASS_ROLES,
    IBEX_4GPU,
    IBEX_8GPU,
    INSTRUCTOR,
    NodeShape,
    PlannedJob,
    ReservationLookupError,
    assign,
    class_jobs,
    nodes_of,
    parse_nodes,
    plan_on,
    read_reservation,
    role_of,
    simulate,
    smallest_reservation,
)
from workshop_lib.experiments import all_experiments, chapter_experiments

FOUR = frozenset({"a100", "4gpus"})
EIGHT = frozenset({"a100", "8gpus"})


def job(user="u1", gpus=1, nodes=1, memory_gib=64, features=FOUR, minutes=10.0, cpus=4, name="x"):
    return PlannedJob(user, name, nodes, gpus, cpus, memory_gib * 1024, features, minutes * 60)


# ---- the simulation ---------------------------------------------------------------------------------
def test_memory_per_node_limits_packing_as_gpus_do():
    # --mem=256G on a 512 GB 4-GPU node: two 1-GPU jobs per node, not four.
    node = nodes_of({IBEX_4GPU: 1})
    schedule = simulate([job(name=f"j{i}", memory_gib=256, user=f"u{i}") for i in range(4)], node, cap=24)
    starts = sorted(p.start_s for p in schedule.placements)
    assert starts == [0, 0, 600, 600] and schedule.makespan_s == 1200


def test_small_jobs_stay_off_the_8_gpu_nodes_and_large_ones_wait_for_them():
    nodes = nodes_of({IBEX_4GPU: 1, IBEX_8GPU: 1})
    jobs = [job(name="small-1", user="a"), job(name="small-2", user="b", gpus=4), job(name="big", gpus=8,
                                                                                     features=EIGHT, user="c")]
    placements = {p.job.experiment_id: p for p in simulate(jobs, nodes, cap=24).placements}
    assert placements["small-1"].nodes == ("4gpu-01",) and placements["big"].nodes == ("8gpu-01",)
    assert placements["small-2"].start_s == 600  # waits for the 4-GPU node, never takes the idle 8-GPU node


def test_the_per_user_cap_holds_jobs_back_and_a_later_job_that_fits_passes():
    nodes = nodes_of({IBEX_4GPU: 10})
    jobs = [job(gpus=4, nodes=5, minutes=10, name="twenty"), job(gpus=4, nodes=2, minutes=10, name="eight"),
            job(gpus=4, minutes=10, name="four")]
    placements = {p.job.experiment_id: p for p in simulate(jobs, nodes, cap=24).placements}
    assert placements["twenty"].start_s == 0 and placements["four"].start_s == 0  # 24 GPUs: at the cap
    assert placements["eight"].start_s == 600


def test_fullest_nodes_are_filled_first_so_whole_nodes_stay_free():
    nodes = nodes_of({IBEX_4GPU: 2})
    jobs = [job(name="a", user="a", minutes=30), job(name="b", user="b", minutes=10), job(name="whole", user="c",
                                                                                          gpus=4, minutes=5)]
    placements = {p.job.experiment_id: p for p in simulate(jobs, nodes, cap=24).placements}
    assert placements["a"].nodes == placements["b"].nodes == ("4gpu-01",)
    assert placements["whole"].start_s == 0 and placements["whole"].nodes == ("4gpu-02",)


def test_a_job_no_node_can_hold_is_reported_not_waited_for():
    schedule = simulate([job(gpus=8, features=EIGHT, name="big"), job(name="small")], nodes_of({IBEX_4GPU: 2}), 24)
    assert [j.experiment_id for j in schedule.never] == ["big"]
    assert [p.job.experiment_id for p in schedule.placements] == ["small"]


# ---- the roles --------------------------------------------------------------------------------------
@pytest.mark.parametrize("participants", [1, 2, 7, 30])
def test_every_participant_has_a_job_of_their_own_in_every_chapter(participants):
    names = tuple(f"p{i}" for i in range(participants))
    start = 0
    for chapter in CLASS_ROLES:
        assignment, start = assign(chapter, names, start)
        assert all(assignment.by_participant[name] for name in names), (chapter, participants)


def test_no_participant_job_needs_two_8_gpu_nodes_and_every_row_is_made():
    for experiment in all_experiments():
        if (experiment.nodes > 1 and experiment.gpus_per_node > 4) or experiment.gpus > 8:
            assert role_of(experiment) == INSTRUCTOR, experiment.id  # no participant job asks for 16 GPUs
    names = tuple(f"p{i}" for i in range(30))
    assignment, _ = assign(2, names)
    made = {e.id for runs in assignment.by_participant.values() for e in runs} | {e.id for e in assignment.instructor}
    assert made == {e.id for e in chapter_experiments(2)}
    makers = dict((e.id, m) for e, m in assignment.split)
    assert len(makers["model-parallel/llama/tp2-dp2"]) == len(makers["model-parallel/llama/tp4"]) == 15
    assert not set(makers["model-parallel/llama/tp2-dp2"]) & set(makers["model-parallel/llama/tp4"])


def test_split_runs_go_round_robin_and_the_next_chapter_goes_on_where_the_last_stopped():
    names = tuple(f"p{i}" for i in range(30))
    first, start = assign(1, names)
    makers = [m for _, m in first.split]
    assert makers[0] == ("p0", "p1") and makers[1] == ("p2", "p3") and start == 8
    second, _ = assign(2, names, start)
    assert dict((e.id, m) for e, m in second.split)["model-parallel/llama/tp2-dp2"][0] == "p8"


# ---- the plan for the target class ----------------------------------------------------------------
@pytest.fixture(scope="module")
def durations():
    from workshop_lib.book.plans.day_plan import class_durations

    return class_durations()


def test_thirty_participants_fit_five_hours_on_16_four_gpu_and_2_eight_gpu_nodes(durations):
    plan = plan_on(class_jobs(30, durations), nodes_of({IBEX_4GPU: 16, IBEX_8GPU: 2}), "target")
    assert plan.fits and plan.day_s <= 5 * 3600 and not plan.never
    assert max(day.schedule.peak_user_gpus for day in plan.chapters) <= 24
    hours = plan.gpu_hours()
    assert set(hours) == {4, 8} and hours[4] > hours[8] > 0


def test_the_smallest_reservation_fits_and_one_node_less_does_not(durations):
    jobs = class_jobs(6, durations)
    smallest = smallest_reservation(jobs)
    assert smallest is not None and smallest.fits
    counts = {node.shape: 0 for node in smallest.nodes}
    for node in smallest.nodes:
        counts[node.shape] += 1
    assert counts[IBEX_4GPU] > 1
    fewer = {**counts, IBEX_4GPU: counts[IBEX_4GPU] - 1}
    assert not plan_on(jobs, nodes_of(fewer), "one less").fits


def test_a_reservation_without_8_gpu_nodes_names_the_missing_shape(durations):
    plan = plan_on(class_jobs(4, durations), nodes_of({IBEX_4GPU: 4}), "reservation small")
    assert not plan.fits
    [line] = [line for line in plan.missing_shapes() if "8gpus" in line]
    assert "reservation small has no node with the features 8gpus,a100, 8 GPUs" in line
    assert "model-parallel/llama/tp8" in line


# ---- the reservation from scontrol ------------------------------------------------------------------
RESERVATION = """ReservationName=dist-ft StartTime=2026-12-01T08:00:00 EndTime=2026-12-01T18:00:00 Duration=10:00:00
   Nodes=gpu201-[02-03],gpu214-07 NodeCnt=3 CoreCnt=252 Features=(null) PartitionName=(null) Flags=SPEC_NODES
   TRES=cpu=252
   Users=alice,bob Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a
   MaxStartDelay=(null)

"""
NODE = """NodeName={name} Arch=x86_64 CoresPerSocket=32
   CPUAlloc=0 CPUEfctv={efctv} CPUTot={total} CPULoad=0.02
   AvailableFeatures=dragon,cpu_amd_epyc_7713,amd,milan,nolmem,local_200G,gpu,a100,{shape}
   ActiveFeatures=dragon,cpu_amd_epyc_7713,amd,milan,nolmem,local_200G,gpu,a100,{shape}
   Gres=gpu:a100:{gpus}(S:0-1)
   NodeAddr={name} NodeHostName={name} Version=23.02.7
   OS=Linux 4.18.0-477.27.1.el8_8.x86_64 #1 SMP Wed Sep 20 15:55:39 UTC 2023
   RealMemory={memory} AllocMem=0 FreeMem=498000 Sockets=2 Boards=1
   CoreSpecCount=2 CPUSpecList=0,32 MemSpecLimit=8192
   State=IDLE+RESERVED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=batch
   CfgTRES=cpu={efctv},mem={memory}M,billing={efctv},gres/gpu={gpus}
   AllocTRES=

"""


def fake_scontrol(arguments):
    if arguments[:2] == ["show", "reservation"]:
        return RESERVATION if arguments[2] == "dist-ft" else f"Reservation {arguments[2]} not found\n"
    assert arguments == ["show", "node", "gpu201-[02-03],gpu214-07"], arguments
    return (NODE.format(name="gpu201-02", efctv=62, total=64, shape="4gpus", gpus=4, memory=515000)
            + NODE.format(name="gpu201-03", efctv=62, total=64, shape="4gpus", gpus=4, memory=515000)
            + NODE.format(name="gpu214-07", efctv=126, total=128, shape="8gpus", gpus=8, memory=1031000))


def test_a_reservation_is_read_with_each_nodes_real_shape():
    reservation = read_reservation("dist-ft", fake_scontrol)
    assert reservation.users == ("alice", "bob") and reservation.state == "INACTIVE"
    assert [node.name for node in reservation.nodes] == ["gpu201-02", "gpu201-03", "gpu214-07"]
    four, _, eight = (node.shape for node in reservation.nodes)
    assert (four.gpus, four.cpus, four.memory_mib) == (4, 62, 515000 - 8192)
    assert {"a100", "4gpus"} <= four.features and {"a100", "8gpus"} <= eight.features and eight.gpus == 8


def test_an_unknown_reservation_says_how_to_find_the_name():
    with pytest.raises(ReservationLookupError, match=r"reservation 'nope' is not in SLURM's answer.*"
                                                     r"scontrol show reservation.*--nodes-4gpu N"):
        read_reservation("nope", fake_scontrol)


def test_node_without_gpus_or_features_parses_as_an_empty_shape():
    [node] = parse_nodes("NodeName=cn1 CPUTot=40 RealMemory=350000 Features=(null) Gres=(null) State=IDLE\n")
    assert node.shape == NodeShape(0, 40, 350000, frozenset())


# ---- the command --------------------------------------------------------------------------------------
def workshop(capsys, *arguments):
    from workshop_lib.cli.main import main

    code = main(["class", "plan", *arguments])
    return code, capsys.readouterr()


@pytest.mark.parametrize("arguments, message", [
    (["--participants", "0"], "--participants 0: a class has at least 1 participant"),
    (["--participants", "3", "--nodes-4gpu", "0", "--nodes-8gpu", "0"], "no nodes to plan on: give --nodes-4gpu N"),
    (["--participants", "3", "--reservation", "x", "--nodes-4gpu", "2"], "either --reservation NAME or node counts"),
    (["--participants", "3", "--reservation", "x;rm"], "is not a SLURM reservation name"),
])
def test_bad_input_is_refused_with_what_to_give(capsys, arguments, message):
    code, output = workshop(capsys, *arguments)
    assert code == 2 and message in output.err, output.err


def test_an_unknown_reservation_is_refused_with_scontrols_answer(capsys, tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho \"Reservation $3 not found\" >&2\nexit 1\n")
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    code, output = workshop(capsys, "--participants", "3", "--reservation", "missing")
    assert code == 2
    assert "`scontrol show reservation missing` failed: Reservation missing not found" in output.err


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_the_plan_prints_each_chapter_the_day_and_the_reservation_to_ask_for(capsys):
    code, output = workshop(capsys, "--participants", "4", "--nodes-4gpu", "8", "--nodes-8gpu", "1")
    assert code == 0, output.err
    text = output.out
    assert "Class plan: 4 participants on 8 four-GPU + 1 eight-GPU nodes (40 GPUs)" in text
    for chapter in CLASS_ROLES:
        assert f"\nChapter {chapter} (" in text
    assert "instructor, once before the day: model-parallel/mixtral/tp2-pp4-ep2-sp (16 GPUs)" in text
    assert "The day: " in text and "Smallest reservation that fits" in text and "GPU-hours" in text


# ---- chapter 2 and the day plan page ------------------------------------------------------------------
def test_chapter_2_submits_no_two_node_mixtral_by_default_and_its_plan_fits_the_day():
    from workshop_lib.book.chapter.selection import select
    from workshop_lib.book.plans import time_plan
    from workshop_lib.class_plan.roles import needs_two_large_nodes

    selection = select(2, "ibex")
    assert [e.id for e in selection.runnable] == ["model-parallel/llama/tp2-dp2", "model-parallel/llama/tp4",
                                                  "model-parallel/llama/tp8"]
    assert all("the instructor runs it once before the day" in why for _, why in selection.left_out)
    named = select(2, "ibex", ["model-parallel/mixtral/tp2-pp4-ep2-sp"])
    assert [e.id for e in named.runnable] == ["model-parallel/mixtral/tp2-pp4-ep2-sp"]  # named: it runs
    planned = [e for e in selection.chosen if not needs_two_large_nodes(e)]
    slots = time_plan.queue(time_plan.estimate_chapter(planned))
    assert max(slot.end_s for slot in slots) < 2 * 3600  # the text's "fit a workshop day"


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_the_day_plan_page_shows_the_plans_own_numbers(durations):
    from workshop_lib.book.plans.day_plan import agenda, day_plan_markdown

    text, shown = day_plan_markdown(participants=30, nodes_4gpu=16, nodes_8gpu=2)
    plan = plan_on(class_jobs(30, durations), nodes_of({IBEX_4GPU: 16, IBEX_8GPU: 2}), "x")
    assert f"take **{plan.day_s / 3600:.1f} h**" in text and "(target 5 h: fits)" in text
    frame = agenda(plan)
    assert list(frame["jobs running (min)"]) == [-(-int(d.schedule.makespan_s) // 300) * 5 for d in plan.chapters]
    assert shown.equals(frame)
    assert shown.loc[1, "read from the instructor's runs"] == ("model-parallel/mixtral/tp2-pp4-ep2-sp, "
                                                                "model-parallel/mixtral/tp4-pp2-ep2-sp")


def test_in_a_class_a_chapter_submits_the_participants_own_runs(monkeypatch):
    from workshop_lib.book.chapter.selection import select
    from workshop_lib.core.errors import WorkshopError

    monkeypatch.setenv("WORKSHOP_PARTICIPANT", "9/30")
    names = tuple(f"participant-{i + 1:02d}" for i in range(30))
    first, start = assign(1, names)
    second, _ = assign(2, names, start)
    selection = select(2, "ibex")
    assert [e.id for e in selection.runnable] == [e.id for e in second.by_participant["participant-09"]]
    assert [e.id for e in selection.planned] == [e.id for e in selection.runnable]
    why = dict((e.id, reason) for e, reason in selection.left_out)
    assert "made by participant(s) 10" in why["model-parallel/llama/tp4"]
    assert "the instructor runs it once before the day" in why["model-parallel/mixtral/tp2-pp4-ep2-sp"]
    one = select(1, "ibex")
    assert [e.id for e in one.runnable] == [e.id for e in first.by_participant["participant-09"]]
    assert "lora/llama/8-gpus" not in [e.id for e in one.runnable]  # the instructor's in a class
    for value in ("31/30", "0/30", "seven", "7-30"):
        monkeypatch.setenv("WORKSHOP_PARTICIPANT", value)
        with pytest.raises(WorkshopError, match=r"WORKSHOP_PARTICIPANT is .*K/N"):
            select(1, "ibex")
    monkeypatch.delenv("WORKSHOP_PARTICIPANT")
    assert "lora/llama/8-gpus" in [e.id for e in select(1, "ibex").runnable]  # outside a class: every run
