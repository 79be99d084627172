"""NeMo step lines, resolved arguments and LoRA parameter summaries, on clean and damaged logs."""

from pathlib import Path

from workshop_lib.core.log_text import read_text
from workshop_lib.results.parse.nemo import parse_nemo_log, parse_step

SAMPLES = Path(__file__).parents[1] / "samples" / "nemo"


def test_step_lines_of_a_clean_log():
    log = parse_nemo_log(read_text(SAMPLES / "llama_lora_2gpus.out"))
    assert [step.global_step for step in log.steps] == list(range(10))
    first, last = log.steps[0], log.last_step
    assert first.consumed_samples is None  # NeMo leaves it out of the first line
    assert first.train_step_timing_s == 7.126
    assert (last.iteration, last.last_iteration) == (9, 9)
    assert last.reduced_train_loss == 0.1058
    assert last.train_step_timing_s == 1.608
    assert last.consumed_samples == 80 and last.global_batch_size == 8
    assert last.val_loss == 0.194
    assert log.skipped_lines == 0


def test_resolved_arguments_join_wrapped_values():
    arguments = parse_nemo_log(read_text(SAMPLES / "llama_lora_2gpus.out")).resolved_arguments
    assert arguments["data"] == "SquadDataModule(seq_length=2048, micro_batch_size=1, global_batch_size=8)"
    assert arguments["trainer"] == "Trainer(devices=2, max_steps=10, val_check_interval=10)"
    assert "dim=32" in arguments["peft"]
    assert set(arguments) == {"data", "log", "model", "optim", "peft", "resume", "trainer", "tokenizer"}


def test_seed_table_with_ascii_borders():
    # The seeds' own example mixes '|' and '│' borders and has no bottom rule.
    text = (
        "┃ Argument Name    ┃ Resolved Value                                              ┃\n"
        "┡━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩\n"
        "|strateg           │ MegatronStrategy(tp=1, pp=1, ep=2, sequence_parallel=False) |\n"
        "|resume            │ path=/ibex/project/.../mixtral/model                        |\n"
        "Training epoch 0, iteration 0/0 | global_step: 0 | reduced_train_loss: 1.0 | train_step_timing in s: 2.0\n"
    )
    log = parse_nemo_log(text)
    assert log.resolved_arguments == {
        "strateg": "MegatronStrategy(tp=1, pp=1, ep=2, sequence_parallel=False)",
        "resume": "path=/ibex/project/.../mixtral/model",
    }
    assert len(log.steps) == 1


def test_parameter_summaries_before_and_after_lora():
    log = parse_nemo_log(read_text(SAMPLES / "llama_lora_2gpus.out"))
    before, after = log.before_lora, log.after_lora
    assert len(log.parameter_summaries) == 2
    assert before.trainable_params == before.total_params == 8_000_000_000
    assert before.non_trainable_params == 0
    assert before.estimated_size_mb == 32121.045
    assert after.trainable_params == 21_000_000
    assert after.non_trainable_params == 8_000_000_000
    assert after.modules_in_train_mode == 905 and before.modules_in_train_mode == 649
    assert 0.002 < after.trainable_fraction < 0.003


def test_interleaved_ranks_keep_every_complete_step_once():
    log = parse_nemo_log(read_text(SAMPLES / "interleaved_ranks.out"))
    # step 3 was cut by another rank's message; the last line is garbled bytes.
    assert [step.global_step for step in log.steps] == [0, 1, 2, 4]
    assert log.steps[2].train_step_timing_s == 1.0  # value read up to the intruding message
    assert log.last_step.val_loss == 1.7
    assert log.skipped_lines == 2


def test_truncated_log_at_every_length_never_crashes():
    text = read_text(SAMPLES / "llama_lora_2gpus.out")
    complete = len(parse_nemo_log(text).steps)
    counts = []
    for cut in range(0, len(text), 97):
        log = parse_nemo_log(text[:cut])
        assert all(step.reduced_train_loss >= 0 for step in log.steps)
        counts.append(len(log.steps))
    assert counts == sorted(counts) and counts[-1] <= complete


def test_a_line_without_required_fields_is_not_a_step():
    assert parse_step("Training epoch 0, iteration 3/9 | lr: 1e-05 | global_batch_size: 8") is None
    assert parse_step("Training epoch 0, iteration 3/9 | global_step: 3 | reduced_train_loss: x | "
                      "train_step_timing in s: 1.0") is None
