#!/usr/bin/env python3
"""tests/golden/gen_conv.py - PyTorch golden values for dl.h's convolution,
transposed convolution and pooling (parts/conv_*.h), and a whole d2l LeNet
forward + backward.

Run from the repository root:   /usr/bin/python3 tests/golden/gen_conv.py [out.bin]
(default output: tests/golden/conv.bin). Works with torch 1.13 and newer.
Deterministic: torch.manual_seed(4321), CPU, float32.

FILE FORMAT: the same as tests/golden/core.bin (see gen.py): magic
"DLGOLD1\\0", uint32 version 1, uint32 record count, then records
(uint32 name length, name, uint32 ndim, int64 shape[ndim], float32 values).

RECORD NAMES are "<op>/<case>/<field>", a case's records consecutive:
inputs (x, w, b; lenet: X, W1, b1, ..., W5, b5, R), params, gout, v_<input>,
out, grad_<input>, hv_<input> (as gen.py). <op> is conv1d..3d,
conv_transpose1d..3d, max_pool1d..3d, avg_pool1d..3d,
adaptive_avg_pool1d..3d or lenet. params (floats; 3 entries per array,
unused dims 0):
    conv*:      stride[3], padding[3], dilation[3], output_padding[3],
                groups, padding_same
    *_pool*:    kernel[3], stride[3], padding[3], dilation[3], ceil_mode,
                count_include_pad
    adaptive*:  output_size[3]
"""
import struct
import goldfile
from goldfile import RECORDS, rec, randn, record_grads
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(4321)
torch.set_grad_enabled(True)







def distinct(*s):
    """distinct values on a 0.2 grid (no ties for max pooling), shuffled"""
    n = 1
    for d in s:
        n *= d
    v = (torch.arange(n, dtype=torch.float32) - n // 2) * 0.2 + 0.06
    return v[torch.randperm(n)].reshape(s)


def case(name, inputs, fn, params=None, grad=None, dd=False, gout=None):
    if grad is None:
        grad = [f for f, _ in inputs]
    ts = []
    for f, t in inputs:
        t = t.detach().clone().to(torch.float32)
        if f in grad:
            t.requires_grad_(True)
        ts.append(t)
    req = [t for (f, _), t in zip(inputs, ts) if f in grad]
    reqf = [f for f, _ in inputs if f in grad]
    out = fn(*ts)
    for (f, _), t in zip(inputs, ts):
        rec(name + "/" + f, t)
    if params is not None:
        rec(name + "/params", torch.tensor(params, dtype=torch.float32))
    record_grads(name, out, req, reqf, dd, gout)


def three(v, nsp, fill=0):
    v = list(v) if isinstance(v, (list, tuple)) else [v] * nsp
    return v + [fill] * (3 - nsp)


# ------------------------------------------------------------ convolution
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def conv_case(cname, nsp, N, C, OC, size, k, stride=1, padding=0, dilation=1, groups=1,
              bias=True, same=False, dd=False):
    sp = three(size, nsp)[:nsp]
    ks = three(k, nsp)[:nsp]
    x = randn(N, C, *sp)
    w = randn(OC, C // groups, *ks) * 0.5
    ins = [("x", x), ("w", w)]
    if bias:
        ins.append(("b", randn(OC)))
    st, pd, dl = three(stride, nsp), three(padding, nsp), three(dilation, nsp)
    params = st + pd + dl + [0, 0, 0] + [groups, 1 if same else 0]
    pad = "same" if same else tuple(pd[:nsp])

    def fn(x, w, b=None):
        return CONV[nsp](x, w, b, stride=tuple(st[:nsp]), padding=pad,
                         dilation=tuple(dl[:nsp]), groups=groups)
    case("conv%dd/%s" % (nsp, cname), ins, fn, params=params, dd=dd)


def convt_case(cname, nsp, N, C, OC, size, k, stride=1, padding=0, dilation=1, groups=1,
               output_padding=0, bias=True, dd=False):
    sp = three(size, nsp)[:nsp]
    ks = three(k, nsp)[:nsp]
    x = randn(N, C, *sp)
    w = randn(C, OC // groups, *ks) * 0.5
    ins = [("x", x), ("w", w)]
    if bias:
        ins.append(("b", randn(OC)))
    st, pd, dl = three(stride, nsp), three(padding, nsp), three(dilation, nsp)
    op = three(output_padding, nsp)
    params = st + pd + dl + op + [groups, 0]

    def fn(x, w, b=None):
        return CONVT[nsp](x, w, b, stride=tuple(st[:nsp]), padding=tuple(pd[:nsp]),
                          output_padding=tuple(op[:nsp]), groups=groups,
                          dilation=tuple(dl[:nsp]))
    case("conv_transpose%dd/%s" % (nsp, cname), ins, fn, params=params, dd=dd)


for nsp, size in ((1, 9), (2, (6, 7)), (3, (4, 5, 4))):
    conv_case("plain", nsp, 2, 3, 4, size, 3)
    conv_case("nobias", nsp, 2, 3, 4, size, 2, bias=False)
    conv_case("stride", nsp, 2, 2, 3, size, 2, stride=2)
    conv_case("pad", nsp, 1, 2, 3, size, 3, padding=1)
    conv_case("dil", nsp, 1, 2, 3, size, 2, dilation=2, padding=1)
    conv_case("groups", nsp, 2, 4, 6, size, 3, groups=2, padding=1)
    conv_case("depthwise", nsp, 1, 3, 6, size, 3, groups=3, stride=2)
    conv_case("same", nsp, 1, 2, 3, size, 3, same=True)
    conv_case("same_even", nsp, 1, 2, 2, size, 4, same=True, dilation=1)
    conv_case("same_dil", nsp, 1, 2, 2, size, 2, same=True, dilation=3)
    conv_case("k1", nsp, 2, 3, 4, size, 1)
    conv_case("mixed", nsp, 2, 4, 4, size, 2, stride=2, padding=1, dilation=2, groups=2)
    convt_case("plain", nsp, 2, 3, 4, size, 3)
    convt_case("nobias", nsp, 1, 3, 2, size, 2, bias=False)
    convt_case("stride", nsp, 2, 2, 3, size, 3, stride=2)
    convt_case("outpad", nsp, 1, 2, 3, size, 3, stride=2, padding=1, output_padding=1)
    convt_case("outpad_dil", nsp, 1, 2, 2, size, 2, stride=1, dilation=3, output_padding=2)
    convt_case("groups", nsp, 1, 4, 6, size, 3, groups=2, stride=2, padding=1)
    convt_case("depthwise", nsp, 1, 3, 3, size, 3, groups=3, padding=1)
    convt_case("k1", nsp, 2, 3, 2, size, 1)
conv_case("asym", 2, 2, 3, 4, (7, 8), (2, 3), stride=(1, 2), padding=(0, 1), dilation=(2, 1))
convt_case("asym", 2, 1, 3, 4, (4, 5), (3, 2), stride=(2, 3), padding=(1, 0),
           output_padding=(1, 2), dilation=(1, 1))
conv_case("dd", 2, 2, 4, 4, (5, 5), 3, stride=2, padding=1, groups=2, dd=True)
conv_case("dd", 1, 2, 2, 3, 7, 3, dilation=2, dd=True)
convt_case("dd", 2, 1, 2, 4, (3, 4), 3, stride=2, padding=1, output_padding=1, dd=True)
conv_case("dd_same", 3, 1, 2, 2, (3, 4, 3), 2, same=True, dd=True)

# ------------------------------------------------------------ pooling
MAXP = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVGP = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
ADAP = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}


def pool_case(kind, cname, nsp, shape, k, stride=0, padding=0, dilation=1, ceil=False, cip=True):
    ks, st, pd, dl = three(k, nsp), three(stride, nsp), three(padding, nsp), three(dilation, nsp)
    params = ks + st + pd + dl + [1 if ceil else 0, 1 if cip else 0]
    tst = tuple(st[i] if st[i] else ks[i] for i in range(nsp))
    x = distinct(*shape)
    if kind == "max":
        def fn(x):
            return MAXP[nsp](x, tuple(ks[:nsp]), tst, tuple(pd[:nsp]), tuple(dl[:nsp]),
                             ceil_mode=ceil)
    else:
        def fn(x):
            return AVGP[nsp](x, tuple(ks[:nsp]), tst, tuple(pd[:nsp]), ceil_mode=ceil,
                             count_include_pad=cip)
    case("%s_pool%dd/%s" % (kind, nsp, cname), [("x", x)], fn, params=params)


for nsp, shape in ((1, (2, 3, 11)), (2, (2, 2, 7, 8)), (3, (1, 2, 5, 6, 5))):
    for kind in ("max", "avg"):
        pool_case(kind, "k2", nsp, shape, 2)
        pool_case(kind, "k3s1", nsp, shape, 3, stride=1)
        pool_case(kind, "k3s2p1", nsp, shape, 3, stride=2, padding=1)
        pool_case(kind, "ceil", nsp, shape, 3, stride=2, ceil=True)
        pool_case(kind, "ceil_pad", nsp, shape, 3, stride=2, padding=1, ceil=True)
        pool_case(kind, "ceil_s3", nsp, shape, 2, stride=3, padding=1, ceil=True)
    pool_case("max", "dil", nsp, shape, 2, stride=1, dilation=2, padding=1)
    pool_case("max", "dil_ceil", nsp, shape, 2, stride=2, dilation=2, ceil=True)
    pool_case("avg", "nopad_count", nsp, shape, 3, stride=2, padding=1, cip=False)
    pool_case("avg", "nopad_ceil", nsp, shape, 3, stride=2, padding=1, ceil=True, cip=False)
pool_case("max", "asym", 2, (1, 2, 9, 7), (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))
pool_case("avg", "asym", 2, (1, 2, 9, 7), (3, 2), stride=(2, 1), padding=(1, 1), ceil=True)

for nsp, shape, outs in ((1, (2, 3, 10), [(4,), (3,), (1,), (13,)]),
                         (2, (2, 2, 7, 9), [(3, 4), (1, 1), (7, 9), (5, 2)]),
                         (3, (1, 2, 5, 6, 7), [(2, 3, 4), (1, 1, 1), (5, 2, 3)])):
    for i, o in enumerate(outs):
        case("adaptive_avg_pool%dd/o%d" % (nsp, i), [("x", randn(*shape))],
             (lambda o, nsp: lambda x: ADAP[nsp](x, o))(o, nsp), params=three(o, nsp))


# ------------------------------------------------------------ d2l LeNet
def lenet(X, W1, b1, W2, b2, W3, b3, W4, b4, W5, b5, R):
    h = torch.sigmoid(F.conv2d(X, W1, b1, padding=2))
    h = F.avg_pool2d(h, 2, 2)
    h = torch.sigmoid(F.conv2d(h, W2, b2))
    h = F.avg_pool2d(h, 2, 2)
    h = torch.flatten(h, 1)
    h = torch.sigmoid(h @ W3.t() + b3)
    h = torch.sigmoid(h @ W4.t() + b4)
    out = h @ W5.t() + b5
    return (out * R).sum()


def lin(o, i):
    bound = 1.0 / (i ** 0.5)
    return (torch.rand(o, i) * 2 - 1) * bound, (torch.rand(o) * 2 - 1) * bound


W1 = randn(6, 1, 5, 5) * 0.3
W2 = randn(16, 6, 5, 5) * 0.1
W3, b3 = lin(120, 400)
W4, b4 = lin(84, 120)
W5, b5 = lin(10, 84)
case("lenet/b4", [("X", torch.rand(4, 1, 28, 28)), ("W1", W1), ("b1", randn(6) * 0.1),
                  ("W2", W2), ("b2", randn(16) * 0.1), ("W3", W3), ("b3", b3), ("W4", W4),
                  ("b4", b4), ("W5", W5), ("b5", b5), ("R", randn(4, 10))],
     lenet, grad=["W1", "b1", "W2", "b2", "W3", "b3", "W4", "b4", "W5", "b5"],
     gout=torch.ones(()))


# ------------------------------------------------------------ 3-d over single frames
# (input depth 1, depth padding: output depths of padding only; 128+ output
# positions and stride 2, so that the CPU's im2col paths take them)
conv_case("frame", 3, 2, 3, 4, (1, 16, 16), (1, 3, 3), stride=(1, 2, 2), padding=1)
conv_case("frame_s3", 3, 1, 2, 2, (1, 12, 12), 1, stride=(3, 1, 1), padding=(1, 0, 0))
pool_case("max", "frame", 3, (1, 2, 1, 6, 6), (2, 2, 2), stride=(1, 2, 2), padding=(1, 0, 0))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/conv.bin"
    goldfile.write(path, RECORDS)


if __name__ == "__main__":
    main()
