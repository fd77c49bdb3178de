"""Bytes one micro-batch keeps for its backward, counted exactly: the
tensors autograd saves (`torch.autograd.graph.saved_tensors_hooks`, each
storage once) in one forward of the actor's log-prob pass, on a model built
from a config (random weights, no download). What the doctor's activation
formula (`thinkrl/doctor/memory.py`) is calibrated against.

    python bench/activation_bytes.py --model builtin:smollm2-135m-instruct --micro 32 \
        --prompts 8 --prompt-len 128 --response-len 64 [--padded] [--fused-head] [--checkpointing]

Prints one JSON line: the counted bytes and the doctor's estimate of the same micro-batch.
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from thinkrl.models.forward import response_logprobs


def saved_bytes(model, input_ids, attention_mask, position_ids, *, response_length: int, padded: bool,
                fused_head: bool) -> int:
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logprobs, _ = response_logprobs(model, input_ids, attention_mask, position_ids,
                                        response_length=response_length, temperature=1.0, with_entropy=True,
                                        remove_padding=not padded, fused_head=fused_head)
        logprobs.sum().backward()
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in parameters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts among the micro-batch's rows")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--padded", action="store_true", help="the padded forward (use_remove_padding=False)")
    parser.add_argument("--fused-head", action="store_true")
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args()
    from thinkrl.builtin import resolve_model_path
    from thinkrl.doctor.activations import shared_prompt_activations

    config = AutoConfig.from_pretrained(resolve_model_path(args.model, log=lambda *_: None))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if args.checkpointing:
        model.gradient_checkpointing_enable()
    p, r, b = args.prompt_len, args.response_len, args.micro
    prompts = torch.randint(3, config.vocab_size, (args.prompts, p))
    input_ids = torch.cat((prompts[torch.arange(b) % args.prompts], torch.randint(3, config.vocab_size, (b, r))), 1)
    attention_mask = torch.ones_like(input_ids)
    position_ids = torch.arange(p + r).expand(b, -1)
    counted = saved_bytes(model, input_ids, attention_mask, position_ids, response_length=r, padded=args.padded,
                          fused_head=args.fused_head)
    text = config
    estimate = shared_prompt_activations(
        b=b, prompts=args.prompts, p=p, r=r, h=text.hidden_size, f=text.intermediate_size,
        kv=text.num_key_value_heads * (getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads),
        layers=text.num_hidden_layers, vocab=text.vocab_size, c=4,
        checkpointing=args.checkpointing, fused_head=args.fused_head)
    print(json.dumps({"model": args.model, "micro": b, "prompts": args.prompts, "prompt_len": p,
                      "response_len": r, "padded": args.padded, "fused_head": args.fused_head,
                      "checkpointing": args.checkpointing, "saved_gib": round(counted / 2**30, 3),
                      "doctor_shared_prompt_gib": round(estimate / 2**30, 3)}))


if __name__ == "__main__":
    main()
