#!/usr/bin/env bash
# The GPU figures docs/benchmarks.md's "On a GPU" holds, measured on a GPU machine with no network
# and no Hydra (../shared/device/README.md), in parts that each fit one 10-minute command:
#
#   bash benchmarks/gpu_table.sh tests dtype      # the CUDA suite; compile x dtype
#   bash benchmarks/gpu_table.sh attention batch  # the attention backends; batch size to OOM
#   bash benchmarks/gpu_table.sh nanogpt          # the runner and our GPT against nanoGPT's
#   bash benchmarks/gpu_table.sh protocol         # the default-point gap; diagnostics' cost
#
# The first loan runs benchmarks/gpu_check.sh (one command, every part time-boxed); these are the
# longer figures, one part per command in a later loan. Before, on the machine with the checkout:
#   bash benchmarks/gpu_check.sh --prepare     # the git-ignored .gpu/: wheels, tokenizer files
#   mkdir -p .gpu/nanoGPT; cp NANOGPT_CHECKOUT/{bench.py,model.py,configurator.py} .gpu/nanoGPT/
# and name .gpu among the paths that travel (the device tool's carry=[".gpu"]): ignored, it does
# not travel otherwise.
#
# Each part writes OUT/PART.md: for a sweep the documented columns of its table (the whole table is
# its summary.csv), else what it printed; all sweep dirs and logs go into OUT/sweeps.tar.gz. OUT is $OUT (the device tool's) or ./gpu_out.
# A part that fails is said in its PART.md, the other parts still run, and the exit is non-zero.
# EXTRA appends overrides to every sweep: `EXTRA="bench.device=cpu model=nano"` with the
# `dtype` part on a CPU checks this script's plumbing, not a GPU.
set -uo pipefail
OUT=${OUT:-gpu_out}
WORK=${WORK:-/tmp/gpu_table}
mkdir -p "$OUT" "$WORK"
if [ -d .gpu ] && ! python3 -c "import hydra" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target "$WORK/site" .gpu/*.whl
  export PYTHONPATH="$WORK/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" WANDB_MODE=${WANDB_MODE:-disabled}
read -r -a extra <<<"${EXTRA:-}"

# The documented columns of a sweep's summary.csv, as markdown (read_summary: the file's
# part.field names back as the table's flat ones, whichever version wrote it).
COLUMNS='
import sys
from nanogpt.analysis.labels import point_labels
from nanogpt.analysis.display import to_markdown
from nanogpt.analysis.tidy import read_summary
t = read_summary(sys.argv[1])
t["point"] = point_labels(t)
if "peak_memory_bytes" in t:  # what the point needs (a headline column; no NaN-only column)
    t["peak_GiB"] = t["peak_memory_bytes"] / 2**30
cols = ["point", "model", "batch_size", "status", "step_ms_median", "tokens_per_s", "mfu", "peak_GiB",
        "j_per_token", "speedup", "error"]
print(to_markdown(t[[c for c in cols if c in t]]))
'

sweep() {  # NAME OVERRIDES...: one multirun; its table is NAME.md
  local name=$1
  shift
  python3 -m nanogpt.run -m logger=none "hydra.sweep.dir=$WORK/$name" "$@" "${extra[@]}" \
    >"$WORK/$name.log" 2>&1
  local rc=$?
  { [ -f "$WORK/$name/summary.csv" ] && python3 -c "$COLUMNS" "$WORK/$name/summary.csv"
    tail -n 5 "$WORK/$name.log"; } >"$OUT/$name.md"
  return $rc
}

part() {
  case $1 in
    tests)
      python3 -m pytest -m cuda -q -p no:cacheprovider >"$WORK/tests.log" 2>&1
      local rc=$?
      tail -n 40 "$WORK/tests.log" >"$OUT/tests.md"
      return $rc ;;
    dtype) sweep dtype +sweep=compile_dtype ;;
    attention) sweep attention +sweep=attention ;;
    batch) sweep batch +sweep=batch_scaling perf.dtype=bf16 ;;
    nanogpt)
      { python3 benchmarks/vs_nanogpt.py --nanogpt .gpu/nanoGPT --rounds "${ROUNDS:-3}" bench &&
        python3 benchmarks/vs_nanogpt.py --nanogpt .gpu/nanoGPT --rounds "${ROUNDS:-3}" model; } \
        >"$WORK/nanogpt.log" 2>&1
      local rc=$?
      grep -E "^round|^tokens/s|Error|error" "$WORK/nanogpt.log" >"$OUT/nanogpt.md"
      return $rc ;;
    protocol)
      { python3 benchmarks/default_gap.py --rounds "${ROUNDS:-2}" perf.dtype=bf16 perf.compile=true &&
        python3 benchmarks/instrumentation_cost.py --rounds "${ROUNDS:-2}" perf.dtype=bf16; } \
        >"$WORK/protocol.log" 2>&1
      local rc=$?
      grep -vE "^\s*$" "$WORK/protocol.log" | tail -n 30 >"$OUT/protocol.md"
      return $rc ;;
    *) echo "unknown part $1: tests, dtype, attention, batch, nanogpt or protocol" >&2; return 2 ;;
  esac
}

failed=0
for name in "$@"; do
  start=$SECONDS
  if part "$name"; then status=ok; else status=FAILED; failed=1; fi
  echo "$name: $status in $((SECONDS - start)) s" | tee -a "$OUT/$name.md"
done
tar -czf "$OUT/sweeps.tar.gz" -C "$WORK" --exclude=site .
exit $failed
