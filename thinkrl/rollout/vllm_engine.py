"""`vllm` rollout: vLLM's offline engine (`vllm.LLM`) in the worker's process.

Colocated, as verl and OpenRLHF run it: the engine lives in the same
process and on the same device as the actor, holds its own copy of the
weights, and gets the actor's after every update through vLLM's in-place
weight reload, in buckets, never through the disk (`update_weights`).

What comes back is the native engine's `Rollouts` record (prompt and
response ids, the sampled tokens' log-probs, finish reasons), so nothing
after generation knows which engine ran. Differences from `native` that a
user may see:
- Randomness: every prompt gets its own seed drawn from this engine's
  generator (its state is what checkpoints keep), so a batch's samples do
  not depend on how vLLM schedules it, and a resumed run draws the same.
- Log-probs are of softmax(logits / temperature) over the whole vocabulary,
  as the trainer's and `native`'s (`logprobs_mode`): vLLM's "processed"
  ones, or its "raw" ones when top-k/top-p/min_p truncate at temperature 1.
  Truncation at another temperature leaves them renormalised over the kept
  tokens (off by log(kept mass)); refused where they enter the update unless
  `rollout.accept_truncated_logprobs`.
- LoRA (`vllm_lora`): the engine serves the policy's adapter itself, sent
  alone after each update, or holds the base with it merged in.
- Sleep mode (`rollout.free_cache_engine`, CUDA only): after each rollout
  the KV cache is freed and the weights moved to the host while the actor
  trains; the weights come back for the sync, the cache for the next rollout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from typing import Callable, Iterable

import torch
from torch import Tensor

from thinkrl.config.checks import truncates
from thinkrl.errors import SetupError, UserError
from thinkrl.parallel.device import compute_dtype, empty_cache
from thinkrl.records import PromptBatch, Rollouts
from thinkrl.rollout.attest import AttestShare, Ledger, recording, unit_of
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import empty_rollouts
from thinkrl.rollout.vllm_attest import packed_modules, served_ledger
from thinkrl.rollout.vllm_checks import check_vllm_usable
from thinkrl.rollout.vllm_lora import (adapter_config, engine_adapter, engine_lora_arguments, install_adapter,
                                       lora_request, served_adapter)
from thinkrl.rollout.vllm_outputs import sampled_logprobs, to_rollouts
from thinkrl.rollout.vllm_versions import reload_with_tensors, translate_arguments, weight_loader
from thinkrl.rollout.vllm_vision import VisionInputs, is_synced, vision_engine_arguments
from thinkrl.rollout.weight_sync import buckets

_ARR = "actor_rollout_ref.rollout"


def engine_arguments(cfg, *, model_path: str, max_model_len: int, seed: int,
                     device_kind: str, in_process_group: bool = False,
                     vision: bool = False, lora_rank: int = 0) -> dict:
    """`vllm.LLM` keyword arguments from the rollout.* settings, then
    `rollout.engine_kwargs.vllm.*` on top (a user's explicit choice wins)."""
    rollout, model = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model
    load_format = "dummy" if rollout.load_format.startswith("dummy") else rollout.load_format
    args = dict(
        model=model_path, skip_tokenizer_init=True, trust_remote_code=model.trust_remote_code,
        dtype=engine_dtype(cfg, device_kind), seed=seed, load_format=load_format,
        tensor_parallel_size=rollout.tensor_model_parallel_size,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        enforce_eager=rollout.enforce_eager, max_model_len=rollout.max_model_len or max_model_len,
        max_num_batched_tokens=rollout.max_num_batched_tokens, max_num_seqs=rollout.max_num_seqs,
        # vLLM rewinds a seeded request's generator when it discards the token
        # of a partial (chunked) prefill, which CPU generators cannot do.
        enable_chunked_prefill=rollout.enable_chunked_prefill and device_kind != "cpu",
        disable_log_stats=rollout.disable_log_stats,
        enable_sleep_mode=sleeps(cfg, device_kind),
        logprobs_mode=logprobs_mode(rollout))
    if in_process_group and rollout.tensor_model_parallel_size > 1:
        # Each rank is one tensor-parallel worker of its engine, in the process
        # group the workers already share (vLLM splits it into engines of TP
        # ranks; every engine generates on its own, as in verl).
        args["distributed_executor_backend"] = "external_launcher"
    if vision:  # Qwen2.5-VL / Qwen2-VL: image features from the trainer (`vllm_vision`)
        args.update(vision_engine_arguments())
    if lora_rank:  # the engine serves the policy's adapter (`vllm_lora`)
        args.update(engine_lora_arguments(lora_rank))
    args.update(dict(rollout.engine_kwargs.get("vllm") or {}))
    return args


def logprobs_mode(rollout) -> str:
    """Which log-probs vLLM reports, chosen so that they are the trainer's
    distribution, softmax(logits / temperature) over the whole vocabulary:
    "processed" (after temperature) when the rollout does not truncate; when
    it does (top_p, top_k, min_p), "processed" would be renormalised over the
    kept tokens, so at temperature 1 "raw" (before any processing, which is
    then the same distribution). Truncation at another temperature keeps
    "processed", off by log(kept mass): refused where it enters the update
    unless rollout.accept_truncated_logprobs (`config.checks`)."""
    return "raw_logprobs" if truncates(rollout) and rollout.temperature == 1 else "processed_logprobs"


def engine_dtype(cfg, device_kind: str) -> str:
    """rollout.dtype with "auto" resolved to the trainer's compute dtype
    (model.dtype, whose "auto" is float32 on a CPU and bfloat16 elsewhere)."""
    dtype = cfg.actor_rollout_ref.rollout.dtype
    if dtype != "auto":
        return dtype
    return str(compute_dtype(device_kind, cfg.actor_rollout_ref.model.dtype)).removeprefix("torch.")


def sleeps(cfg, device_kind: str) -> bool:
    """vLLM's sleep mode frees device memory between rollouts; CUDA only."""
    return cfg.actor_rollout_ref.rollout.free_cache_engine and device_kind == "cuda"


def check_engine_arguments(args: dict) -> dict:
    """`args` with older releases' names translated (`vllm_versions`, logged);
    ValueError naming any other argument vLLM's engine does not take."""
    from vllm import EngineArgs
    known = {f.name for f in dataclasses.fields(EngineArgs)}
    args, notes = translate_arguments(args, known)
    for note in notes:
        logging.getLogger("thinkrl").warning("%s", note)
    unknown = sorted(set(args) - known)
    if unknown:
        raise UserError(f"{_ARR}.engine_kwargs.vllm: vLLM {_vllm_version()} has no engine "
                         f"argument {', '.join(map(repr, unknown))}; remove it (vllm.EngineArgs "
                         "lists the arguments)")
    return args


def _vllm_version() -> str:
    import vllm
    return vllm.__version__


class VllmEngine:
    """The RolloutEngine protocol on a `vllm.LLM`."""

    def __init__(self, llm, *, eos_token_ids: list[int], pad_token_id: int, seed: int,
                 bucket_megabytes: float, sleep_mode: bool,
                 vision: VisionInputs | None = None, lora_rank: int = 0,
                 load_weights: Callable[[object, list], None] = reload_with_tensors) -> None:
        self.llm = llm
        self.load_weights = load_weights  # this vLLM release's in-place load (`vllm_versions`)
        self.vision = vision  # a VL model: image features and M-RoPE positions from the trainer
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.pad_token_id = pad_token_id
        self.bucket_megabytes = bucket_megabytes
        self.sleep_mode = sleep_mode
        # Draws one seed per prompt; its state is the engine's checkpointed state.
        self.generator = torch.Generator().manual_seed(seed)
        self._asleep: set[str] = set()
        self.lora_rank = lora_rank  # > 0: the engine serves a LoRA adapter of this rank (`update_adapter`)
        self._adapter = None  # the LoRARequest naming the installed adapter

    @classmethod
    def start(cls, cfg, *, model_path: str, max_model_len: int, eos_token_ids: list[int],
              pad_token_id: int, seed: int, device_kind: str,
              group_rank: tuple[int, int] | None = None,
              vision_model: torch.nn.Module | None = None, lora_rank: int = 0) -> "VllmEngine":
        """Build the engine in this process, checking every argument first.

        group_rank: (rank, local rank) of this process in the workers'
        process group, when there is one: an engine over several ranks
        (TP > 1) is then built with vLLM's external launcher, which reads them
        from the environment as torchrun would set them. lora_rank > 0: the
        engine serves a LoRA adapter of that rank (`update_adapter`)."""
        # Set before vLLM is first imported. The engine core runs in this
        # process: it shares the device with the actor and takes the weights
        # by reference (no pickling of tensors).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if device_kind == "cpu":  # GiB of KV cache; vLLM's CPU default (4) is a laptop's worth
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        check_vllm_usable(device_kind)
        if group_rank is not None:
            os.environ["RANK"], os.environ["LOCAL_RANK"] = map(str, group_rank)
            tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
            if device_kind == "cpu" and tp > 1:
                remove_stale_cpu_shm(group_rank[0], tp)
        args = engine_arguments(cfg, model_path=model_path, max_model_len=max_model_len,
                                seed=seed, device_kind=device_kind,
                                in_process_group=group_rank is not None,
                                vision=vision_model is not None, lora_rank=lora_rank)
        args = check_engine_arguments(args)
        from vllm import LLM
        # Bucketed reloads leave every layer outside the bucket as it was, and
        # vLLM warns about each one; they are expected, not failures.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        try:
            llm = LLM(**args)
        except (ValueError, TypeError, RuntimeError) as err:
            raise SetupError(f"{_ARR}.name=vllm: vLLM could not start on {model_path}: {err}",
                             f"check the {_ARR}.* settings (max_model_len, gpu_memory_utilization, "
                             "dtype, engine_kwargs.vllm) against the message" + (
                                 "; an engine that cannot serve LoRA adapters takes merged weights "
                                 "with actor_rollout_ref.model.lora.merge=True" if lora_rank else "")) from err
        rollout = cfg.actor_rollout_ref.rollout
        return cls(llm, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, seed=seed,
                   bucket_megabytes=rollout.update_weights_bucket_megabytes,
                   sleep_mode=sleeps(cfg, device_kind),
                   vision=None if vision_model is None else VisionInputs(vision_model), lora_rank=lora_rank,
                   load_weights=weight_loader(_vllm_version()))

    # -- RolloutEngine --------------------------------------------------------
    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        # A VL model's image features: every rank computes them, with rows or without
        # (on shards, a collective).
        requests = self.vision.requests(prompts) if self.vision is not None else None
        if len(prompts) == 0:
            return empty_rollouts(prompts)
        from vllm.inputs import TokensPrompt
        if requests is None:
            requests = [{"prompt_token_ids": ids[mask.bool()].tolist()}
                        for ids, mask in zip(prompts.input_ids, prompts.attention_mask)]
        requests = [TokensPrompt(**request) for request in requests]
        # Greedy decoding draws nothing, as in `native`: a greedy validation
        # leaves the training stream (and an exact resume) untouched.
        seeds = ([None] * len(prompts) if params.greedy else
                 torch.randint(0, 2**62, (len(prompts),), generator=self.generator).tolist())
        self._wake("weights", "kv_cache")
        try:
            outputs = self.llm.generate(requests, [self.sampling(params, s) for s in seeds],
                                        use_tqdm=False, lora_request=self._adapter)
        finally:
            self._sleep()
        # Greedy decoding asks vLLM for one response (it refuses n > 1 there)
        # and repeats it, as the native engine's n identical rows.
        copies = params.n if params.greedy else 1
        rollouts = to_rollouts(prompts, [[(c.token_ids, sampled_logprobs(c), c.finish_reason)
                                          for c in out.outputs] * copies for out in outputs],
                               params=params, pad_token_id=self.pad_token_id)
        if self.vision is not None and prompts.model_inputs is not None:
            rollouts.model_inputs = self.vision.rollout_inputs(
                rollouts.prompt_ids, rollouts.prompt_mask,
                prompts.model_inputs.repeat_interleave(params.n))
        return rollouts

    def sampling(self, params: SamplingParams, seed: int):
        from vllm import SamplingParams as VllmSampling
        return VllmSampling(
            n=1 if params.greedy else params.n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=params.top_p, top_k=max(params.top_k, 0), min_p=params.min_p,
            max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
            # vLLM's ignore_eos passes only the model's own EOS; the run's stop ids
            # (template stop words) would still stop it, so they go too.
            stop_token_ids=[] if params.ignore_eos else list(self.eos_token_ids),
            logprobs=0, detokenize=False, seed=seed)

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]],
                       share: AttestShare | None = None) -> Ledger:
        """Load the actor's tensors into the engine in place (as this vLLM
        release does it: `vllm_versions`), one bucket (whole decoder layers)
        per call; then forget cached prompt KV, which the old weights computed.
        Returns the digests of what was sent (the units of `share`, when
        given), taken as the tensors enter (before any bucketing or loading),
        for `served` to be checked against."""
        self._wake("weights")
        # vLLM's in-place reload drops every adapter it holds: requests stop naming
        # ours until `update_adapter` installs it again (the attestation checks it did).
        self._adapter = None
        if self.vision is not None:  # the engine is given image features, not pixels
            named_tensors = ((name, t) for name, t in named_tensors if is_synced(name))
        sent = Ledger()
        named_tensors = recording(named_tensors, sent, dtype=self.dtype, packed=self.packed, share=share)
        for bucket in buckets(named_tensors, megabytes=self.bucket_megabytes):
            self.load_weights(self.llm, bucket)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM kept its prefix cache after a weight sync (requests still "
                               "running?): the next rollout would reuse KV of the old weights")
        return sent

    def update_adapter(self, named_tensors: Iterable[tuple[str, Tensor]], scalings: dict[str, float]
                       ) -> Ledger:
        """Put the policy's LoRA adapter (its A and B tensors, the PEFT
        module's names) in place of the engine's, in memory, and name it in
        every later request (`vllm_lora`). Returns the digests of what the
        engine was given, as `update_weights` does."""
        self._wake("weights")
        sent, tensors, modules = Ledger(), {}, set()
        for unit, name, tensor in engine_adapter(named_tensors, scalings, dtype=self.dtype):
            sent.add(unit_of(unit, self.packed), tensor)
            tensors[name] = tensor
            modules.add(unit.rsplit(".", 2)[-2])  # "q_proj" of "...q_proj.lora_A"
        config = adapter_config(self.lora_rank, modules)
        self.llm.collective_rpc(install_adapter, args=(tensors, config))
        self._adapter = lora_request()
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM kept its prefix cache after an adapter sync (requests still "
                               "running?): the next rollout would reuse KV of the old adapter")
        return sent

    def served(self, *, adapter_only: bool = False, share: AttestShare | None = None) -> list[Ledger]:
        """Digests of the weights each of this process's workers serves
        (`vllm_attest`; the units of `share`, when given), its adapter's too
        when it serves one (`vllm_lora`); the adapter's alone with
        `adapter_only` (the base, never rewritten after its load, is not read
        again: on a CPU that is the costly part)."""
        self._wake("weights")
        if adapter_only:
            return self.llm.collective_rpc(served_adapter)
        ledgers = self.llm.apply_model(functools.partial(served_ledger, share=share))
        if self._adapter is not None:
            for ledger, adapter in zip(ledgers, self.llm.collective_rpc(served_adapter)):
                ledger.include(adapter)
        return ledgers

    @functools.cached_property
    def dtype(self) -> torch.dtype:
        """The dtype the engine holds its weights in (the sent tensors are cast to it)."""
        return self.llm.llm_engine.model_config.dtype

    @functools.cached_property
    def packed(self) -> dict[str, list[str]]:
        """The engine model's fused tensors (q|k|v, gate|up), as vLLM declares them."""
        return self.llm.apply_model(packed_modules)[0]

    def generator_state(self) -> Tensor:
        return self.generator.get_state()

    def set_generator_state(self, state: Tensor) -> None:
        self.generator.set_state(state)

    def close(self) -> None:
        """Free the engine (and its device memory) now rather than at exit."""
        with contextlib.suppress(Exception):
            self._wake("weights", "kv_cache")
        self.llm = None

    # -- sleep mode -----------------------------------------------------------
    def _sleep(self) -> None:
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)  # level 1 keeps the weights (on the host)
            self._asleep = {"weights", "kv_cache"}
            empty_cache("cuda")  # sleep mode is CUDA's: the trainer gets the blocks back

    def _wake(self, *tags: str) -> None:
        wanted = [t for t in tags if t in self._asleep]
        if wanted:
            empty_cache("cuda")  # the trainer's cached blocks, for vLLM to take
            self.llm.wake_up(tags=wanted)
            self._asleep -= set(wanted)


def remove_stale_cpu_shm(rank: int, tp: int, folder: str = "/dev/shm") -> list[str]:
    """Delete the shared-memory segment this rank's tensor-parallel group
    would create on CPU, if a previous run left it behind.

    vLLM's CPU communicator names it after the group's ranks only
    ("<ident>-tp:<n>-[r0-r1]-cpushm_<i>", the same in every run under the
    external launcher), and a run whose workers were killed never unlinks
    it, so the next run would fail with "create shm ... errno 17". Two live
    runs on one host cannot share the name either way."""
    import glob
    first = rank - rank % tp
    ranks = "-".join(str(r) for r in range(first, first + tp))
    removed = []
    for path in glob.glob(os.path.join(folder, f"*-tp:*-[[]{ranks}[]]-cpushm_{rank - first}")):
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
    return removed
