#!/bin/sh
# make test without nvcc: the CUDA tests (test_cuda on emulated devices) are
# not built; say so in the harness's format.
echo "SKIP test_cuda: nvcc not found, so the CUDA build and its emulated test do not run (make test-cuda-emu)"
echo "0 passed, 0 failed, 1 skipped"
