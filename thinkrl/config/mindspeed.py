"""MindSpeed-RL trainer configs as thinkrl input.

`thinkrl train --config grpo_trainer_qwen25_7b.yaml` (and `doctor`, and
`thinkrl config convert FILE --out thinkrl.yaml`) recognise MindSpeed-RL's
layout — top-level `megatron_training`, `actor_config`, `ref_config`,
`reward_config`, `rl_config`, `generate_config`, and `defaults: model:
[name]` naming `model/<name>.yaml` next to the file — and translate every
key into thinkrl's (verl's) keys by the rules of
`thinkrl.config.mindspeed_rules`. The translation is a list of `Row`s, one
per MindSpeed-RL key, printed as a table at start: the thinkrl keys and
values it became, or why it has none. A key without a rule is an error
naming the closest known keys, as for thinkrl's own keys.

The translated settings are applied like command-line overrides on top of
thinkrl's defaults; the user's own overrides come after them and win.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from thinkrl.config.mindspeed_rules import DEFAULTS, RULES, Row, Source, data_parquet
from thinkrl.errors import UserError

SECTIONS = tuple(RULES)
"""MindSpeed-RL's top-level sections, in file order."""
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_NESTED = ("sampling_config",)
"""Sub-mappings whose keys are translated one by one (others, like
`actor_resource`, are one value)."""


@dataclass(frozen=True)
class Translation:
    """A MindSpeed-RL file in thinkrl's terms."""

    path: Path
    rows: tuple[Row, ...]
    data_path: str | None
    """`megatron_training.data_path`: the Megatron prefix the file reads."""

    @property
    def settings(self) -> dict[str, Any]:
        """thinkrl key -> value, in row order (a later row wins; rules agree on shared keys)."""
        merged: dict[str, Any] = {}
        for row in self.rows:
            merged.update(row.settings)
        return merged

    def overrides(self) -> list[str]:
        """The settings as `+key=value` overrides (`+`: keys inside engine_kwargs are new)."""
        return [f"+{key}={json.dumps(value)}" for key, value in self.settings.items()]

    def recipe(self) -> dict[str, Any]:
        """The settings as a nested thinkrl recipe mapping."""
        nested: dict[str, Any] = {}
        for key, value in self.settings.items():
            node = nested
            *parents, last = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        return nested

    @property
    def data_parquet(self) -> str | None:
        return None if self.data_path is None else data_parquet(self.data_path)

    def table(self) -> str:
        """One line per MindSpeed-RL key: `->` mapped, `--` no counterpart, `!!` differs."""
        lines = [f"MindSpeed-RL config {self.path} -> thinkrl "
                 f"({len(self.rows)} keys; -> mapped, -- no counterpart, !! differs):"]
        width = min(60, max(len(_shown(r)) for r in self.rows))
        for row in self.rows:
            mark = "!!" if row.differs else "->" if row.settings else "--"
            target = ", ".join(f"{k}={_value(v)}" for k, v in row.settings.items())
            text = "; ".join(t for t in (target, row.note) if t)
            lines.append(f"  {_shown(row):<{width}} {mark} {text}")
        return "\n".join(lines)


def _shown(row: Row) -> str:
    return f"{row.key} = {_value(row.value)}"


def _value(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def looks_like_mindspeed(data: Any) -> bool:
    """A mapping with MindSpeed-RL's sections (and none of thinkrl's)."""
    return (isinstance(data, Mapping) and any(s in data for s in SECTIONS)
            and not any(k in data for k in ("actor_rollout_ref", "data", "trainer", "algorithm")))


def is_mindspeed_file(path: str | Path) -> bool:
    path = Path(path).expanduser()
    if not path.is_file():
        return False
    try:
        return looks_like_mindspeed(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # the ordinary loader reports it


def translate_file(path: str | Path) -> Translation:
    """Read a MindSpeed-RL trainer config and translate it; ValueError naming
    every key without a rule (with the closest known ones)."""
    path = Path(path).expanduser()
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not looks_like_mindspeed(raw):
        raise UserError(f"{path} is not a MindSpeed-RL config (no {', '.join(SECTIONS)} section)")
    rows: list[Row] = []
    problems: list[str] = []
    models = _read_defaults(path, raw.get("defaults"), rows)
    source = Source({s: raw.get(s) or {} for s in SECTIONS})
    for top in raw:
        if top != "defaults" and top not in SECTIONS:
            problems.append(f"unknown section {top!r}; {_closest(top, SECTIONS)}")
    for section in SECTIONS:
        for key, value in _flat(raw.get(section) or {}):
            rule = RULES[section].get(key)
            if rule is None:
                problems.append(f"unknown key {section}.{key}; {_closest(key, RULES[section])}")
                continue
            if key == "model" and value not in models:
                problems.append(f"{section}.model={value}: no model/{value}.yaml among the "
                                f"defaults ({', '.join(models) or 'none'})")
            rows.append(rule(f"{section}.{key}", value, source))
    for dotted, value in DEFAULTS.items():  # MindSpeed-RL's defaults for absent keys
        section, key = dotted.split(".", 1)
        if key not in (raw.get(section) or {}):
            row = RULES[section][key](dotted, value, source)
            rows.append(replace(row, key=f"{dotted} (default)"))
    if problems:
        raise UserError(f"{path}: {len(problems)} key(s) thinkrl cannot translate:\n"
                         + "\n".join(f"  - {p}" for p in problems))
    return Translation(path=path, rows=tuple(rows),
                       data_path=source.get("megatron_training.data_path"))


def _flat(section: Mapping[str, Any]) -> list[tuple[str, Any]]:
    items = []
    for key, value in section.items():
        if key in _NESTED and isinstance(value, Mapping):
            items.extend((f"{key}.{sub}", _number(v)) for sub, v in value.items())
        else:
            items.append((str(key), _number(value)))
    return items


def _number(value: Any) -> Any:
    """`5e-7` as a float: YAML 1.1 (PyYAML) reads an exponent without a dot as
    text, where Megatron's argument parser would have read a number."""
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        return float(value)
    return value


def _read_defaults(path: Path, defaults: Any, rows: list[Row]) -> list[str]:
    """Rows for `defaults: [{model: [name]}]` and every key of model/<name>.yaml;
    returns the model names."""
    names: list[str] = []
    for entry in defaults or []:
        if not isinstance(entry, Mapping) or set(entry) != {"model"}:
            raise UserError(f"{path}: defaults entry {entry!r}: thinkrl reads `- model: [name]` "
                             "entries (model/<name>.yaml next to the file)")
        listed = entry["model"] if isinstance(entry["model"], list) else [entry["model"]]
        names.extend(str(n) for n in listed)
    for name in names:
        model_file = path.parent / "model" / f"{name}.yaml"
        if not model_file.is_file():
            raise UserError(f"{path}: defaults names model {name!r}, but {model_file} does not "
                             "exist; MindSpeed-RL keeps it in configs/model/ next to the config")
        rows.append(Row("defaults.model", name, {}, f"reads {model_file.name}: the architecture"))
        spec = (yaml.safe_load(model_file.read_text(encoding="utf-8")) or {}).get(name) or {}
        for key, value in spec.items():
            rows.append(Row(f"model/{name}.yaml:{key}", value, {},
                            "architecture: thinkrl reads it from the model folder's config.json"))
    return names


def _closest(key: str, known) -> str:
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(known)}"


def write_recipe(translation: Translation, out: str | Path) -> Path:
    """`thinkrl config convert`: the translated recipe, the table as its header comment."""
    from thinkrl.atomic import atomic_write_text

    header = "".join(f"# {line}\n" for line in translation.table().splitlines())
    body = yaml.safe_dump(translation.recipe(), sort_keys=False)
    out = Path(out).expanduser()
    atomic_write_text(out, f"# Written by `thinkrl config convert {translation.path}`.\n"
                           f"{header}\n{body}")
    return out
