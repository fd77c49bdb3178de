"""Tools for multi-turn rollouts: the calls a model writes, the tools that
answer them (a calculator, a sandboxed Python executor, the user's own
classes from verl's tool file) and running them with deadlines."""
