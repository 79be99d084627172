"""Job-side training code: the entry points that run inside SLURM jobs under torchrun.

The entry points (``python -m workshop_lib.train.<name>``: hf, lora, parallel, gpt, bandwidth,
nemo_finetune, rehearsal) are module paths job scripts run, so they never move. The training ones write
``metrics.jsonl`` in their ``--output-dir`` through :mod:`workshop_lib.train.metrics`. A bad flag ends
with status 2 and one ``error:`` line (:mod:`workshop_lib.train.flags`). A Hugging Face Trainer run's
recipe is declared in :mod:`workshop_lib.train.recipes`; its features' mechanisms live in
``workshop_lib.train.features``.
Owns: the entry points, models, data, training loops, sharding, measurement on the job side, and where
DeepSpeed's compiled ops live (one folder per environment, :mod:`workshop_lib.train.extensions`).
May import: workshop_lib.core and itself (the rehearsal stand-in also reads workshop_lib.experiments).
Nothing here is imported by the notebook side of the library, which stays free of torch.
"""
