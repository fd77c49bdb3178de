"""`thinkrl export CKPT --out DIR`

Write the trained actor of a checkpoint as a Hugging Face folder (config.json,
generation_config.json, tokenizer files, model.safetensors) that
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads. CKPT is a
`global_step_N` folder, or a run directory (its latest complete checkpoint).
A LoRA run's checkpoint gives PEFT's adapter folder (adapter_config.json,
adapter_model.safetensors, tokenizer files), or with --merge the base model
with the adapter merged in.
"""

from __future__ import annotations


from thinkrl.commands.common import command_parser, console_log


def add_parser(sub) -> None:
    parser = command_parser(sub, "export", doc=__doc__,
                            help="write a checkpoint's model as a Hugging Face folder")
    parser.add_argument("checkpoint", metavar="CKPT",
                        help="a global_step_N folder, or a run directory (its latest checkpoint)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the folder to write (must not exist, or be empty)")
    parser.add_argument("--merge", action="store_true",
                        help="LoRA checkpoints: write the base model with the adapter merged in "
                             "(default: the adapter folder alone)")
    parser.add_argument("--base", metavar="MODEL", default=None,
                        help="LoRA with --merge: the base model folder or hub id (default: the one "
                             "the adapter records)")


def run(args) -> int:
    from thinkrl.checkpoint.export import export_checkpoint

    export_checkpoint(args.checkpoint, args.out, merge=args.merge or args.base is not None,
                      base=args.base, log=console_log())
    return 0
