"""What crosses a worker boundary, and the deadline of every wait."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

from thinkrl.workers.ray_group import check_cpu_only


@dataclass
class _Record:
    values: torch.Tensor
    extra: dict


def test_only_cpu_tensors_may_leave_a_worker():
    check_cpu_only(_Record(torch.ones(2), {"a": [torch.zeros(1), 3]}), where="rank 0, gen")
    meta = torch.ones(2, device="meta")  # stands in for a device tensor here
    with pytest.raises(TypeError, match=r"rank 1, gen: result.extra\['a'\]\[0\] is a meta tensor"):
        check_cpu_only(_Record(torch.ones(2), {"a": [meta]}), where="rank 1, gen")


@pytest.mark.slow
def test_a_wait_past_its_deadline_names_rank_node_and_stage(tmp_path):
    ray = pytest.importorskip("ray")
    from thinkrl.config import load_config
    from thinkrl.workers.policy_rank import RankSpec
    from thinkrl.workers.ray_group import RayWorkerGroup, WorkerFailed

    @ray.remote(num_cpus=0)
    class Sleeper:
        def nap(self, seconds: float) -> float:
            time.sleep(seconds)
            return seconds

    cfg = load_config(None, ["trainer.ray_wait_timeout_s=2"])
    spec = RankSpec(cfg=cfg, sizes=None, model_path="x", total_steps=1, eos_token_ids=(0,),
                    pad_token_id=0, tokenizer_size=1)
    ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        workers = [Sleeper.remote(), Sleeper.remote()]
        group = RayWorkerGroup(spec, workers, [{"host": "h0", "ip": "127.0.0.1"}] * 2,
                               [str(tmp_path / "rank_0.log"), str(tmp_path / "rank_1.log")],
                               started_cluster=False, groups=[])
        (tmp_path / "rank_1.log").write_text("[rank 1] gen\nloading shards\n")
        start = time.monotonic()
        with pytest.raises(WorkerFailed) as err:
            group.wait([workers[0].nap.remote(0), workers[1].nap.remote(30)], stage="gen")
        assert time.monotonic() - start < 10
        message = str(err.value)
        assert "gen: rank(s) [1] (rank 1 on h0 (127.0.0.1))" in message
        assert "trainer.ray_wait_timeout_s=2" in message and "loading shards" in message
    finally:
        ray.shutdown()
