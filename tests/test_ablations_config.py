"""The `ablations` config section: what it accepts, and each config that cannot work refused by the
preflight of a `refinery` command with exit 2, naming the field, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestration.cli import main
from refinery.config import parse_config

from helpers.configs import demo_config

GOOD = {"variants": {"funnel": {}, "raw": {"base": "raw"}, "no_heuristic": {"without": ["heuristic"]},
                     "no_near_dedup": {"without": ["near_dedup"]}, "top_half": {"quality_top": 0.5}}}


def with_ablations(tmp_path: Path, ablations: dict) -> Path:
    data = demo_config(tmp_path / "out")
    if ablations.pop("stages_quality_off", False):
        data["stages"]["quality"] = {"enabled": False}
    data["ablations"] = ablations
    path = tmp_path / "refinery.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_issue_variants_load_with_their_defaults(tmp_path):
    cfg = parse_config({**demo_config(tmp_path / "out"), "ablations": GOOD})
    ab = cfg.ablations
    assert list(ab.variants) == ["funnel", "raw", "no_heuristic", "no_near_dedup", "top_half"]
    assert (ab.seeds, ab.tokens, ab.eval_sets, ab.eval_buckets) == (3, None, [], None)
    assert ab.variants["raw"].base == "raw" and ab.variants["no_heuristic"].base == "funnel"
    # the ablations shape no output of the main graph: the demo's manifests keep their fingerprint
    assert cfg.fingerprint() == parse_config(demo_config(tmp_path / "out")).fingerprint()
    assert main(["validate", "--config", str(with_ablations(tmp_path, GOOD))]) == 0


BAD = [
    ({"variants": {"funnel": {}, "x": {"without": ["heurstic"]}}},
     "ablations.variants.x.without[0]: 'heurstic' is no funnel stage, verdict, skip: name or rule family after "
     "extracted_text; use one of"),
    ({"variants": {"funnel": {}, "x": {"without": ["extract"]}}}, "ablations.variants.x.without[0]: 'extract' is no"),
    ({"variants": {"funnel": {}, "x": {"without": []}}},
     "ablations.variants.x.without: an empty list ignores nothing, so the variant is the funnel"),
    ({"variants": {"funnel": {}, "a": {"without": ["heuristic"]}, "b": {"without": ["heuristic_filtered"]}}},
     "ablations.variants.b: empty: it selects what 'a' selects"),
    ({"variants": {"funnel": {}, "x": {}}}, "ablations.variants.x: empty: it selects what 'funnel' selects"),
    ({"variants": {"funnel": {}, "x": {"base": "raw", "without": ["c4"]}}},
     "ablations.variants.x: `without` needs `base: funnel`"),
    ({"variants": {"funnel": {}, "x": {"quality_top": ".nan"}}}, "ablations.variants.x.quality_top: nan is not a finite"),
    ({"variants": {"funnel": {}, "x": {"quality_top": 0}}}, "ablations.variants.x.quality_top: Input should be greater than 0"),
    ({"variants": {"funnel": {}, "x": {"quality_top": 1.5}}}, "ablations.variants.x.quality_top: Input should be less"),
    ({"variants": {"funnel": {}, "../up": {"base": "raw"}}}, "ablations.variants: '../up' is not safe as a folder name"),
    ({"variants": {"raw": {"base": "raw"}}}, "ablations.variants: no variant named 'funnel'"),
    ({"variants": {"funnel": {"quality_top": 0.5}}}, "ablations.variants: 'funnel' must be the plain funnel"),
    ({"variants": {"funnel": {}, "x": {"quality_top": 0.5}}, "stages_quality_off": True},
     "ablations.variants.x.quality_top: stages.quality.enabled is false, so no document has a quality_score"),
    ({"variants": {"funnel": {}}, "tokens": 1000},
     "ablations.tokens: 1,000 is not a whole number of proxy optimizer steps of 1,024 tokens"),
    ({"variants": {"funnel": {}}, "eval_fraction": 1.0}, "ablations.eval_fraction: Input should be less than 1"),
    ({"variants": {"funnel": {}}, "eval_buckets": ["news"]}, "ablations.eval_buckets[0]: unknown bucket 'news'"),
    ({"variants": {"funnel": {}}, "eval_sets": ["evals/web.jsonl"]},
     "ablations.eval_sets[0]: its domain 'web' (the file's name) is also a bucket or another eval set"),
    ({"variants": {"funnel": {}}, "eval_sets": ["evals/.hidden.jsonl"]},
     "ablations.eval_sets[0]: its domain '' (the file's name before its first '.') is not a plain name"),
    ({"variants": {"funnel": {}}, "model": {"n_embd": 100, "n_head": 3}},
     "ablations.model.n_embd: 100 is not a multiple of ablations.model.n_head 3"),
]


@pytest.mark.parametrize("ablations,problem", BAD, ids=[p.split(":")[0] + f"-{i}" for i, (_, p) in enumerate(BAD)])
def test_a_bad_ablations_config_exits_2_naming_the_field(tmp_path, capsys, ablations, problem):
    path = with_ablations(tmp_path, ablations)
    path.write_text(path.read_text().replace("'.nan'", ".nan"))  # YAML's NaN, which safe_dump would quote
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"  {problem}" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_an_eval_set_that_is_not_there_exits_2_naming_it(tmp_path, capsys):
    path = with_ablations(tmp_path, {"variants": {"funnel": {}}, "eval_sets": ["evals/missing.jsonl"]})
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert (f"  ablations.eval_sets[0]: {tmp_path / 'evals' / 'missing.jsonl'} is not a file; give a JSONL file of "
            f"{{\"id\", \"text\"}} lines") in err
