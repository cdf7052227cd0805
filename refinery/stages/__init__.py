"""The funnel's per-document stages as plain Python over polars tables, with no Dagster import:
each stage sees a batch of documents and decides each document alone.

Floors, bottom up: isolated_child.py (the killable worker process's side, importing only
refinery/parent_death.py of the library) and stats.py (StageStats, Drop, reject rows) <- isolation.py (per-record error and
timeout rejects, the killable worker process) <- base.py (Stage, RecordStage, Filter, Chain) <- the
stages: ingest.py over readers/ (one module per input format), extract.py, language.py,
heuristic/ (one module per rule family over text.py's shared document split), custom.py, safety.py
and pii.py. registry.py names every funnel stage once. attributes.py stores the documents of the
stages between extracted_text and pii_redacted as attribute tables and reads any stage's documents
back (`stage_batches`). The steps over the whole corpus (dedup, tokenize, shuffle) are in
refinery.global_steps and the trained models (quality, difficulty) in refinery.models; this package
imports neither. assets/ wraps them in Dagster assets.
"""
