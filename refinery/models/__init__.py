"""The models the pipeline trains from the data itself and then applies to documents.

quality.py is the quality classifier and its stage (QualityScorer, a per-document RecordStage
built from a trained model), quality_training.py trains it from the data root's curated and raw
buckets and publishes it, quality_metrics.py measures it on the labelled set. difficulty.py is the
reference n-gram model whose per-document loss the tokenize step records. Each needs a pass over
many documents to train before it can judge one, so neither is a plain per-document stage nor a
global step: they import refinery.stages (the Stage base, stats, attribute tables), and
refinery.global_steps imports them (tests/test_architecture.py).
"""
