"""A rank Ray kills for memory is named with the setting to lower, in the
message's first line, before Ray's memory report (a newcomer's rehearsal of
a 7B line met 60 lines of Ray's dump and no fix)."""

from __future__ import annotations

from thinkrl.workers.ray_group import RayWorkerGroup, killed_for_memory, memory_fix

RAY_REPORT = ("Task was killed due to the node running low on memory.\nMemory on the node (IP: 127.0.0.1, ID: 1) "
              "where the task was running was 15.2GB / 16.0GB (0.95)\n" + "\n".join(
                  f"{pid}\t3.1GiB\tray::RankActor.call" for pid in range(60)))


class OutOfMemoryError(Exception):
    """Stands in for ray.exceptions.OutOfMemoryError (matched by name)."""


class _Group:
    def _nodes(self, ranks):
        return "node 127.0.0.1"

    def _tails(self, ranks):
        return ""


def test_the_first_line_names_the_stage_and_the_setting_and_the_report_is_cut():
    failed = RayWorkerGroup._died(_Group(), 3, "update_actor", OutOfMemoryError(RAY_REPORT))
    first, *rest = str(failed).splitlines()
    assert first.startswith("ray: rank 3 (node 127.0.0.1) was killed for memory during update_actor: lower "
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
    assert "more lines)" in rest[-1] and len(rest) < 20


def test_each_stage_names_its_own_setting_and_other_deaths_stay_as_they_were():
    assert "rollout.n" in memory_fix("gen") and "val_batch_size" in memory_fix("gen")  # validation runs as gen
    assert "update_weights_bucket_megabytes" in memory_fix("update_weights")
    assert "ppo_micro_batch_size_per_gpu" in memory_fix("update_actor")
    assert "log_prob_micro_batch_size_per_gpu" in memory_fix("old_log_prob")
    assert "trainer.nnodes" in memory_fix("build (load and shard the model)")
    assert killed_for_memory(RuntimeError("The actor was killed by the memory monitor (ray memory_usage)"))
    generic = ("Worker unexpectedly exits with a connection error code 2. Some common causes include: (1) "
               "the process was killed by the OOM killer due to high memory usage, (2) ray stop --force")
    assert not killed_for_memory(RuntimeError(generic))  # Ray says it of every death
    assert killed_for_memory(type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried to "
                                                                           "allocate 2.00 GiB"))
    assert not killed_for_memory(RuntimeError("connection closed by peer"))
    died = RayWorkerGroup._died(_Group(), 0, "gen", RuntimeError("SIGSEGV in the rank"))
    assert "died during gen" in str(died) and "killed for memory" not in str(died)
