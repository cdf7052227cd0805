"""The trainer's settings: the model, the batch, the optimizer and LR shape, checkpoints, run
safety and validation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from refinery.config.section import Section
from refinery.config.tokens import check_vocab_size


class ModelConfig(Section):
    """The GPT in training/model.py. vocab_size None takes tokenizer.vocab_size."""

    vocab_size: int | None = Field(default=None, ge=2)
    _vocab_bound = field_validator("vocab_size")(check_vocab_size)
    n_layer: int = Field(default=2, ge=1)
    n_head: int = Field(default=4, ge=1)
    n_embd: int = Field(default=128, ge=8)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)


class ValRiseHaltConfig(Section):
    """Halt when a bucket's validation loss rises during `phase` (seed 000's anneal playbook): after
    `patience` evaluations in a row each more than `min_delta` above the bucket's best in the phase."""

    phase: str = "anneal"
    patience: int = Field(default=2, ge=1)
    min_delta: float = Field(default=0.0, ge=0.0)


class ClusterConfig(Section):
    """The hardware and wall-clock budget the run has, for the throughput contract (seed 002's second
    equation, refinery/throughput.py): `refinery validate` prints the tokens per second they need."""

    gpus: int = Field(ge=1, le=10_000_000)
    days: float = Field(gt=0.0, le=3650.0)


# The fields that say where the trainer runs, not what it computes: a run's provenance leaves them out.
LAUNCH_FIELDS = frozenset({"launch", "ray_cpus", "ray_gpus"})


class TrainingConfig(Section):
    """The curriculum trainer. One optimizer step trains on micro_batch_size * grad_accum_steps rows
    (the global batch, fixed whatever the world size, so the data order does not depend on it); each of
    W ranks takes 1/W of those rows in micro-batches of at most micro_batch_size. Defaults fit the
    tiny CPU demo; nanoGPT's small-model settings (grad_clip 1.0, weight_decay 0.1)."""

    run_dir: str = "runs/demo"  # relative to data_root
    model: ModelConfig = ModelConfig()
    micro_batch_size: int = Field(default=4, ge=1)
    grad_accum_steps: int = Field(default=1, ge=1)
    lr: float = Field(default=3e-3, gt=0.0)
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    warmup_steps: int = Field(default=10, ge=0)
    stable_schedule: Literal["constant", "cosine"] = "constant"
    weight_decay: float = Field(default=0.1, ge=0.0)
    grad_clip: float = Field(default=1.0, gt=0.0)
    checkpoint_interval: int = Field(default=50, ge=1)
    keep_last: int = Field(default=2, ge=1)
    max_consecutive_nonfinite: int = Field(default=5, ge=1)
    num_workers: int = Field(default=0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Intra-op threads on CPU; None keeps torch's default. Small matrices gain nothing from more: on
    # the 2-core shared VM a 32-wide linear layer ran 50x slower with 2 threads than with 1 under load.
    cpu_threads: int | None = Field(default=1, ge=1)
    max_resume_attempts: int = Field(default=3, ge=0)
    resume_backoff_s: float = Field(default=1.0, ge=0.0)
    # Local cache for shards read from a remote (s3://) data root. The trainer pins only the shards its
    # bounded pool holds open and prefetches those the read position reaches next
    # (docs/training-data.md); the rest may be evicted.
    shard_cache_gb: float = Field(default=8.0, gt=0.0)
    record_consumption: bool = False  # write <run_dir>/consumption-rank<r>.jsonl: every entry piece each step of rank r read
    # sdpa: dense T x T document mask, any device; flex: FlexAttention block mask, O(T) memory, compiled
    # on CUDA; auto: flex on CUDA, sdpa elsewhere.
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    compile: bool = False  # torch.compile each transformer block
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    # Adam's state at the first step whose seq_len differs from the step before: "reset" starts the
    # attention parameters' moments afresh, "renorm" rescales every second moment once to the new
    # gradients' scale (training/length_jump.py).
    length_jump_adam: Literal["none", "reset", "renorm"] = "none"
    # ---- run safety and the anneal playbook (training/lifeline.py, training/halt.py) ----
    # Seconds a rank whose launcher died may spend checkpointing before it exits regardless.
    orphan_grace_s: float = Field(default=60.0, gt=0.0)
    # Per-bucket validation loss on held-out entries every this many trained tokens; 0 = never.
    eval_every_tokens: int = Field(default=0, ge=0)
    # Entries of each bucket held out of training for validation (chosen by seed); 0 = none.
    eval_entries_per_bucket: int = Field(default=0, ge=0)
    anneal_halt_on_val_rise: ValRiseHaltConfig | None = None
    # e.g. {gpus: 2048, days: 54}: the throughput the run needs (validate) against what it achieves.
    cluster: ClusterConfig | None = None
    # ---- where `training_run` runs the trainer (assets/ray_trainer.py, docs/scale-out.md) ----
    # local: a subprocess on the machine of the Dagster step. ray: a subprocess of a Ray actor on a node
    # of the Ray cluster at execution.address (whatever execution.engine says), relaunched from its
    # checkpoint like a local one.
    launch: Literal["local", "ray"] = "local"
    # CPUs the trainer's actor reserves on its node (launch: ray).
    ray_cpus: int = Field(default=1, ge=0, le=1024)
    # GPUs the trainer's actor reserves on its node (launch: ray); with device cuda or auto on GPU
    # nodes, reserve the GPUs it trains on, or Ray may give them to another task too.
    ray_gpus: int = Field(default=0, ge=0, le=64)

    @model_validator(mode="after")
    def _eval(self) -> "TrainingConfig":
        if (self.eval_every_tokens > 0) != (self.eval_entries_per_bucket > 0):
            raise ValueError("eval_every_tokens and eval_entries_per_bucket go together: set both above 0 to "
                             "measure validation loss, or both to 0")
        if self.anneal_halt_on_val_rise is not None and not self.eval_every_tokens:
            raise ValueError("anneal_halt_on_val_rise needs validation loss: set eval_every_tokens and "
                             "eval_entries_per_bucket")
        return self
