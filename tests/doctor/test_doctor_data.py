"""Data checks: paths (seed 000, bug 2), schema, reward, template, prompt lengths."""

from __future__ import annotations

from doctor_helpers import context, row, write_rows

from thinkrl.doctor.data import check_files, check_prompt_length, check_reward, check_schema, check_template


def _data(tmp_path, rows_train, rows_val=None):
    train = write_rows(tmp_path / "data" / "gsm8k_train.parquet", rows_train)
    val = write_rows(tmp_path / "data" / "gsm8k_test.parquet", rows_val or rows_train)
    return train, val


def _ctx(tiny_model_dir, train, val, *extra):
    return context(f"data.train_files={train}", f"data.val_files={val}", "data.train_batch_size=2",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                   f"actor_rollout_ref.model.path={tiny_model_dir}", *extra)


def test_a_path_without_its_prefix_fails_and_lists_the_real_file(tmp_path, tiny_model_dir):
    # Seed 000: preprocessing wrote <prefix>_train...; the config named the path without it.
    train, val = _data(tmp_path, [row()] * 4)
    ctx = _ctx(tiny_model_dir, train.parent / "train.parquet", val)
    rows = check_files(ctx)
    assert [r.status for r in rows] == ["fail", "ok"]
    assert "train.parquet" in rows[0].found
    assert "gsm8k_train.parquet" in rows[0].fix and "prefix" in rows[0].fix
    # the checks that need the rows say why they did not run
    assert check_schema(ctx)[0].status == "skip"


def test_an_empty_file_fails(tmp_path, tiny_model_dir):
    train, val = _data(tmp_path, [row()] * 4)
    train.write_bytes(b"")
    assert check_files(_ctx(tiny_model_dir, train, val))[0].status == "fail"


def test_rows_without_ground_truth_fail_the_schema(tmp_path, tiny_model_dir):
    bad = dict(row(), reward_model={"style": "rule"})
    train, val = _data(tmp_path, [row(), bad, row(), row()])
    [train_row, val_row] = check_schema(_ctx(tiny_model_dir, train, val))
    assert train_row.status == "fail" and "row 1" in train_row.found and "ground_truth" in train_row.fix


def test_a_data_source_without_reward_fails(tmp_path, tiny_model_dir):
    train, val = _data(tmp_path, [row(source="my/unknown_set")] * 4)
    result = check_reward(_ctx(tiny_model_dir, train, val))
    assert result.status == "fail" and "my/unknown_set" in result.found
    assert "custom_reward_function.path" in result.fix


def test_known_data_sources_name_their_scorer(tmp_path, tiny_model_dir):
    train, val = _data(tmp_path, [row()] * 4)
    result = check_reward(_ctx(tiny_model_dir, train, val))
    assert result.status == "ok" and "openai/gsm8k -> gsm8k" in result.found


def test_overlong_prompts_fail_with_truncation_error_and_warn_when_filtered(tmp_path, tiny_model_dir):
    long_question = "How many apples are there? " * 40
    train, val = _data(tmp_path, [row(), row(long_question), row(), row()])
    [failed, _] = check_prompt_length(_ctx(tiny_model_dir, train, val))
    assert failed.status == "fail" and "1 over the limit" in failed.found
    assert "data.filter_overlong_prompts=True" in failed.fix
    [warned, _] = check_prompt_length(_ctx(tiny_model_dir, train, val, "data.filter_overlong_prompts=True"))
    assert warned.status == "warn" and "dropped" in warned.found


def test_template_row_shows_the_rendered_prompt_of_each_template(tmp_path, tiny_model_dir):
    train, val = _data(tmp_path, [row()] * 4)
    rows = check_template(_ctx(tiny_model_dir, train, val, "data.val_template=qwen_r1"))
    assert [r.status for r in rows] == ["ok", "ok"]
    assert "template chat" in rows[0].found and "<|im_start|>user" in rows[0].found
    assert "template qwen_r1" in rows[1].found and "A conversation between User" in rows[1].found
