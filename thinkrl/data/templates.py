"""Prompt templates: how a row's chat messages become the text the model sees.

Chosen per data set by `data.template` (training files) and
`data.val_template` (validation files; None = the training template):

- `chat`: the tokenizer's own chat template, ending with the assistant
  turn's header (`add_generation_prompt=True`), as verl renders prompts.
- `qwen_r1`: the DeepSeek-R1-Zero prompt (MindSpeed-RL's `qwen_r1`). With a
  chat template, `R1_INSTRUCTION` is the system turn and the question the
  user turn, so Qwen2.5 sees

      <|im_start|>system\\n{R1_INSTRUCTION}<|im_end|>\\n
      <|im_start|>user\\n{question}<|im_end|>\\n
      <|im_start|>assistant\\n

  Without one, plain text: `{R1_INSTRUCTION}\\nUser: {question}\\nAssistant:`.

  The assistant turn is NOT prefilled with `<think>`: the model opens the
  tag itself, so the whole `<think>...</think><answer>...</answer>` format
  lives in the response, where the R1 reward checks it (exactly one think
  block, then the answer). Prefilling would make every response start
  mid-format and fail that check.
- `raw`: the row's prompt text as is (TRL's standard, non-conversational
  format), preceded by the BOS token when the tokenizer adds one to what it
  encodes (Llama, Gemma): for base models that have no chat template. The
  row must hold one message; its role is ignored.
"""

from __future__ import annotations

R1_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
    "process here </think><answer> answer here </answer>. Put your final answer within "
    "\\boxed{}."
)
TEMPLATES = ("chat", "qwen_r1", "raw")
_PLAIN_SPEAKERS = {"user": "User", "assistant": "Assistant"}


def render_prompt(template: str, tokenizer, messages: list[dict],
                  chat_kwargs: dict | None = None) -> str:
    """The prompt text of one row's `messages` ([{"role", "content"}, ...])
    under `template`; it ends where the model's response begins."""
    if template == "chat":
        return render_chat(tokenizer, messages, chat_kwargs=chat_kwargs or {})
    if template == "qwen_r1":
        return render_r1(tokenizer, messages, chat_kwargs=chat_kwargs or {})
    if template == "raw":
        return render_raw(tokenizer, messages)
    raise ValueError(f"unknown prompt template {template!r}; known templates: "
                     f"{', '.join(TEMPLATES)}")


def render_chat(tokenizer, messages: list[dict], *, chat_kwargs: dict) -> str:
    """The tokenizer's own chat template, ending with the assistant turn's header."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "data.template=chat but the tokenizer has no chat template. Use a tokenizer "
            "that ships one, set actor_rollout_ref.model.custom_chat_template, or use "
            "data.template=qwen_r1 (plain text without a chat template).")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **chat_kwargs)


def render_r1(tokenizer, messages: list[dict], *, chat_kwargs: dict) -> str:
    """R1_INSTRUCTION as the system turn, then the row's turns, then the
    assistant header (see the module docstring for the exact text)."""
    if any(m.get("role") == "system" for m in messages):
        # Two system prompts would contradict each other; which one wins
        # would depend on the tokenizer's template.
        raise ValueError("the row has its own system message, but data.template=qwen_r1 "
                         "supplies the system prompt; drop the row's system message or use "
                         "data.template=chat")
    if not getattr(tokenizer, "chat_template", None):
        return _plain_r1(messages)
    turns = [{"role": "system", "content": R1_INSTRUCTION}, *messages]
    try:
        return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True,
                                             **chat_kwargs)
    except Exception as err:  # jinja raises its own TemplateError types
        raise ValueError(f"data.template=qwen_r1 needs a system turn, and the tokenizer's chat "
                         f"template refused it ({type(err).__name__}: {err}). Use "
                         "data.template=chat, or a custom_chat_template with system turns."
                         ) from None


def _plain_r1(messages: list[dict]) -> str:
    lines = [R1_INSTRUCTION]
    for message in messages:
        speaker = _PLAIN_SPEAKERS.get(message.get("role"))
        if speaker is None:
            raise ValueError(f"data.template=qwen_r1 without a chat template writes only user "
                             f"and assistant turns; found the role {message.get('role')!r}")
        lines.append(f"{speaker}: {message['content']}")
    return "\n".join(lines) + "\nAssistant:"


def render_raw(tokenizer, messages: list[dict]) -> str:
    """The one message's text, after BOS when the tokenizer adds one (the
    prompt is later encoded without special tokens, so BOS must be in the text)."""
    if len(messages) != 1:
        roles = ", ".join(str(m.get("role")) for m in messages)
        raise ValueError(f"data.template=raw takes a row with one message (the prompt text); this "
                         f"row has {len(messages)} ({roles}). Use data.template=chat for "
                         "conversations")
    text = messages[0]["content"]
    bos = getattr(tokenizer, "bos_token", None)
    if bos and _adds_bos(tokenizer) and not text.startswith(bos):
        return bos + text
    return text


def _adds_bos(tokenizer) -> bool:
    """Whether encoding with special tokens puts the BOS token first."""
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id
