"""A sharded build never puts the whole model on a rank's device: rank 0
reads the checkpoint into host memory, every rank (rank 0 too) builds the
meta skeleton and allocates only its shards on the device, and rank 0's host
copy is gone when the build returns. On the CPU the host is the device, so
the test records where the loader was asked to put the model and what stays
alive, and checks the shards against a model loaded whole."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import run_two_ranks

pytestmark = pytest.mark.slow
DEADLINE_S = 120


def _rank(rank: int, store: str, folder: str, results) -> None:
    import gc
    import weakref

    import torch.distributed as dist

    from thinkrl.models.loading import causal_lm_skeleton, load_causal_lm
    from thinkrl.parallel import fsdp

    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    device = torch.device("cpu")  # stands for the rank's accelerator
    asked, loaded = [], []

    def load(on: torch.device):
        asked.append(on)
        model = load_causal_lm(folder, dtype=torch.float32, device=on)
        loaded.append(weakref.ref(model))
        return model

    model = fsdp.build_model(load, lambda: causal_lm_skeleton(folder, dtype=torch.float32),
                             prepare=lambda _: None, device=device,
                             shard=lambda m: fsdp.parallelize(m, compute_dtype=torch.float32))
    gc.collect()
    local = {name: p.to_local().detach().clone() for name, p in model.named_parameters()}
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    saved = f"{folder}-rank{rank}.pt"  # tensors through a file: a queue would share their memory
    torch.save({"local": local, "buffers": buffers}, saved)
    results.put((rank, [str(d) for d in asked], [ref() is None for ref in loaded],
                 sum(t.numel() for t in local.values()), saved))
    dist.destroy_process_group()


def test_rank_zero_reads_into_host_memory_and_keeps_no_whole_copy(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    whole = Qwen2ForCausalLM(Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    whole.save_pretrained(tmp_path / "model")
    got = run_two_ranks(_rank, str(tmp_path / "model"), folder=tmp_path, deadline_s=DEADLINE_S,
                        hang="a rank waits in the build's broadcast")
    total = sum(p.numel() for p in whole.parameters())
    (_, asked0, freed0, count0, saved0), (_, asked1, freed1, count1, saved1) = got
    (local0, buffers0), (local1, buffers1) = ((d["local"], d["buffers"]) for d in map(torch.load, (saved0, saved1)))
    assert asked0 == ["cpu"] and asked1 == []  # rank 0 alone reads, into the host
    assert freed0 == [True]  # rank 0's whole copy did not outlive the build
    assert count0 < total and count1 < total and count0 + count1 == total  # shards, not the model
    for name, p in whole.named_parameters():  # dim-0 shards: rank 0's rows, then rank 1's
        assert torch.equal(torch.cat([local0[name], local1[name]]), p.detach()), name
    for name, b in whole.named_buffers():  # the rotary table, computed at init, broadcast
        assert torch.allclose(buffers0[name], b) and torch.allclose(buffers1[name], b), name
