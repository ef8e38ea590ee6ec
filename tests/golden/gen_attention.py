#!/usr/bin/env python3
"""tests/golden/gen_attention.py - PyTorch golden values for
dl_scaled_dot_product_attention (F.scaled_dot_product_attention) and
dl_nn_multihead_attention (nn.MultiheadAttention, batch_first=True), read
by tests/test_layers.c.

"sdpa/<case>/<field>": config [mask (0 none, 1 bool, 2 float), is_causal,
scale (0: default)]; q, k, v, mask (bool: 1/0, given to dl.h as int32);
gout; out; grad_q, grad_k, grad_v (grad_mask for a float mask).
"mha/<case>/<field>": config [E, H, bias, inputs (0: query is key is value,
1: key is value, 2: three), key_padding_mask (0 none, 1 bool, 2 float),
attn_mask (0 none, 1 bool, 2 float), attn_mask 3-d (N*H, L, S), is_causal,
batched]; "p.<name>" per state_dict entry in torch's order; query, key,
value (as many as distinct), kpm, am; gout; out; weights (the head
average); grad_query (grad_key, grad_value), "grad_p.<name>". Also
tests/golden/mha_torch.safetensors: the case three_inputs_masks' state_dict
(safetensors.torch.save_file), which test_layers loads with dl_load_module.

Run from the repository root (torch and safetensors):
    python3 tests/golden/gen_attention.py [out.bin]
(default output: tests/golden/attention.bin). Deterministic:
torch.manual_seed(2027), CPU, float32, dropout 0.
"""
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

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


def mha(name, E, H, bias=True, inputs=0, kpm=0, am=0, am3=False, causal=False, batched=True, N=2, L=4, S=4,
        save=None):
    n = "mha/" + name
    m = torch.nn.MultiheadAttention(E, H, bias=bias, batch_first=True)
    # non-zero biases, so that they are tested
    with torch.no_grad():
        for pn, p in m.named_parameters():
            if "bias" in pn:
                p.copy_(randn(*p.shape) * 0.5)
    rec(n + "/config", torch.tensor([E, H, bias, inputs, kpm, am, am3, causal, batched], dtype=torch.float32))
    params = list(m.named_parameters())
    for pn, p in params:
        rec(n + "/p." + pn, p)
    if save:
        save_file({k: t.detach().contiguous() for k, t in m.state_dict().items()}, save)
    if inputs == 0:
        S = L
    lead = (N,) if batched else ()
    query = randn(*lead, L, E).requires_grad_(True)
    key = query if inputs == 0 else randn(*lead, S, E).requires_grad_(True)
    value = key if inputs <= 1 else randn(*lead, S, E).requires_grad_(True)
    req, fields = [query], ["query"]
    rec(n + "/query", query)
    if inputs >= 1:
        rec(n + "/key", key)
        req.append(key)
        fields.append("key")
    if inputs == 2:
        rec(n + "/value", value)
        req.append(value)
        fields.append("value")
    kp = None
    if kpm:
        kshape = (N, S) if batched else (S,)
        kp = torch.rand(kshape) < 0.3
        kp[..., 0] = False   # no row fully masked: torch's need_weights path gives NaN there
        if kpm == 2:
            kp = torch.where(kp, float("-inf"), randn(*kshape))
        rec(n + "/kpm", kp.float())
    a = None
    if causal:
        a = torch.triu(torch.ones(L, S, dtype=torch.bool), 1)
    elif am:
        ashape = (N * H, L, S) if am3 else (L, S)
        a = torch.rand(ashape) < 0.3
        a[..., 0] = False
        if am == 2:
            a = torch.where(a, float("-inf"), randn(*ashape))
        rec(n + "/am", a.float())
    out, w = m(query, key, value, key_padding_mask=kp, attn_mask=a, is_causal=causal, need_weights=True)
    gout = randn(*out.shape)
    rec(n + "/gout", gout)
    rec(n + "/out", out)
    rec(n + "/weights", w)
    gr = torch.autograd.grad(out, req + [p for _, p in params], gout)
    for f, g in zip(fields, gr):
        rec(n + "/grad_" + f, g)
    for (pn, _), g in zip(params, gr[len(req):]):
        rec(n + "/grad_p." + pn, g)


mha("self", 8, 2)
mha("self_1head_nobias", 6, 1, bias=False)
mha("kv_same", 8, 4, inputs=1, S=5)
mha("three_inputs_masks", 6, 3, inputs=2, S=3, L=5, kpm=1, am=2, save="tests/golden/mha_torch.safetensors")
mha("float_kpm_bool_am3", 4, 2, inputs=2, S=6, kpm=2, am=1, am3=True)
mha("causal", 8, 2, causal=True, L=5)
mha("causal_kpm", 4, 2, causal=True, kpm=1)
mha("unbatched", 6, 2, inputs=2, S=3, batched=False, kpm=1, am=1)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/attention.bin"
    goldfile.write(path, goldfile.RECORDS)


if __name__ == "__main__":
    main()
