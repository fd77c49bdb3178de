"""What the rehearsal's stages check beyond running the real code: image
paths of every row, the reward on the data's gold answers and on the
shrunken model's responses, a restart that continues from its checkpoint,
an export that keeps the model's architecture."""

from __future__ import annotations

import contextlib
import copy
import logging
import re
from pathlib import Path

from thinkrl.config.schema import Config
from thinkrl.rehearse.errors import StageFailed, StageWarning
from thinkrl.rehearse.plan import DataSample


def image_path(cell) -> str | None:
    """The file an image cell names, None for bytes (read as `open_image` reads it)."""
    from thinkrl.data.images import image_source

    source = image_source(cell)
    return str(source).removeprefix("file://") if isinstance(source, (str, Path)) else None


def check_image_paths(files: list[Path], *, image_key: str) -> str | None:
    """The first image path of any row of `files` that does not exist, with
    the count; None when all do (every row is read, not only the sample)."""
    import pyarrow.parquet as pq

    missing, first = 0, None
    for path in dict.fromkeys(files):  # val_files may repeat train_files
        if image_key not in pq.read_schema(path).names:
            continue
        for index, cell in enumerate(pq.read_table(path, columns=[image_key]).column(0).to_pylist()):
            for image in cell if isinstance(cell, list) else [cell] if cell else []:
                named = image_path(image)
                if named and not Path(named).expanduser().exists():
                    missing += 1
                    first = first or f"{path}, row {index}: the image {named} does not exist"
    return None if first is None else f"{first} ({missing} image path(s) missing in all)"


def real_layout_rows(real: Config) -> list:
    """The real run's parallel layout against its model and devices, whatever
    this machine has installed: rollout TP x PP tiling the nodes, the
    attention heads splitting over TP, the FSDP sizes."""
    from thinkrl.doctor import DoctorContext, run_check
    from thinkrl.doctor.config import check_parallel_layout, check_rollout_parallel
    from thinkrl.doctor.core import fail, ok
    from thinkrl.rollout.vllm_checks import engine_model_problem

    ctx = DoctorContext(real)
    rows = [*run_check(check_rollout_parallel, ctx), *run_check(check_parallel_layout, ctx)]
    from thinkrl.doctor import NotChecked

    try:
        problem = engine_model_problem(real.actor_rollout_ref.rollout, ctx.model_config)
    except NotChecked:
        return rows  # the model's own row says why
    rollout = real.actor_rollout_ref.rollout
    rows.append(fail("config/rollout-heads", *problem) if problem else
                ok("config/rollout-heads", f"rollout.name={rollout.name} TP"
                   f"{rollout.tensor_model_parallel_size} splits the model's attention heads"))
    return rows


def loaded_prompts(cfg: Config, *, key: str) -> list:
    """The prompts of data.<key> as the run loads them: the real tokenizer
    and template, the length rules, the images through the processor."""
    from thinkrl.assets import prompt_set, run_tokenizer
    from thinkrl.tools.setup import chat_kwargs_with_tools, run_tools

    data, model_path = cfg.data, cfg.actor_rollout_ref.model.path
    template = data.template if key == "train_files" else data.val_template or data.template
    return prompt_set(cfg, run_tokenizer(cfg, model_path), files=getattr(data, key),
                      key=f"data.{key}", template=template, log=lambda _m: None,
                      chat_kwargs=chat_kwargs_with_tools(cfg, run_tools(cfg)))


def real_rows(text: str, sample: DataSample, sample_files: list[Path]) -> str:
    """The scorer's "data_source X, row N" of a sample file said as the real
    file's row; kept as is when the rows of several files could be meant."""
    if len(sample_files) != 1:
        return text

    def mapped(match: re.Match) -> str:
        try:
            return f"{match.group(1)}{sample.real_row(sample_files[0], int(match.group(2)))}"
        except (KeyError, IndexError):
            return match.group(0)
    return re.sub(r"(data_source [^,]+, )row (\d+)", mapped, text, count=1)


def gold_finding(cfg: Config, sample: DataSample, *, rows: int) -> str:
    """The reward on the gold answers of the first `rows` sampled train rows:
    raises StageFailed when it raises, hangs, or scores no gold answer above
    a wrong one; StageWarning when some rows' gold answers score no higher."""
    from thinkrl.rehearse.gold import score_gold
    from thinkrl.rewards.scorer import RewardScorer

    first_file = Path(cfg.data.train_files[0])
    one_file = copy.deepcopy(cfg)  # rows are numbered within their file
    one_file.data.train_files = [str(first_file)]
    samples = [p.sample for p in loaded_prompts(one_file, key="train_files")[:rows]]
    where = [sample.real_row(first_file, s.index) for s in samples]
    reward = RewardScorer.from_config(cfg)
    reward.check_sources(s.data_source for s in samples)
    with reward, kept_reward_warnings():
        gold = score_gold(reward, samples, where)
    fix = ("fix the reward for these rows' data_source (reward.scorer, reward.verifiers or "
           "custom_reward_function.*) or the data's reward_model.ground_truth")
    if gold.errors or gold.timeouts:
        raise StageFailed(f"the reward raised on {gold.errors} and timed out on {gold.timeouts} of the "
                          f"{gold.answers} answers written for {len(samples)} rows: "
                          f"{real_rows(gold.first_error or '', sample, [first_file])}", fix)
    bad = gold.unrewarded
    example = (lambda i: f"{where[i]} (ground truth {samples[i].ground_truth!r}: its gold answer "
                         f"scores {gold.best[i]:g}, a wrong one at best {gold.wrong[i]:g})")
    if len(bad) == len(samples) and max(gold.best) <= 0:
        raise StageFailed(f"the reward scores no row's gold answer above a wrong answer "
                          f"({len(samples)} rows), e.g. {example(bad[0])}: the run cannot learn", fix)
    if len(bad) == len(samples):  # it pays, but a wrong answer as much: a format-only reward?
        raise StageWarning(f"the reward pays a wrong answer as much as the gold one on every row "
                           f"({len(samples)} rows), e.g. {example(bad[0])}: it can teach a format, "
                           "not the answers", fix)
    if bad:
        raise StageWarning(f"{len(bad)} of {len(samples)} rows' gold answers score no higher than a "
                           f"wrong answer, e.g. {example(bad[0])}", fix)
    unasked = [i for i, marks in enumerate(gold.unasked) if marks]
    if unasked:
        i = unasked[0]
        found = (f"the reward scores only answers with {' and '.join(gold.unasked[i])}, but the "
                 f"prompts of {len(unasked)} of {len(samples)} rows never ask for "
                 f"{'them' if len(gold.unasked[i]) > 1 else 'it'} (data.template="
                 f"{cfg.data.template}), e.g. {where[i]}: a model not told the format scores 0")
        fix = ("use the template the data was prepared for (R1-Zero rewards: data.template=qwen_r1), "
               "or an instruction in the prompt that asks for this answer format")
        raise (StageFailed if len(unasked) == len(samples) else StageWarning)(found, fix)
    mean = sum(gold.best) / len(gold.best)
    return (f"the gold answers of {len(samples)} rows score {mean:.2f} on average, a wrong answer "
            f"{sum(gold.wrong) / len(gold.wrong):.2f}")


class ReasonsKept(logging.Handler):
    """Keeps the reward's warnings (the first failing row and response)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def kept_reward_warnings():
    """The reward's warnings go to the rehearsal's table (with the real file's
    rows), not to the console with the sample's row numbers."""
    logger, reasons = logging.getLogger("thinkrl.rewards"), ReasonsKept()
    logger.addHandler(reasons)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield reasons
    finally:
        logger.removeHandler(reasons)
        logger.propagate = propagate


def response_reward_failure(metrics: list[dict], reasons: list[str], sample: DataSample,
                            train_files: list[Path]) -> tuple[str, str] | None:
    """(found, fix) when the reward raised or timed out on responses of the
    shrunken model during training; None when it scored them all."""
    errors = sum(m.get("reward/errors", 0) for m in metrics)
    timeouts = sum(m.get("reward/timeouts", 0) for m in metrics)
    if not errors and not timeouts:
        return None
    first = real_rows(reasons[0], sample, train_files) if reasons else "(no message)"
    return (f"the reward failed on {errors:g} and timed out on {timeouts:g} of the shrunken "
            f"model's responses: {first}",
            "make the reward function return a number for any response text (a wrong or "
            "malformed answer scores low; it must not raise), within reward.timeout_s")


def resume_from_checkpoint(cfg: Config, *, expect: int, log) -> str:
    """Start the run again as a restarted cluster job would: it must continue
    from step `expect`'s checkpoint and train one more step."""
    from thinkrl.build import build_run
    from thinkrl.trainer import train_run

    run = build_run(cfg, log=log)
    try:
        start = run.state.progress.step
        if start != expect:
            trainer = cfg.trainer
            raise StageFailed(
                f"a restart began at step {start}, not after global_step_{expect} "
                f"(trainer.resume_mode={trainer.resume_mode}"
                f"{f', resume_from_path={trainer.resume_from_path}' if trainer.resume_from_path else ''}"
                "): a preempted cluster job would train from the start again",
                "set trainer.resume_mode=auto (the newest checkpoint of the run directory)")
        train_run(run, log=log)
    finally:
        run.close()
    return f"a restart continued from global_step_{expect} and trained step {expect + 1}"


def check_exported(out: Path, *, like: Path) -> str:
    """The exported folder loads with transformers and keeps the model's
    architecture, vocabulary and special tokens."""
    from transformers import AutoConfig, AutoTokenizer

    from thinkrl.rehearse.shrink import architecture_of

    AutoConfig.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    exported, trained = architecture_of(out), architecture_of(like)
    changed = {k: (trained[k], v) for k, v in exported.items() if trained[k] != v}
    if changed:
        raise StageFailed(f"the exported model differs from the trained one: {changed}",
                          "this is a bug in thinkrl export: please report it")
    files = sorted(p.name for p in out.iterdir())
    return (f"{out}: {exported['architectures'][0]}, tokenizer of {len(tokenizer)} tokens, "
            f"{len(files)} files")
