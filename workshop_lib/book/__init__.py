"""What a chapter shows: the chapter facade the notebooks use as ``nb``, its HTML, the reference
measurements (one series, an engine on one kind of card, per table: ``series``) and their views, the seed
tables, plots and figures, the generated sentences, the memory predictions beside the measurements, the time
plan, the class day plan (day_plan.py: the class plan with the time plan's durations, its report and agenda),
the NeMo reference and the book's memory calculator.

May import every package below it (core, experiments, estimate, sites, checks, scripts, jobs, runs, results,
class_plan);
widgets and cli import it, never the other way round (the facade starts the job monitor inside a function).
This face imports nothing: the calculator runs ``workshop_lib.book.calculator.page`` in the browser (Pyodide),
which runs this file first.
"""
