"""One module per log format a run leaves: Trainer output and state (hf), metrics.jsonl (metrics), NeMo's log
(nemo), nvidia-smi CSV (nvidia_smi), psrecord (psrecord), nccl-tests (nccl). Each turns text into values and
names every line it could not read. May import: core only (the job footer's parser is jobs.footer)."""
