#!/bin/sh
# `make test-mpi`: a rank that stops answering in the middle of allreduces
# (hangs, or is killed) must not hang the job: with DL_COMM_TIMEOUT=2 the
# survivor of a hang fails with dl.h's message within the timeout (plus
# start-up), in an allreduce and in dl_ddp_step with its buckets summed
# during backward, and a killed rank ends the job (mpirun's own abort) as fast.
# Prints "N passed, M failed".
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
B=${B:-build}
pass=0; fail=0
ok() { if [ "$1" = 1 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL test_mpi_kill.sh: $2"; fi; }
out=$(mktemp); trap 'rm -f "$out"' EXIT

s=$(date +%s)
DL_COMM_TIMEOUT=2 timeout 60 $MPIRUN -np 2 "$B/mpi/test_mpi" --stop >"$out" 2>&1
rc=$?; e=$(( $(date +%s) - s ))
grep -q "rank 0 of 2 waited 2 s for rank 1 or 1 (timeout: dl_comm_desc.timeout or DL_COMM_TIMEOUT): a rank died or hangs" "$out"
ok $((1 - $?)) "a hung rank 1: rank 0 reports the timeout (rc $rc): $(head -c 600 "$out")"
grep -q "^2 passed, 0 failed" "$out"; ok $((1 - $?)) "a hung rank 1: rank 0's checks"
[ "$rc" != 124 ] && [ "$e" -le 20 ]; ok $((1 - $?)) "a hung rank 1: the job ends in ${e} s (limit 20), rc $rc"

s=$(date +%s)
DL_COMM_TIMEOUT=2 timeout 60 $MPIRUN -np 2 "$B/mpi/test_mpi" --stop-ddp >"$out" 2>&1
rc=$?; e=$(( $(date +%s) - s ))
grep -q "rank 0 of 2 waited 2 s for rank 1 or 1 (timeout: dl_comm_desc.timeout or DL_COMM_TIMEOUT): a rank died or hangs" "$out"
ok $((1 - $?)) "a rank 1 that hangs in dl_ddp_step (buckets summed during backward): rank 0 reports the timeout (rc $rc): $(head -c 600 "$out")"
grep -q "^3 passed, 0 failed" "$out"; ok $((1 - $?)) "a hung rank 1 in dl_ddp_step: rank 0's checks"
[ "$rc" != 124 ] && [ "$e" -le 20 ]; ok $((1 - $?)) "a hung rank 1 in dl_ddp_step: the job ends in ${e} s (limit 20), rc $rc"

s=$(date +%s)
DL_COMM_TIMEOUT=2 timeout 60 $MPIRUN -np 2 "$B/mpi/test_mpi" --kill >"$out" 2>&1
rc=$?; e=$(( $(date +%s) - s ))
[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$e" -le 20 ]
ok $((1 - $?)) "a killed rank 1: the job fails in ${e} s (limit 20), rc $rc: $(head -c 600 "$out")"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
