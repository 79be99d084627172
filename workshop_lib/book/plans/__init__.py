"""How long the chapters take: each chapter's jobs timed on an A100 from the reference runs (time_plan.py) and
the class day plan built from class_plan with those durations, its report and agenda (day_plan.py).

May import book.pages, book.measurements and every package below book; the chapter facade, the book's
day-plan page and the CLI import it. This face imports nothing.
"""
