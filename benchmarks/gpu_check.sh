#!/usr/bin/env bash
# gpu_check.sh: the paper-scale GPU path on one GPU, in under 10 minutes.
#
#   benchmarks/gpu_check.sh                                   # one GPU, the paper's model
#   DEVICE=cpu STEPS=20 SIZE=smoke benchmarks/gpu_check.sh    # dry check of the script on a CPU
#
# It does two things:
#   (a) the smoke DAG on the device: snakemake --cores all --configfile config/smoke.yaml
#       --config device=$DEVICE data_url=file://$DATA, in a scratch copy of the pipeline under $OUT/dag
#       (so the checkout's results/ are untouched). It passes when snakemake exits 0.
#   (b) for each training precision (bf16, float32, float64) $STEPS-step runs of case $CASE with the
#       model of config/$SIZE.yaml, with metrics (their linear algebra on the host: --metrics-device host)
#       and without, and for the first precision also with the metrics on the device
#       (--metrics-device device) and on the host but on the training thread (host-sync:
#       --metrics-threads 0, against the config's metrics threads), and reports ms/step, the claims that depend on precision (E1: max rho
#       of plain SGD; E3: max tau) and the peak memory. The host/device pair is the measurement that
#       --metrics-device auto's choice for CUDA (host) awaits.
#       Where this attnid has no --dtype flag, one run set at the default precision, labelled "default".
#
# Parameters (environment variables, defaults in brackets):
#   DEVICE [cuda]   device of the runs and of the smoke DAG
#   SIZE [paper]    model and case settings from config/$SIZE.yaml (paper, smoke, config)
#   CONFIG          a config file instead of config/$SIZE.yaml
#   STEPS [200]     optimizer steps per run
#   CASE [sgd]      optimizer case of the runs (sgd gives both the E1 and the E3 number)
#   DTYPES ["bf16 float32 float64"; "float32 float64" when DEVICE=cpu, where attnid refuses bf16]
#   THREADS         torch CPU threads per run [the config's threads]
#   COMPILE [auto]  auto: attnid's default (torch.compile on CUDA); 1: --compile; 0: --no-compile (shorter
#                   start-up per run: compiling is not in ms_per_step, but it is in the wall time)
#   DAG [1]         0 skips (a)
#   CORES [all]     snakemake --cores for (a)
#   DATA [assets/tinyshakespeare.txt]  the tiny shakespeare text
#   OUT [results/gpu_check]            where runs, logs and the summary go (replaced on each call)
#   RUN_TIMEOUT [240]                  seconds per run before it is stopped and reported as "timeout"
#   PYTHON [python3]
#
# Output: $OUT/summary.tsv, also printed at the end between "=== summary ===" and "=== end ===":
# lines starting with "#" are comments (date, attnid version, the smoke DAG's result, the device
# name), then one tab-separated header row and one row per run (metrics: host, device, off; "on" where
# this attnid has no --metrics-device) with the columns
#   dtype metrics case steps status ms_per_step max_rho_qk max_rho_ov max_tau max_drift1_qk
#   max_drift1_ov e1_rho e3_tau peak_mb peak_source run_dtype final_val_loss
# defined in benchmarks/gpu_check_summary.py (and docs/cluster.md). NA marks a value not measured.
# Exit status: 0 when the smoke DAG (if run) and every run finished, 1 otherwise.

set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-paper}
CONFIG=${CONFIG:-$REPO/config/$SIZE.yaml}
STEPS=${STEPS:-200}
CASE=${CASE:-sgd}
if [[ $DEVICE == cpu ]]; then DTYPES=${DTYPES:-float32 float64}; else DTYPES=${DTYPES:-bf16 float32 float64}; fi
THREADS=${THREADS:-}
COMPILE=${COMPILE:-auto}
DAG=${DAG:-1}
CORES=${CORES:-all}
DATA=${DATA:-$REPO/assets/tinyshakespeare.txt}
OUT=${OUT:-$REPO/results/gpu_check}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
PYTHON=${PYTHON:-python3}
HELPER=("$PYTHON" "$REPO/benchmarks/gpu_check_summary.py")

say() { echo "gpu_check: $*" >&2; }
die() { say "error: $*"; exit 2; }

[[ -f $CONFIG ]] || die "config $CONFIG not found (SIZE=paper|smoke|config, or CONFIG=FILE)"
[[ -f $DATA ]] || die "tiny shakespeare not found at $DATA; pass DATA=/path/to/tinyshakespeare.txt"
DATA=$(cd "$(dirname "$DATA")" && pwd)/$(basename "$DATA")
"$PYTHON" -c "import attnid" 2>/dev/null || die "$PYTHON cannot import attnid: pip install -e . first"

if [[ -e $OUT && ! -d $OUT/runs ]] && [[ -n $(ls -A "$OUT" 2>/dev/null) ]]; then
  die "OUT=$OUT exists and is not an earlier gpu_check output; choose another OUT"
fi
rm -rf "$OUT"
mkdir -p "$OUT/runs"
failures=0
version=$("$PYTHON" -m attnid --version | cut -d' ' -f2)
comments=("gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), attnid $version, config $(basename "$CONFIG"), device $DEVICE")

# (a) the smoke DAG on the device, in a scratch copy of the pipeline
if [[ $DAG != 0 ]]; then
  command -v snakemake >/dev/null || die "snakemake not on PATH (pip install -e . installs it)"
  mkdir -p "$OUT/dag"
  for item in Snakefile workflow config paper profiles assets; do
    [[ -e $REPO/$item ]] && cp -r "$REPO/$item" "$OUT/dag/"
  done
  say "(a) smoke DAG with device=$DEVICE (log: $OUT/dag.log)"
  started=$SECONDS
  (cd "$OUT/dag" && snakemake --cores "$CORES" --configfile config/smoke.yaml \
      --config device="$DEVICE" data_url="file://$DATA") >"$OUT/dag.log" 2>&1
  rc=$?
  if [[ $rc == 0 ]]; then dag_result="ok"; else dag_result="FAILED (exit $rc, see $OUT/dag.log)"; failures=1; fi
  comments+=("smoke DAG device=$DEVICE: $dag_result in $((SECONDS - started)) s")
  say "(a) smoke DAG: $dag_result"
fi

# (b) timed runs per precision: metrics on the host, off, and (first precision) on the device
"$PYTHON" -m attnid prepare --text "$DATA" --out-dir "$OUT/data" >"$OUT/prepare.log" 2>&1 \
  || die "attnid prepare failed (see $OUT/prepare.log)"
train_help=$("$PYTHON" -m attnid train --help)
if [[ $train_help == *--dtype* ]]; then
  dtypes=($DTYPES)
else
  dtypes=(default)
  say "this attnid train has no --dtype flag: one run pair at its default precision (labelled 'default')"
  comments+=("attnid train has no --dtype: runs at the default precision (run_dtype says which)")
fi
if [[ $train_help == *--metrics-device* ]]; then with_metrics=(host); else with_metrics=(on); fi
case $COMPILE in
  auto) compile_flag=() ;;
  1) compile_flag=(--compile) ;;
  0) compile_flag=(--no-compile) ;;
  *) die "COMPILE=$COMPILE: use auto, 1 or 0" ;;
esac
[[ $train_help == *--compile* ]] || compile_flag=()
flag_line=$("${HELPER[@]}" flags --config "$CONFIG" --case "$CASE" --steps "$STEPS") \
  || die "cannot read the model and case $CASE from $CONFIG"
read -r -a flags <<<"$flag_line"

run_dirs=()
for dtype in "${dtypes[@]}"; do
  variants=("${with_metrics[@]}" off)
  # the metrics' linear algebra on the device too, once: the host-or-device comparison; and on the
  # training thread, once: what the metrics threads save
  if [[ $dtype == "${dtypes[0]}" && ${with_metrics[0]} == host ]]; then
    variants=(host device off)
    [[ $train_help == *--metrics-threads* ]] && variants=(host host-sync device off)
  fi
  for metrics in "${variants[@]}"; do
    run="$OUT/runs/$dtype-metrics-$metrics"
    run_dirs+=("$run")
    extra=()
    [[ $dtype != default ]] && extra+=(--dtype "$dtype")
    [[ $metrics == off ]] && extra+=(--no-metrics)
    [[ $metrics == host || $metrics == device ]] && extra+=(--metrics-device "$metrics")
    [[ $metrics == host-sync ]] && extra+=(--metrics-device host --metrics-threads 0)
    extra+=("${compile_flag[@]}")
    [[ -n $THREADS ]] && extra+=(--threads "$THREADS")
    say "(b) $dtype, metrics $metrics: $STEPS steps (log: $run/train.log)"
    mkdir -p "$run"
    timeout -k 30 "$RUN_TIMEOUT" "${HELPER[@]}" measure --result "$run/gpu_check.json" --dtype "$dtype" \
      --metrics "$metrics" --case "$CASE" -- train --data "$OUT/data" --out "$run" --device "$DEVICE" \
      --fresh --progress-every 30 "${flags[@]}" "${extra[@]}" >"$run/train.log" 2>&1
    rc=$?
    if [[ $rc != 0 ]]; then
      failures=1
      say "(b) $dtype, metrics $metrics: exit $rc, see $run/train.log"
      [[ -f $run/gpu_check.json ]] || printf '{"dtype": "%s", "metrics": "%s", "case": "%s", "rc": %d}\n' \
        "$dtype" "$metrics" "$CASE" "$rc" >"$run/gpu_check.json"
    fi
  done
done

echo "=== summary ==="
"${HELPER[@]}" summarize --out "$OUT/summary.tsv" "${comments[@]/#/--comment=}" "${run_dirs[@]}" || failures=1
echo "=== end ==="
say "summary written to $OUT/summary.tsv"
exit $failures
