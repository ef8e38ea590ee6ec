#!/bin/sh
# tests/snippets_check.sh - every C code snippet of README.md, docs/*.md and of dl.h's
# comments compiles (-std=c99 -Wall -Wextra -Werror -pedantic), and every
# whole program among them runs. One check per snippet; prints
# "N passed, M failed" (a FAIL line names the snippet's file and line).
#
# Which snippets:
#   README.md and docs/*.md  every ```c fence. A fence right after a line
#              <!-- snippet: not compiled (why) --> is an outline and is skipped
#              (it still counts, as a pass, so the count shows it).
#   dl.h       the indented block after a comment line that says
#              "compiled by `make test`" or "compiled and run by `make test`"
#              (after one optional blank line, up to the next blank line or
#              the end of the comment); blocks without it are outlines.
# How each is built (after removing its common indentation; always with
# -DDL_NO_IMPLEMENTATION, the programs linked with dl.h's implementation
# compiled once, $dir/dl_impl.o):
#   a whole program (has "int main(")   compiled as it is, run: exit status 0,
#       and when it prints "step N loss X" lines, the last loss must be below
#       1/100 of the first (the quick start trains);
#   a file with #include "dl.h"         compiled as it is (-c);
#   file-scope code (a function         compiled after #define DL_IMPLEMENTATION,
#       definition, static, typedef)    #include "dl.h", <stdio.h>, <string.h> (-c);
#   anything else: statements           compiled and run inside
#       int main(void) { dl_ctx *ctx = dl_ctx_init(NULL); dl_module *net = a
#       Sequential(Linear(4, 8), ReLU, Linear(8, 2)); { snippet } dl_ctx_free(ctx); }
#       so `ctx` and `net` are in scope (a snippet may declare its own ctx).
# Environment: CC (default cc), SNIPPET_DIR (default build/snippets); the
# programs run with this script's environment (make test's strict rerun too).
CC=${CC:-cc}
dir=${SNIPPET_DIR:-build/snippets}
WARN="-std=c99 -Wall -Wextra -Werror -pedantic"
mkdir -p "$dir" || { echo "FAIL snippets: cannot make $dir"; echo "0 passed, 1 failed"; exit 1; }
rm -f "$dir"/s*.txt "$dir"/list

# cut the snippets out: $dir/sNN.txt, and "sNN FILE:LINE skip|check" lines in $dir/list
awk -v dir="$dir" '
function out(src, line, skip) { n++; f = sprintf("%s/s%02d.txt", dir, n)
    printf "" > f; name = f; printf "s%02d %s:%d %s\n", n, src, line, skip ? "skip" : "check" >> (dir "/list") }
FNR == 1 { src = FILENAME; sub(/.*\//, "", src); inb = 0; want = 0; skipnext = 0 }
src ~ /\.md$/ {
    if (!inb && /^<!-- snippet: not compiled/) { skipnext = 1; next }
    if (!inb && /^```c[ \t]*$/) { inb = 1; out(src, FNR + 1, skipnext); skipnext = 0; next }
    if (inb && /^```/) { inb = 0; close(name); next }
    if (inb) print > name
    else if (!/^[ \t]*$/) skipnext = 0
    next
}
src == "dl.h" {
    if (/^#if defined\(DL_IMPLEMENTATION\) && !defined\(DL_NO_IMPLEMENTATION\)/) nextfile
    if (!inb && !want && /compiled (and run )?by `make test`/) { want = 1; blanks = 0; next }
    if (want) {
        if (/^[ \t]*$/ && blanks++ == 0) next
        if (/^[ \t]*$/ || /\*\//) { want = 0; next }
        want = 0; inb = 1; match($0, /^ */); ind = RLENGTH; out(src, FNR, 0)
    }
    if (inb) {
        if (/^[ \t]*$/ || (match($0, /^ */) && RLENGTH < ind)) { inb = 0; close(name); next }
        if (/\*\//) { l = $0; sub(/ *\*\/.*/, "", l); print substr(l, ind + 1) > name; inb = 0; close(name); next }
        print substr($0, ind + 1) > name
    }
}' README.md docs/*.md dl.h

# dl.h's implementation, compiled once: every snippet is compiled with
# DL_NO_IMPLEMENTATION (its own DL_IMPLEMENTATION ignored) and the programs
# link this object, so a snippet costs its own lines, not dl.h's
impl="$dir/dl_impl.o"
if ! err=$($CC $WARN -O0 -I. -DDL_IMPLEMENTATION -x c -c dl.h -o "$impl" 2>&1); then
    echo "FAIL snippets: dl.h's implementation does not compile:"; printf '%s\n' "$err" | head -n 20
    echo "0 passed, 1 failed"; exit 1
fi

pass=0; fail=0
while read -r id where what; do
    s="$dir/$id.txt"; c="$dir/$id.c"; bin="$dir/$id"
    if [ "$what" = skip ]; then echo "snippet $where: an outline, not compiled"; pass=$((pass + 1)); continue; fi
    run=0; cflags="-c"; kind=statements
    if grep -q 'int main(' "$s"; then kind=program; run=1; cflags=""; cp "$s" "$c"
    elif grep -q '#include "dl.h"' "$s"; then kind="translation unit"; cp "$s" "$c"
    elif grep -Eq '^(static|typedef|struct) ' "$s" ||
         grep -E '^[A-Za-z_].*\) *\{ *$' "$s" | grep -Evq '^(for|while|if|switch|do|else)\b'; then
        kind="file scope"
        { printf '#define DL_IMPLEMENTATION\n#include "dl.h"\n#include <stdio.h>\n#include <string.h>\n'
          cat "$s"; } > "$c"
    else
        run=1; cflags=""
        { printf '#define DL_IMPLEMENTATION\n#include "dl.h"\n#include <stdio.h>\n#include <string.h>\n'
          printf 'int main(void)\n{\n    dl_ctx *ctx = dl_ctx_init(NULL);\n'
          printf '    dl_module *mods[3], *net;\n    mods[0] = dl_nn_linear(ctx, 4, 8, true); mods[1] = dl_nn_relu(ctx);\n'
          printf '    mods[2] = dl_nn_linear(ctx, 8, 2, true); net = dl_nn_sequential(ctx, 3, mods);\n'
          printf '    (void)net;\n    {\n#line %s "%s"\n' "${where#*:}" "${where%%:*}"
          cat "$s"
          printf '    }\n    dl_ctx_free(ctx);\n    return 0;\n}\n'; } > "$c"
    fi
    if [ -n "$cflags" ]; then o="$bin.o"; link=""; else o="$bin"; link="$impl"; fi
    if ! err=$($CC $WARN -O0 -I. -DDL_NO_IMPLEMENTATION $cflags "$c" $link -o "$o" -lm -lpthread 2>&1); then
        echo "FAIL snippet $where ($kind) does not compile:"; printf '%s\n' "$err" | head -n 20
        fail=$((fail + 1)); continue
    fi
    if [ "$run" = 1 ]; then
        if ! outp=$("$o" 2>&1); then
            echo "FAIL snippet $where ($kind) exits with an error:"; printf '%s\n' "$outp" | tail -n 5
            fail=$((fail + 1)); continue
        fi
        first=$(printf '%s\n' "$outp" | awk '/^step [0-9]+ loss /{print $4; exit}')
        last=$(printf '%s\n' "$outp" | awk '/^step [0-9]+ loss /{v = $4} END{print v}')
        if [ -n "$first" ] && ! awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a / 100)}'; then
            echo "FAIL snippet $where ($kind): loss $first -> $last, not below 1/100 of the first"
            fail=$((fail + 1)); continue
        fi
    fi
    echo "snippet $where ($kind): ok"
    pass=$((pass + 1))
done < "$dir/list"
[ $((pass + fail)) -gt 0 ] || { echo "FAIL snippets: none found"; fail=1; }
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
