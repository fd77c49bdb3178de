"""Asynchronous training's rollout side (`async_training.mode`): a process of
its own holding its own copy of the policy, fed attested weight versions,
generating batches that the trainer takes from a bounded queue.

- `server`: the plain class that generates (tests use it without a process);
- `process`: the process shell around it and the driver's client, every wait
  with a deadline;
- `sampler`: the driver side, the step's generate-and-score stage that keeps
  generation ahead of the trainer within the staleness bound;
- `stream`, `stream_state`, `streaming`: streaming rollout
  (`async_training.streaming`): the engine that decodes with continuous
  batching and emits the first groups to finish, its checkpointed state, and
  the driver's side of it.
"""
