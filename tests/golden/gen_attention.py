#!/usr/bin/env python3
"""tests/golden/gen_attention.py - PyTorch golden values for
dl_scaled_dot_product_attention (F.scaled_dot_product_attention), read by
tests/test_layers.c.

"sdpa/<case>/<field>": config [mask (0 none, 1 bool, 2 float), is_causal,
scale (0: default)]; q, k, v, mask (bool: 1/0, given to dl.h as int32);
gout; out; grad_q, grad_k, grad_v (grad_mask for a float mask).

Run from the repository root:   python3 tests/golden/gen_attention.py [out.bin]
(default output: tests/golden/attention.bin). Deterministic:
torch.manual_seed(2027), CPU, float32, dropout 0.
"""
import sys

import torch
import torch.nn.functional as F

import goldfile
from goldfile import rec, randn

torch.manual_seed(2027)


def sdpa(name, qs, ks, vs, mask=0, mshape=None, causal=False, scale=0.0, full_row=False):
    n = "sdpa/" + name
    rec(n + "/config", torch.tensor([mask, causal, scale], dtype=torch.float32))
    q, k, v = (randn(*s).requires_grad_(True) for s in (qs, ks, vs))
    rec(n + "/q", q)
    rec(n + "/k", k)
    rec(n + "/v", v)
    m = None
    req = [q, k, v]
    if mask == 1:
        m = torch.rand(mshape) < 0.7
        if full_row:
            m[..., 1, :] = False
        rec(n + "/mask", m.float())
    elif mask == 2:
        m = randn(*mshape)
        m[torch.rand(mshape) < 0.3] = float("-inf")
        if full_row:
            m[..., 1, :] = float("-inf")
        m.requires_grad_(True)
        rec(n + "/mask", m)
        req.append(m)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                         scale=scale if scale != 0 else None)
    gout = randn(*out.shape)
    rec(n + "/gout", gout)
    rec(n + "/out", out)
    gr = torch.autograd.grad(out, req, gout)
    for f, g in zip(["q", "k", "v", "mask"], gr):
        rec(n + "/grad_" + f, g)


sdpa("plain", (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 4))
sdpa("causal", (2, 4, 3), (2, 6, 3), (2, 6, 5), causal=True)
sdpa("causal_l_gt_s", (1, 2, 5, 4), (1, 2, 3, 4), (1, 2, 3, 4), causal=True)
sdpa("bool_mask_full_row", (2, 2, 4, 3), (2, 2, 5, 3), (2, 2, 5, 3), mask=1, mshape=(4, 5), full_row=True)
sdpa("float_mask_full_row", (2, 2, 4, 3), (2, 2, 5, 3), (2, 2, 5, 2), mask=2, mshape=(2, 1, 4, 5), full_row=True)
sdpa("broadcast_batch", (2, 1, 3, 4), (1, 3, 5, 4), (3, 5, 2))
sdpa("unbatched_scale", (3, 4), (5, 4), (5, 6), scale=0.3)
sdpa("bool_mask_bcast", (3, 2, 4), (3, 6, 4), (3, 6, 4), mask=1, mshape=(3, 1, 6))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/attention.bin"
    goldfile.write(path, goldfile.RECORDS)


if __name__ == "__main__":
    main()
