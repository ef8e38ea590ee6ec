#!/bin/sh
# Runs each test program given, sums their "N passed, M failed" lines and
# prints the total as the last line. A program that crashes or prints no
# summary counts as one failure. Exit status: non-zero when anything failed.
pass=0; fail=0
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    printf '%s\n' "$out" | grep -E '^(FAIL|SKIP|dl.h:|==|ERROR|.*runtime error)' | grep -v 'failed to allocate 0x' | head -n 40
    if [ -z "$line" ]; then
        echo "$t: exited with status $rc and no summary line"; fail=$((fail + 1)); continue
    fi
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed, ([0-9]+) failed.*/\1/')
    f=$(echo "$line" | sed -E 's/^([0-9]+) passed, ([0-9]+) failed.*/\2/')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "$t: exit status $rc"; fi
    printf '%-32s %s\n' "$(basename "$t")" "$line"
    pass=$((pass + p)); fail=$((fail + f))
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
