"""Each failure of the seeds that can happen off the device, planted one at a
time into a run that otherwise rehearses clean (the tiny recipe on the test
model): the rehearsal fails at the stage where the cluster run would have,
with the message and the fix (docs/rehearse.md has the table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from thinkrl.rehearse import RunArgs, rehearse

ARR = "actor_rollout_ref"


@pytest.fixture
def planted(asset_cache, tiny_model_dir, tmp_path):
    """rehearse(*overrides) on the tiny recipe with the test model; returns
    (the failed stage's result or None, the report). The real run's folder
    must stay untouched whatever happens."""
    real_run = tmp_path / "real-run"

    def run(*overrides: str, config: str = "tiny"):
        base = (f"{ARR}.model.path={tiny_model_dir}", f"trainer.default_local_dir={real_run}")
        rehearsal, report = rehearse(RunArgs(config, (*base, *overrides)), tmp_path / "rehearsal",
                                     log=lambda _m: None)
        assert not real_run.exists(), "a rehearsal wrote into the real run's folder"
        failed = [r for r in rehearsal.results if r.status == "failed"]
        return (failed[0] if failed else None), report
    return run


def _reward_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, "
                    "**kwargs):\n" + body)
    return path


def test_a_template_name_that_does_not_exist_fails_the_config_stage(planted):
    failed, _ = planted("data.template=qwen-r1")
    assert failed.stage == "config" and "qwen_r1" in failed.found  # the known names


def test_a_reward_format_the_template_never_asks_for_fails_the_reward_stage(planted):
    # seed 000: R1-Zero's reward wants <think>/<answer>; a prompt without the
    # qwen_r1 instruction never asks for them and every response scores 0
    failed, _ = planted("reward.scorer=r1", "data.template=chat")
    assert failed.stage == "reward", failed
    assert "<think> and <answer>" in failed.found and "never ask" in failed.found
    assert "data.template=qwen_r1" in failed.fix


def test_a_data_path_without_the_file_prefix_fails_the_doctor_stage(planted, tmp_path):
    from thinkrl import builtin

    real = Path(builtin.resolve_data_files("builtin:arith/train"))
    folder = tmp_path / "dataset"
    folder.mkdir()
    (folder / "orz_train.parquet").write_bytes(real.read_bytes())
    failed, _ = planted(f"data.train_files={folder / 'data'}")  # the prefix left out
    assert failed.stage == "doctor" and "data/files" in failed.found
    assert "orz_train.parquet" in failed.found  # the nearest file, named


def test_a_reward_that_raises_on_real_rows_fails_the_reward_stage_naming_the_row(planted, tmp_path):
    reward = _reward_file(tmp_path, "    if int(ground_truth) % 2:\n"
                                    "        raise KeyError('units')\n"
                                    "    return float(ground_truth in solution_str)\n")
    failed, _ = planted(f"custom_reward_function.path={reward}", "reward.num_workers=0")
    assert failed.stage == "reward" and "KeyError" in failed.found
    assert "arith" in failed.found and ".parquet, row " in failed.found  # the real file's row


def test_a_reward_that_scores_the_gold_answer_0_fails_the_reward_stage(planted, tmp_path):
    reward = _reward_file(tmp_path, "    return float(solution_str == (extra_info or {}).get('solution'))\n")
    failed, _ = planted(f"custom_reward_function.path={reward}", "reward.num_workers=0")
    assert failed.stage == "reward" and "no row's gold answer above a wrong answer" in failed.found


def test_a_batch_that_does_not_divide_the_ranks_fails_the_config_stage(planted):
    failed, _ = planted("trainer.n_gpus_per_node=3")  # 32 prompts x 8 over 3 ranks
    assert failed.stage == "config" and "trainer.n_gpus_per_node 3" in failed.found


def test_a_tp_size_that_does_not_split_the_heads_fails_the_doctor_stage(planted):
    # the test model has 4 query / 2 key-value heads; vLLM TP3 cannot split them
    failed, _ = planted(f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.tensor_model_parallel_size=3",
                        "trainer.n_gpus_per_node=6", "data.train_batch_size=6",
                        f"{ARR}.actor.ppo_mini_batch_size=6", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8")
    assert failed.stage == "doctor" and "config/rollout-heads" in failed.found
    assert "choose tensor_model_parallel_size among 1, 2, 4" in failed.found


@pytest.mark.slow
def test_a_run_that_would_not_resume_fails_the_resume_stage(planted):
    failed, report = planted("trainer.resume_mode=disable")
    assert failed.stage == "resume", report
    assert "began at step 0, not after global_step_2" in failed.found
    assert "trainer.resume_mode=auto" in failed.fix


@pytest.mark.slow
def test_the_tiny_recipe_rehearses_end_to_end(planted):
    failed, report = planted()
    assert failed is None, report
    for stage in ("config", "doctor", "model", "data", "reward", "train", "resume", "export", "eval"):
        assert f"\n{stage} " in report
    assert "rehearsal passed" in report and "projection for the real run" in report
    assert "trainer.save_freq=-1" in report  # the recipe keeps no checkpoint: said at resume


def test_the_work_folder_may_not_be_the_real_run_folder(asset_cache, tiny_model_dir, tmp_path):
    real_run = tmp_path / "real-run"
    args = RunArgs("tiny", (f"{ARR}.model.path={tiny_model_dir}", f"trainer.default_local_dir={real_run}"))
    with pytest.raises(ValueError, match="inside the run's own folder"):
        rehearse(args, real_run / "rehearsal", log=lambda _m: None)
    assert not real_run.exists()


def test_the_command_refuses_a_work_folder_that_is_not_empty(tmp_path, capsys):
    from thinkrl.cli import main

    (tmp_path / "old.txt").write_text("kept")
    assert main(["rehearse", "--workdir", str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "old.txt").read_text() == "kept"
