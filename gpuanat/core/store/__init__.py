"""What is kept: the SQLite history, writes that wait for it, reports, comparisons, the sweep's experiments."""
