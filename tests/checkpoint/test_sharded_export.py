"""Gathering a sharded checkpoint (actor_dcp/) into one Hugging Face folder,
in one process: every weight of the config's model must come from the
checkpoint, never from uninitialised memory."""

import warnings

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM

from thinkrl.checkpoint.sharded import ACTOR_DIR, DCP_DIR, write_whole_weights


def _checkpoint(tmp_path, *, saved_layers: int, config_layers: int, tied: bool = False):
    import torch.distributed.checkpoint as dcp

    def model(layers):
        torch.manual_seed(0)
        return Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32,
                                            num_hidden_layers=layers, num_attention_heads=2,
                                            num_key_value_heads=1, tie_word_embeddings=tied))

    folder = tmp_path / "global_step_1"
    saved = model(saved_layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one process, no process group: intended
        dcp.save({"model": saved.state_dict()}, checkpoint_id=str(folder / DCP_DIR))
    model(config_layers).config.save_pretrained(folder / ACTOR_DIR)
    return folder, saved


@pytest.mark.parametrize("tied", [False, True])
def test_the_gathered_folder_holds_the_saved_weights(tmp_path, tied):
    folder, saved = _checkpoint(tmp_path, saved_layers=2, config_layers=2, tied=tied)
    out = tmp_path / "hf"
    write_whole_weights(folder, out)
    weights = load_file(out / "model.safetensors")
    # a tied head is the embedding: saved once, as the model's own save_pretrained does
    assert ("lm_head.weight" in weights) != tied
    for name, tensor in saved.state_dict().items():
        if name in weights:
            assert torch.equal(weights[name], tensor), name
    reloaded = Qwen2ForCausalLM.from_pretrained(out)
    for name, tensor in saved.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_weights_the_checkpoint_lacks_are_refused(tmp_path):
    folder, _ = _checkpoint(tmp_path, saved_layers=1, config_layers=2)
    with pytest.raises(ValueError, match=r"lacks \d+ weight\(s\).*model.layers.1"):
        write_whole_weights(folder, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
