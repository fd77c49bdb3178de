"""`thinkrl prep SOURCE --input PATH --output DIR [--template chat|qwen_r1] ...`

Converts a public data set into verl's RL parquet schema (`train.parquet`,
`test.parquet`), ready for data.train_files / data.val_files.

Sources: gsm8k (jsonl, parquet or a Hugging Face folder with question/answer),
math (MATH / MATH-500 jsonl), orz (Open-Reasoner-Zero training or eval JSON),
jsonl (any file: name the fields and --data-source), builtin (the built-in
arithmetic task; no --input).

Use the same --template here as data.template in training: with `chat` the
source's instruction ("Let's think step by step ...") is appended to each
question; `qwen_r1` carries its own instruction. --show N prints the first N
prompts exactly as the model will see them, with their token counts.

Examples:
  thinkrl prep gsm8k --input ../shared/data/gsm8k --output data/gsm8k
  thinkrl prep math --input math500/test.jsonl --output data/math500 --template qwen_r1 --show 2
  thinkrl prep orz --input aime2024.json --split test --output data/aime
"""

from __future__ import annotations

from thinkrl.commands.common import command_parser


from thinkrl.data.prep import SOURCES
from thinkrl.data.templates import TEMPLATES

DEFAULT_TOKENIZER = "builtin:tiny-qwen2"


def add_parser(sub) -> None:
    parser = command_parser(sub, "prep", doc=__doc__,
                            help="convert a data set into verl parquet files")
    parser.add_argument("source", choices=SOURCES, help="which kind of data set")
    parser.add_argument("--input", nargs="+", action="extend", default=[], metavar="PATH",
                        help="input files or folders (a folder: its train*/test* files)")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="folder for train.parquet / test.parquet")
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
    jsonl = parser.add_argument_group("jsonl source")
    jsonl.add_argument("--question-field", default="question", help="default: question")
    jsonl.add_argument("--answer-field", default="answer", help="default: answer")
    jsonl.add_argument("--ability", default="math", help="default: math")
    jsonl.add_argument("--instruction", help="sentence appended to each question (chat template)")


def run(args) -> int:
    from thinkrl.data.prep import PrepRequest, generic, prepare

    if args.show < 0:
        raise ValueError(f"--show {args.show}: give a count >= 0")
    request = PrepRequest(source=args.source, output=args.output, inputs=list(args.input),
                          template=args.template, splits=args.split,
                          data_source=args.data_source, ability=args.ability,
                          instruction=args.instruction,
                          fields=generic.FieldNames(question=args.question_field,
                                                    answer=args.answer_field),
                          overwrite=args.overwrite)
    written = prepare(request)
    for item in written:
        print(f"{item.split}: {item.rows} rows -> {item.path}")
    if args.show:
        show_prompts(written, template=args.template, count=args.show,
                     tokenizer_path=args.tokenizer or DEFAULT_TOKENIZER)
    return 0


def show_prompts(written, *, template: str, count: int, tokenizer_path: str) -> None:
    """The first `count` prompts of each written split, read back with the
    training reader and rendered with the training template code."""
    from thinkrl import builtin
    from thinkrl.data.files import read_rows
    from thinkrl.data.templates import render_prompt
    from thinkrl.models.loading import load_tokenizer

    tokenizer = load_tokenizer(builtin.resolve_model_path(tokenizer_path, log=print))
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
