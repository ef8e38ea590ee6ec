#!/usr/bin/env python3
"""tests/golden/gen_activations.py - PyTorch golden values for the
activations added after core.bin was made (SiLU), read by
tests/test_golden.c in the same format and with the same case layout as
gen.py (see its docstring).

Run from the repository root:   python3 tests/golden/gen_activations.py [out.bin]
(default output: tests/golden/activations.bin). Deterministic:
torch.manual_seed(2468), CPU, float32.
"""
import sys

import torch

import goldfile
from goldfile import RECORDS, rec, randn, record_grads

torch.manual_seed(2468)


def case(name, inputs, fn, dd=False):
    """inputs: list of (field, tensor), all requiring grad; dd: also record a
    Hessian-vector product"""
    ts = [t.detach().clone().to(torch.float32).requires_grad_(True) for _, t in inputs]
    out = fn(*ts)
    for (f, _), t in zip(inputs, ts):
        rec(name + "/" + f, t)
    record_grads(name, out, ts, [f for f, _ in inputs], dd)


silu = torch.nn.functional.silu
case("silu/a", [("x", randn(3, 4))], silu)
case("silu/b", [("x", randn(2, 6) * 4)], silu)          # both tails
case("silu/c", [("x", randn(5))], silu)
case("silu/d", [("x", randn(2, 3, 4) * 0.1)], silu)     # near 0
case("silu/big", [("x", torch.tensor([-100.0, -30.0, -0.0, 30.0, 100.0]))], silu)
case("silu/dd", [("x", randn(3, 4) * 2)], silu, dd=True)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/activations.bin"
    goldfile.write(path, RECORDS)


if __name__ == "__main__":
    main()
