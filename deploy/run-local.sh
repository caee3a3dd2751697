#!/usr/bin/env bash
# Start the collector and the agent on this host, profiling all of it, and say
# where to look. Ctrl-C stops both (the agent drains and ships once more).
#   deploy/run-local.sh [STATE_DIR]     (default: .ember)
set -euo pipefail
state=${1:-.ember}
ember=${EMBER:-.venv/bin/ember}
mkdir -p "$state"

# its own session: a Ctrl-C in the terminal reaches the agent only, and the
# collector is stopped after the agent has shipped its last profiles
setsid "$ember" collector --storage "$state/ember.db" 2>"$state/collector.log" &
collector=$!
agent=
cleanup() {
    [ -n "$agent" ] && kill -TERM "$agent" 2>/dev/null && wait "$agent" 2>/dev/null || true
    kill -TERM "$collector" 2>/dev/null && wait "$collector" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

for _ in $(seq 50); do
    (exec 3<>/dev/tcp/127.0.0.1/7072) 2>/dev/null && break
    sleep 0.2
done
"$ember" -v agent --spool-dir "$state/spool" --interval 10s 2>"$state/agent.log" &
agent=$!

cat <<EOT
ember is profiling this host (on-CPU and off-CPU); profiles reach the collector every 10 s.
  agent health and metrics:  http://127.0.0.1:7071/metrics  (/healthz, /livez, /readyz)
  collector API:             http://127.0.0.1:7072/api/v1/labels
  on-CPU, last 5 minutes:    $ember query --collector http://127.0.0.1:7072 --since 5m
  off-CPU, as pprof:         $ember query --collector http://127.0.0.1:7072 --type offcpu --format pprof -o off.pb.gz
  logs:                      $state/agent.log, $state/collector.log
Ctrl-C stops both.
EOT
wait "$agent"
