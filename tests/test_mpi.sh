#!/bin/sh
# `make test-mpi`: tests/test_mpi.c under mpirun with 2 processes (built by
# make as build/mpi/test_mpi). MPIRUN overrides the launcher.
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
B=${B:-build}
exec timeout 300 $MPIRUN -np 2 "$B/mpi/test_mpi"
