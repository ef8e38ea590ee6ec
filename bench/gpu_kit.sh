#!/bin/sh
# bench/gpu_kit.sh [DIR] - build here, where there is no GPU, the programs
# that a short loan of a GPU runs (bench/gpu_report.sh PLAN=short), so the
# loan spends none of its minutes compiling (make cuda took 127-143 s of
# them on an H200 with 16 cores).
#
# Builds test_cuda, test_conv, test_nn_ops, test_golden, test_capture and
# bench with nvcc for one architecture (CUDA_ARCH, default sm_90: the H100
# and H200) and portable host code (HAVE_NATIVE= : no -march=native, the
# GPU machine's processor may lack this one's instructions), under
# build/kit, then copies them, stripped, into DIR (default build/gpu-kit;
# build/ is ignored by git, so name DIR in the device's carry list). The
# programs link CUDA's runtime, cuBLAS and cuDNN dynamically: gpu_report.sh
# looks for any the GPU machine's loader does not find (in PyTorch's
# wheels too) and builds there after all if the kit does not start.
#
# BASE=REV also builds bench with that commit's dl.h, dl_cuda.cuh and
# examples/*.h (bench.c this tree's) as DIR/bench-base, so the loan times
# the step cases of both, alternating, on one GPU in one run (an A/B of
# what changed since REV; e.g. the last commit measured on a GPU).
set -u
cd "$(dirname "$0")/.." || exit 1
DIR=${1:-build/gpu-kit}
ARCH=${CUDA_ARCH:--gencode arch=compute_90,code=[sm_90,compute_90]}
J=$(nproc 2>/dev/null || echo 2)
KIT="test_cuda test_conv test_nn_ops test_golden test_capture bench"
command -v "${NVCC:-nvcc}" >/dev/null 2>&1 || { echo "gpu_kit: no nvcc here: the kit needs CUDA's compiler" >&2; exit 1; }
targets=
for p in $KIT; do targets="$targets build/kit/cuda/$p"; done
# shellcheck disable=SC2086
make -j"$J" B=build/kit HAVE_NATIVE= CUDA_ARCH="$ARCH" $targets || { echo "gpu_kit: the build failed" >&2; exit 1; }
mkdir -p "$DIR" || exit 1
for p in $KIT; do
    cp build/kit/cuda/$p "$DIR/$p" && strip "$DIR/$p" || { echo "gpu_kit: could not copy $p into $DIR" >&2; exit 1; }
done
# bench_as NAME FLAGS WHAT: bench built under build/kit-NAME with nvcc
# FLAGS added, as DIR/bench-NAME (WHAT: for the message if it fails)
bench_as() {
    rm -f "build/kit-$1/cuda/bench" "build/kit-$1/cuda/bench.o"
    make B="build/kit-$1" HAVE_NATIVE= CUDA_ARCH="$ARCH" NVCC="${NVCC:-nvcc} $2" "build/kit-$1/cuda/bench" ||
        { echo "gpu_kit: bench $3 did not build" >&2; exit 1; }
    cp "build/kit-$1/cuda/bench" "$DIR/bench-$1" && strip "$DIR/bench-$1" || exit 1
}
# bench-x1: bench with dl_cuda.cuh's measurement experiment DL__CU_EXP=1
# (a graph without its per-run values from the host), to time what they
# cost in a replay (its results are wrong; timing only). DL__CU_EXP=2's
# launches have gone from captured steps since (d5d2189): not built, which
# keeps the kit with the tree under the device's 64 MiB
bench_as x1 "-DDL__CU_EXP=1" "with DL__CU_EXP=1"
rm -f "$DIR/bench-x2"
# bench-ct1, bench-ct2: the convolution tiles with 1 or 2 channels a
# thread where the default sums 4 (more threads, fewer reads shared; the
# same bits), for gpu_report.sh's step 6
for x in 1 2; do bench_as ct$x "-DDL__CU_TILE_CT=$x" "with DL__CU_TILE_CT=$x"; done
rm -f "$DIR/bench-base" "$DIR/BASE"
if [ -n "${BASE:-}" ]; then
    src=build/kit-base-src
    rm -rf "$src" && mkdir -p "$src/examples" || exit 1
    for f in dl.h dl_cuda.cuh $(git ls-tree --name-only "$BASE" examples/ | grep '\.h$'); do
        git show "$BASE:$f" >"$src/$f" || { echo "gpu_kit: BASE=$BASE: no $f there" >&2; exit 1; }
    done
    bench_as base "-I$src" "with BASE=$BASE's headers"
    git rev-parse "$BASE" >"$DIR/BASE"
fi
git rev-parse HEAD >"$DIR/COMMIT" 2>/dev/null || echo unknown >"$DIR/COMMIT"
git diff --quiet HEAD -- dl.h dl_cuda.cuh tests bench examples 2>/dev/null || echo "(uncommitted changes)" >>"$DIR/COMMIT"
echo "gpu_kit: $(du -sh "$DIR" | cut -f1) in $DIR, built for: $ARCH"
echo "gpu_kit: on the GPU machine (device run, carry [\"$DIR\"]): PLAN=short KIT=$DIR bench/gpu_report.sh \$OUT"
