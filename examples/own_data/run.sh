#!/usr/bin/env bash
# Your own data and reward, a verl-style line with no recipe (verl's defaults
# and these keys): SmolLM2-135M-Instruct learns to sort a few numbers on a
# laptop's CPU. Arguments given to this script are appended (they win), e.g.
#   bash examples/own_data/run.sh trainer.total_training_steps=4
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${DATA:-runs/data/sort_numbers}
python "$here/make_data.py" --out "$data"
thinkrl train \
  data.train_files="$data/train.parquet" data.val_files="$data/test.parquet" \
  data.train_batch_size=8 data.max_prompt_length=128 data.max_response_length=64 \
  actor_rollout_ref.model.path=builtin:smollm2-135m-instruct \
  actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.temperature=0.7 \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.actor.optim.lr=1e-5 actor_rollout_ref.actor.use_kl_loss=False \
  custom_reward_function.path="$here/reward.py" \
  trainer.total_training_steps=12 trainer.test_freq=4 \
  trainer.project_name=examples trainer.experiment_name=sort_numbers \
  "$@"
