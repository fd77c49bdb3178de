"""Loading models and tokenizers from local folders, as a hub id would load."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from thinkrl.models.loading import eos_token_ids, load_causal_lm, load_tokenizer


def test_loads_the_tiny_model_folder_and_disables_dropout(tiny_model_dir, tmp_path):
    config = Qwen2Config.from_pretrained(tiny_model_dir)
    config.attention_dropout = 0.3
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(tmp_path)
    loaded = load_causal_lm(str(tmp_path), dtype=torch.float32, device=torch.device("cpu"))
    assert all(m.attention_dropout == 0.0 for m in loaded.modules() if hasattr(m, "attention_dropout"))
    tokenizer = load_tokenizer(str(tiny_model_dir))
    assert tokenizer.pad_token_id is not None and tokenizer.chat_template
    assert tokenizer.eos_token_id in eos_token_ids(tokenizer, loaded.generation_config)


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no folder"):
        load_tokenizer(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="does not hold a loadable model"):
        load_causal_lm(str(tmp_path / "empty"), dtype=torch.float32, device=torch.device("cpu"))


def test_real_qwen_tokenizer_from_shared_data():
    from conftest import SHARED_DATA

    folder = SHARED_DATA / "tokenizers" / "qwen2.5"
    if not folder.is_dir():
        pytest.skip("../shared/data is absent")
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [151644, 151645]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")


def test_gradient_checkpointing_is_switched_on(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"),
                           gradient_checkpointing=True)
    flag = "is_activation_checkpointing"  # transformers 5; 4.x: is_gradient_checkpointing
    flag = flag if hasattr(model, flag) else "is_gradient_checkpointing"
    assert getattr(model, flag)
    plain = load_causal_lm(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"))
    assert not getattr(plain, flag)


def test_a_truncated_or_mismatched_model_folder_is_a_clear_error(tiny_model_dir, tmp_path):
    import json
    import shutil

    import pytest
    import torch

    from thinkrl.models.loading import load_causal_lm

    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_model_dir, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="a weight file does not read .truncated or corrupt"):
        load_causal_lm(str(truncated), dtype=torch.float32, device=torch.device("cpu"))
    mismatched = tmp_path / "mismatched"
    shutil.copytree(tiny_model_dir, mismatched)
    config = json.loads((mismatched / "config.json").read_text())
    config["hidden_size"] *= 2
    (mismatched / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not match the shapes config.json describes"):
        load_causal_lm(str(mismatched), dtype=torch.float32, device=torch.device("cpu"))


def test_a_model_class_that_does_not_import_is_named_an_environment_problem(tiny_model_dir,
                                                                             monkeypatch):
    # What transformers raises when a torchvision built for another torch sits
    # beside torch (seen with vLLM's CPU build): the folder is intact.
    import pytest
    import torch
    from transformers import AutoModelForCausalLM

    from thinkrl.errors import SetupError
    from thinkrl.models.loading import load_causal_lm

    def broken(*args, **kwargs):
        try:
            raise ModuleNotFoundError("No module named 'torchvision._meta_registrations'")
        except ModuleNotFoundError as err:
            raise RuntimeError("Failed to import transformers.models.qwen2.modeling_qwen2 because "
                               "of the following error (look up to see its traceback):\n"
                               "No module named 'torchvision._meta_registrations'") from err

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", broken)
    with pytest.raises(SetupError) as err:
        load_causal_lm(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"))
    message = str(err.value)
    assert "cannot import the model's code in this environment" in message
    assert "torchvision._meta_registrations" in message and "installed: torch " in message
    assert "The model folder is not the cause" in message and "truncated" not in message
    assert "pip uninstall torchvision" in err.value.fix


def test_a_model_folder_without_tokenizer_files_says_so(tiny_model_dir, tmp_path):
    import shutil

    import pytest

    from thinkrl.errors import SetupError
    from thinkrl.models.loading import load_tokenizer

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / name, bare / name)
    with pytest.raises(SetupError, match="holds no tokenizer files") as err:
        load_tokenizer(str(bare))
    assert "data.tokenizer" in err.value.fix
    assert len(load_tokenizer(str(tiny_model_dir))) > 100  # a folder with them loads
