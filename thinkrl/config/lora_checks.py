"""Checks of ``actor_rollout_ref.model.lora_*`` (LoRA adapters, `thinkrl.models.lora`).
Called by ``thinkrl.config.checks.validate``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from thinkrl.config.keys import ARR, shown
from thinkrl.config.schema import Config

KEY = f"{ARR}.model"


def lora_problems(cfg: Config) -> list[str]:
    """One line per problem: key=value, what to do."""
    model = cfg.actor_rollout_ref.model
    problems = [f"  - {key}={shown(value)}: {fix}" for key, value, fix in adapter_settings_problems(KEY, model)]
    if model.lora_rank <= 0 and model.lora_adapter_path:
        problems.append(f"  - {KEY}.lora_adapter_path={shown(model.lora_adapter_path)}: an adapter trains "
                        "only with LoRA on: set lora_rank to the adapter's rank")
    if model.lora_rank > 0 and model.lora_adapter_path:
        problems.extend(_adapter_problems(model))
    return problems


def adapter_settings_problems(prefix: str, model) -> list[tuple[str, object, str]]:
    """(key, value, fix) for the LoRA keys of a model section (the actor's
    actor_rollout_ref.model, the critic's critic.model)."""
    found = []
    if model.lora_rank < 0:
        found.append((f"{prefix}.lora_rank", model.lora_rank,
                      "must be 0 (train every weight) or a rank >= 1, e.g. 16"))
    if model.lora_rank <= 0:
        return found
    if importlib.util.find_spec("peft") is None:
        found.append((f"{prefix}.lora_rank", model.lora_rank,
                      "LoRA needs PEFT: pip install -e '.[lora]' (in thinkrl's checkout) (or peft), or set lora_rank=0"))
    if model.lora_alpha is None or not model.lora_alpha > 0:
        found.append((f"{prefix}.lora_alpha", model.lora_alpha,
                      "must be > 0 (the update is lora_alpha/lora_rank * B A), e.g. 32"))
    targets = model.target_modules
    names = [targets] if isinstance(targets, str) else list(targets or [])
    if not names or not all(isinstance(n, str) and n for n in names):
        found.append((f"{prefix}.target_modules", targets,
                      "use all-linear or a list of module names, e.g. [q_proj, v_proj]"))
    return found


def _adapter_problems(model) -> list[str]:
    path = Path(model.lora_adapter_path).expanduser()
    where = f"  - {KEY}.lora_adapter_path={path}"
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        return [f"{where}: no adapter_config.json there; give a PEFT adapter folder "
                "(`thinkrl export` of a LoRA checkpoint writes one)"]
    if not (path / "adapter_model.safetensors").is_file():
        return [f"{where}: no adapter_model.safetensors beside adapter_config.json; "
                "the adapter was not saved completely (or as a .bin: re-save it with safetensors)"]
    try:
        saved = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        return [f"{where}: {config_file.name} is not JSON ({err})"]
    if saved.get("peft_type") != "LORA":
        return [f"{where}: a {saved.get('peft_type')} adapter; only LoRA adapters train here"]
    problems = []
    if saved.get("r") != model.lora_rank or float(saved.get("lora_alpha", 0)) != float(model.lora_alpha):
        problems.append(f"{where}: the adapter has r={saved.get('r')}, lora_alpha={saved.get('lora_alpha')}; "
                        f"set {KEY}.lora_rank={saved.get('r')} {KEY}.lora_alpha={saved.get('lora_alpha')}")
    if saved.get("use_dora") or saved.get("use_rslora"):
        problems.append(f"{where}: DoRA and rsLoRA adapters are not supported; save a plain LoRA adapter")
    other_variants = [key for key in ("use_bdlora", "alora_invocation_tokens", "arrow_config", "lora_ga_config",
                                      "use_qalora", "mica_config") if saved.get(key)]
    if other_variants:
        problems.append(f"{where}: a LoRA variant ({', '.join(other_variants)}); "
                        "thinkrl trains plain LoRA matrices only")
    if saved.get("bias", "none") != "none" or saved.get("modules_to_save") or saved.get("fan_in_fan_out") \
            or saved.get("lora_bias"):
        problems.append(f"{where}: the adapter trains biases, whole modules (modules_to_save) or "
                        "transposed layers; thinkrl trains plain LoRA matrices only (bias none, no "
                        "modules_to_save)")
    return problems
