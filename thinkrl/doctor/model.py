"""Model and tokenizer checks, from config.json and the tokenizer files alone
(no weights are loaded: that is what makes the doctor fast on a 7B model).

The parameter count comes from `estimate_param_count`, used again by the disk
and memory checks.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from thinkrl.doctor.core import CheckResult, DoctorContext, NotChecked, fail, ok, warn
from thinkrl.errors import problem_and_fix

REWARD_MARKUP = ("<think>", "</think>", "<answer>", "</answer>", "\\boxed{")
"""What the r1 and math rewards look for in a decoded response."""
_R1_RUN = ("qwen_r1", "r1_system")


def fetchable(ctx: DoctorContext, path: str) -> str:
    """`path` itself when it is a local folder or the hub can be reached; its
    snapshot folder when it is a hub id already in the Hugging Face cache;
    else OSError at once (offline, transformers would retry for minutes)."""
    if Path(path).expanduser().exists():
        return path

    def compute() -> str:
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(path, local_files_only=True)
        except Exception:  # not cached, or not a valid repo id: ask the hub below
            pass
        endpoint = ctx.env.get("HF_ENDPOINT", "https://huggingface.co")
        if ctx.env.get("HF_HUB_OFFLINE", "0") not in ("0", "") or not _reachable(endpoint):
            return OSError(f"{path} is not a local folder, not in the Hugging Face cache "
                           f"(HF_HOME), and {endpoint} cannot be reached from here")
        return path
    found = ctx.remember(f"fetchable:{path}", compute)
    if isinstance(found, OSError):
        raise found
    return found


def _reachable(url: str, timeout_s: float = 3.0) -> bool:
    import socket
    from urllib.parse import urlparse

    parts = urlparse(url)
    try:
        socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def load_model_config(ctx: DoctorContext):
    """AutoConfig of the run's model (with model.override_config applied)."""
    from transformers import AutoConfig

    model = ctx.cfg.actor_rollout_ref.model
    try:
        path = fetchable(ctx, ctx.model_path)
        if model.external_lib:
            import importlib
            importlib.import_module(model.external_lib)
        return AutoConfig.from_pretrained(path, trust_remote_code=model.trust_remote_code,
                                          **model.override_config)
    except Exception as err:  # OSError, ValueError, ImportError, a remote-code error ...
        ctx.memo["model-config-error"] = err
        raise NotChecked("needs the model's config: see model/config") from None


def load_run_tokenizer(ctx: DoctorContext):
    """The tokenizer exactly as `thinkrl.build` loads it."""
    from thinkrl.build import tokenizer_options, tokenizer_path
    from thinkrl.models.loading import load_tokenizer

    path = tokenizer_path(ctx.cfg, ctx.model_path)
    try:
        return load_tokenizer(fetchable(ctx, path), **tokenizer_options(ctx.cfg))
    except (OSError, ValueError) as err:
        ctx.memo["tokenizer-error"] = err
        raise NotChecked("needs the tokenizer: see model/tokenizer") from None


def estimate_param_count(config) -> int:
    """Parameters of a decoder-only transformer (Llama / Qwen2 / Mistral
    family: gated MLP, grouped-query attention) from its config.

        embed  = V*h                 (+ V*h for the LM head unless tied)
        layer  = h*(a*d) + 2*h*(k*d) + (a*d)*h     q, k, v, o projections
               + (a*d + 2*k*d) if q/k/v have biases (Qwen2)
               + 3*h*i                             gate, up, down
               + 2*h                               two RMSNorms
        total  = embed + L*layer + h               final norm

    V vocab_size, h hidden_size, i intermediate_size, L num_hidden_layers,
    a num_attention_heads, k num_key_value_heads, d head_dim (h/a unless
    given). Multimodal configs count their text model only; mixtures of
    experts are not modelled (they count one expert).
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    h, layers, vocab = text.hidden_size, text.num_hidden_layers, text.vocab_size
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or h // heads
    qkv_bias = getattr(text, "attention_bias", text.model_type.startswith("qwen2"))
    attention = h * heads * head_dim * 2 + 2 * h * kv_heads * head_dim
    if qkv_bias:
        attention += heads * head_dim + 2 * kv_heads * head_dim
    layer = attention + 3 * h * text.intermediate_size + 2 * h
    embeddings = vocab * h * (1 if getattr(text, "tie_word_embeddings", False) else 2)
    return embeddings + layers * layer + h


def check_config(ctx: DoctorContext) -> CheckResult:
    """The model path exists and its config.json loads."""
    path = ctx.cfg.actor_rollout_ref.model.path
    try:
        config = ctx.model_config
    except NotChecked:
        err = ctx.memo.get("model-config-error")
        if err is None:
            raise
        first = str(err).splitlines()[0] if str(err) else ""
        return fail("model/config", f"actor_rollout_ref.model.path={path}: cannot load its config "
                    f"({type(err).__name__}: {first:.300})",
                    "point actor_rollout_ref.model.path at a Hugging Face model folder (with "
                    "config.json) or a hub id this machine can fetch; set trust_remote_code=True or "
                    "model.external_lib for custom architectures")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return ok("model/config", f"{path}: {text.model_type}, {text.num_hidden_layers} layers, hidden "
              f"{text.hidden_size}, vocab {text.vocab_size}, ~{ctx.param_count / 1e6:,.1f}M parameters")


def check_tokenizer(ctx: DoctorContext) -> CheckResult:
    """EOS and pad tokens; a chat template when a data set uses `chat`."""
    try:
        tok = ctx.tokenizer
    except NotChecked:
        err = ctx.memo.get("tokenizer-error")
        if err is None:
            raise
        return fail("model/tokenizer", f"cannot load the tokenizer: {str(err).split('. (')[0]}",
                    "point data.tokenizer or actor_rollout_ref.model.tokenizer_path at the model's tokenizer")
    if tok.eos_token_id is None:  # load_tokenizer accepted a pad token alone
        return fail("model/tokenizer", "the tokenizer has no EOS token: responses never end",
                    "set eos_token in its tokenizer_config.json")
    pad = "pad = EOS (set as verl does)" if tok.pad_token == tok.eos_token else f"pad {tok.pad_token!r}"
    found = f"{len(tok)} tokens, EOS {tok.eos_token!r}, {pad}"
    data = ctx.cfg.data
    uses_chat = "chat" in (data.template, data.val_template or data.template)
    if not getattr(tok, "chat_template", None):
        if uses_chat:
            return fail("model/tokenizer", found + ", no chat template, and data.template (or "
                        "val_template) is chat",
                        "use a tokenizer that ships a chat template, set "
                        "actor_rollout_ref.model.custom_chat_template, or data.template=qwen_r1")
        return ok("model/tokenizer", found + ", no chat template (not needed by the templates used)")
    return ok("model/tokenizer", found + ", has a chat template")


def check_special_tokens(ctx: DoctorContext) -> CheckResult:
    """The reward's markup survives encode -> decode unchanged: a tokenizer
    that drops or splits-and-respaces `<think>` makes every format reward 0."""
    tok = ctx.tokenizer
    sample = "<think> 2 + 3 = 5 </think><answer> \\boxed{5} </answer>"
    back = tok.decode(tok(sample, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
    mangled = [m for m in REWARD_MARKUP if sample.count(m) != back.count(m)]
    if not mangled:
        return ok("model/special-tokens", f"{', '.join(REWARD_MARKUP)} survive the tokenizer round trip")
    found = f"{', '.join(mangled)} do not survive encode/decode: {sample!r} comes back as {back!r}"
    fix = ("use a tokenizer that keeps them as text, or remove them from its special tokens "
           "(decoding skips special tokens)")
    cfg = ctx.cfg
    r1_run = cfg.data.template in _R1_RUN or cfg.reward.scorer in ("r1", "math")
    return fail("model/special-tokens", found, fix) if r1_run else warn("model/special-tokens", found, fix)


def check_fits(ctx: DoctorContext) -> CheckResult:
    """Tokenizer ids and sequence length fit the model: the rule of
    `thinkrl.build.check_model_fits`, applied to the config instead of loaded weights."""
    from thinkrl.models.loading import check_model_fits

    config, tok, sizes = ctx.model_config, ctx.tokenizer, ctx.sizes
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    embeddings = SimpleNamespace(num_embeddings=text.vocab_size)
    shell = SimpleNamespace(get_input_embeddings=lambda: embeddings, config=text)
    try:
        check_model_fits(shell, len(tok), sizes, model_path=ctx.model_path)
    except ValueError as err:
        return fail("model/fits", *problem_and_fix(err))
    limit = getattr(text, "max_position_embeddings", None)
    return ok("model/fits", f"{len(tok)} token ids <= {text.vocab_size} embeddings; "
              f"{sizes.prompt_length} + {sizes.response_length} tokens <= {limit} positions")


def check_chatml_markers(ctx: DoctorContext) -> CheckResult | list[CheckResult]:
    """qwen_r1 writes ChatML markers as literal text (as MindSpeed-RL does):
    on a tokenizer without them as tokens they become ordinary text."""
    data = ctx.cfg.data
    if "qwen_r1" not in (data.template, data.val_template):
        return []
    tok = ctx.tokenizer
    split = [m for m in ("<|im_start|>", "<|im_end|>")
             if len(tok.encode(m, add_special_tokens=False)) != 1]
    if not split:
        return ok("model/chatml", "data.template=qwen_r1: <|im_start|> and <|im_end|> are single "
                                  "tokens; generation also stops at <|im_end|>")
    return warn("model/chatml", f"data.template=qwen_r1 writes ChatML markers, but the tokenizer "
                f"splits {' and '.join(split)} into several tokens (not a Qwen-style tokenizer)",
                "use data.template=r1_system (the R1 instruction in the tokenizer's own chat "
                "template) or chat")


CHECKS = [check_config, check_tokenizer, check_special_tokens, check_chatml_markers, check_fits]
