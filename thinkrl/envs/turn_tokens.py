"""The token ids of an environment's turn (tool results, a user's reply, a
game's observation), straight from the chat template, and appended to the
ids the engine sampled: never a re-tokenised conversation.

Re-tokenising text between turns is not a bijection (a sampled id sequence
may decode and encode to other ids), so the log-probs of the sampled tokens
would no longer belong to the tokens trained on (TRL #5224). Here the
response is the sampled ids, then the ids the template writes after the
model's end-of-turn token, then the next sampled ids, and so on.

What the template writes after the end-of-turn token is found by rendering
a stand-in conversation without and with the environment's messages: the
new ids are everything after the last end-of-turn token of the first. That
keeps the separator between the end-of-turn token and the next turn's header
(Qwen's "\\n" after <|im_end|>), which verl drops at every assistant-to-tool
boundary (verl #6501).
"""

from __future__ import annotations

from functools import lru_cache

from thinkrl.errors import UserError

_STAND_IN = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "."}]


class TurnTokens:
    """`ids(messages)`: the ids of an environment's messages, a tuple of
    (role, content) pairs, ending with the next assistant turn's header
    (masked out of the loss). `tool_ids(texts)`: tool results, one per call."""

    def __init__(self, tokenizer, *, end_of_turn_ids: list[int], chat_kwargs: dict | None = None) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = set(end_of_turn_ids)
        self.chat_kwargs = dict(chat_kwargs or {})
        base = self._encode(_STAND_IN, generation_prompt=False)
        ends = [i for i, t in enumerate(base) if t in self.end_of_turn]
        if not ends:
            raise UserError("multi_turn: the chat template does not end an assistant turn with the "
                             f"model's end token(s) {sorted(self.end_of_turn)}; environment turns cannot be "
                             "joined to sampled turns. Use a chat template whose assistant turns end "
                             "with the EOS token (ChatML: <|im_end|>)")
        self._base = base
        self._cut = ends[-1] + 1  # what follows the stand-in's end-of-turn token
        self.ids = lru_cache(maxsize=4096)(self._ids)

    def _encode(self, messages: list[dict], *, generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=generation_prompt,
                                                  **self.chat_kwargs)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def tool_ids(self, texts: tuple[str, ...]) -> tuple[int, ...]:
        return self.ids(tuple(("tool", text) for text in texts))

    def _ids(self, messages: tuple[tuple[str, str], ...]) -> tuple[int, ...]:
        full = self._encode(_STAND_IN + [{"role": role, "content": content} for role, content in messages],
                            generation_prompt=True)
        if full[:self._cut] != self._base[:self._cut]:
            roles = ", ".join(sorted({role for role, _ in messages}))
            raise UserError(f"multi_turn: the chat template renders the conversation before a {roles} "
                             "message differently once the message is added; environment turns cannot "
                             "be appended token by token with this template")
        return tuple(full[self._cut:])
