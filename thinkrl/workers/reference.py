"""The reference policy: the initial model, frozen, used for the KL term.

It is loaded from the model path like the actor (never copied from the
actor, which may already hold resumed weights) and may be sharded too. With
LoRA it is the actor's own module with the adapter switched off (`adapter_off`):
the base, which never trains (a run that starts from a saved adapter,
lora_adapter_path, is pulled towards the base, not that adapter; as in verl)."""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch
from torch import Tensor

from thinkrl.models.forward import batched_response_logprobs
from thinkrl.records import ModelInputs


class ReferenceWorker:
    def __init__(self, model: torch.nn.Module, *, micro_batch_size: int, temperature: float,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                 device: torch.device | None = None, remove_padding: bool = False,
                 fused_head: bool = False, max_tokens: int | None = None,
                 adapter_off: Callable[[], ContextManager] | None = None) -> None:
        # A module of its own is frozen here; the actor's (LoRA) is left as it trains.
        self.model = model if adapter_off is not None else model.eval().requires_grad_(False)
        self.adapter_off = adapter_off or contextlib.nullcontext
        self.remove_padding = remove_padding  # model.use_remove_padding
        self.fused_head = fused_head  # model.use_fused_kernels
        self.max_tokens = max_tokens  # ref.log_prob_max_token_len_per_gpu when dynamic
        self.device = device
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature
        self.autocast = autocast

    def compute_ref_log_prob(self, input_ids: Tensor, attention_mask: Tensor,
                             position_ids: Tensor, *, response_length: int,
                             model_inputs: ModelInputs | None = None) -> Tensor:
        """log pi_ref of the response tokens. [N, P + R] -> [N, R] on the CPU."""
        with self.adapter_off():
            return batched_response_logprobs(
                self.model, input_ids, attention_mask, position_ids,
                response_length=response_length, temperature=self.temperature,
                micro_batch_size=self.micro_batch_size, autocast=self.autocast,
                device=self.device, model_inputs=model_inputs, remove_padding=self.remove_padding,
                fused_head=self.fused_head, max_tokens=self.max_tokens)
