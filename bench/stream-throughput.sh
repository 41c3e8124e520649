#!/bin/bash
# usage: bench/stream-throughput.sh CHECKOUT: three runs of a 256 MiB exec stream and a 256 MiB
# file download through the API of a fresh daemon built in CHECKOUT (wall seconds each).
set -e
W=$(realpath "$1"); D=$(mktemp -d /tmp/forkd-tp-XXXX); export FORKD_DATA_DIR=$D FORKD_ACCEL=tcg
cd $W
node dist/src/cli/main.js daemon > $D/daemon.log 2>&1 &
DP=$!
for i in $(seq 100); do [ -S $D/forkd.sock ] && break; sleep 0.2; done
F="node dist/src/cli/main.js"
$F snapshot --tag tp >/dev/null
ID=$($F fork --tag tp --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print((d.get("sandboxes") or d)[0]["id"])')
$F exec $ID -- truncate -s 256M /root/big >/dev/null
for r in 1 2 3; do
  s=$EPOCHREALTIME; $F exec $ID -- head -c 268435456 /dev/zero | wc -c >/dev/null; e=$EPOCHREALTIME
  s2=$EPOCHREALTIME; $F cp "$ID:/root/big" "$D/big" >/dev/null; e2=$EPOCHREALTIME
  echo "$W run $r: exec-stream $(awk "BEGIN{print $e - $s}") s, download $(awk "BEGIN{print $e2 - $s2}") s ($(stat -c %s "$D/big") bytes)"
  rm -f "$D/big"
done
$F kill $ID >/dev/null || true
kill $DP; wait $DP 2>/dev/null || true
rm -rf $D
