"""The critic (PPO's value model) on a real tiny, random transformer."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForTokenClassification

from thinkrl.algos.losses import LOSS_AGG_MODES
from thinkrl.config.critic_checks import CriticSizes
from thinkrl.config.schema import CriticConfig
from thinkrl.models.value import response_values
from thinkrl.records import CriticBatch
from thinkrl.workers.critic import CriticWorker

N, P, R, V = 6, 5, 7, 48


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      num_labels=1, classifier_dropout=0.0)
    return Qwen2ForTokenClassification(cfg)


def _batch() -> CriticBatch:
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, V, (N, P + R), generator=gen)
    attention_mask = torch.ones(N, P + R, dtype=torch.long)
    attention_mask[0, :2] = 0  # a left-padded prompt
    lengths = torch.tensor([7, 3, 5, 1, 6, 2])
    response_mask = (torch.arange(R)[None, :] < lengths[:, None]).float()
    attention_mask[:, P:] = response_mask.long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    values = torch.randn(N, R, generator=gen) * 0.1 * response_mask
    returns = torch.randn(N, R, generator=gen)
    return CriticBatch(input_ids, attention_mask, position_ids, response_mask, values, returns)


def _critic(model, *, micro: int = N, mini: int = N, mode: str = "token-mean", lr: float = 1e-5,
            epochs: int = 1, max_tokens: int | None = None) -> CriticWorker:
    cfg = CriticConfig(grad_clip=1e9, cliprange_value=0.05, use_dynamic_bsz=max_tokens is not None,
                       ppo_max_token_len_per_gpu=max_tokens or 32768,
                       forward_max_token_len_per_gpu=max_tokens or 32768)
    cfg.optim.lr = lr
    sizes = CriticSizes(prompts_per_mini_batch=mini, responses_per_mini_batch=mini,
                        responses_per_mini_batch_per_device=mini, micro_batch_size_per_device=micro,
                        forward_micro_batch_size_per_device=micro, ppo_epochs=epochs, shuffle=False,
                        loss_agg_mode=mode)
    return CriticWorker(model, cfg, sizes, total_steps=4, response_length=R)


def _update(critic: CriticWorker, batch: CriticBatch) -> dict[str, float]:
    """The update the driver's handle plans (no shuffle here), on one rank."""
    return critic.update_on(critic.learner.spec.plan(batch, None))


def test_value_of_token_t_is_read_where_token_t_is_predicted():
    # V_t comes from the position before response token t, so it cannot see token t:
    # changing response token 3 leaves V_0..V_3 alone and changes V_4 onwards.
    model, batch = _model().eval(), _batch()
    ids = batch.input_ids[2:3].clone()
    before = response_values(model, ids, batch.attention_mask[2:3], batch.position_ids[2:3], response_length=R)
    ids[0, P + 3] = (ids[0, P + 3] + 1) % V
    after = response_values(model, ids, batch.attention_mask[2:3], batch.position_ids[2:3], response_length=R)
    torch.testing.assert_close(after[0, :4], before[0, :4])
    assert not torch.allclose(after[0, 4:], before[0, 4:])
    # and V_0 is the value at the prompt's last position, the state before the first response token
    full = model(input_ids=ids, attention_mask=batch.attention_mask[2:3], position_ids=batch.position_ids[2:3])
    assert after[0, 0].item() == pytest.approx(full.logits[0, P - 1, 0].item())


def test_values_do_not_depend_on_the_forward_micro_batch_size():
    model, batch = _model(), _batch()
    sequences = (batch.input_ids, batch.attention_mask, batch.position_ids)
    whole = _critic(model, micro=N).compute_values(*sequences, response_length=R)
    one_by_one = _critic(model, micro=1).compute_values(*sequences, response_length=R)
    assert whole.shape == (N, R) and whole.device.type == "cpu"
    mask = batch.response_mask.bool()
    torch.testing.assert_close(one_by_one[mask], whole[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", sorted(LOSS_AGG_MODES))
def test_critic_gradient_does_not_depend_on_micro_batch_size(mode):
    base, batch = _model(), _batch()

    def grads_after_update(micro):
        model = copy.deepcopy(base)
        metrics = _update(_critic(model, micro=micro, mode=mode), batch)
        return [p.grad.clone() for p in model.parameters()], metrics

    reference_grads, reference_metrics = grads_after_update(N)
    assert 0 < reference_metrics["critic/vf_clipfrac"] < 1  # the value clip binds on some tokens
    for micro in (1, 4):  # 4 leaves an uneven last micro-batch of 2
        grads, metrics = grads_after_update(micro)
        for g, ref in zip(grads, reference_grads):
            torch.testing.assert_close(g, ref, atol=1e-5, rtol=1e-4)
        for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"):
            assert metrics[key] == pytest.approx(reference_metrics[key], rel=1e-4, abs=1e-6), key


def test_token_budget_micro_batches_equal_the_fixed_cut():
    # critic.use_dynamic_bsz: rows of 10, 6, 8, 4, 9, 5 tokens (prompt 5 + response, one
    # left-padded prompt of 3); a budget of 14 cuts them [10], [6, 8], [4, 9], [5]: 4 forwards
    # of uneven size whose gradient must equal one forward over all 6 rows.
    base, batch = _model(), _batch()
    assert batch.attention_mask.sum(-1).tolist() == [10, 8, 10, 6, 11, 7]
    fixed, dynamic = copy.deepcopy(base), copy.deepcopy(base)
    m_fixed = _update(_critic(fixed, micro=N), batch)
    m_dynamic = _update(_critic(dynamic, micro=N, max_tokens=14), batch)
    for a, b in zip(dynamic.parameters(), fixed.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"):
        assert m_dynamic[key] == pytest.approx(m_fixed[key], rel=1e-4, abs=1e-6), key
    sequences = (batch.input_ids, batch.attention_mask, batch.position_ids)
    torch.testing.assert_close(_critic(dynamic, max_tokens=14).compute_values(*sequences, response_length=R),
                               _critic(dynamic).compute_values(*sequences, response_length=R),
                               atol=1e-5, rtol=0)


def test_a_non_finite_gradient_skips_the_step_and_says_so():
    model, batch = _model(), _batch()
    critic = _critic(model, lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    first = next(model.parameters())
    hook = first.register_hook(lambda grad: grad * float("nan"))  # finite loss, NaN gradient
    metrics = _update(critic, batch)
    hook.remove()
    assert metrics["critic/skipped_updates"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))  # weights kept
    assert _update(critic, batch)["critic/skipped_updates"] == 0.0


def test_updates_fit_the_returns_and_report_verls_metrics():
    model, batch = _model(), _batch()
    batch.values = torch.zeros_like(batch.values)
    critic = _critic(model, mini=3, lr=3e-3, epochs=2)
    critic.cfg.cliprange_value = 100.0  # no clip: plain regression on the returns
    first = _update(critic, batch)
    for _ in range(5):
        last = _update(critic, batch)
    assert last["critic/vf_loss"] < first["critic/vf_loss"]
    assert set(first) == {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm",
                          "critic/lr", "critic/skipped_updates"}
    assert first["critic/skipped_updates"] == 0.0
    assert first["critic/lr"] == 3e-3
    # 2 epochs x 2 mini-batches of 3 = 4 AdamW steps per update
    assert critic.learner.optimizer.state[next(iter(model.parameters()))]["step"].item() == 6 * 4


def test_save_and_load_restore_weights_optimizer_and_schedule(tmp_path):
    batch = _batch()
    critic = _critic(_model(), lr=1e-3)
    _update(critic, batch)
    critic.save(tmp_path)
    schedule = critic.learner.scheduler.state_dict()
    assert (tmp_path / "critic" / "config.json").is_file() and (tmp_path / "critic_optimizer.pt").is_file()

    other = _critic(_model(), lr=1e-3)
    with torch.no_grad():
        for p in other.model.parameters():
            p.add_(1.0)
    other.load(tmp_path)
    other.learner.load_schedule(schedule)
    for a, b in zip(critic.model.parameters(), other.model.parameters()):
        assert torch.equal(a, b)
    # the same next update from here: optimizer moments and schedule position came back
    after, again = _update(critic, batch), _update(other, batch)
    assert after == again
    for a, b in zip(critic.model.parameters(), other.model.parameters()):
        assert torch.equal(a, b)


def test_loading_a_checkpoint_without_a_critic_says_so(tmp_path):
    with pytest.raises(ValueError, match="holds no critic"):
        _critic(_model()).load(tmp_path)
