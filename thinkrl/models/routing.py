"""Router replay for mixture-of-experts policies (verl's R2/R3): record the
experts each token was routed to in one pass, and make another pass use them.

A router is discrete: a rounding difference between the rollout engine and
the trainer can send a token to other experts, and the trainer then scores
the sampled tokens under another network than the one that sampled them.
Replay fixes the choice of experts; the weights of the chosen experts are
still this pass's (the current router's probabilities gathered at the
replayed experts, renormalised where the model renormalises), so the router
keeps its gradient. As verl: the reference never replays, and a token
without a recorded route (the last sampled token, which no pass fed back;
padding) routes natively: a recorded row repeats no expert, a row that does
(the zeros of "no record") is not replayed.

Routes: int16 [T, L, k] per pass (T tokens in the pass's own order, L the
decoder's layers, absolute index, dense layers all zero, k experts per token),
[N, S, L, k] over sequences (`Rollouts.routed_experts`, aligned with the
sequences' tokens).

`install(model)` puts one `RouteTape` on every sparse block: the lean forward
(`thinkrl.models.lean_moe.route`) and transformers' own forward (a hook on
each router) both consult it, so recording (`recording`) and replay
(`replaying`) work on every path that goes through the block in token order
(the shared-prompt pass does not: replaying passes take the padded forward).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor

from thinkrl.models.lean_moe import TAPE_ATTR as _ATTR, is_sparse_block, tape_of, taped_choice

ROUTE_DTYPE = torch.int16


def sparse_layers(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """(layer index, sparse block) of a Qwen3-MoE / Qwen2-MoE causal LM; [] for a dense model."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None) or []
    return [(i, layer.mlp) for i, layer in enumerate(layers) if is_sparse_block(getattr(layer, "mlp", None))]


def tape_busy(model: torch.nn.Module) -> bool:
    """Whether a tape on `model`'s routers replays, records or collects now:
    its pass must then see the tokens in the padded forward's order (row by
    row), which the shared-prompt pass does not keep."""
    blocks = sparse_layers(model)
    tapped = tape_of(blocks[0][1].gate) if blocks else None
    if tapped is None:
        return False
    tape = tapped[0]
    return tape.replay is not None or tape.record or tape.collect_aux


def router_aux_coef(model: torch.nn.Module) -> float:
    """transformers' load-balancing loss weight when the model's config asks for
    the loss (output_router_logits, router_aux_loss_coef); 0 otherwise or for a dense model."""
    config = getattr(model, "config", None)
    if not sparse_layers(model) or not getattr(config, "output_router_logits", False):
        return 0.0
    return float(getattr(config, "router_aux_loss_coef", 0.0))


def route_shape(model: torch.nn.Module) -> tuple[int, int]:
    """(L, k): the decoder's layer count and the experts per token."""
    blocks = sparse_layers(model)
    return len(model.model.layers), int(blocks[0][1].gate.top_k)


class RouteTape:
    """What the sparse blocks of one model do during a pass: record their
    choices (`record`), use given ones (`replay` [T, L, k], set per pass), and
    count how often their own choice agrees with the replayed one."""

    def __init__(self, layers: int, top_k: int, *, record: bool = False) -> None:
        self.layers, self.top_k, self.record = layers, top_k, record
        self.replay: Tensor | None = None
        self.counting = False  # tally agreement (the old-log-prob pass: trainer vs rollout)
        self.collect_aux = False  # keep each layer's probabilities and own top-k (the load-balancing loss)
        self.aux: tuple[list[Tensor], list[Tensor]] = ([], [])
        self._taken: dict[int, Tensor] = {}
        self.agree = torch.zeros(layers, dtype=torch.float64)
        self.counted = torch.zeros(layers, dtype=torch.float64)

    def choose(self, layer: int, probs: Tensor, native: Tensor) -> Tensor:
        """The experts [T, k] layer `layer` uses, given its probabilities [T, X]
        and its own top-k [T, k]: the replayed ones where a row holds a route."""
        if self.collect_aux:
            self.aux[0].append(probs)
            self.aux[1].append(native)
        chosen = native
        if self.replay is not None:
            target = self.replay[:, layer].to(native.device).long()
            if target.shape[0] != native.shape[0]:
                raise ValueError(f"router replay: layer {layer} routes {native.shape[0]} tokens, the "
                                 f"replayed routes hold {target.shape[0]}")
            held = _distinct(target)
            if self.counting:
                same = (native.sort(-1).values == target.sort(-1).values).all(-1) & held
                self.agree[layer] += float(same.sum())
                self.counted[layer] += float(held.sum())
            chosen = torch.where(held[:, None], target, native)
        if self.record:
            self._taken[layer] = chosen.detach().to(ROUTE_DTYPE)
        return chosen

    def take(self, tokens: int, device=None) -> Tensor:
        """The routes recorded by the last pass, [tokens, L, k] (dense layers zero), and forget them."""
        out = torch.zeros(tokens, self.layers, self.top_k, dtype=ROUTE_DTYPE, device=device)
        for layer, chosen in self._taken.items():
            out[:, layer] = chosen.to(out.device)
        self._taken = {}
        return out

    def take_aux(self) -> tuple[list[Tensor], list[Tensor]]:
        """Each sparse layer's probabilities [T, X] and own top-k [T, k] of the
        pass just made (collect_aux); then collecting stops."""
        aux, self.aux, self.collect_aux = self.aux, ([], []), False
        return aux

    def take_counts(self) -> tuple[list[float], list[float]]:
        """(agreeing, replayed) tokens per layer since the last call; then they start over."""
        counts = (self.agree.tolist(), self.counted.tolist())
        self.agree.zero_()
        self.counted.zero_()
        return counts


def agreement_metrics(agree: list[float], counted: list[float]) -> dict[str, float]:
    """Per layer and mean over the sparse layers, the share of replayed tokens
    whose own top-k is the replayed set (`routing/agreement/layer_<i>`,
    `routing/agreement`): how often the trainer would have routed as the rollout did."""
    shares = {i: a / c for i, (a, c) in enumerate(zip(agree, counted)) if c > 0}
    if not shares:
        return {}
    metrics = {f"routing/agreement/layer_{i}": v for i, v in shares.items()}
    metrics["routing/agreement"] = sum(shares.values()) / len(shares)
    return metrics


def _distinct(routes: Tensor) -> Tensor:
    """Rows [T] whose k experts are all different (a recorded route)."""
    ordered = routes.sort(-1).values
    return (ordered[:, 1:] != ordered[:, :-1]).all(-1) if routes.shape[-1] > 1 else torch.ones(
        routes.shape[0], dtype=torch.bool, device=routes.device)


def install(model: torch.nn.Module) -> RouteTape:
    """One tape on every sparse block of `model`, for the model's life:
    transformers' routers report to it through a forward hook; the lean
    forward reads it. Raises ValueError for a model without sparse layers."""
    blocks = sparse_layers(model)
    if not blocks:
        raise ValueError("router replay needs a mixture-of-experts model; this one has no sparse layers")
    layers, top_k = route_shape(model)
    tape = RouteTape(layers, top_k)
    for index, block in blocks:
        setattr(block.gate, _ATTR, (tape, index))
        block.gate.register_forward_hook(_router_hook)
    return tape


@contextlib.contextmanager
def recording(tape: RouteTape | None) -> Iterator[RouteTape | None]:
    """Within: the tape records each pass's routes (`RouteTape.take`)."""
    if tape is None:
        yield None
        return
    tape.record = True
    try:
        yield tape
    finally:
        tape.record, tape._taken = False, {}


def _router_hook(gate: torch.nn.Module, inputs, output):
    """transformers' router returns (logits, weights, experts): the experts the
    tape chooses and their weights, as the lean forward takes them
    (`lean_moe.taped_choice`); its own output while the tape does nothing."""
    tape, _ = tape_of(gate)
    if tape.replay is None and not tape.record and not tape.collect_aux:
        return output
    logits, _, native = output
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top, chosen = taped_choice(gate, probs, native, norm_topk_prob=gate.norm_topk_prob, dtype=logits.dtype)
    return logits, top, chosen


def set_replay(tape: RouteTape | None, routes: Tensor | None) -> None:
    """From now on the tape replays `routes` [n, S, L, k] (None: routes natively).
    For a training forward: gradient checkpointing recomputes its layers in the
    backward, after the forward returned, and they must route the same way."""
    if tape is not None:
        tape.replay = None if routes is None else routes.reshape(-1, *routes.shape[2:])


@contextlib.contextmanager
def replaying(tape: RouteTape | None, routes: Tensor | None, *, count: bool = False) -> Iterator[None]:
    """Within: the tape replays `routes` [n, S, L, k] (flattened to the pass's
    [n S, L, k] token order), and with `count` tallies how often the pass's own
    choice agrees; nothing without a tape or routes."""
    if tape is None or routes is None:
        yield
        return
    tape.replay, tape.counting = routes.reshape(-1, *routes.shape[2:]), count
    try:
        yield
    finally:
        tape.replay, tape.counting = None, False


def left_padded(compact: Tensor, prompt_lengths: Tensor, prompt_width: int, response_width: int) -> Tensor:
    """Routes written from column 0 (each row's prompt, then its response:
    [N, C, L, k]) in the sequences' layout [N, P + R, L, k]: the prompt
    right-aligned to column P, the response from column P."""
    n = compact.shape[0]
    columns = torch.arange(prompt_width + response_width)
    source = columns[None] - (prompt_width - prompt_lengths[:, None])  # [N, P + R]
    valid = (source >= 0) & (source < compact.shape[1])
    index = source.clamp(0, compact.shape[1] - 1)
    out = compact[torch.arange(n)[:, None], index]
    return out * valid[:, :, None, None].to(out.dtype)


def fed_only(routes: Tensor, attention_mask: Tensor) -> Tensor:
    """Routes [N, S, L, k] with the rows of tokens the model did not read
    (attention_mask [N, S] 0: padding, what follows EOS) and each sequence's
    last token (sampled, never fed back) set to zero: "no record"."""
    last = attention_mask.long().cumsum(-1) == attention_mask.long().sum(-1, keepdim=True)
    keep = attention_mask.bool() & ~last
    return routes * keep[:, :, None, None].to(routes.dtype)
