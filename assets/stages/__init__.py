"""The old home of the pure funnel stages, which now live in `refinery/stages/`.

Only `assets.stages.base` remains, for one release, so custom filters written against the documented
path (`from assets.stages.base import Drop, Filter`) keep loading. New code imports `refinery.stages`.
"""
