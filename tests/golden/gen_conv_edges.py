#!/usr/bin/env python3
"""tests/golden/gen_conv_edges.py - PyTorch golden values for edge cases of
convolution and pooling, read by tests/test_conv.c next to conv.bin (same
runner, tests/golden.h; params as gen_conv.py's).

Run from the repository root:   python3 tests/golden/gen_conv_edges.py [out.bin]
(default output: tests/golden/conv_edges.bin). Works with torch 1.13 and
newer. Deterministic: torch.manual_seed(1470), CPU, float32.

  max_pool2d/mask            the second derivative through max pooling's
                             backward: its first gradient carries history
                             (greq 1), zeros (see gen_masks.py)
  conv_transpose{1,2,3}d/empty*   a batched transposed convolution whose
                             output has a spatial size of exactly 0: PyTorch
                             returns an empty (N, OC, ...) tensor, the
                             inputs' gradients zeros (unbatched it refuses)
  max_pool2d, avg_pool2d, conv2d /special*   NaN and +-inf in x
  avg_pool{1,2}d/mask, adaptive_avg_pool{1,2}d/mask_o*   average pooling's
                             first gradient carries history, its second
                             derivative zeros; not an adaptive pool to all
                             1s (PyTorch's mean)
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldfile  # noqa: E402
from goldfile import case, randn  # noqa: E402

torch.manual_seed(1470)


def three(v, nsp, fill=0):
    v = list(v) if isinstance(v, (list, tuple)) else [v] * nsp
    return v + [fill] * (3 - nsp)


# max pooling: kernel[3], stride[3], padding[3], dilation[3], ceil_mode, count_include_pad
x = (torch.arange(2 * 2 * 6 * 6, dtype=torch.float32) * 0.2 + 0.06)[torch.randperm(144)].reshape(2, 2, 6, 6)
case("max_pool2d/mask", [("x", x)], lambda t: F.max_pool2d(t, 2),
     [2, 2, 0, 2, 2, 0, 0, 0, 0, 1, 1, 0, 0, 1], dd=True, greq=True)

# conv_transpose: stride[3], padding[3], dilation[3], output_padding[3], groups, padding_same
CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
for nsp in (1, 2, 3):
    for cname, pad in (("empty", 1), ("empty_first", [1] + [0] * (nsp - 1))):
        if nsp == 1 and cname == "empty_first":
            continue
        pads = three(pad, nsp)

        def fn(x, w, b, nsp=nsp, pads=pads):
            return CONVT[nsp](x, w, b, padding=tuple(pads[:nsp]))
        case("conv_transpose%dd/%s" % (nsp, cname),
             [("x", randn(2, 3, *([1] * nsp))), ("w", randn(3, 4, *([2] * nsp))), ("b", randn(4))], fn,
             three(1, nsp) + pads + three(1, nsp) + [0, 0, 0] + [1, 0])

# special values in x (NaN, +-inf): max and average pooling, a padded conv2d
# (an inf or NaN weight is left out: PyTorch's input gradient adds only the
# taps that land inside x, dl.h's padded sums the zero-padding's products
# too, NaN times a weight's inf or NaN, so NaNs spread over more of x)
NAN, INF = float("nan"), float("inf")
xs = randn(1, 2, 6, 6)
for (c, r, q), v in (((0, 0, 0), NAN), ((0, 2, 3), INF), ((1, 4, 4), -INF), ((1, 0, 5), NAN), ((1, 1, 1), INF),
                     ((0, 5, 5), -INF), ((0, 3, 0), NAN), ((0, 3, 1), INF)):
    xs[0, c, r, q] = v
for k, st, pd in ((2, 2, 0), (3, 1, 1), (3, 2, 1)):
    pp = three(k, 2) + three(st, 2) + three(pd, 2) + three(1, 2) + [0, 1]
    case("max_pool2d/special_k%d_s%d_p%d" % (k, st, pd), [("x", xs)],
         lambda t, k=k, st=st, pd=pd: F.max_pool2d(t, k, st, pd), pp)
    case("avg_pool2d/special_k%d_s%d_p%d" % (k, st, pd), [("x", xs)],
         lambda t, k=k, st=st, pd=pd: F.avg_pool2d(t, k, st, pd), pp)
case("conv2d/special", [("x", xs), ("w", randn(3, 2, 3, 3)), ("b", randn(3))],
     lambda a, w, b: F.conv2d(a, w, b, padding=1), three(1, 2) + three(1, 2) + three(1, 2) + [0, 0, 0] + [1, 0])

# average pooling's first gradient carries history in PyTorch (its backward
# reads x), its second derivative zeros; an adaptive pool to all 1s is a mean
# there, whose backward does not read x: no history (gen_fuzz.py found it)
ADAP = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d}
case("avg_pool2d/mask", [("x", randn(2, 2, 6, 6))], lambda t: F.avg_pool2d(t, 3, 2, 1),
     [3, 3, 0, 2, 2, 0, 1, 1, 0, 1, 1, 0, 0, 1], dd=True, greq=True)
case("avg_pool1d/mask", [("x", randn(2, 3, 7))], lambda t: F.avg_pool1d(t, 2, ceil_mode=True),
     [2, 0, 0, 2, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1], dd=True, greq=True)
for nsp, o in ((2, [3, 2]), (2, [1, 1]), (1, [2]), (1, [1])):
    case("adaptive_avg_pool%dd/mask_o%s" % (nsp, "".join(map(str, o))), [("x", randn(2, 2, *([5] * nsp)))],
         lambda t, nsp=nsp, o=o: ADAP[nsp](t, o), three(o, nsp), dd=True, greq=True)

goldfile.write(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/conv_edges.bin", goldfile.RECORDS)
