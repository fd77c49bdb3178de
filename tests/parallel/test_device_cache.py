"""Emptying the accelerator allocator's cache between the colocated trainer
and rollout engine: the accelerator's own call, never on a CPU."""

from __future__ import annotations

import torch

from thinkrl.parallel import device


class FakeAccelerator:
    def __init__(self, available: bool) -> None:
        self.available, self.emptied = available, 0

    def is_available(self) -> bool:
        return self.available

    def empty_cache(self) -> None:
        self.emptied += 1


def test_the_cache_of_an_accelerator_is_emptied_and_a_cpu_is_left_alone(monkeypatch):
    modules = {"cuda": FakeAccelerator(True), "npu": FakeAccelerator(False)}
    asked = []

    def get_device_module(kind: str):
        asked.append(kind)
        return modules[kind]

    monkeypatch.setattr(torch, "get_device_module", get_device_module)
    device.empty_cache("cpu")
    assert asked == []  # a CPU has no caching allocator to ask
    device.empty_cache("cuda")
    device.empty_cache("npu")  # installed but not usable here: nothing to empty
    assert (modules["cuda"].emptied, modules["npu"].emptied) == (1, 0)


def test_the_reference_keeps_its_compute_dtype_on_accelerators_only():
    assert device.frozen_weights_dtype(torch.device("cuda", 0), torch.bfloat16) == torch.bfloat16
    assert device.frozen_weights_dtype(torch.device("meta"), torch.float16) == torch.float16  # any non-CPU
    # on a CPU the reference stays float32, whatever the compute dtype: its first
    # forward equals the actor's (float32 master weights under the same autocast)
    assert device.frozen_weights_dtype(torch.device("cpu"), torch.bfloat16) == torch.float32
