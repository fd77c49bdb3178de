"""The actor update on a real (tiny, random) transformer."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from thinkrl.algos.losses import LOSS_AGG_MODES
from thinkrl.config.choices import POLICY_LOSS_MODES
from thinkrl.config.schema import ActorConfig, PolicyLossConfig
from thinkrl.records import TrainBatch
from thinkrl.workers.actor import ActorWorker
from thinkrl.workers.learner import UpdateSpec

N, P, R, V = 6, 5, 7, 48


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg)


def _batch(*, with_old: bool) -> TrainBatch:
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, V, (N, P + R), generator=gen)
    attention_mask = torch.ones(N, P + R, dtype=torch.long)
    attention_mask[0, :2] = 0  # a left-padded prompt
    lengths = torch.tensor([7, 3, 5, 1, 6, 2])  # responses of different lengths
    response_mask = (torch.arange(R)[None, :] < lengths[:, None]).float()
    attention_mask[:, P:] = response_mask.long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    advantages = torch.randn(N, 1, generator=gen) * response_mask
    old = torch.randn(N, R, generator=gen) * 0.1 - 4.0 if with_old else None
    ref = torch.randn(N, R, generator=gen) * 0.1 - 4.0
    return TrainBatch(input_ids, attention_mask, position_ids, response_mask, advantages, old, ref)


def _grads_after_update(model, batch, *, micro: int, mode: str,
                        loss_mode: str = "vanilla", remove_padding: bool = False,
                        max_tokens: int | None = None, fused_head: bool = False
                        ) -> tuple[list, dict]:
    cfg = ActorConfig(loss_agg_mode=mode, use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01,
                      grad_clip=1e9, policy_loss=PolicyLossConfig(loss_mode=loss_mode),
                      use_dynamic_bsz=max_tokens is not None,
                      ppo_max_token_len_per_gpu=max_tokens or 16384)
    spec = UpdateSpec("actor", responses_per_mini_batch=N, epochs=cfg.ppo_epochs, shuffle=cfg.shuffle,
                      micro_batch_size=micro, max_tokens=max_tokens, grad_clip=cfg.grad_clip,
                      response_length=R)
    actor = ActorWorker(model, cfg, spec, total_steps=1, log_prob_micro_batch_size=micro,
                        temperature=0.9, remove_padding=remove_padding,
                        fused_head=fused_head)
    metrics = actor.update_on(spec.plan(batch, None))
    return [p.grad.clone() for p in model.parameters()], metrics


@pytest.mark.parametrize("mode", sorted(LOSS_AGG_MODES))
def test_gradient_does_not_depend_on_micro_batch_size(mode):
    base = _model()
    batch = _batch(with_old=True)
    reference_grads, reference_metrics = _grads_after_update(copy.deepcopy(base), batch,
                                                             micro=N, mode=mode)
    for micro in (1, 4):  # 4 leaves an uneven last micro-batch of 2
        grads, metrics = _grads_after_update(copy.deepcopy(base), batch, micro=micro, mode=mode)
        for g, ref in zip(grads, reference_grads):
            torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
                    "actor/pg_clipfrac"):
            assert metrics[key] == pytest.approx(reference_metrics[key], rel=1e-4, abs=1e-7), key


def _grouped(batch: TrainBatch) -> TrainBatch:
    """The batch with rows 0-2 sharing row 0's prompt and rows 3-5 row 3's (G = 3)."""
    ids, mask = batch.input_ids.clone(), batch.attention_mask.clone()
    for row in (1, 2, 4, 5):
        src = 0 if row < 3 else 3
        ids[row, :P], mask[row, :P] = ids[src, :P], mask[src, :P]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return TrainBatch(ids, mask, position_ids, batch.response_mask, batch.advantages,
                      batch.old_logprobs, batch.ref_logprobs)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_shared_prompt_pass_gives_the_padded_gradient_at_any_micro_batch_size(mode):
    # model.use_remove_padding: each prompt computed once, trailing pad columns cut.
    # Micro-batches of 1 and 4 cut groups apart (and 4 leaves one of 2); at N also
    # with the chunked output head (model.use_fused_kernels).
    base, batch = _model(), _grouped(_batch(with_old=True))
    padded_grads, padded_metrics = _grads_after_update(copy.deepcopy(base), batch, micro=N, mode=mode)
    for micro, fused in ((N, False), (4, False), (1, False), (N, True)):
        grads, metrics = _grads_after_update(copy.deepcopy(base), batch, micro=micro, mode=mode,
                                             remove_padding=True, fused_head=fused)
        for g, ref in zip(grads, padded_grads):
            torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            assert metrics[key] == pytest.approx(padded_metrics[key], rel=1e-4, abs=1e-7), key


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_token_budget_micro_batches_give_the_same_gradient(mode):
    # use_dynamic_bsz: rows hold 3+7, 5+3, 5+5, 5+1, 5+6, 5+2 = 10, 8, 10, 6, 11, 7 tokens;
    # a budget of 16 cuts [0], [1], [2, 3], [4], [5]; with the shared-prompt pass too.
    base, batch = _model(), _batch(with_old=True)
    want, want_metrics = _grads_after_update(copy.deepcopy(base), batch, micro=N, mode=mode)
    for remove_padding in (False, True):
        grads, metrics = _grads_after_update(copy.deepcopy(base), batch, micro=N, mode=mode,
                                             max_tokens=16, remove_padding=remove_padding)
        for g, ref in zip(grads, want):
            torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)
        assert metrics["actor/pg_loss"] == pytest.approx(want_metrics["actor/pg_loss"], rel=1e-4)


# clip_cov and kl_cov pick tokens by covariance statistics of the micro-batch they are
# given (as verl does), so their gradient depends on the micro-batch size by design.
_LAYOUT_FREE_LOSSES = [m for m in POLICY_LOSS_MODES if m not in ("clip_cov", "kl_cov")]


@pytest.mark.parametrize("loss_mode", _LAYOUT_FREE_LOSSES)
def test_each_policy_loss_gradient_does_not_depend_on_micro_batch_size(loss_mode):
    base = _model()
    batch = _batch(with_old=True)
    # seq-mean-token-sum (gspo aggregates with it, as verl 0.9.1; sapo and geo_mean override it
    # with their own sequence means).
    reference_grads, reference_metrics = _grads_after_update(
        copy.deepcopy(base), batch, micro=N, mode="seq-mean-token-sum", loss_mode=loss_mode)
    assert any(g.abs().sum() > 0 for g in reference_grads)
    for micro in (1, 4):
        grads, metrics = _grads_after_update(copy.deepcopy(base), batch, micro=micro,
                                             mode="seq-mean-token-sum", loss_mode=loss_mode)
        for g, ref in zip(grads, reference_grads):
            torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)
        for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm"):
            assert metrics[key] == pytest.approx(reference_metrics[key], rel=1e-4, abs=1e-7), key


def test_on_policy_ratio_is_one():
    # Without old log-probs the update is exactly on-policy: pi_old = pi, so
    # nothing is clipped and the sampled KL between them is 0.
    _, metrics = _grads_after_update(_model(), _batch(with_old=False), micro=3, mode="token-mean")
    assert metrics["actor/ppo_kl"] == 0.0
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_update_changes_weights_and_reports_lr():
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    _, metrics = _grads_after_update(model, _batch(with_old=False), micro=6, mode="token-mean")
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert metrics["actor/lr"] == pytest.approx(1e-6)
    assert metrics["actor/skipped_updates"] == 0.0


def test_nan_loss_is_a_clear_error_and_weights_are_untouched():
    model = _model()
    batch = _batch(with_old=False)
    batch.advantages[0, 0] = float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(FloatingPointError, match="optim.lr"):
        _grads_after_update(model, batch, micro=6, mode="token-mean")
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


@pytest.mark.parametrize("loss_mode", ["vanilla", "geo_mean"])
def test_the_update_weighs_each_tokens_loss_by_the_batchs_rollout_is_weights(loss_mode):
    """The weights travel with the batch (split over micro-batches) into the loss:
    for a loss linear in A, the same gradients as advantages scaled by them; for
    geo_mean (a sequence's geometric-mean weight), not the same."""
    batch = _batch(with_old=True)
    weights = (torch.rand(N, R, generator=torch.Generator().manual_seed(5)) * 1.5 + 0.25) * batch.response_mask
    weighted = copy.copy(batch)
    weighted.rollout_is_weights = weights
    scaled = copy.copy(batch)
    scaled.advantages = batch.advantages * weights
    plain, _ = _grads_after_update(_model(), batch, micro=2, mode="token-mean", loss_mode=loss_mode)
    with_weights, _ = _grads_after_update(_model(), weighted, micro=2, mode="token-mean", loss_mode=loss_mode)
    with_scaled, _ = _grads_after_update(_model(), scaled, micro=2, mode="token-mean", loss_mode=loss_mode)
    differs = lambda a, b: any(not torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b))  # noqa: E731
    assert differs(with_weights, plain)
    assert differs(with_weights, with_scaled) == (loss_mode == "geo_mean")
