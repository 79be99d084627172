#!/usr/bin/env bash
# The timing-dependent fault cases (issue 41, item 3), ROUNDS pytest sessions in a row on one local cluster, each in
# a folder of its own (the tests count jobs by working directory, and a cluster remembers the folders of earlier
# rounds' jobs). Load the machine beside it yourself: `make test` and `make demo` in two other clones, say.
#   bash benchmarks/fault_repeats.sh [ROUNDS]        (from the repository root, after `make setup`; as root)
set -uo pipefail
rounds=${1:-20}
export WORKSHOP_SLURM_PORT_BASE=${WORKSHOP_SLURM_PORT_BASE:-7400} PATH="$PWD/.venv/bin:$PATH"
cases=("tests/runs/test_fault_injection.py::test_a_submission_stopped_between_reserving_and_recording_ends_with_one_job[after-submit:int-adopted job]"
       "tests/runs/test_fault_injection.py::test_a_submitter_stopped_while_a_slow_sbatch_has_not_answered_leaves_a_job_that_is_adopted[2]"
       "tests/runs/test_fault_injection.py::test_ctrl_c_before_a_slow_sbatch_submitted_anything_submits_once_on_the_rerun")
workshop cluster up --nodes 2 >/dev/null || exit 1
work=$(mktemp -d)
failed=0
for round in $(seq "$rounds"); do
    printf '== round %s %s load %s: ' "$round" "$(date +%T)" "$(cut -d' ' -f1-3 /proc/loadavg)"
    python -m pytest -q -p no:cacheprovider --basetemp="$work/round-$round" "${cases[@]}" > "$work/round-$round.log" 2>&1 \
        || failed=$((failed + 1))
    tail -1 "$work/round-$round.log"
done
workshop cluster down >/dev/null
echo "$((rounds - failed)) of $rounds rounds passed (logs in $work)"
exit $((failed > 0))
