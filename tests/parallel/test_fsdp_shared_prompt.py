"""The shared-prompt pass (model.use_remove_padding) on FSDP2 shards.

Two gloo processes (a file store: nothing listens on the network), a small
Qwen2 sharded as the ray backend shards it, GRPO-like rows (2 prompts x 4
responses of uneven lengths). Each rank takes its own rows; rank 0 runs two
micro-batches, rank 1 one and then an idle pass (as `agreed_micro_batches`
makes a rank with fewer rows do), so the two ranks mix the shared pass's
per-layer forwards with the model's own forward in the same collectives.

Checked on every rank, with and without activation checkpointing: the
shared pass's log-probs equal the padded forward's and one process's
shared pass on the real tokens (1e-5: float32 rounding, 1e-6 relative on
log-probs up to -10 from this model's wide random weights), its
columns past the longest response are exactly 0 (so the shared pass really
ran, not the padded fallback), and the gradients of the whole sharded model
(summed over ranks by FSDP2) equal those of one unsharded model over all
rows (1e-5 relative to each gradient's norm).
"""

from __future__ import annotations


import pytest
import torch
from gloo_ranks import run_two_ranks

DEADLINE_S = 180
G, P, R, V = 4, 5, 7, 48


def _model(checkpointing: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=0.3, tie_word_embeddings=True))
    from thinkrl.models.loading import prepare_for_training
    return prepare_for_training(model, device=None, gradient_checkpointing=checkpointing)


def _batch():
    """2 prompts (one left-padded) x G responses of uneven lengths (right-padded)."""
    gen = torch.Generator().manual_seed(3)
    prompt_mask = torch.ones(2, P, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompts = torch.randint(3, V, (2, P), generator=gen) * prompt_mask
    lengths = torch.tensor([7, 2, 4, 1, 3, 2, 6, 1])
    response_mask = (torch.arange(R)[None] < lengths[:, None]).long()
    responses = torch.randint(3, V, (2 * G, R), generator=gen) * response_mask
    ids = torch.cat((prompts.repeat_interleave(G, 0), responses), 1)
    mask = torch.cat((prompt_mask.repeat_interleave(G, 0), response_mask), 1)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), response_mask.bool()


# Each rank's micro-batches (row slices of _batch): rank 0 two, rank 1 one.
SHARES = {0: [slice(0, 3), slice(3, 5)], 1: [slice(5, 8)]}


def _loss_and_logprobs(model, rows, *, remove_padding: bool):
    from thinkrl.models.forward import response_logprobs

    ids, mask, pos, real = (t[rows] for t in _batch())
    logp, ent = response_logprobs(model, ids, mask, pos, response_length=R, temperature=0.8,
                                  with_entropy=True, entropy_grad=True,
                                  remove_padding=remove_padding)
    return ((logp - 0.1 * ent) * real).sum(), logp.detach(), real


def _rank(rank: int, store: str, checkpointing: bool, results) -> None:
    import torch.distributed as dist

    from thinkrl.models.forward import idle_pass
    from thinkrl.parallel import fsdp

    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    whole = _model(checkpointing)  # one process's model over all rows: the reference
    sum(_loss_and_logprobs(whole, rows, remove_padding=False)[0]
        for share in SHARES.values() for rows in share).backward()
    want = {name: p.grad for name, p in whole.named_parameters()}

    sharded = fsdp.parallelize(_model(checkpointing), compute_dtype=torch.float32)
    report = {}
    for remove_padding in (False, True):
        sharded.zero_grad()
        logprobs = []
        for rows in SHARES[rank]:
            loss, logp, real = _loss_and_logprobs(sharded, rows, remove_padding=remove_padding)
            loss.backward()
            logprobs.append((logp, real))
        if rank == 1:  # rank 0 has one more micro-batch: join its collectives
            idle_pass(sharded, device=torch.device("cpu"), backward=True)
        grads = {name: fsdp.full_tensor(p.grad) for name, p in sharded.named_parameters()}
        report[remove_padding] = (logprobs, grads)
    padded, shared = report[False], report[True]
    # the same pass on one process, over the same rows
    alone = [_loss_and_logprobs(whole, rows, remove_padding=True)[1] for rows in SHARES[rank]]
    lp_gap = max(max(float((s[r] - p[r]).abs().max()), float((s[r] - a[r]).abs().max()))
                 for (p, r), (s, _), a in zip(padded[0], shared[0], alone))
    cut_zero = all(bool((s[:, int(r.sum(-1).max()):] == 0).all()) for s, r in shared[0])
    grad_gap = {kind: max(float((grads[n] - want[n]).norm() / want[n].norm()) for n in want)
                for kind, (_, grads) in report.items()}
    results.put((rank, lp_gap, cut_zero, grad_gap[False], grad_gap[True]))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_shared_prompt_pass_on_two_shards_equals_the_padded_forward(tmp_path, checkpointing):
    got = run_two_ranks(_rank, checkpointing, folder=tmp_path, deadline_s=DEADLINE_S,
                        hang="mismatched collectives")
    for rank, lp_gap, cut_zero, padded_gap, shared_gap in got:
        assert lp_gap <= 1e-5, (rank, lp_gap)
        assert cut_zero, rank
        assert padded_gap <= 1e-5, (rank, padded_gap)
        assert shared_gap <= 1e-5, (rank, shared_gap)
