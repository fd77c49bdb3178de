"""`fsdp.gathered`: inside it, forward passes of a sharded model run no
collective, so ranks may run different numbers of them (a rollout whose
rows all reached EOS on one rank while another rank still decodes).

Two gloo processes (a file store: nothing listens on the network), a small
Qwen2 sharded as the ray backend shards it. Rank 0 runs 3 forwards inside
`gathered`, rank 1 runs 1; each counts the all-gathers FSDP2 starts. Before
the fix the root resharded after its first forward and rank 0's second
forward waited forever in an all-gather rank 1 never joined.
"""

from __future__ import annotations


import pytest
import torch
from gloo_ranks import run_two_ranks

DEADLINE_S = 120
# torch >= 2.8: FSDP2's public reshard switch (thinkrl.parallel.fsdp, MIN_TORCH)
NEWER_FSDP2 = hasattr(__import__("torch.distributed.fsdp", fromlist=["FSDPModule"]).FSDPModule,
                      "set_reshard_after_forward")


def _rank(rank: int, store: str, results) -> None:
    import torch.distributed as dist
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from thinkrl.parallel import fsdp

    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    gathers = []
    real = param_group.foreach_all_gather

    def counted(*args, **kwargs):
        gathers.append(1)
        return real(*args, **kwargs)

    param_group.foreach_all_gather = counted
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    fsdp.parallelize(model, compute_dtype=torch.float32)
    ids = torch.tensor([[1, 2, 3, 4]])
    model.eval()
    with torch.no_grad():
        full = model(input_ids=ids).logits  # a gathered forward outside the block
        entered = len(gathers)
        with fsdp.gathered(model):
            inside_start = len(gathers)
            outs = [model(input_ids=ids).logits for _ in range(3 if rank == 0 else 1)]
            inside = len(gathers) - inside_start
        on_entry = inside_start - entered
    # After the block every module is sharded again: a training forward and
    # backward gather and reduce as before (both ranks run them).
    model.train()
    before = len(gathers)
    model(input_ids=ids).logits.sum().backward()
    results.put((rank, on_entry, inside, len(gathers) - before,
                 max(float((o - full).abs().max()) for o in outs)))
    dist.destroy_process_group()


@pytest.mark.slow
def test_forwards_inside_gathered_run_no_collective(tmp_path):
    got = run_two_ranks(_rank, folder=tmp_path, deadline_s=DEADLINE_S,
                        hang="a collective in decode")
    for rank, on_entry, inside, after, gap in got:
        # one all-gather per sharded module: 2 layers + the root (torch 2.6/2.7 keep the
        # root gathered after its first forward, so it needs none there)
        assert on_entry == (3 if NEWER_FSDP2 else 2), rank
        assert inside == 0, rank
        assert after >= 3, rank  # sharded again: the next forward gathers every module
        assert gap == 0.0, rank  # the gathered weights are the model's own
