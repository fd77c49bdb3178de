"""distillation.* read as verl spells it, its mistakes refused key by key,
verl's serving keys noted, and rows routed to their teacher."""

from __future__ import annotations

import pytest
import torch

from thinkrl.config import load_config
from thinkrl.config.checks import validate
from thinkrl.config.distill_checks import Teacher, needs_reference, teachers_of
from thinkrl.config.inactive import inactive_settings
from thinkrl.errors import UserError
from thinkrl.metrics import StageTimer
from thinkrl.stages.teacher import teacher_logprobs, teacher_rows

T = "distillation.teacher_models"
L = "distillation.distillation_loss"
# verl's run_qwen3_8b_fsdp.sh distillation block, as written there
VERL_LINE = ["distillation.enabled=True", "distillation.n_gpus_per_node=4", "distillation.nnodes=1",
             f"{T}.teacher_model.model_path=Qwen/Qwen3-32B", f"{T}.teacher_model.inference.tensor_model_parallel_size=2",
             f"{T}.teacher_model.inference.name=vllm", f"{T}.teacher_model.inference.gpu_memory_utilization=0.4",
             f"{T}.teacher_model.inference.max_model_len=3073", f"{L}.loss_mode=k1", f"{L}.topk=64",
             f"{L}.use_task_rewards=False", f"{L}.use_policy_gradient=True", f"{L}.loss_max_clamp=10.0",
             f"{L}.log_prob_min_clamp=-10.0"]


def test_verls_distillation_block_reads_and_says_what_it_ignores():
    cfg = load_config("tiny", VERL_LINE)
    validate(cfg)
    assert teachers_of(cfg) == (Teacher("teacher_model", None, "Qwen/Qwen3-32B"),)
    notes = "\n".join(inactive_settings(cfg))
    for said in ("distillation.n_gpus_per_node=4 has no effect", "distillation.nnodes=1 has no effect",
                 "inference.tensor_model_parallel_size=2 has no effect", f"{L}.topk=64 has no effect",
                 "log_prob_min_clamp=-10.0 has no effect",
                 "actor_rollout_ref.actor.use_kl_loss=True has no effect"):  # the tiny recipe's KL loss
        assert said in notes, said
    assert not needs_reference(cfg)  # pure OPD drops the KL loss: no reference is built


def test_several_teachers_by_data_source():
    cfg = load_config("tiny", ["distillation.enabled=True", f"+{T}.math.key=math", f"+{T}.math.model_path=/m",
                               f"+{T}.code.key=code", f"+{T}.code.model_path=/c"])
    validate(cfg)
    assert {t.name: (t.key, t.model_path) for t in teachers_of(cfg)} == {"math": ("math", "/m"),
                                                                         "code": ("code", "/c")}
    assert teacher_rows(teachers_of(cfg), ["math", "code", "math"]) == {"code": [1], "math": [0, 2]}
    with pytest.raises(ValueError, match="row 1 has data_source 'poems'"):
        teacher_rows(teachers_of(cfg), ["math", "poems"])
    # one teacher scores every row whatever its key (verl calls a lone teacher's key "default")
    assert teacher_rows((Teacher("t", "math", "/m"),), ["math", "poems"]) == {"t": [0, 1]}


@pytest.mark.parametrize("overrides, said", [
    ([f"{L}.loss_mode=forward_kl_topk"], "forward_kl_topk: the top-k forward KL needs"),
    ([f"{L}.loss_mode=k1"], "does not depend on the teacher"),
    ([f"{L}.loss_mode=k4"], "use one of kl, k1"),
    ([f"{L}.policy_loss_mode=gspo"], "only vanilla"),
    ([f"{L}.clip_ratio_high=1.5"], "clip_ratio_high=1.5: use a value in (0, 1)"),
    (["distillation.teacher_key=task"], "by their data_source column only"),
    ([f"{T}.teacher_model.model_path=null"], "no teacher has a model"),
    ([f"+{T}.other.model_path=/x"], f"{T}.other.key=null: with 2 teachers"),
    ([f"+{T}.other.model_pth=/x"], "did you mean model_path"),
    ([f"+{T}.teacher_model.inference.tensor_paralel=2"], "unknown key"),
])
def test_mistakes_are_refused_with_their_key(overrides, said):
    cfg = load_config("tiny", ["distillation.enabled=True", f"{T}.teacher_model.model_path=/t", *overrides])
    with pytest.raises(UserError) as caught:
        validate(cfg)
    assert said in str(caught.value), str(caught.value)


def test_unknown_teacher_key_without_plus_names_the_fix():
    with pytest.raises(UserError, match=r"write \+distillation.teacher_models.math.key"):
        load_config("tiny", [f"{T}.math.key=math"])


class _Teachers:
    """A handle whose teacher `name` gives every token the log-prob of its name's length."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def compute_teacher_log_prob(self, name, input_ids, attention_mask, position_ids, *, response_length,
                                 model_inputs=None):
        self.calls.append((name, input_ids.shape[0]))
        return torch.full((input_ids.shape[0], response_length), -float(len(name)))


class _Rollouts:
    """What the teachers' stage reads of a step's rollouts."""

    def __init__(self, sources: list[str], response_length: int) -> None:
        self.samples = [type("Sample", (), {"data_source": s})() for s in sources]
        self.response_ids = torch.zeros(len(sources), response_length, dtype=torch.long)
        self.model_inputs = None

    def __len__(self) -> int:
        return len(self.samples)


def test_each_row_is_scored_by_its_own_teacher():
    rollouts = _Rollouts(["math", "code", "math", "math"], response_length=3)
    seqs = (torch.zeros(4, 5, dtype=torch.long),) * 3
    handle = _Teachers()
    teachers = (Teacher("mathteacher", "math", "/m"), Teacher("py", "code", "/c"))
    out = teacher_logprobs(handle, teachers, rollouts, seqs, StageTimer())
    assert out[:, 0].tolist() == [-11.0, -2.0, -11.0, -11.0]
    assert sorted(handle.calls) == [("mathteacher", 3), ("py", 1)]
