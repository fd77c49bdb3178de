"""The LoRA keys: bad values and a mismatched adapter folder are refused
with the fix; LoRA settings without lora_rank are noted as inactive."""

import json

import pytest

from thinkrl.config import load_config
from thinkrl.config.checks import validate
from thinkrl.config.inactive import inactive_settings

M = "actor_rollout_ref.model"


def problems(*overrides: str) -> str:
    with pytest.raises(ValueError) as err:
        validate(load_config("tiny", list(overrides)))
    return str(err.value)


def adapter_folder(tmp_path, **config):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                                                            **config}))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def test_bad_lora_values_are_listed_with_the_fix():
    text = problems(f"{M}.lora_rank=8", f"{M}.lora_alpha=0", f"{M}.target_modules=[]")
    for expected in (f"{M}.lora_alpha=0.0: must be > 0", f"{M}.target_modules=[]: use all-linear or a list"):
        assert expected in text, text
    assert f"{M}.lora_rank=-1: must be 0 (train every weight) or a rank >= 1" in problems(f"{M}.lora_rank=-1")


def test_an_adapter_path_is_checked_against_the_rank(tmp_path):
    folder = adapter_folder(tmp_path)
    assert validate(load_config("tiny", [f"{M}.lora_rank=8", f"{M}.lora_alpha=16",
                                         f"{M}.lora_adapter_path={folder}"]))
    text = problems(f"{M}.lora_rank=4", f"{M}.lora_adapter_path={folder}")
    assert f"the adapter has r=8, lora_alpha=16; set {M}.lora_rank=8 {M}.lora_alpha=16" in text, text
    assert "an adapter trains only with LoRA on" in problems(f"{M}.lora_adapter_path={folder}")
    assert "no adapter_config.json there" in problems(f"{M}.lora_rank=8", f"{M}.lora_adapter_path={tmp_path}")


def test_a_dora_adapter_is_refused(tmp_path):
    folder = adapter_folder(tmp_path, use_dora=True)
    assert "DoRA and rsLoRA adapters are not supported" in problems(
        f"{M}.lora_rank=8", f"{M}.lora_adapter_path={folder}")


def test_lora_settings_without_a_rank_are_noted():
    notes = inactive_settings(load_config("tiny", [f"{M}.lora_alpha=64", f"{M}.target_modules=[q_proj]"]))
    assert any(f"{M}.lora_alpha=64.0 has no effect" in n for n in notes), notes
    assert any(f"{M}.target_modules=['q_proj'] has no effect" in n for n in notes), notes
    assert not any("lora" in n for n in inactive_settings(load_config("tiny", [f"{M}.lora_rank=8"])))


def test_an_adapter_training_biases_or_whole_modules_is_refused(tmp_path):
    folder = adapter_folder(tmp_path, bias="all", modules_to_save=["lm_head"])
    assert "thinkrl trains plain LoRA matrices only" in problems(
        f"{M}.lora_rank=8", f"{M}.lora_adapter_path={folder}")


def test_the_critic_s_lora_keys_are_checked_and_noted_like_the_actor_s():
    text = problems("algorithm.adv_estimator=gae", "critic.model.lora_rank=4", "critic.model.lora_alpha=0")
    assert "critic.model.lora_alpha=0.0: must be > 0" in text, text
    assert "critic.model.lora_rank=-2: must be 0" in problems("algorithm.adv_estimator=gae",
                                                              "critic.model.lora_rank=-2")
    notes = inactive_settings(load_config("tiny", ["algorithm.adv_estimator=gae", "critic.model.lora_alpha=8"]))
    assert any("critic.model.lora_alpha=8.0 has no effect: it configures the critic's LoRA" in n
               for n in notes), notes
