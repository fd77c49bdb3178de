"""Build a typed ``Config``: defaults, then a YAML recipe, then overrides.

Overrides use verl's (Hydra's) spelling so that verl launch lines work as-is:

- ``a.b.c=value``   set a known key;
- ``+a.b.c=value``  also add a new key inside a free-form mapping field
  (e.g. ``+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4``);
  on a known key it simply sets it;
- ``++a.b.c=value`` like ``+``, and a mapping given to a mapping field
  replaces it instead of being merged into it.

Values are read as YAML (``True``, ``null``, ``4``, ``'x y'``, ``[a,b]``,
``{a: 1}``) and then converted to the field's annotated type. ``${a.b.c}``
inside a string refers to another key and is resolved once, after every
override has been applied.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from thinkrl.config.schema import Config
from thinkrl.config.verl_async import apply_verl_async_aliases
from thinkrl.config.values import (INTERPOLATION, INVALID, coerce, has_interpolation,
                                   is_dataclass_type, is_dict_type, type_text)
from thinkrl.errors import UserError

__all__ = ["config_to_dict", "flatten_keys", "load_config"]

_RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


def load_config(recipe: str | Path | Mapping[str, Any] | None = None, overrides: Sequence[str] = (), *,
                recipe_overrides: Sequence[str] = (), tool_overrides: Sequence[str] = ()) -> Config:
    """Return the run config: defaults < recipe file < `recipe_overrides` (a
    recipe given as overrides: a MindSpeed-RL file's translation) <
    `overrides` (the user's, in order) < `tool_overrides` (what a tool
    forces, e.g. a rehearsal's step count).

    ``recipe`` is a YAML file path, the name of a bundled recipe
    (``"tiny"`` -> ``thinkrl/recipes/tiny.yaml``), or the recipe's mapping itself. Raises ``ValueError`` for
    a missing or malformed file, an unknown key, a malformed override or a
    value of the wrong type. Cross-field checks live in ``checks.validate``.
    """
    cfg = Config()
    given: dict[str, int] = {}  # where each dotted key was set: 1 a recipe, 2 the user, 3 a tool
    if recipe is not None:
        if isinstance(recipe, Mapping):  # a recipe given as a (nested or dotted) dict: the Python API
            mapping, source = recipe, "the config dict"
        else:
            path = _find_recipe(recipe)
            mapping, source = _read_yaml(path), f"recipe {path}"
        _merge_mapping(cfg, "", mapping, source=source)
        given.update(dict.fromkeys(_dotted_keys(mapping), 1))
    for level, group in ((1, recipe_overrides), (2, overrides), (3, tool_overrides)):
        for override in group:
            for key in _apply_override(cfg, override):
                given[key] = level
    for key in flatten_keys(cfg):
        _resolve_key(cfg, key, ())
    apply_verl_async_aliases(cfg, given=given)
    return cfg


def _dotted_keys(mapping: Mapping[Any, Any], prefix: str = "") -> list[str]:
    """The dotted keys a (nested) recipe mapping sets."""
    keys = []
    for sub, value in mapping.items():
        key = f"{prefix}.{sub}" if prefix else str(sub)
        keys += _dotted_keys(value, key) if isinstance(value, Mapping) and value else [key]
    return keys


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain-dict copy of ``cfg`` (for writing the run's config YAML)."""
    return dataclasses.asdict(cfg)


def flatten_keys(cfg: Any) -> list[str]:
    """Every dotted leaf key of ``cfg`` (a dataclass or its class); mapping fields are leaves."""
    cls = cfg if isinstance(cfg, type) else type(cfg)
    keys: list[str] = []
    for name, tp in _hints(cls).items():
        if is_dataclass_type(tp):
            keys.extend(f"{name}.{sub}" for sub in flatten_keys(tp))
        else:
            keys.append(name)
    return keys


# --- reading sources ---------------------------------------------------------

def _find_recipe(recipe: str | Path) -> Path:
    path = Path(recipe).expanduser()
    if path.is_file():
        return path
    builtin = _RECIPES_DIR / f"{recipe}.yaml"
    if isinstance(recipe, str) and "/" not in recipe and not path.suffix and builtin.is_file():
        return builtin
    names = sorted(p.stem for p in _RECIPES_DIR.glob("*.yaml"))
    listing = ", ".join(names) if names else "none"
    raise UserError(
        f"recipe file {str(path)!r} does not exist (looked in {Path.cwd()}); give the path "
        f"of a YAML file, or the name of a bundled recipe (bundled: {listing})."
    )


def _read_yaml(path: Path) -> Mapping[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise UserError(f"recipe file {str(path)!r} is not valid YAML: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"recipe file {str(path)!r} could not be read: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise UserError(
            f"recipe file {str(path)!r} must hold a mapping of keys (e.g. 'data:\\n  train_batch_size: 8'), "
            f"not a {type(data).__name__}."
        )
    return data


def _apply_override(cfg: Config, override: str) -> list[str]:
    """Apply one KEY=VALUE; returns the dotted keys it set."""
    text = override.strip()
    mode = "++" if text.startswith("++") else "+" if text.startswith("+") else ""
    body = text[len(mode) :]
    key, sep, raw = body.partition("=")
    key = key.strip()
    if not sep or not key:
        if text.startswith("~"):
            raise UserError(f"override {override!r}: removing keys ('~key') is not supported; set the key instead.")
        raise UserError(
            f"override {override!r} is malformed: write KEY=VALUE with a dotted key, e.g. "
            f"data.train_batch_size=8, or +KEY=VALUE to add a key inside a mapping, e.g. "
            f"+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4."
        )
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw  # e.g. an unbalanced bracket: kept as text, rejected by non-string fields
    _assign(cfg, key, value, raw, add=bool(mode), replace=mode == "++", source=f"override {override!r}")
    return _dotted_keys(value, key) if isinstance(value, Mapping) and value else [key]


def _merge_mapping(cfg: Config, prefix: str, mapping: Mapping[Any, Any], *, source: str) -> None:
    """Apply each entry of ``mapping`` (nested or with dotted keys) below ``prefix``."""
    for sub, value in mapping.items():
        if not isinstance(sub, str) or not sub:
            raise UserError(f"{source}: key {sub!r} under {prefix or 'the top level'!r} must be a non-empty string.")
        key = f"{prefix}.{sub}" if prefix else sub
        _assign(cfg, key, value, None, add=True, replace=False, source=source)


# --- setting one key -----------------------------------------------------------

def _assign(cfg: Config, key: str, value: Any, raw: str | None, *, add: bool, replace: bool, source: str) -> None:
    """Set dotted ``key`` on ``cfg``; ``raw`` is the command-line text (None from YAML)."""
    parts = key.split(".")
    if not all(parts):
        raise UserError(f"{source}: key {key!r} has an empty part; write keys like data.train_batch_size.")
    node: Any = cfg
    for i, part in enumerate(parts):
        path = ".".join(parts[: i + 1])
        last = i == len(parts) - 1
        if dataclasses.is_dataclass(node):
            hints = _hints(type(node))
            if part not in hints:
                raise UserError(f"{source}: unknown config key {key!r}; {_did_you_mean(key)}")
            tp = hints[part]
            if is_dataclass_type(tp):
                if not last:
                    node = getattr(node, part)
                    continue
                if value is None and raw is None:
                    return  # an empty section in a recipe file
                if not isinstance(value, Mapping):
                    first = flatten_keys(tp)[0]
                    raise UserError(
                        f"{source}: {path} is a section, not a value; set its keys, e.g. {path}.{first}=..."
                    )
                _merge_mapping(cfg, path, value, source=source)
                return
            if last:
                _set_field(node, part, tp, value, raw, key=path, replace=replace, source=source)
                return
            if not is_dict_type(tp):
                raise UserError(
                    f"{source}: {path} is a single value ({type_text(tp)}), so it has no key "
                    f"{parts[i + 1]!r}; did you mean {path}=...?"
                )
            node = getattr(node, part)
            continue
        # Inside a free-form mapping field.
        if part not in node and not add:
            known = ", ".join(map(str, node)) or "none yet"
            raise UserError(
                f"{source}: {path} does not exist (existing keys under {path.rpartition('.')[0]}: {known}); "
                f"write +{key}=... to add it."
            )
        if last:
            if isinstance(value, Mapping) and isinstance(node.get(part), dict) and not replace:
                _deep_merge(node[part], value)
            else:
                node[part] = copy.deepcopy(value)
            return
        if not isinstance(node.setdefault(part, {}), dict):
            raise UserError(f"{source}: {path} holds {node[part]!r}, not a mapping; it has no key {parts[i + 1]!r}.")
        node = node[part]


def _set_field(
    node: Any, name: str, tp: Any, value: Any, raw: str | None, *, key: str, replace: bool, source: str
) -> None:
    if has_interpolation(value) and isinstance(value, str):
        setattr(node, name, value)  # typed after ${...} is resolved
        return
    if is_dict_type(tp) and isinstance(value, Mapping) and not replace:
        _deep_merge(getattr(node, name), value)
        return
    example = _field_default(type(node), name)
    setattr(node, name, coerce(value, raw, tp, key=key, example=example, source=source))


def _deep_merge(target: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(target.get(k), dict):
            _deep_merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # field name -> annotated type, in field order


def _field_default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


# --- unknown keys ------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _known_keys() -> tuple[str, ...]:
    leaves = flatten_keys(Config)
    sections = {leaf.rsplit(".", i)[0] for leaf in leaves for i in range(1, leaf.count(".") + 1)}
    return tuple(leaves) + tuple(sorted(sections))


def suggest_keys(key: str, limit: int = 4) -> list[str]:
    """Known keys closest to ``key``: by the whole dotted key, then by its last part."""
    known = _known_keys()
    found = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    by_last: dict[str, list[str]] = {}
    for k in known:
        by_last.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    for name in difflib.get_close_matches(key.rsplit(".", 1)[-1], list(by_last), n=3, cutoff=0.7):
        found.extend(k for k in by_last[name] if k not in found)
    section = key.split(".", 1)[0]
    found.sort(key=lambda k: k.split(".", 1)[0] != section)  # same top-level section first
    return found[:limit]


def _did_you_mean(key: str) -> str:
    close = suggest_keys(key)
    return f"did you mean {' or '.join(close)}?" if close else "see thinkrl/config/schema.py (and schema_roles.py) for every key."


# --- ${a.b.c} interpolation --------------------------------------------------------

def _resolve_key(cfg: Config, key: str, stack: tuple[str, ...]) -> Any:
    """Value of leaf ``key`` with its ``${...}`` resolved (and stored back, typed)."""
    node: Any = cfg
    for part in key.split("."):
        if not dataclasses.is_dataclass(node) or part not in _hints(type(node)):
            node = INVALID
            break
        owner, node = node, getattr(node, part)
    if node is INVALID or dataclasses.is_dataclass(node):
        where = f" (in {stack[-1]})" if stack else ""
        raise UserError(f"${{{key}}}{where} does not name a config value; {_did_you_mean(key)}")
    name = key.rsplit(".", 1)[-1]
    if not has_interpolation(node):
        return node
    if key in stack:
        chain = " -> ".join((*stack[stack.index(key) :], key))
        raise UserError(f"config references form a loop: {chain}; make one of them a plain value.")
    resolved = _interpolate(cfg, node, (*stack, key))
    tp, example = _hints(type(owner))[name], _field_default(type(owner), name)
    typed = coerce(resolved, None, tp, key=key, example=example, source=f"after resolving {node!r}")
    setattr(owner, name, typed)
    return typed


def _interpolate(cfg: Config, value: Any, stack: tuple[str, ...]) -> Any:
    if isinstance(value, list):
        return [_interpolate(cfg, v, stack) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(cfg, v, stack) for k, v in value.items()}
    if not isinstance(value, str) or "${" not in value:
        return value
    for ref in INTERPOLATION.findall(value):
        if ":" in ref or not ref.strip():
            raise UserError(
                f"{stack[-1]}: '${{{ref}}}' is not supported; only references to other keys, "
                f"like ${{trainer.project_name}}, are."
            )
    whole = INTERPOLATION.fullmatch(value)
    if whole:  # a lone reference keeps the referenced value's type
        return _resolve_key(cfg, whole.group(1).strip(), stack)
    text = INTERPOLATION.sub(lambda m: str(_resolve_key(cfg, m.group(1).strip(), stack)), value)
    if "${" in text:
        raise UserError(f"{stack[-1]}: could not resolve {value!r}; write references as ${{section.key}}.")
    return text
