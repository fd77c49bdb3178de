"""`native` rollout: batched sampling in plain PyTorch with a KV cache.

Works with any Hugging Face causal LM on any device; it is the default on CPU
and the reference that faster engines are checked against.

One call: repeat each prompt G times, prefill all prompts at once (left
padding, explicit position ids), then decode one token per step for every
unfinished row, reusing the model's KV cache. A row finishes at EOS (unless
`ignore_eos`) or at `max_tokens`.

Plain Llama/Qwen2/Qwen3 decoders on one process take the slot decoder of
`thinkrl.rollout.continuous` instead (a prompt prefilled once for its G
samples, the lean forward, finished rows leaving the batch): the same tokens
under the same generator.
Every other model (remote code, vision-language, FSDP-sharded) takes the
padded loop here, which stays the reference.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Iterable

import contextlib
import math

import torch
from torch import Tensor

from thinkrl.progress import DecodeProgress
from thinkrl.models.forward import forward_accepts, last_logits
from thinkrl.models.vision import image_kwargs, to_model_positions, with_prompt_positions
from thinkrl.models.lean_decoder import lean_spec
from thinkrl.models.routing import RouteTape, fed_only, left_padded, recording
from thinkrl.rollout import continuous
from thinkrl.records import FINISH_LENGTH, FINISH_STOP, PromptBatch, Rollouts
from thinkrl.rollout.base import SamplingParams


def filter_logits(logits: Tensor, *, top_k: int, top_p: float, min_p: float = 0.0) -> Tensor:
    """Set logits outside the min-p, top-k and nucleus (top-p) sets to -inf. [N, V] -> [N, V].

    In that order, as vLLM's V1 sampler applies them to the tempered logits:
    - min_p: drop token i when p_i < min_p * max_j p_j (p = softmax(logits));
      equivalently logit_i < max_j logit_j + ln(min_p). 0 keeps everything;
      the most likely token always stays.
    - top_k: keep the k largest logits (-1 keeps all).
    - top_p: keep the smallest most-likely set whose mass reaches top_p, the
      mass measured after the filters before it.
    """
    if min_p > 0.0:
        # p_i / p_max = exp(logit_i - logit_max): no softmax needed.
        floor = logits.max(dim=-1, keepdim=True).values + math.log(min_p)
        logits = logits.masked_fill(logits < floor, float("-inf"))
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p;
        # the most likely token is therefore always kept.
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class NativeEngine:
    """Samples from `model` in place: when it is the actor's own module, the
    actor's optimizer step is already the weight sync.

    `gather` is entered once per `generate` call: for an FSDP2-sharded
    module it gathers the full weights for the whole rollout (and frees them
    after), so decoding never gathers per token."""

    def __init__(self, model: torch.nn.Module, *, eos_token_ids: list[int], pad_token_id: int,
                 seed: int = 0,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                 gather: Callable[[], ContextManager] = contextlib.nullcontext,
                 device: torch.device | None = None, fast: bool = True,
                 route_tape: RouteTape | None = None) -> None:
        self.model = model
        # router replay R3: each token's experts are recorded (`Rollouts.routed_experts`)
        self.route_tape = route_tape
        self.gather = gather
        # Where decoding runs: the parameters' device unless they are offloaded shards.
        self._device = device
        self.eos_token_ids = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long)
        self.pad_token_id = pad_token_id
        self.autocast = autocast
        # Sampling happens where the logits are: copying [N, V] probabilities
        # to the host every token would cost more than the forward pass.
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        # transformers 5 renamed the KV-cache argument `past_key_values` to `cache`.
        self._cache_arg = "cache" if forward_accepts(type(model), "cache") else "past_key_values"
        # The fast loop reads the weights straight from the modules: not for
        # sharded ones (their full weights exist only inside FSDP's hooks).
        sharded = gather is not contextlib.nullcontext
        self._lean = lean_spec(model) if fast and not sharded else None

    @property
    def device(self) -> torch.device:
        return self._device or next(self.model.parameters()).device

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        params = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in named_tensors:
                if params[name].data_ptr() != tensor.data_ptr():  # shared: nothing to copy
                    params[name].copy_(tensor.to(params[name].device, params[name].dtype))

    def generator_state(self) -> Tensor:
        return self.generator.get_state()

    def set_generator_state(self, state: Tensor) -> None:
        self.generator.set_state(state)

    @torch.no_grad()
    def generate(self, prompts: PromptBatch, params: SamplingParams,
                 pause: Callable[[int], bool] | None = None) -> Rollouts:
        """`pause(tokens so far)`, asked after every decoded token, may end
        decoding early: rows that have not stopped then hold fewer than
        max_tokens tokens (async training's partial rollout continues them)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with self.gather(), self.autocast(), recording(self.route_tape):
                return self._generate(prompts, params, pause)
        finally:
            self.model.train(was_training)

    def _generate(self, prompts: PromptBatch, params: SamplingParams,
                  pause: Callable[[int], bool] | None = None) -> Rollouts:
        from transformers import DynamicCache

        if len(prompts) == 0:  # a rank with no share of a small batch still gathered above
            return empty_rollouts(prompts)
        g, device = params.n, self.device
        prompt_ids = prompts.input_ids.repeat_interleave(g, dim=0)  # [N, P]
        prompt_mask = prompts.attention_mask.repeat_interleave(g, dim=0)  # [N, P]
        if self._lean is not None and prompts.model_inputs is None:  # VL: the padded loop
            decoded = continuous.decode(
                self._lean, prompts.input_ids.to(device), prompts.attention_mask.to(device),
                samples=g, max_tokens=params.max_tokens, pad_token_id=self.pad_token_id,
                eos=None if params.ignore_eos else self.eos_token_ids.to(device),
                sample=lambda logits, rows, total: self._sample(logits, params, rows, total),
                pause=pause, tape=self.route_tape)
            routes = None if decoded.routes is None else left_padded(
                decoded.routes.cpu(), prompt_mask.sum(-1), prompt_mask.shape[1], decoded.tokens.shape[1])
            return self._rollouts(prompts, prompt_ids, prompt_mask, decoded.tokens.cpu(),
                                  decoded.logprobs.cpu(), params, routes=routes)
        n = prompt_ids.shape[0]
        eos = self.eos_token_ids.to(device)

        attention_mask = prompt_mask.to(device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        model_inputs, images = None, {}
        if prompts.model_inputs is not None:  # VL: M-RoPE positions [N, 3, P] and pixels
            model_inputs = with_prompt_positions(
                self.model, prompt_ids, prompt_mask, prompts.model_inputs.repeat_interleave(g))
            position_ids = model_inputs.prompt_positions.to(device)
            images = image_kwargs(model_inputs, device)
        # The last prompt column holds the largest position (prompts end in text).
        next_position = position_ids[..., -1:] + 1  # [N, 1] or [N, 3, 1]
        cache = DynamicCache()
        cache_kwargs = {self._cache_arg: cache}  # filled in place by every forward
        logits, _ = last_logits(self.model, 1, input_ids=prompt_ids.to(device),
                                attention_mask=attention_mask,
                                position_ids=to_model_positions(position_ids),
                                use_cache=True, **cache_kwargs, **images)
        tape = self.route_tape
        routes = [] if tape is None else [tape.take(prompt_ids.numel()).view(*prompt_ids.shape, tape.layers, -1)]

        tokens, logprobs = [], []
        finished = torch.zeros(n, dtype=torch.bool, device=device)
        told = DecodeProgress(n, params.max_tokens)
        for step in range(params.max_tokens):
            told.decoded(step + 1, lambda: n - int(finished.sum()))
            logits = logits[:, -1, :].float()  # [N, V]
            token, logprob = self._sample(logits, params)
            token = torch.where(finished, torch.full_like(token, self.pad_token_id), token)
            tokens.append(token)
            logprobs.append(logprob.masked_fill(finished, 0.0))
            if not params.ignore_eos:
                finished = finished | torch.isin(token, eos)
            if bool(finished.all()) or step + 1 == params.max_tokens or (pause is not None
                                                                          and pause(step + 1)):
                break
            attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], 1)
            logits = self.model(input_ids=token[:, None], attention_mask=attention_mask,
                                position_ids=to_model_positions(next_position), use_cache=True,
                                **cache_kwargs).logits
            if tape is not None:
                routes.append(tape.take(n)[:, None])
            next_position = next_position + 1

        response_ids = torch.stack(tokens, dim=1).cpu()  # [N, R]
        response_logprobs = torch.stack(logprobs, dim=1).cpu()  # [N, R]
        recorded = None
        if tape is not None:  # prompt columns, then one per fed token; the last sampled one was never fed
            recorded = torch.cat(routes, dim=1).cpu()[:, :prompt_ids.shape[1] + response_ids.shape[1]]
            recorded = torch.nn.functional.pad(
                recorded, (0, 0, 0, 0, 0, prompt_ids.shape[1] + response_ids.shape[1] - recorded.shape[1]))
        return self._rollouts(prompts, prompt_ids, prompt_mask, response_ids, response_logprobs,
                              params, model_inputs=model_inputs, routes=recorded)

    def _rollouts(self, prompts: PromptBatch, prompt_ids: Tensor, prompt_mask: Tensor,
                  response_ids: Tensor, response_logprobs: Tensor,
                  params: SamplingParams, model_inputs=None, routes: Tensor | None = None) -> Rollouts:
        g = params.n
        response_mask = self._response_mask(response_ids, params.ignore_eos)
        if routes is not None:  # [N, P + R]: only the tokens the model read count
            routes = fed_only(routes, torch.cat([prompt_mask, response_mask], dim=1))
        stopped = torch.isin(response_ids, self.eos_token_ids).any(-1) & (not params.ignore_eos)
        reasons = [FINISH_STOP if s else FINISH_LENGTH for s in stopped.tolist()]
        return Rollouts(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
            response_mask=response_mask, rollout_logprobs=response_logprobs,
            finish_reasons=reasons,
            group_ids=torch.arange(len(prompts)).repeat_interleave(g),
            samples=[s for s in prompts.samples for _ in range(g)],
            model_inputs=model_inputs, routed_experts=routes,
        )

    def _sample(self, logits: Tensor, params: SamplingParams, rows: Tensor | None = None,
                total: int = 0) -> tuple[Tensor, Tensor]:
        return sample_tokens(logits, params, self.generator, rows=rows, total=total)

    def _response_mask(self, response_ids: Tensor, ignore_eos: bool) -> Tensor:
        """1 up to and including the first EOS of each row. [N, R] -> [N, R] long."""
        if ignore_eos:
            return torch.ones_like(response_ids)
        is_eos = torch.isin(response_ids, self.eos_token_ids).long()
        after_eos = (is_eos.cumsum(-1) - is_eos) > 0  # strictly after the first EOS
        return (~after_eos).long()


def sample_tokens(logits: Tensor, params: SamplingParams, generator: torch.Generator, *,
                  rows: Tensor | None = None, total: int = 0) -> tuple[Tensor, Tensor]:
    """Next token and its log-prob under softmax(logits / temperature). [N, V] -> [N], [N].
    With `rows`, `logits` are those rows of a `total`-row batch (the
    generator is drawn as for all of them: `continuous.sample_rows`)."""
    if params.greedy:
        token = logits.argmax(-1)
        return token, torch.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
    scaled = logits / params.temperature
    logp = torch.log_softmax(scaled, -1)
    filtered = filter_logits(scaled, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p)
    if rows is not None:
        token = continuous.sample_rows(filtered, rows, total, generator=generator,
                                        probs_of=lambda z: torch.softmax(z, -1))
        return token, logp.gather(-1, token[:, None])[:, 0]
    probs = torch.softmax(filtered, -1)
    token = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return token, logp.gather(-1, token[:, None])[:, 0]


def empty_rollouts(prompts: PromptBatch) -> Rollouts:
    """The responses to no prompts (the share of a rank that got none)."""
    none = torch.zeros(0, 0, dtype=torch.long)
    return Rollouts(prompt_ids=prompts.input_ids, prompt_mask=prompts.attention_mask,
                    response_ids=none, response_mask=none, rollout_logprobs=none.float(),
                    finish_reasons=[], group_ids=torch.zeros(0, dtype=torch.long), samples=[])
