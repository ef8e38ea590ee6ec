#!/bin/sh
# tests/test_bench_serve.sh - bench/run.sh's one PyTorch process for the
# *_cuda cases (torch_bench.py --serve, a case a line through two FIFOs),
# against a made-up PyTorch (PYTHON=a script, no torch needed): answers go to
# their cases' lines in order, an "ERR" answer prints n/a and its reason, a
# server that dies leaves n/a and "is gone" on every later line and run.sh
# still ends, and with DL_PROFILE each case gets a process of its own.
# Prints "N passed, M failed"; exit status 1 on a failure.
cd "$(dirname "$0")/.." || exit 1
T=build/test_bench_serve.tmp
rm -rf "$T" && mkdir -p "$T" || { echo "cannot create $T"; echo "0 passed, 1 failed"; exit 1; }
pass=0 fail=0
ok() { pass=$((pass + 1)); }
no() { fail=$((fail + 1)); echo "FAIL $*"; }
# the made-up interpreter: $1 is bench/torch_bench.py, or -c for the version line
cat >"$T/py" <<'PY'
#!/bin/sh
[ "$1" = -c ] && { echo "python 0.0"; exit 0; }
case $2 in
--version) echo 9.9.9 ;;
--serve)
    echo "serve $$" >>"${FAKE_LOG:?}"
    while read -r c t rest; do
        case $c in
        matmul200_cuda) echo "ERR made-up refusal of $c" ;;
        conv1_fwdbwd_cuda) exit 3 ;;
        *) echo "$c $t 1.25" ;;
        esac
    done ;;
*)  echo "process $2" >>"${FAKE_LOG:?}"; echo "$2 $3 2.5" ;;
esac
PY
chmod +x "$T/py"
# run CASES: bench/run.sh with the fake PyTorch, no dl.h CUDA build, 60 s at most
run() {
    : >"$T/log"
    FAKE_LOG=$PWD/$T/log PYTHON=$PWD/$T/py MAKE=true DL_CUDA=$T/none CASES="$1" THREADS=1 \
        timeout 60 sh bench/run.sh >"$T/out" 2>&1
}
line() { grep "^$1 " "$T/out" | head -n 1; }

run 'add_sync_cuda matmul200_cuda linear_fwdbwd_cuda'
rc=$?
if [ $rc = 0 ]; then ok; else no "run.sh ended with status $rc"; fi
if [ "$(grep -c '^serve' "$T/log")" = 1 ] && ! grep -q '^process' "$T/log"; then ok
else no "one serving process, no per-case ones:"; sed 's/^/    /' "$T/log"; fi
for c in add_sync_cuda add_sync_cuda_fp32 linear_fwdbwd_cuda linear_fwdbwd_cuda_fp32; do
    if line "$c" | grep -qE "^$c +1 +n/a +1.25 +n/a$"; then ok; else no "$c: $(line "$c")"; fi
done
if line matmul200_cuda | grep -qE '^matmul200_cuda +1 +n/a +n/a +n/a$' && grep -q '^# torch matmul200_cuda: made-up refusal of matmul200_cuda' "$T/out"
then ok; else no "an ERR answer: n/a and its reason"; sed 's/^/    /' "$T/out"; fi

run 'conv1_fwdbwd_cuda bn2d_fwdbwd_cuda'   # the server exits at conv1: later lines n/a, no hang
rc=$?
if [ $rc = 0 ]; then ok; else no "run.sh after the server died: status $rc (124: it hung)"; fi
for c in conv1_fwdbwd_cuda conv1_fwdbwd_cuda_fp32 bn2d_fwdbwd_cuda bn2d_fwdbwd_cuda_fp32; do
    if line "$c" | grep -qE "^$c +1 +n/a +n/a +n/a$"; then ok; else no "$c after the server died: $(line "$c")"; fi
done
if grep -q "^# torch conv1_fwdbwd_cuda: the PyTorch process (torch_bench.py --serve) is gone" "$T/out"; then ok
else no "the reason: the server is gone"; sed 's/^/    /' "$T/out"; fi

DL_PROFILE=1 run 'add_sync_cuda'          # profiling: a process a case
if [ "$(grep -c '^process' "$T/log")" = 2 ] && ! grep -q '^serve' "$T/log" &&
   line add_sync_cuda | grep -qE ' 2.5 +n/a$'; then ok
else no "DL_PROFILE: a process a case"; sed 's/^/    /' "$T/log" "$T/out"; fi

run 'step_mlp16'                            # CPU cases: a process each, as before
if grep -q '^process step_mlp16' "$T/log" && ! grep -q '^serve' "$T/log"; then ok
else no "a CPU case: its own process"; sed 's/^/    /' "$T/log"; fi

# bad settings: refused with the setting and the rule, exit 2 (they measured
# nothing, every line n/a, and exited 0)
for v in ROUNDS=0 ROUNDS=abc THREADS=0 THREADS=abc THREADS=99999; do
    out=$(env "$v" sh bench/run.sh 2>&1); rc=$?
    if [ $rc = 2 ] && printf '%s\n' "$out" | grep -q "^bench: ${v%%=*}="; then ok
    else no "$v: status $rc: $(printf '%s' "$out" | head -c 300)"; fi
done
# build/bench's own numbers: whole, in range, named (atoi took 2abc as 2):
# bench.c at -O0, linked with the examples' implementation object (make
# test builds it), or build/bench where that is all there is
skip=0
bench=
if [ -f build/dl_ex.o ] &&
   ${CC:-cc} -std=c99 -O0 -DDL_NO_IMPLEMENTATION -I. bench/bench.c build/dl_ex.o -o "$T/bench" -lm -lpthread \
       >"$T/cc" 2>&1; then bench=$T/bench
elif [ -x build/bench ]; then bench=build/bench
fi
if [ -n "$bench" ]; then
    for args in "matmul200 2abc" "matmul200 1 --reps 1e9" "matmul200 1 --warmup -1" "matmul200 1 --reps"; do
        # shellcheck disable=SC2086
        out=$("$bench" $args 2>&1); rc=$?
        if [ $rc = 2 ] && printf '%s\n' "$out" | grep -qE "^bench: (THREADS|--reps|--warmup) "; then ok
        else no "build/bench $args: status $rc: $(printf '%s' "$out" | head -c 300)"; fi
    done
    # --help exits 0 (was 2); a stray argument is named as such; --list has
    # the collective cases; a --list that cannot be written is exit 1
    # (examples/cli.h), not 0
    for t in "0|^usage: build/bench CASE THREADS|--help" "2|^bench: junk is no flag \(unknown argument\)$|matmul200 1 junk" \
             "0|^allreduce_ranks$|--list"; do
        want=${t%%|*} rest=${t#*|}
        pat=${rest%%|*} args=${rest#*|}
        # shellcheck disable=SC2086
        out=$("$bench" $args 2>&1); rc=$?
        if [ $rc = "$want" ] && printf '%s\n' "$out" | grep -qE -- "$pat"; then ok
        else no "build/bench $args: status $rc (want $want): $(printf '%s' "$out" | head -c 300)"; fi
    done
    out=$(sh -c "exec $bench --list >/dev/full" 2>&1); rc=$?
    if [ $rc = 1 ] && printf '%s\n' "$out" | grep -q "^bench: writing standard output: "; then ok
    else no "build/bench --list >/dev/full: status $rc: $out"; fi
else
    skip=1
    echo "SKIP build/bench's flags: no build/dl_ex.o to link bench.c with (make test builds it), no build/bench"
fi

rm -rf "$T"
if [ "$skip" = 0 ]; then echo "$pass passed, $fail failed"; else echo "$pass passed, $fail failed, $skip skipped"; fi
[ "$fail" = 0 ]
