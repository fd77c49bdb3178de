"""Loading a Hugging Face model and tokenizer: a local folder or a hub id."""

from __future__ import annotations

from pathlib import Path

import torch

from thinkrl.errors import SetupError, UserError


def _explain(path: str, what: str, err: Exception, *, key: str = "actor_rollout_ref.model.path"
             ) -> UserError:
    local = Path(path).expanduser()
    if local.exists():
        hint = f"the folder {local} exists but does not hold a loadable {what}"
    elif path.startswith(("/", ".", "~")):
        hint = f"there is no folder {local}"
    else:
        hint = ("it is neither a local folder nor a hub id that could be fetched "
                "(offline? set HF_HUB_OFFLINE=0 and check the name)")
    return UserError(f"{key}={path!r}: cannot load the {what}: {hint}. "
                      f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")


def import_failure(err: BaseException) -> str | None:
    """The import error behind `err` (anywhere in its cause chain, or in the
    text transformers wraps it in: "Failed to import ... because of the
    following error"), else None."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ImportError):
            return f"{type(seen).__name__}: {seen}"
        if "Failed to import" in str(seen):
            return str(seen).strip().splitlines()[-1]
        seen = seen.__cause__ or seen.__context__
    return None


def installed(*packages: str) -> str:
    """'torch 2.13.0+cpu, torchvision 0.28.0, ...' for the packages installed here."""
    from importlib import metadata

    found = []
    for name in packages:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def damaged_model(path: str, err: Exception, *, key: str = "actor_rollout_ref.model.path") -> UserError:
    """A model folder whose files do not load: a truncated or corrupt
    safetensors file, or weights whose shapes do not match config.json; or
    not the folder at all but this environment, when transformers cannot
    import the model's code (a package built for another torch, say)."""
    missing = import_failure(err)
    if missing is not None:
        return SetupError(
            f"{key}={path!r}: transformers cannot import the model's code in this environment "
            f"({missing}); installed: {installed('torch', 'torchvision', 'torchaudio', 'transformers')}. "
            "The model folder is not the cause",
            "install the torchvision (and torchaudio) built for the installed torch, or uninstall "
            "them if nothing needs them (vLLM's CPU build pulls ones that do not import beside "
            "torch 2.13.0+cpu: `pip uninstall torchvision torchaudio torchcodec`)")
    text = str(err).strip().splitlines()
    if "mismatch" in str(err).lower() or "ignore_mismatched_sizes" in str(err):
        what = "its weights do not match the shapes config.json describes"
    else:
        what = "a weight file does not read (truncated or corrupt?)"
    return UserError(f"{key}={path!r}: cannot load the model: {what} "
                      f"({type(err).__name__}: {text[0] if text else ''}). Re-download or "
                      "re-export the model folder, or fix config.json")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "vocab.txt", "spiece.model")
"""A folder holding none of these has no tokenizer (transformers would build an empty one)."""


def load_tokenizer(path: str, *, trust_remote_code: bool = False,
                   custom_chat_template: str | None = None):
    from transformers import AutoTokenizer

    local = Path(path).expanduser()
    if local.is_dir() and not any((local / name).is_file() for name in TOKENIZER_FILES):
        raise SetupError(
            f"the tokenizer folder {local} holds no tokenizer files (none of "
            f"{', '.join(TOKENIZER_FILES)}): transformers would make an empty tokenizer of it",
            "copy the model's tokenizer files into it, or point data.tokenizer (or "
            "actor_rollout_ref.model.tokenizer_path) at the folder that has them")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise _explain(path, "tokenizer", err) from None
    if custom_chat_template:
        tokenizer.chat_template = custom_chat_template
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise UserError(f"the tokenizer of {path} has neither a pad nor an EOS token; "
                             "set one in its tokenizer_config.json")
        tokenizer.pad_token = tokenizer.eos_token  # as verl does for Llama-style tokenizers
    return tokenizer


def load_causal_lm(path: str, *, dtype: torch.dtype, device: torch.device,
                   trust_remote_code: bool = False, override_config: dict | None = None,
                   gradient_checkpointing: bool = False) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bar is the one that matters

    from thinkrl.models.vision import is_vision_model, load_vision_model

    if is_vision_model(path):  # Qwen2.5-VL / Qwen2-VL; other VL models are refused
        load = load_vision_model
    else:
        load = AutoModelForCausalLM.from_pretrained
    try:
        model = load(path, dtype=dtype, trust_remote_code=trust_remote_code,
                     **(override_config or {}))
    except (OSError, ValueError) as err:
        raise _explain(path, "model", err) from None
    except Exception as err:  # safetensors' own error types, transformers' size mismatch
        raise damaged_model(path, err) from None
    return prepare_for_training(model, device=device, gradient_checkpointing=gradient_checkpointing)


def causal_lm_skeleton(path: str, *, dtype: torch.dtype, trust_remote_code: bool = False,
                       override_config: dict | None = None,
                       gradient_checkpointing: bool = False) -> torch.nn.Module:
    """The architecture `load_causal_lm` would load from `path`, on the meta
    device: no weights are read and no memory is taken (the ranks of a
    sharded model other than rank 0 start from it: `thinkrl.parallel.fsdp.build_model`)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from thinkrl.models.vision import is_vision_model

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code,
                                        **(override_config or {}))
    kind = AutoModelForImageTextToText if is_vision_model(path) else AutoModelForCausalLM
    with torch.device("meta"):
        model = kind.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    return prepare_for_training(model, device=None, gradient_checkpointing=gradient_checkpointing)


def prepare_for_training(model: torch.nn.Module, *, device: torch.device | None,
                         gradient_checkpointing: bool) -> torch.nn.Module:
    """No dropout (see `disable_dropout`), optional activation checkpointing,
    on `device` (None: where it is, e.g. the meta device)."""
    disable_dropout(model)
    if gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model if device is None else model.to(device)


def load_generation_config(path: str, trust_remote_code: bool = False):
    """The model folder's generation_config.json, or None when it has none."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None


def eos_token_ids(tokenizer, generation_config) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's
    generation config EOS (Qwen2.5 instruct ends turns with <|im_end|> but
    lists <|endoftext|> too)."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(generation_config, "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def disable_dropout(model: torch.nn.Module) -> None:
    """RL needs pi_old, pi and pi_ref to be the same function of the weights:
    with dropout, the training forward and the log-prob forward would disagree
    and the importance ratio would be noise. (Train mode stays on, since
    gradient checkpointing in transformers only acts in train mode.)"""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        # transformers' attention layers apply their dropout functionally
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def check_model_fits(model, tokenizer_size: int, sizes, *, model_path: str) -> None:
    """The tokenizer's ids (`tokenizer_size` = len(tokenizer)) and the run's
    sequence length must fit the model: otherwise the first forward pass
    fails with an index error deep inside."""
    vocab = model.get_input_embeddings().num_embeddings
    if tokenizer_size > vocab:
        raise SetupError(
            f"the tokenizer has {tokenizer_size} tokens but the model {model_path} embeds only "
            f"{vocab}: they do not belong together",
            "point actor_rollout_ref.model.tokenizer_path (or data.tokenizer) at the model's "
            "own tokenizer")
    limit = getattr(model.config, "max_position_embeddings", None)
    needed = sizes.prompt_length + sizes.response_length
    if limit is not None and needed > limit:
        raise SetupError(
            f"data.max_prompt_length {sizes.prompt_length} + data.max_response_length "
            f"{sizes.response_length} = {needed} tokens exceed the model's "
            f"max_position_embeddings {limit} ({model_path})", "lower one of them")
