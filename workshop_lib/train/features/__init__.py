"""The mechanisms behind a training recipe's features, one module per kind of change.

Owns: per-batch padding and length grouping (``data``), the chunked and Liger cross-entropy (``loss``),
BLOOM's SDPA attention and tanh-GELU (``bloom``), the ways to ``torch.compile`` a model (``compile``).
The CUDA graphs feature keeps its own module, ``workshop_lib.train.graphs``, where notes and notebooks
point. Which feature applies where, and in what order, is declared in ``workshop_lib.train.recipes``;
nothing here knows of recipes.
May import: torch, transformers (inside functions), workshop_lib.core and workshop_lib.train.
"""
