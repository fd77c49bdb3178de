"""`thinkrl prep SOURCE --input PATH --output DIR [--template chat|qwen_r1|r1_system] ...`

Converts a public data set into verl's RL parquet schema (`train.parquet`,
`test.parquet`), ready for data.train_files / data.val_files.

Sources: gsm8k (jsonl, parquet or a Hugging Face folder with question/answer),
geo3k (Geometry3K's Hugging Face parquet: images, problem, answer; verl's rows),
math (MATH / MATH-500 jsonl), orz (Open-Reasoner-Zero training or eval JSON),
jsonl (any file: name the fields and --data-source), builtin (the built-in
arithmetic task; no --input), reasoning-gym (procedural tasks of the
reasoning-gym package, generated here: --tasks, --size, --test-size, --seed,
--config, --shots; no --input; scored by the package's own scorers),
textarena (single-player games, one row per game: --games, --size,
--test-size, --seed; the game scores each rollout).

Use the same --template here as data.template in training: with `chat` the
source's instruction ("Let's think step by step ...") is appended to each
question; `qwen_r1` carries its own instruction. --show N prints the first N
prompts exactly as the model will see them, with their token counts.

A MindSpeed-RL data preprocessing config (configs/datasets/*.yaml) is read
as it is: --mindspeed-config FILE writes its `input` with its `prompt_type`
and `map_keys` to <output_prefix>/train.parquet (or --output).

Examples:
  thinkrl prep --mindspeed-config configs/datasets/r1_zero_qwen25_7b.yaml
  thinkrl prep gsm8k --input ../shared/data/gsm8k --output data/gsm8k
  thinkrl prep math --input math500/test.jsonl --output data/math500 --template qwen_r1 --show 2
  thinkrl prep orz --input aime2024.json --split test --output data/aime
  thinkrl prep reasoning-gym --tasks chain_sum,leg_counting --size 500 --test-size 50 --output data/rg
  thinkrl prep textarena --games GuessTheNumber-v0 --size 200 --test-size 32 --output data/games
"""

from __future__ import annotations

import argparse

from thinkrl.commands.common import command_parser
from thinkrl.data.prep import SOURCES
from thinkrl.data.templates import TEMPLATES
from thinkrl.errors import UserError

DEFAULT_TOKENIZER = "builtin:tiny-qwen2"
GYM = "reasoning-gym"
ARENA = "textarena"


def add_parser(sub) -> None:
    parser = command_parser(sub, "prep", doc=__doc__,
                            help="convert a data set into verl parquet files")
    parser.add_argument("source", choices=(*SOURCES, GYM, ARENA), nargs="?",
                        help="which kind of data set (none with --mindspeed-config)")
    parser.add_argument("--mindspeed-config", metavar="FILE",
                        help="a MindSpeed-RL dataset config (configs/datasets/*.yaml) to follow")
    parser.add_argument("--input", nargs="+", action="extend", default=[], metavar="PATH",
                        help="input files or folders (a folder: its train*/test* files)")
    parser.add_argument("--output", metavar="DIR",
                        help="folder for train.parquet / test.parquet (required unless "
                             "--mindspeed-config gives output_prefix)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace train.parquet / test.parquet already in --output "
                             "(without it, prep refuses)")
    parser.add_argument("--template", choices=TEMPLATES, default="chat",
                        help="the data.template the rows are for (default: chat)")
    parser.add_argument("--split", nargs="+", action="extend", metavar="NAME",
                        help="split of each input file (train|test): one for all or one per "
                             "file; default: from the file names")
    parser.add_argument("--show", type=int, default=0, metavar="N",
                        help="print the first N rendered prompts of each split")
    parser.add_argument("--tokenizer", metavar="PATH",
                        help="tokenizer for --show (default: the built-in tiny model's)")
    parser.add_argument("--data-source", help="data_source to write (required for jsonl)")
    jsonl = parser.add_argument_group("jsonl source (and flat orz records)")
    jsonl.add_argument("--question-field", help="default: question (orz: problem)")
    jsonl.add_argument("--answer-field", help="default: answer")
    jsonl.add_argument("--ability", default="math", help="default: math")
    jsonl.add_argument("--instruction", help="sentence appended to each question (chat template)")
    gym = parser.add_argument_group("reasoning-gym and textarena sources (generated here, no --input)")
    gym.add_argument("--tasks", help="comma-separated reasoning-gym task names, e.g. chain_sum,leg_counting")
    gym.add_argument("--games", help="comma-separated textarena game ids, e.g. GuessTheNumber-v0")
    gym.add_argument("--size", type=int, default=1000, help="training rows per task or game (default 1000)")
    gym.add_argument("--test-size", type=int, default=100, help="held-out rows per task or game (default 100)")
    gym.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    gym.add_argument("--config", metavar="JSON_OR_FILE",
                     help="generator settings: {task: {key: value}} or one object for every task")
    gym.add_argument("--shots", type=int, default=0,
                     help="worked examples of the task shown before each question (default 0)")


def run(args) -> int:
    from thinkrl.data.prep import PrepRequest, generic, prepare

    if args.show < 0:
        raise UserError(f"--show {args.show}: give a count >= 0")
    if args.mindspeed_config:
        return _run_mindspeed(args)
    if args.source in (GYM, ARENA):
        return _run_generated(args)
    if args.source is None:
        raise UserError("thinkrl prep needs a SOURCE (" + ", ".join(SOURCES) + ") or "
                         "--mindspeed-config FILE")
    if args.output is None:
        raise UserError(f"thinkrl prep {args.source} needs --output DIR")
    fields = None
    if args.question_field or args.answer_field:
        default = generic.FieldNames()
        fields = generic.FieldNames(question=args.question_field or default.question,
                                    answer=args.answer_field or default.answer)
    request = PrepRequest(source=args.source, output=args.output, inputs=list(args.input),
                          template=args.template, splits=args.split,
                          data_source=args.data_source, ability=args.ability,
                          instruction=args.instruction,
                          fields=fields, overwrite=args.overwrite)
    written = prepare(request)
    for item in written:
        print(f"{item.split}: {item.rows} rows -> {item.path}")
    if args.show:
        show_prompts(written, template=args.template, count=args.show,
                     tokenizer_path=args.tokenizer or DEFAULT_TOKENIZER)
    return 0


def _run_generated(args) -> int:
    """`thinkrl prep reasoning-gym` / `thinkrl prep textarena`: generate the rows and write them."""
    from thinkrl.data.prep import write_splits

    wanted = "--tasks T1,T2" if args.source == GYM else "--games G1,G2"
    if args.input:
        raise UserError(f"thinkrl prep {args.source} generates its rows itself; drop --input")
    if args.output is None or (args.tasks if args.source == GYM else args.games) is None:
        raise UserError(f"thinkrl prep {args.source} needs {wanted} and --output DIR")
    if args.template != "chat":
        raise UserError(f"--template {args.template}: {args.source} rows are written for the chat "
                         "template; drop --template")
    if args.source == GYM:
        from thinkrl.data.prep import reasoning_gym as gym

        names = gym.parse_tasks(args.tasks)
        rows = gym.generate(gym.GymRequest(tasks=names, size=args.size, test_size=args.test_size,
                                           seed=args.seed, config=gym.parse_config(args.config, names),
                                           shots=args.shots))
    else:
        from thinkrl.data.prep import textarena as arena

        if args.config or args.shots:
            raise UserError("--config and --shots are for reasoning-gym; a textarena game is set by its id")
        names = arena.parse_games(args.games)
        rows = arena.generate(names, size=args.size, test_size=args.test_size, seed=args.seed)
    written = write_splits(rows, output=args.output, overwrite=args.overwrite)
    for item in written:
        print(f"{item.split}: {item.rows} rows ({len(names)} {'task' if args.source == GYM else 'game'}(s)) "
              f"-> {item.path}")
    if args.show:
        show_prompts(written, template="chat", count=args.show,
                     tokenizer_path=args.tokenizer or DEFAULT_TOKENIZER)
    return 0


def _run_mindspeed(args) -> int:
    """`--mindspeed-config FILE`: the request that file describes."""
    from thinkrl.data.prep.mindspeed import read_dataset_config

    if args.source or args.input or args.split or args.question_field or args.answer_field:
        raise UserError("--mindspeed-config gives the source, input, split and fields itself; "
                         "drop SOURCE/--input/--split/--question-field/--answer-field "
                         "(--output, --show and --tokenizer still apply)")
    dataset = read_dataset_config(args.mindspeed_config)
    command = dataset.prep_args(args.output)
    print(f"{dataset.path}: thinkrl prep {' '.join(command)}")
    sub = argparse.ArgumentParser(add_help=False)
    add_parser(sub.add_subparsers(dest="command"))
    return run(sub.parse_args(["prep", *command, "--show", str(args.show),
                               *(["--tokenizer", args.tokenizer] if args.tokenizer else [])]))


def show_prompts(written, *, template: str, count: int, tokenizer_path: str) -> None:
    """The first `count` prompts of each written split, read back with the
    training reader and rendered with the training template code."""
    from thinkrl.builtin import resolve_model_path
    from thinkrl.data.files import read_rows
    from thinkrl.data.templates import render_prompt
    from thinkrl.models.loading import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_path(tokenizer_path, log=print))
    for item in written:
        rows = read_rows(item.path, prompt_key="prompt", reward_fn_key="data_source")
        for index, row in enumerate(rows[:count]):
            text = render_prompt(template, tokenizer, row["prompt"])
            tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            print(f"----- {item.split} row {index}: {tokens} tokens, template {template}, "
                  f"data_source {row['data_source']}, ground truth: "
                  f"{row['reward_model']['ground_truth']}")
            print(text)
        print("-----")
