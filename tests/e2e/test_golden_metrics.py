"""A seeded tiny run against committed metrics: exact where the arithmetic is
exact, tolerant where CPU kinds round float32 differently.

golden_metrics.json holds the metrics of 3 seeded steps (validation before
training, KL loss, two mini-batches per step so the old-log-prob pass runs):

- "reference": as thinkrl 2f1ea49 wrote them, on the machine of that
  release. Every machine compares against it: counts, lengths, scores and
  settings exactly (sampled tokens are integers: a changed token is a changed
  algorithm), float metrics within the float32 rounding of what they are
  made of (`TOLERANCE` below). A refactor that changes the algorithm moves
  these by orders of magnitude more than rounding does.
- "exact": the same run's metrics per fingerprint of the pretrained test
  model (its weight bytes, which already differ between CPU kinds, and the
  torch version). On a machine whose fingerprint is recorded, every number
  must be equal to the last bit: there, a refactor changes no number.
  `THINKRL_RECORD_GOLDEN=1 pytest tests/e2e/test_golden_metrics.py` records
  this machine's entry (after checking it against the reference).

The run is also made twice in one process and must give the same metrics
twice: a seeded run is deterministic.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import torch

from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train

pytestmark = pytest.mark.slow
GOLDEN = Path(__file__).with_name("golden_metrics.json")

# float32 rounding, derived from the quantities involved (relative, absolute):
# - log-prob quantities: a log-prob of a V = 512 vocabulary is ~ ln V = 6.2 in
#   size and comes out of a few hundred float32 operations per token, whose
#   order changes with the CPU kind's kernels; a difference of two of them
#   (ppo_kl, the k3 KL, pg_loss at ratio ~1) or an entropy carries an absolute
#   error of up to ~64 ulps of ln V = 64 * 1.19e-7 * 6.24 = 4.8e-5, whatever
#   its own size (ppo_kl is ~1e-6 at step 1: relative error means nothing there).
# - gradient norms: while the policy is still the reference and all scores are
#   0 (the test model never answers right), the gradient is that of the KL
#   term, built from log-prob differences of 1e-6..1e-4, whose rounding above
#   is a relative 1e-3..1e-2 part of them: rel 2e-2.
LOGPROB_ABS = 64 * torch.finfo(torch.float32).eps * math.log(512)
TOLERANCE = {
    "actor/ppo_kl": (0.0, LOGPROB_ABS),
    "actor/kl_loss": (0.0, LOGPROB_ABS),
    "actor/pg_loss": (0.0, LOGPROB_ABS),
    "actor/entropy": (0.0, LOGPROB_ABS),
    "actor/grad_norm": (2e-2, 0.0),
}
"""Metric -> (rel, abs) tolerance against the reference; every other metric exact."""

OVERRIDES = [
    "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.optim.lr=1e-3", "data.max_response_length=16",
    "data.val_batch_size=100", "trainer.total_training_steps=3", "trainer.test_freq=3",
    "trainer.progress_bar=False", "trainer.logger=[]", "reward.num_workers=0"]


def _seeded_run(model_dir: Path, run_dir: Path) -> list[dict]:
    overrides = [f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
                 *OVERRIDES]
    train(load_config(recipe_path("tiny"), overrides), log=lambda *_: None)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def fingerprint(model_dir: Path) -> str:
    digest = hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()[:16]
    return f"{digest}-torch{torch.__version__}"


def differences(got: list[dict], want: list[dict], tolerance: dict) -> list[str]:
    """Every metric of `want` that `got` misses or differs in beyond its tolerance."""
    found = [f"{len(got)} records, expected {len(want)}"] if len(got) != len(want) else []
    for g, w in zip(got, want):
        for key, value in w.items():
            rel, abs_ = tolerance.get(key, (0.0, 0.0))
            if key not in g or not abs(g[key] - value) <= rel * abs(value) + abs_:
                found.append(f"step {w['step']} {key}: {g.get(key)!r}, expected {value!r} "
                             f"(rel {rel:g}, abs {abs_:.2g})")
    return found


def test_the_comparison_holds_exact_keys_exactly_and_rounding_within_its_bound():
    want = [{"step": 1, "actor/ppo_kl": -1.1425e-6, "response_length/mean": 16.0}]
    assert not differences([{"step": 1, "actor/ppo_kl": -1.13e-6, "response_length/mean": 16.0}],
                           want, TOLERANCE)
    assert differences([{"step": 1, "actor/ppo_kl": -1.1425e-6, "response_length/mean": 15.75}],
                       want, TOLERANCE)  # one token fewer: exact keys catch it
    assert differences([{"step": 1, "actor/ppo_kl": -2e-4, "response_length/mean": 16.0}],
                       want, TOLERANCE)  # a changed KL, far beyond rounding
    assert differences([], want, TOLERANCE)


def test_seeded_run_reproduces_the_golden_metrics(asset_cache, tiny_model_dir, tmp_path):
    records = _seeded_run(tiny_model_dir, tmp_path / "first")
    golden = json.loads(GOLDEN.read_text())
    problems = differences(records, golden["reference"], TOLERANCE)
    assert not problems, "against the reference run:\n" + "\n".join(problems)

    again = _seeded_run(tiny_model_dir, tmp_path / "second")
    keys = golden["reference"][1].keys()
    assert [{k: r.get(k) for k in keys} for r in again] == [{k: r.get(k) for k in keys}
                                                            for r in records]

    machine = fingerprint(tiny_model_dir)
    if os.environ.get("THINKRL_RECORD_GOLDEN") == "1":
        golden["exact"][machine] = [{k: r[k] for k in want} for r, want in
                                    zip(records, golden["reference"])]
        GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    if machine not in golden["exact"]:
        return  # another CPU kind: the reference comparison above is the check
    problems = differences(records, golden["exact"][machine], {})
    assert not problems, "against this machine's exact entry:\n" + "\n".join(problems)
