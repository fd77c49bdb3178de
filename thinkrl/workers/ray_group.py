"""The ray backend: one Ray actor per device, started, met and stopped here.

`RankActor` is a thin shell around `PolicyRank` (the plain class the local
backend uses): it builds one in its process and runs its methods. The
driver never touches a module; it holds the handles of
`thinkrl.workers.handles`, which have the methods of the local roles, split
each batch over the ranks, call every rank through `RayWorkerGroup.call_all`
and put the CPU results back together in the original order.

Failure is loud and fast: results pass one CPU-only check where they leave
a worker; every wait has a deadline (`trainer.ray_wait_timeout_s`) naming
the ranks, nodes and stage still pending; a worker that dies stops the run
within seconds, naming its rank, node, stage and last log lines.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import tempfile
import time
from pathlib import Path

import torch

from thinkrl.errors import WorkerFailed
from thinkrl.workers.policy_rank import RankSpec


def check_cpu_only(value, *, where: str, path: str = "result") -> None:
    """Raise when `value` holds a tensor that is not on the CPU: pickling
    device tensors across processes is a bug (seed 000's RecursionError was
    torch_npu's storage pickling through Ray)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise TypeError(f"{where}: {path} is a {value.device} tensor; only CPU tensors may "
                            "leave a worker. This is a bug in thinkrl: move it with .cpu()")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_cpu_only(item, where=where, path=f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_cpu_only(item, where=where, path=f"{path}[{i}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            check_cpu_only(getattr(value, f.name), where=where, path=f"{path}.{f.name}")


class RankActor:
    """The Ray actor of one rank (wrapped with ray.remote at start)."""

    def __init__(self, log_file: str) -> None:
        # Everything this process prints, Python or C++, goes to its own log,
        # whose tail the driver shows if the rank dies.
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        self.rank = None
        self.name = "?"

    def where(self) -> dict:
        """This worker's node: hostname, IP, and a free port for a TCP store."""
        import ray
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            port = s.getsockname()[1]
        return {"host": socket.gethostname(), "ip": ip, "port": port, "pid": os.getpid()}

    def build(self, spec: RankSpec) -> dict:
        from thinkrl.workers.policy_rank import PolicyRank
        self.name = f"rank {spec.rank}"
        print(f"[{self.name}] pid {os.getpid()} building", flush=True)
        self.rank = PolicyRank(spec)
        print(f"[{self.name}] built", flush=True)
        return self.rank.sharding()

    def call(self, stage: str, method: str, *args, **kwargs):
        print(f"[{self.name}] {stage}", flush=True)
        result = getattr(self.rank, method)(*args, **kwargs)
        check_cpu_only(result, where=f"{self.name}, {stage}")
        return result


class RayWorkerGroup:
    """The ranks of one run: their lifecycle, and `call_all`, which the
    driver-side role handles (`thinkrl.workers.handles`) call them through."""

    def __init__(self, spec: RankSpec, workers: list, places: list[dict], log_files: list[str],
                 *, started_cluster: bool, groups: list) -> None:
        self.spec, self.workers, self.places, self.log_files = spec, workers, places, log_files
        self.world_size = len(log_files)
        self.timeout_s = spec.cfg.trainer.ray_wait_timeout_s
        self.started_cluster, self.groups = started_cluster, groups
        self.rendezvous_dir: Path | None = None

    @classmethod
    def start(cls, spec: RankSpec, *, log=print) -> "RayWorkerGroup":
        from thinkrl.parallel import ray_cluster
        trainer = spec.cfg.trainer
        world = trainer.nnodes * trainer.n_gpus_per_node
        started = ray_cluster.connect(trainer, world_size=world, log=log)
        run_dir = Path(trainer.default_local_dir).expanduser().resolve()
        group = cls(spec, [], [{"host": "?", "ip": "?"}] * world,
                    [str(run_dir / "logs" / f"rank_{r}.log") for r in range(world)],
                    started_cluster=started, groups=[])
        try:
            group._launch(started=started, log=log)
        except BaseException:
            group.close()
            raise
        return group

    def _launch(self, *, started: bool, log) -> None:
        """Reserve the devices, start one actor per rank, meet, build the roles."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from thinkrl.parallel import ray_cluster
        from thinkrl.parallel.device import loopback_env
        trainer, world = self.spec.cfg.trainer, self.world_size
        device = ray_cluster.device_kind(trainer.device)
        ray_cluster.check_capacity(trainer, device_name=device)
        self.groups = ray_cluster.reserve_devices(trainer, device_name=device,
                                                  timeout_s=self.timeout_s)
        # A cluster of this machine alone: collectives stay on loopback too.
        env = {"env_vars": loopback_env()} if started or ray_cluster.on_loopback() else None
        remote = ray.remote(RankActor)
        for r in range(world):
            node, slot = divmod(r, trainer.n_gpus_per_node)
            resources = ray_cluster.bundle(device)
            self.workers.append(remote.options(
                num_cpus=resources.pop("CPU"), num_gpus=resources.pop("GPU", 0),
                resources=resources, runtime_env=env,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.groups[node], placement_group_bundle_index=slot),
            ).remote(self.log_files[r]))
        self.places = self.wait([w.where.remote() for w in self.workers], stage="start")
        self._check_shared_run_dir()
        init_method = self._rendezvous(trainer.dist_init_method)
        specs = [dataclasses.replace(self.spec, rank=r, world_size=world, init_method=init_method,
                                     device=device) for r in range(world)]
        sharding = self.wait([w.build.remote(s) for w, s in zip(self.workers, specs)],
                             stage="build (load and shard the model)")
        log(f"ray: {world} ranks on {len({p['host'] for p in self.places})} node(s), {device}, "
            f"{sharding[0]['local']:,} of {sharding[0]['total']:,} parameters per rank "
            f"(FSDP2), logs in {Path(self.log_files[0]).parent}")

    def _check_shared_run_dir(self) -> None:
        """Every rank writes its checkpoint shards under the run directory, so
        all nodes must see the same one: each rank has created its log there."""
        unseen = [r for r, f in enumerate(self.log_files) if not Path(f).is_file()]
        if unseen:
            from thinkrl.errors import SetupError
            raise SetupError(
                f"ranks {unseen} ({self._nodes(unseen)}) write to a run directory this node does "
                f"not see ({Path(self.log_files[0]).parent.parent}): their checkpoint shards "
                "would be lost", "put trainer.default_local_dir on a disk every node mounts "
                "at the same path (NFS, a parallel file system)")

    def _rendezvous(self, method: str) -> str:
        """Where the ranks meet: a file in the run directory, which every
        node sees (`_check_shared_run_dir`), so nothing listens on the network
        (trainer.dist_init_method auto or file); or, with tcp, a store on
        rank 0's node address."""
        if method in ("auto", "file"):
            self.rendezvous_dir = Path(tempfile.mkdtemp(
                prefix=".rendezvous-", dir=Path(self.log_files[0]).parent))
            return f"file://{self.rendezvous_dir}/store"
        first = self.places[0]
        return f"tcp://{first['ip']}:{first['port']}"

    def call_all(self, stage: str, method: str, per_rank_args: list[tuple] | None = None,
                 **kwargs) -> list:
        """`method` on every rank (rank r with per_rank_args[r]), results in rank order."""
        args = per_rank_args or [()] * self.world_size
        return self.wait([w.call.remote(stage, method, *a, **kwargs)
                          for w, a in zip(self.workers, args)], stage=stage)

    def wait(self, refs: list, *, stage: str) -> list:
        """Every result, or a WorkerFailed naming the rank, node and stage as
        soon as one rank fails (not when the others, blocked in a collective,
        time out)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

        rank_of = {ref: r for r, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        deadline = time.monotonic() + self.timeout_s
        pending = list(refs)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                ranks = sorted(rank_of[ref] for ref in pending)
                raise WorkerFailed(
                    f"ray: {stage}: rank(s) {ranks} ({self._nodes(ranks)}) did not answer within "
                    f"trainer.ray_wait_timeout_s={self.timeout_s:g} s.{self._tails(ranks)}")
            ready, pending = ray.wait(pending, num_returns=1, timeout=min(left, 1.0))
            for ref in ready:
                r = rank_of[ref]
                try:
                    results[r] = ray.get(ref, timeout=0)
                except RayActorError as err:
                    raise self._died(r, stage, err) from None
                except RayTaskError as err:
                    cause = err.cause  # the worker's own exception
                    if killed_for_memory(cause):  # torch's OutOfMemoryError on the rank's device
                        raise self._died(r, stage, cause) from None
                    if isinstance(cause, (ValueError, FloatingPointError)):
                        # a user's mistake or a diverged run: the CLI says it in its own words
                        raise cause from None
                    # A rank that dies breaks its peers' collectives ("connection closed by
                    # peer"), and a peer's error may arrive first: name the dead rank.
                    dead = self._dead_rank(pending, rank_of)
                    if dead is not None:
                        raise self._died(*dead, stage) from None
                    raise WorkerFailed(f"ray: rank {r} ({self._nodes([r])}) failed during "
                                       f"{stage}:\n{err}") from None
                except RayError as err:  # e.g. an exception that did not survive pickling
                    if killed_for_memory(err):  # Ray's memory monitor killed the task
                        raise self._died(r, stage, err) from None
                    raise WorkerFailed(f"ray: rank {r} ({self._nodes([r])}) failed during "
                                       f"{stage}:\n{err}") from None
                except GetTimeoutError:  # ready but not fetched in time: try again
                    pending.append(ref)
        return results

    def _died(self, r: int, stage: str, err: BaseException) -> WorkerFailed:
        if killed_for_memory(err):
            return WorkerFailed(f"ray: rank {r} ({self._nodes([r])}) was killed for memory during {stage}: "
                                f"{memory_fix(stage)}; `thinkrl doctor` estimates each stage's peak. The "
                                f"last complete checkpoint is intact. Ray's report:\n{_cut(str(err))}")
        return WorkerFailed(
            f"ray: rank {r} ({self._nodes([r])}) died during {stage} "
            f"({type(err).__name__}: killed, out of memory or crashed). The last "
            f"complete checkpoint is intact; trainer.resume_mode=auto continues from "
            f"it.{self._tails([r])}")

    @staticmethod
    def _dead_rank(pending: list, rank_of: dict, grace_s: float = 5.0) -> tuple[int, BaseException] | None:
        """(rank, error) of a pending rank whose actor died, waiting up to `grace_s`
        for the others to answer; None when none died."""
        import ray
        from ray.exceptions import RayActorError

        if not pending:
            return None
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=grace_s)
        for ref in ready:
            try:
                ray.get(ref, timeout=0)
            except RayActorError as err:
                return rank_of[ref], err
            except Exception:  # noqa: BLE001 - another rank's own failure: not a death
                continue
        return None

    def _nodes(self, ranks: list[int]) -> str:
        return ", ".join(f"rank {r} on {self.places[r]['host']} ({self.places[r]['ip']})"
                         for r in ranks)

    def _tails(self, ranks: list[int], lines: int = 8) -> str:
        text = []
        for r in ranks:
            try:
                tail = Path(self.log_files[r]).read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            text.append(f"\n--- last lines of {self.log_files[r]} ---\n" + "\n".join(tail))
        return "".join(text)

    def close(self) -> None:
        """Stop the workers (and the cluster this run started)."""
        import shutil

        import ray
        if self.rendezvous_dir is not None:
            shutil.rmtree(self.rendezvous_dir, ignore_errors=True)
        if not ray.is_initialized():
            return
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        from ray.util.placement_group import remove_placement_group
        for group in self.groups:
            remove_placement_group(group)
        if self.started_cluster:
            ray.shutdown()


# Ray's memory monitor, torch's allocator on a device; not Ray's generic list of a dead
# worker's possible causes, which names the OOM killer for every death
_MEMORY_WORDS = re.compile(r"OutOfMemoryError|running low on memory|memory monitor|(CUDA|NPU|XPU) out of memory|"
                           r"out of memory\. Tried to allocate", re.IGNORECASE)
_FIXES = (  # the first word the stage's name holds picks the fix
    ("update_weights", "lower actor_rollout_ref.rollout.update_weights_bucket_megabytes (vLLM: also "
                       "actor_rollout_ref.rollout.gpu_memory_utilization)"),
    ("update", "lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (critic.ppo_micro_batch_size_per_gpu "
               "for the critic's), or set actor_rollout_ref.model.enable_gradient_checkpointing=True"),
    ("log_prob", "lower actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu and "
                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
    ("ref", "lower actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
    ("gen", "lower data.train_batch_size x actor_rollout_ref.rollout.n in training, data.val_batch_size x "
            "rollout.val_kwargs.n in validation (the sequences decoded at once), or data.max_response_length "
            "(vLLM: actor_rollout_ref.rollout.gpu_memory_utilization)"),
    ("build", "the model does not fit this node's memory while it is loaded and sharded: spread it over more "
              "devices or nodes (trainer.n_gpus_per_node, trainer.nnodes) or use a smaller model"),
)


def killed_for_memory(err: BaseException) -> bool:
    """Whether Ray (its memory monitor, or the kernel's OOM killer) ended the rank for memory."""
    return type(err).__name__ == "OutOfMemoryError" or bool(_MEMORY_WORDS.search(str(err)))


def memory_fix(stage: str) -> str:
    """The setting to lower for the stage a rank ran out of memory in."""
    for word, fix in _FIXES:
        if word in stage:
            return fix
    return ("lower the micro-batch sizes (actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu, "
            "...log_prob_micro_batch_size_per_gpu) or the responses per step (data.train_batch_size x rollout.n)")


def _cut(text: str, lines: int = 12) -> str:
    """The head of Ray's memory report (its per-process table runs to dozens of lines)."""
    kept = text.splitlines()
    return "\n".join(kept[:lines] + ([f"... ({len(kept) - lines} more lines)"] if len(kept) > lines else []))
