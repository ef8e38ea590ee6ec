# dl.h - build, test and run. `make run` trains; `make test` checks everything.
CC      ?= cc
CFLAGS  ?= -O2 -g
WARN     = -std=c99 -Wall -Wextra -Werror -pedantic
CXXWARN  = -Wall -Wextra -Werror -pedantic
LDLIBS   = -lm -lpthread
B        = build
SAN      = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
HAVE_OPENBLAS := $(shell echo 'int main(void){return 0;}' | $(CC) -include cblas.h -x c - -o /dev/null -lopenblas >/dev/null 2>&1 && echo 1)
HAVE_NATIVE   := $(shell echo 'int main(void){return 0;}' | $(CC) -march=native -x c - -o /dev/null >/dev/null 2>&1 && echo 1)
HAVE_ZLIB     := $(shell echo 'int main(void){return 0;}' | $(CC) -include zlib.h -x c - -o /dev/null -lz >/dev/null 2>&1 && echo 1)
HAVE_CLANG    := $(shell command -v clang >/dev/null 2>&1 && echo 1)
HAVE_CXX      := $(shell command -v g++ >/dev/null 2>&1 && echo 1)

# tests/test_mpi.c needs mpicc and mpirun: `make test-mpi`
TEST_SRC := $(filter-out tests/test_mpi.c,$(sort $(wildcard tests/test_*.c)))
TESTS     = $(patsubst tests/%.c,$(B)/%,$(TEST_SRC)) $(B)/test_quickstart
# shell tests: the examples' command line (needs the examples built), `make data`
SCRIPTS   = tests/test_cli.sh tests/test_fetch_data.sh
# the same checks built other ways: clang, C++, OpenBLAS
EXTRA     = $(if $(HAVE_CLANG),$(B)/test_core_clang) $(if $(HAVE_CXX),$(B)/test_core_cxx $(B)/test_ops_cxx $(B)/test_dist_cxx) \
            $(if $(HAVE_OPENBLAS),$(B)/test_ops_openblas) $(if $(HAVE_ZLIB),$(B)/test_data_zlib $(B)/test_hardening_debug)
SANTESTS  = $(patsubst tests/%.c,$(B)/san/%,$(TEST_SRC))
DEPS      = dl.h tests/harness.h tests/golden.h tests/dist_models.h
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

.PHONY: all test sanitize valgrind clean run data fuzz bench test-mpi nccl-check
all: $(TESTS) $(EXTRA) $(EXAMPLES)

$(B) $(B)/san:
	mkdir -p $@

$(B)/%: tests/%.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

$(B)/%: examples/%.c dl.h examples/common.h | $(B)
	$(CC) $(WARN) $(EXFLAGS) -I. $< -o $@ $(LDLIBS)

# the main job: LeNet-BN on Fashion-MNIST (make run EPOCHS=3). TensorBoard
# logs go to a new directory under runs/ each time (LOGDIR=dir for another,
# LOGDIR= for none); the run prints the `tensorboard --logdir` line to use
run: $(B)/lenet data
	$(B)/lenet --epochs $(EPOCHS)$(if $(LOGDIR), --logdir $(LOGDIR))

data:
	@examples/fetch_data.sh

# libFuzzer targets for the file loaders, FUZZ_SECONDS each
fuzz: | $(B)
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. tests/fuzz_idx.c -o $(B)/fuzz_idx -lm -lpthread
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. tests/fuzz_checkpoint.c -o $(B)/fuzz_checkpoint -lm -lpthread
	mkdir -p $(B)/corpus_idx $(B)/corpus_ckpt
	$(B)/fuzz_idx -max_total_time=$(FUZZ_SECONDS) $(B)/corpus_idx
	$(B)/fuzz_checkpoint -max_total_time=$(FUZZ_SECONDS) $(B)/corpus_ckpt

# the quick start of dl.h's doc block, cut out of the header and compiled
$(B)/quickstart.c: dl.h | $(B)
	sed -n '/QUICK START/,/BUILD FLAGS/p' dl.h | sed '1,2d;$$d' | sed 's/^       //' > $@
$(B)/test_quickstart: $(B)/quickstart.c tests/quickstart_check.sh | $(B)
	$(CC) $(WARN) $(CFLAGS) -I. $< -o $(B)/quickstart $(LDLIBS)
	cp tests/quickstart_check.sh $@ && chmod +x $@

$(B)/test_core_clang: tests/test_core.c $(DEPS) | $(B)
	clang $(WARN) $(CFLAGS) -I. $< -o $@ $(LDLIBS)
$(B)/test_core_cxx: tests/test_core.c $(DEPS) | $(B)
	g++ -x c++ $(CXXWARN) $(CFLAGS) -I. $< -o $@ -lpthread
$(B)/test_ops_cxx: tests/test_ops.c $(DEPS) | $(B)
	g++ -x c++ $(CXXWARN) $(CFLAGS) -I. $< -o $@ -lpthread
$(B)/test_dist_cxx: tests/test_dist.c $(DEPS) | $(B)
	g++ -x c++ $(CXXWARN) $(CFLAGS) -I. $< -o $@ -lpthread
$(B)/test_data_zlib: tests/test_data.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -DDL_ZLIB -I. $< -o $@ -lz $(LDLIBS)
$(B)/test_hardening_debug: tests/test_hardening.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -DDL_DEBUG -DDL_ZLIB -I. $< -o $@ -lz $(LDLIBS)
$(B)/test_ops_openblas: tests/test_ops.c $(DEPS) | $(B)
	$(CC) $(WARN) $(CFLAGS) -DDL_OPENBLAS -I. $< -o $@ -lopenblas $(LDLIBS)

test: all
	@tests/run.sh $(TESTS) $(EXTRA) $(SCRIPTS)

$(B)/san/%: tests/%.c $(DEPS) | $(B)/san
	$(CC) $(WARN) -O1 -g $(SAN) -DDL_DEBUG -I. $< -o $@ $(LDLIBS)

# threaded code (the loader's workers, the kernel thread pool, the allreduce ring) under ThreadSanitizer
TSANTESTS = $(B)/tsan/test_data $(B)/tsan/test_core $(B)/tsan/test_hardening $(B)/tsan/test_dist
$(B)/tsan:
	mkdir -p $@
$(B)/tsan/%: tests/%.c $(DEPS) | $(B)/tsan
	$(CC) $(WARN) -O1 -g -fsanitize=thread -DDL_DEBUG -I. $< -o $@ $(LDLIBS)

sanitize: $(SANTESTS) $(TSANTESTS)
	@ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1 \
	    tests/run.sh $(SANTESTS) $(TSANTESTS)

# MPI: dl_comm across 2 processes (mpicc -DDL_MPI, with DL_DEBUG's replica
# checks, mpirun -np 2), and a rank that hangs or dies mid-allreduce
# (DL_COMM_TIMEOUT=2)
MPICC  ?= mpicc
MPIRUN ?= mpirun --allow-run-as-root --oversubscribe
$(B)/mpi:
	mkdir -p $@
$(B)/mpi/test_mpi: tests/test_mpi.c $(DEPS) | $(B)/mpi
	$(MPICC) $(WARN) $(CFLAGS) -DDL_MPI -DDL_DEBUG -I. $< -o $@ $(LDLIBS)
$(B)/mpi/data_parallel: examples/data_parallel.c dl.h examples/common.h | $(B)/mpi
	$(MPICC) $(WARN) $(EXFLAGS) -DDL_MPI -I. $< -o $@ $(LDLIBS)
test-mpi: $(B)/mpi/test_mpi
	@B=$(B) MPIRUN="$(MPIRUN)" tests/run.sh tests/test_mpi.sh tests/test_mpi_kill.sh

# NCCL: the communicator's NCCL code compiles and links with nvcc (alone, and
# with MPI for the unique id); nothing CUDA runs on a machine without a GPU
NVCC ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
NVFLAGS = -x cu -O2 -Xcompiler -Wall,-Wextra,-Werror -I. -Itests
nccl-check: | $(B)/mpi
	$(NVCC) $(NVFLAGS) -DDL_NCCL tests/test_dist.c -o $(B)/test_dist_nccl -lnccl
	$(NVCC) $(NVFLAGS) -DDL_NCCL -DDL_MPI $$($(MPICC) --showme:compile) tests/test_mpi.c \
	    -o $(B)/mpi/test_mpi_nccl -lnccl $$($(MPICC) --showme:link)
	@echo "nccl-check: the NCCL backend compiles and links"

valgrind: $(B)/test_core
	valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=all $(B)/test_core --quick

# benchmarks (never part of `make test`): build/bench and, when bench/gemm.c
# and OpenBLAS are there, build/bench_gemm; bench/run.sh builds what it needs
bench: $(B)/bench
	@MAKE="$(MAKE)" CC="$(CC)" CASES="$(CASES)" THREADS="$(THREADS)" ROUNDS="$(ROUNDS)" bench/run.sh

$(B)/bench: bench/bench.c dl.h | $(B)
	$(CC) $(WARN) $(BENCH_FLAGS) -I. $< -o $@ $(LDLIBS)
	@echo '$(CC) $(BENCH_FLAGS)' > $(B)/bench.flags

$(B)/bench_gemm: bench/gemm.c dl.h | $(B)
ifeq ($(HAVE_OPENBLAS),1)
	$(CC) $(BENCH_FLAGS) -I. $< -o $@ -lopenblas $(LDLIBS)
else
	@echo "bench_gemm needs OpenBLAS (cblas.h, -lopenblas)"; exit 1
endif

clean:
	rm -rf $(B)
