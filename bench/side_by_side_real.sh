#!/usr/bin/env bash
# thinkrl beside TRL 1.16's GRPOTrainer on any model folder and verl parquet data,
# paired A B A B: the same GRPO step on both sides (PROMPTS x N completions of exactly
# LEN tokens, EOS ignored so the work is equal; no KL; lr 1e-5; temperature 0.7;
# 32 completions per forward/backward; one optimizer step), float32 unless BF16=1
# (thinkrl's bfloat16 autocast against TrainingArguments.bf16). Read the paired ratio:
# absolute times on a shared 2-core machine swing with foreign load.
#
#   TRLSITE=/tmp/trlsite REPS=2 bash bench/side_by_side_real.sh \
#       builtin:smollm2-135m-instruct builtin:sums/train
#
# TRLSITE: a folder with trl 1.16 and its few extra dependencies (bench/trl_real.py says
# how); TRL runs in this project's venv with it on PYTHONPATH, so both sides use the
# same torch and transformers. Writes JSON lines to $OUT and prints the table.
set -euo pipefail
MODEL=${1:-builtin:smollm2-135m-instruct}
DATA=${2:-builtin:sums/train}
: "${TRLSITE:?set TRLSITE to the folder trl 1.16 is installed in (bench/trl_real.py)}"
PY=${PY:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d)/side_by_side_real.jsonl}
REPS=${REPS:-2} WARMUP=${WARMUP:-1} STEPS=${STEPS:-2}
PROMPTS=${PROMPTS:-8} N=${N:-8} LEN=${LEN:-64} MICRO=${MICRO:-32}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TRL_BF16=() TK_BF16=()
if [[ "${BF16:-0}" == 1 ]]; then
  TRL_BF16=(--bf16) TK_BF16=(actor_rollout_ref.model.dtype=bfloat16)
fi
TK_JSON=$(mktemp)
trap 'rm -f "$TK_JSON"' EXIT
: > "$OUT"  # this run's pairs only
for rep in $(seq 1 "$REPS"); do
  echo "== rep $rep: TRL" >&2
  PYTHONPATH=$TRLSITE "$PY" bench/trl_real.py --model "$MODEL" --data "$DATA" --prompts "$PROMPTS" \
    --n "$N" --max-completion "$LEN" --micro "$MICRO" --ignore-eos --warmup "$WARMUP" --steps "$STEPS" \
    --tag "trl-r$rep" --json-out "$OUT" "${TRL_BF16[@]}" > /dev/null
  echo "== rep $rep: thinkrl" >&2
  "$PY" bench/grpo_step.py --warmup "$WARMUP" --steps "$STEPS" --json "$TK_JSON" \
    "actor_rollout_ref.model.path=$MODEL" "data.train_files=$DATA" "data.val_files=$DATA" \
    data.max_prompt_length=128 "data.max_response_length=$LEN" "data.train_batch_size=$PROMPTS" \
    "actor_rollout_ref.rollout.n=$N" "actor_rollout_ref.actor.ppo_mini_batch_size=$PROMPTS" \
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO" \
    actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.optim.lr=1e-5 \
    actor_rollout_ref.rollout.temperature=0.7 \
    "${TK_BF16[@]}" > /dev/null
  "$PY" - "$TK_JSON" "$OUT" "$rep" <<'EOF'
import json, statistics, sys
path, out, rep = sys.argv[1:]
result = json.load(open(path))["result"]
line = {"bench": "thinkrl_grpo_step", "tag": f"thinkrl-r{rep}",
        "seconds_per_step_median": round(statistics.median(result["step_s"]), 3),
        "step_seconds": [round(s, 3) for s in result["step_s"]],
        "stages_s": {k: round(v, 3) for k, v in result["stages_s"].items()}}
open(out, "a").write(json.dumps(line) + "\n")
EOF
done
"$PY" - "$OUT" <<'EOF'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
trl = [l["seconds_per_step_median"] for l in lines if l["tag"].startswith("trl-")]
tk = [l["seconds_per_step_median"] for l in lines if l["tag"].startswith("thinkrl-")]
ratios = [a / b for a, b in zip(tk, trl)]
print(f"TRL     s/step per rep: {trl}")
print(f"thinkrl s/step per rep: {tk}")
print(f"thinkrl/TRL paired ratio: median {statistics.median(ratios):.3f} (each: "
      + " ".join(f"{r:.3f}" for r in ratios) + ")")
print(f"results: {sys.argv[1]}")
EOF
