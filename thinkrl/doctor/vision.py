"""Vision-language checks: the model type, its processor and image tokens, and
prompt lengths with the vision tokens counted.

For a text-only model these rows say so (or fail when the data holds
images). Image sizes are read from the files' headers (no decoding) and
turned into token counts by the image processor the run uses, so what
passes here loads at start.
"""

from __future__ import annotations

from thinkrl.assets import run_image_encoder
from thinkrl.doctor.context import DoctorContext, NotChecked
from thinkrl.doctor.core import CheckResult, fail, ok, warn
from thinkrl.doctor.data import KEYS, SAMPLED_ROWS, dataset_of

VISION_TOKEN_NAMES = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
LARGE_IMAGE_TOKENS = 4096
"""Vision tokens per image above which max_pixels deserves a warning (Qwen2.5-VL's
preprocessor allows 16,384: one image could fill a prompt many times over)."""


def _is_vision(ctx: DoctorContext) -> bool:
    from thinkrl.models.vision import SUPPORTED

    config = ctx.model_config
    if getattr(config, "vision_config", None) is None:
        return False
    if config.model_type not in SUPPORTED:
        raise NotChecked(f"the model type {config.model_type!r} is not supported: see vision/model")
    return True


def _rows_with_images(ctx: DoctorContext, key: str) -> list[tuple[int, dict]]:
    image_key = ctx.cfg.data.image_key
    return [(i, row) for i, row in enumerate(dataset_of(ctx, key).rows) if row.get(image_key)]


def _encoder(ctx: DoctorContext):
    def compute():

        try:
            return run_image_encoder(ctx.cfg, ctx.tokenizer, model_path=ctx.model_path)
        except ValueError as err:
            ctx.memo["processor-error"] = err
            raise NotChecked("needs the image processor: see vision/processor") from None
    return ctx.remember("image-encoder", compute)


def check_model(ctx: DoctorContext) -> CheckResult:
    """A VL model is one thinkrl trains; image data needs a VL model."""
    from thinkrl.models.vision import SUPPORTED

    config = ctx.model_config
    with_images = [key for key in KEYS if _safe_rows(ctx, key)]
    if getattr(config, "vision_config", None) is None:
        if with_images:
            return fail("vision/model", f"{', '.join(with_images)} hold images, but the model "
                        f"({config.model_type}) is text-only",
                        "use a vision-language model (Qwen2.5-VL, Qwen2-VL) or text data")
        return ok("vision/model", f"text-only model ({config.model_type}); text prompts only")
    if config.model_type not in SUPPORTED:
        return fail("vision/model", f"{config.model_type} is a vision-language model thinkrl "
                    "cannot train yet", f"use {', '.join(SUPPORTED.values())}")
    images = f"image prompts in {', '.join(with_images)}" if with_images else "text prompts"
    return ok("vision/model", f"{SUPPORTED[config.model_type]} ({config.model_type}); {images}")


def _safe_rows(ctx: DoctorContext, key: str) -> list:
    try:
        return _rows_with_images(ctx, key)
    except NotChecked:
        return []  # data/schema reports unreadable files


def check_processor(ctx: DoctorContext) -> CheckResult | list[CheckResult]:
    """The image processor loads, and the tokenizer has the vision tokens."""
    if not _is_vision(ctx):
        return []
    try:
        encoder = _encoder(ctx)
    except NotChecked:
        err = ctx.memo.get("processor-error")
        found, _, fix = str(err).partition("; ")
        return fail("vision/processor", found, fix or "see the message")
    tokenizer = ctx.tokenizer
    missing = [t for t in VISION_TOKEN_NAMES
               if len(tokenizer.encode(t, add_special_tokens=False)) != 1]
    if missing:
        return fail("vision/processor", f"the tokenizer lacks {', '.join(missing)} as single tokens",
                    "use the model's own tokenizer (data.tokenizer / model.tokenizer_path unset)")
    path = ("the model's AutoProcessor" if encoder.processor is not None else
            f"{type(encoder.image_processor).__name__} + the tokenizer (no torchvision: "
            "thinkrl expands <|image_pad|> itself)")
    size = encoder.image_processor.size
    return ok("vision/processor", f"{path}; images resized within {size.shortest_edge}.."
              f"{size.longest_edge} pixels (data.min_pixels / data.max_pixels)")


def _length_row(ctx: DoctorContext, key: str) -> CheckResult | None:
    """Prompt tokens with each image's vision tokens, against max_prompt_length."""
    from thinkrl.data.images import open_image
    from thinkrl.data.templates import render_prompt

    rows = _rows_with_images(ctx, key)
    if not rows:
        return None
    data, encoder = ctx.cfg.data, _encoder(ctx)
    template = dataset_of(ctx, key).template
    step = max(1, len(rows) // SAMPLED_ROWS)
    longest, over, most_per_image = 0, 0, 0
    for index, row in rows[::step]:
        where = f"{key}, row {index}"
        try:
            text = render_prompt(template, ctx.tokenizer, row[data.prompt_key],
                                 data.apply_chat_template_kwargs)
            images = [open_image(v, where=where) for v in row[data.image_key]]
        except ValueError as err:
            return fail("vision/prompt-length", str(err), "fix the row or re-run the preprocessing")
        per_image = [encoder.tokens_per_image(image) for image in images]
        # The text's tokens (each <image> mark becomes the 3 vision markers) plus the pads.
        length = len(ctx.tokenizer(text, add_special_tokens=False)["input_ids"]) + sum(per_image)
        longest, over = max(longest, length), over + (length > data.max_prompt_length)
        most_per_image = max([most_per_image, *per_image])
    found = (f"{key}: longest image prompt ~{longest} tokens ({most_per_image} vision tokens in "
             f"its largest image), data.max_prompt_length={data.max_prompt_length}; {over} of "
             f"{len(rows[::step])} sampled over")
    if over and not data.filter_overlong_prompts:
        return fail("vision/prompt-length", found, "image prompts cannot be truncated: raise "
                    "data.max_prompt_length, lower data.max_pixels, or set "
                    "data.filter_overlong_prompts=True")
    if over:
        return warn("vision/prompt-length", found + "; they will be dropped",
                    "raise data.max_prompt_length or lower data.max_pixels to keep them")
    if most_per_image > LARGE_IMAGE_TOKENS and data.max_pixels is None:
        return warn("vision/prompt-length", found + "; one image may take many tokens",
                    f"set data.max_pixels (e.g. {1024 * 28 * 28}: 1,024 tokens per image)")
    return ok("vision/prompt-length", found)


def check_prompt_length(ctx: DoctorContext) -> list[CheckResult]:
    if not _is_vision(ctx):
        return []
    results = []
    for key in KEYS:
        try:
            row = _length_row(ctx, key)
        except NotChecked as why:
            row = CheckResult("vision/prompt-length", "skip", f"{key}: {why}")
        if row is not None:
            results.append(row)
    return results


CHECKS = [check_model, check_processor, check_prompt_length]
