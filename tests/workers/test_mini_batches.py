"""Planning the update: mini-batches with global normalisers, shares per rank."""

from __future__ import annotations

import torch

from thinkrl.records import PromptBatch, Rollouts, Sample, TrainBatch
from thinkrl.workers.mini_batches import (balanced_shares, contiguous_shares, plan_mini_batches,
                                          split_mini_batch)


def _batch(lengths: list[int], width: int = 4) -> TrainBatch:
    n = len(lengths)
    mask = torch.tensor([[1.0] * k + [0.0] * (width - k) for k in lengths])
    ids = torch.arange(n * (2 + width)).view(n, 2 + width)
    attention = torch.cat([torch.ones(n, 2), mask], 1).long()
    return TrainBatch(ids, attention, attention.cumsum(-1) - 1, mask,
                      advantages=torch.ones(n, width), old_logprobs=None, ref_logprobs=None)


def test_balanced_shares_equal_counts_and_tokens():
    tokens = torch.tensor([3, 8, 4, 7, 6, 5])
    # longest first: rows 1(8) 3(7) 4(6) 5(5) 2(4) 0(3), dealt in snake order:
    # lap 0: r0 <- 1, r1 <- 3; lap 1 (reversed): r1 <- 4, r0 <- 5; lap 2: r0 <- 2, r1 <- 0
    shares = balanced_shares(tokens, 2)
    assert [s.tolist() for s in shares] == [[1, 2, 5], [0, 3, 4]]
    assert [int(tokens[s].sum()) for s in shares] == [8 + 5 + 4, 7 + 6 + 3]
    assert sorted(s.numel() for s in balanced_shares(torch.tensor([1, 1, 1]), 2)) == [1, 2]


def test_contiguous_shares():
    assert [s.tolist() for s in contiguous_shares(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [s.tolist() for s in contiguous_shares(1, 3)] == [[0], [], []]


def test_mini_batch_scale_spans_the_whole_mini_batch_on_every_share():
    batch = _batch([4, 1, 2, 3])
    [mini] = plan_mini_batches(batch, mini_batch_size=4, epochs=1, shuffle=False,
                               generator=torch.Generator(), response_length=4)
    assert mini.scale.num_tokens == 10 and mini.scale.num_seqs == 4
    parts = split_mini_batch(mini, balanced_shares(mini.batch.attention_mask.sum(-1), 2))
    assert [len(p.batch) for p in parts] == [2, 2]
    assert all(p.scale == mini.scale for p in parts)  # the global normaliser travels
    assert sum(float(p.batch.response_mask.sum()) for p in parts) == 10


def test_plan_shuffles_each_epoch_from_the_generator():
    batch = _batch([1, 2, 3, 4])
    a = plan_mini_batches(batch, mini_batch_size=2, epochs=2, shuffle=True,
                          generator=torch.Generator().manual_seed(0), response_length=4)
    b = plan_mini_batches(batch, mini_batch_size=2, epochs=2, shuffle=True,
                          generator=torch.Generator().manual_seed(0), response_length=4)
    assert len(a) == 4
    assert all(torch.equal(x.batch.input_ids, y.batch.input_ids) for x, y in zip(a, b))


def _rollouts(n_prompts: int, g: int, width: int, pad: int = 0) -> Rollouts:
    n = n_prompts * g
    sample = Sample("ds", "1", "q")
    return Rollouts(prompt_ids=torch.ones(n, 3, dtype=torch.long),
                    prompt_mask=torch.ones(n, 3, dtype=torch.long),
                    response_ids=torch.full((n, width), 7), response_mask=torch.ones(n, width).long(),
                    rollout_logprobs=torch.full((n, width), -1.0), finish_reasons=["stop"] * n,
                    group_ids=torch.arange(n_prompts).repeat_interleave(g), samples=[sample] * n)


def test_rollouts_concat_pads_responses_and_shifts_groups():
    joined = Rollouts.concat([_rollouts(2, 2, 3), _rollouts(0, 2, 0), _rollouts(1, 2, 5)],
                             pad_token_id=0)
    assert joined.response_ids.shape == (6, 5)
    assert joined.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert joined.response_ids[0].tolist() == [7, 7, 7, 0, 0]
    assert joined.response_mask[0].tolist() == [1, 1, 1, 0, 0]
    assert joined.rollout_logprobs[0, 3:].tolist() == [0.0, 0.0]
    assert len(joined.samples) == len(joined.finish_reasons) == 6


def test_prompt_batch_select_keeps_padding_width():
    batch = PromptBatch(torch.arange(12).view(3, 4), torch.ones(3, 4), [Sample("d", str(i), "q")
                                                                       for i in range(3)])
    part = batch.select(torch.tensor([2, 0]))
    assert part.input_ids.shape == (2, 4) and [s.ground_truth for s in part.samples] == ["2", "0"]


def test_micro_batch_rows_by_count_and_by_token_budget():
    from thinkrl.models.micro_batches import micro_batch_rows

    counts = torch.tensor([10, 8, 10, 6, 11, 7])
    assert micro_batch_rows(counts, micro_batch_size=4) == [slice(0, 4), slice(4, 6)]
    # 10 | 8 | 10 + 6 = 16 | 11 | 7 (each next row would pass 16)
    assert micro_batch_rows(counts, micro_batch_size=4, max_tokens=16) == [
        slice(0, 1), slice(1, 2), slice(2, 4), slice(4, 5), slice(5, 6)]
    # A row over the budget goes alone; everything fits a big budget.
    assert micro_batch_rows(torch.tensor([3, 50, 3]), micro_batch_size=1, max_tokens=10) == [
        slice(0, 1), slice(1, 2), slice(2, 3)]
    assert micro_batch_rows(counts, micro_batch_size=1, max_tokens=1000) == [slice(0, 6)]
    assert micro_batch_rows(torch.zeros(0, dtype=torch.long), micro_batch_size=2, max_tokens=5) == []
