#!/bin/sh
# bench/gpu_report.sh [OUTDIR] - what a machine with an NVIDIA GPU can check
# that the CPU cannot, in the order that spends a short loan of one best, into
# one log: OUTDIR/report.txt (default build/gpu-report), with
# OUTDIR/resnet18_cuda.bin (PyTorch's GPU error for test_resnet18; copy it to
# tests/golden/ and commit it).
#
#   1. the GPU, the driver, PyTorch
#   2. make cuda for this GPU's architecture only (CUDA_ARCH from nvidia-smi)
#   3. make test-cuda-all (the summary lines and every failure)
#   4. tests/golden/gen_resnet18.py --cuda, then test_resnet18 on cuda:0 again
#   5. make bench-cuda (every *_cuda case against PyTorch in the same run)
#   6. the few-channel convolutions three ways: dl.h's side of the LeNet
#      cases with DL_CONV_DIRECT=1, 2 and 0 (the direct sums' shared-memory
#      tiles, their per-element kernels, im2col + cuBLAS)
#   7. DL_PROFILE=1 tables of step_lenet_cuda, step_lenet_bn_cuda,
#      step_resnet_small_cuda and step_resnet18_cuda
#   8. make run DEVICE=cuda, eager and CAPTURE=1, with and without
#      TensorBoard (wall time; needs data/)
#   9. with BASE_DIR (an older checkout: dl.h, dl_cuda.cuh and examples/*.h,
#      e.g. `git worktree add DIR REV`): bench built with those headers
#      against this one, dl.h's side of the step cases alternating (an A/B
#      of what changed in between, on the same GPU in the same run)
#  10. ncu: each kernel's GPU time in the small nets' captured steps (the
#      eager warm-up step, the capture's run, one replay), to see where a
#      replay's time goes
#  11. make test-nccl, with the system's NCCL or else the one in PyTorch's
#      wheel (nvidia.nccl: a namespace package, so its __path__, not
#      __file__; a libnccl.so link to libnccl.so.2 made beside it if none)
#  12. ncu: the convolution tiles' shared-memory bank conflicts (loads and
#      their wavefronts) and time in LeNet's and LeNet-BN's captured steps,
#      to check the odd row stride's model (docs/cuda.md)
#  13. compute-sanitizer's memcheck, racecheck and synccheck over
#      test_cuda's groups of block kernels (--only: the tiles, the staged
#      column sums, batch norm's pass, the class loss), which only ran on
#      emulated devices before: out-of-range and misaligned accesses, shared
#      memory hazards between a block's threads, barriers not all reach
#
# Each step has a time limit (STEP_LIMIT seconds, default 300) and its wall
# time in the log; a step that fails or runs out leaves its output and the
# rest go on. SKIP="3 5" leaves steps out. Environment passed to make as
# usual (NVCC, CUDA_ARCH, HAVE_CUDNN, CUDA_LIBS).
#
# PLAN=short: for a loan of 15 minutes, in one device call of about 8
# (a fresh machine's start counts too). No make: the programs come built
# (bench/gpu_kit.sh, run where there is no GPU: KIT=DIR, default
# build/gpu-kit, named in the device's carry list), or else only those six
# are built here. Steps 1, 2 (the kit: its commit, the libraries it needed
# found), 3 (test_cuda; test_conv, test_nn_ops, test_golden and
# test_capture on cuda:0, test_conv again with the per-element kernels,
# test_capture with DL_CUDA_REPLAY_ARGS=0 and with DL_CUDA_PDL=1),
# 5 (the bench's step_*_cuda, conv1 and batch-norm cases against PyTorch),
# 6 (the LeNet cases three ways, and with the kit's bench-ct2 and
# bench-ct1: the tiles with 2 and 1 channels a thread), 9 (the step cases with this tree's
# bench, with DL_CUDA_REPLAY_ARGS=0, with DL_CUDA_PDL=1 (programmatic
# dependent launches), with DL_CUDA_BLAS_WS=0 (cuBLAS without a
# workspace), and alternating with them the kit's
# bench-base, built by
# gpu_kit.sh BASE=REV from REV's headers, and bench-x1 (and bench-x2),
# dl_cuda.cuh's measurement experiments DL__CU_EXP), 10 (ncu) and 13
# (memcheck and racecheck only); STEP_LIMIT 150 and SKIP "4 7 8 11 12"
# unless given.
set -u
cd "$(dirname "$0")/.." || exit 1
OUTDIR=${1:-build/gpu-report}
PLAN=${PLAN:-full}
case $PLAN in
    full) LIMIT=${STEP_LIMIT:-300}; SKIP=${SKIP:-} ;;
    short) LIMIT=${STEP_LIMIT:-150}; SKIP=${SKIP-4 7 8 11 12} ;;
    *) echo "gpu_report: PLAN=$PLAN: must be full (the default) or short (a 15-minute loan)" >&2; exit 2 ;;
esac
KIT=${KIT:-build/gpu-kit}
CONVCASES="conv1_fwdbwd_cuda conv2_fwdbwd_cuda step_lenet_cuda step_lenet_bn_cuda step_lenet_graph_cuda
           step_lenet_bn_graph_cuda step_resnet_small_cuda step_resnet_small_graph_cuda"
SANTOOLS="memcheck racecheck synccheck" SANLIMIT=200
if [ "$PLAN" = short ]; then
    CONVCASES="conv1_fwdbwd_cuda step_lenet_cuda step_lenet_graph_cuda step_lenet_bn_graph_cuda"
    SANTOOLS="memcheck racecheck" SANLIMIT=70
fi
KITBINS="test_cuda test_conv test_nn_ops test_golden test_capture bench"
J=$(nproc 2>/dev/null || echo 4)
mkdir -p "$OUTDIR" || exit 1
LOG=$OUTDIR/report.txt
: >"$LOG"

say() { printf '%s\n' "$*" | tee -a "$LOG"; }

# step N "title" command...: runs it under the limit, output to the log
step() {
    n=$1 title=$2
    shift 2
    case " $SKIP " in *" $n "*) say "## $n. $title: skipped (SKIP)"; return 0 ;; esac
    say "## $n. $title"
    t0=$(date +%s)
    timeout "$LIMIT" sh -c "$*" >>"$LOG" 2>&1
    rc=$?
    say "(step $n: exit $rc, $(($(date +%s) - t0)) s)"
    say ""
}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    say "gpu_report: no NVIDIA GPU here (nvidia-smi finds none); nothing to do"
    exit 1
fi
if [ -z "${CUDA_ARCH:-}" ]; then
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
    case $cc in
        [0-9][0-9] | [0-9][0-9][0-9]) CUDA_ARCH="-gencode arch=compute_$cc,code=[sm_$cc,compute_$cc]" ;;
        *) CUDA_ARCH= ;;   # the Makefile's default
    esac
fi
[ -n "$CUDA_ARCH" ] && export CUDA_ARCH
say "# gpu_report $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), PLAN=$PLAN"
say ""

# PLAN=short: the kit's programs into build/cuda (the tests read and write
# under build/ too), if they start; each library the loader does not find
# is looked for beside CUDA and in PyTorch's wheels (nvidia/*/lib)
KITNOTE="no kit ($KIT/test_cuda absent): the six programs built here"
if [ "$PLAN" = short ] && [ -x "$KIT/test_cuda" ]; then
    for lib in $(ldd "$KIT/test_cuda" "$KIT/bench" 2>/dev/null | awk '/not found/ { print $1 }' | sort -u); do
        f=$(find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -n 1)
        [ -n "$f" ] && LD_LIBRARY_PATH=$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    done
    export LD_LIBRARY_PATH
    mkdir -p build/cuda || exit 1
    for p in $KITBINS; do cp "$KIT/$p" build/cuda/ || exit 1; done
    for p in bench-base bench-x1 bench-x2 bench-ct1 bench-ct2; do [ -x "$KIT/$p" ] && cp "$KIT/$p" build/cuda/; done
    [ -x "$KIT/bench-x2" ] || rm -f build/cuda/bench-x2   # (an older kit's)
    if build/cuda/test_cuda -q --only colsum >"$OUTDIR/kit-smoke.txt" 2>&1; then
        KITNOTE="the kit's programs ($KIT, built at $(tr '\n' ' ' <"$KIT/COMMIT" 2>/dev/null)), LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    else
        KITNOTE="the kit's test_cuda did not start or failed ($(tail -n 3 "$OUTDIR/kit-smoke.txt" | tr '\n' ' ')): the six programs built here"
        for p in $KITBINS bench-base bench-x1 bench-x2 bench-ct1 bench-ct2; do rm -f "build/cuda/$p"; done
    fi
fi

step 1 "machine" "nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv;
    nvcc --version | tail -n 2; python3 -c 'import torch; print(\"torch\", torch.__version__, torch.version.cuda,
    \"cudnn\", torch.backends.cudnn.version())' || true; echo \"CUDA_ARCH=${CUDA_ARCH:-default}\""
if [ "$PLAN" = short ]; then
    step 2 "the programs: $KITNOTE" \
        "for p in $KITBINS; do [ -x build/cuda/\$p ] || need=\"\${need:-} build/cuda/\$p\"; done
         [ -z \"\${need:-}\" ] || make -j$J \$need 2>&1 | grep -E 'error|warning|Error'
         test -x build/cuda/test_cuda && test -x build/cuda/bench"
    step 3 "test_cuda, then test_conv, test_nn_ops, test_golden, test_capture on cuda:0 (exact fp32), test_conv per-element" \
        "tests/run.sh build/cuda/test_cuda --tag @cuda:0 --env DL_DEVICE=cuda:0 --env DL_ALLOW_TF32_CONV=0 \
             build/cuda/test_conv build/cuda/test_nn_ops build/cuda/test_golden build/cuda/test_capture \
             --tag @cuda:0-elem --env DL_DEVICE=cuda:0 --env DL_ALLOW_TF32_CONV=0 --env DL_CONV_DIRECT=2 build/cuda/test_conv \
             --tag @cuda:0-copies --env DL_DEVICE=cuda:0 --env DL_CUDA_REPLAY_ARGS=0 build/cuda/test_capture \
             --tag @cuda:0-pdl --env DL_DEVICE=cuda:0 --env DL_CUDA_PDL=1 build/cuda/test_capture \
             2>&1 | grep -E 'passed|FAIL|WRONG|SKIP|error'"
else
    step 2 "make cuda (-j$J)" "make -j$J cuda 2>&1 | grep -E 'error|warning|Error' ; test -x build/cuda/test_cuda"
    step 3 "make test-cuda-all" "make test-cuda-all 2>&1 | grep -E 'passed|FAIL|WRONG|SKIP|error'"
fi
step 4 "test_resnet18: PyTorch's GPU float32 error, then the test on cuda:0" \
    "python3 tests/golden/gen_resnet18.py --cuda '$OUTDIR/resnet18_cuda.bin' &&
     cp '$OUTDIR/resnet18_cuda.bin' tests/golden/resnet18_cuda.bin &&
     DL_DEVICE=cuda:0 DL_ALLOW_TF32_CONV=0 build/cuda/test_resnet18 2>&1 | grep -E 'passed|FAIL'"
if [ "$PLAN" = short ]; then
    step 5 "bench: the step cases, conv1 and batch norm against PyTorch (bench/run.sh, no make)" \
        "CASES='step_*_cuda conv1_fwdbwd_cuda bn2d_fwdbwd_cuda' THREADS=1 DL_CUDA=build/cuda/bench MAKE=true sh bench/run.sh"
else
    step 5 "make bench-cuda" "make bench-cuda"
fi
step 6 "few-channel convolutions: DL_CONV_DIRECT=1, 2 then 0, then the kit's tiles with 2 and 1 channels a thread (dl.h's ms)" \
    "for c in $CONVCASES; do
         a=\$(DL_CONV_DIRECT=1 build/cuda/bench \$c 1 2>/dev/null | awk '{print \$3}')
         e=\$(DL_CONV_DIRECT=2 build/cuda/bench \$c 1 2>/dev/null | awk '{print \$3}')
         b=\$(DL_CONV_DIRECT=0 build/cuda/bench \$c 1 2>/dev/null | awk '{print \$3}')
         t2=\$([ -x build/cuda/bench-ct2 ] && build/cuda/bench-ct2 \$c 1 2>/dev/null | awk '{print \$3}')
         t1=\$([ -x build/cuda/bench-ct1 ] && build/cuda/bench-ct1 \$c 1 2>/dev/null | awk '{print \$3}')
         printf '%-30s tiles %-10s per-element %-10s im2col %-10s ct2 %-10s ct1 %s\n' \$c \"\$a\" \"\$e\" \"\$b\" \
             \"\${t2:-n/a}\" \"\${t1:-n/a}\"; done"
step 7 "DL_PROFILE=1: step_lenet_cuda, step_lenet_bn_cuda, step_resnet_small_cuda, step_resnet18_cuda" \
    "for c in step_lenet_cuda step_lenet_bn_cuda step_resnet_small_cuda step_resnet18_cuda; do
         DL_PROFILE=1 build/cuda/bench \$c 1 2>&1 | head -n 30; done"
step 8 "make run DEVICE=cuda, eager then CAPTURE=1, then both without TensorBoard (LOGDIR=)" \
    "test -d data/fashion-mnist || echo 'no data/fashion-mnist: make run will try to fetch it';
     /usr/bin/time -p make -s run DEVICE=cuda 2>&1 | tail -n 5;
     /usr/bin/time -p make -s run DEVICE=cuda CAPTURE=1 2>&1 | tail -n 5;
     /usr/bin/time -p make -s run DEVICE=cuda LOGDIR= 2>&1 | tail -n 4;
     /usr/bin/time -p make -s run DEVICE=cuda CAPTURE=1 LOGDIR= 2>&1 | tail -n 4"
if [ "$PLAN" = short ]; then
    step 9 "A/B: this tree's bench, with DL_CUDA_REPLAY_ARGS=0 (copies), with DL_CUDA_PDL=1 (pdl), with DL_CUDA_BLAS_WS=0 (nows: no split-K GEMMs), the kit's bench-base ($(cut -c1-12 "$KIT/BASE" 2>/dev/null || echo none)'s headers), bench-x1 (no per-run values), bench-x2 where a kit has it (no gradient sums); dl.h's ms, 3 runs each, alternating" \
        "for c in step_mlp_graph_cuda step_lenet_graph_cuda step_lenet_bn_graph_cuda step_resnet_small_graph_cuda step_lenet_cuda; do
             for r in 1 2 3; do
                 line=\$(printf '%-30s' \$c)
                 for b in bench bench:copies bench:pdl bench:nows bench-base bench-x1 bench-x2; do
                     [ -x build/cuda/\${b%:*} ] || continue
                     a=1; p=0; w=32
                     case \$b in *:copies) a=0 ;; *:pdl) p=1 ;; *:nows) w=0 ;; esac
                     v=\$(DL_CUDA_REPLAY_ARGS=\$a DL_CUDA_PDL=\$p DL_CUDA_BLAS_WS=\$w build/cuda/\${b%:*} \$c 1 2>/dev/null |
                         awk '{print \$3}')
                     line=\"\$line \$b \${v:-n/a}\"
                 done
                 echo \"\$line\"
             done; done"
else
    step 9 "A/B: bench with BASE_DIR's headers, then this tree's (dl.h's ms, 3 runs each)" \
        "test -f '${BASE_DIR:-/nonexistent}/dl.h' || { echo 'BASE_DIR unset or without dl.h: nothing to compare'; exit 0; }
         make -s B=build/base NVCC='${NVCC:-nvcc} -I${BASE_DIR:-.}' build/base/cuda/bench 2>&1 | grep -E 'error' ;
         for c in step_mlp_cuda step_lenet_cuda step_lenet_bn_cuda step_resnet_small_cuda step_resnet18_cuda \
                  step_mlp_graph_cuda step_lenet_graph_cuda step_lenet_bn_graph_cuda step_resnet_small_graph_cuda; do
             for r in 1 2 3; do
                 a=\$(build/base/cuda/bench \$c 1 2>/dev/null | awk '{print \$3}')
                 b=\$(build/cuda/bench \$c 1 2>/dev/null | awk '{print \$3}')
                 printf '%-30s base %-10s this %s\n' \$c \"\$a\" \"\$b\"
             done; done"
fi
step 10 "ncu: kernel times (us) of step_{mlp,lenet,lenet_bn}_graph_cuda, then the MLP's with DL_CUDA_BLAS_WS=0: warm-up, capture's run, replay" \
    "command -v ncu >/dev/null || { echo 'no ncu'; exit 0; }
     for c in step_mlp_graph_cuda step_lenet_graph_cuda step_lenet_bn_graph_cuda step_mlp_graph_cuda:nows; do
         echo \"## \$c\"
         w=32; case \$c in *:nows) w=0 ;; esac
         DL_CUDA_BLAS_WS=\$w ncu --csv --print-units base --metrics gpu__time_duration.sum build/cuda/bench \${c%:*} 1 \
             --warmup 0 --reps 1 2>/dev/null |
         python3 -c 'import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 14 and r[12] == \"gpu__time_duration.sum\"]
for r in rows: print(\"%6s %9.2f  %s\" % (r[0], float(r[14].replace(\",\", \"\")) / 1e3, r[4][:90]))
print(\"kernels\", len(rows), \"total us\", round(sum(float(r[14].replace(\",\", \"\")) for r in rows) / 1e3, 1))'
     done"
step 11 "make test-nccl" \
    "if ! echo '#include <nccl.h>' | \${NVCC:-nvcc} -x cu -E - >/dev/null 2>&1; then
         NC=\$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])') || { echo 'no NCCL: none beside CUDA, none in PyTorch'; exit 0; }
         [ -e \$NC/lib/libnccl.so ] || ln -s libnccl.so.2 \$NC/lib/libnccl.so
         export LD_LIBRARY_PATH=\$NC/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} NVCC=\"\${NVCC:-nvcc} -I\$NC/include -L\$NC/lib\"
     fi
     make test-nccl NVCC=\"\${NVCC:-nvcc}\" 2>&1 | grep -E 'passed|FAIL|SKIP|error'"
step 12 "ncu: shared-memory bank conflicts of the conv tiles (LeNet, LeNet-BN replays)" \
    "command -v ncu >/dev/null || { echo 'no ncu'; exit 0; }
     for c in step_lenet_graph_cuda step_lenet_bn_graph_cuda; do
         echo \"## \$c\"
         ncu --kernel-name regex:dl__cu_tile_k --print-units base \
             --metrics gpu__time_duration.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum \
             build/cuda/bench \$c 1 --warmup 0 --reps 1 2>/dev/null | grep -E 'dl__cu_tile_k|duration|conflicts|wavefronts'
     done"
step 13 "compute-sanitizer: $SANTOOLS of the block kernels (test_cuda --only)" \
    "command -v compute-sanitizer >/dev/null || { echo 'no compute-sanitizer'; exit 0; }
     for t in $SANTOOLS; do
         echo \"## \$t\"
         timeout $SANLIMIT compute-sanitizer --tool \$t --error-exitcode 3 --print-limit 20 build/cuda/test_cuda -q \
             --only conv_tiles,conv_tiles_fn,colsum,chan_sum,fused_ce,ce_bias,bn_bias,conv_bn_bias,bn_relu_pool,bn_add_relu \
             >$OUTDIR/sanitizer-\$t.txt 2>&1
         rc=\$?
         grep -E 'passed|FAIL|ERROR SUMMARY|RACECHECK SUMMARY|Error|error|hazard|Invalid' $OUTDIR/sanitizer-\$t.txt | head -n 30
         echo \"(\$t: exit \$rc; 3: the tool found errors, 124: out of time; all in $OUTDIR/sanitizer-\$t.txt)\"
     done"
say "# done: $LOG"
