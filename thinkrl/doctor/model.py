"""Model and tokenizer checks, from config.json and the tokenizer files alone
(no weights are loaded: that is what makes the doctor fast on a 7B model).

The parameter count comes from `estimate_param_count`, used again by the disk
and memory checks.
"""

from __future__ import annotations

from types import SimpleNamespace

from thinkrl.doctor.context import DoctorContext, NotChecked
from thinkrl.doctor.core import CheckResult, fail, ok, warn
from thinkrl.errors import problem_and_fix

REWARD_MARKUP = ("<think>", "</think>", "<answer>", "</answer>", "\\boxed{")
"""What the r1 and math rewards look for in a decoded response."""
_R1_RUN = ("qwen_r1", "r1_system")


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
