"""`thinkrl prep` on the command line (summary, --show, errors), and its
output read back by training's `load_prompts` under either template."""

from __future__ import annotations

import json
import re

import pytest

from thinkrl.cli import main
from thinkrl.data import synthetic
from thinkrl.data.dataset import load_prompts
from thinkrl.data.templates import R1_INSTRUCTION

RECORDS = [{"question": "Ava has 3 apples. She eats 1. How many apples does Ava have now?",
            "answer": "3 - 1 = 2.\n#### 2"},
           {"question": "Ben has 7 coins. He finds 2 more. How many coins does Ben have now?",
            "answer": "7 + 2 = 9.\n#### 9"}]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The tiny model's kind of tokenizer (byte BPE + ChatML), saved as a folder."""
    from thinkrl.models.tiny import build_tokenizer

    problems = synthetic.generate_problems(50, seed=1)
    folder = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer([p.question for p in problems], vocab_size=300).save_pretrained(folder)
    return folder


@pytest.fixture
def train_jsonl(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def _load(path, tokenizer, template):
    return load_prompts(str(path), tokenizer, key="data.train_files", prompt_key="prompt",
                        reward_fn_key="data_source", max_prompt_length=4096,
                        filter_overlong=False, truncation="error", chat_kwargs={},
                        template=template, log=lambda *_: None)


def test_summary_line_per_split(train_jsonl, tmp_path, capsys):
    assert main(["prep", "gsm8k", "--input", str(train_jsonl), "--output", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == f"train: 2 rows -> {tmp_path / 'out' / 'train.parquet'}\n"


@pytest.mark.parametrize("template", ["chat", "qwen_r1"])
def test_show_prints_the_rendered_prompts_and_their_token_counts(
        train_jsonl, tmp_path, tokenizer_dir, capsys, template):
    from thinkrl.models.loading import load_tokenizer

    assert main(["prep", "gsm8k", "--input", str(train_jsonl), "--output", str(tmp_path / "out"),
                 "--template", template, "--show", "1", "--tokenizer", str(tokenizer_dir)]) == 0
    out = capsys.readouterr().out
    prompts = _load(tmp_path / "out" / "train.parquet", load_tokenizer(str(tokenizer_dir)), template)
    first = prompts[0].sample.prompt_text
    assert (f"----- train row 0: {len(prompts[0].ids)} tokens, template {template}, "
            "data_source openai/gsm8k, ground truth: 2\n" + first + "\n") in out
    assert out.count("----- train row") == 1  # --show 1
    assert (R1_INSTRUCTION in first) == (template == "qwen_r1")
    assert ("####" in first) == (template == "chat")  # the instruction only under chat


def test_load_prompts_renders_the_prep_output_with_qwen_r1(train_jsonl, tmp_path, tokenizer_dir):
    from thinkrl.models.loading import load_tokenizer

    main(["prep", "gsm8k", "--input", str(train_jsonl), "--output", str(tmp_path),
          "--template", "qwen_r1"])
    tokenizer = load_tokenizer(str(tokenizer_dir))
    prompts = _load(tmp_path / "train.parquet", tokenizer, "qwen_r1")
    assert [p.sample.prompt_text for p in prompts] == [
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        f"{R1_INSTRUCTION}\n{r['question']}<|im_end|>\n<|im_start|>assistant\n" for r in RECORDS]
    assert [p.sample.ground_truth for p in prompts] == ["2", "9"]
    assert tokenizer.decode(prompts[1].ids) == prompts[1].sample.prompt_text
    assert prompts[0].sample.extra_info["answer"] == RECORDS[0]["answer"]


def test_load_prompts_rejects_an_unknown_template(train_jsonl, tmp_path, tokenizer_dir):
    from thinkrl.models.loading import load_tokenizer

    main(["prep", "gsm8k", "--input", str(train_jsonl), "--output", str(tmp_path)])
    with pytest.raises(ValueError, match="data.train_files: unknown prompt template 'r1'"):
        _load(tmp_path / "train.parquet", load_tokenizer(str(tokenizer_dir)), "r1")


def test_load_prompts_names_the_row_a_template_refuses(tmp_path, tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from thinkrl.models.loading import load_tokenizer

    rows = [{"data_source": "openai/gsm8k", "reward_model": {"style": "rule", "ground_truth": "1"},
             "prompt": [{"role": "user", "content": "Q"}]},
            {"data_source": "openai/gsm8k", "reward_model": {"style": "rule", "ground_truth": "1"},
             "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mixed.parquet")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'mixed.parquet'}, row 1: the row "
                                                   "has its own system message")):
        _load(tmp_path / "mixed.parquet", load_tokenizer(str(tokenizer_dir)), "r1_system")


def test_errors_exit_2_with_the_message(tmp_path, capsys):
    assert main(["prep", "gsm8k", "--input", str(tmp_path / "nope.jsonl"),
                 "--output", str(tmp_path / "out")]) == 2
    assert f"thinkrl: error: --input: no such file or folder {tmp_path / 'nope.jsonl'}" in \
        capsys.readouterr().err
    assert main(["prep", "gsm8k", "--output", str(tmp_path / "out")]) == 2
    assert "needs --input" in capsys.readouterr().err
    assert main(["prep", "builtin", "--input", "x", "--output", str(tmp_path / "out")]) == 2
    assert "drop --input" in capsys.readouterr().err


def test_unknown_source_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        main(["prep", "mmlu", "--output", "x"])
    assert "invalid choice: 'mmlu'" in capsys.readouterr().err


def test_prep_refuses_to_overwrite_without_the_flag(train_jsonl, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["prep", "gsm8k", "--input", str(train_jsonl), "--output", str(out)]) == 0
    (out / "train.parquet").write_bytes(b"my own data")
    capsys.readouterr()
    assert main(["prep", "gsm8k", "--input", str(train_jsonl), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'train.parquet'} exist(s) already" in err and "--overwrite" in err
    assert (out / "train.parquet").read_bytes() == b"my own data"  # untouched
    assert main(["prep", "gsm8k", "--input", str(train_jsonl), "--output", str(out),
                 "--overwrite"]) == 0
    assert (out / "train.parquet").read_bytes()[:4] == b"PAR1"
