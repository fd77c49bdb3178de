"""`thinkrl doctor`'s vision rows on the tiny Qwen2.5-VL and image data."""

from __future__ import annotations

from thinkrl.commands.common import recipe_path
from thinkrl.config import load_config
from thinkrl.data.image_arith import write_splits
from thinkrl.doctor import diagnose


def _rows(model_dir, data, *extra):
    cfg = load_config(recipe_path("tiny"), [
        f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data['train']}",
        f"data.val_files={data['test']}", "data.train_batch_size=2", *extra])
    return {r.check: r for r in diagnose(cfg, families=("vision",))}


def test_vision_rows_on_a_vl_model_with_image_data(tiny_vl_dir, tmp_path):
    data = write_splits(tmp_path, train=3, test=2)
    rows = _rows(tiny_vl_dir, data, "data.max_prompt_length=256")
    assert rows["vision/model"].status == "ok"
    assert "Qwen2.5-VL" in rows["vision/model"].found
    assert "image prompts in data.train_files, data.val_files" in rows["vision/model"].found
    assert rows["vision/processor"].status == "ok"
    assert "3136..12544 pixels" in rows["vision/processor"].found  # the folder's min/max
    length = rows["vision/prompt-length"]
    # A 112 x 56 image: 8 vision tokens, counted in the prompt's length.
    assert length.status == "ok" and "(8 vision tokens in its largest image)" in length.found


def test_image_prompts_over_the_limit_fail_since_they_cannot_be_cut(tiny_vl_dir, tmp_path):
    data = write_splits(tmp_path, train=3, test=2)
    rows = _rows(tiny_vl_dir, data, "data.max_prompt_length=40", "data.truncation=left")
    assert rows["vision/prompt-length"].status == "fail"
    assert "cannot be truncated" in rows["vision/prompt-length"].fix


def test_image_data_on_a_text_model_fails(tiny_model_dir, tmp_path):
    data = write_splits(tmp_path, train=3, test=2)
    rows = _rows(tiny_model_dir, data)
    assert rows["vision/model"].status == "fail"
    assert "hold images, but the model (qwen2) is text-only" in rows["vision/model"].found
    assert "vision/processor" not in rows


def test_vllm_rollout_of_a_vl_model_needs_torchvision_checked_before_it_loads(tiny_vl_dir,
                                                                              tmp_path):
    """vLLM's Qwen2-VL imports torchvision; where it does not import (PyPI's
    build beside a CPU torch), the start-up checks say so before the tokenizer
    or the weights load, and the doctor names it; where it does, both pass."""
    import pytest

    from thinkrl.errors import SetupError
    from thinkrl.preflight import check_model

    try:
        import torchvision.transforms.v2.functional  # noqa: F401
        usable = True
    except Exception:  # noqa: BLE001
        usable = False
    data = write_splits(tmp_path, train=3, test=2)
    vllm = "actor_rollout_ref.rollout.name=vllm"
    cfg = load_config(recipe_path("tiny"), [f"actor_rollout_ref.model.path={tiny_vl_dir}", vllm])
    rows = {r.check: r for r in diagnose(load_config(recipe_path("tiny"), [
        f"actor_rollout_ref.model.path={tiny_vl_dir}", f"data.train_files={data['train']}",
        f"data.val_files={data['test']}", "data.train_batch_size=2", vllm]), families=("config",))}
    row = rows["config/rollout-model"]
    if usable:
        check_model(cfg, str(tiny_vl_dir))
        assert row.status == "ok" and "vision-language" in row.found
        return
    with pytest.raises(SetupError, match="needs torchvision") as err:
        check_model(cfg, str(tiny_vl_dir))
    assert "rollout.name=native" in str(err.value)
    assert row.status == "fail" and "torchvision" in row.found and "native" in row.fix
    check_model(load_config(recipe_path("tiny"), [f"actor_rollout_ref.model.path={tiny_vl_dir}"]),
                str(tiny_vl_dir))  # the native engine takes it
