"""Finding and reading RL data files in verl's parquet schema.

A row needs: the prompt column (`data.prompt_key`, a list of chat messages
`{"role", "content"}`), the reward column (`data.reward_fn_key`, usually
`data_source`) and `reward_model.ground_truth`. `extra_info` is optional.
Every problem is reported with the file, the row and the column.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from thinkrl.errors import SetupError, UserError, nearest_files

SUFFIXES = (".parquet",)


def resolve_files(spec: str | list[str], *, key: str) -> list[Path]:
    """A file, a directory (its *.parquet files), a glob, or a list of those."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    if not specs:
        raise UserError(f"{key} is empty: give a parquet file, a directory or a glob")
    found: list[Path] = []
    for item in specs:
        path = Path(os.path.expanduser(str(item)))
        if any(ch in str(item) for ch in "*?["):
            matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
            if not matches:
                raise SetupError(f"{key}: the pattern {item!r} matches no file", _fix_path(key, path))
            found.extend(matches)
        elif path.is_dir():
            matches = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES)
            if not matches:
                raise SetupError(f"{key}: the directory {path} holds no .parquet file",
                                 f"point {key} at the files your preprocessing wrote "
                                 "(thinkrl prep writes train.parquet and test.parquet)")
            found.extend(matches)
        elif path.is_file():
            found.append(path)
        else:
            raise SetupError(f"{key}: no such file {path}", _fix_path(key, path))
    return found


def _fix_path(key: str, path: Path) -> str:
    # A path without the file prefix the preprocessing added is the classic
    # cause (a seed run's IndexError); the nearest names usually show it.
    return (f"point {key} at the files your preprocessing wrote (the full name, prefix "
            f"included).{nearest_files(path)}")


def read_rows(path: Path, *, prompt_key: str, reward_fn_key: str,
              media_keys: tuple[str, ...] = ()) -> list[dict]:
    """All rows of one parquet file, checked for the columns the run needs."""
    import pyarrow.parquet as pq

    if path.suffix not in SUFFIXES:
        raise UserError(f"{path}: thinkrl reads parquet files in verl's schema; convert it "
                         "first: `thinkrl prep SOURCE --input FILE --output DIR` (see "
                         "`thinkrl prep --help`)")
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise UserError(f"{path} is not a readable parquet file ({err}). "
                         "Re-create it with your preprocessing script.") from None
    missing = [c for c in (prompt_key, reward_fn_key, "reward_model") if c not in table.column_names]
    if missing:
        raise UserError(f"{path} lacks the column(s) {missing}; it has {table.column_names}. "
                         "verl's schema needs the prompt (data.prompt_key), data_source "
                         "(data.reward_fn_key) and reward_model.ground_truth.")
    rows = table.to_pylist()
    if not rows:
        raise UserError(f"{path} has no rows: check the preprocessing that wrote it")
    for index, row in enumerate(rows):
        check_row(row, path=path, index=index, prompt_key=prompt_key, reward_fn_key=reward_fn_key)
        for media in media_keys:
            if row.get(media):  # training on the text alone would silently change the task
                raise UserError(
                    f"{path}, row {index}, column {media!r} holds media that this run cannot "
                    "read: thinkrl trains on text prompts, and on image prompts with a "
                    "vision-language model (Qwen2.5-VL, Qwen2-VL); videos are not supported. "
                    "Drop the column if the prompts do not need it.")
    return rows


def check_row(row: dict, *, path: Path, index: int, prompt_key: str, reward_fn_key: str) -> None:
    where = f"{path}, row {index}"
    messages = row.get(prompt_key)
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role")
            for m in messages):
        raise UserError(f"{where}, column {prompt_key!r}: expected a list of chat messages "
                         f"like [{{'role': 'user', 'content': '...'}}], found {messages!r:.200}")
    if not isinstance(row.get(reward_fn_key), str):
        raise UserError(f"{where}, column {reward_fn_key!r}: expected a string naming the "
                         f"data source (e.g. 'openai/gsm8k'), found {row.get(reward_fn_key)!r}")
    reward = row.get("reward_model")
    if not isinstance(reward, dict) or reward.get("ground_truth") is None:
        raise UserError(f"{where}, column 'reward_model': expected "
                         f"{{'style': 'rule', 'ground_truth': ...}}, found {reward!r:.200}")
