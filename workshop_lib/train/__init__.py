"""Job-side training code: the entry points that run inside SLURM jobs under torchrun.

Each entry point (``python -m workshop_lib.train.<name>``) writes ``metrics.jsonl`` in its
``--output-dir`` through :mod:`workshop_lib.train.metrics`. Nothing here is imported by the
notebook side of the library, which stays free of torch.
"""
