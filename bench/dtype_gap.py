"""How far bfloat16 autocast moves the log-probs from float32, on one model folder.

The GRPO bench's batch shape (8 prompts of 7 tokens, each with 8 responses of
64 tokens; random tokens below the vocabulary size), scored by the
shared-prompt pass in float32 and under bfloat16 autocast; prints the mean
and largest |difference| of the per-token log-probs:

    python bench/dtype_gap.py $WORK/model_small $WORK/model_medium
"""

from __future__ import annotations

import argparse

import torch

from thinkrl.models.forward import response_logprobs

PROMPTS, SAMPLES, PROMPT_TOKENS, RESPONSE_TOKENS = 8, 8, 7, 64


def logprob_gap(path: str) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (PROMPTS, PROMPT_TOKENS), generator=g)
    responses = torch.randint(3, vocab, (PROMPTS * SAMPLES, RESPONSE_TOKENS), generator=g)
    ids = torch.cat((prompts.repeat_interleave(SAMPLES, 0), responses), 1)
    mask = torch.ones_like(ids)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = {}
    for name, bf16 in (("float32", False), ("bfloat16", True)):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out[name], _ = response_logprobs(model, ids, mask, positions,
                                             response_length=RESPONSE_TOKENS, temperature=1.0,
                                             remove_padding=True)
    gap = (out["bfloat16"] - out["float32"]).abs()
    return {"mean_abs": gap.mean().item(), "max_abs": gap.max().item(),
            "mean_logprob": out["float32"].mean().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="Hugging Face model folders")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for path in args.models:
        r = logprob_gap(path)
        print(f"{path}: |log-prob bf16 - fp32| mean {r['mean_abs']:.2e} max {r['max_abs']:.2e} "
              f"(mean float32 log-prob {r['mean_logprob']:.3f})")


if __name__ == "__main__":
    main()
