"""Words both sides of the workshop share: the notebook side (experiments to book) and the job side (train/).

Owns: errors, the checkout's paths (the reference folder too), NeMo's resolved recipes (reference), durations,
GPU cards, the metrics file's schema, reading log text and the shared vocabulary.
May import: the standard library only (no other part of workshop_lib); the memory calculator ships these
modules to the browser, and train/ imports nothing else of the library.
"""
