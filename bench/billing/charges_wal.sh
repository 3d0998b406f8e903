#!/usr/bin/env bash
# WAL written by one billing minute of charges, right after a checkpoint and
# in the minute after it, for the charges table's instance-major primary key
# (instance_no, minute) against a minute-major one, with wal_compression off
# and lz4. A throwaway PostgreSQL 15 cluster; nothing of svd is needed.
#
#   bench/billing/charges_wal.sh [instances=20000] [minutes of history=300]
#
# With a long history each instance's newest key sits on its own leaf page,
# so the first minute after a checkpoint writes a full-page image of about
# one index page per instance (docs/operations.md, "PostgreSQL settings").
set -euo pipefail
N=${1:-20000}
H=${2:-300}
PORT=${PORT:-55991}
BIN=/usr/lib/postgresql/15/bin
D=$(mktemp -d)
as_pg() { if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[[ $(id -u) -eq 0 ]] && chown postgres: "$D"
cleanup() { as_pg "$BIN/pg_ctl" -D "$D/data" -m immediate -w stop >/dev/null 2>&1 || true; rm -rf "$D"; }
trap cleanup EXIT
as_pg "$BIN/initdb" -D "$D/data" -U postgres -A trust -E UTF8 --no-locale --no-sync >/dev/null
as_pg "$BIN/pg_ctl" -D "$D/data" -l "$D/log" -w -t 30 -o "-k $D -p $PORT \
  -c listen_addresses=127.0.0.1 -c max_wal_size=8GB -c checkpoint_timeout=1h \
  -c shared_buffers=1GB" start >/dev/null
sql() { as_pg psql -h 127.0.0.1 -p "$PORT" -U postgres -qAt -d postgres -c "$1"; }
cols="instance_no bigint, minute bigint, gpu_count int, unit_price bigint, main_micros bigint, at timestamptz"
sql "CREATE TABLE by_instance ($cols, PRIMARY KEY (instance_no, minute))"
sql "CREATE TABLE by_minute ($cols, PRIMARY KEY (minute, instance_no))"
for t in by_instance by_minute; do
  sql "INSERT INTO $t SELECT i, m, 8, 33000, 264000, now() FROM generate_series(1, $N) i,
       generate_series(1, $H) m ORDER BY m, i"
  sql "VACUUM ANALYZE $t"
done
echo "$N instances, $H minutes of history; index sizes: $(sql "SELECT pg_size_pretty(pg_relation_size('by_instance_pkey')) || ' (instance, minute), ' || pg_size_pretty(pg_relation_size('by_minute_pkey')) || ' (minute, instance)'")"
printf '%-20s %-16s %-22s %8s %8s\n' key wal_compression minute WAL_MB ms
minute=$H
for comp in off lz4; do
  sql "ALTER SYSTEM SET wal_compression = '$comp'" >/dev/null
  sql "SELECT pg_reload_conf()" >/dev/null
  for t in by_instance by_minute; do
    sql "CHECKPOINT"
    for k in first second; do
      minute=$((minute + 1))
      lsn=$(sql "SELECT pg_current_wal_lsn()")
      start=$(date +%s%N)
      sql "INSERT INTO $t SELECT i, $minute, 8, 33000, 264000, now() FROM generate_series(1, $N) i"
      end=$(date +%s%N)
      bytes=$(sql "SELECT pg_current_wal_lsn() - '$lsn'::pg_lsn")
      key=$([[ $t == by_instance ]] && echo "(instance, minute)" || echo "(minute, instance)")
      printf '%-20s %-16s %-22s %8s %8s\n' "$key" "$comp" "$k after checkpoint" \
        "$((bytes / 1048576))" "$(((end - start) / 1000000))"
    done
  done
done
