#!/usr/bin/env bash
# Runs the integration test binary (kernel suite included, SVC_KERNEL=require: a skip is a
# failure) back to back, to count consecutive green runs (issue 18). Usage, as root:
#
#   tests/streak.sh [RUNS] [LOG_DIR]        # default: 30 runs, logs in /tmp/svc-streak
#
# One line per run goes to LOG_DIR/streak.txt (time, commit, exit code, seconds, load, the
# test result line); a failed run keeps its whole output as LOG_DIR/run-N.log and ends
# the streak (exit 1). Touch LOG_DIR/stop to end it after the run in progress. Each run is
# bounded by the tests' own hang guards; nothing here times a test. With
# SVC_STREAK_PULL=1 each run first fast-forwards the clone (`git pull --ff-only`), so new
# commits join the streak between runs, never during one (the tests read golden/ as they run).
set -u
cd "$(dirname "$0")/.." || exit 2
runs=${1:-30}
logs=${2:-/tmp/svc-streak}
mkdir -p "$logs"
export SVC_KERNEL=require
cargo test -q --test main --no-run >/dev/null 2>&1 || { echo "streak: the tests do not build" >&2; exit 2; }
for n in $(seq 1 "$runs"); do
  [ -e "$logs/stop" ] && { rm -f "$logs/stop"; echo "streak: stopped after $((n - 1)) run(s)"; exit 0; }
  if [ "${SVC_STREAK_PULL:-0}" = 1 ]; then
    git pull -q --ff-only || { echo "streak: git pull failed before run $n" >&2; exit 2; }
  fi
  start=$(date +%s)
  # The tree this run builds (a pull during the run changes HEAD, not the binary).
  commit=$(git rev-parse --short HEAD)
  cargo test -q --test main >"$logs/run-$n.log" 2>&1
  rc=$?
  result=$(grep -E '^test result:' "$logs/run-$n.log" | tail -1)
  echo "$(date -u +%FT%TZ) run $n commit $commit rc=$rc $(($(date +%s) - start))s load=$(cut -d' ' -f1-3 /proc/loadavg) :: $result" | tee -a "$logs/streak.txt"
  if [ "$rc" -ne 0 ]; then
    echo "streak: run $n failed; its output is $logs/run-$n.log" >&2
    exit 1
  fi
  rm -f "$logs/run-$n.log"
done
echo "streak: $runs consecutive green run(s)"
