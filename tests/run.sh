#!/bin/sh
# Runs each test program given, sums their "N passed, M failed" lines (with
# ", K skipped" when a program skipped something) and prints the total as the
# last line: "N passed, M failed", or "N passed, M failed, K skipped" when
# anything was skipped. A program that crashes or prints no summary counts
# as one failure. Exit status: non-zero when anything failed.
pass=0; fail=0; skip=0
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    printf '%s\n' "$out" | grep -E '^(FAIL|SKIP|dl.h:|==|ERROR|.*runtime error)' | grep -v 'failed to allocate 0x' | head -n 40
    if [ -z "$line" ]; then
        echo "$t: exited with status $rc and no summary line"; fail=$((fail + 1)); continue
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    s=0
    case $line in *" failed, "*" skipped"*) s=$(echo "$line" | sed -E 's/^[0-9]+ passed, [0-9]+ failed, ([0-9]+) skipped.*/\1/') ;; esac
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "$t: exit status $rc"; fi
    printf '%-32s %s\n' "$(basename "$t")" "$line"
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
done
if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"
else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
