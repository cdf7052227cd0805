"""Deprecated: the custom-filter base classes moved to `refinery.stages.base`.

Kept for one release so filters written against docs/custom_filters.md's old path still load;
importing it warns once with the new path.
"""

import warnings

from refinery.stages.base import Drop, Filter, RecordStage

__all__ = ["Drop", "Filter", "RecordStage"]

warnings.warn(
    "assets.stages.base is deprecated and will be removed in the next release: "
    "import Drop, Filter and RecordStage from refinery.stages.base",
    DeprecationWarning,
    stacklevel=2,
)
