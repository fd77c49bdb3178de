#!/usr/bin/env bash
# The accelerator check: run once, as one command, when a device is lent
# (bench/device_check.py says what it measures). Prints one JSON line per
# measurement; with $OUT set they are also written to $OUT/device_check.jsonl.
#
#   bash bench/device_check.sh            # on the device: 9 minutes at most
#   bash bench/device_check.sh --dry-run  # the same code on the CPU, tiny shapes
#
# On the H200 of this workplace python3 has torch, transformers, pyarrow, pyyaml
# and peft but not math-verify: carry its wheels in .whl/ (ignored by git):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl \
#     math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
# and, for TRL's step beside thinkrl's, with --python-version 3.12 --no-deps likewise:
#     trl==1.16.0 datasets==5.2.0 dill multiprocess
# and call the device tool's run with carry=[".whl"], timeout_s=540:
#   bash bench/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/thinkrl-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/thinkrl-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
[ -n "${OUT:-}" ] && mkdir -p "$OUT" && : > "$OUT/device_check.jsonl"
exec "$PYTHON" bench/device_check.py "$@"
