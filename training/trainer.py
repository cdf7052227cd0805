"""The curriculum training loop (torchtitan's shape: components own the work, the loop is glue).

`Trainer(cfg, options).train()` resumes if asked, then runs steps until the curriculum ends, a
phase named by `stop_after_phase` closes, a halt rule fires (`halted`: `training.halt.HaltPolicy`),
or SIGTERM arrives (checkpoint, then `failed` so an orchestrator resumes it). It returns the final
status dict. Step hooks (`step_hooks`, installed through `training.halt.STEP_HOOKS_ENV`) run after
each step's checkpoint decision.

The components, each owning its state: `Distributed` (rank, world, device, DDP, collectives),
`TrainBatches` (this process's batches and the sampler state), `RunAccounting` (tokens and loss per
phase and bucket, the mixture report), `Evaluator` (validation loss, the anneal halt rule),
`Checkpointer` (the named parts in a checkpoint, the resume policy) and `RunStatus` (status.json).
The trainer's own state is the step and the tokens trained.

The CUDA path reads the device once a step: the next step's batch is fetched and its device inputs
built while the device runs this step's backward (`Lookahead`), and the fused AdamW skips a
non-finite step on the device (its found_inf), so the host never waits for the update.

Run safety: `train()` holds the run directory's lock (`training.run_lock`) from before resume to the
end, so a second trainer is refused; a watch on the launcher (`training.lifeline`) turns the
launcher's death into this SIGTERM path. The ranks agree on stopping every step (one all-reduce),
so a SIGTERM that reaches any one rank checkpoints them all at the same step.
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from refinery.config import RefineryConfig
from refinery.curriculum import refuse_mismatch
from refinery.storage import open_data_root
from training.accounting import RunAccounting
from training.attention import resolve_attention
from training.batches import Lookahead, StepInputs, TrainBatches
from training.checkpoint import (MODEL, MODEL_ARGS, OPTIMIZER, RNG, SAMPLER, SCHEDULER, TRAIN_STATE, Checkpointer,
                                 ModelShape, PureLR, ResumeRefused, RNGState, SharedKey, seed_all)
from training.data import CurriculumData
from training.distributed import Distributed
from training.halt import Halt, HaltPolicy, StepHook, StepOutcome, install_step_hooks
from training.length_jump import LengthJump
from training.lifeline import ParentWatch, SigtermFlag
from training.loader import StepBatch
from training.loss import IGNORE
from training.metrics import ConsumptionLog, MetricsLogger, MetricsSink, cut_back_logs
from training.model import GPT, GPTConfig
from training.run_lock import lock_all_ranks
from training.run_store import RunMirror, run_base
from training.sampler_state import SamplerStateError
from training.status import RunStatus, read_status, record_refusal
from training.validation import Evaluator


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
        self.parent_watch = ParentWatch(tc.orphan_grace_s)  # before anything that can block on the launcher
        self.dist = Distributed.setup(tc.device, tc.cpu_threads)
        ranks, data_world = self.dist.data_ranks(self.opt.simulate_world_size)
        self.device = self.dist.device
        self.run_dir = run_dir_of(cfg, self.opt)
        self.global_batch = tc.micro_batch_size * tc.grad_accum_steps
        self.mirror = RunMirror.for_run(cfg, self.run_dir)  # the run's durable copy on a remote data root
        root = open_data_root(cfg.resolve(cfg.data_root))
        refuse_mismatch(cfg, root)  # train the curriculum the config declares, or nothing
        self.data = CurriculumData.open(cfg, root, self.global_batch)
        self.schedule = self.data.schedule
        workers = tc.num_workers if self.opt.num_workers is None else self.opt.num_workers
        self.batches = TrainBatches(self.data, cfg.curriculum.allow_bucket_exhaustion, tc.record_consumption, workers,
                                    ranks, data_world)
        self.model_args = GPTConfig(vocab_size=tc.model.vocab_size or cfg.tokenizer.vocab_size, n_layer=tc.model.n_layer,
                                    n_head=tc.model.n_head, n_embd=tc.model.n_embd, dropout=tc.model.dropout)
        seed_all(cfg.seed)
        self.model = GPT(self.model_args, resolve_attention(tc.attention, self.device, tc.model.dropout),
                         tc.activation_checkpointing).to(self.device)
        if tc.compile:
            self.model.compile_blocks()
        self.optimizer = self.model.configure_optimizer(tc.lr, tc.weight_decay)
        self.length_jump = LengthJump(self.model, self.optimizer, self.schedule, tc.length_jump_adam)
        self.ddp = self.dist.wrap(self.model)
        self.accounting = RunAccounting(self.schedule, self.data.bucket_names)
        self.evaluator = Evaluator(self.data, self.model, self.dist, tc.micro_batch_size, tc.eval_every_tokens)
        self.ckpt = Checkpointer(self.run_dir, tc.keep_last, {
            MODEL: self.model, MODEL_ARGS: ModelShape(self.model_args.to_dict()), OPTIMIZER: self.optimizer,
            SCHEDULER: PureLR(lambda: self.step), SAMPLER: self.batches,
            TRAIN_STATE: SharedKey(self, self.accounting, self.evaluator), RNG: RNGState(),
        }, self.dist.rank, self.mirror)
        self.metrics = MetricsLogger(self.run_dir / "metrics.jsonl", self.opt.sinks if self.dist.rank == 0 else [],
                                     tensorboard=self.dist.rank == 0)
        self.consumption = ConsumptionLog(self.run_dir / f"consumption-rank{self.dist.rank}.jsonl")
        self.status = RunStatus(self.run_dir, self.dist.rank, self.schedule, cfg.curriculum.allow_bucket_exhaustion,
                                self.accounting, self.evaluator, self.ckpt, self.mirror, self.metrics.path)
        self.sigterm = SigtermFlag()
        self.halt_policy = HaltPolicy(tc.max_consecutive_nonfinite, tc.anneal_halt_on_val_rise)
        self.step_hooks: list[StepHook] = []  # run with the trainer after each step's checkpoint decision
        install_step_hooks(self)
        self.step, self.tokens = 0, 0
        self.achieved = [0, 0.0]  # tokens trained and step seconds in this launch
        # On CUDA: fetch the next step's batch and build its device inputs while the device still runs
        # this step's backward, and let the fused optimizer skip a non-finite step on the device, so
        # that the step's one read of its figures waits for neither (bench/RESULTS.md, issue 29).
        self.lookahead = self.device.type == "cuda"
        self.skip_nonfinite_on_device = bool(self.optimizer.defaults.get("fused"))
        self._stats_host: torch.Tensor | None = None  # pinned, the device-skip path's copy of the figures

    @property
    def checkpoint_path(self) -> str | None:
        return self.ckpt.path

    @property
    def val_history(self) -> dict[str, dict[str, list[float]]]:
        return self.evaluator.val_history

    # ---- the train state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "phase": self.schedule.phase_at(max(0, self.step - 1))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens = state["step"], state["tokens"]

    def resume(self) -> None:
        """Start from the checkpoint the resume policy picks, and cut the logs back to it."""
        if self.mirror is not None:
            self.mirror.restore()
        try:
            path = self.ckpt.resume(self.opt.resume, read_status(self.run_dir) or {},
                                    self.cfg.curriculum.allow_bucket_exhaustion)
        except SamplerStateError as err:
            raise ResumeRefused(f"{self.run_dir} cannot continue: {err}. Two ways out: train in a new directory "
                                "(set training.run_dir), or archive this run and start over (`refinery train "
                                "--fresh`)") from None
        if path is not None:
            print(f"refinery train: resumed from {path} at step {self.step} "
                  f"(phase {self.schedule.phase_names[self.schedule.phase_at(min(self.step, self.schedule.total_steps - 1))]})")
        cut_back_logs(self.step, self.dist.rank, self.dist.world, self.metrics, self.consumption, self.mirror)

    # ---- the loop ------------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        lock = lock_all_ranks(self.run_dir, self.dist.rank, self.dist.any_rank)
        if lock.previous:
            print(f"refinery train: took over the lock of a trainer that is gone (pid {lock.previous.get('pid')} on "
                  f"{lock.previous.get('host')}, started {lock.previous.get('started')})", file=sys.stderr)
        self.sigterm.install()
        self.parent_watch.start()
        try:
            return self._train()
        finally:
            self.parent_watch.stop()
            self.sigterm.restore()
            lock.release()

    def _train(self) -> dict[str, Any]:
        self.resume()  # a refusal leaves status.json as it was: the halt stays on record
        try:
            stop_idx = self._stop_phase_index()
            if stop_idx is not None and self.step >= self.schedule.phase_starts[stop_idx + 1]:
                return self._finish(f"phase {self.opt.stop_after_phase!r} was already trained")
            self._status("running")
            tc, batches = self.cfg.training, Lookahead(iter(self.batches), self.step_inputs)
            while self.step < self.schedule.total_steps:
                t0 = time.perf_counter()
                batch, wait, inputs = batches.next()
                halt = self.halt_policy.before_step(batch)
                if halt is not None:
                    return self._halt(halt)
                # Not across a phase's end: the loop may stop there, and the next phase may change shape.
                ahead = (self.lookahead and self.step + 1 < self.schedule.total_steps
                         and not self.schedule.is_last_step_of_phase(self.step))
                record = self.train_step(batch, self.schedule.lr_at(self.step, tc.lr, tc.warmup_steps,
                                                                    tc.stable_schedule, tc.min_lr_ratio),
                                         inputs, batches.fetch if ahead else None)
                record.update({"time/data_wait_s": wait, "time/step_s": time.perf_counter() - t0})
                evaluated = self.evaluator.after_step(self.step, self.tokens, batch.phase, record)
                self._log(batch, record)
                closes = self.schedule.is_last_step_of_phase(self.step - 1)
                boundary = self.schedule.phase_names[batch.phase] if closes else None
                halt = self.halt_policy.after_step(StepOutcome(self.accounting.nonfinite_streak, evaluated,
                                                               self.evaluator.val_history))
                if halt is not None:
                    return self._halt(halt, boundary)
                stop = self.dist.any_rank(self.sigterm.raised)
                if closes or self.step % tc.checkpoint_interval == 0 or stop:
                    self._save(boundary)
                for hook in self.step_hooks:
                    hook(self)
                if stop:
                    return self._status("failed", f"preempted: SIGTERM at step {self.step}; checkpoint saved, "
                                        "resume with --resume auto")
                if closes and stop_idx == batch.phase:
                    last = stop_idx == len(self.schedule.phase_starts) - 2
                    return self._finish(f"phase {self.opt.stop_after_phase!r} finished, " + (
                        "the last of the curriculum" if last else "where this launch was told to stop "
                        "(--stop-after-phase); the next phase starts from its boundary checkpoint"))
            return self._finish("curriculum complete")
        except Exception as err:
            try:
                self._status("failed", f"{type(err).__name__}: {err}")
            except OSError:  # a full disk refuses the status file too; the error raised says so
                pass
            raise

    def step_inputs(self, batch: StepBatch) -> StepInputs:
        """The batch's tensors on the device: tokens, targets (IGNORE where the layout says a target
        does not count), doc ids and each micro-batch's attention mask. Queued without waiting for
        the device: copies from pinned memory, no boolean indexing, nothing read back."""
        top = int(batch.tokens.max())  # on the host copy: no device sync
        if top >= self.model_args.vocab_size:
            raise ValueError(f"token id {top} >= vocab_size {self.model_args.vocab_size}; set "
                             "training.model.vocab_size to the tokenizer's vocabulary")
        tokens = batch.tokens.to(self.device, non_blocking=True).long()
        mask = batch.layout.target_mask(self.device)
        targets = torch.full_like(tokens, IGNORE)
        targets[:, :-1] = tokens[:, 1:]
        targets.masked_fill_(~mask, IGNORE)  # not `targets[~mask] =`: a boolean index waits for the device
        doc_ids = batch.layout.doc_ids(self.device)
        mb = self.cfg.training.micro_batch_size
        masks = [self.model.attention_mask(doc_ids[lo:lo + mb], min(mb, tokens.size(0) - lo), tokens.size(1), self.device)
                 for lo in range(0, tokens.size(0), mb)]
        return StepInputs(tokens=tokens, targets=targets, doc_ids=doc_ids,
                          row_bucket=batch.row_bucket.to(self.device, non_blocking=True),
                          rows=torch.bincount(batch.row_bucket.cpu(), minlength=len(self.data.bucket_names)),
                          n_targets=self.dist.all_reduce(mask.sum().float()), masks=masks)

    def train_step(self, batch: StepBatch, lr: float, inputs: StepInputs | None = None,
                   before_read: Callable[[], None] | None = None) -> dict[str, Any]:
        """Forward/backward over micro-batches, then one optimizer step unless the loss is non-finite.
        `inputs`: `step_inputs(batch)` built ahead; `before_read`: host work to do once the step is
        queued, before its figures are read back (the loop fetches the next batch there)."""
        self.length_jump.enter(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x = inputs if inputs is not None else self.step_inputs(batch)
        n_buckets = len(self.data.bucket_names)
        world = self.dist.world
        loss_sum = torch.zeros(n_buckets, device=self.device)
        count = torch.zeros(n_buckets, device=self.device)
        mb = self.cfg.training.micro_batch_size
        chunks = range(0, x.tokens.size(0), mb)
        for i, lo in enumerate(chunks):
            sl = slice(lo, lo + mb)
            sync = i == len(chunks) - 1 or world == 1
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                with self.ddp.no_sync() if not sync else nullcontext():
                    _, per_token = self.ddp(x.tokens[sl], targets=x.targets[sl], doc_ids=x.doc_ids[sl],
                                            reduction="none", mask=x.masks[i])
                    (per_token.sum() / x.n_targets * world).backward()
            valid = x.targets[sl] != IGNORE
            loss_sum.index_add_(0, x.row_bucket[sl], per_token.detach().sum(1))
            count.index_add_(0, x.row_bucket[sl], valid.sum(1).float())
        self.dist.all_reduce(loss_sum), self.dist.all_reduce(count)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.training.grad_clip).detach().float()
        # Rows per bucket are counted on the host (a bincount on the device reads its maximum back, a
        # wait for the whole backward); only several ranks need the device, to sum them.
        rows = self.dist.all_reduce(x.rows.to(self.device)).float() if world > 1 else None
        nonfinite = (~torch.isfinite(grad_norm) | ~torch.isfinite(loss_sum.sum())).float()
        parts = [grad_norm.view(1), loss_sum, count, nonfinite.view(1)] + ([rows] if rows is not None else [])
        # The step that arms the length jump's Adam treatment steps on the host's verdict: its
        # optimizer pre-hook must not act in a step that the device would then skip.
        on_device = self.skip_nonfinite_on_device and not self.length_jump.armed
        if on_device:
            stats = self._step_then_read(parts, nonfinite, before_read)
        else:
            # One read from the device per step, of every figure the host needs: each separate read
            # is a wait in which the GPU idles (bench/RESULTS.md, the H100 profile).
            figures = torch.cat(parts)
            if before_read is not None:
                before_read()
            stats = figures.tolist()
        norm, losses = stats[0], stats[1:1 + n_buckets]
        targets_counted = stats[1 + n_buckets:1 + 2 * n_buckets]
        rows_served = [int(r) for r in (stats[2 + 2 * n_buckets:] if rows is not None else x.rows.tolist())]
        total = sum(losses) / max(sum(targets_counted), 1.0)
        if on_device:
            finite = stats[1 + 2 * n_buckets] == 0.0  # the verdict the optimizer step already acted on
        else:
            finite = math.isfinite(total) and math.isfinite(norm)
            if finite:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.batches.commit(batch)
        record: dict[str, Any] = {"loss/total": total, "lr": lr, "grad_norm": norm, "nonfinite": not finite}
        record.update(self.accounting.count(batch.phase, losses, targets_counted, rows_served, finite))
        self.tokens += self.schedule.step_tokens(batch.phase)
        return record

    def _step_then_read(self, parts: list[torch.Tensor], nonfinite: torch.Tensor,
                        before_read: Callable[[], None] | None) -> list[float]:
        """The step's figures, read once, with the optimizer step queued before the read: skipped on
        the device when `nonfinite` is set (the fused AdamW's found_inf, as under a GradScaler), so
        the device runs the update while the host logs this step and builds the next. On CUDA the
        figures are copied into pinned memory behind the backward, and the host waits for that copy
        only after `before_read`."""
        figures = torch.cat(parts)
        ready = None
        if figures.is_cuda:
            if self._stats_host is None or self._stats_host.numel() != figures.numel():
                self._stats_host = torch.empty(figures.numel(), dtype=figures.dtype, pin_memory=True)
            figures = self._stats_host.copy_(figures, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        self.optimizer.found_inf = nonfinite  # read by the fused AdamW's step
        self.optimizer.step()
        del self.optimizer.found_inf
        self.optimizer.zero_grad(set_to_none=True)
        if before_read is not None:
            before_read()
        if ready is not None:
            ready.synchronize()
        return figures.tolist()

    # ---- bookkeeping -----------------------------------------------------------------------------

    def _log(self, batch: StepBatch, record: dict[str, Any]) -> None:
        record.update({"step": self.step, **self.schedule.describe(batch.phase), "tokens": self.tokens,
                       "world_size": self.batches.world})
        # What this launch achieves per device, for the throughput contract (refinery/throughput.py).
        step_tokens, step_s = self.schedule.step_tokens(batch.phase), record.get("time/step_s", 0.0)
        self.achieved[0] += step_tokens
        self.achieved[1] += step_s
        if step_s > 0:
            record["throughput/tokens_per_s_per_gpu"] = step_tokens / step_s / self.dist.world
        if batch.dropped:
            record["event/bucket_dropped"] = batch.dropped
            print(f"refinery train: step {self.step}: dropped exhausted bucket(s) {batch.dropped}; weights renormalized")
        if self.dist.rank == 0:
            self.metrics.log(record)
        if batch.consumed is not None:
            self.consumption.log(self.step, self.data.bucket_names, batch.consumed)

    def _save(self, boundary: str | None) -> None:
        self.ckpt.write(self.step, boundary)
        if self.dist.rank == 0:
            self._status("running")
        if self.mirror is not None and self.consumption.path.is_file():
            self.mirror.push_log(self.consumption.path)

    def _status(self, state: str, reason: str = "", **extra: Any) -> dict[str, Any]:
        tokens, seconds = self.achieved
        per_gpu = tokens / seconds / self.dist.world if seconds > 0 else None
        return self.status.write(state, reason, self.step, self.tokens, tokens_per_s_per_gpu=per_gpu, **extra)

    def _halt(self, halt: Halt, boundary: str | None = None) -> dict[str, Any]:
        self._save(boundary)
        print(f"refinery train: halted at step {self.step}: {halt.reason}")
        return self._status("halted", halt.reason, halt_kind=halt.kind)

    def _finish(self, reason: str) -> dict[str, Any]:
        return self._status("completed", reason, finished=self.step >= self.schedule.total_steps)

    def refuse(self, reason: str) -> dict[str, Any]:
        """Record a refusal (what to do is in `reason`), unless the run's status is a halt
        (`record_refusal`)."""
        return record_refusal(self.run_dir, reason, lambda why: self._status("refused", why))

    def _stop_phase_index(self) -> int | None:
        if self.opt.stop_after_phase is None:
            return None
        if self.opt.stop_after_phase not in self.schedule.phase_names:
            raise ValueError(f"--stop-after-phase {self.opt.stop_after_phase!r}: no such phase; "
                             f"one of {self.schedule.phase_names}")
        return self.schedule.phase_names.index(self.opt.stop_after_phase)

    def close(self) -> None:
        self.metrics.close()
        self.dist.close()
