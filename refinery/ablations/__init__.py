"""Proxy-model ablations (docs/ablations.md): variants of the corpus as selections over the funnel's
stored verdicts (verdicts.py reads them back, selection.py selects), the held-out evaluation set
(eval_set.py), and each variant built as a small data root of its own that the project's Trainer
runs on (build.py)."""
