"""The one #SBATCH parser: directives read the way sbatch reads them."""

from workshop_lib.checks.sbatch import read_header, sbatch_request


def test_directives_stop_at_the_first_command_and_the_command_line_wins():
    text = ("#!/bin/bash\n#SBATCH --job-name=demo\n#SBATCH -o logs/%x-%j.out  # comment\n"
            "#SBATCH --gres=gpu:a100:4\necho hi\n#SBATCH --time=5\n")
    header = read_header(text)
    assert header.get("time") is None and header.after_command_lines == (6,)  # sbatch ignores it
    assert header.get("output") == "logs/%x-%j.out" and header.line("output") == 3
    assert header.gpus_per_node == 4 and header.first_command_line == 5
    request = sbatch_request(text, ["-t", "10", "--job-name", "other"])
    assert (request.get("time"), request.get("job-name"), request.line("job-name")) == ("10", "other", None)


def test_a_glued_directive_is_a_comment_to_sbatch():
    header = read_header("#!/bin/bash\n#SBATCH --constraint=a100,4gpus#SBATCH --mem=160G\n")
    assert header.get("constraint") == "a100,4gpus" and header.get("mem") is None
    assert header.glued_lines == (2,)


def test_short_long_quoted_and_flag_options():
    header = read_header('#SBATCH -N2 -n 8 --exclusive --job-name "my job" -c4\n'
                         "#SBATCH --tasks-per-node=4 --requeue --gpus-per-node 2\n")
    assert [(d.option, d.value) for d in header.on_line(1)] == [
        ("nodes", "2"), ("ntasks", "8"), ("exclusive", ""), ("job-name", "my job"), ("cpus-per-task", "4")]
    assert header.get("ntasks-per-node") == "4" and header.get("requeue") == "" and header.gpus_per_node == 2


def test_gpus_per_node_forms():
    assert read_header("#SBATCH --gres=gpu:2\n").gpus_per_node == 2
    assert read_header("#SBATCH -G 3\n").gpus_per_node == 3
    assert read_header("#SBATCH --gres=gpu\n").gpus_per_node == 1
    assert read_header("#SBATCH --nodes=1\n").gpus_per_node == 0
