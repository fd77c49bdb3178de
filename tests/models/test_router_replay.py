"""Router replay (verl's R3) on a random tiny Qwen3-MoE: the native engine
records each token's experts on both of its loops, a trainer pass that
replays them routes exactly so, and replay closes the log-prob gap between a
bfloat16 rollout and a float32 trainer that routing flips open."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from thinkrl.models.forward import batched_response_logprobs
from thinkrl.models.routing import fed_only, install, left_padded, replaying
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine

from fast_paths import prompt_batch

V = 48


def _model(router_std: float = 0.5) -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, initializer_range=0.3,
        tie_word_embeddings=False, eos_token_id=1, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=16, mlp_only_layers=[1], norm_topk_prob=True))
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "experts"):
                layer.mlp.gate.weight.normal_(0, router_std)
    return model


def _generate(model, *, fast: bool, autocast=None, seed: int = 3):
    tape = install(model)
    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=0, seed=seed, fast=fast, route_tape=tape,
                          autocast=autocast or (lambda: torch.autocast("cpu", enabled=False)))
    out = engine.generate(prompt_batch(), SamplingParams(n=2, max_tokens=12, temperature=1.0))
    return out, tape


def _native_routes(model, tape, rollouts) -> torch.Tensor:
    """What a float32 forward over the sequences routes, every token: recorded."""
    from thinkrl.models.routing import recording

    ids, mask, pos = rollouts.sequences()
    with recording(tape), torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
        return tape.take(ids.numel()).view(*ids.shape, tape.layers, -1)


@pytest.mark.parametrize("fast", [True, False])  # the slot decoder's lean loop; the padded loop
def test_the_engine_records_the_experts_of_every_token_it_fed(fast):
    model = _model().eval()
    rollouts, tape = _generate(model, fast=fast)
    routes = rollouts.routed_experts
    ids, mask, _ = rollouts.sequences()
    assert routes.shape == (*ids.shape, 3, 2) and routes.dtype == torch.int16
    assert (routes[:, :, 1] == 0).all()  # the dense layer routes nothing
    fed = fed_only(torch.ones_like(routes), mask)[..., 0, 0].bool()
    assert (routes[~fed] == 0).all()  # padding, after EOS, and each last token: no record
    # the same experts as a float32 forward of the whole sequences picks (decode = prefill, here)
    native = _native_routes(model, tape, rollouts)
    for layer in (0, 2):
        got, want = routes[:, :, layer][fed].sort(-1).values, native[:, :, layer][fed].sort(-1).values.short()
        assert (got == want).all()


def test_both_loops_record_the_same_routes():
    lean, _ = _generate(_model().eval(), fast=True)
    padded, _ = _generate(_model().eval(), fast=False)
    assert torch.equal(lean.response_ids, padded.response_ids)
    assert torch.equal(lean.routed_experts.sort(-1).values, padded.routed_experts.sort(-1).values)


def test_replaying_a_bfloat16_rollouts_routes_closes_the_float32_trainers_gap():
    """A router with near ties: bfloat16 sampling flips some choices against
    float32. Without replay the trainer's log-probs of those tokens are another
    network's; replaying the rollout's experts brings them back toward it."""
    model = _model(router_std=0.02).eval()
    rollouts, tape = _generate(model, fast=True, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    ids, mask, pos = rollouts.sequences()
    real = rollouts.response_mask.bool()
    r = rollouts.response_ids.shape[1]

    def trainer(routes):
        return batched_response_logprobs(model, ids, mask, pos, response_length=r, temperature=1.0,
                                         micro_batch_size=64, routes=routes, tape=tape)

    plain, replayed = trainer(None), trainer(rollouts.routed_experts)
    agree, counted = tape.take_counts()
    share = sum(agree) / sum(counted)
    assert 0.9 < share < 1.0, share  # a few tokens routed otherwise in float32
    gap_plain = (plain - rollouts.rollout_logprobs)[real].abs()
    gap_replay = (replayed - rollouts.rollout_logprobs)[real].abs()
    # bfloat16's rounding stays either way; the flipped tokens' large gaps go (measured: max 0.26 -> 0.05)
    assert gap_replay.max() < 0.5 * gap_plain.max(), (gap_replay.max(), gap_plain.max())
    assert gap_replay.mean() < gap_plain.mean()


def test_replay_keeps_the_routers_gradient_and_the_padded_rows_native():
    model = _model()
    tape = install(model)
    ids = torch.randint(3, V, (2, 6), generator=torch.Generator().manual_seed(0))
    routes = torch.zeros(2, 6, 3, 2, dtype=torch.int16)
    routes[0, :, 0] = torch.tensor([3, 5], dtype=torch.int16)  # row 0, layer 0: experts 3 and 5
    with replaying(tape, routes):
        out = model(input_ids=ids).logits
    out.sum().backward()
    assert model.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0
    # rows of zeros (no record) route natively: the same logits for row 1 as without replay
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    assert torch.allclose(out[1], plain[1], atol=1e-6)
    assert not torch.allclose(out[0], plain[0], atol=1e-4)


def test_left_padded_lays_routes_out_as_the_sequences():
    compact = torch.arange(1, 2 * 6 + 1, dtype=torch.int16).view(2, 6, 1, 1).expand(2, 6, 1, 2).clone()
    out = left_padded(compact, torch.tensor([2, 4]), prompt_width=4, response_width=2)
    # row 0: prompt of 2 in columns 2-3, its response (compact columns 2-3) in 4-5
    assert out[0, :, 0, 0].tolist() == [0, 0, 1, 2, 3, 4]
    assert out[1, :, 0, 0].tolist() == [7, 8, 9, 10, 11, 12]


def test_the_load_balancing_loss_is_transformers_by_hand_and_by_its_function():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    from thinkrl.algos.moe_aux import load_balancing_loss

    # by hand: 2 experts, k = 1, one layer, tokens 0 and 1 real (token 2 padding)
    probs = torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.1, 0.9]])
    chosen = torch.tensor([[0], [1], [1]])
    # f = [1/2, 1/2], P = [(0.75 + 0.5) / 2, (0.25 + 0.5) / 2] = [0.625, 0.375]; aux = 2 * (0.3125 + 0.1875)
    assert load_balancing_loss([probs], [chosen], torch.tensor([1, 1, 0])).item() == pytest.approx(1.0)
    # transformers' own, from logits, two layers, a padded batch of 2 rows x 3 tokens
    generator = torch.Generator().manual_seed(0)
    logits = [torch.randn(6, 8, generator=generator) for _ in range(2)]
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    want = load_balancing_loss_func(tuple(logits), num_experts=8, top_k=2, attention_mask=mask)
    probs = [torch.softmax(x, -1) for x in logits]
    got = load_balancing_loss(probs, [torch.topk(p, 2, -1).indices for p in probs], mask.reshape(-1))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
