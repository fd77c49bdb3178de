"""`thinkrl eval --model PATH --data FILE [--n K --temperature T ...] [key=value ...]`

Evaluate a model the way training validates it: the same data loading
(data.* keys), prompt template, native rollout engine and reward functions.
Prints a table per data source (mean@n, accuracy, pass@k, length, clip
ratio) and writes `eval.json` (metrics + settings) and `generations.jsonl`
(every response) into `--out`.

`--model` is a Hugging Face model folder or hub id, `builtin:tiny-qwen2`, a
checkpoint folder (`global_step_N`, its Hugging Face weights are found in
it) or a run directory (its latest checkpoint). Settings start from verl's
defaults (or `--config RECIPE`), then `key=value` overrides, then the flags:
greedy decoding with n=1 unless `--n`/`--temperature` say otherwise.

    thinkrl eval --model runs/thinkrl/tiny --data builtin:arith/test --n 8 --temperature 1
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from thinkrl.commands.common import command_parser, console_log, recipe_path
from thinkrl.data.templates import TEMPLATES
from thinkrl.errors import UserError


def add_parser(sub) -> None:
    parser = command_parser(sub, "eval", doc=__doc__,
                            help="evaluate a model or checkpoint on a data set")
    parser.add_argument("--model", help="model folder, hub id, builtin:tiny-qwen2, checkpoint "
                        "folder or run directory (default: actor_rollout_ref.model.path)")
    parser.add_argument("--data", action="append", help="parquet file, folder, glob or "
                        "builtin:arith/test; repeat for several (default: data.val_files)")
    parser.add_argument("--n", type=int, help="responses per prompt (rollout.val_kwargs.n)")
    parser.add_argument("--temperature", type=float,
                        help="sampling temperature; 0 decodes greedily (rollout.val_kwargs)")
    parser.add_argument("--top-p", type=float, help="nucleus sampling mass (rollout.val_kwargs)")
    parser.add_argument("--max-new-tokens", type=int,
                        help="response length limit (rollout.response_length)")
    parser.add_argument("--batch-size", type=int,
                        help="prompts per generate call (data.val_batch_size)")
    parser.add_argument("--template", choices=TEMPLATES,
                        help="prompt template (data.val_template)")
    parser.add_argument("--out", help="output folder (default: runs/eval/<model>-<time>)")
    parser.add_argument("--config", help="recipe YAML file or built-in recipe name "
                        "(default: none, verl's defaults)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides (verl style)")


def run(args) -> int:
    log = console_log()
    cfg = eval_config(args)
    result, settings = run_eval(cfg, log=log)
    out = output_dir(args.out, settings["model"])
    write_outputs(out, result, settings)
    log(format_table(result))
    log(f"results: {out / 'eval.json'}")
    log(f"generations: {out / 'generations.jsonl'}")
    return 0


def eval_config(args):
    """The recipe (if any) + overrides, then the flags on their config keys."""
    from thinkrl.commands.common import mindspeed_translation
    from thinkrl.config import load_config

    path = recipe_path(args.config) if args.config else None
    translation = mindspeed_translation(path)  # a MindSpeed-RL file: its translated keys
    cfg = (load_config(None, args.overrides, recipe_overrides=translation.overrides()) if translation
           else load_config(path, args.overrides))
    rollout = cfg.actor_rollout_ref.rollout
    val = rollout.val_kwargs
    if args.model is not None:
        cfg.actor_rollout_ref.model.path = args.model
    if args.data is not None:
        cfg.data.val_files = args.data[0] if len(args.data) == 1 else list(args.data)
    if args.n is not None:
        val.n = args.n
    if args.temperature is not None:
        val.temperature, val.do_sample = args.temperature, args.temperature > 0
    if args.top_p is not None:
        val.top_p = args.top_p
    if args.max_new_tokens is not None:
        rollout.response_length = args.max_new_tokens
    if args.batch_size is not None:
        cfg.data.val_batch_size = args.batch_size
    if args.template is not None:
        cfg.data.val_template = args.template
    check_eval_config(cfg)
    return cfg


def check_eval_config(cfg) -> None:
    val = cfg.actor_rollout_ref.rollout.val_kwargs
    response_length = cfg.actor_rollout_ref.rollout.response_length or cfg.data.max_response_length
    if val.n < 1:
        raise UserError(f"--n / rollout.val_kwargs.n={val.n}: must be >= 1")
    greedy = not val.do_sample or val.temperature == 0
    if val.n > 1 and greedy:
        raise UserError(f"--n {val.n} with greedy decoding gives {val.n} identical responses "
                         "(and a meaningless pass@k); sample with --temperature 1.0 (or "
                         "rollout.val_kwargs.do_sample=True rollout.val_kwargs.temperature=...)")
    if not 0 < val.top_p <= 1:
        raise UserError(f"--top-p / rollout.val_kwargs.top_p={val.top_p}: must be in (0, 1]")
    if response_length < 1:
        raise UserError(f"--max-new-tokens / rollout.response_length={response_length}: "
                         "must be >= 1")
    if cfg.data.val_batch_size is not None and cfg.data.val_batch_size < 1:
        raise UserError(f"--batch-size / data.val_batch_size={cfg.data.val_batch_size}: "
                         "must be >= 1")


def response_length_unset(cfg) -> bool:
    """Neither --max-new-tokens, rollout.response_length nor a changed
    data.max_response_length chose the response length."""
    from thinkrl.config.schema import DataConfig

    return (cfg.actor_rollout_ref.rollout.response_length is None
            and cfg.data.max_response_length == DataConfig.max_response_length)


def run_eval(cfg, *, log=print):
    """Load model, tokenizer and data as training does and evaluate with the
    run's own engine (native or vLLM, `actor_rollout_ref.rollout.name`),
    built by the same rank code as training's; returns the EvalResult and
    the settings that produced it."""
    import torch

    from thinkrl.assets import run_tokenizer, val_batch_size, validation_sampling
    from thinkrl.evaluation import evaluate
    from thinkrl.errors import SetupError
    from thinkrl.preflight import check_model
    from thinkrl.rollout.vllm_checks import engine_parallel_problem
    from thinkrl.rewards.scorer import RewardScorer
    from thinkrl.envs.setup import check_rows, needs_loop, run_router, with_env_loop
    from thinkrl.tools.setup import chat_kwargs_with_tools, run_tools
    from thinkrl.workers.group import LocalGroup
    from thinkrl.workers.handles import EngineHandle
    from thinkrl.workers.policy_rank import RankSpec

    torch.manual_seed(cfg.trainer.seed)
    model_path = model_folder(cfg.actor_rollout_ref.model.path, log=log)
    log(f"model: {model_path}")
    check_model(cfg, model_path)  # what the engine cannot take, before anything loads
    problem = engine_parallel_problem(cfg.actor_rollout_ref.rollout, "local")  # one process
    if problem is not None:
        raise SetupError(*problem)
    tokenizer = run_tokenizer(cfg, model_path)
    tools = run_tools(cfg)  # rollout.multi_turn and environments, as training runs them
    chat = chat_kwargs_with_tools(cfg, tools)
    prompts = eval_prompts(cfg, tokenizer, model_path, log=log, chat_kwargs=chat)
    router = run_router(cfg, tools)
    counts = check_rows(router, [p.sample for p in prompts], key="--data", log=log)
    reward = RewardScorer.from_config(cfg)
    # before any generation; rows an environment scores need no reward function
    reward.check_sources(p.sample.data_source for p in prompts if not router.owns_reward(p.sample))
    sizes = eval_sizes(cfg, model_path, longest=max(len(p.ids) for p in prompts), log=log)
    group = LocalGroup(RankSpec.of_model(cfg, sizes, model_path, tokenizer, total_steps=1))
    engine = EngineHandle(group, own_weights=cfg.actor_rollout_ref.rollout.name != "native")
    if needs_loop(counts):
        engine = with_env_loop(cfg, engine, tokenizer=tokenizer, router=router,
                               eos_token_ids=list(group.rank.spec.eos_token_ids), chat_kwargs=chat)
    sampling = validation_sampling(cfg, max_tokens=sizes.response_length)
    batch_size = val_batch_size(cfg, len(prompts))
    log(f"evaluating {len(prompts)} prompts x {sampling.n} responses "
        f"({'greedy' if sampling.greedy else f'temperature {sampling.temperature}'}, "
        f"up to {sampling.max_tokens} tokens, {batch_size} prompts per batch, with "
        f"{cfg.actor_rollout_ref.rollout.name} on {group.rank.device})")
    try:
        with reward:
            result = evaluate(engine, prompts, tokenizer=tokenizer, sampling=sampling,
                              reward=reward, batch_size=batch_size,
                              on_batch=lambda done, total: log(f"  {done}/{total} prompts"))
    finally:
        router.close()
        group.close()
    return result, eval_settings(cfg, model_path, sampling, batch_size=batch_size,
                                 device=group.rank.device)


def eval_prompts(cfg, tokenizer, model_path: str, *, log=print, chat_kwargs: dict | None = None):
    """data.val_files under data.val_template (or data.template), as training loads them."""
    from thinkrl.assets import prompt_set

    data = cfg.data
    return prompt_set(cfg, tokenizer, files=data.val_files, key="--data (data.val_files)",
                      template=data.val_template or data.template, log=log, model_path=model_path,
                      chat_kwargs=chat_kwargs)


def eval_sizes(cfg, model_path: str, *, longest: int, log=print):
    """The run's sizes for prompts of up to `longest` tokens, the response
    length fitted to the model's positions; no critic."""
    from dataclasses import replace

    from transformers import AutoConfig

    from thinkrl.config.sizes import derive_sizes

    model = cfg.actor_rollout_ref.model
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=model.trust_remote_code,
                                        **(model.override_config or {}))
    sizes = fit_response_length(cfg, derive_sizes(cfg), config, longest=longest,
                                model_path=model_path, log=log)
    return replace(sizes, prompt_length=longest, critic=None)


def eval_settings(cfg, model_path: str, sampling, *, batch_size: int, device) -> dict:
    """What produced the results (eval.json's "settings")."""
    data = cfg.data
    return {"model": model_path, "data": data.val_files, "template": data.val_template or data.template,
            "engine": cfg.actor_rollout_ref.rollout.name, "n": sampling.n,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "do_sample": sampling.do_sample, "max_new_tokens": sampling.max_tokens,
            "batch_size": batch_size, "seed": cfg.trainer.seed, "device": str(device)}


def fit_response_length(cfg, sizes, config, *, longest: int, model_path: str, log=print):
    """`sizes` whose response length fits the model's positions after the
    longest prompt actually loaded (not data.max_prompt_length: verl's default
    of 512 would reject small models): shortened when no length was asked
    for, a ValueError when the asked-for length does not fit."""
    from dataclasses import replace

    limit = getattr(config, "max_position_embeddings", None)
    if limit is None:
        return sizes
    if longest + sizes.response_length > limit and response_length_unset(cfg) and limit - longest >= 1:
        sizes = replace(sizes, response_length=limit - longest)
        log(f"note: responses are limited to {sizes.response_length} tokens: the model's "
            f"max_position_embeddings {limit} minus the longest prompt ({longest} tokens); "
            "--max-new-tokens sets another limit")
    if longest + sizes.response_length > limit:
        raise UserError(f"the longest prompt ({longest} tokens) + --max-new-tokens "
                         f"{sizes.response_length} exceed the model's max_position_embeddings "
                         f"{limit} ({model_path}); lower --max-new-tokens")
    return sizes


def model_folder(path: str, *, log=print) -> str:
    """The folder (or hub id) to load weights from: a Hugging Face folder as
    given; a checkpoint (`global_step_N`) or a run directory (its latest
    complete checkpoint, as `thinkrl export` finds it) gives the checkpoint's
    Hugging Face weights."""
    from thinkrl.builtin import is_builtin, resolve_model_path
    from thinkrl.checkpoint.adapter import is_adapter_checkpoint
    from thinkrl.checkpoint.sharded import ACTOR_DIR, is_sharded_checkpoint
    from thinkrl.checkpoint.store import resolve_checkpoint

    if is_builtin(path):
        return resolve_model_path(path, log=log)
    local = Path(path).expanduser()
    if not local.exists():
        if path.startswith(("/", ".", "~")) or path.count("/") > 1:
            raise UserError(f"--model {path}: no such folder. Give a Hugging Face model folder, "
                             "a checkpoint folder (global_step_N), a run directory, a hub id "
                             "or builtin:tiny-qwen2.")
        return path  # a hub id: transformers fetches it (or says why it cannot)
    if (local / "config.json").is_file():
        return str(local.resolve())
    if (local / "adapter_config.json").is_file():  # a LoRA adapter folder: merged onto its base
        from thinkrl.checkpoint.adapter import write_merged_model
        from transformers import AutoTokenizer
        folder = _scratch_folder() / local.name
        base = write_merged_model(local, folder)
        tokenizer_source = local if (local / "tokenizer_config.json").is_file() else base
        AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(folder)
        log(f"--model {local}: a LoRA adapter, merged into its base model {base}")
        return str(folder)
    try:
        checkpoint = resolve_checkpoint(local, log=log)
    except ValueError as err:
        raise UserError(f"--model {local.resolve()}: not a Hugging Face model folder (no "
                         f"config.json), and not a checkpoint or run directory: {err}") from None
    log(f"--model {local}: the weights of checkpoint {checkpoint.name}")
    adapter = is_adapter_checkpoint(checkpoint)
    if is_sharded_checkpoint(checkpoint) or adapter:  # a Hugging Face folder made for this eval
        from thinkrl.checkpoint.export import export_checkpoint
        return str(export_checkpoint(checkpoint, _scratch_folder() / checkpoint.name, merge=adapter,
                                     log=log))
    return str(checkpoint / ACTOR_DIR)


def _scratch_folder() -> Path:
    """A temporary folder removed when this process exits: full weights are never left behind."""
    import atexit
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="thinkrl-eval-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def output_dir(out: str | None, model_path: str) -> Path:
    if out is not None:
        return Path(out).expanduser().resolve()
    # runs/thinkrl/tiny/global_step_20/hf -> tiny-global_step_20-hf
    parents = list(Path(model_path).parts)
    names = [parents.pop()]
    while parents and re.fullmatch(r"global_step_\d+|huggingface|hf|actor", names[0]):
        names.insert(0, parents.pop())
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(names))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (Path("runs") / "eval" / f"{name}-{stamp}").resolve()


def write_outputs(out: Path, result, settings: dict) -> None:
    from dataclasses import asdict

    from thinkrl.atomic import atomic_write_text
    from thinkrl.generations import write_jsonl

    report = {"settings": settings, "prompts": sum(s.prompts for s in result.summaries),
              "samples": len(result.generations), "metrics": result.metrics(),
              "per_source": [asdict(s) for s in result.summaries]}
    atomic_write_text(out / "eval.json", json.dumps(report, indent=2, default=str) + "\n")
    write_jsonl(out / "generations.jsonl", result.generations)


def format_table(result) -> str:
    """One row per data source: prompts, samples, mean@n, accuracy, pass@k,
    mean response length, clip ratio."""
    from thinkrl.rewards.scoring import CORRECT_SCORE

    n = result.n
    ks = sorted({k for s in result.summaries for k in s.pass_at})
    header = (["data source", "prompts", "samples", f"mean@{n}", "acc"]
              + [f"pass@{k}" for k in ks] + ["mean len", "clip"])
    rows = [[s.data_source, str(s.prompts), str(s.samples), f"{s.mean_score:.3f}",
             f"{s.accuracy:.3f}"] + [f"{s.pass_at[k]:.3f}" for k in ks]
            + [f"{s.mean_length:.1f}", f"{s.clip_ratio:.3f}"] for s in result.summaries]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    rule = "-" * len(line(header))
    footer = (f"{result.seconds:.1f} s; acc: accuracy (or score) >= {CORRECT_SCORE}"
              + (f"; {result.scorer_errors} scorer errors (scored 0)" if result.scorer_errors
                 else ""))
    return "\n".join([line(header), rule, *[line(r) for r in rows], rule, footer])
