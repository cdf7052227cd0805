"""The ablation crawl (data/ablations/build_crawl.py): deterministic, and it plants what its ground
truth says: documents where it says, exact and near copies, spam, the languages of each bucket; its
code and math buckets (built here from the committed slices, so the counts hold on any machine) are
real Python source and math-heavy docstrings."""

import ast
import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest
from helpers.generated_pages import article_text

from refinery.config import ExtractConfig, SourceConfig
from refinery.documents import InputShard
from refinery.stages.ingest import read_input_shard
from synthetic.documents import BLOCKLISTED_DOMAINS, jaccard

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("build_crawl", REPO / "data" / "ablations" / "build_crawl.py")
build_crawl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_crawl)


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def crawl(tmp_path_factory) -> tuple[Path, dict, dict[str, dict]]:
    """The crawl built once, its ground truth, and every document read back by ingest, by URL."""
    out = tmp_path_factory.mktemp("crawl")
    truth = build_crawl.build_crawl(out, slices=True)
    docs = {}
    for rel in files(out):
        if rel == "ground_truth.json":
            continue
        fmt = "warc" if ".warc" in rel else "jsonl"
        bucket = rel.split("/")[0]
        src = SourceConfig(name=bucket, path=str(out / rel), format=fmt, bucket=bucket)
        read = read_input_shard(InputShard(f"{bucket}-x", bucket, bucket, str(out / rel)), src, ExtractConfig())
        assert read.rejects.height == 0, rel
        for row in read.documents.iter_rows(named=True):
            assert row["url"] not in docs, row["url"]
            docs[row["url"]] = {**row, "file": rel}
    return out, truth, docs


def test_same_seed_same_bytes_other_seed_other_bytes(crawl, tmp_path):
    out, truth, _ = crawl
    build_crawl.build_crawl(tmp_path / "again", slices=True)
    assert files(tmp_path / "again") == files(out)
    for rel in files(out):
        assert (tmp_path / "again" / rel).read_bytes() == (out / rel).read_bytes(), rel
    build_crawl.build_crawl(tmp_path / "other", seed=38, slices=True)
    assert (tmp_path / "other" / "web" / "web-00.warc.gz").read_bytes() != (out / "web" / "web-00.warc.gz").read_bytes()
    assert json.loads((out / "ground_truth.json").read_text()) == truth


def test_every_document_is_where_the_ground_truth_says(crawl):
    _, truth, docs = crawl
    assert sorted(docs) == sorted(truth["documents"])
    for url, entry in truth["documents"].items():
        assert (docs[url]["file"], docs[url]["record_index"], docs[url]["bucket"]) == (
            entry["file"], entry["record_index"], entry["bucket"]), url
    for file, info in truth["files"].items():
        assert sum(d["file"] == file for d in docs.values()) == info["documents"], file


def test_buckets_kinds_and_languages(crawl):
    _, truth, _ = crawl
    summary = truth["summary"]
    # the curated bucket: data/labelled's 523 high-value pages, nine languages
    assert summary["docs"]["documents"] == summary["docs/clean"]["documents"] == 523
    assert summary["docs"]["languages"] == ["de", "en", "es", "fr", "it", "ja", "pt", "ru", "zh"]
    # web: 445 documentation pages (325 untouched, 60 exact and 60 near bases), 372 low-value pages,
    # 160 spam pages, 120 planted copies
    assert summary["web/clean"]["documents"] + 60 + 60 == 445
    assert summary["web/exact_dup"]["documents"] == summary["web/near_dup"]["documents"] == 120
    assert sum(v["documents"] for k, v in summary.items() if k.startswith("web/low/")) == 372
    assert {k.removeprefix("web/low/") for k in summary if k.startswith("web/low/")} == {
        "catalogue", "changelog", "copyright", "licence", "navigation", "templated", "wordlist"}
    assert summary["web/spam"]["documents"] == len(truth["spam"]) == 160
    assert summary["web"]["documents"] == 445 + 372 + 160 + 120
    assert summary["web"]["languages"] == ["de", "el", "en", "es", "fr", "it", "ja", "ko", "pt", "ro", "ru", "zh"]
    assert summary["web"]["bytes"] + summary["docs"]["bytes"] > 3_000_000
    # the committed slices: 12 standard-library files and 8 modules' docstrings, 110 KB each
    assert (summary["code"]["documents"], summary["math"]["documents"]) == (12, 8)
    assert summary["code"]["languages"] == [] and summary["math"]["languages"] == ["en"]
    assert 100_000 < summary["code"]["bytes"] <= build_crawl.SLICE_BYTES
    assert 100_000 < summary["math"]["bytes"] <= build_crawl.SLICE_BYTES


def test_code_is_python_source_and_math_is_formulas(crawl):
    """Every code document parses as Python, most define functions or classes; every math document is prose
    with formulas (LaTeX or doctests), none of it source code."""
    _, truth, docs = crawl
    code = [d["raw"] for u, d in docs.items() if truth["documents"][u]["bucket"] == "code"]
    math = [d["raw"] for u, d in docs.items() if truth["documents"][u]["bucket"] == "math"]
    assert (len(code), len(math)) == (12, 8)
    trees = [ast.parse(text) for text in code]
    assert sum(any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in ast.walk(t)) for t in trees) >= 10
    for text in math:
        assert len(text) >= build_crawl.MIN_MATH_CHARS and not text.lstrip().startswith(("import ", "from ", "def "))
    assert sum("\\frac" in t or ".. math::" in t for t in math) >= 4
    assert all(">>> " in t for t in math)


def test_code_and_math_extraction_leaves_out_tests_small_files_and_short_docstrings(tmp_path):
    """stdlib_code keeps library files of the size band and leaves out tests, codec tables and
    undecodable files; math_docstrings keeps one document per module with enough docstring text."""
    lib = tmp_path / "lib"
    body = "def f(x):\n    return x\n" * 150  # 3,600 bytes: inside the size band
    for rel, data in {"json/decoder.py": body.encode(), "test/test_json.py": body.encode(),
                      "encodings/cp1.py": body.encode(), "tiny.py": b"x = 1\n",
                      "latin.py": body.encode() + "# caf\xe9\n".encode("latin-1")}.items():
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        (lib / rel).write_bytes(data)
    assert [r["url"] for r in build_crawl.stdlib_code(lib)] == ["https://cpython.example/Lib/json/decoder.py"]
    assert build_crawl.stdlib_code(lib, cap=1000) == []

    pkg = tmp_path / "pkg"
    long_doc = "The integral of x**n is x**(n+1)/(n+1).\n\n" * 60  # 2,400 characters
    for rel, source in {"calc.py": f'"""{long_doc}"""\n\ndef g():\n    """short"""\n',
                        "tests/test_calc.py": f'"""{long_doc}"""\n', "small.py": '"""A short module."""\n',
                        "broken.py": f'"""{long_doc}"""\ndef (:\n'}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(source)
    rows = build_crawl.math_docstrings({"pkg": pkg})
    assert rows == [{"url": "https://pkg.example/calc.py", "text": long_doc.strip()}]


def test_exact_copies_are_identical_pages_in_other_files(crawl):
    _, truth, docs = crawl
    groups = truth["exact_duplicates"]
    assert len(groups) == 60
    for group in groups:
        assert len({docs[u]["raw"] for u in group}) == 1, group
        assert len({docs[u]["file"] for u in group}) == 2, group
    assert {truth["documents"][g[0]]["lang"] for g in groups} <= set(build_crawl.DUPLICATED_LANGUAGES)


def test_near_copies_have_the_recorded_jaccard(crawl):
    _, truth, docs = crawl
    pairs = truth["near_duplicates"]
    assert len(pairs) == 60 and Counter(tuple(p["band"]) for p in pairs) == {(0.8, 0.9): 30, (0.85, 0.95): 30}
    for pair in pairs:
        a, b = docs[pair["a"]], docs[pair["b"]]
        assert jaccard(article_text(a["raw"]), article_text(b["raw"])) == pytest.approx(pair["jaccard"], abs=1e-6)
        assert pair["band"][0] <= pair["jaccard"] <= pair["band"][1]
        assert a["file"] != b["file"]


def test_spam_in_ten_languages_and_on_blocklisted_domains(crawl):
    _, truth, _ = crawl
    spam = truth["spam"]
    assert Counter(s["lang"] for s in spam) == {**{lang: 12 for lang in ("de", "el", "en", "es", "fr", "ja", "ko", "ro", "ru", "zh")}, None: 40}
    assert {s["kind"] for s in spam} >= {"keyword_stuffing", "repeated_line", "link_farm", "lorem_ipsum", "click_here"}
    hosts = [s["url"].split("/")[2] for s in spam]
    assert sum(s["blocklisted_domain"] for s in spam) == sum(h.endswith(BLOCKLISTED_DOMAINS) for h in hosts) == 20
    # none of it is made from the curated pages the evaluation set is drawn from
    assert not any("debian.org" in h for h in hosts)


def test_the_ablations_config_reads_the_crawl_and_names_the_issues_variants(crawl):
    """configs/ablations.yaml's sources match every file the builder writes under its default folder,
    each bucket once, and its variants are the four the bench runs (a rule family alone among them)."""
    import fnmatch

    from refinery.config import load_config

    out, truth, _ = crawl
    cfg = load_config(REPO / "configs" / "ablations.yaml")
    crawl_dir = (REPO / build_crawl.DEFAULT_OUT).resolve()
    matched = {}
    for src in cfg.sources:
        pattern = str(Path(cfg.resolve(src.path)).resolve().relative_to(crawl_dir))
        matched[src.bucket] = sorted(f for f in truth["files"] if fnmatch.fnmatch(f, pattern))
    assert matched == {"web": [f"web/web-{i:02d}.warc.gz" for i in range(4)],
                       "docs": ["docs/docs-00.jsonl.gz", "docs/docs-01.jsonl.gz"],
                       "code": ["code/code-00.jsonl.gz", "code/code-01.jsonl.gz"],
                       "math": ["math/math-00.jsonl.gz", "math/math-01.jsonl.gz"]}
    selections = {name: (v.base, tuple(v.without or ()), v.quality_top) for name, v in cfg.ablations.variants.items()}
    assert selections == {"raw": ("raw", (), None), "funnel": ("funnel", (), None),
                          "without_heuristic": ("funnel", ("heuristic",), None),
                          "without_c4": ("funnel", ("c4",), None)}
    assert cfg.ablations.seeds == 3 and cfg.ablations.eval_buckets in (None, ["docs"])


def test_the_phase_table_shifts_toward_code_and_math_and_every_bucket_is_scored():
    """configs/ablations.yaml's curriculum moves tokens from web to code and math after the main
    phase (what the schedule variants can measure), and every bucket holds out evaluation documents."""
    from refinery.config import load_config
    from refinery.holdout import eval_buckets

    cfg = load_config(REPO / "configs" / "ablations.yaml")
    share = {p.name: p.weights.get("code", 0) + p.weights.get("math", 0) for p in cfg.curriculum.phases}
    assert share["warmup"] <= share["main"] < share["reasoning"] and share["main"] < share["anneal"]
    assert eval_buckets(cfg) == ["web", "docs", "code", "math"]
    assert {name: set(w) for name, w in cfg.ablations.anneal_search.mixtures.items()} == {
        "docs_only": {"docs"}, "even": {"web", "docs", "code", "math"}, "code_math": {"docs", "code", "math"}}
