"""Config checks: the backend, rollout parallel sizes, pre-sharded weights (seed 000, bug 3)."""

from __future__ import annotations

from pathlib import Path

from doctor_helpers import context, tiny_config

from thinkrl.doctor.config import (check_backend, check_parallel_layout, check_rollout_model,
                                   check_rollout_parallel,
                                   check_validate)
from thinkrl.doctor.shards import read_sharded_layout


def _megatron_folder(root: Path, *, tp: int, pp: int | None) -> Path:
    """What MindSpeed's convert_ckpt writes: release/mp_rank_TT[_PPP]/model_optim_rng.pt."""
    (root / "latest_checkpointed_iteration.txt").parent.mkdir(parents=True, exist_ok=True)
    (root / "latest_checkpointed_iteration.txt").write_text("release")
    for t in range(tp):
        for p in range(pp or 1):
            name = f"mp_rank_{t:02d}" if pp is None else f"mp_rank_{t:02d}_{p:03d}"
            (root / "release" / name).mkdir(parents=True)
            (root / "release" / name / "model_optim_rng.pt").write_bytes(b"x")
    return root


def test_reads_tp_and_pp_from_the_rank_folders(tmp_path):
    layout = read_sharded_layout(_megatron_folder(tmp_path / "a", tp=8, pp=2))
    assert (layout.tensor_parallel, layout.pipeline_parallel) == (8, 2)
    layout = read_sharded_layout(_megatron_folder(tmp_path / "b", tp=4, pp=None))
    assert (layout.tensor_parallel, layout.pipeline_parallel) == (4, 1)
    assert read_sharded_layout(tmp_path / "missing") is None


def test_sharded_actor_with_another_layout_than_the_run_fails(tmp_path):
    # Seed 000: the actor was converted TP8/PP2 while the run used TP2/PP1.
    folder = _megatron_folder(tmp_path / "qwen7b_tp8pp2", tp=8, pp=2)
    ctx = context(f"actor_rollout_ref.model.path={folder}",
                  "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    [row] = [r for r in check_parallel_layout(ctx) if r.status != "ok"]
    assert row.status == "fail"
    assert "TP8 PP2" in row.found and "TP2 PP1" in row.found and "layouts differ" in row.found
    assert "same TP/PP" in row.fix and "Hugging Face folder" in row.fix


def test_hf_model_folder_has_a_consistent_layout(tiny_model_dir):
    [row] = check_parallel_layout(context(f"actor_rollout_ref.model.path={tiny_model_dir}"))
    assert row.status == "ok"


def test_fsdp_size_must_divide_the_devices():
    rows = check_parallel_layout(context("actor_rollout_ref.actor.fsdp_config.fsdp_size=3",
                                         "actor_rollout_ref.model.path=/nonexistent"))
    assert [r.status for r in rows] == ["fail"] and "divisor of 1" in rows[0].fix


def test_backend_rows_reuse_the_builds_message():
    from thinkrl.preflight import check_backend as build_check_backend
    ctx = context("actor_rollout_ref.rollout.name=sglang")  # refused in this release
    [row] = [check_backend(ctx)]
    assert row.status == "fail"
    try:
        build_check_backend(ctx.cfg)
    except ValueError as err:
        assert str(err).startswith(row.found) and row.fix in str(err)
    # checked even when the batch sizes are broken too
    broken = context("actor_rollout_ref.rollout.name=sglang", "data.train_batch_size=30")
    assert check_backend(broken).status == "fail"
    assert check_backend(context("trainer.n_gpus_per_node=2")).status == "ok"


def test_rollout_tp_larger_than_a_node_fails():
    ctx = context("actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=4",
                  "actor_rollout_ref.rollout.tensor_model_parallel_size=8")
    row = check_rollout_parallel(ctx)
    assert row.status == "fail" and "TP8" in row.found and "tensor_model_parallel_size=4" in row.fix


def test_batch_size_problems_become_one_row_each():
    rows = check_validate(context("data.train_batch_size=30", "actor_rollout_ref.rollout.n=1"))
    assert len(rows) >= 2 and {r.status for r in rows} == {"fail"}
    assert any("rollout.n" in r.found for r in rows)
    assert any("train_batch_size=30" in r.found for r in rows)


def test_more_devices_asked_than_visible_fails(monkeypatch):
    import torch

    from thinkrl.doctor.config import check_devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    row = check_devices(context("trainer.device=cuda", "trainer.n_gpus_per_node=8"))
    assert row.status == "fail" and "sees 2 cuda" in row.found
    assert "trainer.n_gpus_per_node=2" in row.fix and "CUDA_VISIBLE_DEVICES" in row.fix
    assert check_devices(context("trainer.device=cuda", "trainer.n_gpus_per_node=2")).status == "ok"


def test_an_npu_run_without_torch_npu_fails_with_the_devices_message():
    from thinkrl.doctor.config import check_devices

    row = check_devices(context("trainer.device=npu"))
    assert row.status == "fail" and "torch_npu" in row.found and "ASCEND_RT_VISIBLE_DEVICES" in row.fix


def test_ray_backend_torch_range(monkeypatch):
    from thinkrl import preflight
    assert preflight.torch_problem("2.13.0+cpu") is None
    assert preflight.torch_problem("2.7.1+cu126") is None  # seed 004's torch
    assert preflight.torch_problem("2.6.0") is None
    found, fix = preflight.torch_problem("2.5.1")  # seed 000's torch
    assert "torch 2.5.1" in found and "from torch 2.6" in found and "torch>=2.6" in fix
    # start and doctor both refuse it, before anything loads
    monkeypatch.setattr(preflight.torch, "__version__", "2.5.1+cpu")
    row = check_backend(context("trainer.n_gpus_per_node=2"))
    assert row.status == "fail" and "torch 2.5.1+cpu" in row.found


def test_rollout_tp_must_split_the_attention_heads():
    from types import SimpleNamespace

    from thinkrl.rollout.vllm_checks import engine_model_problem

    def rollout(tp, name="vllm"):
        return SimpleNamespace(name=name, tensor_model_parallel_size=tp)

    qwen7b = SimpleNamespace(num_attention_heads=28, num_key_value_heads=4)  # Qwen2.5-7B
    for tp in (1, 2, 4):  # seed 004 runs TP 4
        assert engine_model_problem(rollout(tp), qwen7b) is None, tp
    found, fix = engine_model_problem(rollout(8), qwen7b)  # 28 heads over 8 devices
    assert "28 attention heads (4 key/value heads)" in found and "among 1, 2, 4, 28" in fix
    # fewer key/value heads than devices: replicated, if the devices are a multiple of them
    assert engine_model_problem(rollout(4), SimpleNamespace(num_attention_heads=8,
                                                            num_key_value_heads=2)) is None
    assert engine_model_problem(rollout(8, "native"), qwen7b) is None  # native ignores TP


def test_the_tp_refusal_comes_before_any_weights_load(tiny_model_dir):
    import json
    import time

    import pytest

    from thinkrl.errors import SetupError
    from thinkrl.preflight import check_model

    heads = json.loads((tiny_model_dir / "config.json").read_text())["num_attention_heads"]
    cfg = tiny_config(f"actor_rollout_ref.model.path={tiny_model_dir}",
                      "actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=8",
                      f"actor_rollout_ref.rollout.tensor_model_parallel_size={heads + 1}")
    start = time.monotonic()
    with pytest.raises(SetupError, match=f"does not split the model's {heads} attention heads"):
        check_model(cfg, str(tiny_model_dir))
    assert time.monotonic() - start < 10.0
    row = check_rollout_model(context(f"actor_rollout_ref.model.path={tiny_model_dir}",
                                      "actor_rollout_ref.rollout.name=vllm",
                                      "trainer.n_gpus_per_node=8",
                                      f"actor_rollout_ref.rollout.tensor_model_parallel_size={heads + 1}"))
    assert row.status == "fail" and "attention heads" in row.found
