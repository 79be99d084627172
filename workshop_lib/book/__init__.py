"""What a chapter shows, by concern (each subpackage's __init__ says what it owns and may import), bottom up:

    pages/         how the book writes things: cells (missing values, numbers), HTML, the chapters' kernels
    measurements/  a measured row's series (one engine on one kind of card) and the memory predictions beside it
    tables/        the seed tables and the added columns, filled from a results frame
    reference/     the views of book/reference/*.json: chapter tables with provenance, NeMo layouts, benchmarks
    claims/        what the data says: generated sentences, matplotlib plots and the figures of a chapter's parts
    parts.py       each chapter's parts (tables and figures), declared as data
    plans/         how long the chapters take (time plan) and the class day plan
    calculator/    the book's memory calculator (runs in the browser)
    chapter/       the notebooks' facade (``from workshop_lib.book.chapter import facade as nb``), the
                   participant's selection, their runs and the class's

May import every package below it (core, experiments, estimate, sites, checks, scripts, jobs, runs, results,
class_plan);
widgets and cli import it, never the other way round (the facade starts the job monitor inside a function).
This face imports nothing: the calculator runs ``workshop_lib.book.calculator.page`` in the browser (Pyodide),
which runs this file first.
"""
