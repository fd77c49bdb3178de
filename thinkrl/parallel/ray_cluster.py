"""Ray for the ray backend: joining or starting a cluster, and one bundle per device.

A run joins the cluster that `trainer.ray_address` or RAY_ADDRESS names
(several nodes: `ray start --head` on one, `ray start --address=HEAD:6379`
on the others), else starts a one-node cluster in this process bound to
127.0.0.1 only, without a dashboard, its files under `trainer.ray_tmpdir`.

Each node's devices are reserved as one placement group of
`trainer.n_gpus_per_node` bundles (STRICT_PACK: a node's ranks share a
machine), each bundle one CPU plus one accelerator of the run's kind.
"""

from __future__ import annotations

import os
from pathlib import Path

from thinkrl.config.schema import TrainerConfig
from thinkrl.parallel.device import ray_resource


def on_loopback_address(address: str) -> bool:
    """A cluster address ("HOST:PORT") on this machine's loopback."""
    return address.split(":")[0] in ("127.0.0.1", "localhost")


def connect(trainer: TrainerConfig, *, world_size: int, log=print) -> bool:
    """Join or start Ray; True when this call started a cluster (the run then
    shuts it down at the end)."""
    address = trainer.ray_address or os.environ.get("RAY_ADDRESS")
    if not address:
        # A cluster of this machine alone binds loopback only. Ray reads the
        # variable at import, so it is set before the first import of ray.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return False
    if address:
        log(f"ray: joining the cluster at {address}")
        local = on_loopback_address(address)
        # A cluster on loopback is joined on loopback (not this host's other addresses).
        ray.init(address=address, log_to_driver=True,
                 **({"_node_ip_address": "127.0.0.1"} if local else {}))
        return False
    options: dict = dict(num_cpus=max(os.cpu_count() or 1, world_size),
                         include_dashboard=False, _node_ip_address="127.0.0.1",
                         log_to_driver=True)
    tmpdir = trainer.ray_tmpdir or os.environ.get("RAY_TMPDIR")
    if tmpdir:
        root = Path(tmpdir).expanduser().resolve()
        spill = root / "spill"
        spill.mkdir(parents=True, exist_ok=True)
        options["_temp_dir"] = str(root)
        import json
        options["_system_config"] = {"object_spilling_config": json.dumps(
            {"type": "filesystem", "params": {"directory_path": str(spill)}})}
    ray.init(**options)
    log(f"ray: started a local cluster on 127.0.0.1 ({options['num_cpus']} CPUs"
        f"{', files under ' + options['_temp_dir'] if tmpdir else ''})")
    return True


def on_loopback() -> bool:
    """Every live node of the cluster is this machine on a loopback address
    (a cluster this run started, or one started with `ray start --head
    --node-ip-address=127.0.0.1` and joined): its ranks' collectives then stay
    on loopback too."""
    import ray
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return bool(nodes) and all(n["NodeManagerAddress"].startswith("127.") for n in nodes)


def device_kind(device_name: str) -> str:
    """trainer.device for the ranks: "auto" becomes cuda or npu when the
    cluster has GPUs or NPUs, else cpu (decided once, here on the driver:
    each rank reserves its accelerator by this kind)."""
    if device_name != "auto":
        return device_name
    import ray
    resources = ray.cluster_resources()
    for kind in ("cuda", "npu"):
        if resources.get(ray_resource(kind), 0) > 0:
            return kind
    return "cpu"


def check_capacity(trainer: TrainerConfig, *, device_name: str) -> None:
    """Fail at once, not after ray_wait_timeout_s, when the whole cluster has
    fewer CPUs or accelerators than the run reserves."""
    import ray
    from thinkrl.errors import SetupError

    world = trainer.nnodes * trainer.n_gpus_per_node
    total = ray.cluster_resources()
    for resource, each in bundle(device_name).items():
        if total.get(resource, 0) < each * world:
            raise SetupError(
                f"trainer.nnodes {trainer.nnodes} x trainer.n_gpus_per_node "
                f"{trainer.n_gpus_per_node} ranks need {each * world:g} {resource} but the Ray "
                f"cluster has {total.get(resource, 0):g}",
                "lower trainer.n_gpus_per_node / trainer.nnodes, or add nodes "
                "(ray start --address=...)")


def bundle(device_name: str) -> dict[str, float]:
    """What one rank reserves: a CPU, and its accelerator."""
    resource = ray_resource(device_name)
    return {"CPU": 1} if resource is None else {"CPU": 1, resource: 1}


def reserve_devices(trainer: TrainerConfig, *, device_name: str, timeout_s: float) -> list:
    """One ready placement group per node, `n_gpus_per_node` bundles each.
    Raises a TimeoutError that says what the cluster lacks when they cannot
    all be placed in time."""
    import ray
    from ray.util.placement_group import placement_group

    groups = [placement_group([bundle(device_name)] * trainer.n_gpus_per_node,
                              strategy="STRICT_PACK", name=f"thinkrl-node-{node}")
              for node in range(trainer.nnodes)]
    ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=timeout_s)
    if len(ready) < len(groups):
        available = ray.available_resources()
        raise TimeoutError(
            f"ray: could not reserve {trainer.nnodes} node(s) x {trainer.n_gpus_per_node} x "
            f"{bundle(device_name)} within {timeout_s:.0f} s; the cluster has {available} free. "
            "Lower trainer.n_gpus_per_node / trainer.nnodes, or add nodes (ray start --address=...)")
    return groups
