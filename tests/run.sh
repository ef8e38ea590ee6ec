#!/bin/sh
# Runs each test program given, sums their "N passed, M failed" lines (with
# ", K skipped" when a program skipped something) and prints the total as the
# last line: "N passed, M failed", or "N passed, M failed, K skipped" when
# anything was skipped. A program that crashes or prints no summary counts
# as one failure. Exit status: non-zero when anything failed.
#
# Options between the programs apply to the programs after them:
#   --tag TAG        starts a new run: label its lines NAME TAG ("test_core@cpu:1"),
#                    prefix its FAIL/SKIP/error lines with that label, and
#                    forget the --env settings before it
#   --env VAR=VALUE  run them with VAR=VALUE in the environment (repeatable)
# With a --tag, each run of programs (before the first --tag, and after each)
# gets a subtotal line, "subtotal[ TAG]: N passed, M failed[, K skipped]".
# e.g. run.sh build/test_core --tag @cpu:1 --env DL_DEVICE=cpu:1 build/test_core
pass=0; fail=0; skip=0
tag=""; envs=""
sp=0; sf=0; ss=0; sn=0; tagged=0   # the current run's subtotal and program count

subtotal() {
    [ "$sn" -gt 0 ] || return 0
    if [ "$ss" -gt 0 ]; then echo "subtotal${tag:+ $tag}: $sp passed, $sf failed, $ss skipped"
    else echo "subtotal${tag:+ $tag}: $sp passed, $sf failed"; fi
    sp=0; sf=0; ss=0; sn=0
}

while [ $# -gt 0 ]; do
    t=$1; shift
    case $t in
        --tag) tagged=1; subtotal; tag=$1; envs=""; shift; continue ;;
        --env) envs="$envs $1"; shift; continue ;;
    esac
    name="$(basename "$t")$tag"
    sn=$((sn + 1))
    # $envs unquoted: VAR=VALUE words for env
    out=$(env $envs "$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    printf '%s\n' "$out" | grep -E '^(FAIL|SKIP|dl.h:|==|ERROR|.*runtime error)' | grep -v 'failed to allocate 0x' |
        head -n 40 | if [ -n "$tag" ]; then sed "s|^|$name: |"; else cat; fi
    if [ -z "$line" ]; then
        echo "$t$tag: exited with status $rc and no summary line"
        fail=$((fail + 1)); sf=$((sf + 1))
        continue
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    s=0
    case $line in *" failed, "*" skipped"*) s=$(echo "$line" | sed -E 's/^[0-9]+ passed, [0-9]+ failed, ([0-9]+) skipped.*/\1/') ;; esac
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "$t$tag: exit status $rc"; fi
    printf '%-32s %s\n' "$name" "$line"
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    sp=$((sp + p)); sf=$((sf + f)); ss=$((ss + s))
done
[ "$tagged" -eq 0 ] || subtotal
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"
else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
