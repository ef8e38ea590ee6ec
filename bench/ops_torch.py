"""bench/ops_torch.py: the PyTorch twin of bench/ops.c. usage: python3 bench/ops_torch.py THREADS < bench/ops_cases.txt"""
import sys, time, torch
import torch.nn.functional as F
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
torch.manual_seed(0)
def sh(s): return tuple(int(v) for v in s.split("x"))
def rn(s, pos=False):
    t = torch.randn(s)
    return (t.abs() + 0.1) if pos else t

UN = {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs, "erf": torch.erf,
      "sin": torch.sin, "cos": torch.cos, "log1p": torch.log1p, "expm1": torch.expm1, "rsqrt": torch.rsqrt, "relu": torch.relu,
      "leaky_relu": lambda a: F.leaky_relu(a, 0.01), "sigmoid": torch.sigmoid, "tanh": torch.tanh, "gelu": F.gelu,
      "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"), "silu": F.silu, "softplus": lambda a: F.softplus(a, 1, 20),
      "logsigmoid": F.logsigmoid, "pow2": lambda a: a ** 2.0, "pow1.5": lambda a: a ** 1.5, "clamp": lambda a: torch.clamp(a, -0.5, 0.5)}
BI = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum, "minimum": torch.minimum}
RED = {"sum": lambda x, d: x.sum(d) if d is not None else x.sum(), "mean": lambda x, d: x.mean(d) if d is not None else x.mean(),
       "max": lambda x, d: x.amax(d) if d is not None else x.amax(), "min": lambda x, d: x.amin(d) if d is not None else x.amin(),
       "var": lambda x, d: x.var(d, correction=1) if d is not None else x.var(correction=1),
       "norm": lambda x, d: torch.linalg.vector_norm(x, dim=d),
       "cumsum": lambda x, d: torch.cumsum(x, d),
       "logsumexp": lambda x, d: torch.logsumexp(x, d if d is not None else tuple(range(x.dim()))),
       "max_dim": lambda x, d: torch.max(x, d).values, "argmax": lambda x, d: x.argmax(d)}

def setup(f):
    k = f[0]; ins = []; ex = []
    if k == "u":
        ins = [rn(sh(f[2]), f[1] in ("log", "sqrt", "pow1.5", "log1p", "rsqrt"))]
        fn = UN[f[1]]; run = lambda: fn(ins[0])
    elif k == "b":
        ins = [rn(sh(f[2])), rn(sh(f[3]), f[1] == "div")]; fn = BI[f[1]]; run = lambda: fn(ins[0], ins[1])
    elif k == "r":
        ins = [rn(sh(f[3]))]; d = {"all": None, "first": 0, "last": -1}[f[2]]; fn = RED[f[1]]; run = lambda: fn(ins[0], d)
    elif k == "sm":
        ins = [rn(sh(f[3]))]; d = int(f[2]); fn = torch.softmax if f[1] == "softmax" else torch.log_softmax; run = lambda: fn(ins[0], d)
    elif k == "mm":
        ins = [rn(sh(f[1])), rn(sh(f[2]))]; run = lambda: torch.matmul(ins[0], ins[1])
    elif k == "lin":
        n, i, o = int(f[1]), int(f[2]), int(f[3]); ins = [rn((n, i)), rn((o, i)), rn((o,))]; run = lambda: F.linear(*ins)
    elif k == "ln":
        s = sh(f[1]); d = s[-1]; ins = [rn(s), rn((d,)), rn((d,))]; run = lambda: F.layer_norm(ins[0], (d,), ins[1], ins[2], 1e-5)
    elif k == "bn":
        s = sh(f[2]); c = s[1]; ins = [rn(s), rn((c,)), rn((c,))]; rm = torch.zeros(c); rv = torch.ones(c); tr = f[1] == "train"
        run = lambda: F.batch_norm(ins[0], rm, rv, ins[1], ins[2], tr, 0.1, 1e-5)
    elif k == "do":
        ins = [rn(sh(f[1]))]; run = lambda: F.dropout(ins[0], 0.5, True)
    elif k in ("cat", "stack"):
        ins = [rn(sh(f[2])), rn(sh(f[2]))]; d = int(f[1]); fn = torch.cat if k == "cat" else torch.stack; run = lambda: fn(ins, d)
    elif k == "narrow":
        ins = [rn(sh(f[1]))]; run = lambda: ins[0].narrow(-1, 0, ins[0].shape[-1] // 2).contiguous()
    elif k == "permute":
        ins = [rn(sh(f[1]))]; run = lambda: ins[0].permute(0, 2, 3, 1).contiguous()
    elif k == "transpose":
        ins = [rn(sh(f[1]))]; run = lambda: ins[0].transpose(0, 1).contiguous()
    elif k == "expand":
        ins = [rn(sh(f[1]))]; to = sh(f[2]); run = lambda: ins[0].expand(to).contiguous()
    elif k == "emb":
        v, d, n = int(f[1]), int(f[2]), int(f[3]); ins = [rn((v, d))]; idx = torch.tensor([(i * 7919) % v for i in range(n)], dtype=torch.int64)
        run = lambda: F.embedding(idx, ins[0])
    elif k == "conv":
        s = sh(f[1]); oc, kk, st, pd = int(f[2]), int(f[3]), int(f[4]), int(f[5]); ins = [rn(s), rn((oc, s[1], kk, kk)), rn((oc,))]
        run = lambda: F.conv2d(ins[0], ins[1], ins[2], stride=st, padding=pd)
    elif k in ("maxpool", "avgpool"):
        ins = [rn(sh(f[1]))]; kk, st, pd = int(f[2]), int(f[3]), int(f[4]); fn = F.max_pool2d if k == "maxpool" else F.avg_pool2d
        run = lambda: fn(ins[0], kk, st, pd)
    elif k == "gap":
        ins = [rn(sh(f[1]))]; run = lambda: F.adaptive_avg_pool2d(ins[0], (1, 1))
    elif k == "ce":
        n, c = int(f[1]), int(f[2]); ins = [rn((n, c))]; y = torch.tensor([(i * 31) % c for i in range(n)]); run = lambda: F.cross_entropy(ins[0], y)
    elif k == "mse":
        ins = [rn(sh(f[1]))]; t = rn(sh(f[1])); run = lambda: F.mse_loss(ins[0], t)
    elif k == "bce":
        ins = [rn(sh(f[1]))]; t = torch.rand(sh(f[1])); run = lambda: F.binary_cross_entropy_with_logits(ins[0], t)
    elif k in ("adam", "sgd"):
        shapes = [(1024, 784), (1024,), (256, 1024), (256,), (10, 256), (10,)]
        ps = [torch.randn(s, requires_grad=True) for s in shapes]
        for p in ps: p.grad = 2 * p.detach()
        opt = torch.optim.Adam(ps) if k == "adam" else torch.optim.SGD(ps, lr=0.01, momentum=0.9)
        return ps, opt.step, True
    return ins, run, False

def timeit(it):
    for _ in range(3): it()
    t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < 0.003 or n < 2: it(); n += 1
    per = (time.perf_counter() - t0) / n; reps = max(1, int(0.005 / per)); r = []; c = []
    for _ in range(5):
        c0 = time.process_time(); t0 = time.perf_counter()
        for _ in range(reps): it()
        r.append((time.perf_counter() - t0) / reps * 1e6); c.append((time.process_time() - c0) / reps * 1e6)
    r.sort(); c.sort(); return r[2], c[2], r[0]

for line in sys.stdin:
    line = line.strip()
    if not line or line.startswith("#"): continue
    f = line.split(":")
    ins, run, isopt = setup(f)
    if isopt or f[1:2] == ["argmax"]:   # argmax: no gradient, fwd only
        fw, fc, fm = timeit(run); fb, fbc, fbm = fw, fc, fm
    else:
        fw, fc, fm = timeit(run)
        for x in ins: x.requires_grad_(True)
        def fwbw():
            for x in ins: x.grad = None
            run().sum().backward()
        fb, fbc, fbm = timeit(fwbw)
    print(f"{line} {fw:.3f} {fb:.3f} {fc:.3f} {fbc:.3f} {fm:.3f} {fbm:.3f}", flush=True)
