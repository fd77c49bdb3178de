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


def _peak_rank(rank: int, store: str, folder: str, results) -> None:
    import torch.distributed as dist

    from thinkrl.models.loading import causal_lm_skeleton, load_causal_lm
    from thinkrl.parallel import fsdp

    def memory(field: str) -> int:  # VmRSS (now) or VmHWM (the peak): bytes, from this process's start
        line = next(s for s in open("/proc/self/status") if s.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    before = memory("VmRSS")
    model = fsdp.build_model(lambda on: load_causal_lm(folder, dtype=torch.float32, device=on),
                             lambda: causal_lm_skeleton(folder, dtype=torch.float32),
                             prepare=lambda _: None, device=torch.device("cpu"),
                             shard=lambda m: fsdp.parallelize(m, compute_dtype=torch.float32))
    local = sum(p.to_local().numel() for p in model.parameters())
    results.put((rank, memory("VmHWM") - before, local))
    dist.destroy_process_group()


def test_host_memory_per_rank_stays_within_its_share_at_a_half_billion_parameters(tmp_path):
    """Qwen2.5-0.5B's shape (494M parameters, random, saved in bfloat16), on 2
    ranks. Rank 0's peak: its whole float32 copy (4P), its shard (2P) and
    one tensor in flight (measured: 2.9 GiB); rank 1's: its shard and one
    tensor in flight (1.6 GiB). Every rank reading the whole model (the build
    before rank 0's host load) puts rank 1 where rank 0 is, past its bound."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model.to_empty(device="cpu").tie_weights()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=generator)
    params = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).save_pretrained(tmp_path / "model")
    del model
    got = run_two_ranks(_peak_rank, str(tmp_path / "model"), folder=tmp_path, deadline_s=300,
                        hang="a rank waits in the build's broadcast")
    (_, peak0, local0), (_, peak1, local1) = got
    assert local0 + local1 == params
    slack = 400 * 2**20  # the allocator's and the process group's own
    assert peak1 < 2 * params + 4 * largest + slack, (peak1 / 2**30, params)
    assert peak0 < 4 * params + 2 * params + 4 * largest + slack, (peak0 / 2**30, params)
