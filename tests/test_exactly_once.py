"""Exactly-once delivery under SIGKILL: a run killed at 10+ steps (around both phase switches among
them), each time resumed with another simulated world size (1, 2, 4) and loader worker count
(0, 2), consumes the same entry pieces in the same order as an uninterrupted run and ends with the
same model (the procedure and its assertions: helpers/exactly_once.py)."""

from __future__ import annotations

import pytest

from helpers.exactly_once import assert_exactly_once_under_sigkill
from synthetic.curriculum import tiny_run


@pytest.mark.slow
def test_sigkill_and_elastic_resume_deliver_every_entry_exactly_once(tmp_path):
    config = tiny_run(tmp_path, training={"record_consumption": True, "checkpoint_interval": 3})
    assert_exactly_once_under_sigkill(tmp_path, config)
