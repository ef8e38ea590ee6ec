#!/usr/bin/env python3
"""tests/golden/gen_norm.py - PyTorch golden values for dl_norm (the 2-norm,
torch.linalg.vector_norm(x, 2, dims, keepdim)), added after core.bin was
made, read by tests/test_golden.c in the format and case layout of gen.py
(see its docstring). Params as gen.py's reductions: [keepdim, correction
(unused), all_flag, dims...]. Rows that are all zero: torch's gradient there
is 0 (its backward masks the division by the norm), also in the
Hessian-vector products of the "dd" cases (a gradient penalty's shape).

Run from the repository root:   python3 tests/golden/gen_norm.py [out.bin]
(default output: tests/golden/norm.bin). Deterministic:
torch.manual_seed(4321), CPU, float32.
"""
import sys

import torch

import goldfile
from goldfile import RECORDS, rec, randn, record_grads

torch.manual_seed(4321)


def case(name, x, dims, keepdim, dd=False):
    t = x.detach().clone().to(torch.float32).requires_grad_(True)
    allf = dims is None
    tdims = tuple(range(t.dim())) if allf else tuple(dims)
    out = torch.linalg.vector_norm(t, 2, dim=tdims, keepdim=keepdim)
    rec(name + "/x", t)
    rec(name + "/params", torch.tensor([float(keepdim), 1.0, float(allf)] + [float(d) for d in (dims or [])],
                                       dtype=torch.float32))
    record_grads(name, out, [t], ["x"], dd)


def zero_row(*s):
    x = randn(*s)
    x[1] = 0.0
    return x


case("norm/d1", randn(3, 4), [1], False)
case("norm/d1k", randn(3, 4), [1], True)
case("norm/dneg", randn(3, 4, 5), [-1], False)
case("norm/d02", randn(3, 4, 5), [0, 2], False)
case("norm/d02k", randn(3, 4, 5), [0, 2], True)
case("norm/all", randn(3, 4), None, False)
case("norm/allk", randn(2, 3, 4), None, True)
case("norm/size1", randn(3, 1, 4), [1], False)
case("norm/zero_row", zero_row(3, 4), [1], False)
case("norm/zero_all", torch.zeros(2, 3), None, False)
case("norm/big", randn(2, 5) * 1e18, [1], False)       # squares near 1e36: still finite
case("norm/dd", randn(3, 4), [1], False, dd=True)
case("norm/dd_zero_row", zero_row(3, 4), [1], False, dd=True)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/norm.bin"
    goldfile.write(path, RECORDS)


if __name__ == "__main__":
    main()
