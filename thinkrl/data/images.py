"""Image prompts in verl's schema, for Qwen2.5-VL / Qwen2-VL policies.

A row's `data.image_key` column (default `images`) lists its images, each
`{"bytes": b"..."}` (how parquet stores them), `{"path": "..."}`, a path or
raw bytes; its prompt text marks where each goes with `<image>`. After the
chat template, each `<image>` becomes `<|vision_start|><|image_pad|><|vision_end|>`
(what Qwen-VL's own chat template writes for an image item) and each
`<|image_pad|>` is then repeated once per merged patch of its image:
`grid_t * grid_h * grid_w // merge_size**2` tokens, after the image is resized
within `data.min_pixels`..`data.max_pixels` (Qwen's processor arguments).

With torchvision installed, the model folder's own `AutoProcessor` expands
the text; without it (transformers' Qwen2.5-VL processor needs torchvision
for its video half), the image processor and the tokenizer do it here, with
the same result (tests/data/test_images.py). Pixels are computed when a batch
is formed, not when the data set is read: a data set's pixels would not fit
in memory.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from thinkrl.errors import UserError

PLACEHOLDER = "<image>"
VISION_SPAN = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGE_PAD = "<|image_pad|>"


class ImageEncoder:
    """Turns a prompt's text and images into token ids and pixels for one model."""

    def __init__(self, image_processor, tokenizer, *, processor=None) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.processor = processor
        """The model's AutoProcessor when it could be built (torchvision present)."""
        self.merge = image_processor.merge_size
        self.patch_dim = 3 * image_processor.temporal_patch_size * image_processor.patch_size ** 2
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)

    @classmethod
    def from_model(cls, path: str, tokenizer, *, min_pixels: int | None = None,
                   max_pixels: int | None = None, trust_remote_code: bool = False
                   ) -> "ImageEncoder":
        from transformers import AutoImageProcessor, AutoProcessor

        from thinkrl.errors import SetupError

        sizes = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels))
                 if v is not None}
        try:
            image_processor = AutoImageProcessor.from_pretrained(
                path, trust_remote_code=trust_remote_code, **sizes)
        except (OSError, ValueError) as err:
            raise SetupError(f"actor_rollout_ref.model.path={path!r} has no image processor "
                             f"({str(err).splitlines()[0]})",
                             "copy the model's preprocessor_config.json into the folder") from None
        processor = None
        try:
            processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code,
                                                      **sizes)
            processor.tokenizer = tokenizer  # the run's tokenizer (chat template, pad)
        except (ImportError, OSError, ValueError, AttributeError):
            processor = None  # no torchvision: expand the image tokens ourselves
        if tokenizer.convert_tokens_to_ids(IMAGE_PAD) in (None, tokenizer.unk_token_id):
            raise SetupError(f"the tokenizer of {path} has no {IMAGE_PAD} token",
                             "use the model's own tokenizer (Qwen2.5-VL's)")
        return cls(image_processor, tokenizer, processor=processor)

    def tokens_per_image(self, image) -> int:
        """Vision tokens of one image after resizing: grid_h * grid_w // merge**2."""
        patches = self.image_processor.get_number_of_image_patches(image.height, image.width, {})
        return patches // self.merge ** 2

    def prompt_ids(self, text: str, images: list) -> list[int]:
        """Token ids of a rendered prompt whose `<image>` marks stand for `images`."""
        spans = text.count(PLACEHOLDER)
        if spans != len(images):
            raise UserError(f"the prompt has {spans} {PLACEHOLDER} mark(s) but the row has "
                             f"{len(images)} image(s); put one {PLACEHOLDER} where each image goes")
        text = text.replace(PLACEHOLDER, VISION_SPAN)
        if self.processor is not None:
            ids = self.processor(text=[text], images=images or None)["input_ids"][0]
            return [int(i) for i in ids]
        parts = text.split(IMAGE_PAD)
        expanded = parts[0]
        for image, part in zip(images, parts[1:]):
            expanded += IMAGE_PAD * self.tokens_per_image(image) + part
        return self.tokenizer(expanded, add_special_tokens=False)["input_ids"]

    def pixels(self, images: list) -> tuple[Tensor, Tensor]:
        """`pixel_values` [Q, D] and `image_grid_thw` [I, 3] of one row's images."""
        if not images:
            return torch.zeros(0, self.patch_dim), torch.zeros(0, 3, dtype=torch.long)
        out = self.image_processor(images=images, return_tensors="pt")
        return out["pixel_values"].float(), out["image_grid_thw"].long()


@dataclass(frozen=True)
class RowImages:
    """One row's images as stored (bytes or paths), decoded when a batch needs them."""

    values: tuple
    encoder: ImageEncoder
    where: str
    """File and row, for error messages."""

    def __len__(self) -> int:
        return len(self.values)

    def open(self) -> list:
        return [open_image(v, where=self.where) for v in self.values]

    def pixels(self) -> tuple[Tensor, Tensor]:
        return self.encoder.pixels(self.open())


def image_source(value):
    """What a verl image cell holds: its bytes, or its path (`{"bytes": ...}`,
    `{"path": ...}`, `{"image": ...}`, or the bytes or path themselves)."""
    if isinstance(value, dict):
        return value.get("bytes") or value.get("path") or value.get("image")
    return value


def open_image(value, *, where: str):
    """A PIL RGB image from a verl image cell: {"bytes": ...}, {"path": ...},
    {"image": ...}, raw bytes or a path."""
    from PIL import Image

    value = image_source(value)
    try:
        if isinstance(value, (bytes, bytearray)):
            image = Image.open(io.BytesIO(value))
        elif isinstance(value, (str, Path)):
            image = Image.open(Path(str(value).removeprefix("file://")).expanduser())
        else:
            raise UserError(f"expected bytes or a path, found {type(value).__name__}")
        return image.convert("RGB")
    except (OSError, ValueError) as err:
        raise UserError(f"{where}: an image does not open ({err}); images are "
                         "{'bytes': ...} or {'path': ...} cells, or paths") from None


def row_images(row: dict, *, image_key: str, video_key: str, encoder: ImageEncoder | None,
               where: str) -> RowImages | None:
    """The row's images (None when it has none); refuses videos, and images
    for a text-only model."""
    if row.get(video_key):
        raise UserError(f"{where}, column {video_key!r} holds videos; thinkrl trains on text "
                         "and image prompts (videos later). Drop the column or the rows.")
    values = row.get(image_key)
    if not values:
        return None
    if isinstance(values, (bytes, str, dict)):
        values = [values]
    if encoder is None:
        raise UserError(f"{where}, column {image_key!r} holds images, but the model is "
                         "text-only. Use a vision-language model (Qwen2.5-VL, Qwen2-VL) or "
                         "a text-only data set.")
    return RowImages(tuple(values), encoder, where)


def vision_tokens(height: int, width: int, *, min_pixels: int, max_pixels: int,
                  patch: int = 14, merge: int = 2) -> int:
    """Qwen-VL's token count of an image of `height` x `width` pixels: both
    sides rounded to multiples of patch * merge (28), then scaled to keep the
    area within [min_pixels, max_pixels]; tokens = (h / 28) * (w / 28).
    For the doctor's estimates (the processor itself decides at run time)."""
    unit = patch * merge
    h, w = max(unit, round(height / unit) * unit), max(unit, round(width / unit) * unit)
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(unit, math.floor(height / scale / unit) * unit)
        w = max(unit, math.floor(width / scale / unit) * unit)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * scale / unit) * unit, math.ceil(width * scale / unit) * unit
    return (h // unit) * (w // unit)


def check_image_backend(cfg, prompts) -> None:
    """Image prompts under trainer.backend=ray need a frozen vision tower:
    FSDP2 then gathers it with the root on every rank (a rank whose rows hold
    no image never calls it), and no rank's gradient for it can be missing
    from the others' reduction. Text prompts on a VL model need nothing."""
    from thinkrl.config.checks import execution_backend
    from thinkrl.errors import SetupError

    if execution_backend(cfg) != "ray" or cfg.actor_rollout_ref.model.freeze_vision_tower:
        return
    with_images = next((p for p in prompts if p.images is not None), None)
    if with_images is not None:
        raise SetupError(
            f"{with_images.images.where} has images; over several devices (trainer.backend=ray, "
            f"{cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes} devices) image prompts train "
            "the language model only",
            "set actor_rollout_ref.model.freeze_vision_tower=True, or train on one device "
            "(trainer.n_gpus_per_node=1 trainer.nnodes=1)")


THUMBNAIL_PIXELS = 160
"""Longest side of the thumbnails in generation logs and the report."""


def thumbnail_uri(value, *, size: int = THUMBNAIL_PIXELS) -> str:
    """A small PNG of an image cell as a data URI (for generations/*.jsonl);
    an image that does not open gives an empty string."""
    import base64

    try:
        image = open_image(value, where="thumbnail")
    except ValueError:
        return ""
    image.thumbnail((size, size))
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")
