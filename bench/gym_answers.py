"""Where a reasoning-gym run's held-out gain is: in the answers or in the format.

Reads a run's saved validation generations (`trainer.log_val_generations`
large enough to keep every held-out response) at two steps and prints, per
task: accuracy; the share of responses with an answer between the tags
(`format`); accuracy among those (`acc | format`: a gain here is not a
format gain); the share of distinct answers among the held-out questions
(a policy that collapsed onto one answer would show it); and the accuracy
of the best constant answer (the most common ground truth), the bar a
guess would reach.

    python bench/gym_answers.py runs/thinkrl/gym-seed1 --before 0 --after 48
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path


def answer_of(text: str) -> str | None:
    """The last answer between <answer> tags, as reasoning-gym reads it."""
    if "<answer>" not in text or "</answer>" not in text.split("<answer>")[-1]:
        return None
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def table(path: Path) -> dict[str, dict[str, float]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by_task: dict[str, list[dict]] = collections.defaultdict(list)
    for row in rows:
        by_task[row["data_source"].split("/", 1)[-1]].append(row)
    out = {}
    for task, group in sorted(by_task.items()):
        answers = [answer_of(r["response"]) for r in group]
        right = [(r["accuracy"] if r.get("accuracy") is not None else r["score"]) >= 1.0 for r in group]
        tagged = [ok for ok, a in zip(right, answers) if a is not None]
        _, mode = collections.Counter(r["ground_truth"] for r in group).most_common(1)[0]
        given = [a for a in answers if a is not None]
        out[task] = {"n": len(group), "acc": sum(right) / len(group), "format": len(tagged) / len(group),
                     "acc | format": sum(tagged) / max(1, len(tagged)),
                     "distinct answers": len(set(given)) / max(1, len(given)),
                     "best constant": mode / len(group)}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--before", type=int, default=0)
    parser.add_argument("--after", type=int, required=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    tables = {step: table(args.run_dir / "generations" / f"val_step_{step}.jsonl")
              for step in (args.before, args.after)}
    columns = ["acc", "format", "acc | format", "distinct answers", "best constant"]
    print(f"{'task':<24} {'step':>5} " + " ".join(f"{c:>16}" for c in columns))
    for task in tables[args.before]:
        for step, values in tables.items():
            row = values[task]
            print(f"{task:<24} {step:>5} " + " ".join(f"{row[c]:>16.3f}" for c in columns))
    if args.json:
        args.json.write_text(json.dumps({str(k): v for k, v in tables.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
