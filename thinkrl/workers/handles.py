"""The driver-side handles of the roles, the only role objects the driver
holds, for both backends: each splits its batch over the ranks of a `Group`
(`thinkrl.workers.group`: one in-process rank, or a Ray worker group),
calls every rank, and puts the CPU results back in the original order.
Updates are planned here, once, whatever the backend.
"""

from __future__ import annotations

from pathlib import Path

import torch

from thinkrl.records import CriticBatch, PromptBatch, Rollouts, TrainBatch
from thinkrl.rollout.attest import AttestShare, check_served, served_by_engine
from thinkrl.rollout.base import SamplingParams
from thinkrl.workers.learner import UpdateSpec, actor_update_spec, critic_update_spec
from thinkrl.workers.mini_batches import balanced_shares, contiguous_shares, split_mini_batch
from thinkrl.workers.group import Group


def _scatter_rows(sequences: tuple, shares: list[torch.Tensor]) -> list[tuple]:
    return [tuple(t[rows] for t in sequences) for rows in shares]


def _gather_rows(parts: list[torch.Tensor], shares: list[torch.Tensor]) -> torch.Tensor:
    """Rank results back in the original row order."""
    n = sum(len(rows) for rows in shares)
    out = torch.empty((n, *parts[0].shape[1:]), dtype=parts[0].dtype)
    for rows, part in zip(shares, parts):
        out[rows] = part
    return out


def row_shares(group: Group, attention_mask: torch.Tensor) -> list[torch.Tensor]:
    """Rows per rank, equal in count: balanced by tokens (trainer.balance_batch,
    verl's name) or consecutive."""
    if group.spec.cfg.trainer.balance_batch:
        return balanced_shares(attention_mask.sum(-1), group.world_size)
    return contiguous_shares(attention_mask.shape[0], group.world_size)


class RowShardedCall:
    """A log-prob or value pass over the ranks: each rank gets an equal share of
    the rows (`row_shares`), the results come back in the original order."""

    def __init__(self, group: Group, method: str, stage: str, **fixed) -> None:
        self.group, self.method, self.stage = group, method, stage
        self.fixed = fixed  # keyword arguments of every call (a teacher's name)

    def __call__(self, input_ids, attention_mask, position_ids, *, response_length: int,
                 model_inputs=None, routed_experts=None):
        """[N, P + R] -> [N, R]: equal row counts per rank (see row_shares);
        the rows' images (`model_inputs`, VL models) and routes (router
        replay, [N, P + R, L, k]) go with them."""
        shares = row_shares(self.group, attention_mask)
        rows = _scatter_rows((input_ids, attention_mask, position_ids), shares)
        if model_inputs is not None or routed_experts is not None:
            rows = [(*part, None if model_inputs is None else model_inputs.select(share),
                     *(() if routed_experts is None else (routed_experts[share],)))
                    for part, share in zip(rows, shares)]
        parts = self.group.call_all(self.stage, self.method, rows,
                                    response_length=response_length, **self.fixed)
        return _gather_rows(parts, shares)


class ShardedUpdate:
    """A trained role's update across the group: planned here, once for both
    backends (`UpdateSpec.plan` with a driver-side shuffle generator); each
    rank trains on its share of every mini-batch, with the whole
    mini-batch's normalisers; rank 0 returns the reduced metrics.
    Its resumable state: rank 0's LR schedule (all ranks hold the same) and
    the shuffle generator."""

    def __init__(self, group: Group, spec: UpdateSpec, *, seed: int, method: str) -> None:
        self.group, self.spec, self.method = group, spec, method
        self.shuffle_generator = torch.Generator().manual_seed(seed)

    def __call__(self, batch: TrainBatch | CriticBatch) -> dict[str, float]:
        minis = self.spec.plan(batch, self.shuffle_generator)
        shares = [split_mini_batch(m, row_shares(self.group, m.batch.attention_mask)) for m in minis]
        per_rank = [([s[r] for s in shares],) for r in range(self.group.world_size)]
        return self.group.call_all(f"update_{self.spec.role}", self.method, per_rank)[0]

    def state_dict(self) -> dict:
        group, role = self.group, self.spec.role
        schedule = group.call_all("save_checkpoint", "schedule_state", [(role,)] * group.world_size)[0]
        return {**schedule, "shuffle_generator": self.shuffle_generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        group, role = self.group, self.spec.role
        group.call_all("load_checkpoint", "load_schedule_state",
                       [(role, {"scheduler": state["scheduler"]})] * group.world_size)
        self.shuffle_generator.set_state(state["shuffle_generator"])


class ActorHandle:
    """The policy's passes and update, fanned out. Driver-side state: the
    mini-batch shuffle generator (the plan is made here, with global normalisers)."""

    def __init__(self, group: Group) -> None:
        cfg = group.spec.cfg
        self.group = group
        self.update = ShardedUpdate(group, actor_update_spec(cfg.actor_rollout_ref.actor, group.spec.sizes),
                                    seed=cfg.trainer.seed, method="update_on")
        self.compute_log_prob = RowShardedCall(group, "compute_log_prob", "old_log_prob")

    def recorded_routes(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The routes the last old-log-prob pass took (router replay R2), [N, P + R, L, k]
        in the rows' order (`attention_mask` [N, P + R] of that pass gives each rank's share)."""
        parts = self.group.call_all("old_log_prob", "take_recorded_routes")
        return _gather_rows(parts, row_shares(self.group, attention_mask))

    def routing_agreement(self) -> dict[str, float]:
        """How often the trainer's own routing agreed with the replayed one in
        the old-log-prob passes since the last call, per layer and mean (R3)."""
        from thinkrl.models.routing import agreement_metrics

        counts = self.group.call_all("old_log_prob", "routing_counts")
        agree = [sum(values) for values in zip(*(c[0] for c in counts))]
        counted = [sum(values) for values in zip(*(c[1] for c in counts))]
        return agreement_metrics(agree, counted)

    def update_policy(self, batch: TrainBatch) -> dict[str, float]:
        return self.update(batch)

    def weight_stats(self) -> dict:
        """ActorWorker.weight_stats over the whole model: every rank's shards."""
        parts = self.group.call_all("guard", "weight_stats")
        return {"nonfinite": sorted({n for p in parts for n in p["nonfinite"]}),
                "square_sum": sum(p["square_sum"] for p in parts),
                "vocab_size": parts[0]["vocab_size"]}

    def save(self, folder: Path) -> None:
        """Every rank writes its share: shards (DCP) with the model's config for
        `thinkrl export`, or, on one rank, a Hugging Face folder."""
        self.group.call_all("save_checkpoint", "save_actor", [(str(folder),)] * self.group.world_size)

    def load(self, folder: Path) -> None:
        self.group.call_all("load_checkpoint", "load_actor", [(str(folder),)] * self.group.world_size)

    def state_dict(self) -> dict:
        return self.update.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.update.load_state_dict(state)

    def device_rng_states(self) -> list:
        """Each rank's accelerator generators (None on a CPU), for a checkpoint."""
        return self.group.call_all("save_checkpoint", "device_rng_state")

    def load_device_rng_states(self, states: list) -> None:
        """Put them back when the rank count is the same (else the ranks keep theirs)."""
        if len(states) == self.group.world_size:
            self.group.call_all("load_checkpoint", "set_device_rng_state", [(s,) for s in states])

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The whole model's weights on the CPU (gathered on rank 0)."""
        return self.group.call_all("export", "full_weights")[0]


class ReferenceHandle:
    def __init__(self, group: Group) -> None:
        self.compute_ref_log_prob = RowShardedCall(group, "compute_ref_log_prob", "ref")


class TeacherHandle:
    """The frozen teachers of on-policy distillation, each a row-sharded pass
    like the reference's, by name."""

    def __init__(self, group: Group) -> None:
        self.compute = {teacher.name: RowShardedCall(group, "compute_teacher_log_prob", "teacher",
                                                     teacher=teacher.name)
                        for teacher in group.spec.teachers}

    def compute_teacher_log_prob(self, name: str, input_ids, attention_mask, position_ids, *,
                                 response_length: int, model_inputs=None) -> torch.Tensor:
        """log pi_teacher [N, R] of sequences [N, P + R] under teacher `name`."""
        return self.compute[name](input_ids, attention_mask, position_ids, response_length=response_length,
                                  model_inputs=model_inputs)


class EngineHandle:
    """The rollout engines of all ranks: each engine generates for a
    consecutive share of the prompts (a prompt's G responses on one engine).
    An engine spans `rollout.tensor_model_parallel_size` consecutive ranks
    (vllm; the native engine is one rank): all of them get the same share,
    and the first one's responses are kept (the others computed the same).

    `own_weights`, chosen at build: the engine holds its own copy of the
    policy (vllm), which `sync_weights` refreshes from the actor rank by rank;
    the native engine samples from the actor's own module, so there is
    nothing to sync."""

    def __init__(self, group: Group, *, own_weights: bool) -> None:
        self.group, self.own_weights = group, own_weights
        self.version = 0
        """The policy version the engines serve: the step whose update made it."""
        rollout = group.spec.cfg.actor_rollout_ref.rollout
        self.ranks_per_engine = rollout.tensor_model_parallel_size if own_weights else 1

    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        tp = self.ranks_per_engine
        shares = contiguous_shares(len(prompts), self.group.world_size // tp)
        parts = self.group.call_all("gen", "generate",
                                    [(prompts.select(shares[r // tp]), params)
                                     for r in range(self.group.world_size)])
        for r, part in enumerate(parts):  # one engine's ranks must agree token for token
            if r % tp and not torch.equal(part.response_ids, parts[r - r % tp].response_ids):
                raise RuntimeError(f"rank {r} of a tensor-parallel vLLM engine generated other "
                                   f"tokens than rank {r - r % tp}: its workers are out of step")
        return Rollouts.concat(parts[::tp], pad_token_id=self.group.spec.pad_token_id)

    def sync_weights(self, version: int) -> dict[str, float]:
        """The actor's current weights, those of policy `version` (the step
        whose update made them), into engines that hold their own copy
        (gathered whole from the shards: a collective on every rank), then
        attested: each engine must serve exactly what was sent, or the run
        stops naming the engine's ranks, the version and the tensor
        (`thinkrl.rollout.attest`). Returns the time the digests took."""
        self.version = version
        if not self.own_weights:
            return {}
        share = AttestShare.of(self.group.spec.cfg.actor_rollout_ref.rollout.attest_stride, version)
        results = self.group.call_all("update_weights", "sync_engine", [(share,)] * self.group.world_size)
        tp = self.ranks_per_engine
        seconds = 0.0
        for first in range(0, len(results), tp):
            sent = results[first][0]  # every rank sent the same whole tensors
            ranks = [ledger for _, served in results[first:first + tp] for ledger in served]
            seconds = max(seconds, sent.seconds + max(r.seconds for r in ranks))
            engine = f"the vLLM engine of rank{'s' if tp > 1 else ''} " + (
                f"{first}-{first + tp - 1}" if tp > 1 else f"{first}")
            check_served(sent, served_by_engine(ranks, sent), engine=engine, version=version)
        return {"timing_s/weight_attest": seconds}

    def generator_state(self) -> list[torch.Tensor]:
        return self.group.call_all("save_checkpoint", "generator_state")

    def set_generator_state(self, state: list[torch.Tensor] | torch.Tensor) -> None:
        """Per-rank states of a run with the same rank count; otherwise (a
        resume on another device count, or a checkpoint of an older release
        holding one state) the first engine takes the first state and the
        others keep their seeds. The ranks of one tensor-parallel engine always
        get one state (its first rank's): they must draw the same seeds."""
        if isinstance(state, dict):  # an async run's checkpoint: its rollout's generator
            state = state["generator"]  # (the batches it had queued are not trained on)
        states = state if isinstance(state, list) else [state]
        world, tp = self.group.world_size, self.ranks_per_engine
        if len(states) == world:
            per_rank = [states[r - r % tp] for r in range(world)]
        else:
            per_rank = [states[0] if r < tp else None for r in range(world)]
        self.group.call_all("load_checkpoint", "set_generator_state", [(s,) for s in per_rank])


class CriticHandle:
    """The critic's methods, fanned out as the actor's are (thinkrl.workers.critic).
    Driver-side state: the mini-batch shuffle generator."""

    def __init__(self, group: Group) -> None:
        spec, cfg = group.spec, group.spec.cfg
        self.group = group
        self.update = ShardedUpdate(
            group, critic_update_spec(cfg.critic, spec.sizes.critic,
                                      response_length=spec.sizes.response_length),
            seed=cfg.critic.data_loader_seed, method="update_critic_on")
        self.compute_values = RowShardedCall(group, "compute_values", "values")

    def update_critic(self, batch: CriticBatch) -> dict[str, float]:
        return self.update(batch)

    def save(self, folder: Path) -> None:
        self.group.call_all("save_checkpoint", "save_critic", [(str(folder),)] * self.group.world_size)

    def load(self, folder: Path) -> None:
        self.group.call_all("load_checkpoint", "load_critic", [(str(folder),)] * self.group.world_size)

    def state_dict(self) -> dict:
        return self.update.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.update.load_state_dict(state)
