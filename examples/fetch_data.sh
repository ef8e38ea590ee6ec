#!/bin/sh
# Puts Fashion-MNIST (uncompressed IDX files) in $DL_DATA_DIR/fashion-mnist
# (default data/fashion-mnist). Takes the .gz files from $DL_DATASET_DIR
# if set, else from Debian's dataset-fashion-mnist: $DL_DEBIAN_DATASET_DIR
# (default /usr/share/datasets/fashion-mnist) when the package is installed,
# else the package fetched with apt-get download and unpacked with dpkg -x
# (no root needed).
# Every file is checked: gzip integrity (gzip -t) and its exact uncompressed
# size. A failure names the file, exits non-zero and leaves no temporaries;
# the downloaded .deb and its unpacked tree are removed when done.
set -u
data=${DL_DATA_DIR:-data}
out=$data/fashion-mnist
files="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"
pkg=""      # a temporary directory for the Debian package, when one is fetched
tmp=""      # the file being written

size_of() {  # the expected uncompressed size of a file
    case $1 in
        train-images-idx3-ubyte) echo 47040016 ;;
        train-labels-idx1-ubyte) echo 60008 ;;
        t10k-images-idx3-ubyte) echo 7840016 ;;
        t10k-labels-idx1-ubyte) echo 10008 ;;
    esac
}
cleanup() {
    [ -n "$tmp" ] && rm -f "$tmp"
    [ -n "$pkg" ] && rm -rf "$pkg"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
fail() { echo "data: $*" >&2; exit 1; }
have() {  # $1 holds every file with its exact size
    for f in $files; do
        [ -f "$1/$f" ] && [ "$(wc -c < "$1/$f")" -eq "$(size_of "$f")" ] || return 1
    done
}

if have "$out"; then echo "data: $out ready"; exit 0; fi
mkdir -p "$out" || fail "cannot create $out"

if [ -n "${DL_DATASET_DIR:-}" ]; then
    src=$DL_DATASET_DIR
    [ -d "$src" ] || fail "DL_DATASET_DIR=$src is not a directory"
else
    src=${DL_DEBIAN_DATASET_DIR:-/usr/share/datasets/fashion-mnist}
    if [ ! -f "$src/train-images-idx3-ubyte.gz" ]; then
        echo "data: fetching the Debian package dataset-fashion-mnist"
        pkg=$(mktemp -d "$data/pkg.XXXXXX") || fail "cannot create a temporary directory in $data"
        (cd "$pkg" && apt-get download dataset-fashion-mnist) ||
            fail "apt-get download failed; install dataset-fashion-mnist or put the four Fashion-MNIST .gz files in a directory and set DL_DATASET_DIR to it"
        dpkg -x "$pkg"/dataset-fashion-mnist_*.deb "$pkg/root" || fail "dpkg -x could not unpack $(ls "$pkg"/*.deb)"
        rm -f "$pkg"/*.deb
        src=$pkg/root/usr/share/datasets/fashion-mnist
    fi
fi

for f in $files; do
    want=$(size_of "$f")
    tmp=$out/.$f.tmp.$$
    if [ -f "$src/$f.gz" ]; then
        gzip -t "$src/$f.gz" 2>/dev/null || fail "$src/$f.gz is damaged or truncated (gzip -t failed); fetch it again"
        gzip -dc "$src/$f.gz" > "$tmp" || fail "cannot unpack $src/$f.gz into $out"
        what=$src/$f.gz
    elif [ -f "$src/$f" ]; then
        cp "$src/$f" "$tmp" || fail "cannot copy $src/$f into $out"
        what=$src/$f
    else
        fail "$src has neither $f.gz nor $f"
    fi
    got=$(wc -c < "$tmp")
    [ "$got" -eq "$want" ] || fail "$what holds $got bytes of $f, expected $want; not Fashion-MNIST, or truncated"
    mv "$tmp" "$out/$f" || fail "cannot move $f into $out"
    tmp=""
done
echo "data: $out ready"
