"""The critic of PPO (algorithm.adv_estimator=gae) on the ray backend: a driver-side
handle to the critic shard every rank holds (`PolicyRank.critic`), fanned out as
`thinkrl.workers.ray_group.ActorHandle` fans out the actor."""

from __future__ import annotations

from pathlib import Path

import torch

from thinkrl.records import CriticBatch
from thinkrl.workers.mini_batches import plan_mini_batches, split_mini_batch
from thinkrl.workers.ray_group import (RayWorkerGroup, _LogProbs, load_update_state, row_shares,
                                      update_state)


class CriticHandle:
    """The critic's methods, fanned out as the actor's are (thinkrl.workers.critic).
    Driver-side state: the mini-batch shuffle generator."""

    def __init__(self, group: RayWorkerGroup) -> None:
        self.group, self.sizes = group, group.spec.sizes.critic
        self.shuffle_generator = torch.Generator().manual_seed(group.spec.cfg.critic.data_loader_seed)
        self.compute_values = _LogProbs(group, "compute_values", "values")

    def update_critic(self, batch: CriticBatch) -> dict[str, float]:
        """As ActorHandle.update_policy: planned here with the whole mini-batch's
        normalisers, each rank trains on its share; rank 0 has the reduced metrics."""
        minis = plan_mini_batches(batch, mini_batch_size=self.sizes.responses_per_mini_batch,
                                  epochs=self.sizes.ppo_epochs, shuffle=self.sizes.shuffle,
                                  generator=self.shuffle_generator,
                                  response_length=self.group.spec.sizes.response_length)
        shares = [split_mini_batch(m, row_shares(self.group, m.batch.attention_mask)) for m in minis]
        per_rank = [([s[r] for s in shares],) for r in range(self.group.world_size)]
        return self.group.call_all("update_critic", "update_critic_on", per_rank)[0]

    def save(self, folder: Path) -> None:
        self.group.call_all("save_checkpoint", "save_critic", [(str(folder),)] * self.group.world_size)

    def load(self, folder: Path) -> None:
        self.group.call_all("load_checkpoint", "load_critic", [(str(folder),)] * self.group.world_size)

    def state_dict(self) -> dict:
        return update_state(self.group, "critic", self.shuffle_generator)

    def load_state_dict(self, state: dict) -> None:
        load_update_state(self.group, "critic", self.shuffle_generator, state)
