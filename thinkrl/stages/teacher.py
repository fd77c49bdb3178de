"""The teachers' pass of on-policy distillation: each response's sampled
tokens scored by the teacher of its row (`distillation.teacher_key`, the
row's data_source), and the step's reverse KL to the teachers.

Shapes: N responses, R response tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.algos.distillation import reverse_kl_metrics
from thinkrl.config.distill_checks import Teacher
from thinkrl.metrics import StageTimer
from thinkrl.records import Rollouts, Sequences
from thinkrl.stages.logprobs import image_inputs
from thinkrl.workers.roles import TeacherRole


def teacher_rows(teachers: tuple[Teacher, ...], sources: list[str]) -> dict[str, list[int]]:
    """Row numbers per teacher: one teacher takes every row, whatever its key
    (verl renames a lone teacher's key "default"); several take the rows whose
    data_source is their key. A row no teacher takes is an error (the driver
    checks the data sets at start, so this names a bug or a new source)."""
    if len(teachers) == 1:
        return {teachers[0].name: list(range(len(sources)))}
    by_key = {t.key: t.name for t in teachers}
    rows: dict[str, list[int]] = {t.name: [] for t in teachers}
    for row, source in enumerate(sources):
        if source not in by_key:
            raise ValueError(f"row {row} has data_source {source!r}, which no teacher scores "
                             f"(keys: {', '.join(sorted(by_key))})")
        rows[by_key[source]].append(row)
    return rows


def teacher_logprobs(handle: TeacherRole | None, teachers: tuple[Teacher, ...], rollouts: Rollouts,
                     sequences: Sequences, timer: StageTimer) -> Tensor | None:
    """log pi_teacher [N, R] of every response under its row's teacher; None
    without distillation. With several teachers each scores its own rows (any
    count: a sharded pass gives a rank without rows an idle share)."""
    if handle is None:
        return None
    with timer("teacher"):
        return _scored(handle, teachers, rollouts, sequences)


def _scored(handle: TeacherRole, teachers: tuple[Teacher, ...], rollouts: Rollouts,
            sequences: Sequences) -> Tensor:
    response_length = rollouts.response_ids.shape[1]
    out = torch.zeros(rollouts.response_ids.shape, dtype=torch.float32)
    for name, rows in teacher_rows(teachers, [s.data_source for s in rollouts.samples]).items():
        if not rows:
            continue
        index, picked, images = torch.tensor(rows), sequences, image_inputs(rollouts)
        if len(rows) < len(rollouts):  # this teacher's rows only (one teacher takes them all as they are)
            picked = tuple(t[index] for t in sequences)
            images = {"model_inputs": images["model_inputs"].select(index)} if images else {}
        out[index] = handle.compute_teacher_log_prob(name, *picked, response_length=response_length,
                                                     **images).float()
    return out


def distillation_metrics(rollouts: Rollouts, student_logprobs: Tensor, teacher: Tensor | None) -> dict[str, float]:
    """The reverse KL to the teachers (`reverse_kl_metrics`), student log-probs
    from the trainer's pass when the step made one, else the engine's."""
    if teacher is None:
        return {}
    return reverse_kl_metrics(student_logprobs, teacher, rollouts.response_mask,
                              [s.data_source for s in rollouts.samples])
