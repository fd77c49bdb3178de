"""A synthetic image task: arithmetic expressions rendered to PNG with Pillow.

Each row's image shows an expression such as `7 + 5 - 3`; the prompt asks
for its value in the GSM8K answer format, so the `thinkrl/arith` scorer
(`#### <answer>`) grades it. Small and made on the spot, for tests and
benchmarks of image prompts (a tiny random VL model cannot read it; the task
exercises the plumbing, not vision).
"""

from __future__ import annotations

import io
import random
from pathlib import Path

from thinkrl.data.images import PLACEHOLDER
from thinkrl.data.prep.examples import Example, to_verl_rows, write_rows
from thinkrl.data.synthetic import INSTRUCTION

DATA_SOURCE = "thinkrl/arith"
QUESTION = f"{PLACEHOLDER}What is the value of the expression in the image?"


def render(text: str, *, size: tuple[int, int] = (112, 56)) -> bytes:
    """PNG bytes of `text` in black on white (Pillow's default font)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).text((6, size[1] // 3), text, fill="black")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def examples(count: int, *, seed: int) -> list[Example]:
    """`count` expressions of two or three operands 1..9, values >= 0."""
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        terms = [rng.randint(1, 9) for _ in range(rng.choice((2, 3)))]
        expression, value = str(terms[0]), terms[0]
        for term in terms[1:]:
            op = "-" if term <= value and rng.random() < 0.5 else "+"
            value = value - term if op == "-" else value + term
            expression += f" {op} {term}"
        made.append(Example(question=QUESTION, ground_truth=str(value), data_source=DATA_SOURCE,
                            ability="math", original={"expression": expression},
                            images=(render(expression),)))
    return made


def write_splits(folder: Path, *, train: int, test: int, seed: int = 0) -> dict[str, Path]:
    """train.parquet and test.parquet in verl's schema (chat-template instruction)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, count, offset in (("train", train, 0), ("test", test, 1)):
        rows = to_verl_rows(examples(count, seed=2 * seed + offset), split=split,
                            instruction=INSTRUCTION)
        paths[split] = folder / f"{split}.parquet"
        write_rows(rows, paths[split])
    return paths
