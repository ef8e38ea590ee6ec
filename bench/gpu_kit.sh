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
git rev-parse HEAD >"$DIR/COMMIT" 2>/dev/null || echo unknown >"$DIR/COMMIT"
git diff --quiet HEAD -- dl.h dl_cuda.cuh tests bench examples 2>/dev/null || echo "(uncommitted changes)" >>"$DIR/COMMIT"
echo "gpu_kit: $(du -sh "$DIR" | cut -f1) in $DIR, built for: $ARCH"
echo "gpu_kit: on the GPU machine (device run, carry [\"$DIR\"]): PLAN=short KIT=$DIR bench/gpu_report.sh \$OUT"
