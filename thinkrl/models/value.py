"""The value model of PPO with a critic: the policy's architecture with one output per token.

It is transformers' ``AutoModelForTokenClassification`` with ``num_labels=1``
(verl's ``load_valuehead_model``): the decoder of ``critic.model.path`` and a
``score`` Linear(hidden, 1) on every position. From a causal-LM folder the
decoder weights load and the head starts fresh (the LM head is dropped);
from a folder this model saved (a checkpoint's ``critic/``) both load.

Sequences follow the layout of `thinkrl.records`. V_t, the value of the
state before response token t, is read at the position that predicts token
t: column P - 1 + t, the same position whose logits give log pi(y_t) (verl
slices ``values[:, -R - 1:-1]``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.errors import UserError
from thinkrl.models.loading import _explain, damaged_model, prepare_for_training


def load_value_model(path: str, *, dtype: torch.dtype, device: torch.device, trust_remote_code: bool = False,
                     override_config: dict | None = None, gradient_checkpointing: bool = False,
                     seed: int = 0) -> torch.nn.Module:
    """The value model of `path` on `device`, dropout off. A fresh head is drawn
    from its own generator seeded with `seed`, so building the critic neither
    depends on nor moves the global RNG (a GRPO run and a resumed run see the
    same global stream)."""
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized: score.weight" is the point here
    try:
        config = value_config(path, trust_remote_code=trust_remote_code,
                              override_config=override_config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForTokenClassification.from_pretrained(
                path, config=config, dtype=dtype, trust_remote_code=trust_remote_code)
    except ValueError as err:
        if "Unrecognized configuration class" in str(err):
            raise UserError(f"critic.model.path={path!r}: its architecture has no token-classification "
                             "head in transformers, so thinkrl cannot build a value model from it; use a "
                             "model family that has one (Qwen2, Llama, Mistral, ...)") from None
        raise _explain(path, "value model", err, key="critic.model.path") from None
    except OSError as err:
        raise _explain(path, "value model", err, key="critic.model.path") from None
    except Exception as err:  # safetensors' own error types, transformers' size mismatch
        raise damaged_model(path, err, key="critic.model.path") from None
    finally:
        hf_logging.set_verbosity(level)
    return prepare_for_training(model, device=device, gradient_checkpointing=gradient_checkpointing)


def value_config(path: str, *, trust_remote_code: bool, override_config: dict | None):
    """The config of `path` with one output per token and no dropout on it
    (verl's settings): the value must be a function of the weights."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code,
                                        **(override_config or {}))
    config.num_labels, config.classifier_dropout = 1, 0.0
    return config


def value_model_skeleton(path: str, *, dtype: torch.dtype, trust_remote_code: bool = False,
                         override_config: dict | None = None,
                         gradient_checkpointing: bool = False) -> torch.nn.Module:
    """The architecture `load_value_model` builds, on the meta device (no
    weights read, no memory: `thinkrl.parallel.fsdp.build_model`)."""
    from transformers import AutoModelForTokenClassification

    config = value_config(path, trust_remote_code=trust_remote_code, override_config=override_config)
    with torch.device("meta"):
        model = AutoModelForTokenClassification.from_config(config, dtype=dtype,
                                                            trust_remote_code=trust_remote_code)
    return prepare_for_training(model, device=None, gradient_checkpointing=gradient_checkpointing)


def value_head_name(model: torch.nn.Module) -> str:
    """The attribute holding the token-classification head (transformers
    names it `score` for Llama/Qwen2-style decoders, `classifier` for others)."""
    for name in ("score", "classifier"):
        if isinstance(getattr(model, name, None), torch.nn.Module):
            return name
    raise UserError(f"{type(model).__name__} has no score or classifier head: critic.model.lora_rank "
                     "cannot tell the value head from the decoder; use critic.model.lora_rank=0")


def response_values(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                    position_ids: Tensor, *, response_length: int) -> Tensor:
    """V_t for every response token: [N, P + R] inputs on the model's device -> [N, R] float32."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=False)
    return out.logits[:, -response_length - 1:-1, 0].float()  # [N, R]
