"""How the book writes what it shows: one rule for a missing value and one way to write a number (cells.py),
the HTML of tables, notes and findings (html.py), and the IPC kernels that execute the chapters (kernels.py).

The bottom of book: imports only packages below book (core, results), and book.tables for type hints.
This face imports nothing.
"""
