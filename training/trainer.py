"""The curriculum training loop (torchtitan's shape: components own the work, the loop is glue).

`Trainer(cfg, options).train()` resumes if asked, then runs steps until the curriculum ends, a
phase named by `stop_after_phase` closes, a bucket runs dry (`halted`), the loss stays non-finite
for `max_consecutive_nonfinite` steps (`halted`), or SIGTERM arrives (checkpoint, then `failed`
so an orchestrator resumes it). It returns the final status dict.

Distributed: under torchrun (WORLD_SIZE > 1) each process is one rank, with DDP over NCCL (CUDA)
or gloo (CPU). `simulate_world_size=W` instead runs the data path of W ranks in one process and
assembles the global batch from their slices: the same model maths as W=1, used to test that
resuming with another world size still delivers every entry exactly once.
"""

from __future__ import annotations

import os
import signal
from contextlib import nullcontext
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from refinery.config import RefineryConfig
from refinery.storage import open_data_root
from training.checkpoint import CheckpointManager, load_checkpoint, rng_state, set_rng_state
from training.data import CurriculumData
from training.loader import Exhausted, StepBatch, StepStream, make_loader
from training.metrics import ConsumptionLog, MetricsLogger, MetricsSink
from training.length_jump import LengthJump
from training.model import GPT, GPTConfig, IGNORE, resolve_attention
from training.run_store import RunMirror, run_base
from training.status import read_status, write_status

KILL_AT_STEP_ENV = "REFINERY_TRAIN_KILL_AT_STEP"  # chaos testing: SIGKILL self after this step


class ResumeRefused(RuntimeError):
    """The run may not continue as asked; the message says why and what to change."""


@dataclass
class RunOptions:
    resume: str = "auto"  # "auto" | "never" | a checkpoint path (e.g. a previous phase's boundary checkpoint)
    stop_after_phase: str | None = None
    run_dir: str | None = None  # default: data_root / training.run_dir
    simulate_world_size: int = 1
    num_workers: int | None = None  # default: training.num_workers
    sinks: list[MetricsSink] = field(default_factory=list)


def run_dir_of(cfg: RefineryConfig, options: RunOptions) -> Path:
    return Path(options.run_dir) if options.run_dir else run_base(cfg)


class Trainer:
    def __init__(self, cfg: RefineryConfig, options: RunOptions | None = None):
        self.cfg, self.opt, tc = cfg, options or RunOptions(), cfg.training
        self.rank, self.world = self._init_distributed()
        if self.world > 1 and self.opt.simulate_world_size != 1:
            raise ValueError("simulate_world_size is for single-process runs; under torchrun the world size is real")
        self.ranks_here = range(self.opt.simulate_world_size) if self.world == 1 else [self.rank]
        self.data_world = max(self.world, self.opt.simulate_world_size)
        use_cuda = tc.device == "cuda" or (tc.device == "auto" and torch.cuda.is_available())
        self.device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
        if not use_cuda and tc.cpu_threads is not None:
            torch.set_num_threads(tc.cpu_threads)
        self.run_dir = run_dir_of(cfg, self.opt)
        self.global_batch = tc.micro_batch_size * tc.grad_accum_steps
        self.mirror = RunMirror.for_run(cfg, self.run_dir)  # the run's durable copy on a remote data root
        self.data = CurriculumData.open(cfg, open_data_root(cfg.resolve(cfg.data_root)), self.global_batch)
        self.schedule = self.data.schedule
        self.data.rank_rows(0, self.data_world)  # fail now, not in a worker, if the batch does not split
        self.model_args = GPTConfig(vocab_size=tc.model.vocab_size or cfg.tokenizer.vocab_size, n_layer=tc.model.n_layer,
                                    n_head=tc.model.n_head, n_embd=tc.model.n_embd, dropout=tc.model.dropout)
        torch.manual_seed(cfg.seed)
        self.model = GPT(self.model_args, resolve_attention(tc.attention, self.device, tc.model.dropout),
                         tc.activation_checkpointing).to(self.device)
        if tc.compile:
            self.model.compile_blocks()
        self.optimizer = self.model.configure_optimizer(tc.lr, tc.weight_decay)
        self.length_jump = LengthJump(self.model, self.optimizer, self.schedule,
                                      {p.name: p.rope_scaling for p in cfg.curriculum.phases}, tc.length_jump_adam)
        self.ddp = self._wrap_ddp()
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", tc.keep_last)
        self.metrics = MetricsLogger(self.run_dir / "metrics.jsonl", self.opt.sinks if self.rank == 0 else [])
        self.consumption = ConsumptionLog(self.run_dir / f"consumption-rank{self.rank}.jsonl")
        self.step, self.tokens, self.nonfinite_streak = 0, 0, 0
        self.sampler_state: dict[str, Any] | None = None
        self.bucket_tokens: dict[str, int] = defaultdict(int)
        self.summary: dict[str, dict[str, dict[str, float]]] = {}  # phase -> bucket -> loss_sum, targets, tokens
        self.checkpoint_path: str | None = None
        self._stop_signal = False

    # ---- setup -------------------------------------------------------------------------------------

    @staticmethod
    def _init_distributed() -> tuple[int, int]:
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return 0, 1
        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        return dist.get_rank(), dist.get_world_size()

    def _wrap_ddp(self) -> torch.nn.Module:
        if self.world == 1:
            return self.model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def _allreduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t

    # ---- state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "model_args": self.model_args.to_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"kind": "warmup_stable_decay", "step": self.step},  # the LR is a pure function of step
            "sampler": self.sampler_state,
            "train": {
                "step": self.step, "tokens": self.tokens, "phase": self.schedule.phase_at(max(0, self.step - 1)),
                "nonfinite_streak": self.nonfinite_streak, "bucket_tokens": dict(self.bucket_tokens),
                "summary": self.summary,
            },
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["model_args"] != self.model_args.to_dict():
            raise ResumeRefused(
                f"the checkpoint's model {state['model_args']} differs from the config's {self.model_args.to_dict()}; "
                "restore training.model or start a new run_dir"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        train = state["train"]
        self.step, self.tokens, self.nonfinite_streak = train["step"], train["tokens"], train["nonfinite_streak"]
        self.bucket_tokens = defaultdict(int, train["bucket_tokens"])
        self.summary = train["summary"]
        self.sampler_state = state["sampler"]
        if self.sampler_state is not None:
            probe = self.data.sampler(self.cfg.curriculum.allow_bucket_exhaustion)
            for note in probe.load_state_dict(self.sampler_state, self.data_world):
                print(f"refinery train: {note}")
        set_rng_state(state["rng"])

    def resume(self) -> None:
        """Pick the checkpoint to start from, enforcing the halted/completed rules of status.json."""
        if self.mirror is not None:
            self.mirror.restore()
        status = read_status(self.run_dir) or {}
        allow = self.cfg.curriculum.allow_bucket_exhaustion
        path: Path | None
        if self.opt.resume == "never":
            if self.ckpt.complete():
                raise ResumeRefused(f"{self.run_dir} already has checkpoints; use --resume auto or another run_dir")
            path = None
        elif self.opt.resume == "auto":
            if status.get("state") == "halted":
                flag_changed = status.get("halt_kind") == "bucket_exhausted" and allow and not status.get("allow_bucket_exhaustion")
                if not flag_changed:
                    raise ResumeRefused(
                        f"the run halted: {status.get('reason')}. Auto-resume would repeat it; set "
                        "curriculum.allow_bucket_exhaustion: true to continue with renormalized weights, or pass "
                        "--resume PATH to restart from a chosen checkpoint"
                    )
            path = self.ckpt.latest()
        else:
            path = Path(self.opt.resume)
        if path is not None:
            self.load_state_dict(load_checkpoint(path))
            self.checkpoint_path = str(path)
            print(f"refinery train: resumed from {path} at step {self.step} "
                  f"(phase {self.schedule.phase_names[self.schedule.phase_at(min(self.step, self.schedule.total_steps - 1))]})")
        self.metrics.truncate_after(self.step)
        self.consumption.truncate_after(self.step)

    # ---- data ----------------------------------------------------------------------------------------

    def batches(self) -> Iterator[StepBatch | Exhausted]:
        """This process's share of each global batch (all W slices when simulating W ranks)."""
        workers = self.cfg.training.num_workers if self.opt.num_workers is None else self.opt.num_workers
        record = self.cfg.training.record_consumption
        allow = self.cfg.curriculum.allow_bucket_exhaustion
        loaders = [make_loader(StepStream(self.data, self.sampler_state, allow, r, self.data_world, record), workers)
                   for r in self.ranks_here]
        for parts in zip(*loaders):
            exhausted = [p for p in parts if isinstance(p, Exhausted)]
            if exhausted:
                yield exhausted[0]
                return
            yield parts[0] if len(parts) == 1 else StepBatch(
                step=parts[0].step, phase=parts[0].phase, seq_len=parts[0].seq_len,
                tokens=torch.cat([p.tokens for p in parts]), doc_ids=torch.cat([p.doc_ids for p in parts]),
                target_mask=torch.cat([p.target_mask for p in parts]), row_bucket=torch.cat([p.row_bucket for p in parts]),
                sampler_state=parts[0].sampler_state, dropped=parts[0].dropped,
                consumed={k: torch.cat([torch.from_numpy(p.consumed[k]) for p in parts]).numpy() for k in parts[0].consumed}
                if parts[0].consumed is not None else None,
            )

    # ---- the loop ------------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        self.resume()  # a refusal leaves status.json as it was: the halt stays on record
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            stop_idx = self._stop_phase_index()
            if stop_idx is not None and self.step >= self.schedule.phase_starts[stop_idx + 1]:
                return self._finish(f"phase {self.opt.stop_after_phase!r} was already trained")
            self._status("running")
            batches = self.batches()
            while self.step < self.schedule.total_steps:
                t0 = time.perf_counter()
                batch = next(batches)
                wait = time.perf_counter() - t0
                if isinstance(batch, Exhausted):
                    return self._halt(f"bucket_exhausted: {batch.message}", "bucket_exhausted")
                tc = self.cfg.training
                lr = self.schedule.lr_at(self.step, tc.lr, tc.warmup_steps, tc.stable_schedule, tc.min_lr_ratio)
                record = self.train_step(batch, lr)
                record.update({"time/data_wait_s": wait, "time/step_s": time.perf_counter() - t0})
                self._log(batch, record)
                if self.nonfinite_streak >= self.cfg.training.max_consecutive_nonfinite:
                    return self._halt(f"nonfinite_loss: {self.nonfinite_streak} consecutive steps with a NaN/Inf loss "
                                      f"or gradient (limit training.max_consecutive_nonfinite)", "nonfinite_loss")
                closes = self.schedule.is_last_step_of_phase(self.step - 1)
                if closes or self.step % self.cfg.training.checkpoint_interval == 0 or self._stop_signal:
                    self._save(self.schedule.phase_names[batch.phase] if closes else None)
                if os.environ.get(KILL_AT_STEP_ENV) == str(self.step):
                    os.kill(os.getpid(), signal.SIGKILL)
                if self._stop_signal:
                    return self._status("failed", f"preempted: SIGTERM at step {self.step}; checkpoint saved, "
                                        "resume with --resume auto")
                if closes and stop_idx == batch.phase:
                    return self._finish(f"stopped after phase {self.opt.stop_after_phase!r} as asked")
            return self._finish("curriculum complete", finished=True)
        except Exception as err:
            self._status("failed", f"{type(err).__name__}: {err}")
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    def train_step(self, batch: StepBatch, lr: float) -> dict[str, Any]:
        """Forward/backward over micro-batches, then one optimizer step unless the loss is non-finite."""
        self.length_jump.enter(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        tokens = batch.tokens.to(self.device, non_blocking=True).long()
        if int(tokens.max()) >= self.model_args.vocab_size:
            raise ValueError(f"token id {int(tokens.max())} >= vocab_size {self.model_args.vocab_size}; set "
                             "training.model.vocab_size to the tokenizer's vocabulary")
        mask = batch.target_mask.to(self.device, non_blocking=True)
        targets = torch.full_like(tokens, IGNORE)
        targets[:, :-1] = tokens[:, 1:]
        targets[~mask] = IGNORE
        doc_ids = batch.doc_ids.to(self.device, non_blocking=True)
        n_buckets = len(self.data.bucket_names)
        row_bucket = batch.row_bucket.to(self.device)
        n_targets = self._allreduce(mask.sum().float())
        loss_sum = torch.zeros(n_buckets, device=self.device)
        count = torch.zeros(n_buckets, device=self.device)
        mb = self.cfg.training.micro_batch_size
        chunks = range(0, tokens.size(0), mb)
        for i, lo in enumerate(chunks):
            sl = slice(lo, lo + mb)
            sync = i == len(chunks) - 1 or self.world == 1
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                with self.ddp.no_sync() if not sync else nullcontext():
                    _, per_token = self.ddp(tokens[sl], targets=targets[sl], doc_ids=doc_ids[sl], reduction="none")
                    (per_token.sum() / n_targets * self.world).backward()
            valid = targets[sl] != IGNORE
            loss_sum.index_add_(0, row_bucket[sl], per_token.detach().sum(1))
            count.index_add_(0, row_bucket[sl], valid.sum(1).float())
        self._allreduce(loss_sum), self._allreduce(count)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.training.grad_clip)
        total = loss_sum.sum() / count.sum().clamp(min=1)
        finite = bool(torch.isfinite(total)) and bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizer.step()
            self.nonfinite_streak = 0
        else:
            self.nonfinite_streak += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.sampler_state = batch.sampler_state
        record: dict[str, Any] = {"loss/total": float(total), "lr": lr, "grad_norm": float(grad_norm), "nonfinite": not finite}
        phase = self.schedule.phase_names[batch.phase]
        per_bucket_rows = self._allreduce(torch.bincount(row_bucket, minlength=n_buckets)) * batch.seq_len
        for b, name in enumerate(self.data.bucket_names):
            served = int(per_bucket_rows[b])
            if served == 0:
                continue
            self.bucket_tokens[name] += served
            if count[b] > 0:
                record[f"loss/{name}"] = float(loss_sum[b] / count[b])
            acc = self.summary.setdefault(phase, {}).setdefault(name, {"loss_sum": 0.0, "targets": 0.0, "tokens": 0})
            if finite:
                acc["loss_sum"] += float(loss_sum[b])
                acc["targets"] += float(count[b])
            acc["tokens"] += served
        self.tokens += self.global_batch * batch.seq_len
        record.update({f"tokens/{name}": n for name, n in self.bucket_tokens.items()})
        return record

    # ---- bookkeeping -----------------------------------------------------------------------------

    def _log(self, batch: StepBatch, record: dict[str, Any]) -> None:
        record.update({"step": self.step, "phase": batch.phase, "phase_name": self.schedule.phase_names[batch.phase],
                       "tokens": self.tokens, "seq_len": batch.seq_len, "world_size": self.data_world})
        if batch.dropped:
            record["event/bucket_dropped"] = batch.dropped
            print(f"refinery train: step {self.step}: dropped exhausted bucket(s) {batch.dropped}; weights renormalized")
        if self.rank == 0:
            self.metrics.log(record)
        if batch.consumed is not None:
            self.consumption.log(self.step, self.data.bucket_names, batch.consumed)

    def _save(self, boundary: str | None) -> None:
        state = self.state_dict()
        if self.rank == 0:
            self.checkpoint_path = str(self.ckpt.save(self.step, state, boundary))
            if self.mirror is not None:
                self.mirror.push_checkpoints()
            self._status("running")

    def _status(self, state: str, reason: str = "", **extra: Any) -> dict[str, Any]:
        if self.rank != 0:
            return {"state": state, "reason": reason}
        phase = self.schedule.phase_at(min(self.step, self.schedule.total_steps - 1))
        status = write_status(
            self.run_dir, state, reason, step=self.step, tokens=self.tokens, phase=self.schedule.phase_names[phase],
            checkpoint=self.checkpoint_path, total_steps=self.schedule.total_steps,
            allow_bucket_exhaustion=self.cfg.curriculum.allow_bucket_exhaustion, summary=self.summary, **extra,
        )
        if self.mirror is not None:
            self.mirror.push_run_files()
        return status

    def _halt(self, reason: str, kind: str) -> dict[str, Any]:
        self._save(None)
        print(f"refinery train: halted at step {self.step}: {reason}")
        return self._status("halted", reason, halt_kind=kind)

    def _finish(self, reason: str, finished: bool = False) -> dict[str, Any]:
        return self._status("completed", reason, finished=finished)

    def _stop_phase_index(self) -> int | None:
        if self.opt.stop_after_phase is None:
            return None
        if self.opt.stop_after_phase not in self.schedule.phase_names:
            raise ValueError(f"--stop-after-phase {self.opt.stop_after_phase!r}: no such phase; "
                             f"one of {self.schedule.phase_names}")
        return self.schedule.phase_names.index(self.opt.stop_after_phase)

    def _on_sigterm(self, signum, frame) -> None:
        self._stop_signal = True

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
