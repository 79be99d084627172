"""The chapter notebooks' side of the book: the facade they use as ``nb`` (facade.py: show scripts and findings,
submit and wait, show a part's reference, your runs and the class's), which experiments a participant runs
(selection.py), the participant's own runs (your_runs.py) and the class's shared runs (class_runs.py).

May import every other part of book (pages, measurements, tables, reference, claims, figures, parts, plans)
and every package below book; the facade alone imports widgets (the live job monitor, inside a function).
Nothing in book imports it. This face imports nothing.
"""
