"""Prompt templates: how a row's chat messages become the text the model sees.

Chosen per data set by `data.template` (training files) and
`data.val_template` (validation files; None = the training template):

- `chat`: the tokenizer's own chat template, ending with the assistant
  turn's header (`add_generation_prompt=True`), as verl renders prompts.
- `qwen_r1`: MindSpeed-RL's `qwen_r1` (its `configs/model/templates.json`),
  byte for byte: the system turn is `You are a helpful assistant.` (or the
  row's own system message, as MindSpeed-RL lets a data set's `system`
  field replace the default), and the USER turn carries the R1 instruction,
  a newline, then the question:

      <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n
      <|im_start|>user\n{R1_INSTRUCTION}\n{question}<|im_end|>\n
      <|im_start|>assistant\n

  The ChatML markers are literal text, whatever the tokenizer's own chat
  template says, exactly as MindSpeed-RL writes them; on Qwen tokenizers
  they are single special tokens. MindSpeed-RL tokenises the system and
  user parts separately and concatenates the ids; as both parts start with
  a special token, that equals tokenising the whole text (tested on the
  Qwen2.5 tokenizer).
- `r1_system`: what thinkrl called `qwen_r1` before it matched MindSpeed-RL:
  `R1_INSTRUCTION` as the system turn and the question as the user turn,
  rendered with the tokenizer's OWN chat template (plain text without one:
  `{R1_INSTRUCTION}\nUser: {question}\nAssistant:`). Kept because it works
  for models whose chat markers are not ChatML (Llama, Gemma-style
  templates, base models without a chat template), where `qwen_r1`'s
  literal ChatML text would be foreign, and so runs made with the old
  layout can be reproduced.

- `raw`: the row's prompt text as is (TRL's standard, non-conversational
  format), preceded by the BOS token when the tokenizer adds one to what it
  encodes (Llama, Gemma): for base models that have no chat template. The
  row must hold one message; its role is ignored.

Neither R1 template prefills `<think>`: the model opens the tag itself, so
the whole `<think>...</think><answer>...</answer>` format lives in the
response, where the R1 rewards and MindSpeed-RL's verifiers check it.
"""

from __future__ import annotations

from thinkrl.errors import UserError

TEMPLATES = ("chat", "qwen_r1", "r1_system", "raw")
"""data.template, data.val_template: the renderers of `render_prompt`."""
R1_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
    "process here </think><answer> answer here </answer>. Put your final answer within "
    "\\boxed{}."
)
QWEN_R1_SYSTEM = "You are a helpful assistant."
"""MindSpeed-RL's `default_system` of `qwen_r1`."""
_PLAIN_SPEAKERS = {"user": "User", "assistant": "Assistant"}
STOP_WORDS: dict[str, tuple[str, ...]] = {"qwen_r1": ("<|im_end|>",)}
"""MindSpeed-RL's `stop_words` of a template: generation ends there as at EOS.
Qwen2.5 BASE models' EOS is <|endoftext|>, which a ChatML turn never reaches;
without this stop the response would run on past the turn's <|im_end|>."""


def stop_token_ids(templates, tokenizer) -> list[int]:
    """Ids of the stop words of `templates` that are one token for `tokenizer`
    (<|im_end|> on Qwen tokenizers: [151645]); [] for `chat` and `r1_system`."""
    ids = set()
    for template in templates:
        for word in STOP_WORDS.get(template, ()):
            encoded = tokenizer.encode(word, add_special_tokens=False)
            if len(encoded) == 1:
                ids.add(encoded[0])
    return sorted(ids)


def render_prompt(template: str, tokenizer, messages: list[dict],
                  chat_kwargs: dict | None = None) -> str:
    """The prompt text of one row's `messages` ([{"role", "content"}, ...])
    under `template`; it ends where the model's response begins."""
    if template == "chat":
        return render_chat(tokenizer, messages, chat_kwargs=chat_kwargs or {})
    if template == "qwen_r1":
        return render_qwen_r1(messages)
    if template == "r1_system":
        return render_r1_system(tokenizer, messages, chat_kwargs=chat_kwargs or {})
    if template == "raw":
        return render_raw(tokenizer, messages)
    raise UserError(f"unknown prompt template {template!r}; known templates: "
                     f"{', '.join(TEMPLATES)}")


def render_chat(tokenizer, messages: list[dict], *, chat_kwargs: dict) -> str:
    """The tokenizer's own chat template, ending with the assistant turn's header."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "data.template=chat but the tokenizer has no chat template. Use a tokenizer "
            "that ships one, set actor_rollout_ref.model.custom_chat_template, or use "
            "data.template=qwen_r1 (MindSpeed-RL's literal ChatML text) or r1_system (plain "
            "text without a chat template).")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **chat_kwargs)


def render_qwen_r1(messages: list[dict]) -> str:
    """MindSpeed-RL's `qwen_r1` text for one question (see the module docstring).

    `messages`: an optional system message, then exactly one user message.
    """
    system = [m for m in messages if m.get("role") == "system"]
    turns = [m for m in messages if m.get("role") != "system"]
    if len(system) > 1 or len(turns) != 1 or turns[0].get("role") != "user":
        roles = [m.get("role") for m in messages]
        raise UserError(f"data.template=qwen_r1 renders one question (an optional system "
                         f"message, then one user message), as MindSpeed-RL's R1 data does; "
                         f"this row has the roles {roles}. Use data.template=chat for dialogues.")
    system_text = system[0]["content"] if system and system[0]["content"] else QWEN_R1_SYSTEM
    return (f"<|im_start|>system\n{system_text}<|im_end|>\n"
            f"<|im_start|>user\n{R1_INSTRUCTION}\n{turns[0]['content']}<|im_end|>\n"
            "<|im_start|>assistant\n")


def render_r1_system(tokenizer, messages: list[dict], *, chat_kwargs: dict) -> str:
    """R1_INSTRUCTION as the system turn, then the row's turns, then the
    assistant header (see the module docstring for the exact text)."""
    if any(m.get("role") == "system" for m in messages):
        # Two system prompts would contradict each other; which one wins
        # would depend on the tokenizer's template.
        raise UserError("the row has its own system message, but data.template=r1_system "
                         "supplies the system prompt; drop the row's system message or use "
                         "data.template=chat")
    if not getattr(tokenizer, "chat_template", None):
        return _plain_r1(messages)
    turns = [{"role": "system", "content": R1_INSTRUCTION}, *messages]
    try:
        return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True,
                                             **chat_kwargs)
    except Exception as err:  # jinja raises its own TemplateError types
        raise UserError(f"data.template=r1_system needs a system turn, and the tokenizer's chat "
                         f"template refused it ({type(err).__name__}: {err}). Use "
                         "data.template=chat, or a custom_chat_template with system turns."
                         ) from None


def _plain_r1(messages: list[dict]) -> str:
    lines = [R1_INSTRUCTION]
    for message in messages:
        speaker = _PLAIN_SPEAKERS.get(message.get("role"))
        if speaker is None:
            raise UserError(f"data.template=r1_system without a chat template writes only user "
                             f"and assistant turns; found the role {message.get('role')!r}")
        lines.append(f"{speaker}: {message['content']}")
    return "\n".join(lines) + "\nAssistant:"


def render_raw(tokenizer, messages: list[dict]) -> str:
    """The one message's text, after BOS when the tokenizer adds one (the
    prompt is later encoded without special tokens, so BOS must be in the text)."""
    if len(messages) != 1:
        roles = ", ".join(str(m.get("role")) for m in messages)
        raise UserError(f"data.template=raw takes a row with one message (the prompt text); this "
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
