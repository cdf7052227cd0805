"""Filters of your own, plugged in by dotted path (`stages.custom_filters`, docs/custom_filters.md).

A custom filter is a class on the same base as the built-in filters (`Filter`, or `RecordStage` for
one that also rewrites columns), so it gets the same per-record isolation, timeouts, reject rows
and counters. It runs inside `heuristic_filtered`, after the built-in rules, on the documents they
kept: a `Chain` (refinery/stages/base.py) runs the stages one after the other and reports them as
one stage. The config's `name` is the filter's reason family: its rejects read `<name>/<reason>`
(a reason it returns without that prefix gets it) and its counters `<name>/<counter>`.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections import Counter
from typing import Any

import polars as pl

from refinery.config import CustomFilterConfig, RefineryConfig
from refinery.stages.base import Chain, RecordStage, Stage, StageOutput


class CustomFilterError(ValueError):
    """A custom filter that cannot be built; `field` is the config field to fix (path or params)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _import(module_name: str, base_dir: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        # Only the module itself missing (not something it imports) sends us to the config's folder.
        missing_itself = err.name is not None and (module_name == err.name or module_name.startswith(err.name + "."))
        if not missing_itself or base_dir in sys.path:
            raise CustomFilterError("path", f"cannot import {module_name!r}: {err}; put it on PYTHONPATH or "
                                    f"beside the config file ({base_dir})") from None
        # A module beside the config file is found without installing it.
        sys.path.append(base_dir)
        return _import(module_name, base_dir)
    except Exception as err:  # noqa: BLE001 - whatever the user's module raises, the config names it
        raise CustomFilterError("path", f"importing {module_name!r} raised {type(err).__name__}: {err}") from None


def custom_filter_class(spec: CustomFilterConfig, base_dir: str) -> type[RecordStage]:
    """The class `spec.path` names, imported and checked to be a complete stage class."""
    module_name, _, class_name = spec.path.partition(":")
    cls = getattr(_import(module_name, base_dir), class_name, None)
    if cls is None:
        raise CustomFilterError("path", f"module {module_name!r} has no attribute {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, RecordStage)):
        raise CustomFilterError("path", f"{spec.path} is not a subclass of refinery.stages.base.Filter or RecordStage "
                                "(the base every built-in filter runs on)")
    if inspect.isabstract(cls):
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        raise CustomFilterError("path", f"{spec.path} does not implement {missing}")
    return cls


def build_custom_filter(spec: CustomFilterConfig, base_dir: str, stage_name: str = "heuristic_filtered") -> RecordStage:
    """The filter `spec` names, built with its params and renamed to report as part of `stage_name`."""
    cls, class_name = custom_filter_class(spec, base_dir), spec.path.partition(":")[2]
    try:
        stage = cls(**spec.params)
    except Exception as err:  # noqa: BLE001 - bad params are the config's error, whatever they raise
        raise CustomFilterError("params", f"{class_name}(**params) raised {type(err).__name__}: {err}") from None
    stage.name = stage_name
    stage.family = spec.name
    return stage


def in_family(out: StageOutput, family: str) -> StageOutput:
    """`out` with every reason and counter under `family/`."""
    prefix = f"{family}/"

    def own(key: str) -> str:
        return key if key.startswith(prefix) else prefix + key

    stats = out.stats
    stats.dropped = Counter({own(k): v for k, v in stats.dropped.items()})
    stats.counters = Counter({own(k): v for k, v in stats.counters.items()})
    rejects = out.rejects.with_columns(pl.col("rule").map_elements(own, return_dtype=pl.String))
    return StageOutput(out.documents, rejects, stats)


class FamilyScoped(Stage):
    """A custom filter as a part of a chain: every reason and counter it reports under its family."""

    def __init__(self, stage: RecordStage):
        self.stage = stage
        self.name = stage.name

    def run(self, docs: pl.DataFrame) -> StageOutput:
        self.stage.record_timeout_s = self.record_timeout_s
        return in_family(self.stage.run(docs), self.stage.family)

    def skipped(self, docs: pl.DataFrame) -> StageOutput:
        return self.stage.skipped(docs)


def with_custom_filters(first: Stage, cfg: RefineryConfig) -> Stage:
    """`first`, followed by the config's custom filters when it has any."""
    specs = cfg.stages.custom_filters
    if not specs:
        return first
    custom = [FamilyScoped(build_custom_filter(spec, cfg.base_dir, first.name)) for spec in specs]
    summary = {**first.config_summary(), "custom_filters": [spec.model_dump(mode="json") for spec in specs]}
    return Chain(first.name, [first, *custom], summary, skip_key=first.skip_key)
