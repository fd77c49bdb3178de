"""Environment checks: FRACTAL_NZ (seed 004) and torch_npu's nbytes patch (seed 000, bug 1)."""

from __future__ import annotations

import io
import pickle
import sys
import types

import pytest
import torch
from doctor_helpers import context

from thinkrl.doctor.environment import check_network, check_serialization, check_vllm_ascend_nz


@pytest.mark.parametrize("value", ["1", None])
def test_nz_layout_on_an_npu_vllm_run_fails(value):
    env = {} if value is None else {"VLLM_ASCEND_ENABLE_NZ": value}
    row = check_vllm_ascend_nz(context("trainer.device=npu", "actor_rollout_ref.rollout.name=vllm", env=env))
    assert row.status == "fail" and "VLLM_ASCEND_ENABLE_NZ=0" in row.fix


def test_nz_off_passes_and_other_devices_do_not_care():
    env = {"VLLM_ASCEND_ENABLE_NZ": "0"}
    assert check_vllm_ascend_nz(context("trainer.device=npu", env=env)).status == "ok"
    assert check_vllm_ascend_nz(context("trainer.device=cpu", env={"VLLM_ASCEND_ENABLE_NZ": "1"})).status == "ok"


def test_torch_npus_patched_storage_nbytes_is_detected(monkeypatch):
    fake = types.ModuleType("torch_npu")
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    assert check_serialization(context()).status == "ok"  # installed, not patched

    def npu_nbytes(self):  # what torch_npu/utils/serialization.py installs
        return 0
    npu_nbytes.__module__ = "torch_npu.utils.serialization"
    monkeypatch.setattr(torch.UntypedStorage, "nbytes", npu_nbytes)
    row = check_serialization(context())
    assert row.status == "warn" and "npu_nbytes" in row.found and "RecursionError" in row.found
    assert ".cpu()" in row.fix


class _TensorSpotter(pickle.Pickler):
    """Pickles normally, and records any tensor or storage it meets."""

    def __init__(self, file):
        super().__init__(file)
        self.tensors = []

    def persistent_id(self, obj):
        if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
            self.tensors.append(obj)
        return None


class _Sent(Exception):
    pass


def test_what_reward_workers_receive_holds_no_tensor(monkeypatch, asset_cache, tiny_model_dir):
    # Our process boundary: the reward pool pickles Tasks built from the run's
    # own Samples. Capture what it would send for real prompts and responses.
    from thinkrl import builtin
    from thinkrl.data.dataset import load_prompts
    from thinkrl.models.loading import load_tokenizer
    from thinkrl.rewards.pool import ScoringPool
    from thinkrl.rewards.scorer import RewardScorer

    sent = []

    def capture(self, tasks, **kwargs):
        sent.extend(tasks)
        raise _Sent
    monkeypatch.setattr(ScoringPool, "run", capture)
    cfg = context("reward.num_workers=2").cfg
    prompts = load_prompts(builtin.resolve_data_files("builtin:arith/test"), load_tokenizer(str(tiny_model_dir)),
                           key="data.val_files", prompt_key="prompt", reward_fn_key="data_source",
                           max_prompt_length=512, filter_overlong=False, truncation="error", chat_kwargs={},
                           log=lambda *_: None)[:4]
    with pytest.raises(_Sent):
        RewardScorer.from_config(cfg).score(["#### 5"] * len(prompts), [p.sample for p in prompts])
    assert len(sent) == 4
    spotter = _TensorSpotter(io.BytesIO())
    spotter.dump(sent)
    assert spotter.tensors == []


def test_network_one_process_opens_no_socket():
    row = check_network(context())
    assert row.status == "ok" and "no network sockets" in row.found


def test_network_ray_on_one_host_stays_on_loopback():
    row = check_network(context("trainer.backend=ray", "trainer.n_gpus_per_node=2", device_kind="cpu"))
    assert row.status == "ok" and "every socket on 127.0.0.1" in row.found
    assert "no listening store" in row.found and "gloo collectives on lo" in row.found


def test_network_across_nodes_names_each_socket_and_what_pins_it():
    overrides = ("trainer.backend=ray", "trainer.nnodes=2", "trainer.n_gpus_per_node=8",
                 "trainer.ray_address=10.0.0.1:6379")
    row = check_network(context(*overrides, device_kind="cuda"))
    assert row.status == "warn" and "nccl collectives" in row.found and "no listening store" in row.found
    assert "NCCL_SOCKET_IFNAME" in row.fix
    pinned = check_network(context(*overrides, env={"NCCL_SOCKET_IFNAME": "ib0"}, device_kind="cuda"))
    assert pinned.status == "ok" and "NCCL_SOCKET_IFNAME=ib0" in pinned.found
    tcp = check_network(context(*overrides, "trainer.dist_init_method=tcp", device_kind="cuda"))
    assert "listening on every interface" in tcp.found
