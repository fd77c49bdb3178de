"""What a user sees during a long step: the stage running now, and a note at
start when the machine is busy."""

from __future__ import annotations

import os

import torch

from thinkrl.metrics import StageTimer
from thinkrl.preflight import busy_machine_note


def test_the_timer_tells_the_innermost_stage_as_it_changes():
    told: list[str] = []
    timer = StageTimer(on_stage=told.append)
    with timer("step"):
        with timer("gen"):
            pass
        with timer("update_actor"):
            pass
    assert told == ["step", "gen", "step", "update_actor", "step"]
    assert set(timer.metrics()) == {"timing_s/step", "timing_s/gen", "timing_s/update_actor"}


def test_a_busy_machine_is_noted_with_its_load_and_threads(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    monkeypatch.setattr(torch, "get_num_threads", lambda: cores)
    assert busy_machine_note() is None
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0 * os.cpu_count(), 1.0, 1.0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4 * cores)
    note = busy_machine_note()
    assert note.startswith("note: this machine is busy (load average")
    assert f"torch runs {4 * cores} threads on {cores} cores (set OMP_NUM_THREADS={cores})" in note
