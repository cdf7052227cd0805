"""bench/scaleout.py's split of a setting's CPU into a fixed part and a part per document, and the
nodes' CPU by role."""

from __future__ import annotations

import pytest

from bench import scaleout as bench


def test_two_sizes_give_the_fixed_cpu_and_the_cpu_per_document():
    fixed, per_doc = bench.fixed_and_per_doc([(3000, 36.0), (30000, 306.0)])
    assert fixed == pytest.approx(6.0)
    assert per_doc == pytest.approx(0.01)


def test_more_sizes_are_fitted_by_least_squares():
    # 1 + 2 * docs, the middle point 1 high: the line moves up by a third and keeps its slope.
    fixed, per_doc = bench.fixed_and_per_doc([(1, 3.0), (2, 6.0), (3, 7.0)])
    assert (fixed, per_doc) == (pytest.approx(4 / 3), pytest.approx(2.0))


def test_one_size_cannot_split_the_cpu():
    with pytest.raises(ValueError, match="two corpus sizes"):
        bench.fixed_and_per_doc([(3000, 36.0), (3000, 38.0)])


def test_the_nodes_cpu_by_role():
    assert bench.by_role({"ray::PoolWorker": 10.0, "-c": 1.5, "raylet": 0.4, "gcs_server": 0.3}) == {
        "workers": 10.0, "extraction processes": 1.5, "daemons": 0.7}
