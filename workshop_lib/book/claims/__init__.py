"""What a chapter says from its data: the generated sentences (sentences.py: each claim a function of the
reference rows, so re-running the references rewrites the text), the matplotlib plots (plots.py) and the
figures a chapter part shows (figures.py, from plots and the run's results).

May import the book's pages, measurements and tables (and every package below book); the chapter facade and
the parts import it, never the other way round. This face imports nothing.
"""
