"""Prompt templates: `chat` (the tokenizer's own), `qwen_r1` (MindSpeed-RL's
R1-Zero prompt, byte for byte) and `r1_system` (the instruction as the system
turn), on the real Qwen2.5 tokenizer and on the tiny one; and the config keys
that choose them."""

from __future__ import annotations

import pytest

from thinkrl.config import Config
from thinkrl.config.checks import validate
from thinkrl.data import synthetic
from thinkrl.data.templates import QWEN_R1_SYSTEM, R1_INSTRUCTION, TEMPLATES, render_prompt

QUESTION = "What is 1+1?"
USER = [{"role": "user", "content": QUESTION}]
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


@pytest.fixture(scope="module")
def qwen_tokenizer():
    from conftest import SHARED_DATA

    from thinkrl.models.loading import load_tokenizer

    folder = SHARED_DATA / "tokenizers" / "qwen2.5"
    if not folder.is_dir():
        pytest.skip("../shared/data is absent")
    return load_tokenizer(str(folder))


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from thinkrl.models.tiny import build_tokenizer

    problems = synthetic.generate_problems(50, seed=1)
    return build_tokenizer([p.question for p in problems], vocab_size=300)


@pytest.fixture
def bare_tokenizer(tiny_tokenizer):
    """The tiny tokenizer without a chat template (as most base models ship)."""
    bare = tiny_tokenizer.__class__(tokenizer_object=tiny_tokenizer.backend_tokenizer)
    bare.chat_template = None
    return bare


def test_instruction_text_is_the_r1_zero_prompt():
    assert R1_INSTRUCTION == (
        "A conversation between User and Assistant. The user asks a question, and the Assistant "
        "solves it. The assistant first thinks about the reasoning process in the mind and then "
        "provides the user with the answer. The reasoning process and answer are enclosed within "
        "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
        "process here </think><answer> answer here </answer>. Put your final answer within "
        "\\boxed{}.")
    assert R1_INSTRUCTION.endswith(r"within \boxed{}.")  # one backslash, as the model sees it


def test_chat_on_qwen25_uses_its_template_and_default_system(qwen_tokenizer):
    assert render_prompt("chat", qwen_tokenizer, USER) == (
        f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_r1_system_on_qwen25_puts_the_instruction_in_the_system_turn(qwen_tokenizer):
    text = render_prompt("r1_system", qwen_tokenizer, USER)
    assert text == (f"<|im_start|>system\n{R1_INSTRUCTION}<|im_end|>\n"
                    f"<|im_start|>user\n{QUESTION}<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert QWEN_DEFAULT_SYSTEM not in text
    assert not text.endswith("<think>")  # the model opens the think block itself
    ids = qwen_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 151644 and ids.count(151644) == 3  # <|im_start|> is one token, three turns


def test_r1_system_on_the_tiny_chatml_tokenizer(tiny_tokenizer):
    assert render_prompt("chat", tiny_tokenizer, USER) == (
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    assert render_prompt("r1_system", tiny_tokenizer, USER) == (
        f"<|im_start|>system\n{R1_INSTRUCTION}<|im_end|>\n"
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")


def test_r1_system_without_chat_template_is_plain_text(bare_tokenizer):
    assert render_prompt("r1_system", bare_tokenizer, USER) == (
        f"{R1_INSTRUCTION}\nUser: {QUESTION}\nAssistant:")
    turns = USER + [{"role": "assistant", "content": "2"}, {"role": "user", "content": "And 2+2?"}]
    assert render_prompt("r1_system", bare_tokenizer, turns) == (
        f"{R1_INSTRUCTION}\nUser: {QUESTION}\nAssistant: 2\nUser: And 2+2?\nAssistant:")
    with pytest.raises(ValueError, match="found the role 'tool'"):
        render_prompt("r1_system", bare_tokenizer, [{"role": "tool", "content": "x"}])


def test_chat_without_chat_template_points_to_the_fixes(bare_tokenizer):
    with pytest.raises(ValueError, match="no chat template.*custom_chat_template.*qwen_r1.*r1_system"):
        render_prompt("chat", bare_tokenizer, USER)


def test_chat_kwargs_reach_the_tokenizer_template(tiny_tokenizer):
    template = tiny_tokenizer.chat_template
    try:
        tiny_tokenizer.chat_template = "{{ greeting }}|{{ messages[0]['content'] }}"
        assert render_prompt("chat", tiny_tokenizer, USER, {"greeting": "hi"}) == f"hi|{QUESTION}"
        assert render_prompt("r1_system", tiny_tokenizer, USER, {"greeting": "yo"}) == (
            f"yo|{R1_INSTRUCTION}")  # the system turn comes first
    finally:
        tiny_tokenizer.chat_template = template


def test_a_row_with_its_own_system_message_is_refused_under_r1_system(tiny_tokenizer):
    rows = [{"role": "system", "content": "Be terse."}] + USER
    with pytest.raises(ValueError, match="own system message.*data.template=chat"):
        render_prompt("r1_system", tiny_tokenizer, rows)
    assert "Be terse." in render_prompt("chat", tiny_tokenizer, rows)


def test_a_chat_template_that_refuses_system_turns(tiny_tokenizer):
    template = tiny_tokenizer.chat_template
    try:  # as Gemma's template does
        tiny_tokenizer.chat_template = (
            "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
            "supported') }}{% endif %}{{ messages[0]['content'] }}")
        with pytest.raises(ValueError, match="refused it.*System role not supported"):
            render_prompt("r1_system", tiny_tokenizer, USER)
    finally:
        tiny_tokenizer.chat_template = template


def test_unknown_template_lists_the_known_ones(tiny_tokenizer):
    with pytest.raises(ValueError, match="unknown prompt template 'r1'; known templates: "
                                         "chat, qwen_r1, r1_system, raw"):
        render_prompt("r1", tiny_tokenizer, USER)


def test_config_keys_are_validated():
    cfg = Config()
    cfg.actor_rollout_ref.rollout.n = 4  # verl's default n=1 is refused for GRPO
    cfg.data.template, cfg.data.val_template = "qwen_r1", "chat"
    validate(cfg)
    cfg.data.val_template = None  # None: the training template
    validate(cfg)
    cfg.data.template, cfg.data.val_template = "r1", "zero"
    with pytest.raises(ValueError) as err:
        validate(cfg)
    assert "data.template=r1: use one of: chat, qwen_r1, r1_system, raw" in str(err.value)
    assert "data.val_template=zero: use one of: chat, qwen_r1, r1_system, raw, or null" in str(err.value)
    assert TEMPLATES == ("chat", "qwen_r1", "r1_system", "raw")


# --- qwen_r1: MindSpeed-RL's template, byte for byte ---------------------------------

def _readme_template() -> str:
    """The template text of ../shared/seeds/mindspeed_rl/README.md (a code block
    where `\\n` stands for a newline), with `{question}` still in it."""
    from conftest import SHARED_DATA

    readme = SHARED_DATA.parent / "seeds" / "mindspeed_rl" / "README.md"
    if not readme.is_file():
        pytest.skip("../shared/seeds/mindspeed_rl is absent")
    line = next(l.strip() for l in readme.read_text().splitlines()
                if l.strip().startswith("<|im_start|>system"))
    return line.replace("\\n", "\n")


def _math500_question() -> str:
    import json

    from conftest import SHARED_DATA

    path = SHARED_DATA / "orz" / "math500.json"
    if not path.is_file():
        pytest.skip("../shared/data is absent")
    return json.loads(path.read_text())[0]["prompt"][0]["value"]


def test_qwen_r1_is_mindspeed_rl_text_byte_for_byte_on_qwen25(qwen_tokenizer):
    question = _math500_question()  # "Convert the point $(0,3)$ ... polar coordinates ..."
    expected = _readme_template().replace("{question}", question)
    text = render_prompt("qwen_r1", qwen_tokenizer, [{"role": "user", "content": question}])
    assert text.encode() == expected.encode()
    assert text.startswith(f"<|im_start|>system\n{QWEN_R1_SYSTEM}<|im_end|>\n<|im_start|>user\n"
                           f"{R1_INSTRUCTION}\n{question}<|im_end|>")
    ids = qwen_tokenizer(text, add_special_tokens=False)["input_ids"]
    # 158 tokens: 11 for the system turn (<|im_start|> system \n You are a helpful
    # assistant . <|im_end|> \n), the rest for the user turn and the assistant header.
    assert len(ids) == 158
    # MindSpeed-RL encodes the system part and the user part separately and joins
    # the ids; each part starts with a special token, so that is the same sequence.
    cut = text.index("<|im_start|>user")
    parts = (qwen_tokenizer.encode(text[:cut], add_special_tokens=False)
             + qwen_tokenizer.encode(text[cut:], add_special_tokens=False))
    assert parts == ids and len(qwen_tokenizer.encode(text[:cut], add_special_tokens=False)) == 11
    assert ids.count(151644) == 3 and ids.count(151645) == 2  # <|im_start|> x3, <|im_end|> x2


def test_qwen_r1_ignores_the_tokenizer_chat_template(qwen_tokenizer, tiny_tokenizer, bare_tokenizer):
    texts = {render_prompt("qwen_r1", tok, USER) for tok in (qwen_tokenizer, tiny_tokenizer,
                                                             bare_tokenizer)}
    assert texts == {(f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                      f"<|im_start|>user\n{R1_INSTRUCTION}\n{QUESTION}<|im_end|>\n"
                      "<|im_start|>assistant\n")}


def test_qwen_r1_takes_the_rows_system_message_and_one_question(tiny_tokenizer):
    # MindSpeed-RL: `system or default_system`; an empty one keeps the default.
    rows = [{"role": "system", "content": "Be terse."}] + USER
    assert render_prompt("qwen_r1", tiny_tokenizer, rows).startswith(
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nA conversation")
    rows = [{"role": "system", "content": ""}] + USER
    assert "You are a helpful assistant." in render_prompt("qwen_r1", tiny_tokenizer, rows)
    dialogue = USER + [{"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2?"}]
    with pytest.raises(ValueError, match="one question.*'user', 'assistant', 'user'.*template=chat"):
        render_prompt("qwen_r1", tiny_tokenizer, dialogue)


def test_qwen_r1_stops_at_im_end_as_mindspeed_rl(qwen_tokenizer, tiny_tokenizer):
    from thinkrl.data.templates import stop_token_ids

    # Qwen2.5 base models end text with <|endoftext|> (151643); MindSpeed-RL's
    # qwen_r1 also stops at <|im_end|> (151645), the end of the ChatML turn.
    assert stop_token_ids(["qwen_r1"], qwen_tokenizer) == [151645]
    assert stop_token_ids(["qwen_r1", None], tiny_tokenizer) == [tiny_tokenizer.eos_token_id]
    assert stop_token_ids(["chat", "r1_system"], qwen_tokenizer) == []


def test_raw_is_the_text_as_is_and_bos_only_when_the_tokenizer_adds_it(tiny_tokenizer):
    assert render_prompt("raw", tiny_tokenizer, USER) == QUESTION  # the tiny tokenizer adds no BOS
    assert tiny_tokenizer(QUESTION, add_special_tokens=True)["input_ids"] == \
        tiny_tokenizer(QUESTION, add_special_tokens=False)["input_ids"]

    class AddsBos:  # what a Llama-style tokenizer does on encode
        bos_token, bos_token_id = "<s>", 1

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [1, 99] if add_special_tokens else [99]}

    assert render_prompt("raw", AddsBos(), USER) == "<s>" + QUESTION
    assert render_prompt("raw", AddsBos(), [{"role": "user", "content": "<s>Hi"}]) == "<s>Hi"
    with pytest.raises(ValueError, match="one message .* this row has 2 .user, assistant."):
        render_prompt("raw", tiny_tokenizer, USER + [{"role": "assistant", "content": "2"}])
