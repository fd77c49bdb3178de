"""Prompts ready for the rollout engine: rendered, tokenised, length-checked,
served in seeded shuffled batches whose position a checkpoint can restore."""

from __future__ import annotations

import copy

from dataclasses import dataclass
from pathlib import Path

import torch

from thinkrl.data.files import read_rows, resolve_files
from thinkrl.data.images import ImageEncoder, RowImages, row_images
from thinkrl.data.templates import TEMPLATES, render_prompt
from thinkrl.errors import UserError
from thinkrl.records import ModelInputs, PromptBatch, Sample


@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]
    sample: Sample
    images: RowImages | None = None
    """The row's images (vision-language models), decoded when batched."""


def _truncate(ids: list[int], limit: int, side: str) -> list[int]:
    if side == "left":
        return ids[-limit:]
    if side == "right":
        return ids[:limit]
    head = limit // 2  # "middle": keep both ends
    return ids[:head] + ids[len(ids) - (limit - head):]


def load_prompts(files: str | list[str], tokenizer, *, key: str, prompt_key: str,
                 reward_fn_key: str, max_prompt_length: int, filter_overlong: bool,
                 truncation: str, chat_kwargs: dict, template: str = "chat",
                 media_keys: tuple[str, str] = ("images", "videos"),
                 images: ImageEncoder | None = None, log=print) -> list[Prompt]:
    """Read, render (with the prompt `template`, see thinkrl.data.templates)
    and tokenise every row of `files` (the value of config `key`). Rows with
    images (column `media_keys[0]`) need `images`, the model's encoder; the
    vision tokens count towards max_prompt_length."""
    if template not in TEMPLATES:  # before reading any file
        raise UserError(f"{key}: unknown prompt template {template!r}; known templates: "
                         f"{', '.join(TEMPLATES)}")
    prompts: list[Prompt] = []
    too_long: list[tuple[int, Path, int]] = []
    for path in resolve_files(files, key=key):
        for index, row in enumerate(read_rows(path, prompt_key=prompt_key,
                                              reward_fn_key=reward_fn_key)):
            try:
                text = render_prompt(template, tokenizer, row[prompt_key], chat_kwargs)
                pictures = row_images(row, image_key=media_keys[0], video_key=media_keys[1],
                                      encoder=images, where=f"{path}, row {index}")
                if pictures is None:
                    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                else:
                    ids = images.prompt_ids(text, pictures.open())
            except ValueError as err:
                raise UserError(f"{key}: {path}, row {index}: {err}") from None
            if len(ids) > max_prompt_length:
                too_long.append((len(ids), path, index))
                if filter_overlong:
                    continue
                if truncation != "error":
                    if pictures is not None:  # a cut image would not match its pixels
                        raise UserError(
                            f"{key}: {path}, row {index}: the prompt with its image tokens has "
                            f"{len(ids)} tokens, over data.max_prompt_length={max_prompt_length}, "
                            "and image prompts cannot be truncated. Raise data.max_prompt_length, "
                            "lower data.max_pixels, or set data.filter_overlong_prompts=True")
                    ids = _truncate(ids, max_prompt_length, truncation)
            sample = Sample(data_source=row[reward_fn_key],
                            ground_truth=str(row["reward_model"]["ground_truth"]),
                            prompt_text=text, extra_info=dict(row.get("extra_info") or {}),
                            index=index, images=pictures.values if pictures else (),
                            messages=_messages(row[prompt_key]))
            prompts.append(Prompt(ids=ids, sample=sample, images=pictures))
    if too_long and not filter_overlong and truncation == "error":
        longest, path, index = max(too_long)
        raise UserError(
            f"{key}: {len(too_long)} prompt(s) are longer than data.max_prompt_length="
            f"{max_prompt_length} tokens after the template; the longest has {longest} tokens "
            f"({path}, row {index}). Raise data.max_prompt_length, set "
            "data.filter_overlong_prompts=True to drop them, or data.truncation=left|right|middle.")
    if too_long:
        action = "dropped" if filter_overlong else f"truncated ({truncation})"
        log(f"{key}: {len(too_long)} prompt(s) over {max_prompt_length} tokens {action}")
    if not prompts:
        raise UserError(f"{key}: no prompt is left after filtering; raise data.max_prompt_length")
    return prompts


def _messages(prompt) -> tuple:
    """The prompt's chat messages as plain dicts (a text prompt: none)."""
    if not isinstance(prompt, (list, tuple)):
        return ()
    return tuple({k: v for k, v in dict(m).items() if v is not None} for m in prompt if isinstance(m, dict))


def collate(prompts: list[Prompt], *, pad_token_id: int) -> PromptBatch:
    """Left-pad to the longest prompt of the batch."""
    width = max(len(p.ids) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        input_ids[row, width - len(p.ids):] = torch.tensor(p.ids, dtype=torch.long)
        mask[row, width - len(p.ids):] = 1
    return PromptBatch(input_ids=input_ids, attention_mask=mask, samples=[p.sample for p in prompts],
                       model_inputs=batch_images(prompts))


def batch_images(prompts: list[Prompt]) -> ModelInputs | None:
    """The pixels of the prompts' images, per row; None when no prompt has one."""
    encoders = [p.images.encoder for p in prompts if p.images is not None]
    if not encoders:
        return None
    pixels, grids = [], []
    for p in prompts:
        values, grid = (p.images.pixels() if p.images is not None
                        else encoders[0].pixels([]))
        expected = sum(1 for i in p.ids if i == encoders[0].image_token_id)
        # The token count was decided when the row was read; the pixels must fit it.
        assert int(grid.prod(-1).sum()) // encoders[0].merge ** 2 == expected, p.sample.index
        pixels.append(values)
        grids.append(grid)
    return ModelInputs(pixels, grids)


class PromptLoader:
    """Batches of `batch_size` prompts; each epoch a new seeded permutation.
    An incomplete last batch is dropped (as verl does) so every step is full."""

    def __init__(self, prompts: list[Prompt], *, batch_size: int, shuffle: bool, seed: int,
                 pad_token_id: int) -> None:
        if len(prompts) < batch_size:
            raise UserError(f"the training set has {len(prompts)} prompts, fewer than "
                             f"data.train_batch_size={batch_size}; lower data.train_batch_size")
        self.prompts, self.batch_size, self.shuffle, self.seed = prompts, batch_size, shuffle, seed
        self.pad_token_id = pad_token_id
        self.epoch, self.position = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return len(self.prompts) // self.batch_size

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.prompts)))
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.prompts), generator=gen).tolist()

    def next_batch(self) -> PromptBatch:
        if self.position >= self.batches_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        order = self._order()
        start = self.position * self.batch_size
        self.position += 1
        return collate([self.prompts[i] for i in order[start:start + self.batch_size]],
                       pad_token_id=self.pad_token_id)

    def batch_at(self, state: dict) -> PromptBatch:
        """The batch `next_batch` draws from `state` (a `state_dict`), without
        moving this loader: a checkpointed batch's prompts, drawn again."""
        loader = copy.copy(self)
        loader.load_state_dict(state)
        return loader.next_batch()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        if "cursor" in state:
            raise UserError("the checkpoint's data position was saved with data.mixture, which this run "
                             "does not set; resume with the same data.mixture, or set "
                             "trainer.resume_mode=disable")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def batches(prompts: list[Prompt], *, batch_size: int, pad_token_id: int):
    """Every prompt once, in order (validation)."""
    for start in range(0, len(prompts), batch_size):
        yield collate(prompts[start:start + batch_size], pad_token_id=pad_token_id)
