"""Data checks: files, schema, environments, data_source -> reward, prompt
template and lengths.

Files are found and read by the same functions the run uses
(`thinkrl.data.files.resolve_files`, `read_rows`), prompts are rendered by
`thinkrl.data.templates.render_prompt` and tokenised as `load_prompts` does,
so what passes here loads at start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from thinkrl.doctor.context import DoctorContext, NotChecked
from thinkrl.doctor.core import CheckResult, fail, gib, ok, warn
from thinkrl.errors import problem_and_fix
from thinkrl.records import SINGLE_TURN, Sample

SAMPLED_ROWS = 1000
"""Prompts rendered and tokenised per data set for the length check: evenly
spaced rows, so a 57K-row set costs the same second as a small one."""
KEYS = ("data.train_files", "data.val_files")


@dataclass(frozen=True, slots=True)
class DataSet:
    key: str
    """The config key naming the files."""
    files: list[Path]
    rows: list[dict]
    template: str
    """The prompt template this set is rendered with."""


def _spec(ctx: DoctorContext, key: str):
    return getattr(ctx.cfg.data, key.split(".")[1])


def _template(ctx: DoctorContext, key: str) -> str:
    data = ctx.cfg.data
    return data.template if key == "data.train_files" else (data.val_template or data.template)


def _files(ctx: DoctorContext, key: str) -> list[Path]:
    def compute() -> list[Path]:
        from thinkrl.builtin import resolve_data_files
        from thinkrl.data.files import resolve_files

        try:
            return resolve_files(resolve_data_files(_spec(ctx, key), log=ctx.log), key=key)
        except ValueError:
            raise NotChecked(f"needs readable {key}: see data/files") from None
    return ctx.remember(f"files:{key}", compute)


def dataset_of(ctx: DoctorContext, key: str) -> DataSet:
    def compute() -> DataSet:
        from thinkrl.data.files import read_rows

        data, rows = ctx.cfg.data, []
        files = _files(ctx, key)
        try:
            for path in files:
                rows += read_rows(path, prompt_key=data.prompt_key, reward_fn_key=data.reward_fn_key,
                                  media_keys=(data.video_key,))  # images: doctor/vision
        except ValueError as err:
            ctx.memo[f"schema-error:{key}"] = err  # data/schema reports it
            raise NotChecked(f"needs valid rows in {key}: see data/schema") from None
        return DataSet(key=key, files=files, rows=rows, template=_template(ctx, key))
    return ctx.remember(f"dataset:{key}", compute)


def _each_key(name: str, row: Callable[[DoctorContext, str], CheckResult | None]):
    """Rows of `row(ctx, key)` for the train and the validation set; a set
    that cannot be checked gives its own `skip` row."""
    def per_key(ctx: DoctorContext) -> list[CheckResult]:
        results = []
        for key in KEYS:
            try:
                result = row(ctx, key)
            except NotChecked as why:
                result = CheckResult(name, "skip", f"{key}: {why}")
            if result is not None:
                results.append(result)
        return results
    per_key.__name__ = "check_" + name.split("/")[1].replace("-", "_")  # the row name on a crash
    return per_key


def check_files(ctx: DoctorContext) -> list[CheckResult]:
    """Every train/val path resolves to existing, non-empty files."""
    from thinkrl.builtin import resolve_data_files
    from thinkrl.data.files import resolve_files

    results = []
    for key in KEYS:
        try:
            files = resolve_files(resolve_data_files(_spec(ctx, key), log=ctx.log), key=key)
        except ValueError as err:
            results.append(fail("data/files", *problem_and_fix(err)))
            continue
        empty = [p for p in files if p.stat().st_size == 0]
        if empty:
            results.append(fail("data/files", f"{key}: empty file(s) {', '.join(map(str, empty))}",
                                "re-run the preprocessing that writes them"))
            continue
        size = sum(p.stat().st_size for p in files)
        shown = ", ".join(map(str, files[:3])) + (f" (+{len(files) - 3} more)" if len(files) > 3 else "")
        results.append(ok("data/files", f"{key}: {len(files)} file(s), {gib(size)}: {shown}"))
    return results


def _schema_row(ctx: DoctorContext, key: str) -> CheckResult:
    """Every row has the prompt, data_source and ground truth the run reads."""
    data = ctx.cfg.data
    try:
        rows = len(dataset_of(ctx, key).rows)
    except NotChecked:
        err = ctx.memo.get(f"schema-error:{key}")
        if err is None:
            raise
        found, _, fix = str(err).partition(": ")
        return fail("data/schema", found, fix or str(err))
    if key == "data.train_files" and rows < data.train_batch_size:
        return fail("data/schema", f"{key}: {rows} rows, fewer than data.train_batch_size="
                    f"{data.train_batch_size}", "lower data.train_batch_size or add data")
    return ok("data/schema", f"{key}: {rows} rows with {data.prompt_key}, {data.reward_fn_key}, "
              "reward_model.ground_truth")


check_schema = _each_key("data/schema", _schema_row)


def check_reward(ctx: DoctorContext) -> CheckResult:
    """Every data_source of the data has a reward function: the run's own
    `RewardFnSpec` is built and asked, as the trainer does at start. A
    user's file is imported first in a throwaway process under
    reward.timeout_s, so a file that hangs at import cannot freeze the doctor."""
    from thinkrl.rewards.registry import scorer_name_for
    from thinkrl.rewards.reward_fn import RewardFnSpec
    from thinkrl.rewards.scorer import probe_import

    spec = RewardFnSpec.from_config(ctx.cfg)
    try:
        if spec.custom_path:
            probe_import(spec, timeout_s=ctx.cfg.reward.timeout_s)
        spec.build()  # a custom file that does not load, an unknown reward.scorer
    except ValueError as err:
        found, _, fix = str(err).partition(": ")
        return fail("data/reward", found, fix or str(err))
    if spec.custom_path:
        return ok("data/reward", f"every row is scored by {spec.custom_name} in {spec.custom_path}")
    if spec.scorer != "auto":
        return ok("data/reward", f"every row is scored by the built-in {spec.scorer} scorer (reward.scorer)")
    sources = sorted({row[ctx.cfg.data.reward_fn_key] for key in KEYS for row in dataset_of(ctx, key).rows})
    try:
        sources = [s for s in sources if s not in routing(ctx).scoring]  # a game scores its own rows
    except ValueError:
        pass  # data/environments reports it
    try:
        spec.check_sources(sources)
    except ValueError as err:
        found, _, fix = str(err).partition(". ")
        return fail("data/reward", found, fix or str(err))
    if not sources:
        return ok("data/reward", "every row is scored by its environment")
    return ok("data/reward", "; ".join(f"{s} -> {scorer_name_for(s)}" for s in sources))


def _rendered(ctx: DoctorContext, key: str) -> str:
    """Row 0 of `key` rendered with its template (what the model sees)."""
    def compute() -> str:
        from thinkrl.data.templates import render_prompt

        dataset = dataset_of(ctx, key)
        tokenizer = ctx.tokenizer
        try:
            return render_prompt(dataset.template, tokenizer, dataset.rows[0][ctx.cfg.data.prompt_key],
                                 ctx.cfg.data.apply_chat_template_kwargs)
        except ValueError as err:
            ctx.memo[f"render-error:{key}"] = err  # data/template reports it
            raise NotChecked("needs a template that renders: see data/template") from None
    return ctx.remember(f"rendered:{key}", compute)


def _template_row(ctx: DoctorContext, key: str) -> CheckResult | None:
    """The template each data set uses, shown on its first row."""
    dataset = dataset_of(ctx, key)
    if key != KEYS[0] and dataset.template == _template(ctx, KEYS[0]):
        return None  # the same template as training: shown once
    try:
        text = _rendered(ctx, key)
    except NotChecked:
        err = ctx.memo.get(f"render-error:{key}")
        if err is None:
            raise
        return fail("data/template", f"{key}: template {dataset.template} does not render row 0",
                    str(err))
    return ok("data/template", f"{key}: template {dataset.template}, row 0 renders as {text!r:.300}")


def _length_row(ctx: DoctorContext, key: str) -> CheckResult:
    """Rendered prompt lengths (tokens) against data.max_prompt_length."""
    from thinkrl.data.templates import render_prompt

    data, dataset = ctx.cfg.data, dataset_of(ctx, key)
    limit = data.max_prompt_length
    _rendered(ctx, key)  # row 0 must render: else data/template has said why
    step = max(1, len(dataset.rows) // SAMPLED_ROWS)
    texts = []
    for index in range(0, len(dataset.rows), step):
        try:
            texts.append(render_prompt(dataset.template, ctx.tokenizer, dataset.rows[index][data.prompt_key],
                                       data.apply_chat_template_kwargs))
        except ValueError as err:
            return fail("data/prompt-length", f"{key}, row {index}: {err}",
                        "fix the row or change data.template")
    lengths = [len(ids) for ids in ctx.tokenizer(texts, add_special_tokens=False)["input_ids"]]
    if step == 1:  # every row measured: the memory estimate may use the real longest prompt
        ctx.memo[f"longest-prompt:{key}"] = min(max(lengths), limit)
    over = sum(n > limit for n in lengths)
    sampled = f"{len(lengths)} of {len(dataset.rows)} rows" if step > 1 else f"{len(lengths)} rows"
    found = (f"{key}: longest prompt {max(lengths)} tokens, data.max_prompt_length={limit}; "
             f"{over} over the limit ({sampled}, template {dataset.template})")
    if not over:
        return ok("data/prompt-length", found)
    if data.filter_overlong_prompts or data.truncation != "error":
        action = "dropped" if data.filter_overlong_prompts else f"truncated ({data.truncation})"
        return warn("data/prompt-length", found + f"; they will be {action}",
                    f"raise data.max_prompt_length to {max(lengths)} to keep them whole")
    return fail("data/prompt-length", found + " and data.truncation=error",
                f"raise data.max_prompt_length to {max(lengths)}, set data.filter_overlong_prompts=True, "
                "or data.truncation=left|right|middle")


check_template = _each_key("data/template", _template_row)
check_prompt_length = _each_key("data/prompt-length", _length_row)

def check_tools(ctx: DoctorContext) -> CheckResult | list[CheckResult]:
    """rollout.multi_turn: the tool file loads and every tool is built, as the
    trainer does at start; nothing to check with the tool loop off."""
    from thinkrl.tools.setup import run_tools

    if not ctx.cfg.actor_rollout_ref.rollout.multi_turn.enable:
        return []
    try:
        runner = run_tools(ctx.cfg)
    except ValueError as err:
        found, _, fix = str(err).partition(": ")
        return fail("data/tools", found, fix or str(err))
    names = ", ".join(runner.tools) or "no tools (the model's calls are answered with an error)"
    return ok("data/tools", f"tool loop on: {names}")


@dataclass(frozen=True)
class Routing:
    rows: dict[str, int]
    """environment -> rows (train and validation)."""
    scoring: frozenset[str]
    """data sources whose every row an environment scores."""


def routing(ctx: DoctorContext) -> Routing:
    """Resolve every row (ValueError as the run would raise it); the
    environments are built for it and closed again."""
    def compute() -> Routing:
        from thinkrl.envs.setup import run_router
        from thinkrl.tools.setup import run_tools

        samples = [Sample(str(row[ctx.cfg.data.reward_fn_key]), "", "", extra_info=dict(row.get("extra_info") or {}),
                          index=index)
                   for key in KEYS for index, row in enumerate(dataset_of(ctx, key).rows)]
        router = run_router(ctx.cfg, run_tools(ctx.cfg))
        try:
            rows = router.check(samples, key="data")
            owned = {s.data_source: router.owns_reward(s) for s in samples}
            by_source: dict[str, bool] = {}
            for sample in samples:
                by_source[sample.data_source] = by_source.get(sample.data_source, True) and owned[sample.data_source]
        finally:
            router.close()
        return Routing(rows, frozenset(s for s, all_owned in by_source.items() if all_owned))
    return ctx.remember("env-routing", compute)


def check_environments(ctx: DoctorContext) -> CheckResult | list[CheckResult]:
    """Rows per environment; a fail naming the row and the closest name
    for one the run does not have, or for an interaction file that does not load."""
    try:
        found = routing(ctx)
    except ValueError as err:
        problem, _, fix = str(err).partition("; ")
        return fail("data/environments", problem, fix or str(err))
    if set(found.rows) == {SINGLE_TURN}:
        return []
    return ok("data/environments", ", ".join(f"{name}: {rows} rows" for name, rows in sorted(found.rows.items())))


CHECKS = [check_files, check_schema, check_environments, check_reward, check_tools, check_template,
          check_prompt_length]
