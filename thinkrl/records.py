"""Typed records that cross stage boundaries. All tensors are CPU tensors.

Shapes: B prompts, G samples per prompt (rollout.n), N = B*G responses,
P prompt tokens (left-padded), R response tokens (right-padded).

Layout of a sequence, as verl lays it out: the prompt is left-padded and the
response right-padded, so every prompt ends at column P and response token t
of every row sits at column P + t. Log-probs, masks and advantages over the
response are all [N, R] and line up with `response_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class Sample:
    """One data row, as the reward function needs it."""

    data_source: str
    ground_truth: str
    prompt_text: str
    """The prompt after the template, exactly as the model sees it."""
    extra_info: dict = field(default_factory=dict)
    index: int = 0
    """Row number in its data file, for error messages and sample logs."""
    images: tuple = ()
    """The row's images as stored (bytes or paths), for thumbnails in generation logs."""
    messages: tuple = ()
    """The row's prompt as chat messages, before the template (what verl's
    interactions read as the start of the conversation)."""


@dataclass(slots=True)
class ModelInputs:
    """What a forward pass of a vision-language model needs beyond token ids,
    one entry per row (rows own different numbers of images), CPU tensors.

    The same record flows from the prompt batch through the rollout to the
    log-prob passes and the update, so every pass sees the same pixels and
    the same M-RoPE positions. D = channels * temporal_patch * patch**2."""

    pixel_values: list[Tensor]
    """Per row [patches_i, D] (0 patches for a text-only row)."""
    image_grid_thw: list[Tensor]
    """Per row [images_i, 3]: each image's (t, h, w) grid of patches."""
    prompt_positions: Tensor | None = None
    """[N, 3, P] M-RoPE positions of the prompt, from the model's own
    get_rope_index (filled by the rollout engine at prefill)."""

    def __len__(self) -> int:
        return len(self.pixel_values)

    def select(self, rows: Tensor | slice) -> "ModelInputs":
        """The rows at `rows` (a slice or a LongTensor of row numbers)."""
        index = range(len(self))[rows] if isinstance(rows, slice) else rows.tolist()
        positions = None if self.prompt_positions is None else self.prompt_positions[rows]
        return ModelInputs([self.pixel_values[i] for i in index],
                           [self.image_grid_thw[i] for i in index], positions)

    def repeat_interleave(self, g: int) -> "ModelInputs":
        """Each row `g` times in a row (the G responses of a prompt)."""
        return self.select(torch.arange(len(self)).repeat_interleave(g))

    @classmethod
    def concat(cls, parts: list["ModelInputs"]) -> "ModelInputs":
        """Rows of `parts` one after the other (prompt widths must agree)."""
        positions = [p.prompt_positions for p in parts]
        return cls([t for p in parts for t in p.pixel_values],
                   [t for p in parts for t in p.image_grid_thw],
                   None if any(t is None for t in positions) else torch.cat(positions))

    @classmethod
    def text_only(cls, prompt_mask: Tensor) -> "ModelInputs":
        """Rows without images, for a record that must line up with image rows:
        their M-RoPE positions are the 1-D positions in all three components."""
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [N, P]
        rows = prompt_mask.shape[0]
        return cls([torch.zeros(0)] * rows, [torch.zeros(0, 3, dtype=torch.long)] * rows,
                   positions[:, None, :].expand(-1, 3, -1).contiguous())

    def left_padded(self, width: int) -> "ModelInputs":
        """Prompt positions left-padded with 0 to `width` columns (re-padded prompts)."""
        assert self.prompt_positions is not None
        pad = width - self.prompt_positions.shape[-1]
        return ModelInputs(self.pixel_values, self.image_grid_thw,
                           torch.nn.functional.pad(self.prompt_positions, (pad, 0)))

    def sequence_positions(self, response_length: int) -> Tensor:
        """M-RoPE positions of prompt + response [N, 3, P + R]. Response
        tokens are text: all three components of token t are the prompt's
        largest position + 1 + t, as get_rope_index gives a text run after the
        prompt and as the model's own decoding adds its rope delta. The last
        prompt column holds that largest position (prompts end in text)."""
        assert self.prompt_positions is not None, "the engine fills prompt_positions"
        last = self.prompt_positions[..., -1:]  # [N, 3, 1]
        steps = torch.arange(1, response_length + 1, dtype=last.dtype)  # [R]
        return torch.cat([self.prompt_positions, last + steps], dim=-1)


@dataclass(slots=True)
class PromptBatch:
    input_ids: Tensor  # [B, P] left-padded
    attention_mask: Tensor  # [B, P] 1 for real tokens
    samples: list[Sample]
    model_inputs: ModelInputs | None = None
    """Images of the prompts (vision-language models); None for text."""

    def __len__(self) -> int:
        return len(self.samples)

    def select(self, rows: Tensor) -> "PromptBatch":
        """The prompts at `rows` (a LongTensor), padding width unchanged."""
        return PromptBatch(self.input_ids[rows], self.attention_mask[rows],
                           [self.samples[i] for i in rows.tolist()],
                           None if self.model_inputs is None else self.model_inputs.select(rows))


SINGLE_TURN = "single_turn_agent"
"""The environment of a row that talks to none: one turn (verl's agent name)."""

FINISH_STOP = "stop"  # the model wrote EOS
FINISH_LENGTH = "length"  # hit max_response_length


@dataclass(slots=True)
class TurnStats:
    """What the conversation of each response did, per response [N]
    (`thinkrl.envs.loop`): which environment it talked to, its turns, the
    environment's rewards and failures."""

    environments: list[str]
    """[N] the environment's name (SINGLE_TURN for one turn)."""
    assistant_turns: Tensor  # [N] long: turns the model generated
    env_turns: Tensor  # [N] long: environment turns (tool results, user replies) put into the response
    env_seconds: Tensor  # [N] float: time of the response's environment calls (they overlap)
    env_wall: Tensor
    """[N] float: each round of environment calls' wall time split evenly over the
    responses in it; the sum is the time the batch waited on its environments."""
    env_rewards: Tensor  # [N] float: the sum of its environment's step rewards
    env_scored: Tensor  # [N] bool: that sum is the response's score (the environment owns the reward)
    turn_rewards: list[list[float]]
    """[N] each step's reward, in order (verl's turn_scores for the reward function)."""
    failures: list[str | None]
    """[N] the kind of environment failure that ended the response (raised,
    timeout, invalid, crashed), None when there was none: it scores 0."""
    metrics: list[dict[str, float]]
    """[N] the environment's named counts, summed over its steps (tool_calls, ...)."""

    def __len__(self) -> int:
        return len(self.environments)

    def select(self, rows: Tensor | slice) -> "TurnStats":
        index = range(len(self))[rows] if isinstance(rows, slice) else rows.tolist()
        return TurnStats(*(getattr(self, name)[rows] if isinstance(getattr(self, name), Tensor)
                           else [getattr(self, name)[i] for i in index] for name in self.__slots__))

    @classmethod
    def concat(cls, parts: list["TurnStats"]) -> "TurnStats":
        def joined(name: str):
            values = [getattr(p, name) for p in parts]
            return torch.cat(values) if isinstance(values[0], Tensor) else [v for part in values for v in part]
        return cls(*(joined(name) for name in cls.__slots__))

    @classmethod
    def single_turn(cls, rows: int) -> "TurnStats":
        """`rows` responses of one turn each, with no environment."""
        return cls([SINGLE_TURN] * rows, torch.ones(rows, dtype=torch.long),
                   torch.zeros(rows, dtype=torch.long), torch.zeros(rows), torch.zeros(rows), torch.zeros(rows),
                   torch.zeros(rows, dtype=torch.bool), [[] for _ in range(rows)], [None] * rows,
                   [{} for _ in range(rows)])


def concat_turns(parts: list["Rollouts"]) -> TurnStats | None:
    """The parts' turn records as one (a part without one: one turn per response)."""
    if all(p.turns is None for p in parts):
        return None
    return TurnStats.concat([p.turns if p.turns is not None else TurnStats.single_turn(len(p)) for p in parts])


Sequences = tuple[Tensor, Tensor, Tensor]
"""Prompt + response as the model reads them (`Rollouts.sequences()`):
input_ids, attention_mask, position_ids, each [N, P + R]."""


@dataclass(slots=True)
class Rollouts:
    """Responses to a PromptBatch, G per prompt, grouped consecutively."""

    prompt_ids: Tensor  # [N, P] left-padded (each prompt repeated G times)
    prompt_mask: Tensor  # [N, P]
    response_ids: Tensor  # [N, R] right-padded with the pad id
    response_mask: Tensor  # [N, R] 1 up to and including EOS
    rollout_logprobs: Tensor  # [N, R] log pi(token) under the sampling temperature
    finish_reasons: list[str]
    group_ids: Tensor  # [N] index of the prompt in its PromptBatch
    samples: list[Sample]  # [N] the prompt's row, repeated per response
    model_inputs: ModelInputs | None = None
    """[N] rows: the prompts' images and M-RoPE positions (VL models)."""
    response_attention: Tensor | None = None
    """[N, R] 1 for every token of a multi-turn trajectory, the tool turns' too
    (the model reads them; `response_mask` has 0 there, so no loss or KL
    falls on them); None: one turn, where it equals `response_mask`."""
    turns: TurnStats | None = None
    """Responses of an environment loop: their environments, turns and
    environment rewards; None when no environment took part (one turn each)."""
    routed_experts: Tensor | None = None
    """[N, P + R, L, k] int16: the experts each token was routed to in the
    rollout, aligned with `sequences()` (router replay R3; zero where no token
    was fed: padding, the last sampled token); None without."""

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def trajectory_mask(self) -> Tensor:
        """[N, R] 1 for every token the model reads, sampled or inserted (tool turns)."""
        return self.response_mask if self.response_attention is None else self.response_attention

    @classmethod
    def concat(cls, parts: list["Rollouts"], *, pad_token_id: int) -> "Rollouts":
        """The responses of consecutive prompt batches as one record: each
        part's responses right-padded to the longest (pad id, mask 0,
        log-prob 0) and its group ids shifted past the previous parts'.
        Prompts must share their padded width (slices of one PromptBatch)."""
        parts = [p for p in parts if len(p)]
        width = max(p.response_ids.shape[1] for p in parts)

        def pad(t: Tensor, value) -> Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        offsets = torch.tensor([0] + [int(p.group_ids.max()) + 1 for p in parts[:-1]]).cumsum(0)
        return cls(
            prompt_ids=torch.cat([p.prompt_ids for p in parts]),
            prompt_mask=torch.cat([p.prompt_mask for p in parts]),
            response_ids=torch.cat([pad(p.response_ids, pad_token_id) for p in parts]),
            response_mask=torch.cat([pad(p.response_mask, 0) for p in parts]),
            rollout_logprobs=torch.cat([pad(p.rollout_logprobs, 0.0) for p in parts]),
            finish_reasons=[r for p in parts for r in p.finish_reasons],
            group_ids=torch.cat([p.group_ids + off for p, off in zip(parts, offsets.tolist())]),
            samples=[s for p in parts for s in p.samples],
            model_inputs=(ModelInputs.concat([p.model_inputs or ModelInputs.text_only(p.prompt_mask)
                                              for p in parts])
                          if any(p.model_inputs is not None for p in parts) else None),
            response_attention=(torch.cat([pad(p.trajectory_mask, 0) for p in parts])
                                if any(p.response_attention is not None for p in parts) else None),
            turns=concat_turns(parts),
            routed_experts=(torch.cat([torch.nn.functional.pad(
                p.routed_experts, (0, 0, 0, 0, 0, width - p.response_ids.shape[1])) for p in parts])
                if all(p.routed_experts is not None for p in parts) else None))

    def select(self, rows: Tensor) -> "Rollouts":
        """The responses at `rows` (a LongTensor), widths unchanged."""
        picks = rows.tolist()
        return Rollouts(self.prompt_ids[rows], self.prompt_mask[rows], self.response_ids[rows],
                        self.response_mask[rows], self.rollout_logprobs[rows],
                        [self.finish_reasons[i] for i in picks], self.group_ids[rows],
                        [self.samples[i] for i in picks],
                        None if self.model_inputs is None else self.model_inputs.select(rows),
                        None if self.response_attention is None else self.response_attention[rows],
                        None if self.turns is None else self.turns.select(rows),
                        None if self.routed_experts is None else self.routed_experts[rows])

    @property
    def response_lengths(self) -> Tensor:  # [N]
        """Tokens of each response, tool turns included (where the trajectory ends)."""
        return self.trajectory_mask.sum(-1)

    def sequences(self) -> Sequences:
        """(input_ids, attention_mask, position_ids), each [N, P + R]; with
        images, position_ids are M-RoPE's [N, 3, P + R] (rows first, so that
        selecting rows works alike for both)."""
        input_ids = torch.cat([self.prompt_ids, self.response_ids], dim=1)
        attention_mask = torch.cat([self.prompt_mask, self.trajectory_mask], dim=1)
        if self.model_inputs is not None:
            return input_ids, attention_mask, self.model_inputs.sequence_positions(
                self.response_ids.shape[1])
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        return input_ids, attention_mask, position_ids


@dataclass(slots=True)
class TrainBatch:
    """Everything the actor update needs, for N responses."""

    input_ids: Tensor  # [N, P + R]
    attention_mask: Tensor  # [N, P + R]
    position_ids: Tensor  # [N, P + R]; [N, 3, P + R] for M-RoPE (images)
    response_mask: Tensor  # [N, R] float, 1 for response tokens
    advantages: Tensor  # [N, R]
    old_logprobs: Tensor | None  # [N, R]; None when the update is exactly on-policy
    ref_logprobs: Tensor | None  # [N, R]; None without a KL loss
    model_inputs: ModelInputs | None = None
    """The prompts' images (VL models); None for text."""
    rollout_is_weights: Tensor | None = None
    """[N, R] algorithm.rollout_is's truncated importance weights pi_trainer /
    pi_rollout (constants), applied to each token's policy loss; None without."""
    teacher_logprobs: Tensor | None = None
    """[N, R] log pi_teacher of the sampled tokens (distillation.enabled); None without."""
    routed_experts: Tensor | None = None
    """[N, P + R, L, k] the experts the update's forward replays (router replay); None without."""

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_length(self) -> int:
        return self.response_mask.shape[1]

    def select(self, index: Tensor | slice) -> "TrainBatch":
        """The rows at `index` (a slice or a LongTensor of row numbers)."""
        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[index]
        return TrainBatch(self.input_ids[index], self.attention_mask[index],
                          self.position_ids[index], self.response_mask[index],
                          self.advantages[index], pick(self.old_logprobs),
                          pick(self.ref_logprobs),
                          None if self.model_inputs is None else self.model_inputs.select(index),
                          pick(self.rollout_is_weights), pick(self.teacher_logprobs),
                          pick(self.routed_experts))


@dataclass(slots=True)
class CriticBatch:
    """Everything the critic update needs, for N responses (PPO with a critic)."""

    input_ids: Tensor  # [N, P + R]
    attention_mask: Tensor  # [N, P + R]
    position_ids: Tensor  # [N, P + R]
    response_mask: Tensor  # [N, R] float, 1 for response tokens
    values: Tensor  # [N, R] V_old, the critic's values at rollout time
    returns: Tensor  # [N, R] GAE returns, the regression target

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_length(self) -> int:
        return self.response_mask.shape[1]

    def select(self, index: Tensor | slice) -> "CriticBatch":
        """The rows at `index` (a slice or a LongTensor of row numbers)."""
        return CriticBatch(*(getattr(self, name)[index] for name in self.__slots__))
