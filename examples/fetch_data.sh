#!/bin/sh
# Puts Fashion-MNIST (uncompressed IDX files) in data/fashion-mnist/.
# Looks in /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist),
# else fetches that package with apt-get download and unpacks it with dpkg -x
# (no root needed), then gunzips.
set -e
out=data/fashion-mnist
files="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"
have=1
for f in $files; do [ -s "$out/$f" ] || have=0; done
[ $have = 1 ] && { echo "data: $out ready"; exit 0; }
mkdir -p "$out"
src=${DL_DATASET_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -s "$src/train-images-idx3-ubyte.gz" ]; then
    src=data/pkg/usr/share/datasets/fashion-mnist
    if [ ! -s "$src/train-images-idx3-ubyte.gz" ]; then
        echo "data: fetching the Debian package dataset-fashion-mnist"
        mkdir -p data/pkg
        (cd data && apt-get download dataset-fashion-mnist) || {
            echo "data: apt-get download failed; install dataset-fashion-mnist or put the four"
            echo "      Fashion-MNIST .gz files in $out"; exit 1; }
        dpkg -x data/dataset-fashion-mnist_*.deb data/pkg
    fi
fi
for f in $files; do
    if [ -s "$src/$f.gz" ]; then gunzip -c "$src/$f.gz" > "$out/$f.tmp" && mv "$out/$f.tmp" "$out/$f"
    elif [ -s "$src/$f" ]; then cp "$src/$f" "$out/$f"
    else echo "data: $src has no $f"; exit 1; fi
done
echo "data: $out ready"
