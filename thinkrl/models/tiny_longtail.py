"""The tiny model of the built-in long-tail task (`thinkrl.data.longtail`):
the built-in tiny model's recipe (tokenizer, Qwen2 shape, worked and
one-step answers) pretrained on problems of 1-3 and 10-16 steps, so its
responses are as long as the problems it is given."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from thinkrl.data import longtail
from thinkrl.models.tiny import TinyModelSpec, build_on_problems


@dataclass(frozen=True)
class LongTailModelSpec(TinyModelSpec):
    task: str = "longtail"
    build_version: int = 1


def build_longtail_model(out_dir: str | Path, spec: LongTailModelSpec = LongTailModelSpec(), *,
                         log=print) -> Path:
    """Tokenizer + Qwen2 model + pretraining on long-tailed problems, saved atomically."""
    problems, _ = longtail.split_problems(train=spec.pretrain_problems, test=longtail.TEST_SIZE)
    return build_on_problems(problems, Path(out_dir), spec, name="tiny long-tail model", log=log)
