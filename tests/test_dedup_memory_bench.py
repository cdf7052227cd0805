"""bench/dedup_memory.py reports each partition's own peak, not the driver's."""

from __future__ import annotations

import numpy as np
import pytest

from bench import dedup_memory as bench


def test_a_partitions_peak_excludes_the_drivers_memory(tmp_path):
    config = bench.write_config(tmp_path, 1, {"exact_dedup": {"hash_ranges": 4}, "near_dedup": {}})
    ballast = np.ones(400 * 2**20 // 8)  # 400 MiB touched in the driver: ru_maxrss would carry it into the child
    wall, peak, counts = bench.measure(config, "import", "-")
    assert ballast.sum() == ballast.size
    assert bench.own_peak_bytes() > 400 * 2**20
    assert 20 * 2**20 < peak < 300 * 2**20
    assert counts == {} and wall > 0


def test_a_failing_partition_is_an_error(tmp_path):
    config = bench.write_config(tmp_path, 1, {"exact_dedup": {"hash_ranges": 4}, "near_dedup": {}})
    with pytest.raises(RuntimeError, match="no-such-step"):
        bench.measure(config, "no-such-step", "-")
