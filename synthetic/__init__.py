"""Synthetic inputs for tests, benchmarks and the data/ builders: the seeded sample crawl and benchmark
corpora (crawl.py), and synthetic curricula for the trainer (curriculum.py). Not part of the
installed runtime packages (pyproject.toml); the checkout's root puts it on the path."""
