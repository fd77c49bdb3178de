"""Environments: the other side of a rollout's conversation.

- `base`: the `Environment` protocol and its `EnvStep`;
- `loop`: the loop that runs every row's conversation around the rollout engine;
- `routing`: which environment each row talks to; the interaction file's entries;
- `classes`, `server`: building an entry's environment, in this process or in
  worker processes on loopback;
- `turn_tokens`: an environment's messages as the chat template's ids;
- `tool_env` (the tool loop), `verl_interaction` (verl's simulated users),
  `textarena` (games): the environments thinkrl ships;
- `setup`: a run's router and loop from its config.
"""
