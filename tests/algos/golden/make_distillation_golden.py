"""Writes distillation_verl.json: verl's own distillation loss on fixed tensors.

Not a test: it needs verl's source on PYTHONPATH and verl's imports installed
(tensordict, transformers, ...), which thinkrl does not depend on. Run as

    git -C VERL_CHECKOUT archive 1dda039b9c6311889a9c9a26040677e1254814f9 verl | tar -x -C /tmp/verlsrc
    PYTHONPATH=/tmp/verlsrc python tests/algos/golden/make_distillation_golden.py

It calls `verl.trainer.distillation.losses.distillation_loss` (the per-token
divergence, its clamp, and the supervised or policy-gradient aggregation)
exactly as verl's actor does, with verl's padding-free layout of the student's
log-probs, and records inputs and outputs; tests/algos/test_distillation.py
compares thinkrl's `distillation_loss` with them.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from tensordict import TensorDict

from verl.trainer.distillation.losses import distillation_loss
from verl.workers.config import DistillationLossConfig

VERL_COMMIT = "1dda039b9c6311889a9c9a26040677e1254814f9"
MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]
PROMPT = 2  # prompt tokens per row (all real)


def flat(per_response: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's padding-free model output: one value per real token of each
    sequence, the value predicting response token j at position PROMPT - 1 + j."""
    pieces = []
    for row, length in zip(per_response, mask.sum(-1).tolist()):
        seq = torch.full((PROMPT + int(length),), 123.0, dtype=per_response.dtype)  # never read
        seq[PROMPT - 1:PROMPT - 1 + int(length)] = row[: int(length)]
        pieces.append(seq)
    return torch.cat(pieces)


def case(mode: str, pg: bool, agg: str, clamp: float | None, tensors: dict) -> dict:
    mask = torch.tensor(MASK, dtype=torch.float64)
    n, t = mask.shape
    data = TensorDict({
        "prompts": torch.ones(n, PROMPT, dtype=torch.long),
        "responses": torch.ones(n, t, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(n, PROMPT), mask], dim=1).long(),
        "response_mask": mask,
        "teacher_logprobs": flat(tensors["teacher"], mask).unsqueeze(-1),
        "old_log_probs": tensors["old"],
        "dp_size": torch.tensor(1), "batch_num_tokens": mask.sum(), "global_batch_size": torch.tensor(n),
    }, batch_size=[])
    log_prob = flat(tensors["student"], mask).requires_grad_(True)
    loss_config = DistillationLossConfig(loss_mode=mode, use_policy_gradient=pg, loss_max_clamp=clamp)
    actor = SimpleNamespace(loss_agg_mode=agg, global_batch_info={}, loss_scale_factor=None)
    loss, metrics = distillation_loss(actor, SimpleNamespace(distillation_loss=loss_config),
                                      {"log_probs": log_prob}, data)
    loss.backward()
    grad = torch.zeros(n, t, dtype=torch.float64)
    offset = 0
    for row, length in enumerate(mask.sum(-1).long().tolist()):
        grad[row, :length] = log_prob.grad[offset + PROMPT - 1: offset + PROMPT - 1 + length]
        offset += PROMPT + length
    return {"loss_mode": mode, "use_policy_gradient": pg, "loss_agg_mode": agg, "loss_max_clamp": clamp,
            "loss": loss.item(), "grad": grad.tolist()}


def main() -> None:
    generator = torch.Generator().manual_seed(7)
    student = -torch.rand(3, 4, generator=generator, dtype=torch.float64) * 3
    tensors = {"student": student,
               "old": student + (torch.rand(3, 4, generator=generator, dtype=torch.float64) - 0.5) * 0.6,
               "teacher": -torch.rand(3, 4, generator=generator, dtype=torch.float64) * 3}
    cases = [case(mode, pg, agg, clamp, tensors)
             for mode, pg in (("k1", True), ("k3", False), ("k3", True), ("k2", False), ("abs", False),
                              ("low_var_kl", False), ("kl", True))
             for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
             for clamp in (None, 0.5)]
    out = {"about": "verl's distillation_loss (verl-project/verl " + VERL_COMMIT + ") on the tensors below: "
                    "make_distillation_golden.py wrote it",
           "response_mask": MASK, **{k: v.tolist() for k, v in tensors.items()}, "cases": cases}
    path = Path(__file__).with_name("distillation_verl.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
