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


def mlp_terms(text_config) -> tuple[int, int]:
    """(f, extra) per token of the MLP for the activation formulas: f the
    width its SiLU-gated products keep (a dense MLP: intermediate_size; a
    mixture of experts: its k active experts, k x moe_intermediate_size), and
    what routing adds per token in elements: each active expert's copy of the
    token in and its weighted output out (2 k h), the router's logits and
    float32 probabilities (about 3 X for X experts). Averaged over the layers
    when some are dense (mlp_only_layers, decoder_sparse_step)."""
    experts = getattr(text_config, "num_experts", 0) or 0
    dense = text_config.intermediate_size
    if not experts:
        return dense, 0
    layers = text_config.num_hidden_layers
    only = set(getattr(text_config, "mlp_only_layers", None) or [])
    step = getattr(text_config, "decoder_sparse_step", 1) or 1
    sparse = sum(1 for i in range(layers) if i not in only and (i + 1) % step == 0)
    k, h = text_config.num_experts_per_tok, text_config.hidden_size
    active = k * text_config.moe_intermediate_size + (getattr(text_config, "shared_expert_intermediate_size", 0)
                                                      or 0)
    f = (sparse * active + (layers - sparse) * dense) // layers
    return f, sparse * (2 * k * h + 3 * experts) // layers


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
