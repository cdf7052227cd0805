"""Language-aware heuristics: the multilingual corpus (data/multilingual, real Debian documentation
in ten languages plus planted spam) through language ID and heuristic_filtered, per-language rules on
tiny hand-written documents, rule switches, explain mode, and the config checks."""

import gzip
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from refinery.stages.heuristic import HeuristicFilter, Verdict, gopher_quality, gopher_repetition, resolve_rules
from refinery.stages.language import LanguageFilter, load_language_model
from refinery.stages.segment import segmenter, split_script_runs
from refinery.stages.text import DocumentText
from refinery.config import ConfigError, GopherQualityConfig, HeuristicConfig, LanguageConfig, parse_config
from helpers.documents import provenance_frame
from helpers.texts import BRACED_DOC

CORPUS = Path(__file__).resolve().parents[1] / "data" / "multilingual"
REQUIRED_LANGUAGES = {"en", "zh", "ja", "ko", "el", "ro"}
# The corpus is documentation: its man pages quote shell and C snippets, so the source switches
# C4's curly-bracket rule off, as the demo config does for its documentation and code sources.
DOCUMENTATION_RULES_OFF = ["c4/curly_bracket"]


def _pages(name: str) -> list[dict]:
    with gzip.open(CORPUS / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _frame(pages: list[dict]) -> pl.DataFrame:
    return provenance_frame([p["text"] for p in pages], [p["url"] for p in pages], doc_prefix="ml",
                            source="docs", file="multilingual.jsonl.gz")


def _funnel(pages: list[dict], heuristic: HeuristicFilter) -> set[str]:
    """Language ID (every language kept, as `languages: all`), then the heuristics; the kept urls."""
    language = LanguageFilter(LanguageConfig(languages="all"), load_language_model(None)).run(_frame(pages))
    return set(heuristic.run(language.documents).documents["url"])


@pytest.fixture(scope="module")
def corpus():
    clean, spam = _pages("clean"), _pages("spam")
    kept = _funnel(clean + spam, HeuristicFilter(HeuristicConfig(), DOCUMENTATION_RULES_OFF))
    return clean, spam, kept


def _retention(pages: list[dict], kept: set[str]) -> dict[str, float]:
    total, survived = Counter(), Counter()
    for p in pages:
        total[p["lang"]] += 1
        survived[p["lang"]] += p["url"] in kept
    return {lang: survived[lang] / total[lang] for lang in total}


def test_corpus_has_real_pages_in_at_least_eight_languages():
    clean = _pages("clean")
    counts = Counter(p["lang"] for p in clean)
    assert len(counts) >= 8 and REQUIRED_LANGUAGES <= set(counts)
    assert min(counts.values()) >= 30
    assert all(p["kind"] == "clean" and p["package"] for p in clean)
    sources = json.loads((CORPUS / "SOURCES.json").read_text())
    assert {p["package"] for p in clean} <= set(sources["packages"])
    assert all(entry["version"] and entry["licence"] for entry in sources["packages"].values())
    assert sum(f.stat().st_size for f in CORPUS.glob("*.jsonl.gz")) < 1_500_000
    # The Debian handbook, installation guide and reference are held out for an independent check.
    held_out = ("debian-handbook", "installation-guide", "debian-reference")
    pages = clean + _pages("spam")
    assert not [name for name in sources["packages"] for h in held_out if h in name]
    assert not [p["url"] for p in pages for h in held_out if h in p["url"].lower() or h in (p.get("package") or "")]
    titles = ("Debian Administrator's Handbook", "Debian GNU/Linux Installation Guide", "Debian Reference")
    assert not [p["url"] for p in pages for t in titles if t.lower() in p["text"].lower()]


@pytest.mark.parametrize("lang", ["de", "el", "en", "es", "fr", "ja", "ko", "ro", "ru", "zh"])
def test_every_language_keeps_most_of_its_clean_pages(corpus, lang):
    clean, _, kept = corpus
    retention = _retention(clean, kept)
    assert retention[lang] >= 0.80, f"{lang} keeps {retention[lang]:.0%} of its clean pages"
    assert retention[lang] >= 0.85 * retention["en"], retention


@pytest.mark.parametrize("lang", ["de", "el", "en", "es", "fr", "ja", "ko", "ro", "ru", "zh"])
def test_planted_spam_is_removed_in_every_language(corpus, lang):
    _, spam, kept = corpus
    spam = [p for p in spam if p["lang"] == lang]
    assert len({p["kind"] for p in spam}) == 5
    removed = sum(p["url"] not in kept for p in spam) / len(spam)
    assert removed >= 0.98, [p["url"] for p in spam if p["url"] in kept]


def test_english_stop_words_on_other_languages_lose_their_clean_pages():
    """The failure the per-language lists fix: Gopher's English stop words applied to Romanian,
    Korean and German pages drop nearly all of them."""
    clean = [p for p in _pages("clean") if p["lang"] in {"ro", "ko", "de"}]
    english_words = {lang: {"stop_words": "gopher"} for lang in ("ro", "ko", "de")}
    kept = _funnel(clean, HeuristicFilter(HeuristicConfig(languages=english_words), DOCUMENTATION_RULES_OFF))
    retention = _retention(clean, kept)
    assert retention["de"] < 0.2 and retention["ko"] < 0.2 and retention["ro"] < 0.7, retention


# ---- per-language rules on tiny documents ---------------------------------------------------------

RO = (
    "Comanda copiază fișierele din directorul curent în directorul de destinație și păstrează "
    "permisiunile lor. Dacă fișierul există deja, acesta este suprascris fără nicio întrebare, "
    "așa că este bine să verificați mai întâi conținutul directorului. Opțiunea de mai jos arată "
    "fiecare fișier pe măsură ce este copiat, iar la sfârșit se afișează numărul total de fișiere."
)
RO_WITHOUT_STOP_WORDS = " ".join(["fișierele copiate rapid", "directorul nou", "permisiunile vechi", "conținutul salvat"] * 6)
ZH = (
    "这个命令会把当前目录中的文件复制到目标目录，并且保留它们的权限。如果目标文件已经存在，"
    "它会被直接覆盖，所以最好先检查目录的内容。下面的选项会在复制每个文件的时候显示它的名字，"
    "最后还会显示一共复制了多少个文件。我们建议在第一次使用之前仔细阅读这一部分说明。\n"
    "在复制大量文件时，这个选项特别有用。复制完成以后，请检查结果，如果有必要，可以再次运行这个命令。"
    "系统管理员通常会把这些步骤写进脚本里，以便以后重复使用。"
)
JA = (
    "このコマンドは現在のディレクトリにあるファイルを目的のディレクトリにコピーし、"
    "それらの権限を保持します。ファイルがすでに存在する場合は、確認なしに上書きされるので、"
    "最初にディレクトリの内容を確認することをお勧めします。下のオプションを使うと、"
    "コピーされるファイルの名前が一つずつ表示され、最後にファイルの総数が表示されます。"
)
KO = (
    "이 명령은 현재 디렉터리에 있는 파일을 대상 디렉터리로 복사하고 파일의 권한을 그대로 유지합니다. "
    "대상 파일이 이미 있으면 아무것도 묻지 않고 덮어쓰므로 먼저 디렉터리의 내용을 확인하는 것이 좋습니다. "
    "아래 옵션을 사용하면 복사되는 파일의 이름이 하나씩 표시되고 마지막에 전체 파일 수가 표시됩니다. "
    "처음 사용하기 전에 이 설명을 꼭 읽어 보시기 바랍니다.\n"
    "이 옵션은 여러 파일을 한 번에 복사할 때 특히 유용합니다. 복사가 끝나면 결과를 확인하고 필요하면 "
    "명령을 다시 실행하십시오. 시스템 관리자는 보통 이 단계를 스크립트에 적어 두고 나중에 다시 사용합니다."
)
TH = "คำสั่งนี้จะคัดลอกไฟล์จากไดเรกทอรีปัจจุบันไปยังไดเรกทอรีปลายทาง " * 60


def _rules(language: str, cfg: HeuristicConfig = HeuristicConfig()):
    return HeuristicFilter(cfg).rules_for(language)


def _quality(text: str, language: str) -> str | None:
    rules = _rules(language)
    drop = gopher_quality(DocumentText(text, rules.segment), rules.gopher_quality, rules.stop_words,
                          verdict=Verdict(rules.off))
    return None if drop is None else drop.rule


def test_romanian_counts_romanian_stop_words():
    assert _quality(RO, "ro") is None
    assert _quality(RO, "en") == "gopher_quality/stop_words"  # the English list finds none
    assert _quality(RO_WITHOUT_STOP_WORDS, "ro") == "gopher_quality/stop_words"


def test_chinese_is_segmented_with_jieba():
    words = DocumentText(ZH, segmenter("jieba")).words
    assert "目录" in words and "文件" in words and "，" not in words
    assert 100 <= len(words) <= 200
    assert len(DocumentText(ZH).words) == 2  # one whitespace "word" per line without segmentation
    assert _quality(ZH, "zh") is None
    assert _quality(ZH[:40], "zh") == "gopher_quality/min_words"
    assert _quality(ZH, "en") == "gopher_quality/min_words"


def test_rjieba_gives_the_jieba_packages_segments():
    """The segmenter runs jieba-rs; the `jieba` package with HMM off is the reference it must match,
    on every line of the corpus's Chinese and Japanese pages and on the text above."""
    import jieba

    jieba.setLogLevel(60)
    reference = jieba.Tokenizer()
    lines = [line for p in _pages("clean") + _pages("spam") if p["lang"] in ("zh", "ja")
             for line in p["text"].splitlines()] + ZH.splitlines() + ["", " \t", "Linux 2.6 内核，a_b+c#d&e%f-g."]
    split = segmenter("jieba")
    assert len(lines) > 3000
    for line in lines:
        assert split(line) == [w for w in reference.lcut(line, HMM=False) if not w.isspace()], line


def test_japanese_is_split_into_script_runs():
    assert split_script_runs("このコマンドは現在のディレクトリ、Linux 2.6") == [
        "この", "コマンド", "は", "現在", "の", "ディレクトリ", "、", "Linux", "2", ".", "6"]
    assert _quality(JA, "ja") is None
    assert _quality(JA, "en") == "gopher_quality/min_words"


def test_korean_word_length_band_and_stop_words():
    assert _quality(KO, "ko") is None
    assert _quality(KO, "en") == "gopher_quality/stop_words"
    rules = _rules("ko")
    assert (rules.gopher_quality.min_avg_word_length, rules.gopher_quality.max_avg_word_length) == (2.0, 6.5)
    long_words = " ".join(["디렉터리복사권한유지설명서"] * 60)
    assert _quality(long_words, "ko") == "gopher_quality/max_avg_word_length"


def test_thai_switches_word_unit_rules_off():
    rules = _rules("th")
    assert rules.stop_words is None
    assert rules.off == {"gopher_quality/min_avg_word_length", "gopher_quality/max_avg_word_length"}
    # Runs of Thai letters are phrases of 30+ characters: over English's max mean word length.
    assert _quality(TH, "en") == "gopher_quality/max_avg_word_length"
    text, drop = HeuristicFilter(HeuristicConfig()).apply(TH, None, Counter(), "th")
    assert drop is None or not drop.rule.startswith("gopher_quality/")


def test_chinese_repetition_counts_ngrams_of_segmented_words():
    phrase = "购买便宜的手机请点击这里"
    text = (phrase * 40 + "。") + ZH
    rules = _rules("zh")
    assert [n for n, _ in rules.gopher_repetition.top_n_grams] == [4, 6, 8]
    drop = gopher_repetition(DocumentText(text, rules.segment), rules.gopher_repetition)
    assert drop is not None and drop.rule == "gopher_rep/top_4_gram"
    assert gopher_repetition(DocumentText(ZH, rules.segment), rules.gopher_repetition) is None


def test_cjk_sentences_end_without_a_space():
    lines = ["这是第一句。这是第二句。这是第三句。这是第四句。这是第五句，也是最后一句。"]
    text, drop = HeuristicFilter(HeuristicConfig()).apply("\n".join(lines), None, Counter(), "zh")
    assert drop is None or drop.rule != "c4/too_few_sentences"


def test_a_document_without_a_language_reads_as_english():
    assert _rules(None).stop_words == _rules("en").stop_words
    assert len(_rules(None).stop_words) == 8
    # A table without a language column (a source that skips language ID) reads as English too.
    out = HeuristicFilter(HeuristicConfig()).run(_frame([{"url": "a", "text": RO}]))
    assert dict(out.stats.dropped) == {"gopher_quality/stop_words": 1}
    labelled = _frame([{"url": "a", "text": RO}]).with_columns(pl.lit("ro").alias("language"))
    assert dict(HeuristicFilter(HeuristicConfig()).run(labelled).stats.dropped) == {"c4/too_few_sentences": 1}


# ---- rule switches and explain mode --------------------------------------------------------------



def test_rules_off_per_source_keeps_documentation_with_braces():
    assert HeuristicFilter(HeuristicConfig()).apply(BRACED_DOC, None, Counter())[1].rule == "c4/curly_bracket"
    text, drop = HeuristicFilter(HeuristicConfig(), ["c4/curly_bracket"]).apply(BRACED_DOC, None, Counter())
    assert drop is None and "server {" in text


def test_rules_off_per_language():
    cfg = HeuristicConfig(languages={"ro": {"rules_off": ["gopher_quality/stop_words"]}})
    rules = HeuristicFilter(cfg).rules_for("ro")
    assert rules.off == {"gopher_quality/stop_words"}
    doc = DocumentText(RO_WITHOUT_STOP_WORDS)
    assert gopher_quality(doc, rules.gopher_quality, rules.stop_words, verdict=Verdict(rules.off)) is None
    assert gopher_quality(doc, rules.gopher_quality, rules.stop_words).rule == "gopher_quality/stop_words"
    assert HeuristicFilter(HeuristicConfig()).rules_for("ro").off == frozenset()


def test_explain_lists_every_failing_rule_with_value_and_threshold():
    text = "\n".join(["Buy cheap phones now {click} here"] * 20)
    drops = HeuristicFilter(HeuristicConfig()).explain(text, None, "en")
    rules = [d.rule for d in drops]
    assert rules[0] == HeuristicFilter(HeuristicConfig()).apply(text, None, Counter())[1].rule
    assert {"gopher_quality/stop_words", "gopher_rep/dup_line_frac", "c4/curly_bracket"} <= set(rules)
    assert len(rules) == len(set(rules)) >= 5
    dup = next(d for d in drops if d.rule == "gopher_rep/dup_line_frac")
    assert dup.value == pytest.approx(19 / 20) and dup.detail == "> 0.3"
    assert HeuristicFilter(HeuristicConfig()).explain(CLEAN_EN, None, "en") == []


CLEAN_EN = BRACED_DOC.replace("server { port 8080; }", "server, port 8080")


# ---- config ----------------------------------------------------------------------------------------


def _config(stages: dict, **source) -> dict:
    return {
        "data_root": "out",
        "buckets": ["web"],
        "sources": [{"name": "web", "path": "x/*.jsonl", "format": "jsonl", "bucket": "web", **source}],
        "stages": stages,
    }


def test_languages_all_keeps_every_language_above_the_score():
    cfg = parse_config(_config({"language": {"languages": "all", "min_score": 0.5}}))
    assert cfg.stages.language.languages == "all"
    docs = _frame([{"url": "a", "text": RO}, {"url": "b", "text": KO}, {"url": "c", "text": "12 34 56"}])
    out = LanguageFilter(cfg.stages.language, load_language_model(None)).run(docs)
    assert out.documents["language"].to_list() == ["ro", "ko"]
    assert out.rejects["rule"].to_list() == ["language/low_score"]
    with pytest.raises(ConfigError, match="write `languages: all`"):
        parse_config(_config({"language": {"languages": ["en", "all"]}}))


def test_unquoted_norwegian_is_a_config_error_that_says_to_quote_it():
    import yaml

    data = _config(yaml.safe_load("language: {languages: [en, no]}"))
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert "stages.language.languages" in str(err.value) and "write 'no' in quotes" in str(err.value)
    assert parse_config(_config(yaml.safe_load("language: {languages: [en, 'no']}"))).stages.language.languages == ["en", "no"]


def test_unknown_rule_names_are_config_errors_naming_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        parse_config(_config({}, rules_off=["c4/curly_brackets"]))
    message = str(err.value)
    assert "sources[0].rules_off" in message and "'c4/curly_brackets'" in message and "c4/curly_bracket'" in message
    with pytest.raises(ConfigError, match="languages.ro.rules_off"):
        parse_config(_config({"heuristic": {"languages": {"ro": {"rules_off": ["gopher/stop"]}}}}))
    with pytest.raises(ConfigError, match="unknown threshold"):
        parse_config(_config({"heuristic": {"languages": {"ko": {"gopher_quality": {"min_word_len": 2}}}}}))
    cfg = parse_config(_config({}, rules_off=["c4/curly_bracket", "gopher_rep/top_4_gram"]))
    assert cfg.sources[0].rules_off == ["c4/curly_bracket", "gopher_rep/top_4_gram"]


def test_rules_are_resolved_once_per_language_into_a_frozen_set():
    import dataclasses

    cfg = HeuristicConfig(rules_off=["c4/lorem_ipsum"],
                          languages={"zh": {"stop_words": "gopher", "rules_off": ["fineweb/list_ratio"]}})
    rules = resolve_rules(cfg, "zh")
    assert rules.off == {"c4/lorem_ipsum", "fineweb/list_ratio", "gopher_quality/min_avg_word_length"}
    assert rules.stop_words == resolve_rules(cfg, None).stop_words  # the entry's stop_words win over the built-in
    assert rules.segment is not None  # the built-in segmenter stays: the entry does not set one
    with pytest.raises(dataclasses.FrozenInstanceError):
        rules.off = frozenset()
    stage = HeuristicFilter(cfg, ["c4/curly_bracket"])
    assert stage.rules_for("zh") is stage.rules_for("zh")
    assert stage.rules_for("zh").off == rules.off | {"c4/curly_bracket"}

def test_language_overrides_merge_over_the_built_in_ones():
    cfg = HeuristicConfig(languages={"zh": {"gopher_quality": {"min_words": 80}}})
    rules = HeuristicFilter(cfg).rules_for("zh")
    assert rules.gopher_quality.min_words == 80
    assert rules.gopher_quality.max_avg_word_length == 5.0  # the built-in zh band stays
    assert "gopher_quality/min_avg_word_length" in rules.off
    assert rules.segment is not None
    assert HeuristicFilter(cfg).rules_for("en").gopher_quality == GopherQualityConfig()


def test_a_language_override_is_checked_as_the_stage_applies_it_over_the_built_in_band():
    """The config checks a language's thresholds merged as the stage merges them (stage-wide, then the
    built-in ones, then the entry's): a minimum word length of 6 is within the stage-wide band (3-10)
    but above Chinese's built-in maximum of 5, so it is refused at load, not at the first Chinese page."""
    with pytest.raises(ConfigError, match="languages.zh.gopher_quality"):
        parse_config(_config({"heuristic": {"languages": {"zh": {"gopher_quality": {"min_avg_word_length": 6.0}}}}}))
    cfg = parse_config(_config({"heuristic": {"languages": {"zh": {"gopher_quality": {"min_avg_word_length": 4.0}}}}}))
    band = HeuristicFilter(cfg.stages.heuristic).rules_for("zh").gopher_quality
    assert (band.min_avg_word_length, band.max_avg_word_length) == (4.0, 5.0)


def test_committed_spam_regenerates_from_the_clean_pages():
    """The builder's seeded spam generator, rerun on the committed clean pages, gives the committed
    spam pages exactly (clean pages need the Debian packages, so only the spam is rebuilt here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_corpus", CORPUS / "build_corpus.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert builder.spam_pages(_pages("clean")) == _pages("spam")
