"""Sample generations saved as JSON lines, so a run can be read, not just plotted.

`<run dir>/generations/train_step_{N}.jsonl` and `val_step_{N}.jsonl`: one
object per response with the keys of `Generation` plus `step`.
`thinkrl eval` writes every generation the same way into its `--out` folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from thinkrl.atomic import atomic_path
from thinkrl.errors import UserError
from thinkrl.records import SINGLE_TURN, Rollouts, Sample

KINDS = ("train", "val")


@dataclass(frozen=True, slots=True)
class Generation:
    """One scored response, with the row it answers."""

    data_source: str
    prompt: str
    """The prompt text after the template, as the model saw it."""
    response: str
    ground_truth: str
    score: float
    response_length: int
    """Response tokens, EOS included."""
    finish_reason: str
    """"stop" (wrote EOS) or "length" (hit the response length limit)."""
    prompt_index: int
    """Which prompt of the evaluated set (or of the training batch) this answers;
    responses with the same value are samples of the same prompt."""
    row: int
    """Row number of the prompt in its data file."""
    accuracy: float | None = None
    """The scorer's accuracy part when it reports one (r1: 1.0 for a right
    answer, whatever the format); None when the score is all there is."""
    images: tuple[str, ...] = ()
    """Thumbnails of the prompt's images (PNG data URIs), for the report."""
    environment: str = SINGLE_TURN
    """The environment the response talked to."""
    turns: int = 2
    """verl's num_turns: the prompt's, the model's and the environment's turns."""
    env_failure: str | None = None
    """The kind of environment failure that ended it (then it scored 0)."""


def generations_from_rollouts(rollouts: Rollouts, *, texts: Sequence[str],
                              scores: Sequence[float], prompt_offset: int = 0,
                              parts: Sequence[dict[str, float]] | None = None
                              ) -> list[Generation]:
    """One Generation per response of `rollouts` ([N]); `texts` and `scores`
    are the decoded responses and their scores, both [N]; `parts` the named
    parts a scorer reported beside each score ([N], optional). `prompt_offset`
    is added to the batch's group ids (to number prompts across batches)."""
    if not len(texts) == len(scores) == len(rollouts):
        raise ValueError(f"{len(rollouts)} rollouts but {len(texts)} texts and "
                         f"{len(scores)} scores; pass one of each per response")
    lengths = rollouts.response_lengths.tolist()
    groups = rollouts.group_ids.tolist()
    accuracies = [p.get("accuracy") for p in parts] if parts else [None] * len(texts)
    thumbnails = Thumbnails()
    turns = rollouts.turns
    environments = turns.environments if turns else [SINGLE_TURN] * len(texts)
    counts = ((turns.assistant_turns + turns.env_turns + 1).tolist() if turns else [2] * len(texts))
    failures = turns.failures if turns else [None] * len(texts)
    return [Generation(data_source=sample.data_source, prompt=sample.prompt_text,
                       response=text, ground_truth=sample.ground_truth, score=float(score),
                       response_length=int(length), finish_reason=reason,
                       prompt_index=prompt_offset + int(group), row=sample.index,
                       accuracy=accuracy, images=thumbnails.of(sample), environment=environment,
                       turns=int(count), env_failure=failure)
            for sample, text, score, length, reason, group, accuracy, environment, count, failure
            in zip(rollouts.samples, texts, scores, lengths, rollouts.finish_reasons, groups,
                   accuracies, environments, counts, failures)]


class Thumbnails:
    """Thumbnails of samples' images, made once per prompt (its G responses share them)."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[str, ...]] = {}

    def of(self, sample: Sample) -> tuple[str, ...]:
        if not sample.images:
            return ()
        key = id(sample.images)
        if key not in self._made:
            from thinkrl.data.images import thumbnail_uri
            self._made[key] = tuple(u for u in map(thumbnail_uri, sample.images) if u)
        return self._made[key]


def select_generations(generations: Sequence[Generation], count: int) -> list[Generation]:
    """`count` generations spread evenly over the list (deterministic): with
    G responses per prompt grouped consecutively and count <= prompts, each
    comes from a different prompt. count <= 0 selects none; count >= len all."""
    total = len(generations)
    if count <= 0:
        return []
    if count >= total:
        return list(generations)
    return [generations[i * total // count] for i in range(count)]


def save_generations(run_dir: str | Path, kind: str, step: int,
                     generations: Sequence[Generation]) -> Path:
    """Write `<run_dir>/generations/{kind}_step_{step}.jsonl` (replacing a file
    of the same step, e.g. after a resume) and return its path."""
    if kind not in KINDS:
        raise UserError(f"generations kind {kind!r}: use one of {', '.join(KINDS)}")
    path = Path(run_dir) / "generations" / f"{kind}_step_{step}.jsonl"
    return write_jsonl(path, generations, step=step)


def log_train_generations(run_dir: str | Path, step: int, rollouts: Rollouts, *,
                          texts: Sequence[str], scores: Sequence[float], count: int,
                          every: int) -> Path | None:
    """trainer.log_train_generations (`count`) responses of this step's
    rollouts, spread over its prompts, every trainer.generations_log_freq
    (`every`) steps; returns the file written, or None when not due."""
    if count <= 0 or every <= 0 or step % every != 0:
        return None
    generations = generations_from_rollouts(rollouts, texts=texts, scores=scores)
    return save_generations(run_dir, "train", step, select_generations(generations, count))


def log_val_generations(run_dir: str | Path, step: int, generations: Sequence[Generation], *,
                        count: int) -> Path | None:
    """trainer.log_val_generations (`count`) of a validation's generations,
    spread over its prompts; None when count is 0."""
    if count <= 0:
        return None
    return save_generations(run_dir, "val", step, select_generations(generations, count))


def write_jsonl(path: str | Path, generations: Sequence[Generation], *,
                step: int | None = None) -> Path:
    """One JSON object per generation (with `step` first when given). Written
    to a temporary file and renamed, so a reader never sees half a file."""
    path = Path(path)
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for generation in generations:
            record = asdict(generation)
            if not record["images"]:  # text prompts: the file stays as it was
                del record["images"]
            if step is not None:
                record = {"step": step, **record}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict]:
    """The objects of a generations file, in order."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
