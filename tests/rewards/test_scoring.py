"""The reward stage: scorers per data source, errors counted not raised, the
score on the last response token."""

import logging

import pytest
import torch

from thinkrl.records import Rollouts, Sample
from thinkrl.rewards import get_scorer
from thinkrl.rewards.scoring import decode_responses, score_rollouts, score_texts, token_level_rewards


def _sample(source: str, truth: str, index: int) -> Sample:
    return Sample(data_source=source, ground_truth=truth, prompt_text="q", index=index)


def _broken(response, ground_truth, extra_info):
    raise ZeroDivisionError("bad scorer")


def _scorer_for(source):
    return {"ok": get_scorer("openai/gsm8k"), "broken": _broken}[source]


def test_a_raising_scorer_scores_zero_and_is_counted(caplog):
    texts = ["#### 4", "#### 4", "#### 5", "#### 4"]
    samples = [_sample("ok", "4", 0), _sample("broken", "4", 1), _sample("ok", "4", 2),
               _sample("broken", "4", 3)]
    with caplog.at_level(logging.WARNING, logger="thinkrl.rewards.scoring"):
        scores, errors = score_texts(texts, samples, scorer_for=_scorer_for)
    assert scores.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert scores.dtype == torch.float32
    assert errors == 2
    # logged once, naming the data source, the error and the row
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "broken" in warnings[0] and "ZeroDivisionError" in warnings[0] and "row 1" in warnings[0]


def test_an_unknown_data_source_is_an_error_not_a_crash():
    scores, errors = score_texts(["#### 1"], [_sample("nope", "1", 0)], scorer_for=get_scorer)
    assert scores.tolist() == [0.0] and errors == 1


def test_texts_and_samples_must_line_up():
    with pytest.raises(ValueError):
        score_texts(["#### 1", "#### 2"], [_sample("ok", "1", 0)], scorer_for=_scorer_for)


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


def test_score_rollouts_decodes_only_masked_tokens():
    # Row 0 writes 4, 2, EOS then padding (0s that would decode to "0"); row 1 hits the limit.
    rollouts = Rollouts(
        prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1, dtype=torch.long),
        response_ids=torch.tensor([[4, 2, 9, 0], [4, 3, 1, 2]]),
        response_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        rollout_logprobs=torch.zeros(2, 4), finish_reasons=["stop", "length"],
        group_ids=torch.tensor([0, 0]), samples=[_sample("ok", "42", 0)] * 2)
    assert decode_responses(rollouts, _DigitTokenizer()) == ["42", "4312"]

    def exact(response, truth, extra):
        return float(response == truth)

    result = score_rollouts(rollouts, _DigitTokenizer(), scorer_for=lambda source: exact)
    assert result.texts == ["42", "4312"]
    assert result.scores.tolist() == [1.0, 0.0] and result.errors == 0
