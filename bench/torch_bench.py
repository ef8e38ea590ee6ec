"""bench/torch_bench.py - the PyTorch side of `make bench`: the same cases as
bench/bench.c, with the same command line and output.

Usage: python3 bench/torch_bench.py CASE THREADS [--warmup N] [--reps N] [--steps N]
       python3 bench/torch_bench.py --list | --version | --serve
Prints one line, "CASE THREADS VALUE" (median ms; peak RSS in MiB for mem_*;
0 for startup, which exits right after its first training step). Exit
status 2: unknown case.

--serve: reads such command lines (CASE THREADS [options]) from stdin and
answers each time case with its line on stdout, or "ERR message", in one
process: torch's import and CUDA's start-up (seconds on a GPU machine) are
paid once, not per case (bench/run.sh uses it for the *_cuda cases). Between
cases it frees what the last one held (gc, torch.cuda.empty_cache). mem_*
and startup need a process of their own and are refused.

Threads: torch.set_num_threads(THREADS). Models are the twins of bench.c's:
same layers, PyTorch's default initialization (xavier_uniform for the d2l
LeNet), F.cross_entropy, torch.optim.SGD (defaults but lr), batch 256 of
random N(0,1) inputs and labels in 0..9, optimizer.zero_grad() with its
default set_to_none=True.

CUDA: every case takes a device; a case named "<name>_cuda" runs <name> on
torch.device("cuda") with torch.cuda.synchronize() at the end of each
repetition (bench.c's _cuda cases call dl_sync likewise). Without CUDA such
a case exits 2 and run.sh prints n/a. TF32: PyTorch's defaults, set
explicitly (torch.backends.cudnn.allow_tf32 = True: convolutions in TF32;
torch.backends.cuda.matmul.allow_tf32 = False); "<name>_cuda_fp32" runs
<name> on the GPU with both False, exact fp32 (bench.c's _cuda_fp32 cases
likewise).

Graph cases (step_*_graph_cuda): the training step captured once as a CUDA
graph and replayed, as PyTorch's documentation does a whole network
(torch.cuda.graphs, "whole network capture"): three warm-up steps on a side
stream, grads set to None, then forward, loss, backward and opt.step()
captured with torch.cuda.graph; a repetition is g.replay(). bench.c's twin
captures zero_grad too (dl.h keeps the gradients and zeroes them). PyTorch
has no graph replay on the CPU: those cases exit 2 there (run.sh compares
dl.h's replay with dl.h's eager step instead). step_mlp16 is step_mlp at
batch 16.

DL_PROFILE=1 (as for dl.h's side): the timed reps run under torch.profiler
and its key_averages() table (sorted by total time, CUDA's on a GPU) goes
to stderr, next to dl.h's table (bench/run.sh prints both).
"""
import os
import sys
import time

# only what `startup` needs is imported before the case runs
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 256


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------ models

def make_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def make_lenet_d2l():
    net = nn.Sequential(
        nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.Sigmoid(), nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Conv2d(6, 16, kernel_size=5), nn.Sigmoid(), nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.Sigmoid(),
        nn.Linear(120, 84), nn.Sigmoid(),
        nn.Linear(84, 10))

    def init(m):  # d2l's init_weights
        if type(m) in (nn.Linear, nn.Conv2d):
            nn.init.xavier_uniform_(m.weight)
    net.apply(init)
    return net


def make_lenet_bn():
    # examples/lenet.c (`make run`)
    return nn.Sequential(
        nn.Conv2d(1, 6, kernel_size=5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(6, 16, kernel_size=5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(400, 120), nn.BatchNorm1d(120), nn.ReLU(),
        nn.Linear(120, 84), nn.BatchNorm1d(84), nn.ReLU(),
        nn.Linear(84, 10))


class ResidualBlock(nn.Module):
    """examples/resnet.c's block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)),
    shortcut = bn(conv1x1 stride s) when the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = self.shortcut_bn = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
            self.shortcut_bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        sc = self.shortcut_bn(self.shortcut(x)) if self.shortcut is not None else x
        h = self.bn2(self.conv2(h))
        return F.relu(h + sc)


class Residual(nn.Module):
    """d2l.Residual (examples/resnet18.h): relu(bn2(conv2(relu(bn1(conv1(x))))) + (conv3(x) or x)),
    convs with biases, the 1x1 projection without batch norm."""

    def __init__(self, cin, cout, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(cout, cout, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2d(cin, cout, kernel_size=1, stride=strides) if use_1x1conv else None
        self.bn1 = nn.BatchNorm2d(cout)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return F.relu(y + x)


def make_resnet18():
    """d2l's resnet18(10, 1), the multi-GPU chapter's model (widths 64-512,
    3x3 stem at stride 1, no max pool; tests/golden/gen_resnet18.py checks
    examples/resnet18.h against it)"""
    def stage(cin, cout, first):
        return nn.Sequential(Residual(cin, cout) if first else Residual(cin, cout, True, 2), Residual(cout, cout))
    net = nn.Sequential(nn.Conv2d(1, 64, kernel_size=3, stride=1, padding=1), nn.BatchNorm2d(64), nn.ReLU())
    net.add_module("resnet_block1", stage(64, 64, True))
    net.add_module("resnet_block2", stage(64, 128, False))
    net.add_module("resnet_block3", stage(128, 256, False))
    net.add_module("resnet_block4", stage(256, 512, False))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, 10)))
    return net


def make_resnet_small():
    stages, cin = [], 16
    for s, w in enumerate((16, 32, 64, 128)):
        stages.append(nn.Sequential(ResidualBlock(cin, w, 1 if s == 0 else 2), ResidualBlock(w, w, 1)))
        cin = w
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Sequential(*stages),
        nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(128, 10))


# ------------------------------------------------------------------ cases
# a setup returns rep(), one repetition of the timed work

def batch(dev, shape):
    x = torch.randn(*shape, device=dev)
    y = torch.randint(0, 10, (shape[0],), device=dev)
    return x, y


def model(make, lr, n, dev):
    """the model in training mode on dev, its SGD, a batch of n"""
    net = make().to(dev)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    x, y = batch(dev, (n, 1, 28, 28))
    return net, opt, x, y


def model_case(make, lr, n=BATCH):
    def setup(dev):
        net, opt, x, y = model(make, lr, n, dev)

        def rep():
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
        return rep
    return setup


def graph_case(make, lr, n=BATCH):
    """the step as a CUDA graph (whole-network capture), replayed"""
    def setup(dev):
        net, opt, x, y = model(make, lr, n, dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(net(x), y).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()

        def rep():
            g.replay()
        return rep
    return setup


def micro_case(xshape, params, op, yshape):
    """x and params are leaves with requires_grad; backward is seeded with a
    fixed random gradient (= backward of sum(y * gout)); grads reset to None."""
    def setup(dev):
        x = torch.randn(*xshape, device=dev, requires_grad=True)
        ps = [torch.randn(*s, device=dev, requires_grad=True) for s in params]
        gout = torch.randn(*yshape, device=dev)

        def rep():
            y = op(x, ps)
            y.backward(gout)
            x.grad = None
            for p in ps:
                p.grad = None
        return rep
    return setup


def bn_case(dev):
    rm = torch.zeros(6, device=dev)
    rv = torch.ones(6, device=dev)
    return micro_case((BATCH, 6, 28, 28), [(6,), (6,)],
                      lambda x, p: F.batch_norm(x, rm, rv, p[0], p[1], training=True, momentum=0.1, eps=1e-5),
                      (BATCH, 6, 28, 28))(dev)


def linear_case(dev):
    lin = nn.Linear(784, 256).to(dev)  # as bench.c: the module

    def op(x, p):
        return lin(x)
    inner = micro_case((BATCH, 784), [], op, (BATCH, 256))(dev)

    def rep():
        inner()
        lin.zero_grad()
    return rep


def add_case(dev):
    """per-op overhead: an add of two 4-element tensors"""
    a = torch.randn(4, device=dev)
    b = torch.randn(4, device=dev)

    def rep():
        return a + b
    return rep


def matmul200_case(dev):
    a = torch.randn(200, 200, device=dev)
    b = torch.randn(200, 200, device=dev)

    def rep():
        return a @ b
    return rep


CASES = {
    "add_sync": ("time", add_case),
    "matmul200": ("time", matmul200_case),
    "conv1_fwdbwd": ("time", micro_case((BATCH, 1, 28, 28), [(6, 1, 5, 5), (6,)],
                                        lambda x, p: F.conv2d(x, p[0], p[1], padding=2), (BATCH, 6, 28, 28))),
    "conv2_fwdbwd": ("time", micro_case((BATCH, 6, 14, 14), [(16, 6, 5, 5), (16,)],
                                        lambda x, p: F.conv2d(x, p[0], p[1]), (BATCH, 16, 10, 10))),
    "bn2d_fwdbwd": ("time", bn_case),
    "maxpool_fwdbwd": ("time", micro_case((BATCH, 6, 28, 28), [],
                                          lambda x, p: F.max_pool2d(x, 2, 2), (BATCH, 6, 14, 14))),
    "linear_fwdbwd": ("time", linear_case),
    "step_mlp": ("time", model_case(make_mlp, 0.1)),
    "step_lenet": ("time", model_case(make_lenet_d2l, 0.9)),
    "step_lenet_bn": ("time", model_case(make_lenet_bn, 0.1)),
    "step_resnet_small": ("time", model_case(make_resnet_small, 0.1)),
    "step_resnet18": ("time", model_case(make_resnet18, 0.1)),
    "step_mlp16": ("time", model_case(make_mlp, 0.1, 16)),
    "step_mlp_graph": ("graph", graph_case(make_mlp, 0.1)),
    "step_mlp16_graph": ("graph", graph_case(make_mlp, 0.1, 16)),
    "step_lenet_graph": ("graph", graph_case(make_lenet_d2l, 0.9)),
    "step_lenet_bn_graph": ("graph", graph_case(make_lenet_bn, 0.1)),
    "step_resnet_small_graph": ("graph", graph_case(make_resnet_small, 0.1)),
    "mem_lenet_bn": ("mem", model_case(make_lenet_bn, 0.1)),
    "mem_resnet_small": ("mem", model_case(make_resnet_small, 0.1)),
    "startup": ("startup", model_case(make_lenet_bn, 0.1)),
}


def lookup(name):
    """(kind, setup, device, fp32) for a case name; <name>_cuda runs <name> on
    the GPU with PyTorch's TF32 defaults, <name>_cuda_fp32 in exact fp32."""
    if name in CASES:
        return CASES[name] + (torch.device("cpu"), False)
    fp32 = name.endswith("_cuda_fp32")
    base = name[:-10] if fp32 else name[:-5] if name.endswith("_cuda") else None
    if base in CASES:
        return CASES[base] + (torch.device("cuda"), fp32)
    return None


def peak_rss_mb():
    """VmHWM in MiB, else ru_maxrss (KiB on Linux)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class CaseError(Exception):
    """a case that cannot run here: the message says why"""


def prepare(argv):
    """(name, threads, opts, kind, rep, dev) of a command line CASE THREADS
    [opts]; the case set up (TF32 switches, threads, seed) but not run"""
    if len(argv) < 2 or len(argv) % 2:
        raise CaseError("usage: CASE THREADS [--warmup N] [--reps N] [--steps N]")
    name, threads = argv[0], int(argv[1])
    opts = {"--warmup": 3, "--reps": 11, "--steps": 10}
    for k, v in zip(argv[2::2], argv[3::2]):
        if k not in opts:
            raise CaseError("unknown option %s" % k)
        opts[k] = int(v)
    case = lookup(name)
    if case is None:
        raise CaseError("torch_bench: no case %s" % name)
    kind, setup, dev, fp32 = case
    if kind == "graph":
        if dev.type != "cuda":
            raise CaseError("torch_bench: %s: PyTorch has no graph replay on the CPU (a _cuda case)" % name)
        kind = "time"
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CaseError("torch_bench: %s needs CUDA, which this torch does not have" % name)
    if dev.type == "cuda":
        torch.backends.cudnn.allow_tf32 = not fp32
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    return name, threads, opts, kind, setup(dev), dev


def time_case(name, threads, opts, rep, dev):
    """the line of a time case: median ms of the reps after the warm-ups"""
    for _ in range(opts["--warmup"]):
        rep()
    sync(dev)
    ts = []
    prof = None
    if os.environ.get("DL_PROFILE", "0") not in ("", "0"):
        from torch.profiler import profile, ProfilerActivity
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        prof = profile(activities=acts)
        prof.__enter__()
    for _ in range(opts["--reps"]):
        t0 = time.perf_counter()
        rep()
        sync(dev)
        ts.append(time.perf_counter() - t0)
    if prof is not None:
        prof.__exit__(None, None, None)
        key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
        sys.stderr.write(prof.key_averages().table(sort_by=key, row_limit=40) + "\n")
    ts.sort()
    n = len(ts)
    med = ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2])
    return "%s %d %.4f" % (name, threads, 1e3 * med)


def serve():
    """--serve: one line in, one line out, until stdin ends"""
    import gc
    for line in sys.stdin:
        args = line.split()
        if not args:
            continue
        try:
            name, threads, opts, kind, rep, dev = prepare(args)
            if kind != "time":
                raise CaseError("torch_bench --serve: %s needs a process of its own" % name)
            out = time_case(name, threads, opts, rep, dev)
        except Exception as e:  # the answer says it; the next case still runs
            out = "ERR %s" % str(e).replace("\n", " ")
        rep = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        sys.stdout.write(out + "\n")
        sys.stdout.flush()
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--serve":
        return serve()
    if len(argv) == 2 and argv[1] == "--list":
        print("\n".join(CASES))
        return 0
    if len(argv) == 2 and argv[1] == "--version":
        print(torch.__version__)
        return 0
    if len(argv) < 3 or (len(argv) - 3) % 2:
        sys.stderr.write(__doc__)
        return 2
    try:
        name, threads, opts, kind, rep, dev = prepare(argv[1:])
    except CaseError as e:
        sys.stderr.write("%s\n" % e)
        if str(e).startswith("unknown option"):
            sys.stderr.write(__doc__)
        return 2
    if kind == "startup":
        rep()
        sync(dev)
        sys.stdout.write("%s %d 0\n" % (name, threads))
        sys.stdout.flush()
        os._exit(0)  # end of the first step: leave without interpreter teardown
    if kind == "mem":
        for _ in range(opts["--steps"]):
            rep()
        sync(dev)
        print("%s %d %.1f" % (name, threads, peak_rss_mb()))
        return 0
    print(time_case(name, threads, opts, rep, dev))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
