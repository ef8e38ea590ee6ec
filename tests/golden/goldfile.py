"""Writes the golden-file format the C tests read (tests/golden.h):
magic b"DLGOLD1\\0", uint32 version 1, uint32 record count, then per record:
uint32 name length, name (ASCII), uint32 ndim, ndim x int64 shape, float32
values, all little-endian."""
import struct

import torch

RECORDS = []   # (name, tensor), in file order


def rec(name, t):
    """Appends a record: a float32 snapshot of t (later in-place changes do not show)."""
    t = torch.as_tensor(t).detach().to(torch.float32).contiguous().cpu().clone()
    RECORDS.append((name, t))


def randn(*s):
    return torch.randn(tuple(s), dtype=torch.float32)


def record_grads(name, out, req, reqf, dd=False, gout=None, v=None, greq=False):
    """Records what the C runner (tests/golden.h) checks for one case: gout
    (random unless given), v_<f> when dd (random unless given), then out,
    grad_<f> = d out/d req[i] under gout, and hv_<f>, the Hessian-vector
    product d/d req of sum_i grad_i . v_i. A gradient that does not exist is
    recorded as zeros. greq (with dd): also greq, 1 or 0 per input, whether
    its first gradient carries history (requires_grad)."""
    grads = hv = None
    if req:
        if gout is None:
            gout = randn(*out.shape)
        rec(name + "/gout", gout)
        grads = torch.autograd.grad(out, req, gout, create_graph=dd, allow_unused=True)
        if dd:
            vs = []
            for i, f in enumerate(reqf):
                vi = v[i] if v is not None else randn(*req[i].shape)
                vs.append(vi)
                rec(name + "/v_" + f, vi)
            s2 = None
            for g, vi in zip(grads, vs):
                if g is None or not g.requires_grad:
                    continue
                term = (g * vi).sum()
                s2 = term if s2 is None else s2 + term
            if greq:
                rec(name + "/greq", torch.tensor([1.0 if g is not None and g.requires_grad else 0.0
                                                  for g in grads]))
            if s2 is None:
                hv = [None] * len(req)
            else:
                hv = torch.autograd.grad(s2, req, allow_unused=True)
    rec(name + "/out", out)
    if req:
        for f, t, g in zip(reqf, req, grads):
            rec(name + "/grad_" + f, g if g is not None else torch.zeros_like(t))
        if dd:
            for f, t, h in zip(reqf, req, hv):
                rec(name + "/hv_" + f, h if h is not None else torch.zeros_like(t))


def case(name, inputs, fn, params=None, dd=False, greq=False):
    """A case whose inputs (a list of (field, tensor)) all require grad:
    the inputs, params (floats) if given, then record_grads' records."""
    ts = [t.detach().clone().to(torch.float32).requires_grad_(True) for _, t in inputs]
    out = fn(*ts)
    for (f, _), t in zip(inputs, ts):
        rec(name + "/" + f, t)
    if params is not None:
        rec(name + "/params", torch.tensor(params, dtype=torch.float32))
    record_grads(name, out, ts, [f for f, _ in inputs], dd=dd, greq=greq)


def reduce(op, t, dims, keepdim, correction=1):
    """dl_sum / dl_mean / dl_var / dl_std / dl_max / dl_min / dl_norm over dims (a
    tuple) as torch computes them (dl_max: torch.amax, ties share the
    gradient)"""
    if op == "sum":
        return torch.sum(t, dim=dims, keepdim=keepdim)
    if op == "mean":
        return torch.mean(t, dim=dims, keepdim=keepdim)
    if op == "var":
        return torch.var(t, dim=dims, correction=correction, keepdim=keepdim)
    if op == "std":
        return torch.std(t, dim=dims, correction=correction, keepdim=keepdim)
    if op == "norm":
        return torch.linalg.vector_norm(t, 2, dim=dims, keepdim=keepdim)
    if op in ("max", "min"):
        return torch.amax(t, dim=dims, keepdim=keepdim) if op == "max" else torch.amin(t, dim=dims, keepdim=keepdim)
    raise ValueError(op)


def write(path, records):
    """records: list of (name, torch tensor); values are written as float32."""
    parts = [b"DLGOLD1\0", struct.pack("<II", 1, len(records))]
    for name, t in records:
        nb = name.encode("ascii")
        parts.append(struct.pack("<I", len(nb)))
        parts.append(nb)
        parts.append(struct.pack("<I", t.dim()))
        parts.append(struct.pack("<%dq" % t.dim(), *t.shape))
        vals = t.reshape(-1).tolist()
        parts.append(struct.pack("<%df" % len(vals), *vals))
    blob = b"".join(parts)
    with open(path, "wb") as f:
        f.write(blob)
    print("%s: %d records, %d bytes" % (path, len(records), len(blob)))
