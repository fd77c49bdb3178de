"""The teachers of on-policy distillation, checked before anything loads:
each model found (a folder, a hub id or a `builtin:` name), its tokenizer
the student's own, and every training row scored by one of them.

The teacher scores the student's token ids, so the two must share one
tokenizer: cross-tokenizer distillation is out of scope (docs/distillation.md).
"""

from __future__ import annotations

from thinkrl.builtin import resolve_model_path
from thinkrl.config import Config
from thinkrl.config.distill_checks import Teacher, teachers_of
from thinkrl.errors import SetupError, UserError
from thinkrl.models.loading import load_tokenizer
from thinkrl.stages.teacher import teacher_rows

FIX_TOKENIZER = ("on-policy distillation scores the student's token ids with the teacher, so both need the "
                 "same tokenizer (cross-tokenizer distillation is not supported); pick a teacher of the "
                 "student's model family")


def resolve_teachers(cfg: Config, student_tokenizer, *, log=print) -> tuple[Teacher, ...]:
    """The run's teachers with their model paths resolved, each checked; ()
    without distillation. Raises SetupError naming the teacher's key."""
    resolved = []
    for teacher in teachers_of(cfg):
        name = f"distillation.teacher_models.{teacher.name}.model_path"
        key = f"{name}={teacher.model_path}"
        path = resolve_model_path(teacher.model_path, log=log)
        try:
            tokenizer = load_tokenizer(path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
        except UserError as err:  # its text names the policy's key: this is the teacher's
            said = str(err).replace(f"actor_rollout_ref.model.path={path!r}: ", "")
            raise SetupError(f"{key}: {said}", "point it at the teacher's Hugging Face folder (config, "
                             "weights and tokenizer files) or hub id") from None
        mismatch = tokenizer_mismatch(student_tokenizer, tokenizer)
        if mismatch is not None:
            raise SetupError(f"{key}: its tokenizer is not the student's ({mismatch})", FIX_TOKENIZER)
        resolved.append(Teacher(teacher.name, teacher.key, path))
    if resolved:
        log("distillation: " + ", ".join(f"teacher {t.name} ({t.model_path}"
                                        + (f", rows of data_source {t.key})" if t.key else ", every row)")
                                        for t in resolved))
    return tuple(resolved)


def tokenizer_mismatch(student, teacher) -> str | None:
    """Why two tokenizers would give a token id different meanings; None when they agree."""
    mine, theirs = student.get_vocab(), teacher.get_vocab()
    if mine == theirs:
        return None
    if len(mine) != len(theirs):
        return f"{len(theirs)} tokens against the student's {len(mine)}"
    token = next(t for t in sorted(mine) if theirs.get(t) != mine[t])
    return f"{token!r} is id {mine[token]} for the student and {theirs.get(token)} for the teacher"


def check_teacher_sources(teachers: tuple[Teacher, ...], sources: list[str], *, key: str) -> None:
    """Every training row's data_source has a teacher (each teacher's `key`);
    `key` names the data files in the error."""
    if not teachers:
        return
    try:
        teacher_rows(teachers, sources)
    except ValueError:
        keys = {t.key for t in teachers}
        missing = sorted({s for s in sources if s not in keys})
        raise SetupError(f"{key}: rows of data_source {', '.join(missing)} have no teacher (the teachers' keys: "
                         f"{', '.join(sorted(str(k) for k in keys))})",
                         "add a teacher for each (+distillation.teacher_models.NAME.key=SOURCE and "
                         "+distillation.teacher_models.NAME.model_path=PATH), or one teacher without a key "
                         "for every row") from None
