"""LoRA adapters on the policy (actor_rollout_ref.model.lora_rank > 0), with PEFT.

The adapter is injected into the loaded model in place (`attach_lora`): the
module stays the Hugging Face *ForCausalLM the rest of thinkrl handles (its
forward, FSDP2's per-layer sharding, the native engine), each targeted
nn.Linear becoming PEFT's lora.Linear, which computes

    y = x W^T + b + s * (x A^T) B^T,   s = lora_alpha / lora_rank,
    W [out, in] frozen (the base), A [r, in] and B [out, r] trained (B starts at 0).

Only A and B require gradients, so AdamW (`make_adamw`) holds state for
them alone. The reference policy is the same module with the adapter
switched off (`Lora.disabled`): no second copy of the model.

Names: in the module, `model.layers.0.self_attn.q_proj.base_layer.weight`
and `...q_proj.lora_A.default.weight`; in PEFT's saved adapter
(adapter_model.safetensors), `base_model.model.model.layers.0.self_attn.
q_proj.lora_A.weight` (`saved_key` / `module_key` convert). An engine with
its own weights receives the base's names with B A merged in
(`merged_tensors`), computed out of place in float32: the trained base is
never modified, so nothing drifts from merging and unmerging.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import Tensor

from thinkrl.errors import UserError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_NAME = "default"
_SAVED_PREFIX = "base_model.model."
# "<module>.base_layer.weight|bias", "<module>.lora_A|lora_B.default.weight"
_LORA_PART = re.compile(r"^(.*)\.(?:base_layer\.(weight|bias)|(lora_A|lora_B)\.[^.]+\.weight)$")


@dataclass(frozen=True)
class LoraSettings:
    """actor_rollout_ref.model.lora_* as PEFT needs them."""

    rank: int
    alpha: float
    target_modules: str | tuple[str, ...]
    exclude_modules: str | tuple[str, ...] | None = None
    adapter_path: str | None = None
    """A saved PEFT adapter folder to start from (lora_adapter_path); its own
    adapter_config.json then decides the targets (rank and alpha must agree:
    the config checks)."""
    key: str = "actor_rollout_ref.model"
    """The config section these come from (for messages)."""

    @classmethod
    def of(cls, model_cfg, key: str = "actor_rollout_ref.model") -> "LoraSettings | None":
        """From a model section (`key`); None when lora_rank is 0 (full fine-tuning)."""
        if model_cfg.lora_rank <= 0:
            return None
        as_names = lambda v: v if v is None or isinstance(v, str) else tuple(v)  # noqa: E731
        return cls(rank=model_cfg.lora_rank, alpha=float(model_cfg.lora_alpha),
                   target_modules=as_names(model_cfg.target_modules),
                   exclude_modules=as_names(model_cfg.exclude_modules),
                   adapter_path=getattr(model_cfg, "lora_adapter_path", None),  # the critic has none
                   key=key)

    def excluding(self, name: str) -> "LoraSettings":
        """These settings with module `name` (and `*.name`) kept without an adapter."""
        excluded = self.exclude_modules
        if excluded is None:
            excluded = (name,)
        elif isinstance(excluded, str):  # PEFT reads a string as a regular expression
            excluded = rf"(?:{excluded})|(?:(?:.*\.)?{re.escape(name)})"
        else:
            excluded = (*excluded, name)
        return dataclasses.replace(self, exclude_modules=excluded)

    def peft_config(self):
        import peft

        if self.adapter_path is not None:
            config = peft.LoraConfig.from_pretrained(self.adapter_path)
            # pi_old, pi and pi_ref must be the same function of the weights: no dropout.
            # The saved values are loaded over the init, and an init such as PiSSA's
            # would rewrite the base weights: none.
            config.inference_mode, config.lora_dropout, config.init_lora_weights = False, 0.0, False
            return config
        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        excluded = (self.exclude_modules if self.exclude_modules is None or isinstance(self.exclude_modules, str)
                    else list(self.exclude_modules))
        return peft.LoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=targets,
                               exclude_modules=excluded, lora_dropout=0.0, bias="none")


def read_adapter_config(folder: str | Path) -> dict:
    """A PEFT adapter folder's adapter_config.json, or a ValueError naming what is missing."""
    path = Path(folder).expanduser() / ADAPTER_CONFIG
    if not path.is_file():
        raise UserError(f"{folder}: no {ADAPTER_CONFIG}; give a folder saved by PEFT "
                         "(save_pretrained) or by `thinkrl export` of a LoRA run")
    return json.loads(path.read_text())


class Lora:
    """The adapter of one policy module: switch it off, read and write it."""

    def __init__(self, peft_model, model: torch.nn.Module) -> None:
        self.peft_model = peft_model  # PeftModel: owns the adapter's config and switch
        self.model = model  # the *ForCausalLM, adapters injected (peft_model.base_model.model)

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """The base model: forwards inside skip every adapter (the reference policy).

        Each adapted layer's switch is flipped directly: PEFT's own
        (`disable_adapter`) also turns requires_grad off, and FSDP2 fixes a
        layer's gradient dtypes at its first forward from the parameters
        that require grad then: a first forward in here would leave the
        adapters' gradients without a reduce dtype."""
        layers = self.layers()
        for layer in layers:
            layer._disable_adapters = True
        try:
            yield
        finally:
            for layer in layers:
                layer._disable_adapters = False

    def layers(self) -> list[torch.nn.Module]:
        from peft.tuners.lora import LoraLayer

        return [m for m in self.model.modules() if isinstance(m, LoraLayer)]

    @property
    def config(self):
        return self.peft_model.peft_config[ADAPTER_NAME]

    def trainable_names(self) -> list[str]:
        return [name for name, p in self.model.named_parameters() if p.requires_grad]

    def scalings(self) -> dict[str, float]:
        """Each adapted module's s = alpha / r, by module name."""
        from peft.tuners.lora import LoraLayer

        return {name: float(module.scaling[ADAPTER_NAME]) for name, module in self.model.named_modules()
                if isinstance(module, LoraLayer) and ADAPTER_NAME in module.scaling}

    def save(self, folder: Path, tensors: dict[str, Tensor], *, base_model: str) -> None:
        """PEFT's adapter folder: adapter_config.json and adapter_model.safetensors
        (`tensors` keyed by module names, whole). `base_model` is recorded as
        base_model_name_or_path (what `--merge` and PEFT load the adapter onto)."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        config = self.config
        config.base_model_name_or_path = base_model
        config.save_pretrained(str(folder))
        saved = {saved_key(name): t.detach().to("cpu", torch.float32).contiguous()
                 for name, t in tensors.items()}
        save_file(saved, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})

    def load_tensors(self, folder: str | Path) -> dict[str, Tensor]:
        """An adapter folder's tensors keyed by this module's names; a
        ValueError when they are not exactly this adapter's."""
        from safetensors.torch import load_file

        path = Path(folder).expanduser() / ADAPTER_WEIGHTS
        if not path.is_file():
            raise UserError(f"{folder}: no {ADAPTER_WEIGHTS}; the adapter folder is incomplete")
        tensors = {module_key(k): v for k, v in load_file(str(path)).items()}
        expected = set(self.trainable_names())
        if set(tensors) != expected:
            missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
            raise UserError(f"{path} does not fit this model's adapter: "
                             f"{len(missing)} missing (first: {missing[:1]}), "
                             f"{len(extra)} unexpected (first: {extra[:1]}); it was saved for "
                             "another model or other target_modules")
        return tensors


def saved_key(name: str) -> str:
    """Module name -> PEFT's saved name (no adapter name, the PeftModel prefix)."""
    return _SAVED_PREFIX + re.sub(rf"\.(lora_[AB])\.{ADAPTER_NAME}\.", r".\1.", name)


def module_key(key: str) -> str:
    """PEFT's saved name -> module name (inverse of `saved_key`)."""
    name = key[len(_SAVED_PREFIX):] if key.startswith(_SAVED_PREFIX) else key
    return re.sub(r"\.(lora_[AB])\.weight$", rf".\1.{ADAPTER_NAME}.weight", name)


def attach_lora(model: torch.nn.Module, settings: LoraSettings) -> Lora:
    """Inject `settings`' adapters into `model` in place (its base weights
    frozen) and return the handle. A model on the meta device (a rank that
    receives its weights by broadcast) gets meta adapters."""
    import peft

    nothing = UserError(f"{settings.key}.target_modules={settings.target_modules!r} "
                         f"matches no layer of {type(model).__name__}; use all-linear or names such "
                         "as [q_proj, v_proj]")
    with warnings.catch_warnings():
        # PEFT asks the model a deprecated gradient-checkpointing question, and
        # notes that a loaded adapter's base path is replaced by this model's.
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*base_model_name_or_path.*")
        try:
            peft_model = peft.get_peft_model(model, settings.peft_config(), adapter_name=ADAPTER_NAME)
        except ValueError as err:
            if "not found in the base model" in str(err):
                raise nothing from None
            raise
    if not any(p.requires_grad for p in model.parameters()):
        raise nothing
    lora = Lora(peft_model, model)
    _check_adapted_layers(lora, settings)
    model.__dict__[_HANDLE] = lora  # beside the modules, not one of them: `lora_of`
    return lora


_HANDLE = "_thinkrl_lora"


def lora_of(model: torch.nn.Module) -> Lora | None:
    """The handle `attach_lora` gave `model` (None for a model without
    adapters): read from the model a build returns, so it is always that
    model's, whichever models were built before."""
    return model.__dict__.get(_HANDLE)


def _check_adapted_layers(lora: Lora, settings: LoraSettings) -> None:
    """Only decoder projections: a LoRA nn.Linear over a plain nn.Linear (what
    the merge and the lean forward compute). Embeddings, the output head and
    transposed (Conv1D) layers are refused by name."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    head = lora.model.get_output_embeddings()
    for name, module in lora.model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        base = getattr(module, "base_layer", None)
        if type(module).__name__ == "ParamWrapper":  # PEFT's LoRA on a fused parameter (MoE experts)
            raise UserError(
                f"{settings.key}.target_modules={settings.target_modules!r} adapts {name}, a mixture of "
                "experts' fused parameters (PEFT maps all-linear and gate/up/down names onto them for "
                "transformers 5's MoE layers): thinkrl trains LoRA on linear projections only; name the "
                "attention's, e.g. target_modules=[q_proj,k_proj,v_proj,o_proj]")
        if type(module) is not LoraLinear or type(base) is not torch.nn.Linear or base is head \
                or getattr(module, "fan_in_fan_out", False) or module.lora_variant \
                or any(module.lora_bias.values()):
            raise UserError(
                f"{settings.key}.target_modules={settings.target_modules!r} adapts {name} "
                f"({type(base).__name__}): thinkrl trains LoRA on the decoder's linear projections "
                "only; use all-linear or names such as [q_proj, v_proj], or exclude_modules")


def load_adapter_weights(lora: Lora, folder: str | Path) -> None:
    """Copy a saved adapter's tensors into the (unsharded) module."""
    lora.model.load_state_dict(lora.load_tensors(folder), strict=False)  # exactly the adapter's: checked


def merged_weight(weight: Tensor, a: Tensor, b: Tensor, scale: float) -> Tensor:
    """W + s B A [out, in] for W [out, in], A [r, in], B [out, r]: summed in
    float32, returned in W's dtype, out of place (W is never changed)."""
    return (weight.float() + scale * (b.float() @ a.float())).to(weight.dtype)


def merged_tensors(named: Iterable[tuple[str, Tensor]], scalings: dict[str, float]
                   ) -> Iterator[tuple[str, Tensor]]:
    """The base model's (name, tensor) pairs with each adapter merged in:
    W' = W + s B A, in float32, out of place. Input: a LoRA module's state
    entries in state-dict order (each module's base weight, bias, A, B
    together, as PEFT registers them); everything else passes through."""
    pending: dict[str, dict[str, Tensor]] = {}
    for name, tensor in named:
        found = _LORA_PART.match(name)
        if found is None:
            yield name, tensor
            continue
        module, base_part, lora_part = found.groups()
        if base_part == "bias":
            yield f"{module}.bias", tensor
            continue
        parts = pending.setdefault(module, {})
        parts[base_part or lora_part] = tensor
        if len(parts) == 3:
            del pending[module]
            yield f"{module}.weight", merged_weight(parts["weight"], parts["lora_A"], parts["lora_B"],
                                                    scalings[module])
    if pending:
        raise RuntimeError(f"adapted modules without all of base weight, A and B: {sorted(pending)[:3]}")


def base_tensors(named: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
    """The base model's (name, tensor) pairs of a LoRA module's state
    entries: "<module>.base_layer.weight" as "<module>.weight", A and B left out."""
    for name, tensor in named:
        found = _LORA_PART.match(name)
        if found is None:
            yield name, tensor
        elif found.group(2) is not None:
            yield f"{found.group(1)}.{found.group(2)}", tensor


def adapter_part(name: str) -> tuple[str, str] | None:
    """(module, "lora_A" or "lora_B") of a LoRA module's state entry that is
    an adapter's A or B; None for any other entry."""
    found = _LORA_PART.match(name)
    return None if found is None or found.group(3) is None else (found.group(1), found.group(3))


def is_adapter_tensor(name: str) -> bool:
    """Whether a LoRA module's state entry is an adapter's A or B."""
    return adapter_part(name) is not None


_DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def adapter_parameter_count(text_config, rank: int, target_modules: str | list[str] | tuple[str, ...]) -> int:
    """Trainable parameters of rank-`rank` adapters on a Llama/Qwen2-style
    decoder (for the doctor's estimate, before any model exists): r (in + out)
    per adapted nn.Linear(in, out), all seven projections of every layer for
    all-linear, else those named. exclude_modules is not subtracted (an upper bound)."""
    h, heads = text_config.hidden_size, text_config.num_attention_heads
    d = getattr(text_config, "head_dim", None) or h // heads
    kv = (getattr(text_config, "num_key_value_heads", None) or heads) * d
    inter = text_config.intermediate_size
    shapes = {"q_proj": (h, heads * d), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (heads * d, h),
              "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}
    names = (_DECODER_LINEARS if target_modules == "all-linear"
             else [n for n in ([target_modules] if isinstance(target_modules, str) else target_modules)
                   if n in shapes])
    per_layer = sum(rank * sum(shapes[n]) for n in names)
    return per_layer * text_config.num_hidden_layers
