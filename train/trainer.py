"""The training loop: micro-batches → loss → backward → clip → step (or skip) → metrics and checkpoints.

One host sync per optimizer step (the loss and gradient norm, needed to decide whether to skip the
step); per-source sums stay on the device until a log step. The extras (attribution, adaptive
mixing, distillation, step skipping, early stopping) are hooks (``train.hooks``) called at fixed
points of the step; the trainer is built, with its model already parallelized and initialised, by
``train.build``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from winnow.train.accounting import SourceAccounting, check_source_ids
from winnow.train.alerts import Alerts, SkipReason
from winnow.train.checkpoint import SHARDS_DIR, CheckpointManager, has_shards
from winnow.train.config import TrainConfig
from winnow.train.data import Batch
from winnow.train.errors import CheckpointError
from winnow.train.hooks import TrainHook
from winnow.train.init import Initialization
from winnow.train.metrics import Throughput, memory_stats, peak_flops_basis
from winnow.train.model import Transformer, cross_entropy_per_token
from winnow.train.parallel import Parallel
from winnow.train.progress import TrainProgress
from winnow.train.rng import rng_state, set_rng_state
from winnow.train.runfolder import continue_run_folder
from winnow.train.shutdown import on_stop_signals, stop_requested

log = logging.getLogger(__name__)
REPEATED_PASSES = 4  # passes over the training data past which a run says its repeated tokens add little
_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: str) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the run's autocast context (``nullcontext`` in fp32)."""
    dtype = _AMP_DTYPES.get(precision)
    return (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext


@dataclass(slots=True)
class StepResult:
    """What one optimizer step did; ``skipped`` is None or why the step was skipped."""

    step: int
    loss: float
    grad_norm: float
    skipped: SkipReason | None
    lr: float = 0.0  # the learning rate the step used


class Trainer:
    """Trains ``model`` on ``data`` (an endless iterable of ``Batch`` with ``state_dict``) into ``cfg.output``.

    ``model`` is the plain model this rank holds (parallelized in place and initialised), ``net`` what
    forward is called on (DDP's wrapper, or ``model``); ``hooks`` are called in order (``train.hooks``).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        model: Transformer,
        net: torch.nn.Module,
        parallel: Parallel,
        optimizer: torch.optim.Optimizer,
        scheduler,
        data: Iterable,
        sources: list[str],
        alerts: Alerts,
        hooks: list[TrainHook],
        val_data: Callable[[], Iterable] | None = None,
        scaler: torch.amp.GradScaler | None = None,
        init: Initialization | None = None,
        progress: TrainProgress | None = None,
    ) -> None:
        self.cfg, self.model, self.net, self.parallel = cfg, model, net, parallel
        self.device, self.run_dir = parallel.world.device, Path(cfg.output)
        self.optimizer, self.scheduler, self.scaler = optimizer, scheduler, scaler
        self.data, self._batches, self.val_data = data, iter(data), val_data
        self.sources, self.alerts, self.hooks, self.init = list(sources), alerts, list(hooks), init
        self._resumed: bool | None = None  # resume() ran: whether it found a checkpoint
        self._said_eval_cap = False  # a capped evaluation that left sources out has said so
        self._last_eval: tuple[int, float] | None = None  # (step, perf_counter) when the last evaluation ended
        self._said_eval_cost = False  # an evaluation of the whole val split costing more than training has said so
        self._said_passes = False  # a run past REPEATED_PASSES passes over its training data has said so
        self._eval_pending = -1  # the step whose evaluation a stop signal abandoned: a resume from it redoes it
        self.pipeline = parallel.pipeline  # pipeline parallel: self.model holds this rank's stages only
        self._autocast = autocast(self.device, cfg.precision)
        # compiled on a GPU, the loss's log-softmax over the vocabulary fuses (no fp32 copy of the logits); on a
        # CPU compiling it gains nothing
        compile_loss = cfg.compile and self.device.type == "cuda"
        self._cross_entropy = torch.compile(cross_entropy_per_token) if compile_loss else cross_entropy_per_token
        shape = dict(n_moe_layers=model.cfg.n_moe_layers, n_experts=model.cfg.n_experts, device=self.device)
        self.accounting = SourceAccounting(self.sources, **shape, reduce=parallel.reduce_sum)  # since the last log step
        self._step_accounting = SourceAccounting(self.sources, **shape)  # merged once a step is applied
        self._router_M3 = torch.zeros(model.cfg.n_moe_layers, 3, dtype=torch.float64, device=self.device)
        self.metrics = parallel.metrics_writer(self.run_dir, cfg.metrics)
        # a bar only where someone reads it: the caller's choice, and rank 0
        enabled = progress is not None and parallel.is_main
        self.progress = progress if enabled else TrainProgress(total=cfg.steps, enabled=False)
        self.checkpoints = CheckpointManager(
            self.run_dir / "checkpoints", keep_last=cfg.checkpoint.keep_last, mode=cfg.checkpoint.mode
        )
        self.throughput = Throughput(parallel.comm)
        self.peak_flops, self.peak_basis = peak_flops_basis(self.device, cfg.metrics.peak_flops)
        self.flops_per_token = model.cfg.flops_per_token(cfg.data.seq_len)
        self.step, self.tokens_seen, self.micro_steps = 0, 0, 0
        self.last: StepResult | None = None
        self._stop_signal: int | None = None
        self._saved_step = -1

    def hook(self, name: str) -> TrainHook | None:
        """The hook of that ``name`` (``"attribution"``, ``"mixing"``, ...), None when the run has none."""
        return next((h for h in self.hooks if h.name == name), None)

    # ---- one optimizer step -------------------------------------------------------------
    def train_step(self) -> StepResult:
        self.model.train()
        for h in self.hooks:
            h.begin_step(self.step)
        batches = self._next_batches()
        # host-side (the batches are still on the CPU), summed over ranks: the global-batch mean's denominator
        n_tokens = self.parallel.global_tokens(sum(b.num_tokens for b in batches))
        run = self._pipeline_step if self.pipeline is not None else self._micro_steps
        loss = run([b.to(self.device) for b in batches], n_tokens)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        clip = self.cfg.optim.grad_clip or float("inf")
        grad_norm = self.parallel.clip_grad_norm(self.model, clip)
        loss_value, norm_value = self.parallel.step_values(loss, grad_norm)  # the one sync per step
        skipped = next((r for h in self.hooks if (r := h.check(loss_value, norm_value, batches)) is not None), None)
        if skipped is None:
            for h in self.hooks:
                h.before_update()
            (self.scaler.step if self.scaler else lambda opt: opt.step())(self.optimizer)
            self.accounting.merge(self._step_accounting)
            self.model.update_expert_bias(self.parallel.global_load(self._step_accounting.load_ME))
            self.tokens_seen += n_tokens
        for h in self.hooks:  # torch's clipping factor, from the same global norm
            h.end_step(skipped is None, min(1.0, clip / (norm_value + 1e-6)))
        if self.scaler:
            self.scaler.update()  # after a skipped inf step too: that is how the scale comes down
        self._step_accounting.reset()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        with warnings.catch_warnings():  # the schedule advances on skipped steps too, on purpose
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            self.scheduler.step()
        self.throughput.tokens += n_tokens
        self.step += 1
        self.last = StepResult(self.step, loss_value, norm_value, skipped, lr)
        return self.last

    def _next_batches(self) -> list[Batch]:
        batches = []
        for _ in range(self.cfg.grad_accum):
            start = time.perf_counter()
            batches.append(next(self._batches))
            check_source_ids(batches[-1].source_ids, self.sources, getattr(self.data, "sources", None))
            self.throughput.wait += time.perf_counter() - start
        return batches

    def _loss_scale(self) -> float:
        """The factor the backward's loss carries beyond the global-batch mean: the data-parallel ``grad_scale``
        and fp16's loss scale (``scale``, not ``get_scale``: it also starts the scaler on a stage that never
        calls the loss)."""
        fp16 = float(self.scaler.scale(torch.ones((), device=self.device))) if self.scaler else 1.0
        return self.parallel.grad_scale * fp16

    def _split(self, source_ids_BL: torch.Tensor, loss_scale: float) -> contextlib.ExitStack:
        """Every hook's context for one micro-batch's forward (and backward, outside a pipeline)."""
        stack = contextlib.ExitStack()
        for h in self.hooks:
            stack.enter_context(h.split(source_ids_BL, loss_scale))
        return stack

    def _micro_steps(self, batches: list[Batch], n_tokens: int) -> torch.Tensor:
        """Forward and backward of each micro-batch; returns this rank's share of the step's data loss."""
        total, scale = torch.zeros((), device=self.device), self._loss_scale()
        for i, b in enumerate(batches):
            with self.parallel.grad_sync(self.net, last=i == len(batches) - 1), self._split(b.source_ids, scale):
                with self._autocast():
                    out = self.net(b.tokens, b.doc_ids)
                    data_loss = self._loss(b, out.logits_BLV, n_tokens)
                    loss = data_loss * self.parallel.grad_scale + out.router_loss / len(batches)
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            self._record_moe(0, out.moe, b.source_ids, b.loss_mask)
            total += data_loss.detach()
        self.micro_steps += len(batches)
        return total

    def _pipeline_step(self, batches: list[Batch], n_tokens: int) -> torch.Tensor:
        """The step's micro-batches through the pipeline schedule; returns this dp rank's share of the data loss.

        The last stage computes the same loss as ``_micro_steps``; the router losses join each stage's
        backward (``train.parallel.pipeline``). Every pp rank returns the share, summed over the pipeline.
        """
        total, scale = torch.zeros((), device=self.device), self._loss_scale()
        fp16 = scale / self.parallel.grad_scale

        def loss(logits_BLV, targets_BL, source_ids_BL, loss_mask_BL, tokens_BL=None, doc_ids_BL=None):
            nonlocal total
            b = Batch(tokens_BL, targets_BL, source_ids_BL, loss_mask_BL, doc_ids_BL)
            data_loss = self._loss(b, logits_BLV, n_tokens)
            total += data_loss.detach()
            return data_loss * scale

        self.pipeline.run(
            batches,
            loss=loss,
            record=self._record_moe,
            autocast=self._autocast,
            loss_scale=fp16,
            split=lambda source_ids_BL: self._split(source_ids_BL, scale),
            inputs=any(h.inputs for h in self.hooks),
        )
        self.micro_steps += len(batches)
        return self.parallel.reduce_pp(total)  # every stage then decides the same skip

    def _loss(self, b: Batch, logits_BLV: torch.Tensor, n_tokens: int) -> torch.Tensor:
        """One micro-batch's data loss (its share of the step's global-batch mean), after the hooks' ``loss``;
        its plain cross-entropy (no label smoothing: comparable across runs) goes into the per-source sums."""
        loss_BL = self._cross_entropy(logits_BLV, b.targets, label_smoothing=self.cfg.label_smoothing)
        plain_BL = loss_BL.detach()
        if self.cfg.label_smoothing > 0:
            with torch.no_grad():
                plain_BL = cross_entropy_per_token(logits_BLV.detach(), b.targets)
        with self._autocast():
            for h in self.hooks:
                loss_BL = h.loss(b, logits_BLV, loss_BL, plain_BL, n_tokens)
        self._step_accounting.add_loss(plain_BL, b.source_ids, b.loss_mask)
        return (loss_BL * b.loss_mask).sum() / max(n_tokens, 1)

    def _record_moe(self, first: int, moe: list, source_ids_BL: torch.Tensor, loss_mask_BL: torch.Tensor) -> None:
        """Routing, load and router losses of MoE layers ``first, first + 1, ...`` (all of them, or a pipeline stage's)."""
        if not moe:
            return
        self._step_accounting.add_routing([s.experts_TK for s in moe], source_ids_BL, loss_mask_BL, first_layer=first)
        self._step_accounting.add_load(torch.stack([s.load_E for s in moe]), first_layer=first)
        self._router_M3[first : first + len(moe)] += torch.stack(
            [torch.stack([s.aux_loss.detach(), s.z_loss.detach(), s.dropped.float()]) for s in moe]
        ).double()

    # ---- logging, evaluation, checkpoints -------------------------------------------------
    def log_metrics(self) -> dict:
        acct = self.accounting.flush()
        router = (self.parallel.reduce_pp(self._router_M3) / max(self.micro_steps, 1)).cpu()  # stages: their layers
        self._router_M3.zero_()
        self.micro_steps = 0
        speed = self.throughput.summary(self.flops_per_token, self.peak_flops)
        self.throughput.reset()
        record = {
            "step": self.step,
            "loss": acct["mean_loss"],
            "step_loss": self.last.loss,
            "lr": self.last.lr,  # the learning rate the step used (the scheduler has moved on to the next one's)
            "grad_norm": self.last.grad_norm,
            "tokens_seen": self.tokens_seen,
            **speed,
            "memory": memory_stats(self.device),
            "aux_loss": router[:, 0].tolist(),
            "z_loss": router[:, 1].tolist(),
            "dropped": router[:, 2].tolist(),
            "expert_load": acct["expert_load"],
            "per_source": acct["per_source"],
            "routing": acct["routing"],
            "comm": self.parallel.comm_report(),
        }
        passes = getattr(self.data, "epoch", None)  # completed passes over the training set passed over most
        if passes is not None:
            record["epoch"] = passes
            if passes >= REPEATED_PASSES and not self._said_passes:
                self._said_passes = True
                repeated = getattr(self.data, "most_repeated", None)  # with several sets, the small one repeats
                log.warning(
                    "the run has passed over its training data %d times by step %d%s: beyond about %d passes repeated "
                    "tokens add little (Muennighoff et al. 2023, Scaling Data-Constrained Language Models); curate "
                    "more data for this many steps, lower this set's weight (with several sets), or train fewer steps",
                    passes, self.step, f" (the set {repeated})" if repeated else "", REPEATED_PASSES,
                )  # fmt: skip
        for h in self.hooks:
            record |= h.report()
        self.metrics.write(record)
        self.alerts.check_interval(
            self.step,
            tokens_per_s=speed["tokens_per_s"],
            data_wait_pct=speed["data_wait_pct"],
            grad_norm=self.last.grad_norm,
        )
        log.info(
            "step %d loss %.4f lr %.2e %.0f tok/s mfu %.1f%%",
            self.step,
            record["loss"] or float("nan"),
            record["lr"],
            speed["tokens_per_s"],
            100 * speed["mfu"],
        )
        return record

    def after_step(self, *, last: bool = False) -> list[dict]:
        """The hooks' records after this step (attribution's stretches), written to the metrics, their time
        kept out of the throughput figures."""
        mark = self.throughput.mark()
        records = [r for h in self.hooks if (r := h.after_step(self.step, last=last)) is not None]
        if records:
            self.optimizer.zero_grad(set_to_none=True)  # what a probe left in the gradients
        for record in records:
            self.metrics.write(record)
        self.throughput.exclude_since(mark)
        return records

    @torch.no_grad()
    def evaluate(self, *, record: bool = True) -> dict | None:
        """Per-source held-out loss over the val split (all of it, or at most ``eval_batches`` batches), written to
        the metrics unless ``record`` is false.

        A cap reads each shard's sources in turn, but documents longer than the capped pass leave later sources
        out; the first such evaluation names them (leave the cap unset to report every source).
        """
        if self.val_data is None:
            return None
        mark, started = self.throughput.mark(), time.perf_counter()
        # each data-parallel rank scores its share of the pass; under pipeline parallelism the sums arise on the
        # last stage: summed over both, and rank 0 writes them
        acct = SourceAccounting(
            self.sources, n_moe_layers=0, n_experts=0, device=self.device, reduce=self.parallel.reduce_sum
        )

        def account(logits_BLV, targets_BL, source_ids_BL, loss_mask_BL):
            acct.add_loss(cross_entropy_per_token(logits_BLV, targets_BL), source_ids_BL, loss_mask_BL)
            return logits_BLV.new_zeros(())  # nothing to differentiate

        self.model.eval()
        loader = self.val_data()
        try:
            batches = self.progress.evaluating(loader, total=self.cfg.eval_batches)
            capped = zip(itertools.count() if self.cfg.eval_batches is None else range(self.cfg.eval_batches), batches)
            # preempted: the checkpoint matters more than this pass
            held_out = (
                batch.to(self.device) for _, batch in itertools.takewhile(lambda _: stop_requested() is None, capped)
            )
            if self.pipeline is not None:
                self.pipeline.evaluate(
                    held_out,
                    loss=account,
                    rows=self.cfg.data.batch_size,
                    cols=self.cfg.data.seq_len,
                    autocast=self._autocast,
                )
            else:
                for b in held_out:
                    with self._autocast():
                        account(self.model(b.tokens, b.doc_ids).logits_BLV, b.targets, b.source_ids, b.loss_mask)
        finally:
            if hasattr(loader, "close"):
                loader.close()
        self.model.train()
        if stop_requested() is not None:
            log.warning("evaluation at step %d abandoned: a stop was requested (a resume redoes it)", self.step)
            self._eval_pending = self.step
            return None
        self._eval_pending = -1
        result = acct.flush()
        result_record = {
            "step": self.step,
            "eval": {
                "loss": result["mean_loss"],
                "per_source": {k: v["mean_loss"] for k, v in result["per_source"].items()},
            },
        }
        missing = [k for k, v in result_record["eval"]["per_source"].items() if v is None]
        if missing and not self._said_eval_cap:
            self._said_eval_cap = True
            if self.cfg.eval_batches is not None:
                log.warning(
                    "held-out loss for %s is missing: [train] eval_batches = %d (%d tokens a pass) ended before "
                    "their rows (or the val split has none); raise eval_batches, or leave it unset to read the whole "
                    "val split",
                    missing,
                    self.cfg.eval_batches,
                    self.cfg.eval_batches * self.cfg.data.batch_size * self.cfg.data.seq_len,
                )
            else:  # the whole val split was read: it has none of their rows
                log.warning(
                    "held-out loss for %s is missing: the val split holds none of their rows (every one rejected, "
                    "or the split sent none to val); their held-out loss is null in metrics.jsonl",
                    missing,
                )
        if record:
            self.metrics.write(result_record)
        self.throughput.exclude_since(mark)
        self._say_eval_cost(started)
        return result_record

    def _say_eval_cost(self, started: float) -> None:
        """Once: an evaluation of the whole val split (no ``eval_batches``) that takes more than half the training
        time since the last one (a real corpus's 5% val split can be thousands of batches)."""
        now, last = time.perf_counter(), self._last_eval
        self._last_eval = (self.step, now)
        if self._said_eval_cost or self.cfg.eval_batches is not None or last is None or self.step <= last[0]:
            return
        if now - started > 0.5 * (started - last[1]):
            self._said_eval_cost = True
            log.warning(
                "the evaluation at step %d took %.1f s against %.1f s of training since step %d: each one reads the "
                "whole val split; set [train] eval_batches to cap it",
                self.step,
                now - started,
                started - last[1],
                last[0],
            )

    def state_dict(self) -> dict:
        """The whole run in the one-process format (checkpoints keep weights and moments sharded instead)."""
        return {
            "model": self.parallel.model_state(self.model),
            "optimizer": self.parallel.optim_state(self.model, self.optimizer),
            **self._run_state(),
        }

    def _run_state(self) -> dict:
        """Everything but the weights and the optimizer's moments; each hook's state under its name."""
        return {
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "rng": rng_state(),
            "data": self.data.state_dict(),
            "accounting": self.accounting.state_dict(),
            "alerts": self.alerts.state_dict(),
            **{h.name: h.state_dict() for h in self.hooks},
            "counters": {"step": self.step, "tokens_seen": self.tokens_seen, "eval_pending": self._eval_pending},
            "model_config": dataclasses.asdict(self.model.cfg),
            "sources": self.sources,
        }

    def load_state_dict(self, state: dict, *, shards: Path | None = None) -> None:
        """Restore the run; ``shards``: a checkpoint's DCP folder holding the weights and moments ``state`` lacks."""
        saved, mine = state.get("model_config") or {}, dataclasses.asdict(self.model.cfg)
        if not isinstance(saved, dict):  # damaged, or not winnow's: nothing to compare [train.model] with
            raise CheckpointError(
                f"the checkpoint's model_config is a {type(saved).__name__}, not a table of [train.model] keys; "
                "start a run of its own (a new train.output, or [train.checkpoint] resume = false)"
            )
        differ = [k for k in sorted(saved.keys() & mine.keys()) if saved[k] != mine[k]]
        if differ:  # its weights would not fit (config.json, which the run folder's check reads, may say otherwise)
            detail = ", ".join(f"{k} (the checkpoint's {saved[k]!r}, this run's {mine[k]!r})" for k in differ)
            raise CheckpointError(
                f"the checkpoint's model differs from [train.model] in {detail}; resume with the checkpoint's "
                "[train.model], or start a run of its own (a new train.output, or [train.checkpoint] resume = false)"
            )
        if list(state["sources"]) != self.sources:  # per-source sums and ids would be mixed up
            raise CheckpointError(
                f"the checkpoint was trained on sources {list(state['sources'])}, this run has "
                f"{self.sources}; resume with the same data, or start a new run (another output)"
            )
        # this run's [train.optim] (a resume with another lr, betas or weight decay continues with them): the
        # checkpoint brings back its moments and step, but its param groups and the schedule's base carry the old
        # run's settings
        settings = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        base_lrs = list(self.scheduler.base_lrs)
        if shards is not None:
            self.parallel.load_shards(self.model, self.optimizer, shards, state["optimizer"]["param_groups"])
        else:
            self.parallel.load_model_state(self.model, state["model"])
            self.parallel.load_optim_state(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scheduler.base_lrs = base_lrs
        factors = getattr(self.scheduler, "lr_lambdas", None)  # LambdaLR's (build_scheduler): the schedule's lr now
        for i, (group, own) in enumerate(zip(self.optimizer.param_groups, settings, strict=True)):
            lr = base_lrs[i] * factors[i](self.scheduler.last_epoch) if factors else group["lr"]
            group.update(own, lr=lr)
        if self.scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.data.load_state_dict(state["data"])
        self._batches = iter(self.data)
        self.accounting.load_state_dict(state["accounting"])
        self.alerts.load_state_dict(state["alerts"])
        if "stability" not in state and "spikes" in state:  # a checkpoint from before the hooks
            state = {**state, "stability": {"spikes": state["spikes"], "skipped": state["counters"]["skipped"]}}
        for h in self.hooks:
            h.load_state_dict(state.get(h.name))
        self.step, self.tokens_seen = state["counters"]["step"], state["counters"]["tokens_seen"]
        self._eval_pending = state["counters"].get("eval_pending", -1)  # older checkpoints: none
        set_rng_state(state["rng"])

    def save_checkpoint(self) -> Path:
        mark = self.throughput.mark()
        path = self.parallel.save_checkpoint(self.checkpoints, self.step, self._run_state(), self.model, self.optimizer)
        self._saved_step = self.step
        self.throughput.exclude_since(mark)
        return path

    def resume(self) -> bool:
        """Continue from the newest valid checkpoint, once: ``fit`` calls it, and a caller may call it first, so that
        a resume this run cannot continue is refused before it writes any record of the run."""
        if self._resumed is not None:
            return self._resumed
        found = self.checkpoints.load_latest(full=False)  # each rank reads its own part of the shards below
        self._resumed = found is not None
        if found is None:
            return False
        path, state = found
        self.load_state_dict(state, shards=path / SHARDS_DIR if has_shards(path) else None)
        log.info("resumed from %s (step %d)", path, self.step)
        return True

    # ---- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the training loader's worker processes (a later ``fit`` would restart them)."""
        close = getattr(self.data, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the loop -----------------------------------------------------------------------
    def _on_signal(self, signum: int) -> None:
        log.warning("received signal %d: checkpointing after this step and exiting (again: stop now)", signum)
        self._stop_signal = signum

    def fit(self) -> dict:
        """Train to ``cfg.steps`` (resuming first when asked); returns a summary of the run.

        SIGTERM/SIGINT at any point of the loop (a step, an evaluation, a checkpoint save) ends the
        run after the current step with a checkpoint; a second one stops at once (``train.shutdown``).
        """
        cfg = self.cfg
        if cfg.checkpoint.resume:
            self.resume()
        if self.parallel.is_main:  # metrics from the resumed step on are written once; a fresh start, apart
            continue_run_folder(self.run_dir, self.step, cfg.metrics.log_every)
        log.info("MFU basis: %.3g FLOP/s (%s); %.3g FLOP/token", self.peak_flops, self.peak_basis, self.flops_per_token)
        self.throughput.reset()
        self.progress.open(self.step, self.tokens_seen)
        final_eval, stopped = None, self._reports().get("stopped")  # a stopped run's checkpoint stays stopped
        if stopped is not None:  # its rules may have changed since: the stop stands, and is said with what to do
            log.warning(
                "the run stopped early at step %d (%s); a resume keeps it stopped, whatever [train.stop] says now: "
                "to train on, start a run of its own (a new train.output, or [train.checkpoint] resume = false)",
                self.step,
                stopped,
            )
        finished = self.step >= cfg.steps or stopped is not None  # its final records are in the metrics already,
        redo_final = finished and self._eval_pending == self.step  # but for an evaluation a stop abandoned
        with on_stop_signals(self._on_signal), contextlib.closing(self.progress):  # the bar closes on errors too
            if self.init is not None and self.step == 0:
                final_eval = self.evaluate()  # step 0, before any update: what forgetting and gain are measured from
                stopped = self._stop_reason(final_eval)  # and the best [train.stop] must improve on
            elif 0 < self.step < cfg.steps and self._eval_pending == self.step and stopped is None:
                final_eval = self.evaluate()  # the periodic evaluation a stop abandoned: its record, its stop rules
                stopped = self._stop_reason(final_eval)
            while self.step < cfg.steps and self._stop_signal is None and stopped is None:
                self.train_step()
                self.progress.step(self.step, self.tokens_seen, self.last.loss)
                self.after_step()
                if self.step % cfg.metrics.log_every == 0 or self.step == cfg.steps:
                    self.log_metrics()
                if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                    final_eval = self.evaluate()
                    stopped = self._stop_reason(final_eval)
                    if stopped is not None:
                        break
                if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                    self.save_checkpoint()
            if self._stop_signal is None and not finished:
                self.after_step(last=True)  # the last, shorter stretch: the final record covers every attributed step
            if self._stop_signal is None and (stopped is None or final_eval is None or final_eval["step"] != self.step):
                final_eval = self.evaluate(record=not finished or redo_final)  # the metrics hold it once
            preempted = self._stop_signal is not None  # also when the signal came during that last evaluation
            if preempted:
                final_eval = None
            # again at a step already saved when a stop abandoned its evaluation: the resume must know to redo it
            again = self._saved_step != self.step or self._eval_pending == self.step
            checkpoint = self.save_checkpoint() if again else self.checkpoints.checkpoints()[0]
        self.metrics.close()
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "skipped": self._reports().get("skipped_steps", {}),
            "preempted": preempted,
            "stopped": stopped,
            "checkpoint": str(checkpoint),
            "eval": final_eval,
            "run_dir": str(self.run_dir),
            "mixing": h.report() if (h := self.hook("mixing")) else None,
        }

    def _reports(self) -> dict:
        return {k: v for h in self.hooks for k, v in h.report().items()}

    def _stop_reason(self, eval_record: dict | None) -> str | None:
        """A hook's reason to stop after this evaluation, logged and recorded; the loop then ends with a checkpoint."""
        reason = next((r for h in self.hooks if eval_record is not None and (r := h.after_eval(eval_record))), None)
        if reason is None:
            return None
        if self.step % self.cfg.metrics.log_every:
            self.log_metrics()  # the interval's training figures up to the stopping step
        self.metrics.write({"step": self.step, "stop": {"reason": reason}})
        log.warning("stopping early at step %d: %s", self.step, reason)
        return reason
