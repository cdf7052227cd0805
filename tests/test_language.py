"""language_filtered: lid.176 on the whole text, configured languages above min_score kept."""

import polars as pl
import pytest

from refinery.stages.language import LanguageFilter, LanguageModel, bundled_model_path
from refinery.config import LanguageConfig
from refinery.documents import PROVENANCE_SCHEMA, REJECTS_SCHEMA

EN = "The harbour town wakes slowly when the fishing boats return with the morning tide.\nTraders argue about prices."
FR = "La ville portuaire se réveille lentement quand les bateaux de pêche rentrent avec la marée du matin."
DE = "Die Hafenstadt erwacht langsam, wenn die Fischerboote mit der Morgenflut zurückkehren."
ES = "El pueblo del puerto despierta despacio cuando los barcos de pesca vuelven con la marea de la mañana."


@pytest.fixture(scope="module")
def model():
    return LanguageModel()


def text_table(texts):
    n = len(texts)
    return pl.DataFrame(
        {
            "doc_id": [f"web-a/{i:07d}" for i in range(n)],
            "url": [f"https://harbour.example/{i}" for i in range(n)],
            "source": ["web"] * n,
            "bucket": ["web"] * n,
            "file": ["a.warc.gz"] * n,
            "record_index": list(range(n)),
            "record_offset": [i * 100 for i in range(n)],
            "fetch_time": ["2024-03-01T00:00:00Z"] * n,
            "content_type": ["text/html"] * n,
            "text": texts,
        },
        schema={**PROVENANCE_SCHEMA, "text": pl.String},
    )


@pytest.mark.parametrize("text,lang", [(EN, "en"), (FR, "fr"), (DE, "de"), (ES, "es")])
def test_predicts_the_language(model, text, lang):
    got, score = model.predict(text)
    assert got == lang
    assert 0.65 <= score <= 1.0


def test_the_whole_text_is_read_not_the_first_80_characters(model):
    # 85 characters of French, then many English sentences: the whole text is English.
    text = FR[:85] + "\n" + " ".join([EN.replace("\n", " ")] * 6)
    assert model.predict(FR[:85])[0] == "fr"
    assert model.predict(text)[0] == "en"


def test_lone_surrogates_do_not_crash(model):
    assert model.predict(EN + " \ud800 broken escape")[0] == "en"


def test_stage_keeps_wanted_languages_and_rejects_the_rest_with_reasons(model):
    docs = text_table([EN, FR, DE, "", "12 34 56 78"])
    out = LanguageFilter(LanguageConfig(languages=["en", "de"], min_score=0.65), model).run(docs)
    assert out.documents["doc_id"].to_list() == ["web-a/0000000", "web-a/0000002"]
    assert out.documents["language"].to_list() == ["en", "de"]
    assert out.documents["language_score"].min() >= 0.65
    assert dict(out.rejects.schema) == REJECTS_SCHEMA
    fr = out.rejects.filter(pl.col("doc_id") == "web-a/0000001").row(0, named=True)
    assert (fr["rule"], fr["detail"], fr["stage"]) == ("language/unwanted_language", "fr", "language_filtered")
    assert fr["value"] > 0.65
    assert out.stats.docs_in == 5 and out.stats.docs_out == 2
    assert sum(out.stats.dropped.values()) == 3
    assert out.stats.counters["detected/en"] >= 1


def test_low_score_is_its_own_reason(model):
    out = LanguageFilter(LanguageConfig(languages=["en"], min_score=0.9999), model).run(text_table(["hello there"]))
    assert out.rejects["rule"].to_list() == ["language/low_score"]
    assert out.rejects["detail"].to_list() == ["en"]
    assert out.rejects["value"][0] < 0.9999


def test_model_path_override_and_missing_model(tmp_path):
    assert LanguageFilter.from_config(LanguageConfig(model_path=bundled_model_path())).model.path == bundled_model_path()
    with pytest.raises(FileNotFoundError, match="stages.language.model_path"):
        LanguageModel(str(tmp_path / "missing.ftz"))


def test_skipped_source_keeps_everything_with_null_language_columns():
    docs = text_table([EN, FR])
    out = LanguageFilter(LanguageConfig(), LanguageModel()).run_for_source(docs, ["language"])
    assert out.documents["doc_id"].to_list() == docs["doc_id"].to_list()
    assert out.documents["language"].null_count() == 2
    assert out.documents.schema["language_score"] == pl.Float64
    assert out.stats.counters == {"skipped_by_source": 2}
    assert out.rejects.height == 0
