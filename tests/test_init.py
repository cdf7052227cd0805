"""`refinery init`: formats, buckets and fields found, the budget's maths, and refusals."""

import gzip
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from orchestration.cli import main as refinery
from refinery.config import ConfigError, load_config
from refinery.commands.init import BUDGET_MARGIN, MICRO_BATCH_SIZE, SHORT_SEQ_LEN, plan_curriculum
from refinery.commands.init_sources import scan
from synthetic.crawl import generate_corpus

DOCS = list(generate_corpus(24, seed=3, dup_fraction=0.0, near_dup_fraction=0.0))


def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_formats_buckets_and_fields_are_found(tmp_path):
    data = tmp_path / "My Data"
    write_jsonl_gz(data / "top.jsonl.gz", [{"text": t, "url": u} for u, t in DOCS[:6]])
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"story": t, "uid": f"s{i}"} for i, (_, t) in enumerate(DOCS[6:12])]),
        "test": datasets.Dataset.from_list([{"story": t, "uid": f"t{i}"} for i, (_, t) in enumerate(DOCS[12:14])])})
    dd.save_to_disk(str(data / "Stories-2024" / "hf"))
    (data / "tables").mkdir()
    pq.write_table(pa.table({"n": [1, 2], "label": ["a", "b"]}), data / "tables" / "numbers.parquet")
    (data / "tables" / "readme.md").write_text("notes")
    sources, ignored = scan(str(data))
    assert [(s.name, s.bucket, s.fmt, s.pattern()) for s in sources] == [
        ("stories_2024", "stories_2024", "hf_dataset", "Stories-2024/hf"),
        ("tables", "tables", "parquet", "tables/*.parquet"),
        ("web", "web", "jsonl", "*.jsonl.gz"),
    ]
    assert ignored == ["tables/readme.md"]

    config = tmp_path / "cfg" / "refinery.yaml"
    assert refinery(["init", str(data), "--config", str(config), "--out", str(tmp_path / "out")]) == 0
    text = config.read_text()
    raw = yaml.safe_load(text)
    assert raw["data_root"] == "../out"
    by_name = {s["name"]: s for s in raw["sources"]}
    # A DatasetDict's text column is found by length when no usual name fits; its id column is kept.
    assert by_name["stories_2024"] == {"name": "stories_2024", "path": "../My Data/Stories-2024/hf",
                                       "format": "hf_dataset", "bucket": "stories_2024", "text_field": "story",
                                       "id_field": "uid"}
    # A table with no text column is written commented out, with the reason.
    assert "tables" not in by_name
    assert "# NOT USED: no text field found (fields: ['n', 'label'])" in text
    assert "  # - {name: tables, path: ../My Data/tables/*.parquet, format: parquet, bucket: tables}" in text
    cfg = load_config(config)
    assert sorted(cfg.buckets) == ["stories_2024", "tables", "web"]
    # The curated stories are the quality classifier's positive class, the web its negative.
    assert (cfg.stages.quality.positive_buckets, cfg.stages.quality.negative_buckets) == (["stories_2024"], ["web"])


def test_refusals(tmp_path, capsys):
    assert refinery(["init", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.csv").write_text("x,y\n")
    assert refinery(["init", str(tmp_path / "empty"), "--config", str(tmp_path / "c.yaml")]) == 2
    assert "no WARC, JSONL, Parquet or Hugging Face dataset inputs found (not read: a.csv)" in capsys.readouterr().err
    data = tmp_path / "data"
    write_jsonl_gz(data / "books" / "b.jsonl.gz", [{"content": t} for _, t in DOCS])
    config = tmp_path / "c.yaml"
    config.write_text("# mine\n")
    assert refinery(["init", str(data), "--config", str(config)]) == 2
    assert config.read_text() == "# mine\n"
    assert refinery(["init", str(data), "--config", str(config), "--force"]) == 0
    assert load_config(config).sources[0].text_field == "content"
    write_jsonl_gz(data / "books" / "b.jsonl.gz", [{"content": "A few words."}])
    with pytest.raises(ConfigError, match="too few for a curriculum"):
        from refinery.commands.init import write_config
        write_config(str(data), str(config), force=True, log=lambda _: None)


def test_budget_is_whole_steps_within_the_margin_and_weights_follow_the_estimate():
    estimate = {"web": 60_000, "books": 30_000, "code": 0, "wiki": 9_000}
    plan = plan_curriculum(estimate)
    step = MICRO_BATCH_SIZE * SHORT_SEQ_LEN
    assert plan.seq_len == SHORT_SEQ_LEN
    assert [name for name, _ in plan.phases] == ["main", "anneal"]
    assert all(tokens % step == 0 and tokens > 0 for _, tokens in plan.phases)
    assert plan.total == sum(t for _, t in plan.phases) <= BUDGET_MARGIN * sum(estimate.values())
    assert plan.total > BUDGET_MARGIN * sum(estimate.values()) - 2 * step
    # rounded down to 0.001, the biggest bucket takes the rest; a bucket with no text gets no weight
    assert plan.weights == {"web": 0.607, "books": 0.303, "wiki": 0.09}
    assert sum(plan.weights.values()) == pytest.approx(1.0, abs=1e-9)


def multilingual_pages() -> dict[str, list[dict]]:
    with gzip.open(MULTILINGUAL, "rt", encoding="utf-8") as f:
        pages = [json.loads(line) for line in f]
    by_lang: dict[str, list[dict]] = {}
    for p in pages:
        by_lang.setdefault(p["lang"], []).append({"text": p["text"], "url": p["url"]})
    return by_lang


def test_the_main_language_of_one_file_is_kept_and_compressed_files_join_their_plain_ones(tmp_path, capsys):
    """The issue's corpus in small: a Japanese Parquet file beside two Russian ones (3 of 43 sampled
    documents, 7%, under 10% of the sample and of its source's), and JSONL beside JSONL.gz in one folder."""
    by_lang = multilingual_pages()
    data = tmp_path / "corpus"
    (data / "manuals").mkdir(parents=True)
    for name, rows in {"a_ru.parquet": by_lang["ru"][:20], "b_ja.parquet": by_lang["ja"][:3],
                       "c_ru.parquet": by_lang["ru"][20:40]}.items():
        pq.write_table(pa.table({"text": [r["text"] for r in rows], "url": [r["url"] for r in rows]}),
                       data / "manuals" / name)
    (data / "notes").mkdir()
    (data / "notes" / "plain.jsonl").write_text("".join(json.dumps(r) + "\n" for r in by_lang["en"][:10]))
    write_jsonl_gz(data / "notes" / "packed.jsonl.gz", by_lang["en"][10:20])
    config = tmp_path / "refinery.yaml"
    assert refinery(["init", str(data), "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    raw = yaml.safe_load(config.read_text())
    assert raw["stages"]["language"]["languages"] == ["ru", "en", "ja"]
    assert "  ja          3   4.8%       3 clean after the heuristics  kept" in printed

    by_name = {s["name"]: s for s in raw["sources"]}
    assert sorted(by_name) == ["manuals", "notes"], "one source per folder and format, gzip or not"
    assert by_name["notes"]["path"] == "corpus/notes/*.jsonl*"
    cfg = load_config(config)
    from refinery.documents.inputs import input_files
    assert [Path(p).name for p in input_files(cfg)["notes"]] == ["packed.jsonl.gz", "plain.jsonl"]
    assert "2 of 2 input(s) sampled through the funnel: 20 of 20 records clean" in config.read_text()


def test_the_language_rule_is_the_one_documented():
    from refinery.commands.init_sources import keeps_language

    assert not keeps_language(2, 0.9, 1.0, True), "fewer than 3 documents is language ID's noise"
    assert keeps_language(3, 0.1, 0.0, False)
    assert not keeps_language(3, 0.09, 0.24, False), "a few pages picked up along the way"
    assert keeps_language(3, 0.01, 0.25, False)
    assert keeps_language(3, 0.01, 0.05, True), "the main language of one sampled file"
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert ("keeps those of at least 3 sampled documents that are 10% of the sample, or the main language or 25% "
            "of one source's or sampled file's sample") in " ".join(readme.split())


def test_config_and_data_root_inside_the_folder_are_not_inputs(tmp_path, monkeypatch):
    data = tmp_path / "d"
    write_jsonl_gz(data / "books" / "b.jsonl.gz", [{"text": t} for _, t in DOCS])
    (data / "refinery-out" / "documents").mkdir(parents=True)  # a previous run's tables
    pq.write_table(pa.table({"text": ["an earlier run's output " * 10]}), data / "refinery-out" / "documents" / "t.parquet")
    monkeypatch.chdir(data)
    assert refinery(["init", "."]) == 0
    assert refinery(["init", ".", "--force"]) == 0
    cfg = load_config(data / "refinery.yaml")
    assert cfg.buckets == ["books"] and [(s.name, s.path) for s in cfg.sources] == [("books", "books/*.jsonl.gz")]
    assert "Not read" not in (data / "refinery.yaml").read_text()  # nor is the config itself listed


def test_a_source_the_run_would_refuse_is_written_commented_out(tmp_path):
    """Parquet files whose text column is missing from one of them: init finds the column the files
    share, or says why the source is left out, and the config still loads."""
    data = tmp_path / "data"
    write_jsonl_gz(data / "books" / "b.jsonl.gz", [{"text": t} for _, t in DOCS])
    (data / "wiki").mkdir()
    pq.write_table(pa.table({"body": [t for _, t in DOCS[:4]]}), data / "wiki" / "a.parquet")
    pq.write_table(pa.table({"content": [t for _, t in DOCS[4:8]]}), data / "wiki" / "b.parquet")
    (data / "broken").mkdir()
    (data / "broken" / "x.parquet").write_bytes(b"PAR1 not really")
    config = tmp_path / "refinery.yaml"
    assert refinery(["init", str(data), "--config", str(config)]) == 0
    text = config.read_text()
    assert "# NOT USED: no text column that every file has (a.parquet: ['body']; b.parquet: ['content'])" in text
    assert "# NOT USED: x.parquet could not be read" in text
    assert [s.name for s in load_config(config).sources] == ["books"]


MULTILINGUAL = Path(__file__).resolve().parents[1] / "data" / "multilingual" / "clean.jsonl.gz"


def write_man_pages(root: Path) -> None:
    """The issue's man-page corpus in small: 40 pages each of de, fr and ja, the 7 zh pages of which
    5 quote C with braces and a template's placeholder, 4 English pages (3% of the sample) in a folder of their own, 2 Korean pages
    in another, 3 Spanish pages among the French ones (what a crawl picks up along the way) and one
    Romanian page among the German ones (language ID noise, as far as init can tell)."""
    with gzip.open(MULTILINGUAL, "rt", encoding="utf-8") as f:
        pages = [json.loads(line) for line in f]
    by_lang: dict[str, list[dict]] = {}
    for p in pages:
        by_lang.setdefault(p["lang"], []).append(p)
    # C4's rule reads a brace in C or a synopsis as code now (refinery/stages/heuristic/c4.py), so the
    # braced pages also get a template's placeholder in a prose line, which it still drops.
    braced = [{**p, "text": p["text"] + "\n把 {名字} 换成用户的名字，页面会替你填写它。"} for p in by_lang["zh"] if "{" in p["text"]]
    plain = [p for p in by_lang["zh"] if "{" not in p["text"]]
    folders = {"de": by_lang["de"][:40] + by_lang["ro"][:1], "fr": by_lang["fr"][:40] + by_lang["es"][:3], "ja": by_lang["ja"][:40],
               "zh": braced + plain[:2], "en": [p for p in by_lang["en"] if "{" not in p["text"]][:4],
               "ko": by_lang["ko"][:2]}
    assert len(braced) == 5
    for folder, rows in folders.items():
        (root / "man" / folder).mkdir(parents=True)
        (root / "man" / folder / "pages.jsonl").write_text(
            "".join(json.dumps({"text": p["text"], "url": p["url"]}) + "\n" for p in rows))


def test_init_lists_every_language_it_found_and_says_what_it_left_out(tmp_path, capsys):
    data = tmp_path / "corpus"
    write_man_pages(data)
    config = tmp_path / "refinery.yaml"
    assert refinery(["init", str(data), "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    text = config.read_text()
    raw = yaml.safe_load(text)
    # Every language a folder is largely in is kept, English at 3% of the sample included.
    assert raw["stages"]["language"]["languages"] == ["de", "fr", "ja", "zh", "en"]
    table = [
        "languages in the 137 sampled documents language ID named (fastText lid.176, score >= 0.65):",
        "  de         40  29.2%      39 clean after the heuristics  kept",
        "  fr         40  29.2%      39 clean after the heuristics  kept",
        "  ja         40  29.2%      39 clean after the heuristics  kept",
        "  zh          7   5.1%       2 clean after the heuristics  kept",
        "  en          4   2.9%       4 clean after the heuristics  kept",
        "  es          3   2.2%       3 clean after the heuristics  LEFT OUT: under 10% of the sample; no source's "
        "or file's main language or 25% of it",
        "  ko          2   1.5%       2 clean after the heuristics  LEFT OUT: fewer than 3 documents",
        "  ro          1   0.7%       1 clean after the heuristics  LEFT OUT: fewer than 3 documents",
    ]
    assert "\n".join(f"    # {line}" for line in table) in text, "the config lists every language found"
    assert "\n".join(table) in printed, "and init prints the same table"
    assert ("# Kept: a language of at least 3 sampled documents that is 10% of them, or the main language or 25% of "
            "one source's or sampled file's:") in text

    # Sources in one bucket are named after their folders and formats.
    by_name = {s["name"]: s for s in raw["sources"]}
    assert sorted(by_name) == [f"man_{lang}_jsonl" for lang in ("de", "en", "fr", "ja", "ko", "zh")]
    assert by_name["man_ko_jsonl"]["path"] == "corpus/man/ko/*.jsonl"
    # The source a rule removes 10% or more of says so, with the share of bytes, an example and the switch.
    zh_notes = [
        "  # man_zh_jsonl: 1 file in man/zh/, ",
        "  # 1 of 1 input(s) sampled through the funnel: 2 of 7 records clean under this config; removed by "
        "c4/curly_bracket 5",
        "  # c4/curly_bracket removes 5 of the 7 sampled records (71%), 97% of the bytes the heuristics judged, e.g. "
        "man://zh_CN/ar.1; if that is how these documents are meant to look (documentation, code), switch it off "
        "for this source with  rules_off: [c4/curly_bracket]",
    ]
    at = text.index(zh_notes[0])
    assert text[at:].split("\n")[1:3] == zh_notes[1:]
    assert ("man_zh_jsonl: c4/curly_bracket removes 5 of the 7 sampled records (71%), 97% of the bytes the "
            "heuristics judged, e.g. man://zh_CN/ar.1; if that is how these "
            "documents are meant to look (documentation, code), switch it off for this source with  "
            "rules_off: [c4/curly_bracket]") in printed
    ko_note = ("language/unwanted_language removes 2 of the 2 sampled records (100%): they are in ko, left out of "
               "stages.language.languages; add it there to keep them")
    assert f"  # {ko_note}" in text and f"man_ko_jsonl: {ko_note}" in printed
    # The Romanian and Spanish pages go with the languages left out; the German and French ones stay.
    assert ("39 of 41 records clean under this config; removed by c4/too_few_sentences 1, "
            "language/unwanted_language 1\n") in text
    assert ("39 of 43 records clean under this config; removed by language/unwanted_language 3, "
            "c4/too_few_sentences 1\n") in text
    assert "  # 1 of 1 input(s) sampled through the funnel: 4 of 4 records clean under this config\n" in text

    # The suggested switch is one the config accepts, and it keeps the braced pages.
    raw["sources"] = [{**s, "rules_off": ["c4/curly_bracket"]} if s["name"] == "man_zh_jsonl" else s
                      for s in raw["sources"]]
    config.write_text(yaml.safe_dump(raw))
    assert load_config(config).sources[-1].rules_off == ["c4/curly_bracket"]


def test_a_symlink_loop_and_a_fifo_are_rejected_alone(tmp_path, capsys):
    """Issue 38: a symlink loop crashed init (OSError traceback), and a FIFO beside good files had
    their whole folder left out as 'does not exist'. Now each bad entry is named and skipped, its
    folder's files are sampled and used, and the run's preflight names only the bad entries."""
    import os

    data = tmp_path / "d"
    write_jsonl_gz(data / "books" / "b.jsonl.gz", [{"text": t, "url": u} for u, t in DOCS[:12]])
    write_jsonl_gz(data / "web" / "w.jsonl.gz", [{"text": t, "url": u} for u, t in DOCS[12:]])
    (data / "books" / "loop.jsonl.gz").symlink_to("loop.jsonl.gz")
    os.mkfifo(data / "web" / "pipe.jsonl.gz")
    config = tmp_path / "cfg" / "refinery.yaml"
    assert refinery(["init", str(data), "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line.strip() for line in err.splitlines()[1:]] == [
        f"sources[0].path: {data / 'books' / 'loop.jsonl.gz'} is a symlink loop; narrow the glob so it matches only files",
        f"sources[1].path: {data / 'web' / 'pipe.jsonl.gz'} is a FIFO; narrow the glob so it matches only files",
    ]
    text = config.read_text()
    assert [s["name"] for s in yaml.safe_load(text)["sources"]] == ["books", "web"]
    assert ("  # Not read (not regular files; a source whose glob matches one is refused by the run): "
            "books/loop.jsonl.gz (a symlink loop), web/pipe.jsonl.gz (a FIFO)") in text


def test_a_rule_that_removes_15_percent_of_a_source_is_named_with_an_example(tmp_path, capsys):
    pages = multilingual_pages()["en"][:20]
    braced = {i: {**p, "text": p["text"] + "\nThe key is written as {name} in the file, once per line."}
              for i, p in enumerate(pages) if i in (2, 9, 15)}
    rows = [braced.get(i, p) for i, p in enumerate(pages)]
    (tmp_path / "corpus" / "guides").mkdir(parents=True)
    (tmp_path / "corpus" / "guides" / "pages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "refinery.yaml"
    assert refinery(["init", str(tmp_path / "corpus"), "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    note = next(line for line in printed.splitlines() if "c4/curly_bracket removes" in line)
    assert note.startswith("guides: c4/curly_bracket removes 3 of the 20 sampled records (15%), ")
    assert f"e.g. {pages[2]['url']}" in note and note.endswith("rules_off: [c4/curly_bracket]")
    assert f"  # {note.removeprefix('guides: ')}" in config.read_text()


def test_languages_of_files_outside_the_sample_are_kept_and_url_fields_found_by_name_and_content(tmp_path, capsys):
    """Eight files in a bucket: init reads the first, middle and last whole (English here), and the
    first documents of every other one, where the French, Russian and German are."""
    by_lang = multilingual_pages()
    folder = tmp_path / "corpus" / "docs"
    folder.mkdir(parents=True)
    langs = ["en", "fr", "fr", "ru", "en", "ru", "de", "en"]
    taken: dict[str, int] = {}
    for i, lang in enumerate(langs):
        rows = by_lang[lang][taken.get(lang, 0):taken.get(lang, 0) + 5]
        taken[lang] = taken.get(lang, 0) + 5
        pq.write_table(pa.table({"text": [r["text"] for r in rows], "page_url": [r["url"] for r in rows]}),
                       folder / f"part-{i}.parquet")
    (tmp_path / "corpus" / "notes").mkdir()
    (tmp_path / "corpus" / "notes" / "n.jsonl").write_text("".join(
        json.dumps({"body": r["text"], "location": r["url"]}) + "\n" for r in by_lang["en"][40:50]))
    config = tmp_path / "refinery.yaml"
    assert refinery(["init", str(tmp_path / "corpus"), "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    raw = yaml.safe_load(config.read_text())
    assert set(raw["stages"]["language"]["languages"]) == {"en", "fr", "ru", "de"}
    assert "3 of 8 input(s) sampled through the funnel" in config.read_text()
    assert "(5 of them the first of files outside the sample)" in printed  # de: part-6 alone
    by_name = {s["name"]: s for s in raw["sources"]}
    assert by_name["docs"]["url_field"] == "page_url"
    assert by_name["notes"]["url_field"] == "location"  # by its values: every one an https URL
