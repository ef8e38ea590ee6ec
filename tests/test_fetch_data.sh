#!/bin/sh
# tests/test_fetch_data.sh - `make data` (examples/fetch_data.sh) on made-up
# sources in a scratch directory (DL_DATA_DIR, DL_DATASET_DIR): good files
# are unpacked and checked; a truncated .gz, a wrong size or a missing file
# is an error naming the file, with no temporaries left and no "ready"; a
# partly written earlier copy is redone; the apt-get download fallback (a
# fake apt-get and dpkg) leaves no .deb or unpacked package behind.
# Prints "N passed, M failed"; exit status 1 on a failure.
cd "$(dirname "$0")/.." || exit 1
T=build/test_fetch_data.tmp
F=examples/fetch_data.sh
rm -rf "$T" && mkdir -p "$T/good" || { echo "cannot create $T"; echo "0 passed, 1 failed"; exit 1; }
pass=0 fail=0
ok() { pass=$((pass + 1)); }
no() { fail=$((fail + 1)); echo "FAIL $*"; }
check() {
    d=$1
    shift
    if "$@"; then ok; else no "$d"; fi
}
# fetch STATUS REGEX [VAR=VALUE...]: runs fetch_data.sh with the environment given
fetch() {
    want=$1 pat=$2
    shift 2
    out=$(env "$@" sh "$F" 2>&1)
    rc=$?
    if [ "$rc" = "$want" ] && printf '%s\n' "$out" | grep -qE -- "$pat"; then ok
    else no "fetch_data.sh with $*: expected status $want and /$pat/; got $rc:"; printf '%s\n' "$out" | sed 's/^/    /'; fi
}
files="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"
size() {
    case $1 in
        train-images-idx3-ubyte) echo 47040016 ;; train-labels-idx1-ubyte) echo 60008 ;;
        t10k-images-idx3-ubyte) echo 7840016 ;; t10k-labels-idx1-ubyte) echo 10008 ;;
    esac
}
ready() {  # $1/fashion-mnist holds the four files with their exact sizes, and nothing else
    for f in $files; do [ "$(wc -c < "$1/fashion-mnist/$f")" -eq "$(size $f)" ] || return 1; done
    [ "$(ls -A "$1/fashion-mnist" | wc -l)" -eq 4 ]
}
# sources with the right uncompressed sizes (zeros compress to almost nothing)
for f in $files; do head -c "$(size $f)" /dev/zero | gzip -1 > "$T/good/$f.gz"; done

# good files
fetch 0 "^data: $T/d1/fashion-mnist ready$" DL_DATA_DIR="$T/d1" DL_DATASET_DIR="$T/good"
check "good: four files of the right sizes, nothing else" ready "$T/d1"
fetch 0 "^data: $T/d1/fashion-mnist ready$" DL_DATA_DIR="$T/d1" DL_DATASET_DIR="$T/none"
check "ready again without a source" ready "$T/d1"

# a truncated .gz
mkdir -p "$T/trunc"
cp "$T/good/"*.gz "$T/trunc/"
head -c 20000 "$T/good/train-images-idx3-ubyte.gz" > "$T/trunc/train-images-idx3-ubyte.gz"
fetch 1 "^data: $T/trunc/train-images-idx3-ubyte.gz is damaged or truncated \(gzip -t failed\)" \
    DL_DATA_DIR="$T/d2" DL_DATASET_DIR="$T/trunc"
check "truncated: no 'ready'" eval "! printf '%s\n' \"\$out\" | grep -q ready"
check "truncated: no temporaries or partial files" [ -z "$(ls -A "$T/d2/fashion-mnist")" ]

# a valid gzip of the wrong size
mkdir -p "$T/short"
cp "$T/good/"*.gz "$T/short/"
head -c 1000 /dev/zero | gzip > "$T/short/t10k-labels-idx1-ubyte.gz"
fetch 1 "^data: $T/short/t10k-labels-idx1-ubyte.gz holds 1000 bytes of t10k-labels-idx1-ubyte, expected 10008" \
    DL_DATA_DIR="$T/d3" DL_DATASET_DIR="$T/short"
check "wrong size: no temporaries" eval "! ls -A '$T/d3/fashion-mnist' | grep -q tmp"
check "wrong size: not installed" [ ! -e "$T/d3/fashion-mnist/t10k-labels-idx1-ubyte" ]

# a missing file; a missing source directory
mkdir -p "$T/three"
cp "$T/good/"*.gz "$T/three/"
rm "$T/three/t10k-images-idx3-ubyte.gz"
fetch 1 "^data: $T/three has neither t10k-images-idx3-ubyte.gz nor t10k-images-idx3-ubyte" \
    DL_DATA_DIR="$T/d4" DL_DATASET_DIR="$T/three"
fetch 1 "^data: DL_DATASET_DIR=$T/nowhere is not a directory" DL_DATA_DIR="$T/d4" DL_DATASET_DIR="$T/nowhere"

# an earlier copy cut short is redone (it used to count as ready)
head -c 100 /dev/zero > "$T/d1/fashion-mnist/train-images-idx3-ubyte"
fetch 0 "^data: $T/d1/fashion-mnist ready$" DL_DATA_DIR="$T/d1" DL_DATASET_DIR="$T/good"
check "a short copy is replaced" ready "$T/d1"

# the apt-get download fallback, with a fake apt-get and dpkg
mkdir -p "$T/bin"
cat > "$T/bin/apt-get" <<EOF
#!/bin/sh
[ "\$1 \$2" = "download dataset-fashion-mnist" ] || exit 100
head -c 1000 /dev/zero > dataset-fashion-mnist_0.0.1-1_all.deb
EOF
cat > "$T/bin/dpkg" <<EOF
#!/bin/sh
[ "\$1" = -x ] && [ -f "\$2" ] || exit 2
mkdir -p "\$3/usr/share/datasets/fashion-mnist" && cp "$PWD/$T/good/"*.gz "\$3/usr/share/datasets/fashion-mnist/"
EOF
chmod +x "$T/bin/apt-get" "$T/bin/dpkg"
fetch 0 "^data: $T/d5/fashion-mnist ready$" PATH="$PWD/$T/bin:$PATH" DL_DATA_DIR="$T/d5" DL_DEBIAN_DATASET_DIR="$T/none"
check "apt-get fallback: the files" ready "$T/d5"
check "apt-get fallback: no .deb or package tree left" [ "$(ls -A "$T/d5")" = fashion-mnist ]
printf '#!/bin/sh\necho "E: no network" >&2\nexit 100\n' > "$T/bin/apt-get"
fetch 1 "^data: apt-get download failed" PATH="$PWD/$T/bin:$PATH" DL_DATA_DIR="$T/d6" DL_DEBIAN_DATASET_DIR="$T/none"
check "apt-get failed: nothing left but the empty output directory" [ "$(ls -A "$T/d6")" = fashion-mnist ]

rm -rf "$T"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
