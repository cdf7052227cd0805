"""The funnel's stages as plain Python over polars tables, with no Dagster import.

Floors, bottom up: stats.py (StageStats, Drop, reject rows) <- isolation.py (per-record error and
timeout rejects, the killable worker process) <- base.py (Stage, RecordStage, Filter, Chain) <- the
stages: ingest.py over readers/ (one module per input format), extract.py, language.py,
heuristic/ (one module per rule family over text.py's shared document split), custom.py,
exact_dedup.py, near_dedup.py and minhash.py over dedup_compute.py, quality.py, safety.py and
pii.py, tokenize.py, shuffle.py. attributes.py stores the documents of the stages between
extracted_text and pii_redacted as attribute tables and reads any stage's documents back
(`stage_batches`). assets/ wraps them in Dagster assets.
"""
