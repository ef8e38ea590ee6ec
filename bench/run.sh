#!/bin/sh
# bench/run.sh - dl.h against PyTorch, case by case, at the same thread count.
#
#   bench/run.sh                         every case, threads 1 and 2
#   CASES="step_lenet_bn gemm" bench/run.sh      a subset (shell patterns work: 'step_*')
#   THREADS="2" bench/run.sh             other thread counts
#   ROUNDS=3 bench/run.sh                each time case's process pair 3 times,
#                                        keeping each side's best median (noisy machines)
#   CASES='*_cuda' THREADS=1 bench/run.sh   the GPU cases (make bench-cuda): dl.h's
#                                        build/cuda/bench against PyTorch on cuda:0,
#                                        each twice: NAME_cuda with PyTorch's defaults
#                                        (convolutions in TF32, matrix products exact),
#                                        NAME_cuda_fp32 with both sides in exact fp32
#   DL_PROFILE=1 CASES=step_resnet18 bench/run.sh   after each time or mem line,
#                                        dl.h's per-op table (dl_profile_print) and
#                                        torch.profiler's key_averages() table of the
#                                        timed reps (both sides slowed by their profilers)
#   (make bench / make bench CASES="..." THREADS="..." do the same)
#
# Builds build/bench (bench/bench.c), then for each case and thread count
# runs build/bench and `python3 bench/torch_bench.py` (PYTHON=... for another
# interpreter; for the *_cuda cases one `torch_bench.py --serve` process
# answers them all), one after the other with the same arguments, and prints
#     case threads dl torch ratio          ratio = dl / torch
# time cases in milliseconds (median of the reps after the warm-ups, inside
# each process), mem_* in MiB of peak resident memory, startup in seconds
# (median wall clock of whole processes: exec to exit, which follows the end
# of the first training step at once). A side that lacks the case, fails, or
# has no PyTorch prints n/a. The gemm case runs build/bench_gemm
# (bench/gemm.c, against OpenBLAS) and passes its lines through; so do the
# dist cases (allreduce bandwidth against the copy bound on 2 and 4 CPU
# devices, a data-parallel LeNet-BN step on 1 and 2 devices), which have no
# PyTorch side.
#
# Capture and replay: a *_graph case is its step captured once and
# replayed (dl_capture_begin/end, dl_replay). On the GPU (*_graph_cuda) it
# runs against PyTorch's torch.cuda.CUDAGraph replay; on the CPU, where
# PyTorch has no graph replay, its line compares dl.h's replay with dl.h's
# eager step (the case without _graph) and says so: "dl.h eager" in place
# of torch, ratio = replay / eager (below 1: the replay is faster).
#
# To add a case: one line in TABLE below, a row in bench.c's g_cases and an
# entry in torch_bench.py's CASES (a kind other than time/mem/startup/gemm
# needs a branch in run_case).
set -u -f   # no pathname expansion: CASES holds patterns
cd "$(dirname "$0")/.." || exit 1
MAKE=${MAKE:-make}
PYTHON=${PYTHON:-python3}
THREADS=${THREADS:-1 2}
CASES=${CASES:-}
ROUNDS=${ROUNDS:-1}
# the settings: whole numbers (a bad one measured nothing and said so only as n/a)
for t in $THREADS; do
    case $t in
        '' | *[!0-9]* | 0) echo "bench: THREADS=\"$THREADS\": each must be a whole number from 1 to 1024" >&2; exit 2 ;;
    esac
    [ "$t" -le 1024 ] || { echo "bench: THREADS=\"$THREADS\": each must be a whole number from 1 to 1024" >&2; exit 2; }
done
[ -n "$THREADS" ] || { echo "bench: THREADS is empty: give thread counts, e.g. THREADS=\"1 2\"" >&2; exit 2; }
case $ROUNDS in
    '' | *[!0-9]* | 0) echo "bench: ROUNDS=$ROUNDS: must be a whole number >= 1" >&2; exit 2 ;;
esac
DL=build/bench
DL_CUDA=${DL_CUDA:-build/cuda/bench}   # the nvcc build, for the *_cuda cases
TORCH="bench/torch_bench.py"

# name               kind     warmup  reps (mem: training steps)
TABLE='
gemm                 gemm     -       -
conv1_fwdbwd         time     3       11
conv2_fwdbwd         time     3       11
bn2d_fwdbwd          time     3       11
maxpool_fwdbwd       time     3       11
linear_fwdbwd        time     3       11
add_sync             time     10      101
matmul200            time     5       51
step_mlp             time     3       11
step_lenet           time     3       11
step_lenet_bn        time     3       11
step_resnet_small    time     2       7
step_resnet18        time     1       3
step_mlp16           time     10      101
step_mlp_graph       graph    3       11
step_mlp16_graph     graph    10      101
step_lenet_graph     graph    3       11
step_lenet_bn_graph  graph    3       11
step_resnet_small_graph graph 2       7
add_sync_cuda        time     20      201
matmul200_cuda       time     20      201
conv1_fwdbwd_cuda    time     5       51
bn2d_fwdbwd_cuda     time     5       51
linear_fwdbwd_cuda   time     5       51
step_mlp_cuda        time     10      51
step_lenet_cuda      time     10      51
step_lenet_bn_cuda   time     10      51
step_resnet_small_cuda time   5       21
step_resnet18_cuda   time     5       21
step_mlp_graph_cuda  time     20      201
step_lenet_graph_cuda time    20      201
step_lenet_bn_graph_cuda time 20      201
step_resnet_small_graph_cuda time 10  51
mem_lenet_bn         mem      -       20
mem_resnet_small     mem      -       3
startup              startup  -       7
allreduce            dist     3       11
allreduce_ranks      ranks    3       11
ddp_lenet_bn         dist     2       9
'

# ------------------------------------------------------------------ helpers

median() {
    sort -n | awk '{ a[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) print a[(NR + 1) / 2]; else printf "%.4f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

smaller() {  # the smaller of two values; n/a only when both are
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "n/a") print b; else if (b == "n/a" || a + 0 <= b + 0) print a; else print b }'
}

ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a"; else printf "%.2f\n", a / b }'
}

line() {  # case threads dl torch [note]
    printf '%-20s %2s %10s %10s %7s%s\n' "$1" "$2" "$3" "$4" "$(ratio "$3" "$4")" "${5:+  $5}"
}

# value of "case threads value" from a bench program's stdout, or n/a; the
# program's complaints go to stderr with a prefix
value_of() {  # case output-file error-file side
    v=$(awk -v c="$1" '$1 == c { v = $3 } END { print v }' "$2")
    if [ -z "$v" ]; then
        v=n/a
        sed "s/^/# $4 $1: /" "$3" | head -n 5 >&2
    fi
    echo "$v"
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dlbench.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM

run_dl() {  # case threads args...
    c=$1; t=$2; shift 2
    bin=$DL
    case $c in *_cuda|*_cuda_fp32) bin=$DL_CUDA ;; esac
    if [ ! -x "$bin" ]; then echo "$bin was not built (nvcc missing?)" >"$TMP/e"; : >"$TMP/o"
    else OPENBLAS_NUM_THREADS=$t "$bin" "$c" "$t" "$@" </dev/null >"$TMP/o" 2>"$TMP/e"; fi
    if profiling; then cp "$TMP/e" "$TMP/prof_dl"; fi
    value_of "$c" "$TMP/o" "$TMP/e" dl.h
}

run_torch() {
    c=$1; t=$2; shift 2
    if [ -z "$TORCH_VERSION" ]; then echo n/a; return; fi
    case $c in *_cuda|*_cuda_fp32)
        if [ -n "$SERVED" ]; then   # the one PyTorch process of the GPU cases
            # (a dead server's FIFO would SIGPIPE this shell: the write fails instead)
            (trap '' PIPE; echo "$c $t $*" >&3) 2>/dev/null
            if IFS= read -r ans <&4; then
                case $ans in "ERR "*) echo "${ans#ERR }" >"$TMP/e"; : >"$TMP/o" ;;
                *) echo "$ans" >"$TMP/o"; : >"$TMP/e" ;; esac
            else
                echo "the PyTorch process (torch_bench.py --serve) is gone:" >"$TMP/e"
                tail -n 4 "$TMP/serve_err" >>"$TMP/e" 2>/dev/null; : >"$TMP/o"
            fi
            value_of "$c" "$TMP/o" "$TMP/e" torch
            return
        fi ;;
    esac
    "$PYTHON" "$TORCH" "$c" "$t" "$@" </dev/null >"$TMP/o" 2>"$TMP/e"
    if profiling; then cp "$TMP/e" "$TMP/prof_torch"; fi
    value_of "$c" "$TMP/o" "$TMP/e" torch
}

profiling() { [ -n "${DL_PROFILE:-}" ] && [ "$DL_PROFILE" != 0 ]; }

# DL_PROFILE=1: the two sides' tables of the case just printed, as comments
show_profiles() {
    for side in dl torch; do
        [ -s "$TMP/prof_$side" ] && sed "s/^/# $side: /" "$TMP/prof_$side"
        rm -f "$TMP/prof_$side"
    done
    return 0
}

now_ns() { date +%s%N; }

# seconds from exec to exit of one process, or n/a if it failed
wall() {  # case command...
    c=$1; shift
    t0=$(now_ns)
    "$@" </dev/null >"$TMP/o" 2>"$TMP/e"
    t1=$(now_ns)
    if awk -v c="$c" '$1 == c { ok = 1 } END { exit !ok }' "$TMP/o"; then
        awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f\n", (b - a) / 1e9 }'
    else
        sed "s/^/# $c: /" "$TMP/e" | head -n 5 >&2
        echo n/a
    fi
}

run_startup() {  # threads reps: dl and torch processes alternate
    t=$1; n=$2; i=0
    : >"$TMP/sd"; : >"$TMP/st"
    while [ "$i" -lt "$n" ]; do
        (export OPENBLAS_NUM_THREADS="$t"; wall startup "$DL" startup "$t") >>"$TMP/sd"
        [ -n "$TORCH_VERSION" ] && wall startup "$PYTHON" "$TORCH" startup "$t" >>"$TMP/st"
        i=$((i + 1))
    done
    d=n/a; p=n/a
    grep -q n/a "$TMP/sd" || d=$(median <"$TMP/sd")
    [ -s "$TMP/st" ] && ! grep -q n/a "$TMP/st" && p=$(median <"$TMP/st")
    line startup "$t" "$d" "$p"
}

run_gemm() {
    if [ ! -f bench/gemm.c ]; then
        echo "# gemm: skipped (bench/gemm.c is not here)"; return
    fi
    if ! $MAKE -s build/bench_gemm >"$TMP/e" 2>&1; then
        echo "# gemm: skipped (build/bench_gemm does not build; OpenBLAS missing?)"
        sed 's/^/#   /' "$TMP/e" | head -n 5
        return
    fi
    for t in $THREADS; do
        build/bench_gemm --threads "$t" </dev/null || echo "# gemm: build/bench_gemm --threads $t failed"
    done
}

# data parallelism: build/bench prints its own lines (no PyTorch side)
run_dist() {  # name warmup reps
    for t in $THREADS; do
        "$DL" "$1" "$t" --warmup "$2" --reps "$3" </dev/null || echo "# $1: build/bench $1 $t failed"
    done
}

# allreduce over 2 ranks of one thread each: thread ranks (build/bench), then
# 2 MPI processes (build/mpi/bench under mpirun) where mpicc and mpirun are
run_ranks() {  # name warmup reps
    "$DL" "$1" 1 --warmup "$2" --reps "$3" </dev/null || echo "# $1: build/bench $1 1 failed"
    if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
        if $MAKE -s build/mpi/bench >"$TMP/e" 2>&1; then
            ${MPIRUN:-mpirun --allow-run-as-root --oversubscribe} -np 2 build/mpi/bench "$1" 1 --warmup "$2" \
                --reps "$3" </dev/null || echo "# $1: mpirun -np 2 build/mpi/bench $1 failed"
        else
            echo "# $1: build/mpi/bench did not build:"; sed 's/^/#   /' "$TMP/e" | head -n 5
        fi
    else
        echo "# $1: no mpicc/mpirun: the MPI line is skipped"
    fi
}

run_case() {  # name kind warmup reps
    case $2 in
    gemm) run_gemm ;;
    dist) run_dist "$1" "$3" "$4" ;;
    ranks) run_ranks "$1" "$3" "$4" ;;
    startup) for t in $THREADS; do run_startup "$t" "$4"; done ;;
    mem)
        for t in $THREADS; do
            d=$(run_dl "$1" "$t" --steps "$4"); p=$(run_torch "$1" "$t" --steps "$4")
            line "$1" "$t" "$d" "$p"
            show_profiles
        done ;;
    graph)   # dl.h's replay against dl.h's eager step, processes alternating
        for t in $THREADS; do
            d=n/a; e=n/a; r=0
            while [ "$r" -lt "$ROUNDS" ]; do
                d=$(smaller "$d" "$(run_dl "$1" "$t" --warmup "$3" --reps "$4")")
                e=$(smaller "$e" "$(run_dl "${1%_graph}" "$t" --warmup "$3" --reps "$4")")
                r=$((r + 1))
            done
            line "$1" "$t" "$d" "$e" "(dl.h eager, not torch: PyTorch has no CPU graph replay)"
        done ;;
    time)
        names=$1   # a GPU case twice: PyTorch's defaults (convolutions in TF32), then NAME_fp32, exact fp32
        case $1 in *_cuda) names="$1 ${1}_fp32" ;; esac
        for n in $names; do
            for t in $THREADS; do
                d=n/a; p=n/a; r=0
                while [ "$r" -lt "$ROUNDS" ]; do
                    d=$(smaller "$d" "$(run_dl "$n" "$t" --warmup "$3" --reps "$4")")
                    p=$(smaller "$p" "$(run_torch "$n" "$t" --warmup "$3" --reps "$4")")
                    r=$((r + 1))
                done
                line "$n" "$t" "$d" "$p"
                show_profiles
            done
        done ;;
    *) echo "# $1: unknown kind $2" ;;
    esac
}

# ------------------------------------------------------------------ main

# the selected rows of TABLE, in table order
SELECTED=$(echo "$TABLE" | awk 'NF == 4')
if [ -n "$CASES" ]; then
    sel=
    for want in $CASES; do
        found=$(echo "$TABLE" | awk 'NF == 4 { print $1 }' | while read -r n; do
            case $n in $want) echo "$n" ;; esac
        done)
        if [ -z "$found" ]; then
            echo "bench: no case '$want'; cases:" $(echo "$TABLE" | awk 'NF == 4 { print $1 }') >&2
            exit 2
        fi
        sel="$sel $found"
    done
    SELECTED=$(echo "$TABLE" | awk -v sel="$sel" 'BEGIN { n = split(sel, s, " "); for (i = 1; i <= n; i++) want[s[i]] = 1 } NF == 4 && ($1 in want)')
fi

case $(now_ns) in *N*|'') echo "bench: needs date +%s%N (GNU date)" >&2; exit 1 ;; esac
$MAKE -s build/bench || exit 1
case $SELECTED in *_cuda*)   # the *_cuda cases need the DL_CUDA build; without nvcc they print n/a
    if [ "$DL_CUDA" = build/cuda/bench ] && command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then
        $MAKE -s build/cuda/bench >/dev/null 2>&1 || echo "# build/cuda/bench does not build: *_cuda cases are n/a"
    fi ;;
esac

TORCH_VERSION=$("$PYTHON" "$TORCH" --version 2>/dev/null | tail -n 1)
cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null)
echo "# dl.h bench, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# machine: ${cpu:-unknown CPU}, $(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?') cores, $(uname -sm), load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
echo "# dl.h: $(${CC:-cc} --version 2>/dev/null | head -n 1); build/bench: $(cat build/bench.flags 2>/dev/null || echo "flags unknown")"
if [ -n "$TORCH_VERSION" ]; then
    echo "# torch: $TORCH_VERSION ($("$PYTHON" -c 'import sys; print("python " + sys.version.split()[0])'))"
else
    echo "# torch: not found by '$PYTHON -c \"import torch\"': PyTorch columns are n/a"
fi
echo "# threads: $THREADS; rounds: $ROUNDS; ratio = dl / torch (time, memory: below 1 means dl.h is faster / smaller)"
echo "# case               th         dl      torch   ratio   (ms; mem_*: MiB peak RSS; startup: s)"

# The *_cuda cases' PyTorch side runs in one process (torch_bench.py
# --serve, answering a case per line through two FIFOs): torch's import and
# CUDA's start-up cost seconds a process on a GPU machine, paid once here.
# Not with DL_PROFILE (each case's profiler table goes to its own stderr).
SERVED=
case $SELECTED in *_cuda*)
    if [ -n "$TORCH_VERSION" ] && ! profiling && mkfifo "$TMP/req" "$TMP/ans" 2>/dev/null; then
        "$PYTHON" "$TORCH" --serve <"$TMP/req" >"$TMP/ans" 2>"$TMP/serve_err" &
        exec 3>"$TMP/req" 4<"$TMP/ans"
        SERVED=1
    fi ;;
esac

echo "$SELECTED" | while read -r name kind warmup reps; do
    [ -n "$name" ] && run_case "$name" "$kind" "$warmup" "$reps"
done
