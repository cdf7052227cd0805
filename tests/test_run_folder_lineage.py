"""`refinery lineage --run` given the training's folder (`training.run_dir`, which holds one folder per
phase) instead of a phase's: the answer names the phase folders and the one that trained the step."""

import json

import pytest

from training.token_lineage import TokenLookupError, run_world_size


def test_the_run_folder_points_to_the_phase_that_trained_the_step(tmp_path):
    base = tmp_path / "runs" / "curriculum"
    for phase, steps in {"main": range(1, 5), "anneal": range(5, 7)}.items():
        (base / phase).mkdir(parents=True)
        (base / phase / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "world_size": 1}) + "\n" for s in steps))
    with pytest.raises(TokenLookupError) as err:
        run_world_size(base, 6)
    assert str(err.value) == (f"{base} holds a curriculum's runs, one folder per phase: main (steps 1..4), anneal "
                              f"(steps 5..6); pass the folder of the phase that trained the step; step 6 is in anneal: "
                              f"--run {base / 'anneal'}")
    with pytest.raises(TokenLookupError, match="; none trained step 60$"):
        run_world_size(base, 60)
    assert run_world_size(base / "anneal", 6) == 1
