"""The stages of a training step, each taking only the roles, records and
settings it uses (never the config): `sampling` (generate and score, with
ReMax's baselines and DAPO's dynamic sampling as strategies chosen at
build), `logprobs`, `critic`, `advantages`, `update`.
`thinkrl.trainer` calls them in the order of the algorithm.
"""
