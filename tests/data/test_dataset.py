"""Prompts from parquet to left-padded batches (rendering, length limits,
seeded resumable order), and the synthetic arithmetic task they come from."""

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from thinkrl.data import synthetic
from thinkrl.data.prep.builtin_arith import to_example
from thinkrl.data.prep.examples import to_verl_row
from thinkrl.data.dataset import Prompt, PromptLoader, _truncate, batches, collate, load_prompts
from thinkrl.records import Sample
from thinkrl.rewards import compute_score

ASSISTANT_HEADER = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer():
    from thinkrl.models.tiny import build_tokenizer

    problems = synthetic.generate_problems(100, seed=1)
    texts = [q + "\n" + a for q, a in synthetic.pretraining_texts(problems, full_solution_rate=0.5, seed=0)]
    return build_tokenizer(texts, vocab_size=300)


QUESTIONS = ["Ava has 3 apples.",  # short
             "Ben has 7 coins. He finds 2 more and then gives away 4. How many coins does Ben have now?",
             "Cleo has 5 cards. She buys 1 more."]


@pytest.fixture
def data_file(tmp_path):
    rows = [{"data_source": "thinkrl/arith",
             "prompt": [{"role": "user", "content": q}],
             "reward_model": {"style": "rule", "ground_truth": str(i)},
             "extra_info": {"index": i}} for i, q in enumerate(QUESTIONS)]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _lengths(tokenizer) -> list[int]:
    """Token counts after the chat template, computed without load_prompts."""
    return [len(tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=True,
                                              add_generation_prompt=True, return_dict=True)["input_ids"])
            for q in QUESTIONS]


def _load(path, tokenizer, *, limit=1024, filter_overlong=False, truncation="error", log=print):
    return load_prompts(str(path), tokenizer, key="data.train_files", prompt_key="prompt",
                        reward_fn_key="data_source", max_prompt_length=limit,
                        filter_overlong=filter_overlong, truncation=truncation,
                        chat_kwargs={}, log=log)


# ---------------------------------------------------------------- load_prompts

def test_prompts_are_rendered_with_the_chat_template(data_file, tokenizer):
    prompts = _load(data_file, tokenizer)
    assert [len(p.ids) for p in prompts] == _lengths(tokenizer)
    first = prompts[0]
    assert first.sample.prompt_text == f"<|im_start|>user\n{QUESTIONS[0]}<|im_end|>\n{ASSISTANT_HEADER}"
    assert first.sample.prompt_text.endswith(ASSISTANT_HEADER)
    assert tokenizer.decode(first.ids) == first.sample.prompt_text
    assert [p.sample.ground_truth for p in prompts] == ["0", "1", "2"]
    assert [p.sample.index for p in prompts] == [0, 1, 2]
    assert prompts[2].sample.extra_info == {"index": 2}
    assert prompts[2].sample.data_source == "thinkrl/arith"


def test_overlong_prompts_raise_with_the_count_and_the_longest(data_file, tokenizer):
    lengths = _lengths(tokenizer)
    limit = min(lengths)  # the shortest fits; the other two are over
    with pytest.raises(ValueError) as err:
        _load(data_file, tokenizer, limit=limit)
    message = str(err.value)
    assert f"2 prompt(s) are longer than data.max_prompt_length={limit}" in message
    assert f"the longest has {max(lengths)} tokens ({data_file}, row 1)" in message


def test_filter_overlong_drops(data_file, tokenizer):
    logs = []
    limit = sorted(_lengths(tokenizer))[1]  # row 0 and row 2 fit, row 1 is over
    prompts = _load(data_file, tokenizer, limit=limit, filter_overlong=True, log=logs.append)
    assert [p.sample.index for p in prompts] == [0, 2]
    assert logs == [f"data.train_files: 1 prompt(s) over {limit} tokens dropped"]
    with pytest.raises(ValueError, match="no prompt is left"):
        _load(data_file, tokenizer, limit=3, filter_overlong=True, log=logs.append)


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_truncation_keeps_the_expected_ids(data_file, tokenizer, side):
    full = [p.ids for p in _load(data_file, tokenizer)]
    limit = min(len(ids) for ids in full) - 1  # every prompt is over by at least one
    cut = [p.ids for p in _load(data_file, tokenizer, limit=limit, truncation=side, log=lambda m: None)]
    for ids, kept in zip(full, cut):
        assert len(kept) == limit
        head = limit // 2
        assert kept == {"left": ids[-limit:], "right": ids[:limit],
                        "middle": ids[:head] + ids[len(ids) - (limit - head):]}[side]
    if side == "left":  # the end of the prompt survives: the model still sees its turn
        assert all(tokenizer.decode(k).endswith(ASSISTANT_HEADER) for k in cut)


def test_truncate_by_hand():
    ids = [1, 2, 3, 4, 5, 6, 7]
    assert _truncate(ids, 4, "left") == [4, 5, 6, 7]
    assert _truncate(ids, 4, "right") == [1, 2, 3, 4]
    assert _truncate(ids, 4, "middle") == [1, 2, 6, 7]  # head 4 // 2 = 2, tail 2
    assert _truncate(ids, 5, "middle") == [1, 2, 5, 6, 7]  # head 2, tail 3
    assert _truncate(ids, 1, "middle") == [7]  # head 0, tail 1
    assert _truncate(ids, 7, "middle") == ids


def test_a_tokenizer_without_chat_template(data_file, tokenizer):
    bare = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer)
    bare.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        _load(data_file, bare)


# ---------------------------------------------------------------- collate / loader

def _prompt(i: int, length: int = 1) -> Prompt:
    return Prompt(ids=[100 + i] * length,
                  sample=Sample(data_source="s", ground_truth=str(i), prompt_text="", index=i))


def test_collate_left_pads():
    batch = collate([Prompt([5, 6, 7], _prompt(0).sample), Prompt([8], _prompt(1).sample)],
                    pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.input_ids.dtype == batch.attention_mask.dtype == torch.long
    assert [s.index for s in batch.samples] == [0, 1]


def _indices(batch) -> list[int]:
    return [s.index for s in batch.samples]


def _loader(n=12, batch_size=4, seed=0, shuffle=True) -> PromptLoader:
    return PromptLoader([_prompt(i) for i in range(n)], batch_size=batch_size, shuffle=shuffle,
                        seed=seed, pad_token_id=0)


def test_loader_order_is_seeded_and_changes_per_epoch():
    a, b, c = _loader(seed=0), _loader(seed=0), _loader(seed=1)
    first = [_indices(a.next_batch()) for _ in range(6)]  # two epochs of 3 batches
    assert first == [_indices(b.next_batch()) for _ in range(6)]
    assert first != [_indices(c.next_batch()) for _ in range(6)]
    epoch0, epoch1 = sum(first[:3], []), sum(first[3:], [])
    assert sorted(epoch0) == sorted(epoch1) == list(range(12))  # each prompt once per epoch
    assert epoch0 != epoch1
    assert epoch0 != list(range(12))  # shuffled
    assert a.state_dict() == {"epoch": 1, "position": 3}


def test_loader_drops_the_incomplete_last_batch():
    loader = _loader(n=10, batch_size=4)  # 10 // 4 = 2 batches; 2 prompts wait for the next epoch
    assert loader.batches_per_epoch == 2
    seen = _indices(loader.next_batch()) + _indices(loader.next_batch())
    assert len(set(seen)) == 8
    loader.next_batch()
    assert loader.state_dict() == {"epoch": 1, "position": 1}


def test_loader_without_shuffle_is_in_order():
    loader = _loader(shuffle=False)
    assert [_indices(loader.next_batch()) for _ in range(4)] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [0, 1, 2, 3]]


@pytest.mark.parametrize("taken", [1, 3, 4])  # mid-epoch, at the end of an epoch, next epoch
def test_loader_state_dict_resumes_the_same_next_batch(taken):
    a = _loader(seed=3)
    for _ in range(taken):
        a.next_batch()
    b = _loader(seed=3)
    b.load_state_dict(a.state_dict())
    for _ in range(4):
        assert _indices(a.next_batch()) == _indices(b.next_batch())


def test_loader_smaller_than_batch_raises():
    with pytest.raises(ValueError, match="3 prompts, fewer than data.train_batch_size=4"):
        _loader(n=3, batch_size=4)


def test_validation_batches_cover_every_prompt_in_order():
    prompts = [_prompt(i, length=i + 1) for i in range(5)]
    out = list(batches(prompts, batch_size=2, pad_token_id=0))
    assert [_indices(b) for b in out] == [[0, 1], [2, 3], [4]]
    assert out[1].input_ids.tolist() == [[0, 102, 102, 102], [103, 103, 103, 103]]  # lengths 3, 4


# ---------------------------------------------------------------- synthetic task

STEP = re.compile(r"(\d+) ([+-]) (\d+) = (-?\d+)\.")


@pytest.fixture(scope="module")
def split():
    return synthetic.split_problems(train=300, test=100, seed=synthetic.DATA_SEED)


def test_split_is_disjoint(split):
    train, test = split
    assert len(train) == 300 and len(test) == 100
    train_q, test_q = {p.question for p in train}, {p.question for p in test}
    assert len(train_q) == 300 and len(test_q) == 100
    assert not train_q & test_q
    # the test set is the start of the fixed pool whatever the train size
    _, test_again = synthetic.split_problems(train=50, test=100, seed=synthetic.DATA_SEED)
    assert [p.question for p in test_again] == [p.question for p in test]


def test_every_solution_is_correct_arithmetic(split):
    for problem in split[0] + split[1]:
        text = problem.solution()
        steps = STEP.findall(text)
        assert 2 <= len(steps) <= 3, text
        total = int(re.search(r" has (\d+) ", problem.question).group(1))
        for left, op, right, result in steps:
            assert int(left) == total  # each step starts from the running total
            total = int(left) + int(right) if op == "+" else int(left) - int(right)
            assert int(result) == total, text
            assert 1 <= int(right) <= synthetic.MAX_OPERAND
            assert total >= 0
        assert text.endswith(f"\n#### {total}") and problem.answer == total


def test_sloppy_solution_stops_after_one_step(split):
    problem = split[0][0]
    sloppy = problem.solution(sloppy=True)
    assert len(STEP.findall(sloppy)) == 1
    assert sloppy == f"{problem.solution().split('. ')[0]}.\n#### {problem.steps[0][3]}"


def test_verl_row_and_its_ground_truth(split):
    train, _ = split
    row = to_verl_row(to_example(train[0]), split="train", index=0,
                      instruction=synthetic.INSTRUCTION, demonstration=())
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == synthetic.DATA_SOURCE
    assert row["prompt"] == [{"role": "user", "content": f"{train[0].question} {synthetic.INSTRUCTION}"}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": str(train[0].answer)}
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0

    sloppy_right = 0
    for problem in train:
        truth = to_example(problem).ground_truth
        assert compute_score(synthetic.DATA_SOURCE, problem.solution(), truth) == 1.0
        # the shortcut is right only when the later steps cancel out
        shortcut_right = problem.steps[0][3] == problem.answer
        assert compute_score(synthetic.DATA_SOURCE, problem.solution(sloppy=True), truth) == \
            float(shortcut_right)
        sloppy_right += shortcut_right
    assert sloppy_right < 0.2 * len(train)  # usually 0


def test_pretraining_texts_mix_full_and_sloppy(split):
    problems = split[0]
    pairs = synthetic.pretraining_texts(problems, full_solution_rate=0.3, seed=0)
    assert [q for q, _ in pairs] == [f"{p.question} {synthetic.INSTRUCTION}" for p in problems]
    full = sum(a == p.solution() for (_, a), p in zip(pairs, problems))
    assert 0.2 * len(problems) < full < 0.4 * len(problems)
    assert pairs == synthetic.pretraining_texts(problems, full_solution_rate=0.3, seed=0)
