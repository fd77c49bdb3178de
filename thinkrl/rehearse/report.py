"""The rehearsal's one table, what it could not rehearse, and the projection
for the real cluster from the timed shrunken run and the config."""

from __future__ import annotations

import copy
import textwrap
from dataclasses import dataclass

from thinkrl.config.schema import Config
from thinkrl.doctor.core import gib



@dataclass(frozen=True)
class Projection:
    """Tokens per step, the shrunken run's time split, the micro-batch that fits."""

    prompts: int
    responses: int
    prompt_tokens: float
    response_tokens: int
    time_split: dict[str, float]
    """Stage -> share of a rehearsal step (its last step)."""
    micro_batches: list[tuple[int, int]]
    """(micro-batch per device, estimated peak bytes) for each size tried."""
    asked: int
    """The real run's micro-batch per device."""
    dynamic: bool
    """use_dynamic_bsz: the micro-batches are token budgets, not counts."""
    capacity: int
    device: str
    assumed: str

    @property
    def tokens_per_step(self) -> int:
        return int(self.responses * (self.prompt_tokens + self.response_tokens))

    @property
    def largest_fitting(self) -> int | None:
        fits = [b for b, peak in self.micro_batches if peak <= self.capacity]
        return max(fits) if fits else None

    def lines(self) -> list[str]:
        split = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(self.time_split.items(),
                                                                  key=lambda kv: -kv[1]) if v >= 0.01)
        peaks = ", ".join(f"{b}: {gib(p)}" for b, p in self.micro_batches)
        fit = self.largest_fitting
        memory = (f"of {gib(self.capacity)} per {self.device} device ({self.assumed}); estimated "
                  f"peak by micro-batch: {peaks}")
        micro = (f"largest micro-batch per device that fits: {fit if fit is not None else 'none'} "
                 f"(the run asks {self.asked}) {memory}" if not self.dynamic else
                 "micro-batches are token budgets (use_dynamic_bsz, ppo_max_token_len_per_gpu): "
                 f"the largest that fits is not projected; for reference, {memory}")
        return [
            f"tokens per step: ~{self.tokens_per_step:,} = {self.responses} responses x "
            f"({self.prompt_tokens:.0f} prompt tokens, the mean of the rows sampled with the real "
            f"tokenizer and template, + {self.response_tokens} response tokens, the "
            "data.max_response_length upper bound)",
            f"time split of a rehearsal step: {split or 'not measured'} (the shrunken model's "
            "shares: on the cluster generation's share grows with the response length)",
            micro,
        ]


def time_split(step: dict) -> dict[str, float]:
    total = step.get("timing_s/step") or 0.0
    if total <= 0:
        return {}
    return {key.removeprefix("timing_s/"): value / total for key, value in step.items()
            if key.startswith("timing_s/") and key not in ("timing_s/step", "timing_s/testing")}


def project(real: Config, *, prompt_tokens: list[int], last_step: dict,
            device_memory_gib: float | None = None, target=None) -> Projection:
    """The doctor's memory estimate of the real run at each micro-batch size
    that divides its per-device mini-batch, on the real device kind."""
    from thinkrl.config.checks import validate
    from thinkrl.doctor import DoctorContext
    from thinkrl.doctor.memory import estimate_memory

    sizes = validate(real)
    from thinkrl.doctor.targets import DEFAULT_FOR_KIND, parse_target

    device = real.trainer.device if real.trainer.device != "auto" else "cuda"
    if target is not None:  # --target names the cluster's device
        device = target.kind
    if device_memory_gib is not None:
        capacity, assumed = int(device_memory_gib * 2**30), "--device-memory-gib"
    elif target is not None or device in DEFAULT_FOR_KIND:
        named = target or parse_target(DEFAULT_FOR_KIND[device])
        capacity = named.bytes_per_device
        assumed = named.describe() if target is not None else f"{named.label}, assumed (--target names another)"
    else:  # a CPU run: this machine is the real one
        from thinkrl.doctor.memory import device_capacity
        capacity, assumed = device_capacity("cpu")
    per_device = sizes.responses_per_mini_batch_per_device
    tried = []
    for micro in (b for b in range(1, per_device + 1) if per_device % b == 0):
        cfg = copy.deepcopy(real)
        cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = micro
        cfg.actor_rollout_ref.actor.ppo_micro_batch_size = None  # verl's all-device key, replaced
        ctx = DoctorContext(cfg, device=device)  # the cluster's kind, not this machine's
        tried.append((micro, estimate_memory(ctx, capacity=capacity).peak))
        if tried[-1][1] > capacity and len(tried) > 1 and tried[-2][1] > capacity:
            break  # larger micro-batches only need more
    return Projection(prompts=sizes.prompts_per_step, responses=sizes.responses_per_step,
                      prompt_tokens=sum(prompt_tokens) / max(len(prompt_tokens), 1),
                      response_tokens=sizes.response_length, time_split=time_split(last_step),
                      micro_batches=tried, asked=sizes.micro_batch_size_per_device,
                      dynamic=real.actor_rollout_ref.actor.use_dynamic_bsz, capacity=capacity, device=device,
                      assumed=f"{assumed}; the doctor's memory formulas, docs/memory.md")


WIDTHS = (8, 8, 8, 90)


def stage_table(results) -> str:
    """stage | status | time | what it found (and the fix), wrapped."""
    def line(cells) -> str:
        return "  ".join(f"{c:<{w}}" for c, w in zip(cells, WIDTHS)).rstrip()

    lines = [line(("stage", "status", "time", "found")), line(tuple("-" * w for w in WIDTHS))]
    for r in results:
        text = [part for block in r.found.splitlines() or [""]
                for part in textwrap.wrap(block, WIDTHS[3], break_on_hyphens=False) or [""]]
        if r.fix:
            text += textwrap.wrap(f"fix: {r.fix}", WIDTHS[3], break_on_hyphens=False)
        time_cell = f"{r.seconds:.1f} s" if r.status != "not run" else ""
        for i, part in enumerate(text):
            lines.append(line((r.stage, r.status, time_cell, part) if i == 0 else ("", "", "", part)))
    return "\n".join(lines)


def render(rehearsal, projection: Projection | None, *, seconds: float) -> str:
    """The whole report: the stage table, what changed, what was not
    rehearsed (with the doctor's view of the cluster), the projection."""
    results = rehearsal.results
    failed = [r.stage for r in results if r.status == "failed"]
    verdict = (f"rehearsal failed at: {', '.join(failed)}" if failed
               else "rehearsal passed: every stage ran on the shrunken model")
    parts = [stage_table(results), "", f"{verdict} ({seconds:.0f} s; work folder "
                                        f"{rehearsal.workdir})"]
    if rehearsal.notes:
        parts += ["", "changed or skipped for the rehearsal:"] + [f"  - {n}" for n in rehearsal.notes]
    cluster = [f"  - {r.check}: {r.status} here: {r.found}" for r in rehearsal.not_rehearsed
               if r.check != "memory/device"]
    parts += ["", "not rehearsed here (the cluster's devices, kernels, software, disks and memory at "
                  "full size; the doctor's view from this machine):",
              "  - device kernels and numerics (bf16 on the accelerator, fused ops, vLLM's device "
              "build): a CPU runs the same code in float32", *cluster]
    if projection is not None:
        parts += ["", "projection for the real run:"] + [f"  - {x}" for x in projection.lines()]
    return "\n".join(parts)
