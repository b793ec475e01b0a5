#!/usr/bin/env bash
# Redis's own instructions per decision, before request ids and now:
# `redis-server` under `valgrind --tool=callgrind`, 5 000 `EVALSHA`s of each
# script over 100 keys (one connection, `redis-benchmark`), a key that
# never drains during the run (1 permit a second, a million deep: its
# state is always there to read), less an idle server's instructions.
# Instruction counts repeat from run to run, unlike time on a shared
# machine. Needs valgrind, redis-server, redis-cli and redis-benchmark.
#
#   bash benches/callgrind_redis.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CALLS=5000
BANDS="1000 1000000 0 1000000000000 0" # unit, cost, tau of 1/s × 1 000 000

# instructions <name> <script> <calls> [args…]: total instructions of a
# server that ran <calls> of <script> with these arguments.
instructions() {
  local name=$1 script=$2 calls=$3
  shift 3
  local port=$((20000 + RANDOM % 20000)) out
  out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" \
    redis-server --port "$port" --save '' --appendonly no >/dev/null 2>&1 &
  local server=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  local sha
  sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$script")")
  if [ "$calls" -gt 0 ]; then
    redis-benchmark -p "$port" -q -n "$calls" -r 100 -c 1 \
      EVALSHA "$sha" 1 "k:__rand_int__" "$@" >/dev/null
  fi
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$server" || true
  grep -E '^summary:' "$out" | cut -d' ' -f2
  rm -f "$out"
}

idle=$(instructions idle redis-benches/gcra_before_ids.lua 0)
per_call() { echo $(( ($1 - idle) / CALLS )); }
# shellcheck disable=SC2086
before=$(per_call "$(instructions before redis-benches/gcra_before_ids.lua $CALLS $BANDS)")
# shellcheck disable=SC2086
now_default=$(per_call "$(instructions now src/redis/gcra.lua $CALLS 0123456789abcdef 400000 f $BANDS)")
# shellcheck disable=SC2086
now_full=$(per_call "$(instructions full src/redis/gcra.lua $CALLS 0123456789abcdef 60000000 f $BANDS)")
echo "| script | instructions per EVALSHA (Redis, network included) |"
echo "|---|---:|"
echo "| before request ids | $before |"
echo "| now, ids kept 400 ms (the default 200 ms deadline) | $now_default ($(( 100 * now_default / before ))%) |"
echo "| now, 16 ids kept (a key granted 16 times within the horizon) | $now_full ($(( 100 * now_full / before ))%) |"
