#!/usr/bin/env bash
# The first thing a GPU loan runs: one command that brings back the figures judging the paths a
# CPU cannot run, cold, within 9 minutes, code never run on a GPU first, each part in its own
# time box so that a slow or hung part cannot starve the rest, writing what it found as it goes.
#
# A loan is short (about 15 minutes of device time, the machine's start included; 10 minutes a
# command) and the GPU machine has no network, no ../shared, and neither Hydra, optuna, wandb,
# torchao, transformers nor pyarrow (../shared/device/README.md). So, here, before the loan:
#
#   bash benchmarks/gpu_check.sh --prepare   # fills the git-ignored .gpu/ (wheels, tokens)
#
# and then, with the device tool, from the checkout's root (an ignored folder reaches the GPU
# machine only when it is named among the paths that travel with the working tree):
#
#   run(command="bash benchmarks/gpu_check.sh", carry=[".gpu"], timeout_s=600)
#
# first, before any other work on that machine (docs/benchmarks.md, "Checking on a GPU"); then
# the call summary.md names for the parts that did not fit in 540 s (the README sweep), which
# keeps to the 250 s a loan has left after the first call:
#
#   run(command='GPU_CHECK_PARTS="readme_sweep ..." bash benchmarks/gpu_check.sh', ...)
# What comes back under $OUT (the device tool's output folder; ./gpu_out elsewhere), two files,
# rewritten after every part, so a loan cut short still returns what ran:
#   summary.md       each part: ok / FAILED / TIMED OUT, its seconds, then per point the figures
#                    that judge it (benchmarks/gpu_summary.py) and the part's last lines
#   records.tar.gz   every sweep dir (result.json, steps.csv, summary.csv, run.log) and log
#
#   bash benchmarks/gpu_check.sh --dry-run        # each part's box, its arithmetic, the total
#   bash benchmarks/gpu_check.sh --summary DIR    # the per-point figures of any sweep dir
#   bash benchmarks/gpu_check.sh --overrides PART # a sweep part's overrides, one a line
#
# On a machine where torch sees no CUDA device it says so in one line and exits 1. The exit is
# non-zero when any part failed or ran out of its box. PYTHON picks the interpreter (python3).
set -uo pipefail

PY=${PYTHON:-python3}
OUT=${OUT:-gpu_out}
WORK=${WORK:-/tmp/gpu_check}
SHARED=${SHARED:-../shared}
LIMIT_S=540    # 9 minutes: a loan's 15 less the machine's start and a rerun's margin
NEXT_LIMIT_S=250  # a second call (GPU_CHECK_PARTS): what a loan of 900 s has left after the
#                   machine's start (1-3 min) and a first call (about 406-540 s)
AFTER_S=4      # each part: timeout's grace before SIGKILL (3 s), its summary and the archive
CARRY_MIB=64   # what may travel with the working tree (the device tool's carry), in all

# --- What a box is made of, in seconds, from what a GPU measured, with no compile cache ------
# An H100 (../shared/device/h100-2026-11-23.md) and the first loan's H200 (docs/benchmarks.md):
START=5        # a process's start: Python, torch, the CUDA context
SWEEP=6        # a multirun's own: Hydra composes and checks every point; the table at its end
BUILD=2        # a point's model built, its FLOPs counted on meta, its memory estimated
WINDOW=3       # SHORT below: bench.warmup_s=1 + bench.measure_s=2 (the windows are timed)
DIAG=2         # the diagnosis after the window: the profiler's start (about 1 s), a warmup and
#                one recorded step, then the step whose host syncs are counted (probes/observe.py)
POINT=$((START + BUILD + WINDOW + DIAG))  # an eager point in its own process, short windows
COLD=26        # a cold Inductor compile of GPT-2 124M, forward and backward, one process
COLD_SMALL=12  # the same for a 4-layer model (compile time grows with the layers it unrolls)
GRAPHS=3       # reduce-overhead: CUDA graphs recorded in warmup (3 steps, bench.warmup_steps)
FP8_SWAP=6     # torchao imported, the Linears swapped for Float8Linear (the H200 ran the part in
#                its whole 43 s box with 3 here, 2026-11-28)
TF_IMPORT=6    # transformers imported (the sweep's process and the point's)
MUON_POINT=21  # a Muon point (GPT-2, eager): the H200 ran its bf16 point in about 17 s and the fp16
#                one was still in its diagnosis at 21 s (2026-11-28): Newton-Schulz a step, two
#                optimizers built, the diagnosis's profiler over both
TTL_MAX_S=10   # a time-to-loss run's bench.max_s: it stops there if the target is not reached
PYTEST=10      # pytest's start and the collection of the suite
TEST_S=2       # a CUDA test other than the two below: the 2026-11-28 H200, cold, reached the
#                16th test 141 s after its box began: pytest's start, the float8 and chunked-loss
#                tests (46 s and the 60 s pytest gave it) and 13 others in about 25 s (1.9 s
#                each; the 2026-11-26 H200, warm, ran 38 in 75 s). The cuda_tests part prints
#                every test's seconds (--durations=0): the next box is reckoned from them.
# The slow CUDA tests, by name, cold on the 2026-11-28 H200:
FLOAT8_TEST=46    # test_a_float8_point_records_its_layers_and_the_bf16_peak: torchao, a compile
CHUNKED_TEST=67   # test_the_chunked_loss_saves_what_the_estimate_predicts_compiled_or_not: 4
#                   points in their own processes, 2 compiled (then at 12 layers; 2 now)
N_TESTS=40     # tests marked cuda (pytest -m cuda --collect-only -q, 2026-12-07), the two above
#                included
WHEELS_S=8     # the wheels the image lacks installed into a folder on PYTHONPATH
IMPORTS_S=5    # one check of what imports (torch, torchao, transformers, Hydra, optuna ...)
MARGIN_PCT=30  # every box is its arithmetic plus at least this much

# A path checked, not a speed: short windows; the diagnosis stays (host syncs are counted in it)
SHORT=(bench.warmup_s=1 bench.measure_s=2 bench.diagnose_steps=1)

# The parts, most at risk first: code no GPU has run (the GPU slot's fork server, the CUDA tests
# past the 16th, the memory fit's depths), then what changed since its last ok loan, then what
# did not (LAST_OK, below: those go last), default_gap (a figure, not a path) at the very end.
# ARITH is each box's arithmetic, names from above; BOX = ARITH x (1 + MARGIN_PCT %), rounded up.
PARTS=(setup muon cuda_tests reduce_overhead memory_fit readme_sweep chunked_loss user_model
  transformers fp8 time_to_loss search default_gap)
declare -A ARITH=(
  [setup]="START + WHEELS_S + 2*IMPORTS_S"
  [muon]="SWEEP + 2*MUON_POINT"
  [cuda_tests]="PYTEST + (N_TESTS - 2)*TEST_S + FLOAT8_TEST + CHUNKED_TEST"
  [reduce_overhead]="SWEEP + 2*POINT + 2*COLD_SMALL + GRAPHS"
  [memory_fit]="SWEEP + 2*(START + BUILD + WINDOW) + COLD_SMALL + COLD"
  [readme_sweep]="SWEEP + 4*(START + BUILD + 8 + 2) + 2*COLD"
  [chunked_loss]="SWEEP + 2*POINT + COLD"
  [user_model]="SWEEP + 2*POINT + COLD_SMALL"
  [transformers]="SWEEP + TF_IMPORT + POINT + COLD_SMALL"
  [fp8]="SWEEP + POINT + COLD_SMALL + FP8_SWAP"
  [time_to_loss]="SWEEP + 2*(START + BUILD + TTL_MAX_S)"
  [search]="SWEEP + 4*POINT"
  [default_gap]="START + 4*POINT + COLD + 3*COLD_SMALL"
)
declare -A WHAT=(
  [setup]="the CUDA check, .gpu/'s wheels the image lacks installed, what imports noted"
  [muon]="optimizer=muon, bf16 and fp16 (GradScaler), eager GPT-2, on hydra/launcher=parallel: the GPU slot's own fork server"
  [cuda_tests]="pytest -m cuda -v, each test at most 60 s (the chunked-loss test 120 s), every test's seconds (--durations=0), its temp dir in the records"
  [reduce_overhead]="GPT-2 width, 4 layers, compiled: perf.compile_mode=reduce-overhead (the CUDA-graph peak and pool) and its default-mode twin"
  [memory_fit]="compiled full-loss GPT-2 at 2 and 12 layers (4: reduce_overhead's twin), then benchmarks/memory_refit.py on them"
  [readme_sweep]="the README sweep: perf.compile=true,false perf.dtype=bf16,fp16 (4 points)"
  [chunked_loss]="perf.loss=chunked, GPT-2, batch 8, eager and compiled"
  [user_model]="benchmarks/modern_gpt.py as model.build (RoPE, GQA), eager and compiled, bf16"
  [transformers]="a transformers Llama (AutoModelForCausalLM.from_config), 2 layers, compiled"
  [fp8]="perf.fp8=tensorwise (torchao), GPT-2 width, 4 layers, compiled"
  [time_to_loss]="bench.target_loss on .gpu/ttl's token file, one point, bench.repeats=2"
  [search]="hydra/sweeper=tune, 2 candidates (bf16, fp16 eager), each finalist once"
  [default_gap]="benchmarks/default_gap.py, one round (compiled bf16, 4 points, short windows)"
)
# The loan that last ran a part ok, and the files its GPU path runs beyond every part's (the
# trainer, the loop, the probes: the parts before it run those): a part whose files hold the same
# code as then (benchmarks/code_changed.py: the syntax tree, docstrings and comments aside) goes
# last. Without one (cuda_tests past the 16th test, memory_fit, default_gap) it never ran ok.
declare -A LAST_OK=(
  [muon]=19e7a7f [reduce_overhead]=19e7a7f [chunked_loss]=19e7a7f [user_model]=19e7a7f
  [transformers]=19e7a7f [fp8]=19e7a7f [time_to_loss]=19e7a7f [search]=19e7a7f
  [readme_sweep]=3d39f7c
)
declare -A FILES=(
  [muon]="nanogpt/train/optim.py nanogpt/frontend/launchers/parallel.py nanogpt/runner/forkserver.py nanogpt/hardware/slots.py"
  [reduce_overhead]="nanogpt/probes/memory.py nanogpt/train/trainer.py"
  [chunked_loss]="nanogpt/train/chunked_loss.py"
  [user_model]="nanogpt/train/user_model.py nanogpt/train/user_model_meta.py benchmarks/modern_gpt.py"
  [transformers]="nanogpt/train/user_model.py nanogpt/train/user_model_meta.py"
  [fp8]="nanogpt/train/float8.py"
  [time_to_loss]="nanogpt/scenarios/time_to_loss/run.py"
  [search]="nanogpt/tune/fit.py nanogpt/frontend/tune_sweeper.py"
  [readme_sweep]="nanogpt/train/gpt.py nanogpt/train/trainer.py nanogpt/scenarios/loop.py"
)
UNCHANGED_FILE=.gpu/unchanged.txt  # --prepare's answer, for a machine without the repository

unchanged_parts() {  # the parts whose files hold their last ok loan's code, one a line
  local commit part file paths changed same
  if git rev-parse --git-dir >/dev/null 2>&1; then
    for commit in $(printf '%s\n' "${LAST_OK[@]}" | sort -u); do  # one comparison a commit
      paths=()
      for part in "${!LAST_OK[@]}"; do
        # shellcheck disable=SC2206  # FILES holds paths, split on purpose
        [ "${LAST_OK[$part]}" = "$commit" ] && paths+=(${FILES[$part]})
      done
      changed=" $("$PY" benchmarks/code_changed.py "$commit" "${paths[@]}" 2>/dev/null | tr '\n' ' ')" ||
        continue  # git cannot read that commit: every part of it counts as changed
      for part in "${!LAST_OK[@]}"; do
        [ "${LAST_OK[$part]}" = "$commit" ] || continue
        same=1
        for file in ${FILES[$part]}; do [[ $changed == *" $file "* ]] && same=0; done
        [ $same = 1 ] && echo "$part"
      done
    done
  elif [ -f "$UNCHANGED_FILE" ]; then
    cat "$UNCHANGED_FILE"
  fi
}
UNCHANGED=" "
case "${1:-}" in  # a part run, its overrides or a summary need no order
  --part | --overrides | --summary) ;;
  *) UNCHANGED=" $(unchanged_parts | sort | tr '\n' ' ')" ;;
esac

# PARTS in order, the unchanged ones moved last (default_gap stays the very last)
ordered=(setup)
for part in "${PARTS[@]:1}"; do
  [[ $UNCHANGED != *" $part "* && $part != default_gap ]] && ordered+=("$part")
done
for part in "${PARTS[@]:1}"; do [[ $UNCHANGED == *" $part "* ]] && ordered+=("$part"); done
PARTS=("${ordered[@]}" default_gap)

# GPU_CHECK_PARTS="readme_sweep ..." runs those parts only (setup always runs first), in PARTS's
# order, within NEXT_LIMIT_S (a loan's second call; GPU_CHECK_LIMIT_S sets another limit).
if [ -n "${GPU_CHECK_PARTS:-}" ]; then
  for part in $GPU_CHECK_PARTS; do
    [[ -n ${ARITH[$part]:-} ]] || { echo "gpu_check: GPU_CHECK_PARTS: no part $part: ${PARTS[*]}" >&2; exit 2; }
  done
  keep=(setup)
  for part in "${PARTS[@]:1}"; do [[ " $GPU_CHECK_PARTS " == *" $part "* ]] && keep+=("$part"); done
  PARTS=("${keep[@]}")
  LIMIT_S=$NEXT_LIMIT_S
fi
LIMIT_S=${GPU_CHECK_LIMIT_S:-$LIMIT_S}

declare -A BOX EST
for part in "${PARTS[@]}"; do
  EST[$part]=$((ARITH[$part]))
  BOX[$part]=$(((EST[$part] * (100 + MARGIN_PCT) + 99) / 100))
done
# What runs: each part in order while it fits what is left of LIMIT_S (each part after setup
# adds AFTER_S); one that does not is dropped, named with the call that runs it, and a smaller
# one after it may still fit.
RUN=(setup)
DROPPED=()
used=${BOX[setup]}
for part in "${PARTS[@]:1}"; do
  if [ $((used + AFTER_S + BOX[$part])) -le "$LIMIT_S" ]; then
    RUN+=("$part")
    used=$((used + AFTER_S + BOX[$part]))
  else
    DROPPED+=("$part")
  fi
done
total_s() { echo "$used"; }
NEXT="next call"  # where the dropped parts go: a first call's, the loan's second call
[ -n "${GPU_CHECK_PARTS:-}" ] && NEXT="a later loan"

dry_run() {
  local part values total
  echo "constants (s): START=$START SWEEP=$SWEEP BUILD=$BUILD WINDOW=$WINDOW DIAG=$DIAG POINT=$POINT" \
    "COLD=$COLD COLD_SMALL=$COLD_SMALL GRAPHS=$GRAPHS FP8_SWAP=$FP8_SWAP TF_IMPORT=$TF_IMPORT" \
    "MUON_POINT=$MUON_POINT TTL_MAX_S=$TTL_MAX_S PYTEST=$PYTEST TEST_S=$TEST_S N_TESTS=$N_TESTS" \
    "FLOAT8_TEST=$FLOAT8_TEST CHUNKED_TEST=$CHUNKED_TEST WHEELS_S=$WHEELS_S IMPORTS_S=$IMPORTS_S"
  printf '%-16s %6s  %s\n' part box "arithmetic; what"
  for part in "${RUN[@]}"; do
    printf '%-16s %4s s  %s = %s s, +%s %% = %s s; %s\n' "$part" "${BOX[$part]}" \
      "${ARITH[$part]}" "${EST[$part]}" "$MARGIN_PCT" "${BOX[$part]}" "${WHAT[$part]}"
  done
  for part in "${DROPPED[@]}"; do
    echo "dropped: $part (${BOX[$part]} s = ${ARITH[$part]} +$MARGIN_PCT %): past $LIMIT_S s"
  done
  for part in "${RUN[@]:1}" "${DROPPED[@]}"; do
    if [[ $UNCHANGED == *" $part "* ]]; then
      echo "unchanged: $part (its code as at ${LAST_OK[$part]}, its last ok loan: last)"
    fi
  done
  [ ${#DROPPED[@]} -gt 0 ] && echo "$NEXT: GPU_CHECK_PARTS=\"${DROPPED[*]}\" bash benchmarks/gpu_check.sh"
  total=$(total_s)
  echo "each part after setup: +$AFTER_S s (timeout's grace before SIGKILL, its summary, the archive)"
  echo "total: $total s ($((total / 60)) min $((total % 60)) s; the limit is $LIMIT_S s)"
  [ "$total" -le "$LIMIT_S" ]
}

# --- --prepare: here, beside ../shared, what the GPU machine lacks, into the ignored .gpu/ ---
# Wheels for the image's Python 3.12 and torch 2.11, no dependencies pulled (the image has
# numpy, requests, idna, filelock, fsspec, pyyaml, tqdm, packaging): torchao 0.18 needs torch
# >= 2.11 (its __init__ loads its kernels from 2.11 on); transformers 5.24 (the version the CPU
# tests run; torch >= 2.6), with what its import needs beyond the image: huggingface_hub 2.4,
# tokenizers, safetensors, and the hub's httpx2 with httpcore2, anyio, h11, sniffio and
# truststore (found by importing it and training a Llama step with the image's packages alone).
# pyarrow (40-55 MB) stays home: a sweep without it writes no parquet and says so.
WHEELS=(torchao==0.18.0 transformers==5.24.0 huggingface_hub==2.4.0 tokenizers==0.23.3
  safetensors==0.8.0 httpx2==2.16.2 httpcore2==2.16.2 anyio==4.16.0 h11==0.16.0 sniffio==1.3.1
  truststore==0.10.5)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64)

prepare() {
  local wheels=$SHARED/device/wheels
  if [ ! -d "$wheels" ]; then
    echo "gpu_check --prepare: no $wheels; set SHARED to the folder holding device/wheels" >&2
    return 1
  fi
  mkdir -p .gpu/tiktoken_cache .gpu/ttl
  rm -f .gpu/*.whl  # an earlier --prepare's (pyarrow, another version): what WHEELS says now
  cp -f "$wheels"/*.whl .gpu/
  cp -f "$SHARED"/tiktoken_cache/* .gpu/tiktoken_cache/ 2>/dev/null
  chmod -R u+w .gpu  # ../shared's files are read-only: a second --prepare overwrites them
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d .gpu "${WHEELS[@]}" 2> >(grep -v '^WARNING' >&2); then
    echo "gpu_check --prepare: pip download ${WHEELS[*]} failed (no network?)" >&2
    return 1
  fi
  # The time-to-loss part's tokens, generated (no data set travels): a first-order Markov
  # chain over 64 ids where each id is followed by one of 2, so a model that learns the
  # pairs reaches ln 2 = 0.69 from ln 64 = 4.16; the part's target is 1.5. nanoGPT's format:
  # uint16 ids, train.bin and val.bin beside it.
  "$PY" - .gpu/ttl <<'EOF' || return 1
import sys
import numpy as np

rng = np.random.default_rng(0)
successors = rng.integers(0, 64, size=(64, 2))
for name, n in (("train.bin", 400_000), ("val.bin", 40_000)):
    ids = np.empty(n, dtype=np.uint16)
    ids[0] = 0
    picks = rng.integers(0, 2, size=n)
    for i in range(1, n):
        ids[i] = successors[ids[i - 1], picks[i]]
    ids.tofile(f"{sys.argv[1]}/{name}")
EOF
  { git rev-parse HEAD 2>/dev/null || echo unknown
    echo "$(git status --short 2>/dev/null | wc -l) paths changed since"; } >.gpu/commit.txt
  # the GPU machine has no repository: which parts are unchanged since their ok loan, said here
  echo "$UNCHANGED" | tr ' ' '\n' | grep -v '^$' >"$UNCHANGED_FILE"
  local total
  # each wheel, the tokens and the tokenizer's files with their sizes, then the total
  du -ab .gpu/*.whl .gpu/ttl .gpu/tiktoken_cache | grep -v '/ttl/\|/tiktoken_cache/' |
    awk '{printf "%8.2f MiB  %s\n", $1 / 1048576, substr($2, 6)}'
  total=$(du -sb .gpu | cut -f1)
  echo "gpu_check --prepare: $(awk "BEGIN {printf \"%.1f\", $total / 1048576}") MiB in .gpu/" \
    "($(ls .gpu/*.whl | wc -l) wheels); what may travel: $CARRY_MIB MiB"
  if [ "$total" -gt $((CARRY_MIB * 1048576)) ]; then
    echo "gpu_check --prepare: .gpu/ is past $CARRY_MIB MiB: it cannot travel; drop a wheel from WHEELS" >&2
    return 1
  fi
}

summarize() {  # DIR: the per-point figures of a sweep dir (benchmarks/gpu_summary.py)
  if [ ! -d "${1:-}" ]; then
    echo "gpu_check --summary: no dir ${1:-(none given)}: --summary SWEEP_DIR" >&2
    return 2
  fi
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" benchmarks/gpu_summary.py "$1"
}

# --- the parts -------------------------------------------------------------------------------
GPT2_4=(model=gpt2 model.n_layer=4)  # GPT-2's width, 4 layers: a compile in COLD_SMALL
LLAMA=(  # docs/models.md's keys, sized for a GPU; 2 layers: Dynamo traces transformers' code
#          slower than the GPT's, so its compile stays within COLD_SMALL
  model.build._target_=transformers.AutoModelForCausalLM.from_config
  model.build.config._target_=transformers.LlamaConfig
  "model.build.config.vocab_size=\${model.vocab_size}"
  "model.build.config.max_position_embeddings=\${model.block_size}"
  model.build.config.hidden_size=512 model.build.config.intermediate_size=1376
  model.build.config.num_hidden_layers=2 model.build.config.num_attention_heads=8
  model.build.config.num_key_value_heads=2 model.vocab_size=32000 model.block_size=512
)
MODERN=(  # benchmarks/modern_gpt.py, as a user sweeps it (benchmarks/byo_overhead.py)
  model.build._target_=modern_gpt.GPT model.build.config._target_=modern_gpt.Config
  model.build.config.vocab_size=32768 model.build.config.block_size=512
  model.build.config.n_layer=4 model.build.config.n_head=8 model.build.config.n_kv_head=2
  model.build.config.n_embd=512 model.vocab_size=32768 model.block_size=512
)

run_part() {  # PART: run by this script itself (--part), under `timeout`, in the set-up env
  case $1 in
    muon)
      sweep muon optimizer=muon perf.dtype=bf16,fp16 perf.compile=false \
        hydra/launcher=parallel "${SHORT[@]}" ;;
    user_model)
      sweep user_model "${MODERN[@]}" "model.code_dir=$PWD/benchmarks" perf.dtype=bf16 \
        perf.compile=false,true "${SHORT[@]}" ;;
    transformers)
      sweep transformers "${LLAMA[@]}" perf.dtype=bf16 perf.compile=true "${SHORT[@]}" ;;
    reduce_overhead)  # and its default-mode twin: what the graphs' pool adds, and the memory
      #                fit's 4-layer point
      sweep reduce_overhead "${GPT2_4[@]}" perf.dtype=bf16 perf.compile=true \
        perf.compile_mode=reduce-overhead,default "${SHORT[@]}" ;;
    memory_fit)  # the compiled estimate's refit input: peaks only, so no diagnosis
      sweep memory_fit model=gpt2 model.n_layer=2,12 perf.dtype=bf16 perf.compile=true \
        "${SHORT[@]}" bench.diagnose=false ;;
    chunked_loss)
      sweep chunked_loss model=gpt2 perf.loss=chunked perf.batch_size=8 perf.dtype=bf16 \
        perf.compile=false,true "${SHORT[@]}" ;;
    fp8)
      sweep fp8 "${GPT2_4[@]}" perf.fp8=tensorwise perf.dtype=bf16 perf.compile=true "${SHORT[@]}" ;;
    time_to_loss)
      if [ -z "${PRINT_ONLY:-}" ] && [ ! -f .gpu/ttl/train.bin ]; then
        echo "gpu_check: no .gpu/ttl/train.bin: run bash benchmarks/gpu_check.sh --prepare here first" >&2
        return 1
      fi
      sweep time_to_loss data=tokens "data.path=$PWD/.gpu/ttl/train.bin" model=nano \
        model.vocab_size=64 model.block_size=64 perf.batch_size=32 perf.dtype=bf16 \
        perf.compile=false bench.target_loss=1.5 bench.repeats=2 bench.eval_every=25 \
        bench.eval_batches=4 "bench.max_s=$TTL_MAX_S" bench.diagnose=false ;;
    cuda_tests)
      read -r -a limit <<<"${GPU_CHECK_TEST_TIMEOUT:-}"
      exec "$PY" -m pytest -m cuda -v -rfEs -p no:cacheprovider "${limit[@]}" --durations=0 \
        "--basetemp=$WORK/cuda_tests" ;;
    readme_sweep) sweep readme_sweep perf.compile=true,false perf.dtype=bf16,fp16 ;;
    search)
      sweep search hydra/sweeper=tune perf.compile=false \
        "perf.dtype=choice(bf16,fp16)" hydra.sweeper.n_trials=2 hydra.sweeper.finalists=2 \
        hydra.sweeper.repeats=1 "${SHORT[@]}" bench.diagnose=false ;;
    default_gap)
      exec "$PY" benchmarks/default_gap.py --rounds 1 perf.dtype=bf16 perf.compile=true \
        "${SHORT[@]}" bench.diagnose=false ;;
    *) echo "gpu_check: no part $1: ${PARTS[*]}" >&2; return 2 ;;
  esac
}

sweep() {  # NAME OVERRIDES...: one multirun on CUDA into WORK/NAME
  local name=$1
  shift
  if [ -n "${PRINT_ONLY:-}" ]; then  # --overrides: what it would run, one override a line
    printf '%s\n' logger=none bench.device=cuda "$@"
    return 0
  fi
  # exec: the sweep is the process `timeout` signals (SIGTERM: the point recorded `interrupted`
  # and the table built), then kills 3 s later; a shell between would die and leave it running.
  exec "$PY" -m nanogpt.run -m logger=none bench.device=cuda "hydra.sweep.dir=$WORK/$name" "$@"
}

case "${1:-}" in
  --dry-run) dry_run; exit $? ;;
  --prepare) prepare; exit $? ;;
  --summary) summarize "${2:-}"; exit $? ;;
  --overrides)  # PART: a sweep part's overrides, as its multirun gets them (tests compose them)
    case ${2:-} in
      setup | cuda_tests | default_gap | "") echo "gpu_check --overrides: ${2:-(none)} is no sweep part" >&2; exit 2 ;;
    esac
    PRINT_ONLY=1 run_part "$2"; exit $? ;;
  --part) run_part "$2"; exit $? ;;
  "") ;;
  *)
    echo "gpu_check: unknown argument $1: none, --dry-run, --prepare, --summary DIR or --overrides PART" >&2
    exit 2 ;;
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
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda},"
      f" {torch.cuda.device_count()} GPU(s)")
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
lacking=" $("$PY" -c "$IMPORTS" "${names[@]}" 2>/dev/null | tr '\n' ' ')"
# transformers pins its hub, tokenizers and safetensors: where it is installed, so are they (an
# image's older huggingface_hub would fail its import)
[[ $lacking == *" transformers "* ]] && lacking+="huggingface_hub tokenizers safetensors "
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
# Cold, as the boxes are reckoned: empty Inductor and Triton caches of this run's own, whatever
# ran on the machine before (a point's record says `inductor_cache`: cold or warm)
export TORCHINDUCTOR_CACHE_DIR=$WORK/caches/inductor TRITON_CACHE_DIR=$WORK/caches/triton
optional=(hydra omegaconf optuna pyarrow tiktoken pynvml pytest_timeout wandb torchao transformers submitit)
absent=" $("$PY" -c "$IMPORTS" "${optional[@]}" 2>/dev/null | tr '\n' ' ')"
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
  [ ${#DROPPED[@]} -gt 0 ] && echo "- dropped to fit $LIMIT_S s: ${DROPPED[*]} (--dry-run); $NEXT:" \
    "GPU_CHECK_PARTS=\"${DROPPED[*]}\" bash benchmarks/gpu_check.sh"
  [ "$UNCHANGED" != " " ] && echo "- last, their code as at their last ok loan:$UNCHANGED"
  cat "$WORK/setup.txt" 2>/dev/null
  echo "- setup: $((SECONDS - started)) s"
} >"$SUMMARY"

show() {  # NAME: what the summary keeps of a part: each point's figures, then its last lines
  local name=$1 dir=$WORK/$1
  # the CUDA suite's: the chunked-loss test's sweep (pytest's temp dir is under WORK)
  [ "$name" = cuda_tests ] && dir=$(ls -d "$WORK"/cuda_tests/test_the_chunked_loss*/sweep 2>/dev/null | head -n 1)
  [ -n "$dir" ] && [ -d "$dir" ] && "$PY" benchmarks/gpu_summary.py "$dir" 2>&1
  [ -f "$dir/tune.md" ] && grep -A 8 "^## Ranking" "$dir/tune.md"
  if [ "$name" = memory_fit ]; then  # the refit, on this call's compiled points (the twin's too)
    echo '```'
    timeout 60 "$PY" benchmarks/memory_refit.py "$WORK/memory_fit" "$WORK/reduce_overhead" 2>&1 |
      sed 's|'"$WORK"'/||g'
    echo '```'
  fi
  echo '```'
  grep -vE '^\s*$' "$WORK/$name.log" | tail -n 25
  echo '```'
}

archive() {  # the records so far, replaced whole (a loan cut mid-tar keeps the last one)
  tar -czf "$OUT/records.tar.gz.tmp" -C "$WORK" --exclude=./site --exclude=./caches \
    --exclude=inductor_cache --exclude='*.pt.trace.json*' --exclude='*.pickle' . \
    2>/dev/null && mv "$OUT/records.tar.gz.tmp" "$OUT/records.tar.gz"
}

failed=0
for part in "${RUN[@]}"; do
  [ "$part" = setup ] && continue  # done above, in this shell
  begin=$SECONDS
  timeout -k 3 "${BOX[$part]}" bash "$0" --part "$part" >"$WORK/$part.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status="TIMED OUT (box ${BOX[$part]} s)"; failed=1 ;;
    *) status="FAILED (exit $rc)"; failed=1 ;;
  esac
  { echo
    echo "## $part: $status in $((SECONDS - begin)) s (box ${BOX[$part]} s = ${ARITH[$part]} +$MARGIN_PCT %)"
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
