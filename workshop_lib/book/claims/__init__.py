"""What a chapter says from its data: the generated sentences (sentences.py: each claim a function of the
reference rows, so re-running the references rewrites the text) and the matplotlib plots (plots.py).

May import the book's pages, measurements and tables (and every package below book); the chapter facade and
the figures import it, never the other way round. This face imports nothing.
"""
