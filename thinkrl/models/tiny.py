"""A tiny base model for the built-in task, made here from nothing.

`build_tiny_model(out_dir)` trains a byte-level BPE tokenizer on the task's
text, makes a small Qwen2 model from a `Qwen2Config`, pretrains it briefly on
worked solutions (see `thinkrl.data.synthetic`) and saves an ordinary Hugging
Face folder. Everything downstream loads it with `from_pretrained`, the same
code that loads Qwen2.5-7B, so the tiny run exercises the real path.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from thinkrl.data import synthetic

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything that decides the tiny model; its hash names the cache entry."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    pretrain_problems: int = 6000
    full_solution_rate: float = 0.3
    pretrain_steps: int = 1600
    """800 steps left some bases (other seeds or thread counts, as another CPU's
    rounding would) with arithmetic too weak for the demo's GRPO to pass
    0.55 held-out accuracy; 1600 make every base tried reach 0.85
    (`bench/demo_bases.py`, docs/benchmarks.md)."""
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 1234
    build_version: int = 2
    """Part of the cache key: raised whenever the build itself changes (2: the
    initial weights are seeded with `seed`), so no stale cached model is used."""

    def cache_key(self) -> str:
        import hashlib
        import json
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


def build_tokenizer(texts: list[str], *, vocab_size: int):
    """Byte-level BPE (as Qwen's) trained on `texts`, with ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    # Digits one at a time, as Qwen2's pre-tokenizer does: arithmetic is then
    # learned digit by digit instead of as a lookup table of number tokens.
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>", model_max_length=1024)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def _encode_pair(tokenizer, question: str, answer: str) -> tuple[list[int], int]:
    """Token ids of the chat-rendered pair and where the answer starts."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                           tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    return prompt_ids + answer_ids, len(prompt_ids)


def _make_model(spec: TinyModelSpec, tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=64 * math.ceil(len(tokenizer) / 64),
        hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config)


def pretrain(model, tokenizer, pairs: list[tuple[str, str]], spec: TinyModelSpec, *,
             log=print) -> float:
    """Next-token training on the answers of (question, answer) pairs; the
    question tokens are context only, since predicting the random names and
    numbers of a story teaches nothing. Returns the final smoothed loss."""
    encoded = []
    for question, answer in pairs:
        ids, answer_start = _encode_pair(tokenizer, question, answer)
        encoded.append((ids, [0] * answer_start + [1] * (len(ids) - answer_start)))
    return train_on(model, encoded, spec, pad_token_id=tokenizer.pad_token_id, log=log)


def train_on(model, encoded: list[tuple[list[int], list[int]]], spec: TinyModelSpec, *,
             pad_token_id: int, log=print) -> float:
    """Next-token training on sequences (ids, loss mask): the tokens with mask
    1 are predicted, the others are context only. Returns the final smoothed loss."""
    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    pad = pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01,
                                  betas=(0.9, 0.98))
    warmup = max(1, spec.pretrain_steps // 20)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, spec.pretrain_steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    model.train()
    smoothed, start = None, time.time()
    bar = _pretrain_bar(spec.pretrain_steps)
    for step in range(spec.pretrain_steps):
        batch = [encoded[rng.randrange(len(encoded))] for _ in range(spec.batch_size)]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, (ids, trained) in enumerate(batch):
            input_ids[row, :len(ids)] = torch.tensor(ids)
            mask[row, :len(ids)] = 1
            keep = torch.tensor(trained, dtype=torch.bool)
            labels[row, :len(ids)] = torch.where(keep, input_ids[row, :len(ids)], -100)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
        if bar is not None:
            bar.set_postfix(loss=f"{smoothed:.3f}", refresh=False)
            bar.update(1)
        if bar is None and ((step + 1) % 200 == 0 or step + 1 == spec.pretrain_steps):
            elapsed = time.time() - start
            left = elapsed / (step + 1) * (spec.pretrain_steps - step - 1)
            log(f"  pretrain step {step + 1}/{spec.pretrain_steps}  loss {smoothed:.3f}  "
                f"({elapsed:.0f}s, about {left:.0f}s left)")
    if bar is not None:
        bar.close()
    model.eval()
    return float(smoothed)


def _pretrain_bar(total: int):
    """A tqdm bar (steps, loss, time left) on an interactive terminal; None
    elsewhere (logs, tests), where the periodic log lines say the same."""
    import sys

    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="pretraining the tiny model", unit="step", dynamic_ncols=True)


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec = TinyModelSpec(), *, log=print) -> Path:
    """Tokenizer + Qwen2 model + short pretraining, saved atomically to `out_dir`."""
    out_dir = Path(out_dir)
    # Drawn from the same pool as the built-in data, after its test problems,
    # so the held-out test set is never seen in pretraining.
    problems, _ = synthetic.split_problems(train=spec.pretrain_problems, test=synthetic.TEST_SIZE,
                                           seed=synthetic.DATA_SEED)
    return build_on_problems(problems, out_dir, spec, name="tiny base model", log=log)


def build_on_problems(problems: list[synthetic.ArithProblem], out_dir: Path, spec: TinyModelSpec, *,
                      name: str, log=print) -> Path:
    """Tokenizer + Qwen2 model pretrained on worked and one-step answers to
    `problems` (a share `spec.full_solution_rate` worked), saved in `out_dir`."""
    pairs = synthetic.pretraining_texts(problems, full_solution_rate=spec.full_solution_rate,
                                        seed=spec.seed)
    tokenizer = build_tokenizer([q + "\n" + a for q, a in pairs], vocab_size=spec.vocab_size)
    return seeded_build(spec, tokenizer, out_dir, name=name, log=log,
                        train=lambda model: pretrain(model, tokenizer, pairs, spec, log=log))


def seeded_build(spec: TinyModelSpec, tokenizer, out_dir: Path, *, name: str, train, log) -> Path:
    """A fresh model of `spec`, `train(model)`, saved with `tokenizer` in
    `out_dir`. The weights depend on the spec alone, and the caller's global
    RNG is left as it was (the doctor, a test or a training run may build it)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = _make_model(spec, tokenizer)
        n_params = sum(p.numel() for p in model.parameters())
        log(f"building the {name} ({n_params / 1e6:.2f}M parameters, Qwen2 architecture) in {out_dir}")
        train(model)
    return save_folder(model, tokenizer, out_dir)


def save_folder(model, tokenizer, out_dir: Path) -> Path:
    """A Hugging Face folder at `out_dir`, written beside it and renamed:
    only a complete folder ever carries the final name."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tmp = out_dir.with_name(f"{out_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
