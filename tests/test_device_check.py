"""The accelerator check's dry run: `bash bench/device_check.sh --dry-run`
runs every check's code on the CPU with tiny shapes and prints (and writes
under $OUT) one JSON line per measurement, so the script a session runs when
a device is lent is known to work before a minute of device time is spent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def test_a_deadline_kills_the_check_and_what_it_started(tmp_path):
    # The check starts a grandchild in a session of its own (as a rollout process or
    # a Ray worker may): it leaves the check's process group but not its deadline.
    # The driver is a process of its own here, as on the device: it becomes the
    # subreaper of what its checks start, which pytest's process must not.
    marker = tmp_path / "grandchild.pid"
    check = ("import subprocess, sys, time\n"
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
             "start_new_session=True)\n"
             f"open({str(marker)!r}, 'w').write(str(p.pid))\n"
             "time.sleep(60)\n")
    driver = ("import sys\n"
              f"sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
              "from device_check import run_with_deadline\n"
              f"code, why = run_with_deadline([sys.executable, '-c', {check!r}], 3)\n"
              "print(code, why)\n")
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("-1 did not finish within its 3 s deadline"), out.stderr[-2000:]
    grandchild = int(marker.read_text())
    try:
        state = Path(f"/proc/{grandchild}/stat").read_text().split(")")[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z"), f"the grandchild {grandchild} is still running ({state})"
    sys.path.insert(0, str(ROOT / "bench"))
    from device_check import peak_flops

    assert peak_flops("NVIDIA H100 80GB HBM3") == (989e12, "H100")
    assert peak_flops("NVIDIA H100 PCIe") == (756e12, "H100 PCIe")
    assert peak_flops("NVIDIA H200 NVL")[1] == "NVL" and peak_flops("Ascend910B") == (None, None)


def test_the_dry_run_prints_every_check_s_figures(tmp_path, asset_cache):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "THINKRL_CACHE": str(asset_cache)}
    result = subprocess.run(["bash", "bench/device_check.sh", "--dry-run"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert printed == [json.loads(line) for line in (out / "device_check.jsonl").read_text().splitlines()]
    by_check = {}
    for record in printed:
        by_check.setdefault(record["check"], []).append(record)
    assert list(by_check) == ["env", "tests", "grpo-0.5b", "grpo-1.5b", "trl", "async-longtail"]
    assert by_check["env"][0]["dry_run"] is True and by_check["tests"][0]["ok"]
    for shape in ("grpo-0.5b", "grpo-1.5b"):
        step = by_check[shape][0]
        assert step["ran_shape"] == "tiny" and step["device"] == "cpu"
        assert step["step_s"] > 0 and step["gen_tokens_per_s"] > 0 and step["update_tokens_per_s"] > 0
        assert 0 < step["mfu_step"] < 1 and step["peak_memory_gib"] > 0 and step["doctor_estimate_gib"] > 0
    trl = by_check["trl"][0]  # TRL's step where its wheels are installed, else why not
    assert (trl["ran"] and trl["step_s"] > 0) or (trl["ran"] is False and "not installed" in trl["why"])
    assert {r.get("mode") for r in by_check["async-longtail"]} >= {"sync", "streaming"}
