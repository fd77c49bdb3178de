"""Writes a small task of your own in verl's parquet schema: sort three to
five numbers. Each row: `data_source`, `prompt` (chat messages), `ability`,
`reward_model` {`style`, `ground_truth`}, `extra_info` {`split`, `index`}.

    python examples/own_data/make_data.py --out runs/data/sort_numbers
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

INSTRUCTION = "Sort these numbers from smallest to largest: {numbers}. Write the sorted list on the last line."


def rows(count: int, split: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    made = []
    for index in range(count):
        numbers = rng.sample(range(1, 100), rng.randint(3, 5))
        made.append({
            "data_source": "sort_numbers",
            "prompt": [{"role": "user", "content": INSTRUCTION.format(numbers=", ".join(map(str, numbers)))}],
            "ability": "sorting",
            "reward_model": {"style": "rule", "ground_truth": ", ".join(map(str, sorted(numbers)))},
            "extra_info": {"split": split, "index": index},
        })
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for train.parquet and test.parquet")
    parser.add_argument("--train-rows", type=int, default=512)
    parser.add_argument("--test-rows", type=int, default=64)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, count, seed in (("train", args.train_rows, 0), ("test", args.test_rows, 1)):
        pq.write_table(pa.Table.from_pylist(rows(count, split, seed)), out / f"{split}.parquet")
    print(f"wrote {out / 'train.parquet'} ({args.train_rows} rows) and {out / 'test.parquet'} ({args.test_rows})")


if __name__ == "__main__":
    main()
