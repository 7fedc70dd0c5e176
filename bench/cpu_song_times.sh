#!/usr/bin/env bash
# The CPU timings the README quotes ("No GPU?", "A CPU another job shares?", "How long", the 4,096-token lead-sheet
# budget), measured in one run on this machine: `scripts/song.sh` (the tiny synthetic bf16 model, the default 20 s
# song, 128 ABC tokens) idle and beside two busy processes (pure-Python loops, one per core of a 2-core machine),
# each with and without OMP_NUM_THREADS=1, then the release's 4,096-token lead-sheet budget with OMP_NUM_THREADS=1.
# Needs `bash scripts/song.sh` to have run once (the venv and the synthetic checkpoint). Prints a table; seconds are
# wall time of the whole command (process start, load, lead sheet, music, render, VAE, writing the song).
#
#   bash bench/cpu_song_times.sh [--skip-long]     # --skip-long: not the 4,096-token run (≈ 1.5 min)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/yue2_cpu_times}
rm -rf "$OUT"; mkdir -p "$OUT"
rows=()
run() {  # label, env assignment ("" or OMP_NUM_THREADS=1), extra args...
  local label=$1 envs=$2; shift 2
  local t0 t1
  t0=$(date +%s.%N)
  local dir; dir="$OUT/run${#rows[@]}_$(echo "$label" | tr -c 'a-z0-9' _)"
  env $envs bash scripts/song.sh --output "$dir" "$@" >"$dir.log" 2>&1
  local rc=$?
  t1=$(date +%s.%N)
  rows+=("| $label | ${envs:-(unset)} | $(python3 -c "print(f'{$t1 - $t0:.1f}')") s | rc $rc |")
  echo "${rows[-1]}"
}
busy_start() { for _ in 1 2; do python3 -c "while True: pass" & done; BUSY=$(jobs -p); }
busy_stop() { kill $BUSY 2>/dev/null; wait $BUSY 2>/dev/null; }
echo "$(nproc) cores · $(uname -m) · $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
bash scripts/song.sh --output "$OUT/warm" >/dev/null 2>&1  # page cache, .pyc files: not the first-run install
run "idle" ""
run "idle" "OMP_NUM_THREADS=1"
busy_start
run "beside 2 busy processes" ""
run "beside 2 busy processes" "OMP_NUM_THREADS=1"
busy_stop
[ "${1:-}" = "--skip-long" ] || run "idle, --max-abc-tokens 4096" "OMP_NUM_THREADS=1" --max-abc-tokens 4096
echo
echo "| run | OMP_NUM_THREADS | seconds | exit |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
