#!/bin/sh
# Runs the quick start from dl.h's doc block and checks its loss fell.
out=$(build/quickstart) || { echo "quickstart crashed"; echo "0 passed, 1 failed"; exit 1; }
first=$(echo "$out" | head -n 1 | awk '{print $4}')
last=$(echo "$out" | tail -n 1 | awk '{print $4}')
if awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a / 100)}'; then
    echo "1 passed, 0 failed"
else
    echo "FAIL quickstart loss $first -> $last"; echo "0 passed, 1 failed"; exit 1
fi
