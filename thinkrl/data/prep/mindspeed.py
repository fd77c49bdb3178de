"""MindSpeed-RL's data preprocessing config (`configs/datasets/*.yaml`) as a
`thinkrl prep` request.

MindSpeed-RL turns the JSON named by `input` into Megatron indexed files
`<output_prefix>_packed_*.bin/.idx`, rendering each prompt with `prompt_type`
and reading the fields named by `map_keys`. thinkrl reads the same JSON into
verl parquet files instead (`<folder>/train.parquet`), with the same template
and fields:

    thinkrl prep --mindspeed-config datasets/r1_zero_qwen25_7b.yaml [--output FOLDER]
    # is the same as
    thinkrl prep orz --input ./dataset/orz.json --question-field problem \\
        --answer-field answer --split train --template qwen_r1 --output ./dataset/orz

The folder defaults to `output_prefix`, so that a trainer config whose
`data_path` is that prefix (as MindSpeed-RL requires) finds the parquet file
at `<data_path>/train.parquet`, the translation of `data_path`.
"""

from __future__ import annotations

import difflib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from thinkrl.data.prep.generic import FieldNames
from thinkrl.errors import UserError

# key -> why thinkrl does not need it (None: it is read)
KEYS: dict[str, str | None] = {
    "input": None,
    "output_prefix": None,
    "prompt_type": None,
    "map_keys": None,
    "handler_name": None,
    "dataset_additional_keys": "the label is written to each row's reward_model.ground_truth",
    "tokenizer_name_or_path": "parquet rows hold text; the run's tokenizer renders them",
    "tokenizer_type": "parquet rows hold text; the run's tokenizer renders them",
    "workers": "thinkrl prep reads in one process",
    "log_interval": "thinkrl prep prints the rows written per split",
    "seq_length": "prompt length is data.max_prompt_length of the run",
    "prompt_type_path": "thinkrl's templates are built in (thinkrl/data/templates.py)",
}
HANDLERS = ("R1AlpacaStyleInstructionHandler", "Math17kAlpacaStyleInstructionHandler")
"""MindSpeed-RL handlers that write one question per row with its label."""
TEMPLATES = {"qwen_r1": "qwen_r1"}
"""MindSpeed-RL prompt_type -> thinkrl data.template."""


@dataclass(frozen=True)
class DatasetConfig:
    """What a MindSpeed-RL dataset config asks for, in thinkrl's terms."""

    path: Path
    input: str
    output_prefix: str
    template: str
    fields: FieldNames

    def prep_args(self, output: str | None = None) -> list[str]:
        """The `thinkrl prep` arguments that write the same rows."""
        return ["orz", "--input", self.input, "--question-field", self.fields.question,
                "--answer-field", self.fields.answer, "--split", "train",
                "--template", self.template, "--output", output or self.output_prefix]

    def prep_command(self, output: str | None = None) -> str:
        return "thinkrl prep " + " ".join(shlex.quote(a) for a in self.prep_args(output))


def read_dataset_config(path: str | Path) -> DatasetConfig:
    """Read and check a MindSpeed-RL dataset config; ValueError naming the key and the fix."""
    path = Path(path).expanduser()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise UserError(f"--mindspeed-config {path}: cannot read it ({err})") from None
    if not isinstance(raw, dict) or "input" not in raw:
        raise UserError(f"{path} is not a MindSpeed-RL dataset config (configs/datasets/*.yaml "
                         "with input, output_prefix, prompt_type, map_keys)")
    for key in raw:
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), list(KEYS), n=2, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise UserError(f"{path}: unknown key {key!r}; {hint}known: {', '.join(KEYS)}")
    handler = raw.get("handler_name", HANDLERS[0])
    if handler not in HANDLERS:
        raise UserError(f"{path}: handler_name={handler}: thinkrl reads question/answer records "
                         f"like {' and '.join(HANDLERS)}; convert this data set with "
                         "`thinkrl prep jsonl` instead")
    prompt_type = str(raw.get("prompt_type", "")).strip()
    if prompt_type not in TEMPLATES:
        raise UserError(f"{path}: prompt_type={prompt_type or '(none)'}: thinkrl has "
                         f"MindSpeed-RL's {', '.join(TEMPLATES)}; for a tokenizer's own chat "
                         "template use `thinkrl prep ... --template chat`")
    return DatasetConfig(path=path, input=str(raw["input"]),
                         output_prefix=str(raw.get("output_prefix", "./dataset/data")),
                         template=TEMPLATES[prompt_type], fields=_fields(path, raw.get("map_keys")))


def _fields(path: Path, map_keys) -> FieldNames:
    """map_keys (a JSON string or a mapping) -> question/answer field names."""
    if map_keys in (None, ""):
        return FieldNames(question="problem", answer="answer")
    if isinstance(map_keys, str):
        try:
            map_keys = json.loads(map_keys)
        except json.JSONDecodeError as err:
            raise UserError(f"{path}: map_keys is not valid JSON ({err}): {map_keys!r}") from None
    if not isinstance(map_keys, dict) or not map_keys.get("prompt") or not map_keys.get("response"):
        raise UserError(f"{path}: map_keys must name the prompt and response fields, e.g. "
                         '\'{"prompt": "problem", "response": "answer"}\'')
    for unsupported in ("query", "system", "history"):
        if map_keys.get(unsupported):
            raise UserError(f"{path}: map_keys.{unsupported}={map_keys[unsupported]!r}: thinkrl "
                             "prep reads one question field and one answer field; merge the "
                             f"{unsupported} field into the question first")
    return FieldNames(question=str(map_keys["prompt"]), answer=str(map_keys["response"]))


def find_dataset_configs(trainer_config: Path) -> list[DatasetConfig]:
    """The readable dataset configs in `datasets/` beside a trainer config."""
    found = []
    for candidate in sorted((trainer_config.parent / "datasets").glob("*.yaml")):
        try:
            found.append(read_dataset_config(candidate))
        except ValueError:
            continue  # another handler or template: not a data set thinkrl can point at
    return found
