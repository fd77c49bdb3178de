"""The context every doctor check reads: the run's config and what the
checks share (sizes, model path, config and tokenizer, device kind), each
computed once on first use, and the probes that compute them.

A property whose input is broken raises `NotChecked`; the runner
(`thinkrl.doctor.core`) turns it into a `skip` row with the reason.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thinkrl.builtin import resolve_model_path
from thinkrl.assets import tokenizer_options, tokenizer_path
from thinkrl.config.checks import validate
from thinkrl.config.schema import Config
from thinkrl.doctor.targets import Target
from thinkrl.models.loading import load_tokenizer


class NotChecked(Exception):
    """Raised by a context property whose input is broken; the runner turns it
    into a `skip` row carrying this message."""


@dataclass
class DoctorContext:
    """One run's config and what the checks share, each computed once on
    first use (loading the tokenizer serves the model, data and memory checks)."""

    cfg: Config
    log: Callable[[str], None] = field(default=lambda _msg: None)
    """Where progress notes go (building a built-in asset, ...)."""
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    """Environment variables (a mapping, so tests can pass their own)."""
    memo: dict[str, Any] = field(default_factory=dict)
    """What one check computed for others (see `remember`), by name."""
    device: str | None = None
    """The device kind to judge for ("cuda", "npu", "cpu"); None: this machine's
    (`thinkrl rehearse` projects the cluster's from a laptop)."""
    target: Target | None = None
    """The machine to judge for (`--target h100x8`): its device kind, memory
    and devices per node replace this machine's."""

    def remember(self, key: str, compute: Callable[[], Any]) -> Any:
        """`compute()` once per context; a NotChecked it raises is raised again
        on every later call, so every dependent check skips with the reason."""
        if key not in self.memo:
            try:
                self.memo[key] = compute()
            except NotChecked as why:
                self.memo[key] = why
        value = self.memo[key]
        if isinstance(value, NotChecked):
            raise NotChecked(str(value))
        return value

    @functools.cached_property
    def sizes(self):
        """The derived per-device sizes (`config.checks.validate`)."""
        try:
            return validate(self.cfg)
        except ValueError:
            raise NotChecked("needs valid batch sizes: see config/validate") from None

    @functools.cached_property
    def model_path(self) -> str:
        """actor_rollout_ref.model.path with a `builtin:` name resolved to its folder."""
        try:
            return resolve_model_path(self.cfg.actor_rollout_ref.model.path, log=self.log)
        except ValueError as err:
            raise NotChecked(f"needs the model: {err}") from None

    @functools.cached_property
    def model_config(self):
        """The model's Hugging Face config (config.json only, no weights)."""
        return load_model_config(self)

    @functools.cached_property
    def tokenizer(self):
        """The run's tokenizer, loaded as a run loads it."""
        return load_run_tokenizer(self)

    @functools.cached_property
    def param_count(self) -> int:
        return estimate_param_count(self.model_config)

    @functools.cached_property
    def device_kind(self) -> str:
        """"cpu", "cuda" or "npu": `device` when given, else trainer.device, with
        `auto` decided as `thinkrl.parallel.device.resolve_device` decides it."""
        return self.device or (self.target.kind if self.target else detect_device_kind(self))


def fetchable(ctx: DoctorContext, path: str) -> str:
    """`path` itself when it is a local folder or the hub can be reached; its
    snapshot folder when it is a hub id already in the Hugging Face cache;
    else OSError at once (offline, transformers would retry for minutes)."""
    if Path(path).expanduser().exists():
        return path

    def compute() -> str:
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(path, local_files_only=True)
        except Exception:  # not cached, or not a valid repo id: ask the hub below
            pass
        endpoint = ctx.env.get("HF_ENDPOINT", "https://huggingface.co")
        if ctx.env.get("HF_HUB_OFFLINE", "0") not in ("0", "") or not _reachable(endpoint):
            return OSError(f"{path} is not a local folder, not in the Hugging Face cache "
                           f"(HF_HOME), and {endpoint} cannot be reached from here")
        return path
    found = ctx.remember(f"fetchable:{path}", compute)
    if isinstance(found, OSError):
        raise found
    return found


def _reachable(url: str, timeout_s: float = 3.0) -> bool:
    import socket
    from urllib.parse import urlparse

    parts = urlparse(url)
    try:
        socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def load_model_config(ctx: DoctorContext):
    """AutoConfig of the run's model (with model.override_config applied)."""
    from transformers import AutoConfig

    model = ctx.cfg.actor_rollout_ref.model
    try:
        path = fetchable(ctx, ctx.model_path)
        if model.external_lib:
            import importlib
            importlib.import_module(model.external_lib)
        return AutoConfig.from_pretrained(path, trust_remote_code=model.trust_remote_code,
                                          **model.override_config)
    except Exception as err:  # OSError, ValueError, ImportError, a remote-code error ...
        ctx.memo["model-config-error"] = err
        raise NotChecked("needs the model's config: see model/config") from None


def load_run_tokenizer(ctx: DoctorContext):
    """The tokenizer exactly as a run loads it (`thinkrl.assets`)."""
    path = tokenizer_path(ctx.cfg, ctx.model_path)
    try:
        return load_tokenizer(fetchable(ctx, path), **tokenizer_options(ctx.cfg))
    except (OSError, ValueError) as err:
        ctx.memo["tokenizer-error"] = err
        raise NotChecked("needs the tokenizer: see model/tokenizer") from None


def estimate_param_count(config) -> int:
    """Parameters of a decoder-only transformer (Llama / Qwen2 / Qwen3 /
    Mistral family: gated MLP, grouped-query attention; Qwen2-MoE and
    Qwen3-MoE's expert layers) from its config.

        embed  = V*h                 (+ V*h for the LM head unless tied)
        layer  = h*(a*d) + 2*h*(k*d) + (a*d)*h     q, k, v, o projections
               + (a*d + 2*k*d) if q/k/v have biases (Qwen2)
               + 2*d if queries and keys have their own RMSNorm (Qwen3)
               + mlp                               (below)
               + 2*h                               two RMSNorms
        mlp    = 3*h*i                             gate, up, down (dense layer)
               = E*3*h*m + h*E                     E experts and the router (MoE layer)
                 + 3*h*s + h                       a shared expert and its gate (Qwen2-MoE)
        total  = embed + sum over layers + h       final norm

    V vocab_size, h hidden_size, i intermediate_size, L num_hidden_layers,
    a num_attention_heads, k num_key_value_heads, d head_dim (h/a unless
    given), E num_experts, m moe_intermediate_size, s
    shared_expert_intermediate_size. A layer is an MoE layer unless it is in
    mlp_only_layers or (index + 1) is not a multiple of decoder_sparse_step.
    Multimodal configs count their text model only. Every expert counts:
    what is stored and trained, not what one token uses.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    h, layers, vocab = text.hidden_size, text.num_hidden_layers, text.vocab_size
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or h // heads
    qkv_bias = getattr(text, "attention_bias", text.model_type.startswith("qwen2"))
    attention = h * heads * head_dim * 2 + 2 * h * kv_heads * head_dim
    if qkv_bias:
        attention += heads * head_dim + 2 * kv_heads * head_dim
    if text.model_type.startswith("qwen3"):
        attention += 2 * head_dim
    mlps = sum(_mlp_param_count(text, index) for index in range(layers))
    embeddings = vocab * h * (1 if getattr(text, "tie_word_embeddings", False) else 2)
    return embeddings + layers * (attention + 2 * h) + mlps + h


def _mlp_param_count(text, index: int) -> int:
    """The MLP of layer `index`: dense, or experts with their router (`estimate_param_count`)."""
    h = text.hidden_size
    experts = getattr(text, "num_experts", None) or 0
    expert_size = getattr(text, "moe_intermediate_size", None)
    step = getattr(text, "decoder_sparse_step", 1) or 1
    if (not experts or not expert_size or index in (getattr(text, "mlp_only_layers", None) or [])
            or (index + 1) % step):
        return 3 * h * text.intermediate_size
    count = experts * 3 * h * expert_size + h * experts
    shared = getattr(text, "shared_expert_intermediate_size", None) or 0
    return count + (3 * h * shared + h if shared else 0)


def detect_device_kind(ctx: DoctorContext) -> str:
    """trainer.device, with `auto` decided as `parallel.device.resolve_device`
    does (cuda, then npu, then cpu), without failing when it is unavailable."""
    import torch

    name = ctx.cfg.trainer.device
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    npu = getattr(torch, "npu", None)
    if torch_npu_module() is not None and npu is not None and npu.is_available():
        return "npu"
    return "cpu"


def torch_npu_module():
    """torch_npu when it is installed (imported then), else None."""
    import importlib.util
    import sys

    if "torch_npu" in sys.modules:
        return sys.modules["torch_npu"]
    if importlib.util.find_spec("torch_npu") is None:
        return None
    import torch_npu
    return torch_npu
