"""Issue 26: config values that used to pass the preflight and fail later (a NaN weight, a negative
threshold, a vocabulary the BPE trainer aborts on, an alias bomb, a deep nest, a data root inside a
source glob, names with control characters, globs matching what is not a file, a table without its
text column, an S3 data root without credentials) are each refused before any work, naming the field
or file, with exit status 2 and no traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from orchestration.cli import main
from refinery import commands, preflight

from helpers.configs import demo_config

REFUSED = "found before any work started; nothing was run or written"


def write_text(tmp_path: Path, text: str) -> str:
    path = tmp_path / "refinery.yaml"
    path.write_text(text)
    return str(path)


def refused(capsys, tmp_path: Path, data: dict | str, command: str = "demo") -> str:
    """Run `refinery COMMAND --config` in process; assert exit 2, no traceback and nothing under
    the data root; return stderr."""
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    assert main([command, "--config", write_text(tmp_path, text)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert REFUSED in err
    root = tmp_path / "out"
    assert not root.exists() or not any(root.iterdir()), sorted(root.rglob("*"))
    return err


def jsonl_source(path: str, name: str = "extra", bucket: str = "web", fmt: str = "jsonl") -> dict:
    return {"name": name, "path": path, "format": fmt, "bucket": bucket}


# ---- finite numbers and ranges ----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["demo", "validate", "train"])
def test_nan_curriculum_weight(tmp_path, capsys, command):
    data = demo_config(tmp_path / "out")
    data["curriculum"]["phases"][0]["weights"]["web"] = float("nan")
    err = refused(capsys, tmp_path, data, command)
    assert "  curriculum.phases[0].weights.web: nan is not a finite number; give a number (YAML's .nan and .inf are refused)" in err


def test_nan_heuristic_thresholds_stage_wide_and_per_language(tmp_path, capsys):
    data = demo_config(tmp_path / "out")
    heuristic = data["stages"].setdefault("heuristic", {})
    heuristic.setdefault("gopher_quality", {})["min_alpha_words_ratio"] = float("nan")
    heuristic.setdefault("languages", {})["de"] = {"fineweb": {"line_punct_thr": float("nan")}}
    err = refused(capsys, tmp_path, data)
    assert "  stages.heuristic.gopher_quality.min_alpha_words_ratio: nan is not a finite number" in err
    assert "  stages.heuristic.languages.de.fineweb.line_punct_thr: nan is not a finite number" in err


def test_infinite_record_timeout(tmp_path, capsys):
    data = demo_config(tmp_path / "out")
    data["stages"]["record_timeout_s"] = float("inf")
    err = refused(capsys, tmp_path, data)
    assert "  stages.record_timeout_s: inf is not a finite number" in err


def test_record_timeout_beyond_an_hour(tmp_path, capsys):
    data = demo_config(tmp_path / "out")
    data["stages"]["record_timeout_s"] = 86_400
    err = refused(capsys, tmp_path, data)
    assert "  stages.record_timeout_s: Input should be less than or equal to 3600" in err


def test_integer_beyond_64_bits(tmp_path, capsys):
    data = demo_config(tmp_path / "out")
    data["seed"] = 10**40
    err = refused(capsys, tmp_path, data)
    assert f"  seed: {10**40} does not fit in 64 bits" in err


@pytest.mark.parametrize("field, value, message", [
    ("c4.max_word_length", -1, "stages.heuristic.c4.max_word_length: Input should be greater than or equal to 1"),
    ("c4.min_words_per_line", -3, "stages.heuristic.c4.min_words_per_line: Input should be greater than or equal to 0"),
    ("gopher_quality.max_bullet_lines_ratio", 1.5,
     "stages.heuristic.gopher_quality.max_bullet_lines_ratio: Input should be less than or equal to 1"),
    ("gopher_repetition.dup_line_frac", -0.1,
     "stages.heuristic.gopher_repetition.dup_line_frac: Input should be greater than or equal to 0"),
    ("gopher_repetition.top_n_grams", [[0, 0.2]], "stages.heuristic.gopher_repetition.top_n_grams: item 0: n 0.0 is "
     "not a whole number of words >= 1"),
    ("gopher_repetition.dup_n_grams", [[5, 2.0]], "stages.heuristic.gopher_repetition.dup_n_grams: item 0: fraction "
     "2.0 is not between 0 and 1"),
    ("fineweb.short_line_length", 0, "stages.heuristic.fineweb.short_line_length: Input should be greater than or equal to 1"),
    ("fineweb.new_line_ratio", -1, "stages.heuristic.fineweb.new_line_ratio: Input should be greater than or equal to 0"),
])
def test_thresholds_out_of_range(tmp_path, capsys, field, value, message):
    data = demo_config(tmp_path / "out")
    section, name = field.split(".")
    data["stages"].setdefault("heuristic", {}).setdefault(section, {})[name] = value
    err = refused(capsys, tmp_path, data)
    assert f"  {message}" in err


def test_min_above_max_drops_everything(tmp_path, capsys):
    data = demo_config(tmp_path / "out")
    data["stages"].setdefault("heuristic", {})["gopher_quality"] = {"min_words": 500, "max_words": 100}
    err = refused(capsys, tmp_path, data)
    assert ("  stages.heuristic.gopher_quality: min_words 500 is above max_words 100, so every document would be "
            "dropped; give min_words <= max_words") in err


def test_per_language_threshold_out_of_range(tmp_path, capsys):
    data = demo_config(tmp_path / "out")
    data["stages"].setdefault("heuristic", {})["languages"] = {"de": {"c4": {"max_word_length": -1}}}
    err = refused(capsys, tmp_path, data)
    assert ("  stages.heuristic: languages.de.c4.max_word_length: Input should be greater than or equal to 1") in err


@pytest.mark.parametrize("field", ["tokenizer", "model"])
def test_vocabulary_too_large_for_the_trainer(tmp_path, capsys, field):
    data = demo_config(tmp_path / "out")
    if field == "tokenizer":
        data.setdefault("tokenizer", {})["vocab_size"] = 2_147_483_648
        where = "tokenizer.vocab_size"
    else:
        data.setdefault("training", {}).setdefault("model", {})["vocab_size"] = 2_147_483_648
        where = "training.model.vocab_size"
    err = refused(capsys, tmp_path, data)
    assert f"  {where}: 2147483648 is above 1,048,576 tokens, the largest vocabulary Refinery trains or packs" in err


# ---- the YAML itself ------------------------------------------------------------------------------------


def test_alias_expansion_is_refused_before_objects_are_built(tmp_path, capsys):
    """Aliases of a 1,000-item list used 1,000 times: a million nodes from a few KB."""
    text = yaml.safe_dump(demo_config(tmp_path / "out"), sort_keys=False)
    items = ", ".join(f"d{i}.example" for i in range(1000))
    text = text.replace("stages:\n", f"stages:\n  heuristic:\n    url_blocklist: &many [{items}]\n", 1)
    text += "contamination_extra: [" + ", ".join(["*many"] * 1000) + "]\n"
    err = refused(capsys, tmp_path, text)
    assert "refused before reading it: aliases expand to more than 100,000 nodes (the alias *many at line" in err


def test_recursive_alias(tmp_path, capsys):
    text = yaml.safe_dump(demo_config(tmp_path / "out"), sort_keys=False) + "loop: &loop [*loop]\n"
    err = refused(capsys, tmp_path, text)
    assert "refused before reading it: the alias *loop at line" in err and "(a recursive alias)" in err


@pytest.mark.parametrize("style", ["flow", "block"])
def test_deep_nesting(tmp_path, capsys, style):
    depth = 5000
    nest = "[" * depth + "]" * depth if style == "flow" else "".join(f"{'  ' * i}a:\n" for i in range(depth)) + "  " * depth + "b: 1\n"
    text = yaml.safe_dump(demo_config(tmp_path / "out"), sort_keys=False) + ("deep: " + nest + "\n" if style == "flow" else nest)
    err = refused(capsys, tmp_path, text)
    assert "refused before reading it: nested more than 64 levels deep at line" in err


def test_a_configs_own_anchors_still_load(tmp_path):
    """A phase reusing another's weights through an anchor (a config's ordinary reuse) stays inside the limits."""
    data = demo_config(tmp_path / "out")
    phases = data["curriculum"]["phases"]
    phases[1]["weights"] = phases[0]["weights"]  # safe_dump writes &id001 and *id001
    text = yaml.safe_dump(data, sort_keys=False)
    assert "*id001" in text
    assert preflight.check(write_text(tmp_path, text), preflight.GRAPH)[1] == []


# ---- names and inputs --------------------------------------------------------------------------------------


def test_bucket_name_with_a_trailing_newline(tmp_path, capsys):
    data = demo_config(tmp_path / "out")
    data["buckets"] = [b + "\n" if b == "web" else b for b in data["buckets"]]
    for src in data["sources"]:
        src["bucket"] = src["bucket"] + "\n" if src["bucket"] == "web" else src["bucket"]
    err = refused(capsys, tmp_path, data)
    assert "  buckets: 'web\\n' holds the control character U+000A" in err
    assert "  sources[0].bucket: 'web\\n' holds the control character U+000A" in err


@pytest.mark.parametrize("where, message", [
    ("source", "sources[0].name: 'web\\n' holds the control character U+000A"),
    ("phase", "curriculum.phases[0].name: 'warmup\\x07' holds the control character U+0007"),
    ("data_root", "data_root: "),
])
def test_names_with_control_characters(tmp_path, capsys, where, message):
    data = demo_config(tmp_path / "out")
    if where == "source":
        data["sources"][0]["name"] = "web\n"
    elif where == "phase":
        data["curriculum"]["phases"][0]["name"] = "warmup\x07"
    else:
        data["data_root"] = str(tmp_path / "out\t")
    err = refused(capsys, tmp_path, data)
    assert f"  {message}" in err and "holds the control character" in err


@pytest.mark.parametrize("command", ["demo", "validate"])
def test_data_root_inside_a_source_glob(tmp_path, capsys, command):
    """Issue 38: `validate` wrote schedule.png into the input folder the demo refused to write to."""
    corpus = tmp_path / "corpus"
    (corpus / "a").mkdir(parents=True)
    (corpus / "a" / "part.jsonl").write_text('{"text": "hello"}\n')
    data = demo_config(corpus / "out")
    data["sources"].append(jsonl_source(str(corpus / "*" / "*.jsonl")))
    path = write_text(tmp_path, yaml.safe_dump(data, sort_keys=False))
    assert main([command, "--config", path]) == 2
    err = capsys.readouterr().err
    assert (f"  sources[5].path: glob {str(corpus / '*' / '*.jsonl')!r} reaches into the data root {corpus / 'out'}, "
            f"so the run's own outputs would be read back as input") in err
    assert not (corpus / "out").exists()


def test_a_data_root_beside_the_glob_passes(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "a").mkdir(parents=True)
    (corpus / "a" / "part.jsonl").write_text('{"text": "hello"}\n')
    data = demo_config(corpus / "out")
    data["sources"].append(jsonl_source(str(corpus / "a" / "*.jsonl")))
    assert preflight.check(write_text(tmp_path, yaml.safe_dump(data)), preflight.GRAPH)[1] == []


def _make_non_files(folder: Path) -> dict[str, str]:
    folder.mkdir()
    (folder / "good.jsonl").write_text('{"text": "hello"}\n')
    (folder / "dir.jsonl").mkdir()
    os.mkfifo(folder / "fifo.jsonl")
    (folder / "dangling.jsonl").symlink_to(folder / "gone")
    (folder / "loop.jsonl").symlink_to(folder / "loop.jsonl")
    return {"dir.jsonl": "a directory", "fifo.jsonl": "a FIFO",
            "dangling.jsonl": f"a dangling symlink (to {folder / 'gone'})", "loop.jsonl": "a symlink loop"}


def test_glob_matching_a_directory_fifo_dangling_symlink_or_loop(tmp_path, capsys):
    folder = tmp_path / "inputs"
    kinds = _make_non_files(folder)
    data = demo_config(tmp_path / "out")
    data["sources"].append(jsonl_source(str(folder / "*.jsonl")))
    err = refused(capsys, tmp_path, data)
    for name, kind in kinds.items():
        assert f"  sources[5].path: {folder / name} is {kind}; narrow the glob so it matches only files" in err
    assert "good.jsonl" not in err


def test_hf_dataset_glob_matching_a_file(tmp_path, capsys):
    folder = tmp_path / "datasets"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a dataset")
    (folder / "bare").mkdir()
    data = demo_config(tmp_path / "out")
    data["sources"].append(jsonl_source(str(folder / "*"), fmt="hf_dataset"))
    err = refused(capsys, tmp_path, data)
    assert (f"  sources[5].path: {folder / 'notes.txt'} is a file (an hf_dataset source matches directories saved "
            f"with save_to_disk); narrow the glob so it matches only save_to_disk directories") in err
    assert f"  sources[5].path: {folder / 'bare'} is a directory without state.json or dataset_dict.json" in err


def test_parquet_without_its_text_column(tmp_path, capsys):
    folder = tmp_path / "tables"
    folder.mkdir()
    pq.write_table(pa.table({"body": ["hello"], "url": ["https://a.example/"]}), folder / "a.parquet")
    pq.write_table(pa.table({"text": ["hello"]}), folder / "b.parquet")
    data = demo_config(tmp_path / "out")
    data["sources"].append(jsonl_source(str(folder / "*.parquet"), fmt="parquet"))
    err = refused(capsys, tmp_path, data)
    assert (f"  sources[5].text_field: {folder / 'a.parquet'} has no column 'text'; its columns are ['body', 'url']; "
            f"set text_field to one of them") in err
    assert "b.parquet" not in err


def test_a_missing_column_found_during_a_run_exits_2(capsys):
    """A table read in the middle of a run (after the preflight, wrapped by Dagster) is still an input problem."""
    from refinery.stages.readers import InputColumnError

    class StepFailed(Exception):
        def __init__(self, user_exception):
            super().__init__("step failed")
            self.user_exception = user_exception

    def command(args):
        raise StepFailed(InputColumnError("source 'extra': /in/a.parquet has no column 'text' (the source's text_field)"))

    parser = commands.build_parser([_Module(command)], prog="refinery")
    assert commands.run(parser, ["fake"]) == 2
    err = capsys.readouterr().err
    assert err == "refinery fake: source 'extra': /in/a.parquet has no column 'text' (the source's text_field)\n"


class _Module:
    """A one-command module for commands.build_parser."""

    def __init__(self, func):
        self.func = func

    def register(self, sub):
        sub.add_parser("fake").set_defaults(func=self.func)


def test_s3_data_root_without_credentials_exits_2(tmp_path, capsys, monkeypatch):
    """boto3 finds no credentials (none in the environment, no files, no instance metadata): one
    message naming them, exit 2, no traceback."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached: signing fails first
    monkeypatch.setenv("REFINERY_CACHE_DIR", str(tmp_path / "cache"))
    data = demo_config("s3://no-such-bucket/run")
    path = write_text(tmp_path, yaml.safe_dump(data))
    assert main(["funnel", "--config", path]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("refinery funnel: no S3 credentials: Unable to locate credentials (S3 ")
    assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment" in err
