"""Vision-language rollouts through vLLM (Qwen2.5-VL, Qwen2-VL): what the
engine is given for a prompt with images, and what the rollout carries back.

- The image features come from the trainer's own vision tower (vLLM's
  `image_embeds` input, engine argument `enable_mm_embeds`): vLLM never runs
  its tower, so the rollout conditions on exactly the features the training
  forward computes, whether the tower trains or is frozen, and the weight
  sync sends the language model alone.
- The prompt goes as token ids with each image's run of <|image_pad|> tokens
  collapsed to one, which vLLM expands again from that image's grid (the
  prompt form verl's `raw_prompt_ids` gives vLLM).
- After generation the prompts' M-RoPE positions come from the trainer
  model's `get_rope_index`, as the native engine's rollouts carry them, so
  the log-prob passes and the update see the positions they would after a
  native rollout.

Shapes: per row i, `pixel_values[i]` [patches_i, D] and `image_grid_thw[i]`
[images_i, 3]; an image of grid (t, h, w) gives t h w / merge^2 features of
the language model's width E.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.models.vision import image_kwargs, with_prompt_positions
from thinkrl.parallel.fsdp import gathered
from thinkrl.records import ModelInputs, PromptBatch

MAX_IMAGES_PER_PROMPT = 8
"""vLLM's `limit_mm_per_prompt` for images unless engine_kwargs.vllm sets one."""


def vision_engine_arguments() -> dict:
    """What `vllm.LLM` needs beyond a text model's arguments: its multi-modal
    processor needs the tokenizer, and image features come as embeddings."""
    return dict(skip_tokenizer_init=False, enable_mm_embeds=True,
                limit_mm_per_prompt={"image": MAX_IMAGES_PER_PROMPT})


def collapse_image_pads(ids: list[int], image_token_id: int) -> list[int]:
    """Each run of consecutive image tokens as one: [a, I, I, I, b] -> [a, I, b]."""
    out: list[int] = []
    for token in ids:
        if token == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(token)
    return out


def is_synced(name: str) -> bool:
    """Whether the engine needs this trainer tensor: not the vision tower's
    (the engine is given image features, never pixels)."""
    return "visual" not in name.split(".")


class VisionInputs:
    """The trainer model's side of a VL rollout through vLLM: image features
    for the requests and M-RoPE positions for the rollouts. `model` is the
    actor's module (FSDP2 shards included)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.image_token_id = model.config.image_token_id

    def requests(self, prompts: PromptBatch) -> list[dict]:
        """Per prompt, vLLM's token prompt: ids (image runs collapsed) and, for
        a prompt with images, `multi_modal_data` with their embeddings [T, E]
        and grids [images, 3]. On a sharded model every rank must call it, a
        rank without images too: the weights are gathered once, on entry."""
        features = self._image_features(prompts.model_inputs, rows=len(prompts))
        requests = []
        for row, (ids, mask) in enumerate(zip(prompts.input_ids, prompts.attention_mask)):
            tokens = collapse_image_pads(ids[mask.bool()].tolist(), self.image_token_id)
            request = {"prompt_token_ids": tokens}
            if features[row] is not None:
                request["multi_modal_data"] = {"image": {
                    "image_embeds": features[row],
                    "image_grid_thw": prompts.model_inputs.image_grid_thw[row]}}
            requests.append(request)
        return requests

    def rollout_inputs(self, prompt_ids: Tensor, prompt_mask: Tensor,
                       inputs: ModelInputs) -> ModelInputs:
        """`inputs` (one entry per rollout row) with the prompts' M-RoPE positions."""
        return with_prompt_positions(self.model, prompt_ids, prompt_mask, inputs)

    @torch.no_grad()
    def _image_features(self, inputs: ModelInputs | None, *, rows: int) -> list[Tensor | None]:
        """Per row, its images' features concatenated [T_i, E] (CPU), or None
        (every row of a text-only batch, whose `inputs` is None)."""
        with gathered(self.model):  # a collective on entry: every rank, images or not
            device = next(self.model.parameters()).device
            pixels = image_kwargs(inputs, device)
            if not pixels:
                return [None] * rows
            out = self.model.get_image_features(pixels["pixel_values"],
                                                pixels["image_grid_thw"])
            per_image = getattr(out, "pooler_output", out)  # transformers 5: an output record
            per_image = [f.float().cpu() for f in per_image]
        features, image = [], 0
        for grid in inputs.image_grid_thw:
            count = len(grid)
            features.append(torch.cat(per_image[image:image + count]) if count else None)
            image += count
        return features
