#!/usr/bin/env python3
"""tests/golden/gen_dropout.py - PyTorch golden values for dl_dropout, read
by tests/test_nn_ops.c (test_golden_dropout).

Run from the repository root:   python3 tests/golden/gen_dropout.py [out.bin]
(default output: tests/golden/dropout.bin). Works with torch 1.13 and newer.
Deterministic: torch.manual_seed(8642), CPU, float32.

Dropout draws its mask from dl.h's generator, not PyTorch's, so a golden
case needs dl.h's mask: this script computes it as dl.h documents it
(Philox4x32-10, Salmon et al. SC 2011, of the counter offset + i keyed by
the seed; element i is zeroed where the top 24 bits of the first word,
times 2^-24, are below p; dl_set_rng_state sets seed and offset), checks
its Philox against the paper's known answers, and then takes PyTorch's
arithmetic on that mask: torch's own dropout (native_dropout) computes
input * mask * (1 / (1 - p)), the scale a double rounded once to float;
the script checks that F.dropout's kept values are x times that scale,
bit for bit, and its dropped ones 0, with PyTorch's own random mask,
and records out = x * (mask * scale) with its gradient (g * mask *
scale) and double backward. The C side sets the generator's state and
calls dl_dropout(x, p, true), whose mask must be this one (an element
dropped on one side only is off by |x| / (1 - p), far past the golden
tolerance).

FILE FORMAT: as tests/golden/core.bin (see gen.py). RECORD NAMES
dropout/<case>/{x, params, gout, out, grad_x[, v_x, hv_x]}; params =
[p, seed, offset mod 2^24, offset / 2^24] (each exact in float32).
"""
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldfile  # noqa: E402
from goldfile import RECORDS, rec, randn, record_grads  # noqa: E402

torch.manual_seed(8642)
M32 = 0xFFFFFFFF


def philox(counter, key):
    """dl__philox: Philox4x32-10 of the counter (c0, c1 = its two halves,
    c2 = c3 = 0) keyed by (k0, k1) = the key's halves; the four words"""
    c0, c1, c2, c3 = counter & M32, (counter >> 32) & M32, 0, 0
    k0, k1 = key & M32, (key >> 32) & M32
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def check_philox():
    """the known answers of Random123's kat_vectors for philox4x32_10 (whose
    counter words c2, c3 dl.h keeps at 0, and whose key is (k0, k1))"""
    assert philox(0, 0) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8), "Philox known answer (zeros)"


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def dl_mask(n, p, seed, offset):
    """dl.h's mask for n elements: 0 where dropped, else 1 (the scale apart)"""
    seed = seed if seed else 0x5EED   # (dl_set_rng_state: a zero seed is 0x5eed)
    keep = []
    for i in range(n):
        u = (philox(offset + i, seed)[0] >> 8) * (1.0 / 16777216.0)
        keep.append(0.0 if u < p else 1.0)
    return torch.tensor(keep, dtype=torch.float32)


def scale_of(p):
    """native_dropout's scale: 1 / (1 - p) in double, rounded to float when it multiplies"""
    return f32(1.0 / (1.0 - p)) if p < 1.0 else 0.0


def check_torch(p):
    """F.dropout (PyTorch's own mask): kept values are x * scale_of(p), bit for bit, the
    rest 0; its gradient likewise (a look at the arithmetic the recorded cases copy)"""
    x = (randn(4000) * 3).requires_grad_(True)
    y = F.dropout(x, p, training=True)
    g = randn(4000)
    (gx,) = torch.autograd.grad(y, x, g)
    kept = y != 0
    s = torch.tensor(scale_of(p), dtype=torch.float32)
    assert torch.equal(y[kept], x.detach()[kept] * s), "F.dropout's kept values are x * scale"
    assert torch.equal(gx[kept], g[kept] * s), "F.dropout's gradient is g * scale where kept"
    assert bool((gx[~kept] == 0).all()), "F.dropout's gradient is 0 where dropped"
    frac = 1.0 - kept.float().mean().item()
    assert abs(frac - p) < 0.05, "F.dropout dropped %.3f, p %.3f" % (frac, p)


def case(cname, shape, p, seed, offset, dd=False):
    p = f32(p)   # dl_dropout takes a float p: both sides use that value
    x = randn(*shape) * 2 + 0.25
    n = x.numel()
    mask = (dl_mask(n, p, seed, offset) * scale_of(p)).reshape(shape) if 0.0 < p < 1.0 else \
        (torch.zeros(shape) if p == 1.0 else None)
    name = "dropout/" + cname
    rec(name + "/x", x)
    rec(name + "/params", torch.tensor([p, float(seed), float(offset % (1 << 24)), float(offset >> 24)],
                                       dtype=torch.float32))
    xr = x.clone().requires_grad_(True)
    out = xr if mask is None else xr * mask   # (p = 0: x itself, as F.dropout and dl_dropout give it)
    if mask is None:
        out = out * 1.0
    record_grads(name, out, [xr], ["x"], dd)


def main():
    check_philox()
    for p in (0.1, 0.5, 0.8):
        check_torch(f32(p))
    case("p03", (7,), 0.3, 12345, 0)
    case("p05_3d", (3, 4, 5), 0.5, 1, 1000)
    case("p01_big", (2, 1000), 0.1, 99991, 77777)
    case("p08_dd", (5, 6), 0.8, 424242, 5, dd=True)
    case("p0999", (64,), 0.999, 7, 123)
    case("seed0", (9,), 0.25, 0, 0)   # the zero seed: 0x5eed, as dl_manual_seed(0)
    case("carry", (40,), 0.5, 31337, (1 << 32) - 20)   # counters cross into the high word
    case("p1", (6,), 1.0, 5, 0)
    case("p0", (6,), 0.0, 5, 0)
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/dropout.bin"
    goldfile.write(path, RECORDS)


if __name__ == "__main__":
    main()
