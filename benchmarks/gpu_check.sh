#!/usr/bin/env bash
# The first thing a GPU loan runs: one command, within 9 minutes on an H100, that checks what a
# CPU cannot, in priority order, each part in its own time box so that a slow or hung part
# cannot starve the rest, writing what it found as it goes.
#
# A loan is short (about 15 minutes of device time, the machine's start included; 10 minutes a
# command) and the GPU machine has no network, no ../shared, and neither Hydra, optuna, wandb,
# torchao nor submitit (../shared/device/README.md). So, here, in the checkout, before the loan:
#
#   bash benchmarks/gpu_check.sh --prepare   # fills the git-ignored .gpu/ from ../shared
#
# and then, with the device tool, from the checkout's root (an ignored folder reaches the GPU
# machine only when it is named among the paths that travel with the working tree):
#
#   run(command="bash benchmarks/gpu_check.sh", carry=[".gpu"], timeout_s=600)
#
# first, before any other work on that machine (docs/benchmarks.md, "Checking on a GPU").
# What comes back under $OUT (the device tool's output folder; ./gpu_out elsewhere), rewritten
# after every part, so a loan cut short still returns what ran:
#   summary.md       each part: ok / FAILED / TIMED OUT, its seconds, its table or last lines
#   records.tar.gz   every sweep dir (result.json, steps.csv, summary.csv, run.log) and log
#
#   bash benchmarks/gpu_check.sh --dry-run   # the parts, their time boxes and the total; exit 0
#
# On a machine where torch sees no CUDA device it says so in one line and exits 1. The exit is
# non-zero when any part failed or ran out of its box. PYTHON picks the interpreter (python3).
set -uo pipefail

PY=${PYTHON:-python3}
OUT=${OUT:-gpu_out}
WORK=${WORK:-/tmp/gpu_check}
SHARED=${SHARED:-../shared}
LIMIT_S=540  # 9 minutes: a loan's 15 less the machine's start and a rerun's margin
SETUP_S=10   # the CUDA check, the wheels installed, what imports noted
AFTER_S=4    # each part: timeout's grace before SIGKILL (3 s), its summary and the archive

# The parts, most wanted first, and their boxes in seconds, from what an H100 measured
# (../shared/device/h100-2026-11-23.md): the CUDA suite 65 s (29 tests), the README sweep 81 s
# under the old protocol (4 points; the steady-state window now adds about 3 + 5 s a point), a
# cold compile of GPT-2 124M about 26 s a process, a process's start (torch, CUDA) about 5 s.
# The first loan (an H200, 2026-11-26, docs/benchmarks.md) ran the 40 CUDA tests past 85 s (38
# done), the README sweep in 88 s, the parallel part in 37, the search in 48, fp8's and the
# chunked loss's first points in 38 and 39, and default_gap.py past 95 s: the boxes follow, and
# default_gap, the least needed, goes last with what is left.
PARTS=(cuda_tests readme_sweep parallel search fp8 chunked_loss default_gap)
declare -A BOX=(
  [cuda_tests]=130 [readme_sweep]=100 [parallel]=40 [search]=50 [fp8]=45 [chunked_loss]=45
  [default_gap]=90
)
declare -A WHAT=(
  [cuda_tests]="pytest -m cuda, each test at most 60 s (pytest-timeout)"
  [readme_sweep]="the README sweep: perf.compile=true,false perf.dtype=bf16,fp16 (4 points)"
  [parallel]="hydra/launcher=parallel on a bf16 sweep (2 eager points, short windows)"
  [search]="hydra/sweeper=tune, 2 candidates (bf16, fp16 eager), each finalist once"
  [default_gap]="benchmarks/default_gap.py, one round (compiled bf16, 4 points, short windows)"
  [fp8]="+sweep=fp8's first point (n_embd 768, fp8 none; short window, no diagnosis)"
  [chunked_loss]="+sweep=chunked_loss's first point (loss full, batch 8; the same)"
)
total_s() {
  local total=$SETUP_S part
  for part in "${PARTS[@]}"; do total=$((total + BOX[$part] + AFTER_S)); done
  echo "$total"
}

dry_run() {
  printf '%-13s %6s  %s\n' part box what
  printf '%-13s %4s s  %s\n' setup "$SETUP_S" "the CUDA check, .gpu/'s wheels installed, imports noted"
  local part total
  for part in "${PARTS[@]}"; do
    printf '%-13s %4s s  %s\n' "$part" "${BOX[$part]}" "${WHAT[$part]}"
  done
  total=$(total_s)
  echo "each part: +$AFTER_S s (timeout's grace before SIGKILL, its summary, the archive)"
  echo "total: $total s ($((total / 60)) min $((total % 60)) s; the limit is $LIMIT_S s)"
  [ "$total" -le "$LIMIT_S" ]
}

prepare() {  # here, beside ../shared: what the GPU machine lacks, into the ignored .gpu/
  local wheels=$SHARED/device/wheels
  if [ ! -d "$wheels" ]; then
    echo "gpu_check --prepare: no $wheels; set SHARED to the folder holding device/wheels" >&2
    return 1
  fi
  mkdir -p .gpu/tiktoken_cache
  cp -f "$wheels"/*.whl .gpu/
  cp -f "$SHARED"/tiktoken_cache/* .gpu/tiktoken_cache/ 2>/dev/null
  chmod -R u+w .gpu  # ../shared's files are read-only: a second --prepare overwrites them
  # pyarrow writes summary.parquet; the GPU image's package list does not name it (without it
  # a sweep keeps its records and summary.csv, but its end-of-sweep table stops). 18.1 (numpy 1
  # and 2; 40 MB, where 26's wheel is 55 MB of the 64 MiB that may travel): installed there
  # only if the image lacks pyarrow.
  if ! ls .gpu/pyarrow-*.whl >/dev/null 2>&1; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 -d .gpu pyarrow==18.1.0 ||
      echo "gpu_check --prepare: no pyarrow wheel (no network?): tables need the image's own" >&2
  fi
  { git rev-parse HEAD 2>/dev/null || echo unknown
    echo "$(git status --short 2>/dev/null | wc -l) paths changed since" ; } >.gpu/commit.txt
  echo "gpu_check --prepare: $(du -sh .gpu | cut -f1) in .gpu/ ($(ls .gpu/*.whl | wc -l) wheels)"
}

SHORT=(bench.warmup_s=1 bench.measure_s=2)  # for parts that check a path, not a figure

run_part() {  # PART: run by this script itself (--part), under `timeout`, in the set-up env
  case $1 in
    cuda_tests)
      read -r -a limit <<<"${GPU_CHECK_TEST_TIMEOUT:-}"
      exec "$PY" -m pytest -m cuda -q -rfEs -p no:cacheprovider "${limit[@]}" --durations=10 ;;
    readme_sweep) sweep readme_sweep perf.compile=true,false perf.dtype=bf16,fp16 ;;
    parallel)
      sweep parallel hydra/launcher=parallel perf.dtype=bf16 perf.compile=false \
        perf.batch_size=8,12 "${SHORT[@]}" ;;
    search)
      sweep search hydra/sweeper=tune bench.device=cuda perf.compile=false \
        "perf.dtype=choice(bf16,fp16)" hydra.sweeper.n_trials=2 hydra.sweeper.finalists=2 \
        hydra.sweeper.repeats=1 bench.diagnose=false "${SHORT[@]}" ;;
    default_gap)
      exec "$PY" benchmarks/default_gap.py --rounds 1 perf.dtype=bf16 perf.compile=true \
        bench.diagnose=false "${SHORT[@]}" ;;
    # Each preset's first point: its swept keys at their first values (Hydra's grid order).
    fp8) sweep fp8 +sweep=fp8 model.n_embd=768 perf.fp8=none bench.diagnose=false "${SHORT[@]}" ;;
    chunked_loss)
      sweep chunked_loss +sweep=chunked_loss perf.loss=full perf.batch_size=8 \
        bench.diagnose=false "${SHORT[@]}" ;;
    *) echo "gpu_check: no part $1: ${PARTS[*]}" >&2; return 2 ;;
  esac
}

sweep() {  # NAME OVERRIDES...: one multirun into WORK/NAME
  local name=$1
  shift
  # exec: the sweep is the process `timeout` signals (SIGTERM: the point recorded `interrupted`
  # and the table built), then kills 3 s later; a shell between would die and leave it running.
  exec "$PY" -m nanogpt.run -m logger=none "hydra.sweep.dir=$WORK/$name" "$@"
}

case "${1:-}" in
  --dry-run) dry_run; exit $? ;;
  --prepare) prepare; exit $? ;;
  --part) run_part "$2"; exit $? ;;
  "") ;;
  *) echo "gpu_check: unknown argument $1: none, --dry-run or --prepare" >&2; exit 2 ;;
esac

# One line and exit 1 where torch sees no CUDA device (or there is no torch).
if ! found=$("$PY" - 2>/dev/null <<'EOF'
import sys
try:
    import torch
except ImportError as exc:
    print(f"{sys.executable} cannot import torch ({exc})")
    sys.exit(1)
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} sees no CUDA device")
    sys.exit(1)
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
); then
  echo "gpu_check: no CUDA here (${found:-$PY failed}): run it on a GPU machine (docs/benchmarks.md)" >&2
  exit 1
fi

started=$SECONDS
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK/site"
SUMMARY=$OUT/summary.md

# Which of the named modules do not import here: the wheels' (a wheel's module is its name,
# lowercased; hydra_core's is hydra, antlr4_python3_runtime's antlr4) and what the parts use.
IMPORTS='
import importlib, sys
for name in sys.argv[1:]:
    module = {"hydra_core": "hydra", "antlr4_python3_runtime": "antlr4"}.get(name, name)
    try:
        importlib.import_module(module)
    except Exception:
        print(name)
'
wheels=()
names=()
for whl in .gpu/*.whl; do
  [ -e "$whl" ] || continue
  wheels+=("$whl")
  names+=("$(basename "$whl" | cut -d- -f1 | tr '[:upper:]' '[:lower:]')")
done
lacking=" $("$PY" -c "$IMPORTS" "${names[@]}" | tr '\n' ' ')"
missing=()
for i in "${!wheels[@]}"; do
  [[ $lacking == *" ${names[$i]} "* ]] && missing+=("${wheels[$i]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-index --no-deps --target "$WORK/site" "${missing[@]}" \
    >"$WORK/install.log" 2>&1 || echo "- the wheels' install failed (install.log)" >>"$WORK/setup.txt"
fi
# Unbuffered: a part's log holds what it printed up to the moment its box ran out.
export PYTHONPATH="$WORK/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE=disabled PYTHONUNBUFFERED=1
[ -d .gpu/tiktoken_cache ] && export TIKTOKEN_CACHE_DIR=$PWD/.gpu/tiktoken_cache
optional=(hydra omegaconf optuna pyarrow tiktoken pynvml pytest_timeout wandb torchao submitit)
absent=" $("$PY" -c "$IMPORTS" "${optional[@]}" | tr '\n' ' ')"
GPU_CHECK_TEST_TIMEOUT=""
[[ $absent == *" pytest_timeout "* ]] || GPU_CHECK_TEST_TIMEOUT="--timeout=60"
export PY WORK GPU_CHECK_TEST_TIMEOUT

{
  echo "# gpu_check $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "- device: $(nvidia-smi -L 2>/dev/null | head -n 4 | tr '\n' ' ')"
  echo "- $found"
  echo "- checkout prepared at: $(tr '\n' ' ' <.gpu/commit.txt 2>/dev/null || echo 'unknown (no .gpu/commit.txt)')"
  echo "- installed from .gpu/: ${missing[*]##*/}"
  echo "- not importable after that:${absent}"
  [ -z "$GPU_CHECK_TEST_TIMEOUT" ] && echo "- no pytest-timeout: only the part's box limits a test"
  cat "$WORK/setup.txt" 2>/dev/null
  echo "- setup: $((SECONDS - started)) s"
} >"$SUMMARY"

# The documented columns of a sweep's summary.csv, as markdown (pandas alone: no tabulate there).
COLUMNS='
import sys
import warnings
import pandas as pd
warnings.simplefilter("ignore")  # pandas on a wide frame: noise in the summary
t = pd.read_csv(sys.argv[1])
try:
    from nanogpt.results.labels import point_labels
    t.insert(0, "point", point_labels(t))
except Exception:  # the records matter more than the labels
    t.insert(0, "point", range(len(t)))
for col, name in [("mem_peak_allocated_bytes", "peak_GiB"),
                  ("mem_warmup_peak_allocated_bytes", "warmup_peak_GiB"),
                  ("mem_estimate_bytes", "estimate_GiB")]:
    if col in t:
        t[name] = (t[col] / 2**30).round(2)
cols = ["point", "status", "step_ms_median", "tokens_per_s", "mfu", "peak_GiB",
        "warmup_peak_GiB", "mem_peak_allocated_from", "estimate_GiB", "contended", "bottleneck",
        "wall_s", "error"]
t = t[[c for c in cols if c in t]]
print("| " + " | ".join(t.columns) + " |")
print("|" + "---|" * len(t.columns))
for row in t.itertuples(index=False):
    print("| " + " | ".join("" if pd.isna(v) else f"{v:.4g}" if isinstance(v, float) else str(v)
                            for v in row) + " |")
'

show() {  # NAME: what the summary keeps of a part
  local name=$1
  if [ -f "$WORK/$name/summary.csv" ]; then
    "$PY" -c "$COLUMNS" "$WORK/$name/summary.csv" 2>&1
  fi
  [ -f "$WORK/$name/tune.md" ] && grep -A 8 "^## Ranking" "$WORK/$name/tune.md"
  echo '```'
  grep -vE '^\s*$' "$WORK/$name.log" | tail -n 25
  echo '```'
}

archive() {  # the records so far, replaced whole (a loan cut mid-tar keeps the last one)
  tar -czf "$OUT/records.tar.gz.tmp" -C "$WORK" --exclude=./site . 2>/dev/null &&
    mv "$OUT/records.tar.gz.tmp" "$OUT/records.tar.gz"
}

failed=0
for part in "${PARTS[@]}"; do
  begin=$SECONDS
  timeout -k 3 "${BOX[$part]}" bash "$0" --part "$part" >"$WORK/$part.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status="TIMED OUT (box ${BOX[$part]} s)"; failed=1 ;;
    *) status="FAILED (exit $rc)"; failed=1 ;;
  esac
  { echo
    echo "## $part: $status in $((SECONDS - begin)) s"
    echo "${WHAT[$part]}"
    echo
    show "$part"
    # What a part leaves behind (a timed-out pytest's sweep) would share the GPU with the next
    # part and make it "contended" (it did, on the first loan): say so, and end it.
    left=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>/dev/null)
    [ -n "$left" ] && echo "- still on the GPU after it, killed: $(echo "$left" | tr '\n' ';')"
    true; } >>"$SUMMARY"
  for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
    kill -9 "$pid" 2>/dev/null
  done
  archive
done
echo >>"$SUMMARY"
echo "total: $((SECONDS - started)) s" >>"$SUMMARY"
archive
cat "$SUMMARY"
exit $failed
