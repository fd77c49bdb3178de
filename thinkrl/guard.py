"""Stop a run whose policy is destroyed, before a checkpoint of it is written.

`optim.lr=1e6` wrecks the tiny model in one step: AdamW's decoupled weight
decay alone multiplies every weight by 1 - lr * weight_decay = -9999, the
entropy climbs to 99 % of the uniform limit by step 2, and step 3 dies inside
sampling on NaN probabilities. Without a guard the destroyed weights were
checkpointed and the run said nothing until it crashed. After each update
the guard checks, in this order:

- weights: any non-finite value (NaN or inf);
- weights: the global L2 norm grew more than `MAX_NORM_GROWTH` times in one
  step (healthy steps move it by well under 1 %);
- entropy: `actor/entropy` (mean per response token, nats) at or above
  `UNIFORM_FRACTION * ln(V)`, the entropy of a uniform distribution over the
  V-token vocabulary, when the run did not start there;
- loss: |`actor/pg_loss`| above `MAX_ABS_PG_LOSS`. The clipped objective
  keeps |loss| <= |A| * (1 + clip) per token, and a group-normalised
  advantage has |A| <= (G - 1) / sqrt(G) (< 12 for G = 128), so a loss past
  the bound means the importance ratio exploded, not a hard batch.

A check that fires raises RunStopped before the step's validation and
checkpoint; the step's metrics are written first (the report shows it), and
the message names the checkpoint that stays on disk.
"""

from __future__ import annotations

import math

from thinkrl.checkpoint.store import kept_on_disk
from thinkrl.errors import RunStopped
from thinkrl.run import Run
from thinkrl.workers.roles import PolicyRole

MAX_NORM_GROWTH = 2.0
UNIFORM_FRACTION = 0.95
MAX_ABS_PG_LOSS = 1e3


def weight_health(actor: PolicyRole) -> tuple[list[str], float, int]:
    """(names of parameters holding NaN or inf, the global L2 norm
    sqrt(sum_i ||theta_i||^2) in float64, the vocabulary size) of the actor,
    local or sharded over ranks (`weight_stats`)."""
    stats = actor.weight_stats()
    return stats["nonfinite"], math.sqrt(stats["square_sum"]), stats["vocab_size"]


def divergence_reason(metrics: dict[str, float], *, norm_before: float, norm_after: float,
                      uniform_entropy: float, started_uniform: bool) -> str | None:
    """Why the policy counts as destroyed after this step, or None.
    (Non-finite weights are checked first, by the caller, by name.)"""
    if not math.isfinite(norm_after):
        return "the weights' norm is not finite"
    if norm_before > 0 and norm_after > MAX_NORM_GROWTH * norm_before:
        return (f"the weights' L2 norm grew {norm_after / norm_before:.3g}x in one step "
                f"({norm_before:.4g} -> {norm_after:.4g}; the guard allows {MAX_NORM_GROWTH:g}x)")
    entropy = metrics.get("actor/entropy")
    if entropy is not None and not started_uniform and entropy >= UNIFORM_FRACTION * uniform_entropy:
        return (f"the policy's entropy {entropy:.3f} nats is {100 * entropy / uniform_entropy:.0f} % of "
                f"a uniform distribution over the vocabulary (ln V = {uniform_entropy:.3f}): it "
                "samples noise")
    loss = metrics.get("actor/pg_loss")
    if loss is not None and (not math.isfinite(loss) or abs(loss) > MAX_ABS_PG_LOSS):
        return (f"actor/pg_loss is {loss:.4g}, beyond the bound {MAX_ABS_PG_LOSS:g} a clipped loss "
                "can reach with sane importance ratios")
    return None


class DivergenceGuard:
    """Call `check(metrics, step=...)` after each step's update (trainer.divergence_guard)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.enabled = run.spec.cfg.trainer.divergence_guard
        self.norm, vocab = 0.0, 2
        if self.enabled:
            _, self.norm, vocab = weight_health(run.roles.actor)
        self.uniform_entropy = math.log(vocab)
        self.first_entropy: float | None = None

    def check(self, metrics: dict[str, float], *, step: int) -> None:
        if not self.enabled:
            return
        entropy = metrics.get("actor/entropy")
        if self.first_entropy is None and entropy is not None:
            self.first_entropy = entropy
        started_uniform = self.first_entropy is not None \
            and self.first_entropy >= UNIFORM_FRACTION * self.uniform_entropy
        bad, norm, _ = weight_health(self.run.roles.actor)
        reason = (f"{len(bad)} weight tensor(s) hold NaN or inf (first: {bad[0]})" if bad else
                  divergence_reason(metrics, norm_before=self.norm, norm_after=norm,
                                    uniform_entropy=self.uniform_entropy,
                                    started_uniform=started_uniform))
        self.norm = norm
        if reason is None:
            return
        self.run.state.metrics_log.log(metrics, step=step)
        raise RunStopped(destroyed_message(self.run, step=step, reason=reason))


def destroyed_message(run: Run, *, step: int, reason: str) -> str:
    lr = run.spec.cfg.actor_rollout_ref.actor.optim.lr
    return (f"step {step}: the policy is destroyed: {reason}. Nothing of it was saved: the weights "
            f"in memory are the destroyed ones and are dropped. {kept_on_disk(run.spec.run_dir)} "
            f"Likely cause: too large a step; lower actor_rollout_ref.actor.optim.lr (now {lr:g}) "
            "or check the rewards (trainer.divergence_guard=False turns this check off).")
