"""The reward stage's tensors: responses decoded under their mask, the score
on the last response token. (Scoring itself: test_reward_pool.py.)"""

import torch

from thinkrl.records import Rollouts, Sample
from thinkrl.rewards.scoring import decode_responses, token_level_rewards


def _sample(source: str, truth: str, index: int) -> Sample:
    return Sample(data_source=source, ground_truth=truth, prompt_text="q", index=index)


def test_token_level_rewards_by_hand():
    # Lengths 3, 1, 4: the score goes to column length - 1 = 2, 0, 3; all else 0.
    mask = torch.tensor([[1, 1, 1, 0],
                         [1, 0, 0, 0],
                         [1, 1, 1, 1]])
    rewards = token_level_rewards(torch.tensor([0.5, 1.0, -1.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 0.5, 0.0],
                                [1.0, 0.0, 0.0, 0.0],
                                [0.0, 0.0, 0.0, -1.0]]
    assert rewards.dtype == torch.float32
    assert rewards.sum(-1).tolist() == [0.5, 1.0, -1.0]  # one nonzero per row


class _DigitTokenizer:
    """id i decodes to str(i); id 9 is a special token (EOS)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(str(i) for i in ids if not (skip_special_tokens and i == 9))


def test_decode_responses_decodes_only_masked_tokens():
    # Row 0 writes 4, 2, EOS then padding (0s that would decode to "0"); row 1 hits the limit.
    rollouts = Rollouts(
        prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1, dtype=torch.long),
        response_ids=torch.tensor([[4, 2, 9, 0], [4, 3, 1, 2]]),
        response_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        rollout_logprobs=torch.zeros(2, 4), finish_reasons=["stop", "length"],
        group_ids=torch.tensor([0, 0]), samples=[_sample("ok", "42", 0)] * 2)
    assert decode_responses(rollouts, _DigitTokenizer()) == ["42", "4312"]

