"""vLLM serving the policy's LoRA adapter itself (`thinkrl.rollout.vllm_lora`),
on vLLM's CPU build: the adapter goes in memory, the engine samples from it
(greedy equal to the PEFT module's own decoding, sampled log-probs equal to
its forward), a new adapter replaces the old one, and the attestation names
an adapter that never reached the engine."""

import os

import pytest
import torch

vllm = pytest.importorskip("vllm")
pytest.importorskip("peft")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from test_vllm_engine import (LOGPROB_TOLERANCE, MANY_EOS, PAD, batch, engine_config,  # noqa: E402
                              make_model, native, recomputed_logprobs)

from thinkrl.models.lora import LoraSettings, attach_lora, base_tensors, is_adapter_tensor  # noqa: E402
from thinkrl.rollout.attest import Ledger, WeightSyncMismatch, check_served, served_by_engine  # noqa: E402
from thinkrl.rollout.base import SamplingParams  # noqa: E402
from thinkrl.rollout.vllm_engine import VllmEngine  # noqa: E402
from thinkrl.rollout.weight_sync import full_state_tensors  # noqa: E402

RANK = 8


def lora_model(seed: int, targets="all-linear", base=make_model):
    """The test model with an adapter whose A and B are both far from zero."""
    model = base()
    lora = attach_lora(model, LoraSettings(rank=RANK, alpha=16, target_modules=targets))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model.eval(), lora


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-lora-model")
    make_model().save_pretrained(folder)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    eng = VllmEngine.start(engine_config(), model_path=str(folder), max_model_len=64,
                           eos_token_ids=MANY_EOS, pad_token_id=PAD, seed=3, device_kind="cpu",
                           lora_rank=RANK)
    yield eng
    eng.close()


def sync(engine, model, lora, *, first: bool = True):
    """What PolicyRank does with an engine serving the adapter: at the first
    sync, the base and the adapter, both attested; later, the adapter alone,
    and only it read back."""
    base = engine.update_weights(base_tensors(full_state_tensors(model))) if first else Ledger()
    adapter = engine.update_adapter(full_state_tensors(model, keep=is_adapter_tensor), lora.scalings())
    assert adapter.units and all(u.endswith(("lora_A", "lora_B")) for u in adapter.units)
    expected = Ledger().include(base).include(adapter)
    served = served_by_engine(engine.served(adapter_only=not first), expected)
    check_served(expected, served, engine="engine 0", version=1)
    assert set(expected.units) <= set(served)  # each unit under its own name: no tied-copy fallback
    assert first or set(served) == set(adapter.units)


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_the_engine_serves_the_adapter_it_was_sent(engine, targets):
    model, lora = lora_model(seed=1, targets=targets)
    sync(engine, model, lora)
    greedy = SamplingParams(n=1, max_tokens=16, do_sample=False)
    got, want = engine.generate(batch(), greedy), native(model).generate(batch(), greedy)
    assert got.response_ids.tolist() == want.response_ids.tolist()
    with lora.disabled():  # the adapter matters here: the base decodes otherwise
        assert native(model).generate(batch(), greedy).response_ids.tolist() != want.response_ids.tolist()
    sampled = engine.generate(batch(), SamplingParams(n=4, max_tokens=8, temperature=0.7))
    trainer = recomputed_logprobs(model, sampled, temperature=0.7)
    mask = sampled.response_mask.bool()
    assert (sampled.rollout_logprobs - trainer)[mask].abs().max() < LOGPROB_TOLERANCE


def test_a_new_adapter_replaces_the_old_one(engine):
    greedy = SamplingParams(n=1, max_tokens=16, do_sample=False)
    first, first_lora = lora_model(seed=2)
    sync(engine, first, first_lora)
    second, second_lora = lora_model(seed=3)
    sync(engine, second, second_lora, first=False)  # the adapter alone, as every later sync
    got = engine.generate(batch(), greedy).response_ids.tolist()
    assert got == native(second).generate(batch(), greedy).response_ids.tolist()
    assert got != native(first).generate(batch(), greedy).response_ids.tolist()


def test_an_adapter_that_never_reaches_the_engine_stops_the_run(engine, monkeypatch):
    """verl #7495: an adapter never delivered went unnoticed for two months."""
    model, lora = lora_model(seed=4)
    sync(engine, model, lora)
    import thinkrl.rollout.vllm_engine as vllm_engine
    monkeypatch.setattr(vllm_engine, "install_adapter", lambda worker, tensors, config: None)
    changed, changed_lora = lora_model(seed=5)
    with pytest.raises(WeightSyncMismatch, match=r"lora_[AB]"):
        sync(engine, changed, changed_lora, first=False)


def make_llama():
    """A Llama: its vLLM class also wraps the embeddings and the logits
    processor for LoRA (other slot layouts, which the read-back must pass by)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      tie_word_embeddings=False, initializer_range=0.3, eos_token_id=1,
                      pad_token_id=PAD, bos_token_id=1)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_a_llama_engine_serves_the_adapter(tmp_path):
    make_llama().save_pretrained(tmp_path)
    llama = VllmEngine.start(engine_config(), model_path=str(tmp_path), max_model_len=64,
                             eos_token_ids=MANY_EOS, pad_token_id=PAD, seed=3, device_kind="cpu",
                             lora_rank=RANK)
    try:
        model, lora = lora_model(seed=6, base=make_llama)
        sync(llama, model, lora)
        sync(llama, model, lora, first=False)
        greedy = SamplingParams(n=1, max_tokens=16, do_sample=False)
        got, want = llama.generate(batch(), greedy), native(model).generate(batch(), greedy)
        assert got.response_ids.tolist() == want.response_ids.tolist()
    finally:
        llama.close()
