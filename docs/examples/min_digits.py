"""The worked example of docs/custom_filters.md: keep only documents with enough digits (a math or
tables bucket wants numbers in its text).

Plugged in with
    stages:
      custom_filters:
        - {name: digits, path: "docs.examples.min_digits:MinDigits", params: {min_digits: 3}}
"""

from __future__ import annotations

from typing import Any

from refinery.stages.base import Drop, Filter


class MinDigits(Filter):
    """Drops a document with fewer than `min_digits` ASCII digits as `<name>/too_few_digits`, with
    the digit count as the reject's value."""

    reads = ("text",)

    def __init__(self, min_digits: int = 1):
        if min_digits < 1:
            raise ValueError(f"min_digits must be at least 1, got {min_digits}")
        self.min_digits = min_digits

    def check(self, record: dict[str, Any]) -> Drop | None:
        digits = sum(c.isascii() and c.isdigit() for c in record["text"])
        if digits < self.min_digits:
            return Drop(f"{self.family}/too_few_digits", digits, f"{digits} digits < min_digits {self.min_digits}")
        return None

    def config_summary(self) -> dict[str, Any]:
        return {"min_digits": self.min_digits}
