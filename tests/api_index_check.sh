#!/bin/sh
# tests/api_index_check.sh [dl.h] - the API INDEX in dl.h's doc block lists
# every public name of the header, one line each, in declaration order.
# Public names: each DL_API function, each typedef'd dl_ struct, enum and
# function-pointer type, each DL_ macro (not dl__/DL__ internals), between
# `#define DL_H` and `#endif /* DL_H */`. An index line is "       name  text"
# (7 spaces) between "   API INDEX" and the end of the doc block.
# One check per public name (listed), one per index entry (it still exists),
# one for the order; prints "N passed, M failed".
h=${1:-dl.h}
[ -r "$h" ] || { echo "FAIL api_index_check: cannot read $h"; echo "0 passed, 1 failed"; exit 1; }
awk '
FNR == 1 { file++ }
# pass 1: the declarations
file == 1 && /^#endif \/\* DL_H \*\// { done = 1 }
file == 1 && !done {
    if (!started) { if ($0 ~ /^#define DL_H$/) started = 1; next }
    n = ""
    if ($0 ~ /^#define DL_[A-Z0-9_]+/) { n = $2; sub(/\(.*/, "", n) }
    else if ($0 ~ /^typedef (struct|enum) dl_[a-z0-9_]+/) { n = $3; sub(/[^a-z0-9_].*/, "", n) }
    else if ($0 ~ /^typedef .*\(\*dl_[a-z0-9_]+\)/) { n = $0; sub(/.*\(\*/, "", n); sub(/\).*/, "", n) }
    else if ($0 ~ /^DL_API/) { n = $0; sub(/\(.*/, "", n); sub(/.*[ *]/, "", n) }
    if (n != "" && n !~ /^(dl__|DL__)/ && !(n in decl)) { decl[n] = ++nd; dname[nd] = n }
    next
}
# pass 2: the index in the doc block
file == 2 && /^   API INDEX/ { on = 1; next }
file == 2 && on && /^\*\// { on = 0; stop = 1 }
file == 2 && on && !stop && /^       [A-Za-z_]/ { ni++; iname[ni] = $1; idx[$1] = ni }
END {
    pass = fail = 0
    if (nd == 0 || ni == 0) { printf "FAIL api_index_check: %d declarations, %d index lines in %s\n", nd, ni, FILENAME; fail++ }
    for (i = 1; i <= nd; i++)
        if (dname[i] in idx) pass++
        else { printf "FAIL api_index_check: %s is declared in dl.h but missing from the API INDEX\n", dname[i]; fail++ }
    for (i = 1; i <= ni; i++)
        if (iname[i] in decl) pass++
        else { printf "FAIL api_index_check: the API INDEX lists %s, which dl.h does not declare\n", iname[i]; fail++ }
    bad = 0
    for (i = 1; i <= nd && i <= ni && !bad; i++)
        if (dname[i] != iname[i]) {
            printf "FAIL api_index_check: entry %d of the API INDEX is %s, the declarations have %s there\n", i, iname[i], dname[i]
            bad = 1
        }
    if (bad || nd != ni) fail++; else pass++
    printf "%d passed, %d failed\n", pass, fail
    exit fail ? 1 : 0
}' "$h" "$h"
