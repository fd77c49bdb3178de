"""A 2-rank run that joins a Ray cluster started beforehand on this host
(`ray start --head --node-ip-address=127.0.0.1`) opens no socket off loopback:
every listening socket that appears while it runs is on 127.0.0.1 (Ray's
workers and object store, the ranks' gloo collectives)."""

from __future__ import annotations

import os
import socket
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
RAY = Path(sys.executable).with_name("ray")


def listening() -> set[tuple[str, int]]:
    """(address, port) of every TCP socket listening on this host (/proc/net/tcp, tcp6)."""
    found = set()
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(path).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":  # LISTEN
                continue
            address, port = local.split(":")
            raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def on_loopback(address: str) -> bool:
    return address.startswith(("127.", "::ffff:127.")) or address == "::1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc/net/tcp")
def test_a_run_joining_a_local_ray_cluster_listens_on_loopback_only(asset_cache, tiny_model_dir, tmp_path):
    ray_dir = tempfile.mkdtemp(prefix="thinkrl-ray-")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
           "RAY_TMPDIR": ray_dir}
    before = listening()
    port = free_port()
    subprocess.run([str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                    "--include-dashboard=false", "--num-cpus=2", "--disable-usage-stats",
                    f"--temp-dir={ray_dir}"], env=env, check=True, timeout=120,
                   capture_output=True)
    try:
        run = subprocess.Popen(
            [sys.executable, "-m", "thinkrl", "train", "--config", "tiny", "--skip-doctor",
             f"actor_rollout_ref.model.path={tiny_model_dir}",
             f"trainer.default_local_dir={tmp_path / 'run'}", f"trainer.ray_address=127.0.0.1:{port}",
             "trainer.backend=ray", "trainer.n_gpus_per_node=2", "trainer.device=cpu",
             "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
             "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.max_response_length=8",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
             "trainer.total_training_steps=2", "trainer.val_before_train=False", "trainer.test_freq=-1",
             "trainer.progress_bar=False", "trainer.logger=[]", "reward.num_workers=0",
             "trainer.ray_wait_timeout_s=120"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 300
        while run.poll() is None and time.monotonic() < deadline:
            seen |= listening() - before
            time.sleep(0.2)
        if run.poll() is None:
            run.kill()
        output = run.communicate()[0]
        assert run.returncode == 0, output[-3000:]
        assert "ray: joining the cluster at 127.0.0.1" in output
        assert seen, "no listening socket was seen: the check saw nothing of the run"
        assert [s for s in seen if not on_loopback(s[0])] == []
    finally:
        subprocess.run([str(RAY), "stop", "--force"], env=env, timeout=120, capture_output=True)
        shutil.rmtree(ray_dir, ignore_errors=True)
