"""What one micro-batch of the shared-prompt pass keeps for its backward:
the activation term of the doctor's memory estimate (`memory.py`) for
thinkrl's default path, counted against autograd's saved tensors
(`bench/activation_bytes.py`, docs/memory.md)."""

from __future__ import annotations

from thinkrl.models.lean_spec import plain_decoder_config


def shared_prompt_pass(cfg, text_config) -> bool:
    """Whether the update runs the shared-prompt pass (model.use_remove_padding
    on a plain decoder: `thinkrl.models.forward.response_logprobs`), judged
    from the config alone, as `models.lean_spec.lean_spec` judges the model."""
    if not cfg.actor_rollout_ref.model.use_remove_padding:
        return False
    return plain_decoder_config(text_config)


def shared_prompt_activations(*, b: int, prompts: int, p: int, r: int, h: int, f: int, kv: int,
                              layers: int, vocab: int, c: int, checkpointing: bool, fused_head: bool) -> int:
    """Bytes one micro-batch of `b` responses keeps for its backward in the
    shared-prompt pass: each distinct prompt (at most `prompts`) computed
    once, then the responses.

    Per layer and token, in the compute dtype (c bytes): the block's saved
    tensors, 10h + 4f + 2kv (norms, projections' inputs, rotated q/k, the
    SiLU gate's inputs and product); a response row also holds its prompt's
    keys and values, 2 kv (P + R) per row. Attention keeps no score matrix
    (PyTorch's fused kernels keep a log-sum-exp per query, on a CPU too). The
    head: the logits, their fp32 log-softmax and, in the backward, its fp32
    gradient, (c + 12) bytes per logit, of the responses only; `fused_head`
    (model.use_fused_kernels) keeps the final hidden state and one chunk
    instead. With gradient checkpointing a layer keeps its inputs,
    (U P + b R) h c, and the backward holds one layer recomputed with its
    gradients (twice its set). Counted against autograd's saved tensors
    (`bench/activation_bytes.py`) and measured peaks: docs/memory.md."""
    response = b * r * (10 * h + 4 * f + 2 * kv) * c + b * 2 * kv * (p + r) * c
    prompt = prompts * p * (10 * h + 4 * f + 2 * kv) * c
    per_layer = response + prompt
    # checkpointing: each layer's inputs, and in the backward one layer recomputed with its gradients
    kept = layers * per_layer if not checkpointing else layers * (prompts * p + b * r) * h * c + 2 * per_layer
    if fused_head:
        from thinkrl.models.fused_head import chunk_tokens
        head = b * r * h * c + min(chunk_tokens(vocab), b * r) * vocab * (c + 12)
    else:
        head = b * r * vocab * (c + 12)
    return int(kept + head)
