"""Weight-sync attestation (thinkrl.rollout.attest): the digest, the unit
names both sides agree on, and the check, on the layouts vLLM serves
(fused, tensor-parallel, vocabulary-padded, tied) without vLLM."""

import pytest
import torch

from thinkrl.rollout.attest import (INCONSISTENT, Digest, Ledger, WeightSyncMismatch,
                                    check_served, recording, served_by_engine, tensor_digest,
                                    unit_of)

QWEN2_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
M64 = (1 << 64) - 1


def mix_by_hand(bits: int) -> int:
    """The digest's per-element mix in plain Python integers (unsigned 64-bit
    wrapping; >> of a signed int64 is arithmetic, hence the sign fix-ups)."""
    def signed(x):
        return x - (1 << 64) if x >> 63 else x
    h = (bits * 0x9E3779B97F4A7C15) & M64
    h ^= (signed(h) >> 29) & M64
    h = (h * 0xBF58476D1CE4E5B9) & M64
    h ^= (signed(h) >> 32) & M64
    return (signed(h) >> 16) & 0xFFFFFFFF


def test_the_digest_of_a_tensor_is_the_sum_of_the_hand_mixed_float32_bits():
    t = torch.tensor([1.0, -2.5, 0.0, 3.0e-8])
    bits = [0x3F800000, 0xC0200000 - (1 << 32), int(torch.tensor(3.0e-8).view(torch.int32))]
    assert tensor_digest(t) == Digest(sum(mix_by_hand(b & M64) for b in bits), 3)
    assert mix_by_hand(0x3F800000) not in (0, mix_by_hand(0xC0200000 - (1 << 32) & M64))


def test_the_digest_is_order_free_additive_blind_to_zeros_and_exact_for_bfloat16():
    torch.manual_seed(0)
    a, b = torch.randn(6, 4), torch.randn(3, 4)
    fused = torch.cat([a, b])
    assert tensor_digest(fused) == tensor_digest(a) + tensor_digest(b)
    assert tensor_digest(fused) == tensor_digest(fused.flip(0).T)
    padded = torch.cat([fused, torch.zeros(5, 4), -torch.zeros(1, 4)])
    assert tensor_digest(padded) == tensor_digest(fused)
    half = a.to(torch.bfloat16)
    assert tensor_digest(half) == tensor_digest(half.float())  # an upcast copy (vLLM's CPU bias)
    assert tensor_digest(half) != tensor_digest(a)  # the trainer must cast as the engine does


def test_one_changed_element_changes_the_digest():
    torch.manual_seed(1)
    w = torch.randn(32, 32)
    changed = w.clone()
    changed[7, 3] = torch.nextafter(changed[7, 3], torch.tensor(10.0))  # one ulp
    assert tensor_digest(changed) != tensor_digest(w)


@pytest.mark.parametrize("name,unit", [
    ("model.layers.3.self_attn.q_proj.weight", "layers.3.self_attn.qkv_proj.weight"),
    ("model.layers.3.self_attn.v_proj.bias", "layers.3.self_attn.qkv_proj.bias"),
    ("model.layers.0.mlp.up_proj.weight", "layers.0.mlp.gate_up_proj.weight"),
    ("model.layers.0.mlp.down_proj.weight", "layers.0.mlp.down_proj.weight"),
    ("model.language_model.layers.2.input_layernorm.weight", "layers.2.input_layernorm.weight"),
    ("model.embed_tokens.weight", "embed_tokens.weight"),
    ("model.language_model.embed_tokens.weight", "embed_tokens.weight"),
    ("lm_head.weight", "lm_head.weight"),
    ("model.norm.weight", "norm.weight"),
])
def test_trainer_and_engine_names_meet_in_one_unit(name, unit):
    assert unit_of(name, QWEN2_PACKED) == unit
    engine_name = unit.replace("layers.", "language_model.model.layers.", 1)
    assert unit_of(engine_name) == unit


def qwen_like(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {"model.embed_tokens.weight": torch.randn(10, 8),
            "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8),
            "model.layers.0.self_attn.k_proj.weight": torch.randn(4, 8),
            "model.layers.0.self_attn.v_proj.weight": torch.randn(4, 8),
            "model.layers.0.input_layernorm.weight": torch.randn(8),
            "model.norm.weight": torch.randn(8)}


def sent_ledger(state, dtype=torch.float32) -> Ledger:
    ledger = Ledger()
    passed = list(recording(state.items(), ledger, dtype=dtype, packed=QWEN2_PACKED))
    assert [n for n, _ in passed] == list(state)  # passed on unchanged
    return ledger


def engine_ranks(state, tp: int, vocab_pad: int = 0) -> list[Ledger]:
    """Each tensor-parallel rank's ledger as vLLM lays the weights out: q|k|v
    fused and split by rows per rank (each rank its share of q, k and v), the
    embedding split by rows after zero padding, the norms whole on every rank."""
    ranks = [Ledger() for _ in range(tp)]
    qkv = [state[f"model.layers.0.self_attn.{x}_proj.weight"].chunk(tp) for x in "qkv"]
    embed = torch.cat([state["model.embed_tokens.weight"], torch.zeros(vocab_pad, 8)]).chunk(tp)
    for r, ledger in enumerate(ranks):
        ledger.add("layers.0.self_attn.qkv_proj.weight", torch.cat([q[r] for q in qkv]))
        ledger.add("embed_tokens.weight", embed[r])
        ledger.add("layers.0.input_layernorm.weight", state["model.layers.0.input_layernorm.weight"])
        ledger.add("norm.weight", state["model.norm.weight"])
    return ranks


@pytest.mark.parametrize("tp,vocab_pad", [(1, 0), (1, 6), (2, 0), (2, 6)])
def test_a_faithful_engine_passes_on_every_layout(tp, vocab_pad):
    state = qwen_like()
    sent = sent_ledger(state)
    check_served(sent, served_by_engine(engine_ranks(state, tp, vocab_pad), sent),
                 engine="engine 0", version=3)


def test_a_stale_tensor_on_one_rank_is_named_with_engine_and_version():
    state = qwen_like()
    sent = sent_ledger(state)
    stale = dict(state)
    stale["model.layers.0.self_attn.k_proj.weight"] = state["model.layers.0.self_attn.k_proj.weight"] + 1e-6
    served = served_by_engine(engine_ranks(stale, 2), sent)
    with pytest.raises(WeightSyncMismatch, match=r"policy version 7: engine 1 .*'layers\.0\.self_attn"
                                                 r"\.qkv_proj\.weight'.*digest"):
        check_served(sent, served, engine="engine 1", version=7)


def test_a_replicated_tensor_that_differs_between_ranks_is_named():
    state = qwen_like()
    sent = sent_ledger(state)
    ranks = engine_ranks(state, 2)
    ranks[1].units["norm.weight"] = tensor_digest(state["model.norm.weight"] * 2)
    served = served_by_engine(ranks, sent)
    assert served["norm.weight"] == INCONSISTENT
    with pytest.raises(WeightSyncMismatch, match="'norm.weight' it holds two copies that differ"):
        check_served(sent, served, engine="engine 0", version=1)


def test_the_engine_is_checked_in_its_own_dtype():
    state = qwen_like()
    ranks = engine_ranks({k: v.to(torch.bfloat16) for k, v in state.items()}, 1)
    sent_bf16, sent_f32 = sent_ledger(state, torch.bfloat16), sent_ledger(state)
    check_served(sent_bf16, served_by_engine(ranks, sent_bf16), engine="e", version=0)
    with pytest.raises(WeightSyncMismatch):
        check_served(sent_f32, served_by_engine(ranks, sent_f32), engine="e", version=0)


def test_a_tied_head_may_be_absent_a_missing_tensor_may_not():
    state = qwen_like()
    tied = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
    sent = sent_ledger(tied)
    check_served(sent, served_by_engine(engine_ranks(state, 1), sent), engine="e", version=0)
    untied = {**state, "lm_head.weight": torch.randn(10, 8)}
    sent = sent_ledger(untied)
    with pytest.raises(WeightSyncMismatch, match="'lm_head.weight' it holds no such tensor"):
        check_served(sent, served_by_engine(engine_ranks(state, 1), sent), engine="e", version=0)


def test_units_only_the_engine_holds_are_not_compared():
    state = qwen_like()
    sent = sent_ledger(state)
    ranks = engine_ranks(state, 1)
    ranks[0].add("blocks.0.attn.qkv.weight", torch.randn(3, 3))  # a vision tower, not synced
    check_served(sent, served_by_engine(ranks, sent), engine="e", version=0)


def test_a_stride_checks_every_unit_once_in_that_many_syncs():
    from thinkrl.rollout.attest import AttestShare

    units = ["embed_tokens.weight", "norm.weight", "lm_head.weight",
             *(f"layers.{i}.self_attn.qkv_proj.weight" for i in range(6))]
    assert AttestShare.of(1, 7) is None  # every unit
    seen = {u: 0 for u in units}
    for version in range(10, 13):  # three syncs at stride 3
        share = AttestShare.of(3, version)
        for u in units:
            seen[u] += share(u)
    assert seen == {u: 1 for u in units}
    assert [AttestShare.of(3, 7)(f"layers.{i}.mlp.up_proj.weight") for i in range(4)] == [0, 1, 0, 0]
    assert AttestShare.of(3, 9)("embed_tokens.weight") and AttestShare.of(3, 9)("lm_head.weight")  # with layer 0
    assert not any(AttestShare.of(0, 5)(u) for u in units)  # stride 0: nothing digested
    ledger = Ledger()
    tensors = [(f"model.layers.{i}.mlp.down_proj.weight", torch.ones(2)) for i in range(4)]
    passed = list(recording(tensors, ledger, dtype=torch.float32, share=AttestShare.of(2, 3)))
    assert [n for n, _ in passed] == [n for n, _ in tensors]  # every tensor still goes to the engine
    assert sorted(ledger.units) == ["layers.1.mlp.down_proj.weight", "layers.3.mlp.down_proj.weight"]
