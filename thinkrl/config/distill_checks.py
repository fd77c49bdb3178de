"""Checks of ``distillation.*`` and the teachers they name, as typed records.

``teachers_of`` reads verl's free-form ``distillation.teacher_models``
mapping into `Teacher` records (the only form the rest of thinkrl sees);
``distillation_problems`` lists what is wrong, key by key, for `validate`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from thinkrl.config.schema import Config
from thinkrl.config.schema_distill import TEACHER_INFERENCE_KEYS, TEACHER_KEYS

ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""distillation_loss.loss_mode values thinkrl implements (verl's single-sample estimators)."""
_PREFIX = "distillation.teacher_models"
_LOSS = "distillation.distillation_loss"


@dataclass(frozen=True)
class Teacher:
    """One frozen teacher: its entry name, the ``teacher_key`` value of the rows it
    scores (None: every row) and its model (a folder or hub id; ``builtin:`` names
    are resolved by the driver)."""

    name: str
    key: str | None
    model_path: str


def teachers_of(cfg: Config) -> tuple[Teacher, ...]:
    """The teachers of an enabled run (entries with a model_path), in name order;
    () when distillation is off. Entries are assumed checked (`distillation_problems`)."""
    dist = cfg.distillation
    if not dist.enabled:
        return ()
    return tuple(Teacher(name, entry.get("key"), str(entry["model_path"]))
                 for name, entry in sorted(dist.teacher_models.items())
                 if isinstance(entry, dict) and entry.get("model_path"))


def needs_reference(cfg: Config) -> bool:
    """A KL term to the reference is computed: the KL loss (unless pure
    on-policy distillation drops the task loss it belongs to, as verl does)
    or the KL penalty in the reward. The run builds the reference then, and
    the doctor counts it."""
    kl_loss_counts = not cfg.distillation.enabled or cfg.distillation.distillation_loss.use_task_rewards
    return cfg.actor_rollout_ref.actor.use_kl_loss and kl_loss_counts or cfg.algorithm.use_kl_in_reward


def distillation_problems(cfg: Config) -> list[str]:
    """What is wrong with ``distillation.*`` ("  - key=value: fix" lines)."""
    dist, loss = cfg.distillation, cfg.distillation.distillation_loss
    if not dist.enabled:
        return []
    problems: list[str] = []
    mode = loss.loss_mode
    if mode == "forward_kl_topk":
        problems.append(f"  - {_LOSS}.loss_mode=forward_kl_topk: the top-k forward KL needs the teacher's "
                        "top-k log-probs at every position, which thinkrl's teacher pass does not return yet; "
                        "use k3 (minimised directly) or k1 with use_policy_gradient=True")
    elif mode not in ESTIMATOR_MODES:
        problems.append(f"  - {_LOSS}.loss_mode={mode}: use one of {', '.join(ESTIMATOR_MODES)}")
    elif mode in ("k1", "kl") and not loss.use_policy_gradient:
        problems.append(f"  - {_LOSS}.loss_mode={mode} with use_policy_gradient=False: the gradient of "
                        "log pi_student - log pi_teacher does not depend on the teacher at all; use k3 (or k2), "
                        "or set use_policy_gradient=True (k1 as a per-token reward)")
    if loss.policy_loss_mode != "vanilla":
        problems.append(f"  - {_LOSS}.policy_loss_mode={loss.policy_loss_mode}: only vanilla (PPO's clip) is "
                        "implemented for the distillation term, as in verl")
    if loss.distillation_loss_coef < 0:
        problems.append(f"  - {_LOSS}.distillation_loss_coef={loss.distillation_loss_coef}: use a weight >= 0")
    if loss.loss_max_clamp is not None and loss.loss_max_clamp <= 0:
        problems.append(f"  - {_LOSS}.loss_max_clamp={loss.loss_max_clamp}: use a bound > 0, or null")
    for name in ("clip_ratio_low", "clip_ratio_high"):
        if not 0 < getattr(loss, name) < 1:
            problems.append(f"  - {_LOSS}.{name}={getattr(loss, name)}: use a value in (0, 1), e.g. 0.2")
    if dist.teacher_key != "data_source":
        problems.append(f"  - distillation.teacher_key={dist.teacher_key}: thinkrl routes rows to teachers by "
                        "their data_source column only; set distillation.teacher_key=data_source and give "
                        "each teacher the data_source of its rows as its key")
    problems.extend(_teacher_problems(cfg))
    return problems


def _teacher_problems(cfg: Config) -> list[str]:
    entries = cfg.distillation.teacher_models
    problems: list[str] = []
    for name, entry in sorted(entries.items()):
        if not isinstance(entry, dict):
            problems.append(f"  - {_PREFIX}.{name}={entry}: each teacher is a mapping, e.g. "
                            f"+{_PREFIX}.{name}.model_path=PATH")
            continue
        for key in sorted(set(entry) - set(TEACHER_KEYS)):
            close = difflib.get_close_matches(key, TEACHER_KEYS, n=1)
            hint = f"did you mean {close[0]}?" if close else f"a teacher has {', '.join(TEACHER_KEYS)}"
            problems.append(f"  - {_PREFIX}.{name}.{key}: unknown teacher key; {hint}")
        inference = entry.get("inference") or {}
        if isinstance(inference, dict):
            for key in sorted(set(inference) - set(TEACHER_INFERENCE_KEYS)):
                problems.append(f"  - {_PREFIX}.{name}.inference.{key}: unknown key (verl's teacher inference "
                                f"keys: {', '.join(TEACHER_INFERENCE_KEYS)})")
        if entry.get("key") is not None and not entry.get("model_path"):
            problems.append(f"  - {_PREFIX}.{name}.key={entry['key']}: this teacher has no model_path; set "
                            f"{_PREFIX}.{name}.model_path=PATH (a folder or hub id)")
    teachers = teachers_of(cfg)
    if not teachers:
        problems.append(f"  - distillation.enabled=True: no teacher has a model; set "
                        f"{_PREFIX}.teacher_model.model_path=PATH (a Hugging Face folder or hub id with the "
                        "student's tokenizer)")
    elif len(teachers) > 1:
        unkeyed = [t.name for t in teachers if t.key is None]
        if unkeyed:
            problems.append(f"  - {_PREFIX}.{unkeyed[0]}.key=null: with {len(teachers)} teachers each needs the "
                            f"data_source of the rows it scores; set +{_PREFIX}.{unkeyed[0]}.key=SOURCE")
        keys = [t.key for t in teachers if t.key is not None]
        for key in sorted({k for k in keys if keys.count(k) > 1}):
            names = [t.name for t in teachers if t.key == key]
            problems.append(f"  - {_PREFIX}.{names[1]}.key={key}: {names[0]} scores data_source {key} "
                            "already; give each teacher a data_source of its own")
    return problems


def distillation_notes(cfg: Config) -> list[str]:
    """Settings of ``distillation.*`` (and beside it) accepted from a verl line
    that change nothing here, one note each (`thinkrl.config.inactive`)."""
    dist = cfg.distillation
    if not dist.enabled:
        return []
    pool = "thinkrl runs each teacher on the training ranks, like the reference (verl: a vLLM pool of its own)"
    notes = [f"distillation.{name}={getattr(dist, name)} has no effect: {pool}"
             for name, default in (("n_gpus_per_node", 8), ("nnodes", 0)) if getattr(dist, name) != default]
    for name, entry in sorted(dist.teacher_models.items()):
        if not isinstance(entry, dict):
            continue
        if entry.get("num_replicas"):
            notes.append(f"{_PREFIX}.{name}.num_replicas={entry['num_replicas']} has no effect: {pool}")
        for key, value in sorted((entry.get("inference") or {}).items()):
            if value is not None:
                notes.append(f"{_PREFIX}.{name}.inference.{key}={value} has no effect: {pool}; its log-probs "
                             "come from the reference's pass, in the policy's dtype and rollout temperature")
    loss = dist.distillation_loss
    if loss.topk != 32 and loss.loss_mode != "forward_kl_topk":
        notes.append(f"{_LOSS}.topk={loss.topk} has no effect: it sizes loss_mode=forward_kl_topk only")
    if loss.log_prob_min_clamp is not None:
        notes.append(f"{_LOSS}.log_prob_min_clamp={loss.log_prob_min_clamp} has no effect: it floors the "
                     "top-k log-probs of loss_mode=forward_kl_topk only (as in verl)")
    if not loss.use_task_rewards:
        actor = cfg.actor_rollout_ref.actor
        for key, value, default in (("use_kl_loss", actor.use_kl_loss, False),
                                    ("entropy_coeff", actor.entropy_coeff, 0)):
            if value != default:
                notes.append(f"actor_rollout_ref.actor.{key}={value} has no effect: with {_LOSS}."
                             "use_task_rewards=False the task loss, with its KL loss and entropy bonus, is "
                             "dropped (as in verl); the teacher's divergence is the only loss")
    return notes
