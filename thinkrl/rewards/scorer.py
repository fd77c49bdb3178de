"""The reward stage's entry point: score a batch of responses, never crash
or hang the run.

    scorer = RewardScorer.from_config(cfg)      # loads/validates a custom file now
    scorer.check_sources(sources)               # unknown data_source -> ValueError at start
    result = scorer.score(texts, samples)       # ScoreResult: scores [N], errors, timeouts
    scorer.close()                              # or `with RewardScorer(...) as scorer:`

With `num_workers > 0` responses are scored in worker processes
(`thinkrl.rewards.pool`) and one that takes longer than `timeout_s` is
stopped and scores 0. With `num_workers = 0` they are scored in this
process: faster for cheap scorers, but a scorer that hangs hangs the run.
Either way a scorer that raises scores 0, and the scores are identical.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from thinkrl.config.schema import RewardConfig
from thinkrl.errors import UserError
from thinkrl.records import Sample
from thinkrl.rewards.custom import RewardFunction, check_reward_file, check_signature
from thinkrl.rewards.pool import ScoringPool
from thinkrl.rewards.reward_fn import Outcome, RewardFnSpec, Task, score_one

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ScoreResult:
    scores: Tensor  # [N] float32; 0 where the scorer failed or timed out
    errors: int
    """Responses whose scorer raised, returned a non-number, or whose worker died."""
    timeouts: int
    """Responses whose scorer ran past reward.timeout_s (and was stopped)."""
    parts: list[dict[str, float]] = field(default_factory=list)
    """[N] named parts a scorer reported beside its score (r1: format, accuracy);
    empty dicts when it reported none."""
    unscored: int = 0
    """Responses not scored because the failures before them already lost the
    run (`score`'s give_up): the failure breaker counts them as failed."""

    def metrics(self) -> dict[str, float]:
        """`reward/errors`, `reward/timeouts`, and `reward/<part>/mean` over
        the responses that reported that part."""
        metrics = {"reward/errors": float(self.errors), "reward/timeouts": float(self.timeouts)}
        sums: dict[str, list[float]] = defaultdict(list)
        for parts in self.parts:
            for name, value in parts.items():
                sums[name].append(value)
        for name, values in sorted(sums.items()):
            metrics[f"reward/{name}/mean"] = sum(values) / len(values)
        return metrics


class RewardScorer:
    """Scores responses with the run's reward function (built-in or custom)."""

    def __init__(self, spec: RewardFnSpec, *, num_workers: int = RewardConfig.num_workers,
                 timeout_s: float = RewardConfig.timeout_s) -> None:
        if num_workers < 0:
            raise UserError(f"reward.num_workers={num_workers}: use 0 (score in the main "
                             "process) or a count of worker processes, e.g. 2")
        self.spec: RewardFnSpec | None = spec
        self._pool = ScoringPool(spec, num_workers=num_workers, timeout_s=timeout_s) \
            if num_workers > 0 else None
        self._function: RewardFunction | None = None
        if spec.custom_path:
            # A user's file is imported in a worker process first, under the
            # scoring deadline: an import that hangs is killed and named.
            check_reward_file(spec.custom_path)
            if self._pool is None:
                probe_import(spec, timeout_s=timeout_s)
                self._function = spec.build()
        else:
            self._function = spec.build()  # a bad scorer name stops the run here
        self._reported: set[str] = set()
        self.first_error: str | None = None
        """The first failure of the run ("data_source ..., row N: what"): the
        circuit breaker names it when it stops the run."""

    @classmethod
    def from_config(cls, cfg: Any) -> "RewardScorer":
        scorer = cls(RewardFnSpec.from_config(cfg), num_workers=cfg.reward.num_workers,
                     timeout_s=cfg.reward.timeout_s)
        if scorer.spec.custom_path and scorer.pool is not None:
            scorer.start()  # the workers import the user's file now: a bad one stops the run here
        return scorer

    @classmethod
    def from_function(cls, function: RewardFunction) -> "RewardScorer":
        """Score inline with an in-process function of verl's signature (tests,
        notebooks). It cannot go to workers: they load functions by path."""
        check_signature(function, where=getattr(function, "__name__", repr(function)))
        scorer = cls(RewardFnSpec(), num_workers=0)
        scorer.spec, scorer._function = None, function
        return scorer

    @property
    def pool(self) -> ScoringPool | None:
        return self._pool

    def check_sources(self, data_sources: Iterable[str]) -> None:
        """ValueError naming each data source no reward function covers."""
        if self.spec is not None:  # a function given in-process takes every row
            self.spec.check_sources(data_sources)

    def trial(self, samples: Iterable[Sample], responses: Callable[[Sample], list[str]]) -> None:
        """Call a custom reward function on each given row with each of
        `responses(row)` (its gold answer written the ways rewards read it);
        ValueError naming the file, the row and the error when every one of
        a row's calls raises or runs past reward.timeout_s. A function that
        fails whatever the response (a wrong key, a missing import inside
        it) stops the run before step 1 instead of after it. With
        reward.num_workers=0 the calls run here, without a deadline, as
        scoring does."""
        if self.spec is None or not self.spec.custom_path:
            return
        tasks: list[Task] = []
        owners: list[int] = []  # the given row each call tries
        for row, sample in enumerate(samples):
            for text in responses(sample):
                tasks.append(Task(len(tasks), text, sample.data_source, sample.ground_truth,
                                  sample.extra_info, sample.index))
                owners.append(row)
        outcomes, timed_out = self._run(tasks)
        rows: dict[int, list[str | None]] = defaultdict(list)  # per given row: each call's error
        for task, row in zip(tasks, owners):
            outcome = outcomes[task.position] if task not in timed_out else None
            error = (f"took longer than reward.timeout_s={self._pool.timeout_s:g} s" if outcome is None
                     else None if outcome.error is None else outcome.error[:500])
            rows[row].append(error)
        where = f"{self.spec.custom_path} ({self.spec.custom_name})"
        for task, row in zip(tasks, owners):
            errors = rows[row]
            if not all(errors):
                continue
            slow = all(e.startswith("took longer than") for e in errors)
            fix = ("Make it faster or raise reward.timeout_s" if slow else
                   "Fix the function: a response of the run that fails like these scores 0")
            raise UserError(
                f"{where} failed on every response of the start-up trial (data_source "
                f"{task.data_source}, row {task.index}, its gold answer written {len(errors)} ways, "
                f"e.g. {task.text[:60]!r}): {errors[0]}. {fix}; a function that reads only a "
                "format of its own can skip the trial with reward.startup_trial=false")

    def start(self) -> None:
        """Start the workers now rather than at the first `score` (optional)."""
        if self._pool is not None:
            self._pool.start()

    def score(self, texts: list[str], samples: list[Sample], *,
              give_up: Callable[[int], bool] | None = None) -> ScoreResult:
        """One score per response; failures score 0 and are counted, and the
        first failure of each kind is logged with its row and response.
        `give_up(failures so far)`: stop scoring as soon as it is true (the
        failure breaker is then certain to stop the run); the responses left
        unscored are counted in `unscored`."""
        if len(texts) != len(samples):
            raise UserError(f"{len(texts)} responses but {len(samples)} samples: they must line up")
        tasks = [Task(i, text, s.data_source, s.ground_truth, s.extra_info, s.index)
                 for i, (text, s) in enumerate(zip(texts, samples))]
        outcomes, timed_out = self._run(tasks, give_up=give_up)
        abandoned = len(tasks) - len(outcomes) - len(timed_out)
        if abandoned:
            log.warning("reward: %d of %d responses left unscored: the failures so far already exceed "
                        "reward.max_failure_rate", abandoned, len(tasks))
        for task in timed_out:
            self._report_once("timeout", task, f"took longer than reward.timeout_s="
                              f"{self._pool.timeout_s:g} s and was stopped; counted in reward/timeouts")
        errors = 0
        for task in tasks:
            outcome = outcomes.get(task.position)
            if outcome is not None and outcome.error is not None:
                errors += 1
                kind = outcome.error.split(":", 1)[0]
                self._report_once(f"error:{kind}", task, f"failed ({outcome.error[:300]}); "
                                  "counted in reward/errors")
        ordered = [outcomes.get(t.position) for t in tasks]
        return ScoreResult(
            scores=torch.tensor([o.score if o else 0.0 for o in ordered], dtype=torch.float32),
            errors=errors, timeouts=len(timed_out), unscored=abandoned,
            parts=[dict(o.parts) if o else {} for o in ordered])

    def _run(self, tasks: list[Task], *, give_up: Callable[[int], bool] | None = None
             ) -> tuple[dict[int, Outcome], list[Task]]:
        """Each task's outcome by position (in this process or the workers; a
        worker that died scores its task as an error), and the tasks that
        timed out; tasks left once `give_up(failures)` is true have neither."""
        if self._pool is None:
            outcomes, failures = {}, 0
            for task in tasks:
                outcomes[task.position] = outcome = score_one(self._function, task)
                failures += outcome.error is not None
                if give_up is not None and failures and give_up(failures):
                    break
            return outcomes, []
        report = self._pool.run(tasks, give_up=give_up)
        outcomes = dict(report.outcomes)
        for task in report.died:
            outcomes[task.position] = Outcome(0.0, {}, "WorkerDied: the reward worker process "
                                                       "exited while scoring this response")
        return outcomes, report.timed_out

    def _report_once(self, kind: str, task: Task, what: str) -> None:
        if self.first_error is None:
            self.first_error = f"data_source {task.data_source}, row {task.index}: {what}"
        if kind in self._reported:
            return
        self._reported.add(kind)
        log.warning("reward for data_source %s, row %d %s; it scores 0 (reported once per kind). "
                    "Response: %.200r", task.data_source, task.index, what, task.text)

    def close(self) -> None:
        """Stop the reward workers; call once the run no longer scores."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def probe_import(spec: RewardFnSpec, *, timeout_s: float) -> None:
    """Import `spec`'s file in one throwaway worker process within
    `timeout_s` (ValueError naming the file if it hangs or fails), before
    this process imports it: with reward.num_workers=0 a hang here would
    freeze the run forever."""
    pool = ScoringPool(spec, num_workers=1, timeout_s=timeout_s)
    try:
        pool.start()
    finally:
        pool.close()
