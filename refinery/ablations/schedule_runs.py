"""Schedule variants and anneal branches on the data root: their manifests beside the `funnel`
variant's, and the config each proxy run trains (refinery/ablations/schedules.py derives the tables).

    <data_root>/ablations/variants/funnel/
        schedules/s_<schedule>.json, a_<mixture>.json     each run's derived curriculum section
        manifests/s_<schedule>__<phase>.json              its phases' manifests (phase_manifests' builder)
        manifests/a_<mixture>__<last phase>.json          an anneal branch's own phase; the others are
                                                          the curriculum schedule's
        runs/schedules/<schedule>/seed-<s>/<phase>/       one run directory per phase, as training_run
        runs/schedules/curriculum/seed-<s>/a_<mixture>__<last phase>/   a branch, beside the curriculum's

Every variant trains the data variants' budget (the funnel variant's `budget_tokens`) on the funnel
variant's shards; nothing is copied. Writing a run's manifests twice gives the same bytes.
"""

from __future__ import annotations

from refinery import curriculum as cur
from refinery.ablations import build
from refinery.ablations.schedules import (ANNEAL, CURRICULUM, SCHEDULE, ScheduleError, read_definition, run_prefix,
                                          write_definition)
from refinery.config import RefineryConfig
from refinery.config.ablations import FUNNEL_VARIANT
from refinery.storage import DataRoot


def funnel_root(root: DataRoot) -> DataRoot:
    return build.variant_root(root, FUNNEL_VARIANT)


def run_base(kind: str, name: str, seed: int) -> str:
    """training.run_dir of a run, in the funnel variant's root: an anneal branch's is its seed's
    curriculum run's, so its last phase starts from that run's pre-anneal boundary checkpoint."""
    return f"runs/schedules/{CURRICULUM if kind == ANNEAL else name}/seed-{seed}"


def _config(cfg: RefineryConfig, curriculum: dict, seed: int | None = None, run_dir: str | None = None) -> RefineryConfig:
    """The data variants' derived config on the funnel variant's root with `curriculum`, its LR
    warmup the same in tokens for every table: the trainer counts warmup steps at the first phase's
    seq_len, so a table that starts shorter than the proxy's window warms up over more steps."""
    assert cfg.ablations is not None
    vcfg = build._derived(cfg, FUNNEL_VARIANT, curriculum, seed=seed, run_dir=run_dir)
    steps = cfg.ablations.warmup_steps * cfg.ablations.seq_len // curriculum["phases"][0]["seq_len"]
    return vcfg.model_copy(update={"training": vcfg.training.model_copy(update={"warmup_steps": steps})})


def prepare_run(root: DataRoot, cfg: RefineryConfig, kind: str, name: str) -> dict:
    """Write the derived curriculum and the manifests of run `kind`/`name` into the funnel
    variant's root (which must be built: the data variants' budget is its `budget_tokens`);
    returns the curriculum section. ScheduleError when the funnel variant cannot fill it."""
    froot = funnel_root(root)
    if not froot.exists(build.SUMMARY_KEY) or "budget_tokens" not in froot.read_json(build.SUMMARY_KEY):
        raise ScheduleError(f"ablations.variants.{FUNNEL_VARIANT}: not built yet; materialize "
                            f"ablation_variants[{FUNNEL_VARIANT}] first")
    summary = froot.read_json(build.SUMMARY_KEY)
    # The funnel variant's shards hold a sample bounded by the budget (build.py): what it stores.
    curriculum = write_definition(froot, cfg, kind, name, summary["budget_tokens"], summary["stored"]["bucket_tokens"])
    vcfg = _config(cfg, curriculum)
    report, inventory, selections = cur.validate_data_root(vcfg, froot)
    field = f"ablations.schedules.{name}" if kind == SCHEDULE else f"ablations.anneal_search.mixtures.{name}"
    if not report.ok or inventory is None:
        raise ScheduleError(f"{field}: its curriculum does not validate on the {FUNNEL_VARIANT!r} variant's data: "
                            + "; ".join(str(e) for e in report.errors))
    own = run_prefix(kind, name) + "__"
    for phase in (p["name"] for p in curriculum["phases"] if p["name"].startswith(own)):
        cur.write_manifest(froot, cur.build_phase_manifest(vcfg, froot, phase, report, inventory, selections))
    return curriculum


def run_config(root: DataRoot, cfg: RefineryConfig, kind: str, name: str, seed: int) -> RefineryConfig:
    """The config the project's Trainer runs for run `kind`/`name` and proxy seed `seed`: the
    funnel variant's root, the written curriculum, the proxy model, the run's seed plus `seed`."""
    curriculum = read_definition(funnel_root(root), kind, name)
    return _config(cfg, curriculum, seed=cfg.seed + seed, run_dir=run_base(kind, name, seed))

