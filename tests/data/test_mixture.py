"""data.mixture: batches hold the data sources in the set proportions
(within one prompt per batch, exact over steps), each source in its own
seeded order, and a checkpointed position resumes the same batches."""

from __future__ import annotations

import pytest

from thinkrl.data.dataset import Prompt, PromptLoader
from thinkrl.data.mixture import MixtureLoader, batch_counts, source_weights
from thinkrl.records import Sample


def prompts(counts: dict[str, int]) -> list[Prompt]:
    return [Prompt(ids=[1, 2, 3], sample=Sample(source, "0", "p", index=i))
            for source, n in counts.items() for i in range(n)]


def test_weights_are_matched_exact_name_first_then_globs_shared_and_normalised():
    sources = ["reasoning_gym/a", "reasoning_gym/b", "reasoning_gym/c", "textarena/g", "openai/gsm8k"]
    notes = []
    weights = source_weights({"reasoning_gym/*": 2, "reasoning_gym/b": 3, "textarena/g": 3}, sources,
                             log=notes.append)
    # the glob's 2 is shared by a and c (b is named itself): 1, 3, 1, 3 of 8
    assert weights == {"reasoning_gym/a": 0.125, "reasoning_gym/b": 0.375, "reasoning_gym/c": 0.125,
                       "textarena/g": 0.375}
    assert notes == ["note: data.mixture leaves out openai/gsm8k (weight 0 or not named)"]
    with pytest.raises(ValueError, match="did you mean 'textarena/g'"):
        source_weights({"textarena/h": 1}, sources)


def test_hamiltons_counts_are_within_one_of_the_share_and_exact_over_steps():
    weights = {"a": 0.5, "b": 1 / 3, "c": 1 / 6}
    drawn = {s: 0 for s in weights}
    for k in range(12):
        counts = batch_counts(weights, batch_size=8, batches_before=k, drawn=drawn)
        assert sum(counts.values()) == 8
        for s, w in weights.items():
            assert abs(counts[s] - 8 * w) < 1 + 1e-9
            drawn[s] += counts[s]
    assert drawn == {"a": 48, "b": 32, "c": 16}  # 12 batches of 8: exactly 1/2, 1/3, 1/6


def test_batches_follow_the_mixture_and_a_resumed_loader_draws_the_same():
    data = prompts({"a": 10, "b": 40})
    make = lambda: MixtureLoader(data, weights={"a": 0.5, "b": 0.5}, batch_size=4,  # noqa: E731
                                 shuffle=True, seed=3, pad_token_id=0)
    loader = make()
    batches = [loader.next_batch() for _ in range(6)]
    assert all(sum(s.data_source == "a" for s in b.samples) == 2 for b in batches)
    seen_a = [s.index for b in batches for s in b.samples if s.data_source == "a"]
    assert sorted(seen_a[:10]) == list(range(10))  # a whole pass of the small source, then another
    state = None
    again = make()
    for k in range(3):
        again.next_batch()
    state = again.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    for k in range(3, 6):
        assert [s.index for s in resumed.next_batch().samples] == [s.index for s in batches[k].samples]
    with pytest.raises(ValueError, match="another data.mixture"):
        MixtureLoader(data, weights={"a": 1.0}, batch_size=4, shuffle=True, seed=3,
                      pad_token_id=0).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with data.mixture"):
        PromptLoader(data, batch_size=4, shuffle=True, seed=3, pad_token_id=0).load_state_dict(state)
