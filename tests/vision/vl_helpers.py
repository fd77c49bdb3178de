"""Images and prompt batches for the vision-language tests."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw


def png(text: str, *, size: tuple[int, int] = (112, 56)) -> bytes:
    """A white PNG with `text` drawn in black (Pillow's default font)."""
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).text((4, size[1] // 3), text, fill="black")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
