"""The training loop: micro-batches → loss → stability checks → optimizer step → metrics and checkpoints.

One host sync per optimizer step (the loss and gradient norm, needed to decide whether to
skip the step); per-source sums stay on the device until a log step.
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

import numpy as np
import torch

from train.accounting import SourceAccounting, check_source_ids
from train.adaptive import AdaptiveMix, CounterfactualMix
from train.alerts import AlertKind, Alerts, SkipReason, SpikeDetector
from train.attribution import SourceAttribution
from train.checkpoint import SHARDS_DIR, CheckpointManager, has_shards
from train.config import TrainConfig
from train.errors import CheckpointError, ConfigError
from train.init import Initialization
from train.metrics import Throughput, memory_stats, peak_flops_basis
from train.model import Transformer, cross_entropy_per_token, distillation_per_token
from train.optim import build_optimizer, build_scheduler
from train.progress import TrainProgress
from train.parallel import Parallel
from train.rng import rng_state, set_rng_state
from train.runfolder import continue_run_folder
from train.shutdown import on_stop_signals, stop_requested
from train.stopping import EarlyStopping

log = logging.getLogger(__name__)
_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(slots=True)
class StepResult:
    """What one optimizer step did; ``skipped`` is None or why the step was skipped."""

    step: int
    loss: float
    grad_norm: float
    skipped: SkipReason | None
    lr: float = 0.0  # the learning rate the step used


class Trainer:
    """Trains ``model`` on ``data`` (an endless iterable of ``Batch`` with ``state_dict``) into ``run_dir``."""

    def __init__(self, cfg: TrainConfig, *, model: Transformer, data: Iterable, sources: list[str], run_dir: str | Path,
                 device: torch.device, val_data: Callable[[], Iterable] | None = None,
                 teacher: Transformer | None = None, parallel: Parallel | None = None,
                 init: Initialization | None = None, progress: TrainProgress | None = None,
                 mixer: AdaptiveMix | CounterfactualMix | None = None) -> None:
        self.cfg, self.device, self.run_dir = cfg, device, Path(run_dir)
        self.model = model.to(device)
        self.parallel = parallel or Parallel.local(device)
        # the layout applied to the plain model in place; self.net is what forward is called on (DDP's wrapper)
        self.net = self.parallel.parallelize(self.model, grad_accum=cfg.grad_accum,
                                             activation_checkpointing=cfg.activation_checkpointing)
        if cfg.optim.name == "lamb" and self.parallel.tp_layouts:
            raise ConfigError("train.optim.name = 'lamb' with train.parallel.tp > 1: LAMB's trust ratio needs each "
                              "whole parameter's norm and every tp rank holds a part of the split ones; use 'adamw'")
        self.pipeline = self.parallel.pipeline  # pipeline parallel: self.model holds this rank's stages only
        if self.pipeline is not None:
            from train.parallel.pipeline import check_pipeline_run

            check_pipeline_run(cfg, attribution=bool(cfg.attribution.every and val_data is not None))
        # under pipeline parallelism only the last stage scores with a teacher or a mix's reference: the
        # other stages drop theirs rather than hold a whole model on the device for nothing
        self._scores = self.pipeline is None or self.pipeline.is_last
        self.teacher = teacher.to(device).eval() if teacher is not None and self._scores else None
        self.data, self._batches = data, iter(data)
        self.val_data = val_data
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, cfg.steps,
                                         start_factor=init.start_factor(cfg.optim) if init else 0.0)
        self.init = init  # a continued run: the base's weights now; a resume below replaces them with its own
        if init is not None:
            init.apply(self.model, self.optimizer, self.scheduler, self.parallel)
        self.stopping = EarlyStopping(cfg.stop)
        self.scaler = self.parallel.grad_scaler() if cfg.precision == "fp16" else None
        shape = dict(n_moe_layers=model.cfg.n_moe_layers, n_experts=model.cfg.n_experts, device=device)
        self.sources = list(sources)
        self.accounting = SourceAccounting(self.sources, **shape, reduce=self.parallel.reduce_sum)  # since the last log step
        self._step_accounting = SourceAccounting(self.sources, **shape)  # merged once a step is accepted
        self._router_M3 = torch.zeros(model.cfg.n_moe_layers, 3, dtype=torch.float64, device=device)
        self.alerts = Alerts(cfg.alerts, self.run_dir)
        self.spikes = SpikeDetector(sigma=cfg.alerts.spike_sigma, window=cfg.alerts.spike_window,
                                    min_history=cfg.alerts.spike_min_history)
        self.metrics = self.parallel.metrics_writer(self.run_dir, cfg.metrics)
        # a bar only where someone reads it: the caller's choice, and rank 0
        self.progress = progress if progress is not None and self.parallel.is_main else TrainProgress(total=cfg.steps, enabled=False)
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", keep_last=cfg.checkpoint.keep_last,
                                             mode=cfg.checkpoint.mode)
        self.throughput = Throughput(self.parallel.comm)
        self.peak_flops, self.peak_basis = peak_flops_basis(device, cfg.metrics.peak_flops)
        self.flops_per_token = model.cfg.flops_per_token(cfg.data.seq_len)
        self.step, self.tokens_seen, self.micro_steps = 0, 0, 0
        self.skipped = {r.value: 0 for r in SkipReason}  # plain str keys: they go into checkpoints and JSON
        self.last: StepResult | None = None
        self._stop_signal: int | None = None
        self._saved_step = -1
        self.attribution = (SourceAttribution(cfg.attribution, model=self.model, optimizer=self.optimizer, sources=self.sources,
                                              val_data=val_data, device=device, parallel=self.parallel,
                                              micro_batch_shape=(cfg.data.batch_size, cfg.data.seq_len),
                                              autocast=self._autocast)
                            if cfg.attribution.every and val_data is not None else None)
        self._attr_split = False  # whether this step's gradients are split per source
        if cfg.mixing.active != (mixer is not None):
            raise ConfigError(f"train.mixing.adaptive = {cfg.mixing.adaptive!r} but the trainer was given "
                              f"{'no' if mixer is None else 'an'} adaptive mix; build it with "
                              "pipelines.train.build_mixer(cfg.mixing, loader, tokenizer, device), or pass none")
        self.mixer = mixer  # [train.mixing] adaptive: reweights self.data's sets (train/adaptive.py)
        if isinstance(mixer, CounterfactualMix):
            mixer.attach(self.attribution)
        elif mixer is not None:
            mixer.reference = mixer.reference.to(device) if self._scores else None
        self._mixing = False  # whether this step's batch updates the mix weights

    # ---- one optimizer step -------------------------------------------------------------
    def _autocast(self):
        dtype = _AMP_DTYPES.get(self.cfg.precision)
        return torch.autocast(self.device.type, dtype=dtype) if dtype else contextlib.nullcontext()

    def _next_batches(self) -> list:
        batches = []
        for _ in range(self.cfg.grad_accum):
            start = time.perf_counter()
            batches.append(next(self._batches))
            check_source_ids(batches[-1].source_ids, self.sources, getattr(self.data, "sources", None))
            self.throughput.wait += time.perf_counter() - start
        return batches

    def _micro_step(self, batch, n_tokens: int, n_micro: int) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns its (detached) share of the step's data loss."""
        b = batch.to(self.device)
        with self._autocast():
            out = self.net(b.tokens, b.doc_ids)
            token_loss_BL = cross_entropy_per_token(out.logits_BLV, b.targets, label_smoothing=self.cfg.label_smoothing)
            train_loss_BL = self._train_loss(out.logits_BLV, token_loss_BL, b.tokens, b.doc_ids)
            data_loss = (train_loss_BL * b.loss_mask).sum() / max(n_tokens, 1)
            if self._attr_split:  # per-source parts of this gradient, from the same forward pass
                self.attribution.add_micro_batch(train_loss_BL * b.loss_mask / max(n_tokens, 1), b.source_ids)
            loss = data_loss * self.parallel.grad_scale + out.router_loss / n_micro
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        self._account_loss(out.logits_BLV, token_loss_BL, b.tokens, b.doc_ids, b.targets, b.source_ids, b.loss_mask)
        if out.moe:
            self._record_moe(0, out.moe, b.source_ids, b.loss_mask)
        self.micro_steps += 1
        return data_loss.detach()

    def _train_loss(self, logits_BLV, token_loss_BL, tokens_BL, doc_ids_BL) -> torch.Tensor:
        """The per-token loss to differentiate: ``token_loss_BL``, mixed with the teacher's soft targets under
        ``[train.distill]`` (the whole teacher, on the micro-batch's inputs)."""
        if self.teacher is None:
            return token_loss_BL
        with torch.no_grad(), self._autocast():
            teacher_BLV = self.teacher(tokens_BL, doc_ids_BL).logits_BLV
        soft_BL = distillation_per_token(logits_BLV, teacher_BLV, temperature=self.cfg.distill.temperature)
        return (1 - self.cfg.distill.alpha) * token_loss_BL + self.cfg.distill.alpha * soft_BL

    def _account_loss(self, logits_BLV, token_loss_BL, tokens_BL, doc_ids_BL, targets_BL, source_ids_BL,
                      loss_mask_BL) -> None:
        """The micro-batch's plain cross-entropy (without label smoothing: comparable across runs, and with
        the reference's) into the per-source sums and, on a mixing step, the adaptive mix."""
        if self.cfg.label_smoothing > 0:
            with torch.no_grad():
                token_loss_BL = cross_entropy_per_token(logits_BLV.detach(), targets_BL)
        if self._mixing:
            with self._autocast():
                self.mixer.add(token_loss_BL, tokens_BL, doc_ids_BL, targets_BL, source_ids_BL, loss_mask_BL)
        self._step_accounting.add_loss(token_loss_BL, source_ids_BL, loss_mask_BL)

    def _record_moe(self, first: int, moe: list, source_ids_BL: torch.Tensor, loss_mask_BL: torch.Tensor) -> None:
        """Routing, load and router losses of MoE layers ``first, first + 1, ...`` (all of them, or a pipeline stage's)."""
        self._step_accounting.add_routing([s.experts_TK for s in moe], source_ids_BL, loss_mask_BL, first_layer=first)
        self._step_accounting.add_load(torch.stack([s.load_E for s in moe]), first_layer=first)
        self._router_M3[first:first + len(moe)] += torch.stack(
            [torch.stack([s.aux_loss.detach(), s.z_loss.detach(), s.dropped.float()]) for s in moe]).double()

    def _pipeline_step(self, batches: list, n_tokens: int) -> torch.Tensor:
        """The step's micro-batches through the pipeline schedule; returns this dp rank's share of the data loss.

        The loss is the one ``_micro_step`` differentiates, computed on the last stage; the router
        losses join each stage's backward (``train.parallel.pipeline``). Every pp rank returns the
        share, summed over the pipeline.
        """
        total = torch.zeros((), device=self.device)
        # fp16: the scaler's factor on the data loss and on the router losses; ``scale`` (not ``get_scale``)
        # also starts the scaler on the stages that never call the loss
        scale = float(self.scaler.scale(torch.ones((), device=self.device))) if self.scaler else 1.0

        def loss(logits_BLV, targets_BL, source_ids_BL, loss_mask_BL, tokens_BL=None, doc_ids_BL=None):
            nonlocal total
            token_loss_BL = cross_entropy_per_token(logits_BLV, targets_BL, label_smoothing=self.cfg.label_smoothing)
            # the last stage runs the whole teacher and reference on the micro-batch's inputs
            train_loss_BL = self._train_loss(logits_BLV, token_loss_BL, tokens_BL, doc_ids_BL)
            data_loss = (train_loss_BL * loss_mask_BL).sum() / max(n_tokens, 1)
            self._account_loss(logits_BLV, token_loss_BL, tokens_BL, doc_ids_BL, targets_BL, source_ids_BL, loss_mask_BL)
            total += data_loss.detach()
            differentiated = data_loss * self.parallel.grad_scale
            return self.scaler.scale(differentiated) if self.scaler else differentiated

        def split(source_ids_BL):  # each stage splits its micro-batches' weight gradients by source (attribution)
            return self.attribution.micro_batch(source_ids_BL, loss_scale=self.parallel.grad_scale * scale)
        self.pipeline.run([b.to(self.device) for b in batches], loss=loss, record=self._record_moe,
                          autocast=self._autocast, loss_scale=scale, split=split if self._attr_split else None,
                          inputs=self._mixing or self.cfg.distill is not None)
        self.micro_steps += len(batches)
        return self.parallel.reduce_pp(total)  # every stage then decides the same skip

    def _split(self, batch):
        """While attributing: each source's part of the micro-batch's gradients (``train.attribution``)."""
        if not self._attr_split:
            return contextlib.nullcontext()
        scale = self.parallel.grad_scale * (self.scaler.get_scale() if self.scaler else 1.0)
        return self.attribution.micro_batch(batch.source_ids, loss_scale=scale)

    def train_step(self) -> StepResult:
        self.model.train()
        self._attr_split = self.attribution is not None and self.attribution.begin_step(self.step)
        self._mixing = self.mixer is not None and self.mixer.due(self.step)
        batches = self._next_batches()
        # host-side (the batches are still on the CPU), summed over ranks: the global-batch mean's denominator
        n_tokens = self.parallel.global_tokens(sum(b.num_tokens for b in batches))
        loss = torch.zeros((), device=self.device)
        if self.pipeline is not None:
            loss = self._pipeline_step(batches, n_tokens)
        else:
            for i, batch in enumerate(batches):
                with self.parallel.grad_sync(self.net, last=i == len(batches) - 1), self._split(batch):
                    loss += self._micro_step(batch, n_tokens, len(batches))
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        clip = self.cfg.optim.grad_clip or float("inf")
        grad_norm = self.parallel.clip_grad_norm(self.model, clip)
        loss_value, norm_value = self.parallel.step_values(loss, grad_norm)  # the one sync per step
        skipped = self._verdict(loss_value, norm_value, batches)
        if skipped is None:
            if self._attr_split:
                self.attribution.before_optimizer_step()
            (self.scaler.step if self.scaler else lambda opt: opt.step())(self.optimizer)
            if self._attr_split:  # torch's clipping factor, from the same global norm
                self.attribution.after_optimizer_step(min(1.0, clip / (norm_value + 1e-6)))
            self.spikes.accept(loss_value)
            self.accounting.merge(self._step_accounting)
            self.model.update_expert_bias(self.parallel.global_load(self._step_accounting.load_ME))
            self.tokens_seen += n_tokens
            if self._mixing:  # the next batches are drawn by the new weights
                self.data.reweight(self.mixer.update(self.parallel.reduce_sum))
        else:
            if self._attr_split:
                self.attribution.skip_step()
            if self._mixing:
                self.mixer.discard()
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

    def _verdict(self, loss: float, grad_norm: float, batches: list) -> SkipReason | None:
        """Decide whether to skip this step; every skip is alerted with the batch's sources and origins."""
        if self.cfg.skip_nonfinite and not (np.isfinite(loss) and np.isfinite(grad_norm)):
            self.alerts.emit(AlertKind.NONFINITE, self.step + 1,
                             f"non-finite loss {loss} or gradient norm {grad_norm}; step skipped",
                             loss=str(loss), grad_norm=str(grad_norm), **self._batch_provenance(batches))
            reason = SkipReason.NONFINITE
        elif self.spikes.is_spike(loss):
            self.alerts.emit(AlertKind.LOSS_SPIKE, self.step + 1, f"loss {loss:.4g} is a spike", loss=loss,
                             **self._batch_provenance(batches))
            if not self.cfg.alerts.skip_spikes:
                return None
            reason = SkipReason.SPIKE
        else:
            return None
        self.skipped[reason] += 1
        return reason

    def _batch_provenance(self, batches: list) -> dict:
        """Which sources and shard rows a batch held: what an alert about it names."""
        ids = torch.cat([b.source_ids[b.loss_mask] for b in batches]).unique().tolist()
        return {"sources": [self.sources[i] for i in ids if 0 <= i < len(self.sources)],
                "origins": [list(o) for b in batches for o in b.origins]}

    # ---- logging, evaluation, checkpoints -------------------------------------------------
    def log_metrics(self) -> dict:
        acct = self.accounting.flush()
        router = (self.parallel.reduce_pp(self._router_M3) / max(self.micro_steps, 1)).cpu()  # stages: their layers
        self._router_M3.zero_()
        self.micro_steps = 0
        speed = self.throughput.summary(self.flops_per_token, self.peak_flops)
        self.throughput.reset()
        record = {"step": self.step, "loss": acct["mean_loss"], "step_loss": self.last.loss,
                  "lr": self.scheduler.get_last_lr()[0], "grad_norm": self.last.grad_norm,
                  "tokens_seen": self.tokens_seen, **speed, "memory": memory_stats(self.device),
                  "aux_loss": router[:, 0].tolist(), "z_loss": router[:, 1].tolist(), "dropped": router[:, 2].tolist(),
                  "expert_load": acct["expert_load"], "per_source": acct["per_source"], "routing": acct["routing"],
                  "skipped_steps": dict(self.skipped), "comm": self.parallel.comm_report()}
        if self.mixer is not None:
            record |= self.mixer.report(self.sources)
        self.metrics.write(record)
        self.alerts.check_interval(self.step, tokens_per_s=speed["tokens_per_s"],
                                   data_wait_pct=speed["data_wait_pct"], grad_norm=self.last.grad_norm)
        log.info("step %d loss %.4f lr %.2e %.0f tok/s mfu %.1f%%", self.step, record["loss"] or float("nan"),
                 record["lr"], speed["tokens_per_s"], 100 * speed["mfu"])
        return record

    def attribute(self) -> dict:
        """Close the attributed stretch that ends at this step and log its record (``train.attribution``)."""
        mark = self.throughput.mark()
        record = self.attribution.close(step=self.step)
        self.optimizer.zero_grad(set_to_none=True)
        self.metrics.write(record)
        self.throughput.exclude_since(mark)
        return record

    def counterfactual(self) -> dict | None:
        """What scaling each source's share would do to each held-out loss, read at the current step and logged
        (``train.attribution.counterfactual``); None when no stretch was attributed yet."""
        mark = self.throughput.mark()
        record = self.attribution.counterfactual(self.step)
        self.optimizer.zero_grad(set_to_none=True)
        if record is None:
            log.warning("attribution: the run ended at step %d before its first attributed stretch closed "
                        "(train.attribution start = %d, every = %d): no attribution and no counterfactual", self.step,
                        self.cfg.attribution.start, self.cfg.attribution.every)
        else:
            self.metrics.write(record)
        self.throughput.exclude_since(mark)
        return record

    @torch.no_grad()
    def evaluate(self) -> dict | None:
        """Per-source held-out loss over the val split (all of it, or at most ``eval_batches`` batches).

        Val shards are per source, so a cap reads the first sources only; leave it unset to
        report every source.
        """
        if self.val_data is None:
            return None
        mark = self.throughput.mark()
        # under pipeline parallelism the sums arise on the last stage and rank 0 writes them
        acct = SourceAccounting(self.sources, n_moe_layers=0, n_experts=0, device=self.device, reduce=self.parallel.reduce_pp)
        self.model.eval()
        loader = self.val_data()
        try:
            with torch.no_grad():
                batches = self.progress.evaluating(loader, total=self.cfg.eval_batches)
                capped = zip(itertools.count() if self.cfg.eval_batches is None else range(self.cfg.eval_batches), batches)
                # preempted: the checkpoint matters more than this pass
                held_out = (batch.to(self.device) for _, batch in itertools.takewhile(lambda _: stop_requested() is None, capped))
                if self.pipeline is not None:
                    self._pipeline_evaluate(held_out, acct)
                else:
                    for b in held_out:
                        with self._autocast():
                            logits_BLV = self.model(b.tokens, b.doc_ids).logits_BLV
                        acct.add_loss(cross_entropy_per_token(logits_BLV, b.targets), b.source_ids, b.loss_mask)
        finally:
            if hasattr(loader, "close"):
                loader.close()
        self.model.train()
        if stop_requested() is not None:
            log.warning("evaluation at step %d abandoned: a stop was requested", self.step)
            return None
        result = acct.flush()
        record = {"step": self.step, "eval": {"loss": result["mean_loss"],
                  "per_source": {k: v["mean_loss"] for k, v in result["per_source"].items()}}}
        self.metrics.write(record)
        self.throughput.exclude_since(mark)
        return record

    def _pipeline_evaluate(self, held_out: Iterable, acct: SourceAccounting) -> None:
        def loss(logits_BLV, targets_BL, source_ids_BL, loss_mask_BL):
            acct.add_loss(cross_entropy_per_token(logits_BLV, targets_BL), source_ids_BL, loss_mask_BL)
            return logits_BLV.new_zeros(())  # nothing to differentiate

        self.pipeline.evaluate(held_out, loss=loss, rows=self.cfg.data.batch_size, cols=self.cfg.data.seq_len,
                               autocast=self._autocast)

    def state_dict(self) -> dict:
        """The whole run in the one-process format (checkpoints keep weights and moments sharded instead)."""
        return {"model": self.parallel.model_state(self.model),
                "optimizer": self.parallel.optim_state(self.model, self.optimizer), **self._run_state()}

    def _run_state(self) -> dict:
        """Everything but the weights and the optimizer's moments."""
        return {"scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict() if self.scaler else None,
                "rng": rng_state(), "data": self.data.state_dict(), "accounting": self.accounting.state_dict(),
                "spikes": self.spikes.state_dict(), "alerts": self.alerts.state_dict(),
                "attribution": self.attribution.state_dict() if self.attribution else None,
                "mixing": self.mixer.state_dict() if self.mixer else None,
                "stopping": self.stopping.state_dict(),
                "counters": {"step": self.step, "tokens_seen": self.tokens_seen, "skipped": dict(self.skipped)},
                "model_config": dataclasses.asdict(self.model.cfg),
                "sources": self.sources}

    def load_state_dict(self, state: dict, *, shards: Path | None = None) -> None:
        """Restore the run; ``shards``: a checkpoint's DCP folder holding the weights and moments ``state`` lacks."""
        if list(state["sources"]) != self.sources:  # per-source sums and ids would be mixed up
            raise CheckpointError(f"the checkpoint was trained on sources {list(state['sources'])}, this run has "
                                  f"{self.sources}; resume with the same data, or start a new run (another output)")
        if shards is not None:
            self.parallel.load_shards(self.model, self.optimizer, shards, state["optimizer"]["param_groups"])
        else:
            self.parallel.load_model_state(self.model, state["model"])
            self.parallel.load_optim_state(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.data.load_state_dict(state["data"])
        self._batches = iter(self.data)
        self.accounting.load_state_dict(state["accounting"])
        self.spikes.load_state_dict(state["spikes"])
        self.alerts.load_state_dict(state["alerts"])
        if self.attribution is not None and state.get("attribution"):
            self.attribution.load_state_dict(state["attribution"])
        if state.get("stopping"):
            self.stopping.load_state_dict(state["stopping"])
        if self.mixer is not None:
            if not state.get("mixing"):
                raise CheckpointError("the checkpoint was trained without [train.mixing] adaptive; resume without it, "
                                      "or start a new run (another output)")
            self.mixer.load_state_dict(state["mixing"])
        counters = state["counters"]
        self.step, self.tokens_seen, self.skipped = counters["step"], counters["tokens_seen"], dict(counters["skipped"])
        set_rng_state(state["rng"])

    def save_checkpoint(self) -> Path:
        mark = self.throughput.mark()
        path = self.parallel.save_checkpoint(self.checkpoints, self.step, self._run_state(), self.model, self.optimizer)
        self._saved_step = self.step
        self.throughput.exclude_since(mark)
        return path

    def resume(self) -> bool:
        found = self.checkpoints.load_latest(full=False)  # each rank reads its own part of the shards below
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
            continue_run_folder(self.run_dir, self.step)
        log.info("MFU basis: %.3g FLOP/s (%s); %.3g FLOP/token", self.peak_flops, self.peak_basis, self.flops_per_token)
        self.throughput.reset()
        self.progress.open(self.step, self.tokens_seen)
        final_eval = None
        if self.init is not None and self.step == 0:
            final_eval = self.evaluate()  # step 0, before any update: what forgetting and gain are measured from
        with on_stop_signals(self._on_signal), contextlib.closing(self.progress):  # the bar closes on errors too
            while self.step < cfg.steps and self._stop_signal is None and self.stopping.reason is None:
                self.train_step()
                self.progress.step(self.step, self.tokens_seen, self.last.loss)
                if self.attribution is not None and self.attribution.due(self.step):
                    self.attribute()
                if self.step % cfg.metrics.log_every == 0 or self.step == cfg.steps:
                    self.log_metrics()
                if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                    final_eval = self.evaluate()
                    if final_eval is not None and cfg.stop.active and self._should_stop(final_eval):
                        break
                if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                    self.save_checkpoint()
            stopped = self.stopping.reason
            if self._stop_signal is None and self.attribution is not None and self.attribution.open_at not in (None, self.step):
                self.attribute()  # the last, shorter stretch: the final record covers every attributed step
            if self._stop_signal is None and self.attribution is not None:
                self.counterfactual()
            if self._stop_signal is None and (stopped is None or final_eval is None or final_eval["step"] != self.step):
                final_eval = self.evaluate()
            preempted = self._stop_signal is not None  # also when the signal came during that last evaluation
            if preempted:
                final_eval = None
            checkpoint = self.save_checkpoint() if self._saved_step != self.step else self.checkpoints.checkpoints()[0]
        self.metrics.close()
        return {"step": self.step, "tokens_seen": self.tokens_seen, "skipped": dict(self.skipped), "preempted": preempted,
                "stopped": stopped, "checkpoint": str(checkpoint), "eval": final_eval, "run_dir": str(self.run_dir),
                "mixing": self.mixer.report(self.sources) if self.mixer is not None else None}

    def _should_stop(self, eval_record: dict) -> bool:
        """Early stopping (``[train.stop]``): log and record the reason; the loop then ends with a final checkpoint."""
        reason = self.stopping.update(eval_record)
        if reason is None:
            return False
        if self.step % self.cfg.metrics.log_every:
            self.log_metrics()  # the interval's training figures up to the stopping step
        self.metrics.write({"step": self.step, "stop": {"reason": reason}})
        log.warning("stopping early at step %d: %s", self.step, reason)
        return True
