"""`thinkrl doctor --target`: a cluster line judged from a laptop, against
the device it is written for, whatever this machine has."""

from __future__ import annotations

import sys

import pytest
from doctor_helpers import context
from transformers import Qwen2Config

from thinkrl.doctor.config import check_devices
from thinkrl.doctor.environment import check_loggers
from thinkrl.doctor.memory import check_device, check_host
from thinkrl.doctor.targets import parse_target
from thinkrl.rehearse.report import project

CONFIG = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
RUN = ("data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
       "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
       "data.max_prompt_length=30", "data.max_response_length=34", "data.val_batch_size=1",
       "trainer.n_gpus_per_node=8", "trainer.device=auto")


def test_the_catalogue_and_sizes_parse_and_a_wrong_name_lists_them():
    h100 = parse_target("H100x8")
    assert (h100.kind, h100.per_node, round(h100.bytes_per_device / 2**30, 1)) == ("cuda", 8, 79.2)
    assert parse_target("910b").kind == "npu" and parse_target("910b").per_node is None
    assert parse_target("80GiBx4").bytes_per_device == 80 * 2**30
    assert parse_target("npu:64GB").kind == "npu" and parse_target("64GB").kind == "cuda"
    assert parse_target("npu:64GB").bytes_per_device == 64 * 10**9
    with pytest.raises(ValueError, match=r"h100, h200, .*910b.*80GiB.*h100x8"):
        parse_target("v100x8")
    with pytest.raises(ValueError, match="more than 0 bytes"):
        parse_target("0GiBx8")


def _ctx(target: str | None, *extra: str, params: int = 100_000):
    ctx = context(*RUN, *extra, model_config=CONFIG, param_count=params)
    ctx.target = parse_target(target) if target else None
    return ctx


def test_memory_is_judged_against_the_target_s_device_not_this_machine():
    # 30e9 parameters: 16 bytes each of fp32 weights, gradients and AdamW, sharded over 8 devices
    row = check_device(_ctx("a100-40x8", params=30_000_000_000))
    assert row.status == "fail" and "per device of 8 x NVIDIA A100 40 GB (the target" in row.found
    assert "of 39.4 GiB" in row.found
    assert check_device(_ctx("h200x8", params=100_000)).status == "ok"
    assert "not compared" in check_host(_ctx("h100x8")).found


def test_devices_per_node_are_compared_with_the_target_and_a_gpu_line_on_a_cpu_is_flagged(monkeypatch):
    row = check_devices(_ctx("h100x4"))
    assert row.status == "fail" and "set trainer.n_gpus_per_node=4" in row.fix
    assert check_devices(_ctx("h100x8")).status == "ok"
    wrong_kind = check_devices(_ctx("h100x8", "trainer.device=npu"))
    assert wrong_kind.status == "fail" and "set trainer.device=cuda" in wrong_kind.fix
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    ctx = _ctx(None)
    ctx.__dict__["device_kind"] = "cpu"
    row = check_devices(ctx)
    assert row.status == "warn" and "--target h100x8" in row.fix


def test_a_logger_package_missing_here_warns_for_a_target_and_fails_for_this_machine(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert check_loggers(_ctx("h100x8", "trainer.logger=[console,wandb]")).status == "warn"
    assert check_loggers(_ctx(None, "trainer.logger=[console,wandb]")).status == "fail"


def test_the_rehearsal_s_projection_takes_the_target(monkeypatch):
    from thinkrl.doctor import memory

    monkeypatch.setattr(memory.DoctorContext, "model_config", CONFIG, raising=False)
    monkeypatch.setattr(memory.DoctorContext, "param_count", 100_000, raising=False)
    cfg = context(*RUN).cfg
    projected = project(cfg, prompt_tokens=[20], last_step={}, target=parse_target("910bx8"))
    assert projected.device == "npu" and projected.capacity == 64 * 2**30
    assert "Ascend 910B" in projected.assumed
    default = project(cfg, prompt_tokens=[20], last_step={})
    assert default.device == "cuda" and "H100 80 GB, assumed" in default.assumed
