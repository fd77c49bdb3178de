#!/usr/bin/env bash
# `thinkrl rehearse` on the two seeds' own launch lines, as their users have
# them: seed 004's verl command (Qwen2.5-VL-7B, 8 NPUs, vLLM TP4, GSM8K) and
# seed 000's MindSpeed-RL file (Qwen2.5-7B, 4 NPUs, vLLM TP4, ORZ data with
# qwen_r1). Each model folder holds only the real config.json and tokenizer
# files (../shared/data); the data is written by `thinkrl prep` from the
# shared files. Prints each rehearsal's report and its wall time.
#   bash bench/rehearse_seeds.sh                       # .venv: the native engine stands in for vLLM
#   THINKRL=.venv-vllm/bin/thinkrl bash bench/rehearse_seeds.sh   # vLLM's CPU build
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SHARED="$(realpath "${SHARED:-$ROOT/../shared}")"
THINKRL="$(realpath "${THINKRL:-$ROOT/.venv/bin/thinkrl}")"
PY="$(dirname "$THINKRL")/python"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/rehearse-seeds-XXXX")"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 HF_HUB_OFFLINE=1

model_folder() {  # $1: shared/data/models folder, $2: destination
  mkdir -p "$2"
  cp "$SHARED/data/models/$1"/* "$SHARED/data/tokenizers/qwen2.5/vocab.json" \
     "$SHARED/data/tokenizers/qwen2.5/merges.txt" "$2"/
  chmod -R u+w "$2"
}

timed() {  # $1: label, then the command
  local label=$1; shift
  local start=$SECONDS
  set +e; "$@"; local code=$?; set -e
  echo "== $label: exit $code in $((SECONDS - start)) s"
}

# seed 004: the verl command line from the seed, only its paths pointed here
mkdir -p "$WORK/s004" && cd "$WORK/s004"
"$THINKRL" prep gsm8k --input "$SHARED/data/gsm8k" --output gsm8k > /dev/null
model_folder qwen2.5-vl-7b-instruct-config Qwen2.5-VL-7B-Instruct
mapfile -t LINE < <("$PY" - "$SHARED" <<'PY'
import re, shlex, sys
from pathlib import Path
text = next(Path(sys.argv[1], "seeds").glob("004_*.txt")).read_text()
line = text.split("python3 -m verl.trainer.main_ppo", 1)[1].split("$@", 1)[0]
line = re.sub(r"\\\s*\n", " ", line).replace("$ENGINE", "vllm")
for arg in shlex.split(line):
    print(arg.replace("/workspace/verl/gsm8k", "gsm8k")
             .replace("/models/Qwen2.5-VL-7B-Instruct", "Qwen2.5-VL-7B-Instruct"))
PY
)
if [[ ${#LINE[@]} -lt 10 ]]; then  # the seed's command was not found: do not rehearse the default recipe
  echo "could not read seed 004's launch line from $SHARED/seeds" >&2; exit 1
fi
timed "seed 004 (verl launch line)" "$THINKRL" rehearse --workdir rehearsal "${LINE[@]}"

# seed 000: the MindSpeed-RL trainer file as is, its data prepared by its dataset config
mkdir -p "$WORK/s000/dataset" && cd "$WORK/s000"
cp -r "$SHARED/seeds/mindspeed_rl" configs
"$PY" - "$SHARED/data/orz/math500.json" > dataset/orz.json <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
print(json.dumps([{"problem": r["prompt"][0]["value"], "answer": r["final_answer"]} for r in rows]))
PY
model_folder qwen2.5-7b-instruct-config data/models/Qwen2.5-7B
"$THINKRL" prep --mindspeed-config configs/datasets/r1_zero_qwen25_7b.yaml --output ./dataset/data > /dev/null
timed "seed 000 (MindSpeed-RL file)" "$THINKRL" rehearse --workdir rehearsal --config configs/grpo_trainer_qwen25_7b.yaml
echo "work folder: $WORK"
