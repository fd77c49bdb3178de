"""One run per run directory: the lock, its refusal message, stale takeover,
and a live writer's temporary save folder left alone."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import thinkrl.checkpoint.lock as lock_module
from thinkrl.checkpoint.lock import LOCK_FILE, STALE_AFTER_S, RunLock, last_locked_run_dir
from thinkrl.checkpoint.store import remove_stale_tmp
from thinkrl.errors import SetupError

_HOLD = """
import sys, time
from thinkrl.checkpoint.lock import RunLock
lock = RunLock.acquire(sys.argv[1], log=lambda *_: None)
print("locked", flush=True)
time.sleep(600)
"""


def _holder(run_dir):
    """A child process that takes the lock and sleeps (until killed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)], stdout=subprocess.PIPE,
                             text=True, env=env)
    assert child.stdout.readline().strip() == "locked"
    return child


def test_second_lock_in_one_process_is_refused_naming_the_holder(tmp_path):
    run_dir = tmp_path / "runs" / "exp"
    first = RunLock.acquire(run_dir)
    assert run_dir.is_dir() and last_locked_run_dir() == run_dir.resolve()
    record = json.loads((run_dir / LOCK_FILE).read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    with pytest.raises(SetupError) as err:
        RunLock.acquire(run_dir)
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in err.value.problem
    assert "trainer.experiment_name=" in err.value.fix
    first.release()
    first.release()  # idempotent
    assert (run_dir / LOCK_FILE).read_text() == ""  # released cleanly: nothing to take over
    notes = []
    RunLock.acquire(run_dir, log=notes.append).release()
    assert notes == []


def test_lock_held_by_another_process_refuses_then_is_taken_over_after_kill_9(tmp_path):
    child = _holder(tmp_path)
    try:
        with pytest.raises(SetupError, match=f"pid {child.pid} on host"):
            RunLock.acquire(tmp_path)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    notes = []
    lock = RunLock.acquire(tmp_path, log=notes.append)
    assert len(notes) == 1 and f"pid {child.pid}" in notes[0] and "killed or crashed" in notes[0]
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_holder_that_has_not_written_yet_is_still_refused(tmp_path):
    import fcntl

    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # locked, record not yet written
    try:
        with pytest.raises(SetupError, match="started a moment ago"):
            RunLock.acquire(tmp_path)
    finally:
        os.close(fd)


def _record_of_another_host(run_dir, *, silent_s: float) -> None:
    """A lock record written on host "elsewhere" 10 min ago, its file last touched `silent_s` ago."""
    path = run_dir / LOCK_FILE
    path.write_text(json.dumps({"pid": 7, "host": "elsewhere", "started": time.time() - 600}))
    os.utime(path, (time.time() - silent_s, time.time() - silent_s))


def test_lock_of_another_host_with_a_recent_heartbeat_is_refused(tmp_path):
    # A shared disk may not carry flocks between machines: the heartbeat decides.
    _record_of_another_host(tmp_path, silent_s=20)
    with pytest.raises(SetupError) as err:
        RunLock.acquire(tmp_path)
    assert "pid 7 on host elsewhere" in err.value.problem and "last sign of life 20 s ago" in err.value.problem
    assert f"delete {tmp_path / LOCK_FILE}" in err.value.fix
    assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == "elsewhere"  # left as it was


def test_lock_of_another_host_silent_for_long_is_taken_over_with_a_note(tmp_path):
    _record_of_another_host(tmp_path, silent_s=STALE_AFTER_S + 60)
    notes = []
    RunLock.acquire(tmp_path, log=notes.append).release()
    assert "another host" in notes[0] and "elsewhere" in notes[0] and "10 min ago" in notes[0]
    assert "no sign of life for 11 min" in notes[0]


def test_a_live_run_touches_its_lock_file(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_module, "HEARTBEAT_S", 0.05)
    path = tmp_path / LOCK_FILE
    with RunLock.acquire(tmp_path):
        os.utime(path, (0, 0))
        deadline = time.time() + 10
        while path.stat().st_mtime == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert time.time() - path.stat().st_mtime < 10


def test_deleting_the_lock_file_of_a_live_run_does_not_let_a_second_run_in(tmp_path):
    child = _holder(tmp_path)
    try:
        (tmp_path / LOCK_FILE).unlink()
        with pytest.raises(SetupError) as err:
            RunLock.acquire(tmp_path)
        assert "was deleted while it ran" in err.value.problem
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    RunLock.acquire(tmp_path, log=lambda *_: None).release()  # free once the holder is gone


def test_stale_save_of_a_live_process_is_kept(tmp_path):
    child = _holder(tmp_path / "other")
    try:
        live = tmp_path / f"global_step_2.tmp-{child.pid}"
        dead = tmp_path / "global_step_3.tmp-99999999"
        live.mkdir()
        dead.mkdir()
        notes = []
        remove_stale_tmp(tmp_path, log=notes.append)
        assert live.is_dir() and not dead.exists()
        assert any("keeping" in n and str(child.pid) in n for n in notes)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
