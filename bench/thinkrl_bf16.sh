#!/usr/bin/env bash
# TK_PY for ../shared/bench/side_by_side.sh: thinkrl's bench/grpo_step.py with bfloat16
# autocast (actor_rollout_ref.model.dtype=bfloat16: opt-in, master weights float32);
# every other call (the matmul probe, the JSON wrapper) runs as is. PY: the Python to use.
#   TK_PY=bench/thinkrl_bf16.sh TRL_PY=... THINKRL=. WORK=... bash ../shared/bench/side_by_side.sh
PY=${PY:-.venv/bin/python}
if [[ "${1:-}" == *grpo_step.py ]]; then
  exec "$PY" "$@" actor_rollout_ref.model.dtype=bfloat16
fi
exec "$PY" "$@"
