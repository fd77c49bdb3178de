"""The built-in tiny model is a pure function of its spec: the caller's use of
torch's global RNG must not change it (the doctor or a test may build it)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from thinkrl.models.tiny import TinyModelSpec, build_tiny_model

SPEC = TinyModelSpec(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1,
                     num_heads=2, num_kv_heads=1, pretrain_problems=200, pretrain_steps=3,
                     batch_size=4)


def test_the_build_ignores_the_callers_rng_state(tmp_path):
    weights = []
    for caller_seed in (0, 99):
        torch.manual_seed(caller_seed)
        torch.rand(17)  # the caller has used the global generator
        state = torch.get_rng_state()
        folder = build_tiny_model(tmp_path / f"after-{caller_seed}", SPEC, log=lambda *_: None)
        assert torch.equal(torch.get_rng_state(), state)  # the caller's RNG is untouched
        weights.append(load_file(folder / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_the_cache_key_covers_the_build_version():
    assert TinyModelSpec().cache_key() != TinyModelSpec(build_version=1).cache_key()
