"""Saved generations: file names, one object per response, deterministic selection."""

import pytest

from thinkrl.generations import Generation, read_jsonl, save_generations, select_generations


def gen(prompt_index: int, j: int) -> Generation:
    return Generation(data_source="thinkrl/arith", prompt=f"Q{prompt_index} ‘quoted’",
                      response=f"A{prompt_index}.{j}", ground_truth="4", score=float(j % 2),
                      response_length=3 + j, finish_reason="stop" if j else "length",
                      prompt_index=prompt_index, row=10 + prompt_index)


def test_save_generations_writes_one_line_per_response(tmp_path):
    records = [gen(p, j) for p in range(2) for j in range(2)]
    path = save_generations(tmp_path, "val", 7, records)
    assert path == tmp_path / "generations" / "val_step_7.jsonl"
    lines = read_jsonl(path)
    assert len(lines) == 4
    assert lines[1] == {"step": 7, "data_source": "thinkrl/arith", "prompt": "Q0 ‘quoted’",
                        "response": "A0.1", "ground_truth": "4", "score": 1.0,
                        "response_length": 4, "finish_reason": "stop", "prompt_index": 0,
                        "row": 10, "accuracy": None, "environment": "single_turn_agent",
                        "turns": 2, "env_failure": None}
    assert list(lines[0])[0] == "step"
    # the same step again (a resumed run) replaces the file, no temporary file is left
    save_generations(tmp_path, "val", 7, records[:1])
    assert len(read_jsonl(path)) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["val_step_7.jsonl"]
    assert save_generations(tmp_path, "train", 3, records).name == "train_step_3.jsonl"


def test_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="train, val"):
        save_generations(tmp_path, "test", 1, [])


def test_selection_spreads_over_prompts():
    records = [gen(p, j) for p in range(8) for j in range(4)]  # 8 prompts x G=4
    picked = select_generations(records, 4)
    assert [(g.prompt_index, g.response) for g in picked] == \
        [(0, "A0.0"), (2, "A2.0"), (4, "A4.0"), (6, "A6.0")]
    assert select_generations(records, 4) == picked  # deterministic
    assert select_generations(records, 0) == []
    assert select_generations(records[:3], 10) == records[:3]


def test_train_generations_follow_the_frequency(tmp_path):
    import torch

    from thinkrl.generations import log_train_generations, log_val_generations
    from thinkrl.records import Rollouts, Sample

    # 3 prompts x G=2; response i has i + 1 tokens
    samples = [Sample(data_source="d", ground_truth="1", prompt_text=f"p{i // 2}", index=i // 2)
               for i in range(6)]
    mask = torch.tensor([[1 if t <= i else 0 for t in range(6)] for i in range(6)])
    rollouts = Rollouts(prompt_ids=torch.zeros(6, 1, dtype=torch.long),
                        prompt_mask=torch.ones(6, 1, dtype=torch.long),
                        response_ids=mask.clone(), response_mask=mask,
                        rollout_logprobs=torch.zeros(6, 6), finish_reasons=["stop"] * 6,
                        group_ids=torch.tensor([0, 0, 1, 1, 2, 2]), samples=samples)
    texts, scores = [f"r{i}" for i in range(6)], [0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    args = dict(texts=texts, scores=scores, count=3, every=10)
    assert log_train_generations(tmp_path, 5, rollouts, **args) is None
    path = log_train_generations(tmp_path, 20, rollouts, **args)
    lines = read_jsonl(path)
    assert path.name == "train_step_20.jsonl"
    assert [(x["prompt"], x["response"], x["score"], x["response_length"]) for x in lines] == \
        [("p0", "r0", 0.0, 1), ("p1", "r2", 0.0, 3), ("p2", "r4", 1.0, 5)]
    assert log_train_generations(tmp_path, 20, rollouts, **{**args, "count": 0}) is None
    assert log_val_generations(tmp_path, 0, [gen(0, 0)], count=0) is None
    assert log_val_generations(tmp_path, 0, [gen(0, 0)], count=5).name == "val_step_0.jsonl"
