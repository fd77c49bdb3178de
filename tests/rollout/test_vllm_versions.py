"""The vLLM release adapter (`thinkrl.rollout.vllm_versions`): which releases
run, and which in-place weight load each gets. The >= 0.16 path runs for real
in the vllm group (tests/rollout/test_vllm_engine.py, vLLM 0.32's CPU build);
no release before 0.16 installs beside this torch, so the older path is
checked here against a stand-in worker with a real module."""

from types import SimpleNamespace

import pytest
import torch

from thinkrl.rollout import vllm_versions as vv


@pytest.mark.parametrize("text, expected", [
    ("0.32.0", (0, 32)), ("0.32.0+cpu", (0, 32)), ("0.11.0rc1", (0, 11)), ("0.9.1", (0, 9)),
    ("0.10.1.1", (0, 10)), ("1.0.0.dev3", (1, 0))])
def test_release(text, expected):
    assert vv.release(text) == expected


def test_releases_before_processed_logprobs_are_refused_with_the_range():
    found, fix = vv.version_problem("0.9.1")  # vllm-ascend 0.9.1's line
    assert "vLLM >= 0.10" in found and "vLLM 0.9.1" in found and "rollout.name=native" in fix
    for ok in ("0.10.0", "0.11.0rc1", "0.15.1", "0.32.0+cpu"):
        assert vv.version_problem(ok) is None, ok


class _Recorder:
    def __init__(self, worker):
        self.worker, self.calls = worker, []

    def collective_rpc(self, method, args=(), kwargs=None):
        """As vLLM does: a name is a worker method, a function gets the worker first."""
        self.calls.append(method)
        target = getattr(self.worker, method) if isinstance(method, str) else (
            lambda *a, **k: method(self.worker, *a, **k))
        return [target(*args, **(kwargs or {}))]


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(2, 2, bias=False)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)


def test_each_release_loads_by_its_own_path():
    new = torch.ones(2, 2)
    # 0.16 and later: the workers' reload_weights(weights_iterator=...)
    reloaded = []
    llm = _Recorder(SimpleNamespace(reload_weights=lambda weights_iterator: reloaded.append(
        list(weights_iterator))))
    vv.weight_loader("0.32.0")(llm, [("proj.weight", new)])
    assert llm.calls == ["reload_weights"] and reloaded[0][0][0] == "proj.weight"
    # before 0.16: each worker's model loads the tensors itself
    model = _Model()
    llm = _Recorder(SimpleNamespace(model_runner=SimpleNamespace(model=model)))
    vv.weight_loader("0.11.0rc1")(llm, [("proj.weight", new)])
    assert callable(llm.calls[0]) and torch.equal(model.proj.weight, new)


def test_an_older_releases_engine_argument_becomes_its_successor():
    # seed 004 (vLLM 0.11) sets disable_mm_preprocessor_cache=True; 0.32 sizes the cache instead
    known = {"model", "mm_processor_cache_gb"}
    args, notes = vv.translate_arguments({"model": "m", "disable_mm_preprocessor_cache": True}, known)
    assert args == {"model": "m", "mm_processor_cache_gb": 0.0}
    assert "disable_mm_preprocessor_cache=True" in notes[0] and "mm_processor_cache_gb=0.0" in notes[0]
    args, _ = vv.translate_arguments({"disable_mm_preprocessor_cache": False}, known)
    assert args == {}  # cache left on, at its default
    # a release that still takes the old name keeps it; an explicit new value wins
    old_release = {"disable_mm_preprocessor_cache", "mm_processor_cache_gb"}
    assert vv.translate_arguments({"disable_mm_preprocessor_cache": True}, old_release)[0] == {
        "disable_mm_preprocessor_cache": True}
    args, _ = vv.translate_arguments({"disable_mm_preprocessor_cache": True,
                                      "mm_processor_cache_gb": 2.0}, known)
    assert args == {"mm_processor_cache_gb": 2.0}
