# dl.h - build, test and run. `make run` trains; `make test` checks each test
# program once (and again on the strict cpu:1); `make test-all` runs the whole
# matrix of builds (native, clang, C++, OpenBLAS, no threads, emulated CUDA).
# Builds run in parallel on every core unless -j is given.
NPROC   := $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(NPROC)
endif
CC      ?= cc
CFLAGS  ?= -O2 -g
WARN     = -std=c99 -Wall -Wextra -Werror -pedantic
CXXWARN  = -Wall -Wextra -Werror -pedantic
LDLIBS   = -lm -lpthread
B        = build
SAN      = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
HAVE_OPENBLAS := $(shell echo 'int main(void){return 0;}' | $(CC) -include cblas.h -x c - -o /dev/null -lopenblas >/dev/null 2>&1 && echo 1)
HAVE_NATIVE   := $(shell echo 'int main(void){return 0;}' | $(CC) -march=native -x c - -o /dev/null >/dev/null 2>&1 && echo 1)
# -march=native with AVX-512: test-all also builds the AVX2 paths (GEMM kernels, Winograd) an AVX2 CPU takes
HAVE_AVX512   := $(if $(HAVE_NATIVE),$(shell $(CC) -march=native -dM -E -x c /dev/null 2>/dev/null | grep -q __AVX512F__ && echo 1))
HAVE_ZLIB     := $(shell echo 'int main(void){return 0;}' | $(CC) -include zlib.h -x c - -o /dev/null -lz >/dev/null 2>&1 && echo 1)
HAVE_CLANG    := $(shell command -v clang >/dev/null 2>&1 && echo 1)
HAVE_CXX      := $(shell command -v g++ >/dev/null 2>&1 && echo 1)

# test_cuda.c is built by nvcc only (make cuda, test-cuda, test-cuda-emu);
# tests/test_mpi.c needs mpicc and mpirun: `make test-mpi`
TEST_SRC := $(filter-out tests/test_cuda.c tests/test_mpi.c,$(sort $(wildcard tests/test_*.c)))
TESTS     = $(patsubst tests/%.c,$(B)/%,$(TEST_SRC))
# shell tests: every C snippet of README.md, docs/*.md and dl.h's comments compiles (and
# runs), dl.h's API INDEX lists every public name, the examples' command line
# (needs the examples built), `make data`
SNIPPETS  = tests/snippets_check.sh
SCRIPTS   = $(SNIPPETS) tests/api_index_check.sh tests/test_cli.sh tests/test_fetch_data.sh \
            tests/test_bench_serve.sh
# the same checks built other ways: clang, C++, OpenBLAS, without threads,
# without mmap, DL_MAX_DIMS 4 and 16
# and every C test built as the examples are (-O3 -march=native), so the
# vector paths (AVX-512 / AVX2 GEMM kernels, pooling) run against the same checks
NATIVE    = $(if $(HAVE_NATIVE),$(patsubst tests/%.c,$(B)/%_native,$(TEST_SRC)))
EXTRA     = $(NATIVE) $(if $(HAVE_CLANG),$(B)/test_core_clang) $(if $(HAVE_CXX),$(B)/test_core_cxx $(B)/test_ops_cxx $(B)/test_dist_cxx $(if $(HAVE_NATIVE),$(B)/test_conv_cxx_native)) \
            $(if $(HAVE_OPENBLAS),$(B)/test_ops_openblas) $(if $(HAVE_ZLIB),$(B)/test_data_zlib $(B)/test_hardening_debug) \
            $(B)/test_core_nothreads $(B)/test_gemm_nothreads $(B)/test_hardening_nommap \
            $(B)/test_core_dims4 $(B)/test_core_dims16 $(if $(HAVE_AVX512),$(B)/test_conv_avx2 $(B)/test_gemm_avx2)
SANTESTS  = $(patsubst tests/%.c,$(B)/san/%,$(TEST_SRC))
DEPS      = dl.h examples/lenet_bn.h examples/resnet18.h examples/resnet_small.h tests/harness.h tests/th_prims.h tests/count_alloc.h tests/golden.h tests/optable.h tests/dist_models.h tests/tb_read.h
EXAMPLES  = $(patsubst examples/%.c,$(B)/%,$(sort $(wildcard examples/*.c)))
EXFLAGS   = -O3 $(if $(HAVE_NATIVE),-march=native) -g
EPOCHS   ?= 10
LOGDIR   ?= runs/lenet-$(shell date +%Y%m%d-%H%M%S)
FUZZ_SECONDS ?= 60
# make bench: dl.h against PyTorch (bench/README.md); CASES="step_lenet_bn gemm" runs a subset
CASES    ?=
THREADS  ?= 1 2
ROUNDS   ?= 1
BENCH_FLAGS = -O3 $(if $(HAVE_NATIVE),-march=native) -g

# CUDA (dl_cuda.cuh): a test is compiled by nvcc as a whole (it defines
# DL_IMPLEMENTATION, so its file is the implementation unit; the examples
# and the LINKED tests share one, below) and linked by the C++ compiler with
# the CUDA runtime and cuBLAS. Fat binary for sm_80 and sm_90.
NVCC      ?= nvcc
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
# host code (the CPU backend, data loading, cpu tensors) as the CPU build
# compiles it: -O3 (nvcc hands it to the host compiler) and -march=native
# where that compiler takes it, so a DL_CUDA build's cpu:0 runs the same
# vector kernels (build it on the machine that runs it); -ffp-contract=off
# as C99 mode implies (g++'s GNU C++ default fuses a*b+c into an FMA where
# -march=native has one, which would round otherwise than the CPU build)
NVHOST    = -O3 $(if $(HAVE_NATIVE),-Xcompiler -march=native) -Xcompiler -ffp-contract=off
NVFLAGS   = -x cu $(CUDA_ARCH) -DDL_CUDA $(NVDNN) -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror $(NVHOST)
NVDNN     = $(if $(filter 1,$(HAVE_CUDNN)),-DDL_CUDNN)
# cuDNN, where its header is beside CUDA's or the system's (else HAVE_CUDNN=1
# with NVCC's -I and CUDA_LIBS's -L pointing at it; HAVE_CUDNN=0: without):
# the CUDA build's convolutions go through it (-DDL_CUDNN, docs/cuda.md)
HAVE_CUDNN ?= $(if $(wildcard $(CUDA_HOME)/include/cudnn.h /usr/include/cudnn.h \
    /usr/include/$(shell uname -m)-linux-gnu/cudnn.h),1)
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -lcudart -lcublas $(if $(filter 1,$(HAVE_CUDNN)),-lcudnn) -lm -lpthread
HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1)
# a test that checks C-only constructs (compound literals, tentative
# definitions) and compiles the implementation whole is not built as CUDA
# C++ (the LINKED ones, test_defaults and test_torch_roundtrip among them,
# are compiled as C and link the nvcc-built implementation: below)
CUDA_C_ONLY   = tests/test_summary.c
CUDA_TESTS    = $(patsubst tests/%.c,$(B)/cuda/%,$(filter-out $(CUDA_C_ONLY),$(TEST_SRC)) tests/test_cuda.c)
CUDA_EXAMPLES = $(patsubst examples/%.c,$(B)/cuda/%,$(sort $(wildcard examples/*.c)))
# make test-all runs tests/test_cuda.c on emulated CUDA devices when nvcc is here
CUDA_EMU_RUN  = $(if $(HAVE_NVCC),--tag @cuda-emu --env DL_CUDA_EMULATE=2 $(B)/cuda/test_cuda)

.PHONY: all test test-all sanitize valgrind clean run data fuzz bench cuda test-cuda test-cuda-all test-cuda-emu nvcc-check bench-cuda test-mpi nccl-check test-nccl
all: $(TESTS) $(EXTRA) $(EXAMPLES)

$(B) $(B)/san:
	mkdir -p $@

$(B)/%: tests/%.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

# The tests that reach dl.h only through its API and the harness share one
# copy of the implementation per build, tests/th_impl.c's object (they are
# compiled with DL_NO_IMPLEMENTATION); the others configure it (an allocator,
# tile sizes) or read its internals, and compile it in whole.
LINKED    = $(addprefix test_,data defaults golden gradcheck inplace layers nn_ops smoke torch_roundtrip)
$(B)/th_impl.o: tests/th_impl.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -I. -c $< -o $@
$(LINKED:%=$(B)/%): $(B)/%: tests/%.c $(B)/th_impl.o $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -DDL_NO_IMPLEMENTATION -I. $< $(B)/th_impl.o -o $@ $(LDLIBS)
$(B)/th_impl_native.o: tests/th_impl.c $(DEPS) | $(B)
	$(CC) $(WARN) $(EXFLAGS) -I. -c $< -o $@
$(LINKED:%=$(B)/%_native): $(B)/%_native: tests/%.c $(B)/th_impl_native.o $(DEPS) | $(B)
	$(CC) $(WARN) $(EXFLAGS) -DDL_NO_IMPLEMENTATION -I. $< $(B)/th_impl_native.o -o $@ $(LDLIBS)

# The examples share one copy of dl.h's implementation, compiled once as
# they are (-O3 -march=native): each example's own DL_IMPLEMENTATION is
# ignored (DL_NO_IMPLEMENTATION) and it links $(B)/dl_ex.o. Compiling dl.h
# into each of them took some 55 s a program, most of make test's time.
EXHDRS    = examples/common.h examples/cli.h examples/lenet_bn.h examples/resnet18.h examples/resnet_small.h
$(B)/dl_ex.o: dl.h | $(B)
	$(CC) $(WARN) $(EXFLAGS) -DDL_IMPLEMENTATION -x c -c $< -o $@
$(B)/%: examples/%.c $(B)/dl_ex.o dl.h $(EXHDRS) | $(B)
	$(CC) $(WARN) $(EXFLAGS) -DDL_NO_IMPLEMENTATION -I. $< $(B)/dl_ex.o -o $@ $(LDLIBS)

# the main job: LeNet-BN on Fashion-MNIST (make run EPOCHS=3). TensorBoard
# logs go to a new directory under runs/ each time (LOGDIR=dir for another,
# LOGDIR= for none); the run prints the `tensorboard --logdir` line to use
# DEVICE=cuda (or cuda:N) trains on the GPU with the nvcc build; DEVICE=cpu:1 ... too
# CAPTURE=1 (yes, true, on) trains through a static graph (--capture: one step
# recorded, then replayed); DL_DATA_DIR as for make data
DEVICE   ?=
CAPTURE  ?=
RUN_BIN   = $(if $(filter cuda%,$(DEVICE)),$(B)/cuda/lenet,$(B)/lenet)
run: $(if $(filter cuda%,$(DEVICE)),nvcc-check) $(RUN_BIN) data
	$(if $(filter-out 0 1 no yes false true off on,$(CAPTURE)),$(error make run: CAPTURE=$(CAPTURE): must be 1, yes, true or on (or 0, no, false, off, empty)))
	$(RUN_BIN) --epochs $(EPOCHS)$(if $(LOGDIR), --logdir '$(LOGDIR)')$(if $(DEVICE), --device $(DEVICE))$(if $(filter 1 yes true on,$(CAPTURE)), --capture)$(if $(DL_DATA_DIR), --data '$(DL_DATA_DIR)/fashion-mnist')

data:
	@examples/fetch_data.sh

# libFuzzer targets for the file loaders and for sequences of capture and
# replay calls (tests/test_capture_fuzz.c with DL_LIBFUZZER), FUZZ_SECONDS each
FUZZ = clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I.
fuzz: | $(B)
	@case "$(FUZZ_SECONDS)" in ''|*[!0-9]*|0) echo "make fuzz: FUZZ_SECONDS=$(FUZZ_SECONDS): must be a whole number of seconds > 0 (libFuzzer would run without a limit)"; exit 2;; esac
	$(FUZZ) tests/fuzz_idx.c -o $(B)/fuzz_idx -lm -lpthread
	$(FUZZ) tests/fuzz_checkpoint.c -o $(B)/fuzz_checkpoint -lm -lpthread
	$(FUZZ) -DDL_LIBFUZZER -DDL_DEBUG tests/test_capture_fuzz.c -o $(B)/fuzz_capture -lm -lpthread
	mkdir -p $(B)/corpus_idx $(B)/corpus_ckpt $(B)/corpus_capture
	$(B)/fuzz_idx -max_total_time=$(FUZZ_SECONDS) $(B)/corpus_idx
	$(B)/fuzz_checkpoint -max_total_time=$(FUZZ_SECONDS) $(B)/corpus_ckpt
	$(B)/fuzz_capture -max_total_time=$(FUZZ_SECONDS) -max_len=64 $(B)/corpus_capture

$(B)/%_native: tests/%.c $(DEPS) | $(B)
	$(CC) $(WARN) $(EXFLAGS) -I. $< -o $@ $(LDLIBS)
$(B)/%_avx2: tests/%.c $(DEPS) | $(B)
	$(CC) $(WARN) -O3 -mavx2 -mfma -g -I. $< -o $@ $(LDLIBS)
$(B)/test_core_clang: tests/test_core.c $(DEPS) | $(B)
	clang $(WARN) $(CFLAGS) -I. $< -o $@ $(LDLIBS)
$(B)/test_core_cxx: tests/test_core.c $(DEPS) | $(B)
	g++ -x c++ $(CXXWARN) $(CFLAGS) -I. $< -o $@ -lpthread
$(B)/test_ops_cxx: tests/test_ops.c $(DEPS) | $(B)
	g++ -x c++ $(CXXWARN) $(CFLAGS) -I. $< -o $@ -lpthread
$(B)/test_conv_cxx_native: tests/test_conv.c $(DEPS) | $(B)
	g++ -x c++ $(CXXWARN) $(EXFLAGS) -I. $< -o $@ -lpthread
$(B)/test_dist_cxx: tests/test_dist.c $(DEPS) | $(B)
	g++ -x c++ $(CXXWARN) $(CFLAGS) -I. $< -o $@ -lpthread
# the single-threaded build (-DDL_NO_THREADS: no pthreads, a pool of one)
$(B)/%_nothreads: tests/%.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -DDL_NO_THREADS -I. $< -o $@ -lm
$(B)/test_data_zlib: tests/test_data.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -DDL_ZLIB -I. $< -o $@ -lz $(LDLIBS)
$(B)/test_hardening_debug: tests/test_hardening.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -DDL_DEBUG -DDL_ZLIB -I. $< -o $@ -lz $(LDLIBS)
# the smallest and largest DL_MAX_DIMS (the smallest as the examples build: -O3)
$(B)/test_core_dims4: tests/test_core.c $(DEPS) | $(B)
	$(CC) $(WARN) $(EXFLAGS) -DDL_MAX_DIMS=4 -I. $< -o $@ $(LDLIBS)
$(B)/test_core_dims16: tests/test_core.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -DDL_MAX_DIMS=16 -I. $< -o $@ $(LDLIBS)
# without the never-reused header addresses (-DDL_NO_MMAP): stale tensors one step old
$(B)/test_hardening_nommap: tests/test_hardening.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -DDL_NO_MMAP -I. $< -o $@ $(LDLIBS)
$(B)/test_ops_openblas: tests/test_ops.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -DDL_OPENBLAS -I. $< -o $@ -lopenblas $(LDLIBS)

# then every C test program again with every tensor on cpu:1 in strict mode,
# where a host dereference of tensor data faults (lines read test_core@cpu:1)
STRICT_ENV = DL_CPU_DEVICES=2 DL_DEVICE=cpu:1 DL_STRICT=1
# the newcomer's check: each test program once in its default build, the
# shell checks (test_cli.sh needs the examples), then the same programs on
# the strict cpu:1 (no second build), but for test_gemm, which makes no
# context (its kernels have no device: a second run would repeat the first)
test: $(TESTS) $(EXAMPLES)
	@CC="$(CC)" tests/run.sh $(TESTS) $(SCRIPTS) \
	    --tag @cpu:1 $(addprefix --env ,$(STRICT_ENV)) $(filter-out $(B)/test_gemm,$(TESTS)) $(SNIPPETS)

# the whole matrix: make test's programs, the other builds of them (EXTRA),
# the strict cpu:1 pass and the emulated CUDA test (when nvcc is here)
test-all: all $(if $(HAVE_NVCC),$(B)/cuda/test_cuda)
	@CC="$(CC)" tests/run.sh $(TESTS) $(EXTRA) $(SCRIPTS) $(if $(HAVE_NVCC),,tests/cuda_skip.sh) \
	    --tag @cpu:1 $(addprefix --env ,$(STRICT_ENV)) $(TESTS) $(SNIPPETS) $(CUDA_EMU_RUN)

# ---- CUDA builds (nvcc): make cuda compiles them all; no GPU needed
nvcc-check:
ifneq ($(HAVE_NVCC),1)
	@echo "make cuda: $(NVCC) not found: the CUDA build needs the CUDA toolkit (nvcc, cuBLAS); set NVCC=/path/to/nvcc"; exit 1
endif

cuda: nvcc-check $(CUDA_TESTS) $(CUDA_EXAMPLES)

$(B)/cuda:
	mkdir -p $@
$(B)/cuda/%.o: tests/%.c $(DEPS) dl_cuda.cuh | $(B)/cuda
	$(NVCC) $(NVFLAGS) -Itests -I. -c $< -o $@
$(B)/cuda/%: $(B)/cuda/%.o
	$(CXX) $< -o $@ $(CUDA_LIBS)
# the LINKED tests as in the CPU build: tests/th_impl.c by nvcc, their own
# files C
CUDA_LINKED = $(filter $(LINKED),$(patsubst tests/%.c,%,$(filter-out $(CUDA_C_ONLY),$(TEST_SRC))))
$(B)/cuda/th_impl.o: tests/th_impl.c $(DEPS) dl_cuda.cuh | $(B)/cuda
	$(NVCC) $(NVFLAGS) -I. -c $< -o $@
$(CUDA_LINKED:%=$(B)/cuda/%.o): $(B)/cuda/%.o: tests/%.c $(DEPS) | $(B)/cuda
	$(CC) $(WARN) $(EXFLAGS) -DDL_CUDA $(NVDNN) -DDL_NO_IMPLEMENTATION -Itests -I. -c $< -o $@
$(CUDA_LINKED:%=$(B)/cuda/%): $(B)/cuda/%: $(B)/cuda/%.o $(B)/cuda/th_impl.o
	$(CXX) $^ -o $@ $(CUDA_LIBS)
# the examples as a user builds a CUDA program: the implementation unit by
# nvcc (one object for all of them, as in the CPU build), their own files C
# (dl.h's public part is the same with or without DL_CUDA)
$(B)/cuda/dl_ex.o: dl.h dl_cuda.cuh | $(B)/cuda
	$(NVCC) $(NVFLAGS) -DDL_IMPLEMENTATION -I. -c $< -o $@
$(B)/cuda/%.o: examples/%.c dl.h $(EXHDRS) | $(B)/cuda
	$(CC) $(WARN) $(EXFLAGS) -DDL_CUDA $(NVDNN) -DDL_NO_IMPLEMENTATION -I. -c $< -o $@
$(CUDA_EXAMPLES): $(B)/cuda/%: $(B)/cuda/%.o $(B)/cuda/dl_ex.o
	$(CXX) $^ -o $@ $(CUDA_LIBS)

# on cuda:0 of a real GPU (without one it says so and passes)
test-cuda: nvcc-check $(B)/cuda/test_cuda
	@tests/run.sh $(B)/cuda/test_cuda

# a real GPU: test_cuda, then every other CUDA-built test with its tensors on
# cuda:0, their expectations the CPU's: convolutions in exact fp32 too
# (DL_ALLOW_TF32_CONV=0; TF32 is their default, as PyTorch's cuDNN); then
# the convolution tests again with every convolution through cuDNN
# (DL_CUDNN=2: by default only those with 16+ channels take it), and
# test_conv with DL_CONV_DIRECT=0 (im2col and cuBLAS for the few-channel
# convs that the direct sums take by default) and =2 (the direct sums'
# per-element kernels, where by default their shared-memory tiles run);
# test_capture with DL_CUDA_REPLAY_ARGS=0 (a replay's changing values by
# copy nodes, not one kernel node's parameters) and with DL_CUDA_PDL=1
# (programmatic dependent launches)
CUDA_ON0 = --env DL_DEVICE=cuda:0 --env DL_ALLOW_TF32_CONV=0
CUDA_CONV_TESTS = $(addprefix $(B)/cuda/,test_conv test_golden test_gradcheck test_nn test_resnet18)
test-cuda-all: nvcc-check $(CUDA_TESTS)
	@tests/run.sh $(B)/cuda/test_cuda --tag @cuda:0 $(CUDA_ON0) \
	    $(filter-out $(B)/cuda/test_cuda,$(CUDA_TESTS)) \
	    --tag @cuda:0-cudnn $(CUDA_ON0) --env DL_CUDNN=2 $(CUDA_CONV_TESTS) \
	    --tag @cuda:0-im2col $(CUDA_ON0) --env DL_CONV_DIRECT=0 $(B)/cuda/test_conv \
	    --tag @cuda:0-elem $(CUDA_ON0) --env DL_CONV_DIRECT=2 $(B)/cuda/test_conv \
	    --tag @cuda:0-copies $(CUDA_ON0) --env DL_CUDA_REPLAY_ARGS=0 $(B)/cuda/test_capture \
	    --tag @cuda:0-pdl $(CUDA_ON0) --env DL_CUDA_PDL=1 $(B)/cuda/test_capture $(B)/cuda/test_conv

# the same program with cuda:0 and cuda:1 emulated in host memory (no GPU
# needed), then every other CUDA-built test with all its tensors on the
# emulated cuda:0 (as make test does on the strict cpu:1), test_conv there
# with DL_CONV_DIRECT=0 (the im2col path) and 2 (per-element direct sums),
# test_capture with DL_CUDA_REPLAY_ARGS=0 (the replay's copy nodes),
# test_conv, test_nn_ops and test_golden with the emulator's threads and
# blocks last to first (DL_CUDA_EMULATE_REVERSE=1), then those tests
# as they are, on the CPU: a DL_CUDA build works where there is no GPU (the
# emulated device rounds TF32 products' operands as a GPU does); last the
# CUDA-built examples on emulated GPUs against the CPU build's
test-cuda-emu: nvcc-check $(CUDA_TESTS) $(CUDA_EXAMPLES) $(EXAMPLES)
	@tests/run.sh --tag @cuda-emu --env DL_CUDA_EMULATE=2 $(B)/cuda/test_cuda \
	    --tag @cuda:0-emu --env DL_CUDA_EMULATE=2 $(CUDA_ON0) $(filter-out $(B)/cuda/test_cuda,$(CUDA_TESTS)) \
	    --tag @cuda:0-emu-im2col --env DL_CUDA_EMULATE=2 $(CUDA_ON0) --env DL_CONV_DIRECT=0 $(B)/cuda/test_conv \
	    --tag @cuda:0-emu-elem --env DL_CUDA_EMULATE=2 $(CUDA_ON0) --env DL_CONV_DIRECT=2 $(B)/cuda/test_conv \
	    --tag @cuda:0-emu-copies --env DL_CUDA_EMULATE=2 $(CUDA_ON0) --env DL_CUDA_REPLAY_ARGS=0 $(B)/cuda/test_capture \
	    --tag @cuda:0-emu-rev --env DL_CUDA_EMULATE=2 $(CUDA_ON0) --env DL_CUDA_EMULATE_REVERSE=1 \
	        $(B)/cuda/test_conv $(B)/cuda/test_nn_ops $(B)/cuda/test_golden \
	    --tag @cuda-build $(filter-out $(B)/cuda/test_cuda,$(CUDA_TESTS)) \
	    --tag @cuda-emu tests/test_cuda_cli.sh

$(B)/san/%: tests/%.c $(DEPS) | $(B)/san
	$(CC) $(WARN) -O1 -g $(SAN) -DDL_DEBUG -I. $< -o $@ $(LDLIBS)
# the LINKED tests share one sanitized implementation here too
$(B)/san/th_impl.o: tests/th_impl.c $(DEPS) | $(B)/san
	$(CC) $(WARN) -O1 -g $(SAN) -DDL_DEBUG -I. -c $< -o $@
$(LINKED:%=$(B)/san/%): $(B)/san/%: tests/%.c $(B)/san/th_impl.o $(DEPS) | $(B)/san
	$(CC) $(WARN) -O1 -g $(SAN) -DDL_DEBUG -DDL_NO_IMPLEMENTATION -I. $< $(B)/san/th_impl.o -o $@ $(LDLIBS)

# threaded code (the loader's workers, the kernel thread pool, the allreduce ring) under ThreadSanitizer
TSANTESTS = $(B)/tsan/test_data $(B)/tsan/test_core $(B)/tsan/test_gemm $(B)/tsan/test_hardening $(B)/tsan/test_dist
$(B)/tsan:
	mkdir -p $@
$(B)/tsan/%: tests/%.c $(DEPS) | $(B)/tsan
	$(CC) $(WARN) -O1 -g -fsanitize=thread -DDL_DEBUG -I. $< -o $@ $(LDLIBS)

# clang's UBSan sees what gcc's does not (NULL + 0, which `make fuzz` found
# in a replay): the capture tests and the hardening regressions under it too
CSANTESTS = $(if $(HAVE_CLANG),$(B)/csan/test_capture_fuzz $(B)/csan/test_capture $(B)/csan/test_hardening)
$(B)/csan:
	mkdir -p $@
$(B)/csan/%: tests/%.c $(DEPS) | $(B)/csan
	clang $(WARN) -O1 -g $(SAN) -DDL_DEBUG -I. $< -o $@ $(LDLIBS)

sanitize: $(SANTESTS) $(TSANTESTS) $(CSANTESTS)
	@ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1 \
	    tests/run.sh $(SANTESTS) $(TSANTESTS) $(if $(CSANTESTS),--tag @clang $(CSANTESTS))

# MPI: dl_comm across 2 processes (mpicc -DDL_MPI, with DL_DEBUG's replica
# checks, mpirun -np 2), and a rank that hangs or dies mid-allreduce
# (DL_COMM_TIMEOUT=2)
MPICC  ?= mpicc
MPIRUN ?= mpirun --allow-run-as-root --oversubscribe
$(B)/mpi:
	mkdir -p $@
$(B)/mpi/test_mpi: tests/test_mpi.c $(DEPS) | $(B)/mpi
	$(MPICC) $(WARN) $(CFLAGS) -DDL_MPI -DDL_DEBUG -I. $< -o $@ $(LDLIBS)
$(B)/mpi/data_parallel: examples/data_parallel.c dl.h examples/common.h examples/cli.h | $(B)/mpi
	$(MPICC) $(WARN) $(EXFLAGS) -DDL_MPI -I. $< -o $@ $(LDLIBS)
test-mpi: $(B)/mpi/test_mpi
	@B=$(B) MPIRUN="$(MPIRUN)" tests/run.sh tests/test_mpi.sh tests/test_mpi_kill.sh

# NCCL: the communicator's NCCL code compiles and links with nvcc (alone, and
# with MPI for the unique id); nothing CUDA runs on a machine without a GPU
NCCLFLAGS = -x cu -O2 -Xcompiler -Wall,-Wextra,-Werror -I. -Itests
nccl-check: $(B)/cuda/test_dist_nccl | $(B)/mpi
	$(NVCC) $(NCCLFLAGS) -DDL_NCCL tests/test_dist.c -o $(B)/test_dist_nccl -lnccl
	$(NVCC) $(NCCLFLAGS) -DDL_NCCL -DDL_MPI $$($(MPICC) --showme:compile) tests/test_mpi.c \
	    -o $(B)/mpi/test_mpi_nccl -lnccl $$($(MPICC) --showme:link)
	@echo "nccl-check: the NCCL backend compiles and links"
# with the CUDA backend: one NCCL rank on cuda:0, dl_ddp's sums overlapped on
# the communicator's stream (test_dist's test_nccl; it skips without a GPU)
$(B)/cuda/test_dist_nccl: tests/test_dist.c $(DEPS) dl_cuda.cuh | $(B)/cuda
	$(NVCC) $(NVFLAGS) -DDL_NCCL -Itests -I. tests/test_dist.c -o $@ -lnccl $(CUDA_LIBS)
test-nccl: $(B)/cuda/test_dist_nccl
	@tests/run.sh $(B)/cuda/test_dist_nccl

valgrind: $(B)/test_core $(B)/test_capture $(B)/test_capture_fuzz
	valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=all $(B)/test_core --quick
	valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=all $(B)/test_capture --quick
	valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=all $(B)/test_capture_fuzz 100

# benchmarks (never part of `make test`): build/bench and, when bench/gemm.c
# and OpenBLAS are there, build/bench_gemm; bench/run.sh builds what it needs
bench: $(B)/bench
	@MAKE="$(MAKE)" CC="$(CC)" CASES="$(CASES)" THREADS="$(THREADS)" ROUNDS="$(ROUNDS)" MPIRUN="$(MPIRUN)" bench/run.sh

$(B)/bench: bench/bench.c dl.h examples/lenet_bn.h examples/resnet18.h examples/resnet_small.h examples/cli.h | $(B)
	$(CC) $(WARN) $(BENCH_FLAGS) -I. $< -o $@ $(LDLIBS)
$(B)/mpi/bench: bench/bench.c dl.h examples/lenet_bn.h examples/resnet18.h examples/resnet_small.h examples/cli.h | $(B)/mpi
	$(MPICC) $(WARN) $(BENCH_FLAGS) -DDL_MPI -I. $< -o $@ $(LDLIBS)
	@echo '$(CC) $(BENCH_FLAGS)' > $(B)/bench.flags

# dl.h against PyTorch on cuda:0 (the *_cuda cases; n/a without a GPU)
bench-cuda: $(B)/bench
	@MAKE="$(MAKE)" CC="$(CC)" CASES="$(if $(CASES),$(CASES),*_cuda)" THREADS=1 ROUNDS="$(ROUNDS)" bench/run.sh

$(B)/cuda/bench.o: bench/bench.c dl.h dl_cuda.cuh examples/lenet_bn.h examples/resnet18.h examples/resnet_small.h examples/cli.h | $(B)/cuda
	$(NVCC) $(NVFLAGS) -I. -c $< -o $@

# the ResNet's 3x3 convs, Winograd against the direct paths (dl.h only)
$(B)/bench_conv3x3: bench/conv3x3.c dl.h | $(B)
	$(CC) $(WARN) $(BENCH_FLAGS) -I. $< -o $@ $(LDLIBS)

$(B)/bench_gemm: bench/gemm.c dl.h | $(B)
ifeq ($(HAVE_OPENBLAS),1)
	$(CC) $(BENCH_FLAGS) -I. $< -o $@ -lopenblas $(LDLIBS)
else
	@echo "bench_gemm needs OpenBLAS (cblas.h, -lopenblas)"; exit 1
endif

clean:
	rm -rf $(B)
