"""What the book knows of a measured row before it shows it: the one reader of book/reference/*.json
(reference_files.py: every view reads the files there), the series a row belongs to (series.py: one engine on one
kind of card; nothing divides two series) and the memory predictions set beside the measurements
(memory_predictions.py).

May import book.pages and every package below book (estimate for the predictions); tables, reference views,
plans, claims, the calculator's data and the chapter facade import it, never the other way round. This face
imports nothing.
"""
