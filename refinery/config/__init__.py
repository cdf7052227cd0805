"""The one YAML config that declares a Refinery run.

Every field is typed and unknown keys are rejected, so a typo fails at load time with the field's
path instead of silently falling back to a default. `load_config` is the only entry point; it
raises `ConfigError` whose message names the field, what is wrong, and how to fix it. Loading runs
no user code: refinery/preflight.py imports and builds the custom filters.

Defaults follow the published pipelines they come from (FineWeb, Gopher, C4, datatrove); each
section's docstring says which. One module per part of the schema: sources.py (inputs and
partitions), stages.py (the funnel's stages) over thresholds.py (the heuristic rules' published
thresholds) and languages.py (per-language settings and defaults), tokens.py (tokenizer and
shards), curriculum.py, training.py, contamination.py, ablations.py, execution.py (where the tasks run), and
run.py (the root `RefineryConfig` and its cross-references); loader.py reads the YAML and rewrites
schema errors.
"""

from refinery.config.ablations import AblationsConfig, VariantConfig
from refinery.config.contamination import ContaminationConfig, EvalSetConfig
from refinery.config.curriculum import BucketPolicy, CurriculumConfig, PhaseConfig, RopeScalingConfig
from refinery.config.execution import ExecutionConfig, task_memory_bytes
from refinery.config.languages import LanguageHeuristics, default_language_heuristics
from refinery.config.loader import ConfigError, field_path, load_config, parse_config, read_yaml
from refinery.config.run import SAFE_PATH_PART, RefineryConfig, cross_reference_problems
from refinery.config.section import Section
from refinery.config.sources import SKIPPABLE_STAGES, PartitionsConfig, SourceConfig
from refinery.config.stages import (BUILTIN_FAMILIES, CustomFilterConfig, ExactDedupConfig, ExtractConfig,
                                    HeuristicConfig, LanguageConfig, NearDedupConfig, PiiConfig, QualityConfig,
                                    SafetyConfig, StagesConfig)
from refinery.config.thresholds import (HEURISTIC_RULES, RULE_SECTIONS, C4Config, FineWebQualityConfig,
                                        GopherQualityConfig, GopherRepetitionConfig)
from refinery.config.tokens import ShardsConfig, TokenizerConfig
from refinery.config.training import ModelConfig, TrainingConfig, ValRiseHaltConfig

__all__ = [
    "BUILTIN_FAMILIES", "HEURISTIC_RULES", "RULE_SECTIONS", "SAFE_PATH_PART", "SKIPPABLE_STAGES",
    "AblationsConfig", "BucketPolicy", "C4Config", "ConfigError", "ContaminationConfig", "CurriculumConfig", "CustomFilterConfig",
    "EvalSetConfig", "ExactDedupConfig", "ExecutionConfig", "ExtractConfig", "FineWebQualityConfig",
    "GopherQualityConfig", "GopherRepetitionConfig", "HeuristicConfig", "LanguageConfig", "LanguageHeuristics", "ModelConfig",
    "NearDedupConfig", "PartitionsConfig", "PhaseConfig", "PiiConfig", "QualityConfig", "RefineryConfig",
    "RopeScalingConfig", "SafetyConfig", "Section", "ShardsConfig", "SourceConfig", "StagesConfig",
    "TokenizerConfig", "TrainingConfig", "ValRiseHaltConfig", "VariantConfig",
    "cross_reference_problems", "default_language_heuristics", "field_path", "load_config", "parse_config",
    "read_yaml", "task_memory_bytes",
]
