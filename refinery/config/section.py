"""The base of every config section: typed fields, unknown keys refused, values frozen, and no
value that would break a run later: every float finite, every int within 64 bits, no control
character in any text (names, paths and list entries become folder names, keys and report lines)."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, field_validator

# A bucket name is a folder name in the data root (shards/final/<bucket>/, manifests/<phase>/<bucket>-...);
# so is a variant name (ablations/variants/<name>/).
SAFE_PATH_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # \Z: `$` would let a trailing newline through

# numpy, Arrow and the Rust tokenizer hold integers in 64 bits; a larger one fails far from the config.
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _bad_scalar(value: Any) -> str | None:
    """Why a text or int value cannot be used (None: it can)."""
    if isinstance(value, str):
        for ch in value:
            if unicodedata.category(ch) == "Cc":
                return (f"{value!r} holds the control character U+{ord(ch):04X}; names and paths become folder "
                        f"names, keys and report lines, so write them without control characters (a trailing "
                        f"newline often comes from a YAML block scalar `|`: use a plain or quoted string)")
    elif isinstance(value, int) and not isinstance(value, bool) and not _INT64[0] <= value <= _INT64[1]:
        return f"{value} does not fit in 64 bits; give a number between {_INT64[0]} and {_INT64[1]}"
    return None


class Section(BaseModel):
    # allow_inf_nan=False: YAML's .nan and .inf are refused in every float field, nested lists and
    # dicts included (a NaN threshold compares false and silently switches its rule off).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # Fields whose values are the user's own (custom filter params), checked by their code, not here.
    free_fields: ClassVar[tuple[str, ...]] = ()

    # Before the field's own type and pattern, so a name with a trailing newline is told so rather
    # than that it does not match a pattern. A mapping's keys are checked here; its values, like
    # a nested section's fields, by their own types.
    @field_validator("*", mode="before")
    @classmethod
    def _usable_values(cls, value: Any, info: Any) -> Any:
        if info.field_name in cls.free_fields:
            return value
        if isinstance(value, dict):
            items = list(value)
        elif isinstance(value, list):
            items = [x for item in value for x in (item if isinstance(item, list) else [item])]
        else:
            items = [value]
        for item in items:
            why = _bad_scalar(item)
            if why is not None:
                raise ValueError(why)
        return value
