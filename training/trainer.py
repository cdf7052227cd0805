"""The curriculum training loop (torchtitan's shape: components own the work, the loop is glue).

`Trainer(cfg, options).train()` resumes if asked, then runs steps until the curriculum ends, a
phase named by `stop_after_phase` closes, a bucket runs dry (`halted`), the loss stays non-finite
for `max_consecutive_nonfinite` steps (`halted`), a bucket's validation loss rises during the phase
`training.anneal_halt_on_val_rise` watches (`halted`), or SIGTERM arrives (checkpoint, then `failed`
so an orchestrator resumes it). It returns the final status dict.

Run safety: `train()` holds the run directory's lock (`training.run_lock`) from before resume to the
end, so a second trainer is refused; a watch on the launcher (`training.lifeline`) turns the
launcher's death into this SIGTERM path. The ranks agree on stopping every step (one all-reduce),
so a SIGTERM that reaches any one rank checkpoints them all at the same step.

Distributed: under torchrun (WORLD_SIZE > 1) each process is one rank, with DDP over NCCL (CUDA)
or gloo (CPU). `simulate_world_size=W` instead runs the data path of W ranks in one process and
assembles the global batch from their slices: the same model maths as W=1, used to test that
resuming with another world size still delivers every entry exactly once.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from contextlib import nullcontext
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from refinery.config import RefineryConfig
from refinery.curriculum import refuse_mismatch
from refinery.storage import open_data_root
from training.checkpoint import CheckpointManager, load_checkpoint, rng_state, set_rng_state
from training.data import CurriculumData, RowLayout
from training.lifeline import ParentWatch
from training.loader import Exhausted, StepBatch, StepStream, make_loader
from training.metrics import ConsumptionLog, MetricsLogger, MetricsSink
from training.length_jump import LengthJump
from training.model import GPT, GPTConfig, IGNORE, resolve_attention
from training.run_lock import RunLock, RunLocked
from training.run_store import RunMirror, run_base
from training.status import read_status, write_status
from training.validation import EvalRows, heldout_fingerprints, pack_eval_rows, rising_buckets

KILL_AT_STEP_ENV = "REFINERY_TRAIN_KILL_AT_STEP"  # chaos testing: SIGKILL self after this step


class ResumeRefused(RuntimeError):
    """The run may not continue as asked; the message says why and what to change."""


class RunDirBusy(ResumeRefused, RunLocked):
    """Another trainer holds the run directory."""


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
        root = open_data_root(cfg.resolve(cfg.data_root))
        refuse_mismatch(cfg, root)  # train the curriculum the config declares, or nothing
        self.data = CurriculumData.open(cfg, root, self.global_batch)
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
        self.metrics = MetricsLogger(self.run_dir / "metrics.jsonl", self.opt.sinks if self.rank == 0 else [],
                                     tensorboard=self.rank == 0)
        self.consumption = ConsumptionLog(self.run_dir / f"consumption-rank{self.rank}.jsonl")
        self.step, self.tokens, self.nonfinite_streak = 0, 0, 0
        self.sampler_state: dict[str, Any] | None = None
        self.bucket_tokens: dict[str, int] = defaultdict(int)
        self.summary: dict[str, dict[str, dict[str, float]]] = {}  # phase -> bucket -> loss_sum, targets, tokens
        self.checkpoint_path: str | None = None
        self.val_history: dict[str, dict[str, list[float]]] = {}  # phase -> bucket -> validation losses, in order
        self.val_last: dict[str, Any] = {}  # the latest evaluation: step and loss per bucket
        self._eval_rows: dict[tuple[str, int], EvalRows] = {}
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
                "summary": self.summary, "val_history": self.val_history, "val_last": self.val_last,
                "heldout": heldout_fingerprints(self.data.heldout),
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
        now = heldout_fingerprints(self.data.heldout)
        saved = train.get("heldout") or dict.fromkeys(now, "")  # a checkpoint from before held-out entries
        changed = sorted(b for b in saved.keys() & now.keys() if saved[b] != now[b])
        if changed:
            raise ResumeRefused(
                f"the held-out validation entries of bucket(s) {changed} differ from the checkpoint's "
                "(training.eval_entries_per_bucket or the seed changed), so the entry sets the sampler's cursors point "
                "into differ too; restore training.eval_entries_per_bucket or start a new run_dir"
            )
        self.step, self.tokens, self.nonfinite_streak = train["step"], train["tokens"], train["nonfinite_streak"]
        self.bucket_tokens = defaultdict(int, train["bucket_tokens"])
        self.summary = train["summary"]
        self.val_history, self.val_last = train.get("val_history", {}), train.get("val_last", {})
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
        self._cut_back_logs()

    def _cut_back_logs(self) -> None:
        """Cut the JSON-lines logs back to the resumed step: later records are replayed, a torn last
        line is dropped, and consumption logs of ranks beyond a shrunk world size are cut back too (by
        rank 0), so the logs on disk name exactly what the checkpoint consumed."""
        logs = [self.consumption]
        if self.rank == 0:
            logs.append(self.metrics)
            for path in sorted(self.run_dir.glob("consumption-rank*.jsonl")):
                rank = path.stem.removeprefix("consumption-rank")
                if rank.isdigit() and int(rank) >= self.world:
                    logs.append(ConsumptionLog(path))
        for log in logs:
            torn = log.truncate_after(self.step)
            if torn:
                print(f"refinery train: {log.path}: cut {torn} unreadable line(s) at its end (a write interrupted "
                      "by a crash)", file=sys.stderr)
            if self.mirror is not None:
                self.mirror.sync_log(log.path)

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
                tokens=torch.cat([p.tokens for p in parts]), row_bucket=torch.cat([p.row_bucket for p in parts]),
                layout=RowLayout.cat([p.layout for p in parts]),
                sampler_state=parts[0].sampler_state, dropped=parts[0].dropped,
                consumed={k: torch.cat([torch.from_numpy(p.consumed[k]) for p in parts]).numpy() for k in parts[0].consumed}
                if parts[0].consumed is not None else None,
            )

    # ---- the loop ------------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        lock = self._lock_run_dir()
        if lock.previous:
            print(f"refinery train: took over the lock of a trainer that is gone (pid {lock.previous.get('pid')} on "
                  f"{lock.previous.get('host')}, started {lock.previous.get('started')})", file=sys.stderr)
        # Set explicitly: a process may inherit SIGTERM ignored, and then a preemption would go unseen.
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self.parent_watch.start()
        try:
            return self._train()
        finally:
            self.parent_watch.stop()
            signal.signal(signal.SIGTERM, previous)
            lock.release()

    def _lock_run_dir(self) -> RunLock:
        """This rank's lock on the run directory; every rank is refused when any one is, so none is
        left waiting in a collective for a rank that gave up."""
        lock, refusal = RunLock(self.run_dir, self.rank), None
        try:
            lock.acquire()
        except RunLocked as err:
            refusal = str(err)
        if self.world > 1:
            refused = torch.tensor([int(refusal is not None)], device=self.device)
            dist.all_reduce(refused, op=dist.ReduceOp.MAX)
            if refused.item() and refusal is None:
                lock.release()
                refusal = f"{self.run_dir}: another rank's lock is held by another trainer (see its message)"
        if refusal is not None:
            raise RunDirBusy(refusal)
        return lock

    def _train(self) -> dict[str, Any]:
        self.resume()  # a refusal leaves status.json as it was: the halt stays on record
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
                val_rise = self._validate(batch, record)
                self._log(batch, record)
                closes = self.schedule.is_last_step_of_phase(self.step - 1)
                boundary = self.schedule.phase_names[batch.phase] if closes else None
                if self.nonfinite_streak >= self.cfg.training.max_consecutive_nonfinite:
                    return self._halt(f"nonfinite_loss: {self.nonfinite_streak} consecutive steps with a NaN/Inf loss "
                                      f"or gradient (limit training.max_consecutive_nonfinite)", "nonfinite_loss", boundary)
                if val_rise:
                    return self._halt(val_rise, "val_loss_rise", boundary)
                stop = self._any_rank_stopping()
                if closes or self.step % self.cfg.training.checkpoint_interval == 0 or stop:
                    self._save(boundary)
                if os.environ.get(KILL_AT_STEP_ENV) == str(self.step):
                    os.kill(os.getpid(), signal.SIGKILL)
                if stop:
                    return self._status("failed", f"preempted: SIGTERM at step {self.step}; checkpoint saved, "
                                        "resume with --resume auto")
                if closes and stop_idx == batch.phase:
                    return self._finish(f"stopped after phase {self.opt.stop_after_phase!r} as asked")
            return self._finish("curriculum complete", finished=True)
        except Exception as err:
            self._status("failed", f"{type(err).__name__}: {err}")
            raise

    def train_step(self, batch: StepBatch, lr: float) -> dict[str, Any]:
        """Forward/backward over micro-batches, then one optimizer step unless the loss is non-finite."""
        self.length_jump.enter(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
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
        rows = self._allreduce(torch.bincount(row_bucket, minlength=n_buckets))
        # One read from the device per step, of every figure the host needs: each separate read
        # is a wait in which the GPU idles (bench/RESULTS.md, the H100 profile).
        stats = torch.cat([grad_norm.detach().float().view(1), loss_sum, count, rows.float()]).tolist()
        norm, losses = stats[0], stats[1:1 + n_buckets]
        targets_counted = stats[1 + n_buckets:1 + 2 * n_buckets]
        rows_served = [int(r) for r in stats[1 + 2 * n_buckets:]]
        total = sum(losses) / max(sum(targets_counted), 1.0)
        finite = math.isfinite(total) and math.isfinite(norm)
        if finite:
            self.optimizer.step()
            self.nonfinite_streak = 0
        else:
            self.nonfinite_streak += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.sampler_state = batch.sampler_state
        record: dict[str, Any] = {"loss/total": total, "lr": lr, "grad_norm": norm, "nonfinite": not finite}
        phase = self.schedule.phase_names[batch.phase]
        for b, name in enumerate(self.data.bucket_names):
            served = rows_served[b] * batch.seq_len
            if served == 0:
                continue
            self.bucket_tokens[name] += served
            if targets_counted[b] > 0:
                record[f"loss/{name}"] = losses[b] / targets_counted[b]
            acc = self.summary.setdefault(phase, {}).setdefault(name, {"loss_sum": 0.0, "targets": 0.0, "tokens": 0})
            if finite:
                acc["loss_sum"] += losses[b]
                acc["targets"] += targets_counted[b]
            acc["tokens"] += served
        self.tokens += self.global_batch * batch.seq_len
        record.update({f"tokens/{name}": n for name, n in self.bucket_tokens.items()})
        return record

    # ---- validation (the anneal playbook) -------------------------------------------------------------

    def _validate(self, batch: StepBatch, record: dict[str, Any]) -> str | None:
        """Every training.eval_every_tokens tokens: per-bucket validation loss into `record`
        (`val_loss/<bucket>`); returns the halt reason when the anneal rule fires, else None."""
        tc = self.cfg.training
        step_tokens = self.global_batch * batch.seq_len
        if not tc.eval_every_tokens or self.tokens // tc.eval_every_tokens == (self.tokens - step_tokens) // tc.eval_every_tokens:
            return None
        t0 = time.perf_counter()
        losses = self.validation_losses(batch.seq_len)
        phase = self.schedule.phase_names[batch.phase]
        for name, loss in losses.items():
            record[f"val_loss/{name}"] = loss
            self.val_history.setdefault(phase, {}).setdefault(name, []).append(loss)
        record["time/eval_s"] = time.perf_counter() - t0
        self.val_last = {"step": self.step, "phase": phase, "loss": losses}
        rule = tc.anneal_halt_on_val_rise
        if rule is None or phase != rule.phase:
            return None
        fired = rising_buckets(self.val_history.get(phase, {}), rule.patience, rule.min_delta)
        if not fired:
            return None
        detail = "; ".join(f"{b}: best {best:.4f}, then {', '.join(f'{x:.4f}' for x in rising)}"
                           for b, (best, rising) in fired.items())
        return (f"val_loss_rise: validation loss of bucket(s) {sorted(fired)} rose during phase {phase!r} for "
                f"{rule.patience} evaluation(s) in a row by more than {rule.min_delta:g} ({detail}); rule "
                "training.anneal_halt_on_val_rise")

    def validation_losses(self, seq_len: int) -> dict[str, float]:
        """Mean loss per bucket over its held-out entries packed into rows of `seq_len`, with the
        current weights (no gradient, no RNG use, so training is unchanged by evaluating)."""
        names = [n for n in self.data.bucket_names if self.data.heldout.get(n) is not None and self.data.heldout[n].size]
        sums = torch.zeros(2, len(names), device=self.device, dtype=torch.float64)
        mb = self.cfg.training.micro_batch_size
        self.model.eval()
        with torch.no_grad():
            for i, name in enumerate(names):
                key = (name, seq_len)
                if key not in self._eval_rows:
                    self._eval_rows[key] = pack_eval_rows(self.data.buckets[name], self.data.heldout[name], seq_len)
                rows = self._eval_rows[key]
                for lo in range(0, len(rows.tokens), mb):
                    tokens = torch.from_numpy(rows.tokens[lo:lo + mb]).to(self.device)
                    mask = torch.from_numpy(rows.target_mask[lo:lo + mb]).to(self.device)
                    targets = torch.full_like(tokens, IGNORE)
                    targets[:, :-1] = tokens[:, 1:]
                    targets[~mask] = IGNORE
                    doc_ids = torch.from_numpy(rows.doc_ids[lo:lo + mb]).to(self.device)
                    with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                        _, per_token = self.model(tokens, targets=targets, doc_ids=doc_ids, reduction="none")
                    sums[0, i] += per_token.double().sum()
                    sums[1, i] += mask.sum()
        self.model.train()
        self._allreduce(sums)  # the ranks hold the same weights; summing keeps their verdicts identical
        return {name: float(sums[0, i] / sums[1, i]) for i, name in enumerate(names) if sums[1, i] > 0}

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
        if self.mirror is not None and self.consumption.path.is_file():
            self.mirror.push_log(self.consumption.path)

    def _status(self, state: str, reason: str = "", **extra: Any) -> dict[str, Any]:
        if self.rank != 0:
            return {"state": state, "reason": reason}
        phase = self.schedule.phase_at(min(self.step, self.schedule.total_steps - 1))
        status = write_status(
            self.run_dir, state, reason, step=self.step, tokens=self.tokens, phase=self.schedule.phase_names[phase],
            checkpoint=self.checkpoint_path, total_steps=self.schedule.total_steps,
            allow_bucket_exhaustion=self.cfg.curriculum.allow_bucket_exhaustion, summary=self.summary,
            mixture=self.mixture_report(), validation=self.val_last, **extra,
        )
        if self.mirror is not None:
            self.mirror.push_run_files()
            self.mirror.push_log(self.metrics.path)
        return status

    def mixture_report(self) -> dict[str, dict[str, dict[str, float]]]:
        """Per phase and bucket: tokens the curriculum plans for the whole phase (its contract, which
        the manifests hold) and tokens served so far."""
        planned = self.schedule.tokens.phase_bucket_tokens()
        report: dict[str, dict[str, dict[str, float]]] = {}
        for p, phase in enumerate(self.schedule.phase_names):
            for b, bucket in enumerate(self.schedule.tokens.buckets):
                served = self.summary.get(phase, {}).get(bucket, {}).get("tokens", 0)
                if planned[p, b] > 0 or served:
                    report.setdefault(phase, {})[bucket] = {"planned": float(planned[p, b]), "served": int(served)}
        return report

    def _halt(self, reason: str, kind: str, boundary: str | None = None) -> dict[str, Any]:
        self._save(boundary)
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

    def _any_rank_stopping(self) -> bool:
        """Whether any rank got SIGTERM; every rank gets the same answer at the same step."""
        if self.world == 1:
            return self._stop_signal
        flag = torch.tensor([int(self._stop_signal)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def close(self) -> None:
        self.metrics.close()
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
