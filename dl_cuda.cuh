/* dl_cuda.cuh - the CUDA backend of dl.h (NVIDIA GPUs).            public domain / MIT-0

   Not a header to include yourself: dl.h includes it from its implementation
   when DL_CUDA is defined, so the one file that defines DL_IMPLEMENTATION is
   compiled by nvcc as CUDA C++ and every other file stays plain C:

       nvcc -c -x cu -O3 -Xcompiler -march=native -DDL_CUDA -DDL_IMPLEMENTATION \
            -gencode arch=compute_80,code=sm_80 \
            -gencode arch=compute_90,code=[sm_90,compute_90] impl.c -o impl.o
       cc -O2 main.c impl.o -o prog -L/usr/local/cuda/lib64 -lcudart -lcublas -lstdc++ -lm -lpthread

   (dl_cuda.cuh must sit next to dl.h; -march=native: the host code, the
   CPU backend among it, built as the CPU build is; -DDL_CUDNN on the nvcc
   line and -lcudnn on the link: convolutions through cuDNN.) `make cuda` builds
   every example and test this way; docs/cuda.md says how convolutions,
   batch norm and TF32 work here, and why.

   Status: compiled warning-free for sm_80 and sm_90 and tested on emulated
   devices (below: tests/test_cuda.c, and every test program with its
   tensors on the emulated cuda:0). It ran on one NVIDIA H100 at 7a1c176,
   GPU-only paths (warp/block reductions, cuBLAS, streams, pinned staging)
   included: make test-cuda 151 passed, 1 failed; make test-cuda-all 12,217
   passed, 2 failed (the three failures were test expectations, not the
   backend); make test-nccl 988 passed. What came after (the batch-norm
   split, the convolution entries without copies, the TF32 modes, capture
   and replay, the multi-tensor updates, the dataset on the device, cuDNN's
   convolutions) ran on one H200 on 2026-11-26: test_cuda 300 passed, 0
   failed; test_capture 440 passed; the other test programs on cuda:0
   13,735 passed, 1 failed (test_resnet18's tightest bound, 1.0e-4 against
   9.5e-5); the convolution tests with every convolution through cuDNN
   5,375 passed, 1 failed (the same); figures in
   docs/cuda.md. The direct sums of few-channel convolutions (dl__cu_direct,
   with the activation and 2x2 average pool after them: dl__cu_conv_act),
   the fused class-index losses, batch norm with its ReLU and pool and the
   launch fusions ran on one H200 on 2026-11-28 (make test-cuda-all 36,734
   passed, 3 failed: test expectations, since fixed). Emulated only: copies
   between two GPUs, bias_act_bwd's reads before its writes, the direct
   sums in shared memory (dl__cu_tile_fwd, dl__cu_tile_wgrad), and a
   replay's per-run values as a kernel node's parameters (dl__cu_setarg;
   DL_CUDA_REPLAY_ARGS=0: the copy nodes that ran on the H200), a
   consumer's backward making its Linear's bias gradient (dl__bias_of),
   and programmatic dependent launches (DL_CUDA_PDL=1, off by default).

   Design
     - One stream and one cuBLAS handle per device (d->impl). Every kernel and
       copy is queued on that stream; the host waits only where a value comes
       back: download (dl_read, dl_item, ...), sync (dl_sync), nonfinite
       (anomaly mode), class_loss and class_mask (cross entropy's target
       check; skipped inside a capture) and sumsq (gradient clipping).
     - Memory: a caching allocator per device. Blocks are rounded to size
       classes (four per power of two, at least 512 bytes), come from
       cudaMalloc once and go back to a free list on free; a later request of
       the same class reuses them (one stream: reuse is ordered after every
       earlier use). dl.h's step arena keeps its chunks across steps, so a
       steady training loop calls neither dl.h's allocator nor cudaMalloc.
       When cudaMalloc fails the cache is released and the call retried once;
       then alloc returns NULL (dl.h reports DL_ERR_OOM with the sizes) and
       the CUDA reason goes to the log as a warning.
     - Uploads copy through two pinned staging buffers (double buffered, an
       event each), so the host buffer may be reused as soon as upload
       returns and large uploads overlap the host memcpy with the DMA.
     - Kernels: most are "one thread per output element" functors (structs
       with a __host__ __device__ operator()) run by one grid-stride kernel
       template, with 32-bit index arithmetic when the sizes allow. The math
       is the CPU backend's, expression for expression: the elementwise ops
       expand dl.h's X-macro lists, products and sums that the CPU computes
       with two roundings use __fmul_rn/__fadd_rn (never contracted into an
       FMA), random numbers are dl.h's counter-based Philox (dl__rng_value,
       DL__HD), accumulations run in the CPU's order. Most results are
       therefore bit-identical to the CPU's; the exceptions are the libm
       functions left (powf, and expf/logf where dl.h calls them: CUDA's
       differ by an ulp or two; exp, log, log1p, expm1, erf, tanh, sin,
       cos and rsqrt are dl.h's own), the matrix products (cuBLAS sums in
       its own order; TF32 where a switch allows it: convolutions by
       default, as PyTorch), row
       reductions / softmax over a contiguous dim, which use a fixed tree of
       warp shuffles (double accumulation, like the CPU), and batch norm's
       sums (double, chunks of each channel over many blocks).
     - Capture (dl__backend.cap_*, dl.h's dl_capture_begin/end, dl_replay):
       the stream is synchronized, then records (cudaStreamBeginCapture,
       relaxed mode) into a graph; memory the graph uses stays its own
       (scratch, temporaries: dl__cucap_block) until the capture is freed.
       What changes from run to run is copied from pinned host memory by
       the graph's first nodes, added after the capture (dl__cu_graph_prefix):
       the RNG's {seed, counter}, which the random kernels read through a
       pointer (dl__cu_draw: the same counters as the eager draw), and the
       optimizers' argument structs. An event after those copies tells the
       host when it may write the next run's values, so the host waits for
       the start of the previous run, not its end. Inside a capture the
       device refuses host reads and uploads, and cross entropy's target
       check is skipped (a bad target counts as ignore_index). An emulated
       device records each launch (a copy of the functor, as a launch takes
       it by value) and each memset, copy and GEMM, and runs the list.
     - Multi-tensor updates (dl__backend.mt_*): an optimizer's step over all
       its parameters on a device, and a zero_grad, are one launch: a table
       of the tensors (pointers, sizes, offsets) built once in device
       memory, each element found by bisection of the offsets, then the
       per-tensor kernel's arithmetic (dl__cu_sgd_at, dl__cu_adam_at): the
       same bits.
     - Fewer launches (docs/cuda.md, "Launches"): cross entropy and
       nll_loss are one op (class_loss: the loss in two launches, T partial
       sums then one thread; the backward one launch with the row's sum in
       closed form); a backward's leaf gradients are added by one launch per
       48 (axpy_multi: the table in the launch's arguments); a Sequential's
       BatchNorm then ReLU is one op (bn_apply's relu, bn_backward's ry),
       and with a 2x2 max pool after them too (bn_pool, bn_pool_bwd).
     - Determinism: no atomics whose order changes results (an atomicMin
       on an index, order-independent, and the last-block ticket's
       atomicInc, which picks which block finishes a launch, not what it
       computes: dl__cu_last_block). Reductions use a
       fixed block size and a fixed tree, col2im and the average-pooling
       adjoint gather (one thread per input element, contributions in the
       CPU's order), max-pool's backward scatters one plane per warp with
       colliding lanes combined in lane order (__match_any_sync). Same input,
       same GPU, same bits, every run.
     - Errors never exit: every CUDA and cuBLAS call and every launch is
       checked; a failure is recorded on the device (dl__dev_fail, "cuda:0
       kernel binary: <cudaGetErrorString>") and reported by the op under
       its name. Kernels run asynchronously, so a fault inside a kernel
       surfaces at the next call that waits (usually dl_read/dl_item);
       DL_CUDA_SYNC=1 waits after every launch so the failing op reports it.
     - DL_CUDA_EMULATE=N (or dl__cu_emu = N from the implementation file)
       makes cuda:0..N-1 emulated devices: host memory (tagged pointers, as
       dl.h's strict CPU devices: host code that touches them faults), every
       functor run by a host loop, cuBLAS replaced by the CPU GEMM (in TF32
       mode on operands rounded to 10 mantissa bits), the shuffle kernels
       by their sequential twins (layer norm: the same per-row routine with
       a group of one thread; batch norm's pass 1: the GPU's chunks and
       block tree, thread by thread). It runs the kernels' index
       arithmetic and the whole device plumbing on a machine without a GPU
       (tests/test_cuda.c uses it); it is a test tool, not a backend. */

#if !defined(DL__IMPLEMENTED) || !defined(DL_CUDA)
#error "dl_cuda.cuh is part of dl.h's implementation: define DL_CUDA and DL_IMPLEMENTATION, then include dl.h (in one file compiled by nvcc)"
#endif
#if !defined(__CUDACC__)
#error "dl_cuda.cuh: the file that defines DL_IMPLEMENTATION with DL_CUDA must be compiled by nvcc (nvcc -x cu -DDL_CUDA -DDL_IMPLEMENTATION -c impl.c)"
#endif

#ifndef DL__CUDA_CUH
#define DL__CUDA_CUH

#include <cuda_runtime.h>
#include <cublas_v2.h>
#ifdef DL_CUDNN
#include <cudnn.h>
#endif

#define DL__CU_THREADS 256                    /* threads per block, every kernel */

/* Measurement experiments, for a copy of bench only (bench/gpu_kit.sh
   builds bench-x1 and bench-x2; never a program that needs its results):
   DL__CU_EXP leaves work out, so that the step's time without it bounds
   what fusing it away could gain; the results are then wrong.
     1  a graph's per-run copies from the host of the RNG's {seed,
        counter} and the optimizers' arguments, and their events: no nodes
     2  zero_grad's multi-tensor launch and the backward's gradient
        sums (axpy_multi's launches, and those an optimizer's launch
        makes inside a capture): not done */
#ifndef DL__CU_EXP
#define DL__CU_EXP 0
#endif
#define DL__CU_STAGE ((size_t)4 << 20)        /* bytes per pinned upload staging buffer (two) */
#define DL__CU_RCHUNK 16384                   /* row reductions: elements per block pass */
#define DL__CU_CCHUNK 256                     /* column reductions: rows per partial */

/* ===========================================================================
 * Device state
 * ========================================================================= */

typedef struct dl__cublock { char *p; size_t size; } dl__cublock;

/* A capture's state on one device (dl__backend.cap_*, below). On a GPU the
   stream records into a graph; an emulated device records its work as a
   list of functor copies (ops) and runs that list for a replay. */
typedef struct dl__cu_emuop {
    void (*run)(const void *f, int64_t n);   /* f(i) for i in [0, n) */
    void *f;                                 /* a copy of the functor */
    int64_t n;
} dl__cu_emuop;
typedef struct dl__cu_pre { void *dst; const void *src; size_t bytes; bool run; } dl__cu_pre;

/* A graph's values that change from run to run (the RNG's {seed, counter},
   the optimizers' arguments: dl__cu_pre.run) as the parameters of one
   kernel node at the graph's start, which writes them where the graph's
   kernels read them; the host sets them before each launch
   (cudaGraphExecKernelNodeSetParams: the bytes are taken at the call, so
   the host waits for nothing). With DL_CUDA_REPLAY_ARGS=0, or when they do
   not fit, a copy node from pinned host memory each and an event after
   them, the host waiting for the previous run's copies before it rewrites
   their sources. The parameters fit in the 4 KB every GPU takes. */
#define DL__CU_SETN 16
#define DL__CU_SETPAY 3584
typedef struct dl__cu_setarg {
    int n, len[DL__CU_SETN], off[DL__CU_SETN];
    void *dst[DL__CU_SETN];
    unsigned char pay[DL__CU_SETPAY];
} dl__cu_setarg;

/* thread t of nt: the values into place */
static DL__HD inline void dl__cu_set_run(const dl__cu_setarg &a, int t, int nt)
{
    int i, j;
    for (i = 0; i < a.n; i++)
        for (j = t; j < a.len[i]; j += nt) ((unsigned char *)a.dst[i])[j] = a.pay[a.off[i] + j];
}

/* DL_CUDA_PDL=1 (compute capability 9.0+): every kernel launch is a
   programmatic dependent launch (cudaLaunchAttributeProgrammaticStream-
   Serialization, dl__cu_go): its blocks may be scheduled while the
   previous kernel's last ones run. Each kernel's first act is to wait for
   the previous one to end and its writes to show (griddepcontrol.wait,
   which returns at once in a launch without the attribute), so nothing
   it reads or writes races with it; its second, to let the next one's
   launch begin (griddepcontrol.launch_dependents: once every block of
   this launch has said so, the next may be scheduled, to wait at its own
   first act; it implies nothing about this launch's writes). What is
   hidden is the gap between two launches, in a captured graph too (its
   edges become programmatic). Off by default: not yet measured. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DL__CU_PDL_ENTER() (cudaGridDependencySynchronize(), cudaTriggerProgrammaticLaunchCompletion())
#else
#define DL__CU_PDL_ENTER() ((void)0)
#endif

__global__ void dl__cu_setk(dl__cu_setarg a)
{
    DL__CU_PDL_ENTER();
    dl__cu_set_run(a, (int)threadIdx.x, (int)blockDim.x);
}

typedef struct dl__cucap {
    bool failed, empty;                /* empty: no work on this device, nothing to launch */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    dl__cu_emuop *ops;
    size_t nops, capops;
    void **blocks;                     /* device blocks its work uses (scratch, temporaries) */
    size_t nblocks, capblocks;
    void *scratch;
    size_t scratch_size;
    /* what changes from run to run: copies from pinned host memory at the
       start of every run, each followed by its event (the host may rewrite
       the source once the event has passed) */
    dl__cu_pre *pre;
    size_t npre, cappre;
    cudaEvent_t *ev;
    size_t nev, capev;
    uint64_t *hrng, *drng;             /* {seed, counter} of the run: pinned host, device */
    cudaEvent_t rng_ev;
    uint64_t rng0;                     /* the counter at dl_capture_begin */
    dl__cu_setarg *set;                /* the run's values as a kernel node's parameters (NULL: copies) */
    cudaGraphNode_t setnode;
} dl__cucap;

typedef struct dl__cuimpl {
    int ordinal;
    bool emulate;                     /* host memory and host loops (DL_CUDA_EMULATE) */
    bool sync_each;                   /* DL_CUDA_SYNC=1: wait after every launch */
    bool replay_args;                 /* DL_CUDA_REPLAY_ARGS (default 1): dl__cu_setarg, else copies */
    bool pdl;                         /* DL_CUDA_PDL=1 on compute capability 9.0+: dl__cu_go's
                                         programmatic dependent launches (default 0) */
    bool tf32;                        /* matrix products may use TF32 tensor cores (dl_set_allow_tf32) */
    bool tf32_conv;                   /* convolutions may (dl_set_allow_tf32_conv) */
    int direct;                       /* DL_CONV_DIRECT: 0 off; 1 (default) few-channel convs by the
                                         tiles, else dl__cu_direct's per-element kernels; 2 those only */
    int blas_tf32;                    /* the handle's math mode now: 1 TF32, 0 exact fp32, -1 unknown */
    int max_blocks;                   /* grid size that fills the GPU */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    size_t blas_ws_size;
    /* caching allocator: free blocks sorted by size, live blocks by address */
    dl__cublock *freel, *live;
    size_t nfree, capfree, nlive, caplive;
    size_t cached_bytes, live_bytes;
    uint64_t raw_allocs, raw_frees;   /* cudaMalloc / cudaFree calls */
    /* uploads: two pinned buffers, an event each */
    char *stage[2];
    cudaEvent_t stage_ev[2];
    int stage_next;
    /* results coming back: 64 device bytes, 64 pinned host bytes */
    void *dres, *hres;
    unsigned *ticket;                 /* dl__cu_last_block's counter (zero between launches) */
    /* two-pass reductions */
    void *scratch;
    size_t scratch_size;
    cudaEvent_t peer_ev;              /* cross-device copies */
    dl__cucap *cap;                   /* while a capture records this device's work */
    cudaEvent_t *pev;                 /* the profiler's marks: timing events, a pool */
    int npev, usedpev;
#ifdef DL_CUDNN
    cudnnHandle_t dnn;                /* made at the first convolution; NULL: not yet */
    int dnn_mode;                     /* DL_CUDNN: 0 off (or cudnnCreate failed), 1 16+ channels, 2 all */
    bool dnn_check;                   /* DL_CUDNN_CHECK=1: each call checked against dl.h's own path */
    bool dnn_bypass;                  /* while that check runs the cuBLAS path */
    struct dl__dnn_plan *plans;       /* one per (direction, batch, geometry, math mode) seen */
    size_t nplans, capplans;
#endif
} dl__cuimpl;

#define DL__CUI(d) ((dl__cuimpl *)(d)->impl)
/* a data pointer without the emulated device's tag (real devices: tag 0) */
#define DL__CUP(d, p) ((decltype(p))((uintptr_t)(p) - (d)->tag))

/* emulated devices: -1 = read DL_CUDA_EMULATE at the first use */
static int dl__cu_emu = -1;

/* A test's switch (tests/test_cuda.c): an emulated device runs the
   elements of a launch, the blocks of a block kernel and the threads of
   each of its phases last to first. A GPU keeps no order among them, so
   work that leans on one (a thread reading what another wrote since the
   last barrier, two threads writing one place) gives other bits then.
   (Every emulated block kernel's shared memory also starts as NaNs: a
   read of what the block did not write shows.) */
static bool dl__cu_emu_rev;
/* element i of n in the emulated order */
static inline int64_t dl__cu_emu_at(int64_t i, int64_t n) { return dl__cu_emu_rev ? n - 1 - i : i; }

/* DL_CUDA_EMULATE=N: cuda:0 .. N-1 emulated; DL_CUDA_EMULATE_REVERSE=1 runs
   them last to first from the start (dl__cu_emu_rev: make test-cuda-emu's
   reversed pass over the convolutions, the fused modules and the fuzz) */
static int dl__cu_emu_count(void)
{
    if (dl__cu_emu < 0) {
        const char *e = getenv("DL_CUDA_EMULATE"), *r = getenv("DL_CUDA_EMULATE_REVERSE");
        long v = e && *e ? strtol(e, NULL, 10) : 0;
        dl__cu_emu = v < 0 ? 0 : v > DL__MAX_CUDA ? DL__MAX_CUDA : (int)v;
        if (dl__cu_emu && r && r[0] == '1' && !r[1]) dl__cu_emu_rev = true;
    }
    return dl__cu_emu;
}

static void dl__cu_fail(dl__dev *d, const char *what, cudaError_t e)
{
    dl__dev_fail(d, "cuda:%d %s: %s", d->id.index, what, cudaGetErrorString(e));
}

/* true when e is success; else records the failure */
static bool dl__cu_ok(dl__dev *d, const char *what, cudaError_t e)
{
    if (e == cudaSuccess) return true;
    dl__cu_fail(d, what, e);
    return false;
}

static bool dl__cu_blas_ok(dl__dev *d, const char *what, cublasStatus_t st)
{
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    dl__dev_fail(d, "cuda:%d %s: %s", d->id.index, what, cublasGetStatusString(st));
    return false;
}

/* every entry starts here: the device's GPU becomes current */
static dl__cuimpl *dl__cu_enter(dl__dev *d)
{
    dl__cuimpl *m = DL__CUI(d);
    if (!m->emulate) dl__cu_ok(d, "cudaSetDevice", cudaSetDevice(m->ordinal));
    return m;
}

/* after a launch: the launch error, and with DL_CUDA_SYNC the kernel's */
static void dl__cu_launched(dl__dev *d, const char *name)
{
    dl__cuimpl *m = DL__CUI(d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && m->sync_each && !m->cap) e = cudaStreamSynchronize(m->stream);
    if (e != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "kernel %s", name);
        dl__cu_fail(d, what, e);
    }
}

/* ===========================================================================
 * Caching allocator
 * ========================================================================= */

/* size classes: 512 bytes, then four per power of two (at most 25% slack) */
static size_t dl__cu_class(size_t n)
{
    size_t top = 1024, step;
    if (n <= 512) return 512;
    while (top < n && top < ((size_t)1 << 62)) top <<= 1;
    step = top >> 3;                  /* classes in (top/2, top]: top/2 + k*top/8 */
    return (n + step - 1) / step * step;
}

static void *dl__cu_raw_alloc(dl__dev *d, size_t bytes, cudaError_t *err)
{
    dl__cuimpl *m = DL__CUI(d);
    void *p = NULL;
    *err = cudaSuccess;
    if (m->emulate) {
        unsigned char *raw, *a;
        if (bytes > ((size_t)-1) - 512) { *err = cudaErrorMemoryAllocation; return NULL; }
        raw = (unsigned char *)DL_MALLOC(bytes + 256 + sizeof(void *));
        if (!raw) { *err = cudaErrorMemoryAllocation; return NULL; }
        a = (unsigned char *)(((uintptr_t)raw + sizeof(void *) + 255) & ~(uintptr_t)255);
        memcpy(a - sizeof(void *), &raw, sizeof(void *));
        m->raw_allocs++;
        return a;
    }
    *err = cudaMalloc(&p, bytes);
    if (*err != cudaSuccess) { (void)cudaGetLastError(); return NULL; }
    m->raw_allocs++;
    return p;
}

static void dl__cu_raw_free(dl__dev *d, void *p)
{
    dl__cuimpl *m = DL__CUI(d);
    if (!p) return;
    m->raw_frees++;
    if (m->emulate) {
        void *raw;
        memcpy(&raw, (unsigned char *)p - sizeof(void *), sizeof(void *));
        DL_FREE(raw);
        return;
    }
    (void)cudaFree(p);   /* waits for the device; only at release or under memory pressure */
}

/* the free blocks go back to CUDA (before a retry, and at close) */
static void dl__cu_release_cache(dl__dev *d)
{
    dl__cuimpl *m = DL__CUI(d);
    size_t i;
    for (i = 0; i < m->nfree; i++) dl__cu_raw_free(d, m->freel[i].p);
    m->nfree = 0;
    m->cached_bytes = 0;
}

/* grows *p (esize each) to hold need; false on OOM */
static bool dl__cu_vgrow(void **p, size_t *cap, size_t need, size_t esize)
{
    size_t c = *cap ? *cap : 16;
    void *q;
    if (need <= *cap) return true;
    while (c < need) c *= 2;
    q = DL_REALLOC(*p, esize * c);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static bool dl__cu_grow(dl__cublock **a, size_t *cap, size_t need)
{
    return dl__cu_vgrow((void **)a, cap, need, sizeof(dl__cublock));
}

/* first index in a (n entries, sorted by key) whose key is >= k */
static size_t dl__cu_lower(const dl__cublock *a, size_t n, size_t k, bool by_size)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        size_t v = by_size ? a[mid].size : (size_t)(uintptr_t)a[mid].p;
        if (v < k) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* A block of at least bytes (256-byte aligned, untagged), from the cache or
   from CUDA; NULL when CUDA has no memory left (the reason in *err). */
static void *dl__cu_block_get(dl__dev *d, size_t bytes, cudaError_t *err)
{
    dl__cuimpl *m = DL__CUI(d);
    size_t cls = dl__cu_class(bytes), i, at;
    dl__cublock b;
    *err = cudaSuccess;
    if (!dl__cu_grow(&m->live, &m->caplive, m->nlive + 1)) { *err = cudaErrorMemoryAllocation; return NULL; }
    i = dl__cu_lower(m->freel, m->nfree, cls, true);
    if (i < m->nfree && m->freel[i].size <= cls + cls / 4) {   /* this class or the next */
        b = m->freel[i];
        memmove(m->freel + i, m->freel + i + 1, sizeof(dl__cublock) * (m->nfree - i - 1));
        m->nfree--;
        m->cached_bytes -= b.size;
    } else {
        b.size = cls;
        b.p = (char *)dl__cu_raw_alloc(d, cls, err);
        if (!b.p && m->nfree && !m->cap) {    /* give the cache back and try again (not inside a
                                                 capture: cudaFree waits for the device, which a
                                                 capture cannot; PyTorch's allocator skips it too) */
            dl__cu_release_cache(d);
            b.p = (char *)dl__cu_raw_alloc(d, cls, err);
        }
        if (!b.p) return NULL;
    }
    at = dl__cu_lower(m->live, m->nlive, (size_t)(uintptr_t)b.p, false);
    memmove(m->live + at + 1, m->live + at, sizeof(dl__cublock) * (m->nlive - at));
    m->live[at] = b;
    m->nlive++;
    m->live_bytes += b.size;
    return b.p;
}

static void dl__cu_block_put(dl__dev *d, void *p)
{
    dl__cuimpl *m = DL__CUI(d);
    size_t at, i;
    dl__cublock b;
    if (!p) return;
    at = dl__cu_lower(m->live, m->nlive, (size_t)(uintptr_t)p, false);
    if (at >= m->nlive || m->live[at].p != (char *)p) {
        dl__dev_fail(d, "cuda:%d free: %p was not allocated by this device", d->id.index, p);
        return;
    }
    b = m->live[at];
    memmove(m->live + at, m->live + at + 1, sizeof(dl__cublock) * (m->nlive - at - 1));
    m->nlive--;
    m->live_bytes -= b.size;
    if (!dl__cu_grow(&m->freel, &m->capfree, m->nfree + 1)) { dl__cu_raw_free(d, b.p); return; }
    i = dl__cu_lower(m->freel, m->nfree, b.size, true);
    memmove(m->freel + i + 1, m->freel + i, sizeof(dl__cublock) * (m->nfree - i));
    m->freel[i] = b;
    m->nfree++;
    m->cached_bytes += b.size;
}

/* A block that the capture recording on d owns until it is freed (a graph
   keeps using it, so the cache must not hand it out again); NULL with the
   device's failure recorded. */
static void *dl__cucap_block(dl__dev *d, size_t bytes)
{
    dl__cucap *c = DL__CUI(d)->cap;
    cudaError_t e;
    void *p;
    if (!dl__cu_vgrow((void **)&c->blocks, &c->capblocks, c->nblocks + 1, sizeof(void *))) {
        dl__dev_fail(d, "cuda:%d: out of host memory recording a capture", d->id.index);
        return NULL;
    }
    p = dl__cu_block_get(d, bytes, &e);
    if (!p) { dl__cu_fail(d, "capture memory", e); return NULL; }
    c->blocks[c->nblocks++] = p;
    return p;
}

/* the backend's alloc: a block, tagged on emulated devices; NULL with a
   warning naming CUDA's reason (dl.h then reports DL_ERR_OOM with the sizes) */
static void *dl__cu_alloc(dl__dev *d, size_t bytes)
{
    dl__cuimpl *m = dl__cu_enter(d);
    cudaError_t e;
    char *p = (char *)dl__cu_block_get(d, bytes, &e);
    if (!p) {
        size_t fr = 0, tot = 0;
        if (!m->emulate && cudaMemGetInfo(&fr, &tot) != cudaSuccess) { (void)cudaGetLastError(); fr = tot = 0; }
        dl__warn(d->ctx, "cuda:%d: allocating %zu bytes failed: %s (%zu bytes free of %zu on the "
                 "GPU, %zu held by dl.h's cache)", d->id.index, dl__cu_class(bytes),
                 cudaGetErrorString(e), fr, tot, m->cached_bytes);
        return NULL;
    }
    return p + d->tag;
}

static void dl__cu_free(dl__dev *d, void *p)
{
    if (!p) return;
    dl__cu_enter(d);
    dl__cu_block_put(d, DL__CUP(d, p));
}

/* the device's scratch for multi-pass reductions, at least bytes (inside a
   capture: the capture's, kept while it lives); NULL on failure */
static void *dl__cu_scratch(dl__dev *d, size_t bytes)
{
    dl__cuimpl *m = DL__CUI(d);
    cudaError_t e;
    void *p;
    if (m->cap) {
        size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes;
        if (m->cap->scratch_size >= bytes) return m->cap->scratch;
        if (!(p = dl__cucap_block(d, want))) return NULL;   /* the old one stays: earlier work reads it */
        m->cap->scratch = p;
        m->cap->scratch_size = dl__cu_class(want);
        return p;
    }
    if (m->scratch_size >= bytes) return m->scratch;
    p = dl__cu_block_get(d, bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes, &e);
    if (!p) { dl__cu_fail(d, "scratch memory", e); return NULL; }
    dl__cu_block_put(d, m->scratch);   /* earlier users are ahead in the stream */
    m->scratch = p;
    m->scratch_size = dl__cu_class(bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes);
    return p;
}

/* ===========================================================================
 * Launching
 * ========================================================================= */

/* IEEE single operations that nvcc never contracts into an FMA: the CPU
   computes a*b+c with two roundings, so the GPU does too */
static DL__HD inline float dl__cu_fmul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
static DL__HD inline float dl__cu_fadd(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
static DL__HD inline float dl__cu_fsub(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
static DL__HD inline float dl__cu_fdiv(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
static DL__HD inline float dl__cu_fsqrt(float a)
{
#ifdef __CUDA_ARCH__
    return __fsqrt_rn(a);
#else
    return sqrtf(a);
#endif
}
static DL__HD inline double dl__cu_dmul(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
static DL__HD inline double dl__cu_dadd(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}
static DL__HD inline double dl__cu_ddiv(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}

/* a load that skips the SM's L1 (ld.global.cg): for data that another
   block of the same launch wrote (partials, read by the last block:
   dl__cu_last_block) */
template <typename T>
static DL__HD inline T dl__cu_ldcg(const T *p)
{
#ifdef __CUDA_ARCH__
    return __ldcg(p);
#else
    return *p;
#endif
}

#ifdef __CUDA_ARCH__
#define DL__CU_UNROLL _Pragma("unroll")
#else
#define DL__CU_UNROLL
#endif

/* A sum in a fixed order by one thread (a column of a bias gradient, the
   partials of a last block's finish): add(k, read(k)) for k = 0 .. n-1, the
   reads PF at a time into registers ahead of their adds. The adds and their
   order are the plain loop's, so are the bits; what changes is how many
   reads are in flight. Such a loop walks data the launch before wrote, out
   of L2, where a read takes some 300 cycles and an add 4: one read at a
   time (a loop that also stores, which the compiler may not read ahead of)
   or the compiler's few make a 256-row column cost tens of microseconds. */
template <int PF, typename I, typename R, typename A>
static DL__HD inline void dl__cu_inorder(I n, const R &read, const A &add)
{
    I k = 0;
    int q;
    for (; k + PF <= n; k += PF) {
        decltype(read(k)) v[PF];
        DL__CU_UNROLL
        for (q = 0; q < PF; q++) v[q] = read(k + (I)q);
        DL__CU_UNROLL
        for (q = 0; q < PF; q++) add(k + (I)q, v[q]);
    }
    for (; k < n; k++) add(k, read(k));
}

/* two doubles a partial, read by dl__cu_ldcg (sh: a plain read, of shared memory) */
struct dl__cu_dd { double a, b; };
static DL__HD inline dl__cu_dd dl__cu_pair(const double *p, bool sh = false)
{
    dl__cu_dd v;
    v.a = sh ? p[0] : dl__cu_ldcg(p);
    v.b = sh ? p[1] : dl__cu_ldcg(p + 1);
    return v;
}

/* f(i) for every i in [0, n): grid-stride, index type I */
template <typename I, typename F>
__global__ void __launch_bounds__(DL__CU_THREADS) dl__cu_each(I n, F f)
{
    DL__CU_PDL_ENTER();
    I stride = (I)blockDim.x * (I)gridDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += stride) f(i);
}

/* Whether this block finished last among the launch's blocks (all its
   threads get the answer): every thread fences its writes, then thread 0
   takes a ticket, atomicInc on the device's counter, which wraps to 0 at
   the grid size, so it is zero again for the next launch and for every
   replay of a graph (the CUDA samples' threadFenceReduction). The last
   block then reads the others' writes by dl__cu_ldcg. Which block is last
   changes from run to run; what it computes does not. */
static __device__ bool dl__cu_last_block(unsigned *ticket)
{
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicInc(ticket, gridDim.x - 1) == gridDim.x - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

/* f(i) for every i in [0, n), then fin(c) for c in [0, nfin) in the block
   that finishes last */
template <typename I, typename F, typename G>
__global__ void __launch_bounds__(DL__CU_THREADS) dl__cu_each_fin(I n, F f, int64_t nfin, G fin, unsigned *ticket)
{
    DL__CU_PDL_ENTER();
    I stride = (I)blockDim.x * (I)gridDim.x;
    int64_t c;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += stride) f(i);
    if (!dl__cu_last_block(ticket)) return;
    for (c = (int64_t)threadIdx.x; c < nfin; c += DL__CU_THREADS) fin(c);
}

/* blocks for n work items of `per` threads each, at most enough to fill the GPU */
static unsigned dl__cu_grid(const dl__cuimpl *m, int64_t n, int64_t per_block)
{
    int64_t b = (n + per_block - 1) / per_block;
    if (b > m->max_blocks) b = m->max_blocks;
    return (unsigned)(b < 1 ? 1 : b);
}

/* k<<<grid, block, shm, the device's stream>>>(a...), or with m->pdl the same as a programmatic
   dependent launch (DL__CU_PDL_ENTER); errors as a launch's (dl__cu_launched reads them) */
template <typename... P, typename... A>
static void dl__cu_go(const dl__cuimpl *m, void (*k)(P...), unsigned grid, unsigned block, size_t shm, A... a)
{
    if (m->pdl) {
        cudaLaunchConfig_t cfg = cudaLaunchConfig_t();
        cudaLaunchAttribute at = cudaLaunchAttribute();
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(block);
        cfg.dynamicSmemBytes = shm;
        cfg.stream = m->stream;
        at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at.val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        (void)cudaLaunchKernelEx(&cfg, k, a...);
        return;
    }
    k<<<grid, block, shm, m->stream>>>(a...);
}

template <typename I, typename F>
static void dl__cu_emu_each(const void *f, int64_t n)
{
    const F *g = (const F *)f;
    int64_t i;
    for (i = 0; i < n; i++) (*g)((I)dl__cu_emu_at(i, n));
}

/* An emulated device inside a capture: f(i), i in [0, n), is recorded (a
   copy of f, by value as a kernel launch takes it), not run. */
template <typename I, typename F>
static void dl__cu_record(dl__dev *d, int64_t n, const F &f)
{
    dl__cucap *c = DL__CUI(d)->cap;
    void *copy;
    if (c->failed) return;
    copy = DL_MALLOC(sizeof(F));
    if (!copy || !dl__cu_vgrow((void **)&c->ops, &c->capops, c->nops + 1, sizeof(dl__cu_emuop))) {
        DL_FREE(copy);
        c->failed = true;
        dl__dev_fail(d, "cuda:%d: out of host memory recording a capture", d->id.index);
        return;
    }
    memcpy(copy, (const void *)&f, sizeof(F));
    c->ops[c->nops].run = dl__cu_emu_each<I, F>;
    c->ops[c->nops].f = copy;
    c->ops[c->nops].n = n;
    c->nops++;
}

/* An emulated device's work that is no kernel (memset, memmove, the CPU's
   GEMM): f(0) now, or recorded inside a capture. */
template <typename F>
static void dl__cu_host(dl__dev *d, const F &f)
{
    if (DL__CUI(d)->cap) dl__cu_record<int64_t, F>(d, 1, f);
    else f((int64_t)0);
}
struct dl__cuh_memset {
    void *p; int byte; size_t n;
    void operator()(int64_t) const { memset(p, byte, n); }
};
struct dl__cuh_memmove {
    void *dst; const void *src; size_t n;
    void operator()(int64_t) const { memmove(dst, src, n); }
};

/* Runs f(i), i in [0, n): one kernel launch (a host loop when emulated;
   inside a capture the stream or the list records it). */
template <typename I, typename F>
static void dl__cu_run(dl__dev *d, const char *name, int64_t n, const F &f)
{
    dl__cuimpl *m = DL__CUI(d);
    if (n <= 0) return;
    if (m->emulate) {
        int64_t i;
        if (m->cap) { dl__cu_record<I, F>(d, n, f); return; }
        for (i = 0; i < n; i++) f((I)dl__cu_emu_at(i, n));
        return;
    }
    dl__cu_go(m, dl__cu_each<I, F>, dl__cu_grid(m, n, DL__CU_THREADS), DL__CU_THREADS, 0, (I)n, f);
    dl__cu_launched(d, name);
}

/* an emulated device's dl__cu_run_fin: both loops, one recorded launch */
template <typename I, typename F, typename G>
struct dl__cuh_fin {
    F f; G fin; int64_t n, nfin;
    void operator()(int64_t) const
    {
        int64_t i;
        for (i = 0; i < n; i++) f((I)dl__cu_emu_at(i, n));
        for (i = 0; i < nfin; i++) fin(dl__cu_emu_at(i, nfin));
    }
};

/* Runs f(i), i in [0, n), then fin(c), c in [0, nfin), in one launch: the
   block that finishes last runs fin (dl__cu_last_block), which reads what
   f wrote by dl__cu_ldcg. For a short finish (a few threads' work): the
   launch it saves costs more than one block's loop. */
template <typename I, typename F, typename G>
static void dl__cu_run_fin(dl__dev *d, const char *name, int64_t n, const F &f, int64_t nfin, const G &fin)
{
    dl__cuimpl *m = DL__CUI(d);
    if (n <= 0) {
        dl__cu_run<int64_t>(d, name, nfin, fin);
        return;
    }
    if (m->emulate) {
        dl__cuh_fin<I, F, G> h;
        h.f = f; h.fin = fin; h.n = n; h.nfin = nfin;
        dl__cu_host(d, h);   /* (recorded inside a capture) */
        return;
    }
    dl__cu_go(m, dl__cu_each_fin<I, F, G>, dl__cu_grid(m, n, DL__CU_THREADS), DL__CU_THREADS, 0, (I)n, f, nfin, fin,
              m->ticket);
    dl__cu_launched(d, name);
}

/* sizes below 2^30: 32-bit index arithmetic is safe (i + grid stride < 2^31) */
static bool dl__cu_small(int64_t v) { return v >= 0 && v < ((int64_t)1 << 30); }

static void dl__cu_memset(dl__dev *d, void *p, int byte, size_t n)
{
    dl__cuimpl *m = DL__CUI(d);
    if (!n) return;
    if (m->emulate) {
        dl__cuh_memset f;
        f.p = p; f.byte = byte; f.n = n;
        dl__cu_host(d, f);
        return;
    }
    dl__cu_ok(d, "cudaMemsetAsync", cudaMemsetAsync(p, byte, n, m->stream));
}

/* waits for the stream; false (recorded) on an error */
static bool dl__cu_wait(dl__dev *d, const char *what)
{
    dl__cuimpl *m = DL__CUI(d);
    if (m->emulate || m->cap) return true;   /* (a capture's stream records: nothing to wait for) */
    return dl__cu_ok(d, what, cudaStreamSynchronize(m->stream));
}

/* reads of device memory to the host (each waits for the stream), emulated
   devices' too: what tests/test_cuda.c counts */
static size_t dl__cu_nreads;

/* n bytes of device memory to the host, waiting */
static bool dl__cu_get(dl__dev *d, void *dst, const void *src, size_t n, const char *what)
{
    dl__cuimpl *m = DL__CUI(d);
    if (!n) return true;
    dl__cu_nreads++;
    if (m->cap) {
        memset(dst, 0, n);
        dl__cap_refuse(d, "a read to the host");
        return false;
    }
    if (m->emulate) { memcpy(dst, src, n); return true; }
    if (!dl__cu_ok(d, what, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, m->stream))) return false;
    return dl__cu_wait(d, what);
}

/* ===========================================================================
 * Memory entries
 * ========================================================================= */

static void dl__cu_upload(dl__dev *d, void *dst, const void *src, size_t n)
{
    dl__cuimpl *m = dl__cu_enter(d);
    size_t off, len;
    dst = DL__CUP(d, dst);
    if (!n) return;
    if (m->cap) { dl__cap_refuse(d, "a copy from the host (upload)"); return; }
    if (m->emulate) { memcpy(dst, src, n); return; }
    if (!m->stage[0]) {   /* no pinned memory: CUDA stages it, and we wait */
        if (dl__cu_ok(d, "cudaMemcpyAsync (upload)", cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, m->stream)))
            dl__cu_wait(d, "cudaStreamSynchronize (upload)");
        return;
    }
    for (off = 0; off < n; off += len) {
        int k = m->stage_next;
        len = n - off < DL__CU_STAGE ? n - off : DL__CU_STAGE;
        m->stage_next ^= 1;
        /* the buffer's previous copy must be done before it is overwritten */
        if (!dl__cu_ok(d, "cudaEventSynchronize (upload)", cudaEventSynchronize(m->stage_ev[k]))) return;
        memcpy(m->stage[k], (const char *)src + off, len);
        if (!dl__cu_ok(d, "cudaMemcpyAsync (upload)",
                       cudaMemcpyAsync((char *)dst + off, m->stage[k], len, cudaMemcpyHostToDevice, m->stream)))
            return;
        if (!dl__cu_ok(d, "cudaEventRecord (upload)", cudaEventRecord(m->stage_ev[k], m->stream))) return;
    }
}

static void dl__cu_download(dl__dev *d, void *dst, const void *src, size_t n)
{
    dl__cu_enter(d);
    dl__cu_get(d, dst, DL__CUP(d, src), n, "cudaMemcpyAsync (download)");
}

static void dl__cu_copy(dl__dev *d, void *dst, const void *src, size_t n)
{
    dl__cuimpl *m = dl__cu_enter(d);
    char *a = (char *)DL__CUP(d, dst);
    const char *b = (const char *)DL__CUP(d, src);
    if (!n || a == b) return;
    if (m->emulate) {
        dl__cuh_memmove f;
        f.dst = a; f.src = b; f.n = n;
        dl__cu_host(d, f);
        return;
    }
    if (a < b + n && b < a + n) {   /* overlapping: through a temporary block (a capture's own) */
        cudaError_t e = cudaErrorMemoryAllocation;
        char *t = (char *)(m->cap ? dl__cucap_block(d, n) : dl__cu_block_get(d, n, &e));
        if (!t) { if (!m->cap) dl__cu_fail(d, "copy (temporary)", e); return; }
        if (dl__cu_ok(d, "cudaMemcpyAsync (copy)", cudaMemcpyAsync(t, b, n, cudaMemcpyDeviceToDevice, m->stream)))
            dl__cu_ok(d, "cudaMemcpyAsync (copy)", cudaMemcpyAsync(a, t, n, cudaMemcpyDeviceToDevice, m->stream));
        if (!m->cap) dl__cu_block_put(d, t);
        return;
    }
    dl__cu_ok(d, "cudaMemcpyAsync (copy)", cudaMemcpyAsync(a, b, n, cudaMemcpyDeviceToDevice, m->stream));
}

/* dst on dd <- src on sd. The copy runs on dd's stream after sd's queued
   work, and sd's later work waits for it (src may be reused right after). */
static void dl__cu_peer(dl__dev *dd, void *dst, dl__dev *sd, const void *src, size_t n)
{
    dl__cuimpl *dm = DL__CUI(dd), *sm = DL__CUI(sd);
    dst = DL__CUP(dd, dst);
    src = DL__CUP(sd, src);
    if (!n) return;
    if (dd != sd && (dm->cap || sm->cap)) {
        dl__cap_refuse(dm->cap ? dd : sd, "a copy between two GPUs");
        return;
    }
    if (dd == sd) { dl__cu_copy(dd, (char *)dst + dd->tag, (const char *)src + sd->tag, n); return; }
    if (dm->emulate || sm->emulate) { memcpy(dst, src, n); return; }
    dl__cu_enter(sd);
    if (!dl__cu_ok(sd, "cudaEventRecord (peer copy)", cudaEventRecord(sm->peer_ev, sm->stream))) return;
    dl__cu_enter(dd);
    if (!dl__cu_ok(dd, "cudaStreamWaitEvent (peer copy)", cudaStreamWaitEvent(dm->stream, sm->peer_ev, 0))) return;
    if (!dl__cu_ok(dd, "cudaMemcpyPeerAsync", cudaMemcpyPeerAsync(dst, dm->ordinal, src, sm->ordinal, n, dm->stream)))
        return;
    if (!dl__cu_ok(dd, "cudaEventRecord (peer copy)", cudaEventRecord(dm->peer_ev, dm->stream))) return;
    dl__cu_enter(sd);
    dl__cu_ok(sd, "cudaStreamWaitEvent (peer copy)", cudaStreamWaitEvent(sm->stream, dm->peer_ev, 0));
}

static void dl__cu_sync(dl__dev *d)
{
    dl__cu_enter(d);
    dl__cu_wait(d, "cudaStreamSynchronize");
}

/* ===========================================================================
 * The profiler's marks (dl_profile_*): timing events from a pool, recorded
 * on the device's stream, so a span's time is the stream's (the device's
 * work, and any wait for the host in between); read back, waiting for the
 * later event, only when the profiler turns its spans into times. A
 * failure gives no mark (the span is not counted), never an op's error.
 * Emulated devices: the host clock.
 * ========================================================================= */

static int64_t dl__cu_prof_mark(dl__dev *d)
{
    dl__cuimpl *m = dl__cu_enter(d);
    if (m->emulate) return dl__prof_now();
    if (m->cap) return -1;   /* a capturing stream times nothing (its spans count with no GPU time) */
    if (m->usedpev == m->npev) {
        int n = m->npev ? 2 * m->npev : 256;
        cudaEvent_t *e = (cudaEvent_t *)DL_REALLOC(m->pev, sizeof(cudaEvent_t) * (size_t)n);
        if (!e) return -1;
        m->pev = e;
        while (m->npev < n && cudaEventCreate(&m->pev[m->npev]) == cudaSuccess) m->npev++;
        (void)cudaGetLastError();
        if (m->usedpev == m->npev) return -1;
    }
    if (cudaEventRecord(m->pev[m->usedpev], m->stream) != cudaSuccess) { (void)cudaGetLastError(); return -1; }
    return m->usedpev++;
}

static double dl__cu_prof_seconds(dl__dev *d, int64_t a, int64_t b)
{
    dl__cuimpl *m = dl__cu_enter(d);
    float ms = 0.0f;
    if (m->emulate) return 1e-9 * (double)(b - a);
    if (a < 0 || b < 0 || a >= m->usedpev || b >= m->usedpev) return 0.0;
    if (cudaEventSynchronize(m->pev[b]) != cudaSuccess ||
        cudaEventElapsedTime(&ms, m->pev[a], m->pev[b]) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0.0;
    }
    return 1e-3 * (double)ms;
}

static void dl__cu_prof_release(dl__dev *d) { DL__CUI(d)->usedpev = 0; }

/* ===========================================================================
 * Fills
 * ========================================================================= */

/* A draw of the context's generator inside a capture reads the seed and the
   counter of each run from live ({seed, counter} on the device, copied at
   the start of the run) and keeps its own counter as an offset from the
   capture's first: the counters of eager step k, whichever run is step k.
   Elsewhere live is NULL: seed and offset as given. */
static DL__HD inline void dl__cu_draw(const uint64_t *live, uint64_t seed, uint64_t offset, uint64_t *s, uint64_t *o)
{
    *s = live ? live[0] : seed;
    *o = live ? live[1] + offset : offset;
}

/* live and the offset for a draw (seed, offset) on d */
static const uint64_t *dl__cu_live(dl__dev *d, uint64_t seed, uint64_t *offset)
{
    dl__cucap *c = DL__CUI(d)->cap;
    if (!c || seed != d->ctx->seed || *offset < c->rng0) return NULL;   /* (another generator: as given) */
    *offset -= c->rng0;
    return c->drng;
}

struct dl__cuf_rand {
    int dist; float *y; uint64_t seed, offset; float a, b; const uint64_t *live;
    DL__HD void operator()(int64_t i) const
    {
        uint64_t sd, of;
        dl__cu_draw(live, seed, offset, &sd, &of);
        y[i] = dl__rng_value(dist, sd, of + (uint64_t)i, a, b);
    }
};

static void dl__cu_rand(dl__dev *d, int dist, float *y, int64_t n, uint64_t seed, uint64_t offset,
                        float a, float b)
{
    dl__cuf_rand f;
    dl__cu_enter(d);
    f.live = dl__cu_live(d, seed, &offset);
    f.dist = dist; f.y = DL__CUP(d, y); f.seed = seed; f.offset = offset; f.a = a; f.b = b;
    dl__cu_run<int64_t>(d, "rand", n, f);
}

struct dl__cuf_arange {
    float *y; double start, step;
    DL__HD void operator()(int64_t i) const { y[i] = (float)dl__cu_dadd(start, dl__cu_dmul((double)i, step)); }
};

static void dl__cu_arange(dl__dev *d, float *y, int64_t n, double start, double step)
{
    dl__cuf_arange f;
    dl__cu_enter(d);
    f.y = DL__CUP(d, y); f.start = start; f.step = step;
    dl__cu_run<int64_t>(d, "arange", n, f);
}

struct dl__cuf_fill {
    float *y; float v;
    DL__HD void operator()(int64_t i) const { y[i] = v; }
};

static void dl__cu_fill(dl__dev *d, float *y, int64_t n, float v)
{
    dl__cuf_fill f;
    dl__cu_enter(d);
    y = DL__CUP(d, y);
    if (n <= 0) return;
    if (v == 0.0f && !signbit(v)) { dl__cu_memset(d, y, 0, sizeof(float) * (size_t)n); return; }
    f.y = y; f.v = v;
    dl__cu_run<int64_t>(d, "fill", n, f);
}

struct dl__cuf_add_i64 {
    int64_t *p; int64_t v;
    DL__HD void operator()(int64_t i) const { (void)i; p[0] += v; }
};

static void dl__cu_add_i64(dl__dev *d, int64_t *p, int64_t v)
{
    dl__cuf_add_i64 f;
    dl__cu_enter(d);
    f.p = DL__CUP(d, p); f.v = v;
    dl__cu_run<int64_t>(d, "add_i64", 1, f);
}

/* dl_eq of int64 tensors (class indices): y = a == b ? 1 : 0 */
struct dl__cuf_eq_i64 {
    float *y; const int64_t *a, *b;
    DL__HD void operator()(int64_t i) const { y[i] = a[i] == b[i] ? 1.0f : 0.0f; }
};

static void dl__cu_eq_i64(dl__dev *d, float *y, const int64_t *a, const int64_t *b, int64_t n)
{
    dl__cuf_eq_i64 f;
    dl__cu_enter(d);
    if (n <= 0) return;
    f.y = DL__CUP(d, y); f.a = DL__CUP(d, a); f.b = DL__CUP(d, b);
    dl__cu_run<int64_t>(d, "eq_i64", n, f);
}

/* dl_cumsum: one thread per line, its adds in order from the line's start
   (rev: from its end) in double, as the CPU's (the same bits); a first
   version, with no parallel scan along a long line */
struct dl__cuf_cumsum {
    void *y; const void *x; int64_t n, inner; bool i64, rev;
    DL__HD void operator()(int64_t t) const
    {
        int64_t o = t / inner, i = t % inner, k;
        double s = 0.0;
        uint64_t si = 0;
        for (k = 0; k < n; k++) {
            int64_t at = (o * n + (rev ? n - 1 - k : k)) * inner + i;
            if (i64) {
                si += (uint64_t)((const int64_t *)x)[at];
                ((int64_t *)y)[at] = (int64_t)si;
            } else {
                s = dl__cu_dadd(s, (double)((const float *)x)[at]);
                ((float *)y)[at] = (float)s;
            }
        }
    }
};

static void dl__cu_cumsum(dl__dev *d, int dt, void *y, const void *x, int64_t outer, int64_t n, int64_t inner,
                          bool rev)
{
    dl__cuf_cumsum f;
    dl__cu_enter(d);
    f.y = DL__CUP(d, y); f.x = DL__CUP(d, x); f.n = n; f.inner = inner; f.i64 = dt == DL_DTYPE_I64; f.rev = rev;
    dl__cu_run<int64_t>(d, "cumsum", outer * inner, f);
}

/* ===========================================================================
 * Elementwise: dl.h's X-macro expressions, one instantiation per op
 * ========================================================================= */

template <int OP>
static DL__HD inline float dl__cu_un(float x, float a, float b)
{
    (void)a; (void)b;
    switch (OP) {
#define DL__CASE(nm, ex) case DL__U_##nm: return (ex);
    DL__UNARY_OPS(DL__CASE)
#undef DL__CASE
    default: return x;
    }
}

template <int OP>
static DL__HD inline float dl__cu_bin(float p, float q)
{
    switch (OP) {
#define DL__CASE(nm, ex) case DL__B_##nm: return (ex);
    DL__BINARY_OPS(DL__CASE)
#undef DL__CASE
    default: return p;
    }
}

/* a fused activation (act: DL__U_RELU, DL__U_SIGMOID, DL__U_TANH; -1:
   none) with the unary kernel's expression, and its backward from the
   output y with the binary kernel's (DL__B_*_GRAD of g and y) */
static DL__HD inline float dl__cu_act(int act, float v)
{
    return act == DL__U_RELU ? dl__cu_un<DL__U_RELU>(v, 0.0f, 0.0f)
           : act == DL__U_SIGMOID ? dl__cu_un<DL__U_SIGMOID>(v, 0.0f, 0.0f)
           : act == DL__U_TANH ? dl__cu_un<DL__U_TANH>(v, 0.0f, 0.0f) : v;
}
static DL__HD inline float dl__cu_actg(int act, float g, float y)
{
    return act == DL__U_SIGMOID ? dl__cu_bin<DL__B_SIGMOID_GRAD>(g, y)
           : act == DL__U_TANH ? dl__cu_bin<DL__B_TANH_GRAD>(g, y) : dl__cu_bin<DL__B_RELU_GRAD>(g, y);
}

template <int OP>
struct dl__cuf_un {
    float *y; const float *x; float a, b;
    DL__HD void operator()(int64_t i) const { y[i] = dl__cu_un<OP>(x[i], a, b); }
};

static void dl__cu_unary(dl__dev *d, int op, float *y, const float *x, int64_t n, float a, float b)
{
    dl__cu_enter(d);
    y = DL__CUP(d, y);
    x = DL__CUP(d, x);
    switch (op) {
#define DL__CASE(nm, ex) \
    case DL__U_##nm: { dl__cuf_un<DL__U_##nm> f; f.y = y; f.x = x; f.a = a; f.b = b; \
                       dl__cu_run<int64_t>(d, "unary " #nm, n, f); break; }
    DL__UNARY_OPS(DL__CASE)
#undef DL__CASE
    default: dl__dev_fail(d, "cuda:%d unary: op %d unknown", d->id.index, op);
    }
}

/* a unary op's backward in one launch: dl.h's DL__UNARY_GRADS expression */
template <int OP>
static DL__HD inline float dl__cu_ug(float p, float x, float a, float b)
{
    (void)a; (void)b;
    switch (OP) {
#define DL__CASE(nm, ex) case DL__G_##nm: return (ex);
    DL__UNARY_GRADS(DL__CASE)
#undef DL__CASE
    default: return p;
    }
}

template <int OP>
struct dl__cuf_ug {
    float *dx; const float *g, *x; float a, b;
    DL__HD void operator()(int64_t i) const { dx[i] = dl__cu_ug<OP>(g[i], x[i], a, b); }
};

static void dl__cu_unary_bwd(dl__dev *d, int op, float *dx, const float *g, const float *x, int64_t n, float a,
                             float b)
{
    dl__cu_enter(d);
    dx = DL__CUP(d, dx);
    g = DL__CUP(d, g);
    x = DL__CUP(d, x);
    switch (op) {
#define DL__CASE(nm, ex) \
    case DL__G_##nm: { dl__cuf_ug<DL__G_##nm> f; f.dx = dx; f.g = g; f.x = x; f.a = a; f.b = b; \
                       dl__cu_run<int64_t>(d, "unary_bwd " #nm, n, f); break; }
    DL__UNARY_GRADS(DL__CASE)
#undef DL__CASE
    default: dl__dev_fail(d, "cuda:%d unary_bwd: op %d unknown", d->id.index, op);
    }
}

/* contiguous or scalar operands: y[i] = a[i*sa] op b[i*sb], sa, sb in {0, 1} */
template <int OP>
struct dl__cuf_binflat {
    float *y; const float *a, *b; int64_t sa, sb;
    DL__HD void operator()(int64_t i) const { y[i] = dl__cu_bin<OP>(a[i * sa], b[i * sb]); }
};

/* broadcasting: the output index split over the (collapsed) dims */
template <int OP, typename I>
struct dl__cuf_bin {
    float *y; const float *a, *b; int nd; I shape[DL_MAX_DIMS], sa[DL_MAX_DIMS], sb[DL_MAX_DIMS];
    DL__HD void operator()(I i) const
    {
        I oa = 0, ob = 0, rem = i;
        int k;
        for (k = nd - 1; k >= 0; k--) {
            I c = rem % shape[k];
            rem /= shape[k];
            oa += c * sa[k];
            ob += c * sb[k];
        }
        y[i] = dl__cu_bin<OP>(a[oa], b[ob]);
    }
};

/* Drops size-1 dims and merges neighbours that are contiguous in every
   operand (ns stride arrays). Returns the new ndim (0 for one element). */
static int dl__cu_collapse(int nd, int64_t *shape, int ns, int64_t (*st)[DL_MAX_DIMS])
{
    int k, j, out = 0;
    for (k = 0; k < nd; k++) {
        if (shape[k] == 1) continue;
        if (out > 0) {
            bool merge = true;
            for (j = 0; j < ns; j++) if (st[j][out - 1] != st[j][k] * shape[k]) merge = false;
            if (merge) {
                shape[out - 1] *= shape[k];
                for (j = 0; j < ns; j++) st[j][out - 1] = st[j][k];
                continue;
            }
        }
        shape[out] = shape[k];
        for (j = 0; j < ns; j++) st[j][out] = st[j][k];
        out++;
    }
    return out;
}

/* largest element offset reached: sum of (shape-1)*|stride| */
static int64_t dl__cu_span(int nd, const int64_t *shape, const int64_t *st)
{
    int64_t s = 0;
    int k;
    for (k = 0; k < nd; k++) s += (shape[k] - 1) * (st[k] < 0 ? -st[k] : st[k]);
    return s;
}

template <int OP>
static void dl__cu_binary_op(dl__dev *d, const char *name, float *y, const float *a, const float *b,
                             const dl__bcast *bc)
{
    int64_t shape[DL_MAX_DIMS], st[2][DL_MAX_DIMS];
    int nd = bc->ndim, k;
    for (k = 0; k < nd; k++) { shape[k] = bc->shape[k]; st[0][k] = bc->sa[k]; st[1][k] = bc->sb[k]; }
    nd = dl__cu_collapse(nd, shape, 2, st);
    if (nd == 0 || (nd == 1 && (st[0][0] == 0 || st[0][0] == 1) && (st[1][0] == 0 || st[1][0] == 1))) {
        dl__cuf_binflat<OP> f;
        f.y = y; f.a = a; f.b = b;
        f.sa = nd ? st[0][0] : 0;
        f.sb = nd ? st[1][0] : 0;
        dl__cu_run<int64_t>(d, name, bc->n, f);
        return;
    }
    if (dl__cu_small(bc->n) && dl__cu_small(dl__cu_span(nd, shape, st[0])) &&
        dl__cu_small(dl__cu_span(nd, shape, st[1]))) {
        dl__cuf_bin<OP, int32_t> f;
        f.y = y; f.a = a; f.b = b; f.nd = nd;
        for (k = 0; k < nd; k++) { f.shape[k] = (int32_t)shape[k]; f.sa[k] = (int32_t)st[0][k]; f.sb[k] = (int32_t)st[1][k]; }
        dl__cu_run<int32_t>(d, name, bc->n, f);
    } else {
        dl__cuf_bin<OP, int64_t> f;
        f.y = y; f.a = a; f.b = b; f.nd = nd;
        for (k = 0; k < nd; k++) { f.shape[k] = shape[k]; f.sa[k] = st[0][k]; f.sb[k] = st[1][k]; }
        dl__cu_run<int64_t>(d, name, bc->n, f);
    }
}

static void dl__cu_binary(dl__dev *d, int op, float *y, const float *a, const float *b, const dl__bcast *bc)
{
    dl__cu_enter(d);
    y = DL__CUP(d, y);
    a = DL__CUP(d, a);
    b = DL__CUP(d, b);
    if (bc->n <= 0) return;
    switch (op) {
#define DL__CASE(nm, ex) case DL__B_##nm: dl__cu_binary_op<DL__B_##nm>(d, "binary " #nm, y, a, b, bc); break;
    DL__BINARY_OPS(DL__CASE)
#undef DL__CASE
    default: dl__dev_fail(d, "cuda:%d binary: op %d unknown", d->id.index, op);
    }
}

/* ===========================================================================
 * Reductions over (outer, r, inner)
 * ========================================================================= */

template <int OP>
static DL__HD inline double dl__cu_rid(void)
{
    return OP == DL__R_SUM ? 0.0 : OP == DL__R_MAX ? -(double)INFINITY : (double)INFINITY;
}

/* combine two partial results; NaN wins (as the CPU); ties keep a (the
   earlier elements) */
template <int OP>
static DL__HD inline double dl__cu_comb(double a, double b)
{
    if (OP == DL__R_SUM) return dl__cu_dadd(a, b);
    if (a != a) return a;
    if (b != b) return b;
    return OP == DL__R_MAX ? (b > a ? b : a) : (b < a ? b : a);
}

/* one row (inner == 1), the CPU's loop exactly: sum in double, in order;
   max/min from the first element, the first NaN wins */
template <int OP, typename I>
struct dl__cuf_rowseq {
    float *y; const float *x; I r;
    DL__HD void operator()(I o) const
    {
        const float *p = x + o * r;
        I k;
        if (OP == DL__R_SUM) {
            double s = 0;
            for (k = 0; k < r; k++) s = dl__cu_dadd(s, (double)p[k]);
            y[o] = (float)s;
        } else {
            float m = r ? p[0] : (OP == DL__R_MAX ? -INFINITY : INFINITY);
            for (k = 1; k < r; k++) {
                float v = p[k];
                if (v != v) { m = v; break; }
                if (OP == DL__R_MAX ? v > m : v < m) m = v;
            }
            y[o] = m;
        }
    }
};

/* one column (inner > 1), the CPU's loop exactly: sum in double, in order;
   max/min from the first element, a later NaN replaces it */
template <int OP, typename I>
struct dl__cuf_colseq {
    float *y; const float *x; I r, inner;
    DL__HD void operator()(I e) const
    {
        I o = e / inner, i = e - o * inner, k;
        const float *p = x + o * r * inner + i;
        float m;
        if (OP == DL__R_SUM) {
            double s = 0.0;
            dl__cu_inorder<16>(r, [&](I q) { return p[q * inner]; },
                               [&](I, float v) { s = dl__cu_dadd(s, (double)v); });
            m = (float)s;
        } else if (r == 0) {
            m = OP == DL__R_MAX ? -INFINITY : INFINITY;
        } else {
            m = p[0];
            for (k = 1; k < r; k++) {
                float v = p[k * inner];
                if (OP == DL__R_MAX ? (v > m || v != v) : (v < m || v != v)) m = v;
            }
        }
        y[e] = m;
    }
};

/* Ordered column sums staged through shared memory: dl__cuf_colseq's sum
   and dl__cuf_bias_act_bwd for columns of at least DL__CU_TILE_MIN rows,
   and the class loss's backward with its logits' bias gradient.
   Block b takes the 32 columns [32b, 32b + 32); its 8 warps read
   DL__CU_TROWS rows of them at a time, a warp a row (32 neighbouring
   columns: coalesced), DL__CU_COLB rows a thread before any of their
   values is used or written (rd.get, then rd.put: a store between two
   reads would keep the compiler from moving the second above it), into
   shared memory; then lane l of warp 0 adds column l's values in row
   order, in double. The adds and their order are the thread-per-column
   loop's, so are the bits; what goes is its wait on the reads:
   dl__cu_inorder keeps 16 in flight, 16 trips to L2 for a 256-row
   column (18-25 us of an MLP's 150 us step on an H200 under ncu; PyTorch's
   own reduce 5-14 us). On the H200 the staged reduce took 6.9 us where
   the loop took 17.8; bias_act_bwd's first staged form, a read then its
   store then the next read, stayed at 24 us: hence get, then put. The two phases between the block's barriers are
   host-and-device functions: an emulated device runs them thread after
   thread, block after block (dl__cuh_colsum). rd.get(e, k): what column
   e's value at row k is made of; rd.put(e, k, raw): that value (with
   what the caller writes on the way: bias_act_bwd's gx, the class loss's
   dx). */
#ifndef DL__CU_TROWS
#define DL__CU_TROWS 256
#endif
#define DL__CU_TILE_MIN 32
#define DL__CU_COLB 8

template <typename I, typename R>
struct dl__cu_colsum {
    R rd; I ncol, r; float *y;
    /* phase 1, thread t: rows [k0, k0 + kn) of columns [c0, c0 + 32) into tile */
    DL__HD void load(float (*tile)[32], I c0, I k0, I kn, int t) const
    {
        const int lane = t & 31, wrp = t >> 5, nw = DL__CU_THREADS / 32;
        I e = c0 + (I)lane, k;
        int q;
        if (e >= ncol) return;
        for (k = (I)wrp; k < kn; k += (I)(DL__CU_COLB * nw)) {
            typename R::raw v[DL__CU_COLB] = {};
            DL__CU_UNROLL
            for (q = 0; q < DL__CU_COLB; q++)
                if (k + (I)(q * nw) < kn) v[q] = rd.get(e, k0 + k + (I)(q * nw));
            DL__CU_UNROLL
            for (q = 0; q < DL__CU_COLB; q++)
                if (k + (I)(q * nw) < kn) tile[k + q * nw][lane] = rd.put(e, k0 + k + (I)(q * nw), v[q]);
        }
    }
    /* phase 2, lane l of warp 0: column c0 + l's kn rows, in order, into *s */
    DL__HD void add(float (*tile)[32], I c0, I kn, int lane, double *s) const
    {
        I k;
        if (c0 + (I)lane >= ncol) return;
        for (k = 0; k < kn; k++) *s = dl__cu_dadd(*s, (double)tile[k][lane]);
    }
};

template <typename I, typename R>
__global__ void __launch_bounds__(DL__CU_THREADS) dl__cu_colsum_k(dl__cu_colsum<I, R> f)
{
    DL__CU_PDL_ENTER();
    __shared__ float tile[DL__CU_TROWS][32];
    const int lane = threadIdx.x & 31;
    I c0, k0;
    for (c0 = (I)blockIdx.x * 32; c0 < f.ncol; c0 += (I)gridDim.x * 32) {
        double s = 0.0;
        for (k0 = 0; k0 < f.r; k0 += DL__CU_TROWS) {
            I kn = f.r - k0 < (I)DL__CU_TROWS ? f.r - k0 : (I)DL__CU_TROWS;
            f.load(tile, c0, k0, kn, (int)threadIdx.x);
            __syncthreads();
            if (threadIdx.x < 32) f.add(tile, c0, kn, lane, &s);
            __syncthreads();
        }
        if (threadIdx.x < 32 && c0 + (I)lane < f.ncol) f.y[c0 + lane] = (float)s;
    }
}

/* an emulated device's dl__cu_colsum_k: the same phases, thread after thread */
template <typename I, typename R>
struct dl__cuh_colsum {
    dl__cu_colsum<I, R> f;
    void operator()(int64_t) const
    {
        float tile[DL__CU_TROWS][32];   /* (32 KB of the host thread's stack, as the block's shared memory) */
        double s[32];
        I c0, k0, nb = (f.ncol + 31) / 32, b;
        int t, i;
        for (b = 0; b < nb; b++) {
            c0 = (I)dl__cu_emu_at(b, nb) * 32;
            for (t = 0; t < 32; t++) s[t] = 0.0;
            for (t = 0; t < DL__CU_TROWS * 32; t++) tile[t / 32][t % 32] = NAN;
            for (k0 = 0; k0 < f.r; k0 += DL__CU_TROWS) {
                I kn = f.r - k0 < (I)DL__CU_TROWS ? f.r - k0 : (I)DL__CU_TROWS;
                for (i = 0; i < DL__CU_THREADS; i++) f.load(tile, c0, k0, kn, (int)dl__cu_emu_at(i, DL__CU_THREADS));
                for (i = 0; i < 32; i++) {
                    t = (int)dl__cu_emu_at(i, 32);
                    f.add(tile, c0, kn, t, &s[t]);
                }
            }
            for (t = 0; t < 32 && c0 + (I)t < f.ncol; t++) f.y[c0 + t] = (float)s[t];
        }
    }
};

/* y[e] = the in-order sum of column e of rd (ncol columns of r rows) */
template <typename I, typename R>
static void dl__cu_colsum_go(dl__dev *d, const char *name, I ncol, I r, const R &rd, float *y)
{
    dl__cuimpl *m = DL__CUI(d);
    dl__cu_colsum<I, R> f;
    f.rd = rd; f.ncol = ncol; f.r = r; f.y = y;
    if (m->emulate) {
        dl__cuh_colsum<I, R> h;
        h.f = f;
        dl__cu_host(d, h);   /* (recorded inside a capture) */
        return;
    }
    dl__cu_go(m, dl__cu_colsum_k<I, R>, dl__cu_grid(m, ncol, 32), DL__CU_THREADS, 0, f);
    dl__cu_launched(d, name);
}

/* rd for x (outer, r, inner): column e = (o, i) */
template <typename I>
struct dl__cur_col {
    typedef float raw;
    const float *x; I r, inner;
    DL__HD float get(I e, I k) const
    {
        I o = e / inner, i = e - o * inner;
        return x[(o * r + k) * inner + i];
    }
    DL__HD float put(I, I, float v) const { return v; }
};

/* columns split into chunks of rc rows: part (outer, nch, inner) in double */
template <int OP, typename T, typename I>
struct dl__cuf_colpart {
    double *part; const T *x; I r, inner, nch, rc;
    DL__HD void operator()(I e) const
    {
        I i = e % inner, t = e / inner, c = t % nch, o = t / nch;
        I lo = c * rc, hi = lo + rc < r ? lo + rc : r;
        double acc = dl__cu_rid<OP>();
        dl__cu_inorder<16>(hi - lo, [&](I k) { return (double)x[(o * r + lo + k) * inner + i]; },
                           [&](I, double v) { acc = dl__cu_comb<OP>(acc, v); });
        part[e] = acc;
    }
};

/* the chunks' partials (outer, r, inner) combined in order, to float */
template <int OP, typename I>
struct dl__cuf_colfin {
    float *y; const double *x; I r, inner;
    DL__HD void operator()(I e) const
    {
        I o = e / inner, i = e - o * inner;
        double acc = dl__cu_rid<OP>();
        dl__cu_inorder<8>(r, [&](I k) { return x[(o * r + k) * inner + i]; },
                          [&](I, double v) { acc = dl__cu_comb<OP>(acc, v); });
        y[e] = (float)acc;
    }
};

/* reduce a warp's values to lane 0 (fixed tree: lane l takes lane l+o) */
template <int OP>
static __device__ inline double dl__cu_warp_red(double v)
{
    int o;
    for (o = 16; o > 0; o >>= 1) v = dl__cu_comb<OP>(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}

/* Reduce a group of G threads (G = 32: a warp; 256: the block) and give
   every thread of the group the result of thread 0's tree. sh: 9 doubles. */
template <int OP, int G>
static __device__ inline double dl__cu_group_all(double v, double *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = dl__cu_warp_red<OP>(v);
    if (G == 32) return __shfl_sync(0xffffffffu, v, 0);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < G / 32 ? sh[lane] : dl__cu_rid<OP>();
        v = dl__cu_warp_red<OP>(v);
        if (lane == 0) sh[8] = v;
    }
    __syncthreads();
    v = sh[8];
    __syncthreads();
    return v;
}

/* Row reductions: job j = (row, chunk) of rows x nchunk covers elements
   [c*chunk, min(r, (c+1)*chunk)) of the row; one group of G threads per job,
   each thread strides over the job's elements, then the group's fixed tree.
   Writes yd[j] (double) or yf[j] (float, nchunk == 1). SQ: squares (sumsq). */
template <int OP, int G, typename T, bool SQ>
__global__ void __launch_bounds__(DL__CU_THREADS)
dl__cu_rowred(const T *x, int64_t rows, int64_t r, int64_t chunk, int64_t nchunk, float *yf, double *yd)
{
    DL__CU_PDL_ENTER();
    __shared__ double sh[9];
    const int gpb = DL__CU_THREADS / G, g = threadIdx.x / G, t = threadIdx.x % G;
    const int64_t total = rows * nchunk;
    int64_t base;
    for (base = (int64_t)blockIdx.x * gpb; base < total; base += (int64_t)gridDim.x * gpb) {
        int64_t job = base + g;
        double acc = dl__cu_rid<OP>();
        if (job < total) {
            int64_t row = job / nchunk, c = job - row * nchunk, k;
            int64_t lo = c * chunk, hi = lo + chunk < r ? lo + chunk : r;
            const T *p = x + row * r;
            for (k = lo + t; k < hi; k += G) {
                double v = (double)p[k];
                acc = dl__cu_comb<OP>(acc, SQ ? dl__cu_dmul(v, v) : v);
            }
        }
        acc = dl__cu_group_all<OP, G>(acc, sh);
        if (t == 0 && job < total) {
            if (yd) yd[job] = acc;
            else yf[job] = (float)acc;
        }
    }
}

template <int OP, typename T, bool SQ>
static void dl__cu_rowred_launch(dl__dev *d, const T *x, int64_t rows, int64_t r, int64_t chunk,
                                 int64_t nchunk, float *yf, double *yd)
{
    dl__cuimpl *m = DL__CUI(d);
    int64_t jobs = rows * nchunk, per = chunk < r ? chunk : r;
    if (jobs <= 0) return;
    if (per <= 256)
        dl__cu_go(m, dl__cu_rowred<OP, 32, T, SQ>, dl__cu_grid(m, jobs, DL__CU_THREADS / 32), DL__CU_THREADS, 0,
                  x, rows, r, chunk, nchunk, yf, yd);
    else
        dl__cu_go(m, dl__cu_rowred<OP, 256, T, SQ>, dl__cu_grid(m, jobs, 1), DL__CU_THREADS, 0, x, rows, r, chunk,
                  nchunk, yf, yd);
    dl__cu_launched(d, "reduce rows");
}

/* (outer, r) rows, inner == 1, on the GPU: one pass when a row fits in a
   chunk, else partial results per chunk (double) reduced again */
template <int OP>
static void dl__cu_reduce_rows(dl__dev *d, float *y, const float *x, int64_t outer, int64_t r)
{
    int64_t n1 = (r + DL__CU_RCHUNK - 1) / DL__CU_RCHUNK, total = 0, len, nch;
    double *buf, *cur, *nxt;
    if (r <= DL__CU_RCHUNK) {
        dl__cu_rowred_launch<OP, float, false>(d, x, outer, r, r > 0 ? r : 1, 1, y, NULL);
        return;
    }
    for (len = n1; len > 1; len = (len + DL__CU_RCHUNK - 1) / DL__CU_RCHUNK) total += outer * len;
    buf = (double *)dl__cu_scratch(d, sizeof(double) * (size_t)(total + outer));
    if (!buf) return;
    dl__cu_rowred_launch<OP, float, false>(d, x, outer, r, DL__CU_RCHUNK, n1, NULL, buf);
    cur = buf;
    len = n1;
    while (len > DL__CU_RCHUNK) {
        nch = (len + DL__CU_RCHUNK - 1) / DL__CU_RCHUNK;
        nxt = cur + outer * len;
        dl__cu_rowred_launch<OP, double, false>(d, cur, outer, len, DL__CU_RCHUNK, nch, NULL, nxt);
        cur = nxt;
        len = nch;
    }
    dl__cu_rowred_launch<OP, double, false>(d, cur, outer, len, len, 1, y, NULL);
}

/* column sums (inner > 1) the reduce adds sequentially, a thread per column
   (dl__cuf_colseq; a sum over 32+ rows staged, dl__cu_colsum): many columns
   or short ones; else partials in chunks */
static bool dl__cu_colseq_ok(int64_t cols, int64_t r) { return cols >= 8192 || r < 1024; }
/* dl__backend.colsum_fused: a sum over the rows of (rows, cols) is dl__cu_reduce_op's in-order one
   (inner cols > 1, outer 1), which a launch that makes the rows' values can make as dl__cu_colsum_go */
static bool dl__cu_colsum_fused(int64_t rows, int64_t cols) { return rows >= 1 && cols >= 2 && dl__cu_colseq_ok(cols, rows); }

template <int OP>
static void dl__cu_reduce_op(dl__dev *d, float *y, const float *x, int64_t outer, int64_t r, int64_t inner)
{
    dl__cuimpl *m = DL__CUI(d);
    int64_t cols = outer * inner, total = cols * r;
    if (cols <= 0) return;
    if (inner == 1) {
        if (m->emulate || r <= 32) {   /* the CPU's loop, one thread per row */
            if (dl__cu_small(total)) {
                dl__cuf_rowseq<OP, int32_t> f;
                f.y = y; f.x = x; f.r = (int32_t)r;
                dl__cu_run<int32_t>(d, "reduce", outer, f);
            } else {
                dl__cuf_rowseq<OP, int64_t> f;
                f.y = y; f.x = x; f.r = r;
                dl__cu_run<int64_t>(d, "reduce", outer, f);
            }
            return;
        }
        dl__cu_reduce_rows<OP>(d, y, x, outer, r);
        return;
    }
    if (dl__cu_colseq_ok(cols, r)) {    /* the CPU's loop, one thread per column */
        if (OP == DL__R_SUM && r >= DL__CU_TILE_MIN) {   /* the same adds, staged */
            if (dl__cu_small(total)) {
                dl__cur_col<int32_t> rd;
                rd.x = x; rd.r = (int32_t)r; rd.inner = (int32_t)inner;
                dl__cu_colsum_go<int32_t>(d, "reduce (columns)", (int32_t)cols, (int32_t)r, rd, y);
            } else {
                dl__cur_col<int64_t> rd;
                rd.x = x; rd.r = r; rd.inner = inner;
                dl__cu_colsum_go<int64_t>(d, "reduce (columns)", cols, r, rd, y);
            }
            return;
        }
        if (dl__cu_small(total)) {
            dl__cuf_colseq<OP, int32_t> f;
            f.y = y; f.x = x; f.r = (int32_t)r; f.inner = (int32_t)inner;
            dl__cu_run<int32_t>(d, "reduce", cols, f);
        } else {
            dl__cuf_colseq<OP, int64_t> f;
            f.y = y; f.x = x; f.r = r; f.inner = inner;
            dl__cu_run<int64_t>(d, "reduce", cols, f);
        }
        return;
    }
    /* few long columns: partials of DL__CU_CCHUNK rows in double, until few remain */
    {
        int64_t len = r, need = 0, nch;
        double *buf, *cur = NULL;
        for (len = r; !dl__cu_colseq_ok(cols, len); len = (len + DL__CU_CCHUNK - 1) / DL__CU_CCHUNK)
            need += cols * ((len + DL__CU_CCHUNK - 1) / DL__CU_CCHUNK);
        buf = (double *)dl__cu_scratch(d, sizeof(double) * (size_t)need);
        if (!buf) return;
        len = r;
        while (!dl__cu_colseq_ok(cols, len)) {
            double *out = cur ? cur + cols * len : buf;
            dl__cuf_colpart<OP, double, int64_t> fd;
            dl__cuf_colpart<OP, float, int64_t> ff;
            nch = (len + DL__CU_CCHUNK - 1) / DL__CU_CCHUNK;
            if (cur) {
                fd.part = out; fd.x = cur; fd.r = len; fd.inner = inner; fd.nch = nch; fd.rc = DL__CU_CCHUNK;
                dl__cu_run<int64_t>(d, "reduce (partials)", outer * nch * inner, fd);
            } else {
                ff.part = out; ff.x = x; ff.r = len; ff.inner = inner; ff.nch = nch; ff.rc = DL__CU_CCHUNK;
                dl__cu_run<int64_t>(d, "reduce (partials)", outer * nch * inner, ff);
            }
            cur = out;
            len = nch;
        }
        {
            dl__cuf_colfin<OP, int64_t> f;
            f.y = y; f.x = cur; f.r = len; f.inner = inner;
            dl__cu_run<int64_t>(d, "reduce (final)", cols, f);
        }
    }
}

static void dl__cu_reduce(dl__dev *d, int op, float *y, const float *x, int64_t outer, int64_t r, int64_t inner)
{
    dl__cu_enter(d);
    y = DL__CUP(d, y);
    x = DL__CUP(d, x);
    if (op == DL__R_SUM) dl__cu_reduce_op<DL__R_SUM>(d, y, x, outer, r, inner);
    else if (op == DL__R_MAX) dl__cu_reduce_op<DL__R_MAX>(d, y, x, outer, r, inner);
    else if (op == DL__R_MIN) dl__cu_reduce_op<DL__R_MIN>(d, y, x, outer, r, inner);
    else dl__dev_fail(d, "cuda:%d reduce: op %d unknown", d->id.index, op);
}

/* the CPU's loop: the first maximum; a NaN is the maximum (the first one) */
struct dl__cuf_argmax {
    int64_t *idx; const float *x; int64_t r, inner;
    DL__HD void operator()(int64_t e) const
    {
        int64_t o = e / inner, i = e - o * inner, k, best = 0;
        const float *p = x + o * r * inner + i;
        float m = r ? p[0] : 0.0f;
        for (k = 1; k < r; k++) {
            float v = p[k * inner];
            if (m != m) break;
            if (v > m || v != v) { m = v; best = k; }
        }
        idx[e] = best;
    }
};

static void dl__cu_argmax(dl__dev *d, int64_t *idx, const float *x, int64_t outer, int64_t r, int64_t inner)
{
    dl__cuf_argmax f;
    dl__cu_enter(d);
    f.idx = DL__CUP(d, idx); f.x = DL__CUP(d, x); f.r = r; f.inner = inner;
    dl__cu_run<int64_t>(d, "argmax", outer * inner, f);
}

/* y (outer, r, inner) = 1 where idx (outer, inner) names the class, else 0 */
struct dl__cuf_onehot {
    float *y; const int64_t *idx; int64_t r, inner;
    DL__HD void operator()(int64_t e) const
    {
        int64_t i = e % inner, t = e / inner, k = t % r, o = t / r;
        y[e] = idx[o * inner + i] == k ? 1.0f : 0.0f;
    }
};

static void dl__cu_onehot(dl__dev *d, float *y, const int64_t *idx, int64_t outer, int64_t r, int64_t inner)
{
    dl__cuf_onehot f;
    dl__cu_enter(d);
    f.y = DL__CUP(d, y); f.idx = DL__CUP(d, idx); f.r = r; f.inner = inner;
    dl__cu_run<int64_t>(d, "onehot", outer * r * inner, f);
}

/* ===========================================================================
 * Strided copies, axpy, scale, nonfinite
 * ========================================================================= */

template <typename T, typename I>
struct dl__cuf_copy {
    T *dst; const T *src; int nd; I shape[DL_MAX_DIMS], ds[DL_MAX_DIMS], ss[DL_MAX_DIMS];
    DL__HD void operator()(I i) const
    {
        I od = 0, os = 0, rem = i;
        int k;
        for (k = nd - 1; k >= 0; k--) {
            I c = rem % shape[k];
            rem /= shape[k];
            od += c * ds[k];
            os += c * ss[k];
        }
        dst[od] = src[os];
    }
};

template <typename T>
static void dl__cu_copy_t(dl__dev *d, int nd, const int64_t *shape, const int64_t (*st)[DL_MAX_DIMS],
                          void *dst, const void *src, int64_t n)
{
    int k;
    if (dl__cu_small(n) && dl__cu_small(dl__cu_span(nd, shape, st[0])) && dl__cu_small(dl__cu_span(nd, shape, st[1]))) {
        dl__cuf_copy<T, int32_t> f;
        f.dst = (T *)dst; f.src = (const T *)src; f.nd = nd;
        for (k = 0; k < nd; k++) { f.shape[k] = (int32_t)shape[k]; f.ds[k] = (int32_t)st[0][k]; f.ss[k] = (int32_t)st[1][k]; }
        dl__cu_run<int32_t>(d, "copy_nd", n, f);
    } else {
        dl__cuf_copy<T, int64_t> f;
        f.dst = (T *)dst; f.src = (const T *)src; f.nd = nd;
        for (k = 0; k < nd; k++) { f.shape[k] = shape[k]; f.ds[k] = st[0][k]; f.ss[k] = st[1][k]; }
        dl__cu_run<int64_t>(d, "copy_nd", n, f);
    }
}

static void dl__cu_copy_nd(dl__dev *d, size_t esize, int ndim, const int64_t *shape, void *dst,
                           const int64_t *dst_strides, const void *src, const int64_t *src_strides)
{
    dl__cuimpl *m = dl__cu_enter(d);
    int64_t sh[DL_MAX_DIMS], st[2][DL_MAX_DIMS], n = 1;
    int k, nd;
    dst = DL__CUP(d, dst);
    src = DL__CUP(d, src);
    for (k = 0; k < ndim; k++) {
        sh[k] = shape[k]; st[0][k] = dst_strides[k]; st[1][k] = src_strides[k];
        n *= shape[k];
    }
    if (n <= 0) return;
    nd = dl__cu_collapse(ndim, sh, 2, st);
    if (nd == 0 || (nd == 1 && st[0][0] == 1 && st[1][0] == 1)) {   /* one contiguous run */
        if (dst == src) return;
        if (m->emulate) {
            dl__cuh_memmove f;
            f.dst = dst; f.src = src; f.n = esize * (size_t)n;
            dl__cu_host(d, f);
            return;
        }
        dl__cu_ok(d, "cudaMemcpyAsync (copy_nd)",
                  cudaMemcpyAsync(dst, src, esize * (size_t)n, cudaMemcpyDeviceToDevice, m->stream));
        return;
    }
    if (esize == 4) dl__cu_copy_t<uint32_t>(d, nd, sh, st, dst, src, n);
    else if (esize == 8) dl__cu_copy_t<unsigned long long>(d, nd, sh, st, dst, src, n);
    else dl__dev_fail(d, "cuda:%d copy_nd: element size %zu", d->id.index, esize);
}

struct dl__cuf_axpy {
    float *y; const float *x; float alpha;
    DL__HD void operator()(int64_t i) const
    {
        y[i] = alpha == 1.0f ? dl__cu_fadd(y[i], x[i]) : dl__cu_fadd(y[i], dl__cu_fmul(alpha, x[i]));
    }
};

static void dl__cu_axpy(dl__dev *d, float *y, const float *x, int64_t n, float alpha)
{
    dl__cuf_axpy f;
    dl__cu_enter(d);
    f.y = DL__CUP(d, y); f.x = DL__CUP(d, x); f.alpha = alpha;
    dl__cu_run<int64_t>(d, "axpy", n, f);
}

/* the tensor of element i of a concatenated list: the last k < nt with
   off[k] <= i (off ascending, off[0] = 0), by bisection */
static DL__HD inline int dl__cu_mt_find(const int64_t *off, int nt, int64_t i)
{
    int lo = 0, hi = nt - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (off[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* y[k][j] += x[k][j] over the tensors' concatenated elements (k by
   dl__cu_mt_find); the table travels in the launch's arguments (about
   1.2 KB: no copy to the device, nothing to keep for a graph). Bit k of
   first: y[k] is zero (a zero_grad inside a capture left it unwritten, or
   one outside left it none), so it is 0 + x[k], y[k] not read: the bits
   of the zeros and the sum */
struct dl__cuf_axm {
    float *y[DL__AXM]; const float *x[DL__AXM]; int64_t off[DL__AXM + 1]; int nt; uint64_t first;
    DL__HD void operator()(int64_t i) const
    {
        int lo = dl__cu_mt_find(off, nt, i);
        int64_t j = i - off[lo];
        y[lo][j] = dl__cu_fadd((first >> lo) & 1 ? 0.0f : y[lo][j], x[lo][j]);   /* axpy with alpha 1 */
    }
};

static void dl__cu_axpy_multi(dl__dev *d, int nt, float *const *y, const float *const *x, const int64_t *n,
                              uint64_t first)
{
    dl__cuf_axm f;
    int k, m = 0;
    dl__cu_enter(d);
    if (DL__CU_EXP & 2) return;
    f.off[0] = 0;
    f.first = 0;
    for (k = 0; k < nt && k < DL__AXM; k++) {
        float *yk = y[k];
        const float *xk = x[k];
        if (n[k] <= 0) continue;
        f.y[m] = DL__CUP(d, yk);
        f.x[m] = DL__CUP(d, xk);
        f.off[m + 1] = f.off[m] + n[k];
        if ((first >> k) & 1) f.first |= (uint64_t)1 << m;
        m++;
    }
    f.nt = m;
    if (m) dl__cu_run<int64_t>(d, "axpy (multi-tensor)", f.off[m], f);
}

struct dl__cuf_scale {
    float *x; float s;
    DL__HD void operator()(int64_t i) const { x[i] = dl__cu_fmul(x[i], s); }
};

static void dl__cu_scale(dl__dev *d, float *x, int64_t n, float s)
{
    dl__cuf_scale f;
    dl__cu_enter(d);
    f.x = DL__CUP(d, x); f.s = s;
    dl__cu_run<int64_t>(d, "scale", n, f);
}

/* *res = min(*res, i): order-independent, so the result is deterministic */
static DL__HD inline void dl__cu_min_index(unsigned long long *res, int64_t i)
{
#ifdef __CUDA_ARCH__
    atomicMin(res, (unsigned long long)i);
#else
    if ((unsigned long long)i < *res) *res = (unsigned long long)i;
#endif
}

struct dl__cuf_nonfinite {
    const float *x; unsigned long long *res;
    DL__HD void operator()(int64_t i) const
    {
        float v = x[i];
        if (!(v - v == 0.0f)) dl__cu_min_index(res, i);
    }
};

static int64_t dl__cu_nonfinite(dl__dev *d, const float *x, int64_t n)
{
    dl__cuimpl *m = dl__cu_enter(d);
    dl__cuf_nonfinite f;
    unsigned long long r = ~0ull;
    if (n <= 0) return -1;
    if (m->cap) { dl__cap_refuse(d, "a read to the host (nonfinite: anomaly mode)"); return -1; }
    dl__cu_memset(d, m->dres, 0xff, sizeof r);
    f.x = DL__CUP(d, x); f.res = (unsigned long long *)m->dres;
    dl__cu_run<int64_t>(d, "nonfinite", n, f);
    if (!dl__cu_get(d, m->hres, m->dres, sizeof r, "nonfinite")) return -1;
    memcpy(&r, m->hres, sizeof r);
    return r == ~0ull ? -1 : (int64_t)r;
}

/* ===========================================================================
 * Matrix products: cuBLAS, row-major through the operand swap
 * ========================================================================= */

/* TF32 as the emulated device computes it: the operand rounded to 10
   mantissa bits, to nearest with ties away from zero (cvt.rna.tf32.f32);
   inf and NaN pass. (cuBLAS's kernels may truncate instead: either way an
   operand is within 2^-10 of itself, the products are summed in fp32.) */
static inline float dl__cu_tf32(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&v, &u, 4);
    return v;
}

/* host copy of an emulated operand, (batch) matrices of rows x cols at row
   stride ld and matrix stride st, rounded to TF32; tagged as the device's
   pointers are (dl__cpu_gemm takes the tag off). NULL: no host memory. */
static float *dl__cu_tf32_copy(dl__dev *d, const float *p, int64_t rows, int64_t cols, int64_t ld, int64_t st,
                               int64_t batch)
{
    int64_t span = (batch - 1) * st + (rows - 1) * ld + cols, i;
    const float *src = DL__CUP(d, p);
    float *c = (float *)DL_MALLOC(sizeof(float) * (size_t)span);
    if (!c) return NULL;
    for (i = 0; i < span; i++) c[i] = dl__cu_tf32(src[i]);
    return (float *)((uintptr_t)c + d->tag);
}

/* cuBLAS's math mode for the next call, set per call site (matrix products
   and convolutions share the handle, each with its own switch) and only
   when it changes: a setting of the handle on the host, no launch */
static bool dl__cu_blas_mode(dl__dev *d, bool tf32)
{
    dl__cuimpl *m = DL__CUI(d);
    if (m->blas_tf32 == (int)tf32) return true;
    if (!dl__cu_blas_ok(d, "cublasSetMathMode",
                        cublasSetMathMode(m->blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH))) {
        m->blas_tf32 = -1;
        return false;
    }
    m->blas_tf32 = (int)tf32;
    return true;
}

/* an emulated device's GEMM: the CPU's, on operands rounded to TF32 when
   tf32 (an emulated capture records it and runs it at each replay) */
static void dl__cu_gemm_emul(dl__dev *d, bool tf32, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                             const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB,
                             float beta, float *C, int64_t ldc, int64_t sC, int64_t batch)
{
    float *a = NULL, *b = NULL;
    if (tf32 && K > 0) {
        a = dl__cu_tf32_copy(d, A, ta ? K : M, ta ? M : K, lda, sA, batch);
        b = dl__cu_tf32_copy(d, B, tb ? N : K, tb ? K : N, ldb, sB, batch);
        if (!a || !b) {
            if (a) DL_FREE(DL__CUP(d, a));
            if (b) DL_FREE(DL__CUP(d, b));
            dl__dev_fail(d, "cuda:%d gemm: out of host memory for the emulated TF32 operands", d->id.index);
            return;
        }
    }
    dl__cpu_gemm(d, ta, tb, M, N, K, alpha, a ? a : A, lda, sA, b ? b : B, ldb, sB, beta, C, ldc, sC, batch);
    if (a) DL_FREE(DL__CUP(d, a));
    if (b) DL_FREE(DL__CUP(d, b));
}

struct dl__cuh_gemm {
    dl__dev *d; bool tf32, ta, tb; int64_t M, N, K; float alpha; const float *A; int64_t lda, sA;
    const float *B; int64_t ldb, sB; float beta; float *C; int64_t ldc, sC, batch;
    void operator()(int64_t) const
    {
        dl__cu_gemm_emul(d, tf32, ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch);
    }
};

/* C (M,N) = alpha op(A) op(B) + beta C in row-major is, column-major,
   C^T (N,M) = alpha op(B)^T op(A)^T + beta C^T: cuBLAS gets B first.
   tf32: TF32 tensor cores (the caller's switch), else exact fp32. */
static void dl__cu_gemm_at(dl__dev *d, bool tf32, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                           const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB,
                           float beta, float *C, int64_t ldc, int64_t sC, int64_t batch)
{
    dl__cuimpl *m = dl__cu_enter(d);
    cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st;
    if (M <= 0 || N <= 0 || batch <= 0) return;
    if (m->emulate) {
        dl__cuh_gemm f;
        f.d = d; f.tf32 = tf32; f.ta = ta; f.tb = tb; f.M = M; f.N = N; f.K = K; f.alpha = alpha; f.A = A;
        f.lda = lda; f.sA = sA; f.B = B; f.ldb = ldb; f.sB = sB; f.beta = beta; f.C = C; f.ldc = ldc;
        f.sC = sC; f.batch = batch;
        dl__cu_host(d, f);
        return;
    }
    A = DL__CUP(d, A);
    B = DL__CUP(d, B);
    C = DL__CUP(d, C);
    if (K <= 0) {   /* C = beta C (beta 0: zeros, whatever C held) */
        int64_t b;
        for (b = 0; b < batch; b++) {
            float *c = C + b * sC;
            int64_t i;
            for (i = 0; i < M; i++) {
                if (beta == 0.0f) dl__cu_memset(d, c + i * ldc, 0, sizeof(float) * (size_t)N);
                else if (beta != 1.0f) dl__cu_scale(d, c + i * ldc + d->tag, N, beta);
            }
        }
        return;
    }
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX ||
        batch > INT_MAX) {
        dl__dev_fail(d, "cuda:%d gemm: M=%lld N=%lld K=%lld (batch %lld) passes cuBLAS's 32-bit sizes",
                     d->id.index, (long long)M, (long long)N, (long long)K, (long long)batch);
        return;
    }
    if (!dl__cu_blas_mode(d, tf32)) return;
    if (batch == 1)
        st = cublasSgemm(m->blas, opB, opA, (int)N, (int)M, (int)K, &alpha, B, (int)ldb, A, (int)lda,
                         &beta, C, (int)ldc);
    else
        st = cublasSgemmStridedBatched(m->blas, opB, opA, (int)N, (int)M, (int)K, &alpha, B, (int)ldb,
                                       (long long)sB, A, (int)lda, (long long)sA, &beta, C, (int)ldc,
                                       (long long)sC, (int)batch);
    if (dl__cu_blas_ok(d, batch == 1 ? "cublasSgemm" : "cublasSgemmStridedBatched", st))
        dl__cu_launched(d, "gemm");
}

/* the backend's gemm: the matrix products (dl_matmul, dl_linear, ...), in
   their math mode (torch.backends.cuda.matmul.allow_tf32; default exact) */
static void dl__cu_gemm(dl__dev *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB,
                        float beta, float *C, int64_t ldc, int64_t sC, int64_t batch)
{
    dl__cu_gemm_at(d, DL__CUI(d)->tf32, ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch);
}

/* the convolutions' products, in theirs (torch.backends.cudnn.allow_tf32; default TF32) */
static void dl__cu_cgemm(dl__dev *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A,
                         int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB, float beta, float *C,
                         int64_t ldc, int64_t sC, int64_t batch)
{
    dl__cu_gemm_at(d, DL__CUI(d)->tf32_conv, ta, tb, M, N, K, 1.0f, A, lda, sA, B, ldb, sB, beta, C, ldc, sC,
                   batch);
}

/* the context's two TF32 switches (dl_set_allow_tf32, dl_set_allow_tf32_conv):
   read at each product; cuBLAS's mode follows at its next call */
static void dl__cuda_set_tf32(dl__dev *d, bool matmul, bool conv)
{
    dl__cuimpl *m;
    if (!d || d->id.type != DL_DEVICE_CUDA || !d->impl) return;
    m = DL__CUI(d);
    m->tf32 = matmul;
    m->tf32_conv = conv;
}

/* ===========================================================================
 * Softmax
 * ========================================================================= */

/* A line of at most this many: read into registers first, all in flight
   (an unrolled loop of constant indexes), then the same arithmetic from
   there. The loop below reads, compares and adds element by element, one
   trip to memory after another where nvcc cannot unroll a loop of unknown
   length around exp() (the class loss of 10 classes: 30 reads a thread,
   each waiting for the last). */
#define DL__CU_SMR 16

/* one (outer, inner) line of n, the CPU's loop exactly */
struct dl__cuf_softmax {
    bool log; float *y; const float *x; int64_t n, inner;
    /* the same, its n <= DL__CU_SMR values read first */
    DL__HD void regs(float *yp, const float *xp) const
    {
        float v[DL__CU_SMR], m = -INFINITY;
        double s = 0;
        int k;
        DL__CU_UNROLL
        for (k = 0; k < DL__CU_SMR; k++) v[k] = k < n ? xp[k * inner] : -INFINITY;
        DL__CU_UNROLL
        for (k = 0; k < DL__CU_SMR; k++) if (k < n && v[k] > m) m = v[k];
        if (m == -INFINITY) m = 0;
        DL__CU_UNROLL
        for (k = 0; k < DL__CU_SMR; k++) if (k < n) s = dl__cu_dadd(s, (double)dl__expf(v[k] - m));
        if (log) {
            float ls = (float)::log(s);
            DL__CU_UNROLL
            for (k = 0; k < DL__CU_SMR; k++) if (k < n) yp[k * inner] = dl__cu_fsub(dl__cu_fsub(v[k], m), ls);
        } else {
            float inv = (float)(1.0 / s);
            DL__CU_UNROLL
            for (k = 0; k < DL__CU_SMR; k++) if (k < n) yp[k * inner] = dl__cu_fmul(dl__expf(v[k] - m), inv);
        }
    }
    DL__HD void operator()(int64_t j) const
    {
        int64_t o = j / inner, i = j - o * inner, k;
        const float *xp = x + o * n * inner + i;
        float *yp = y + o * n * inner + i;
        float m = -INFINITY;
        double s = 0;
        if (n <= DL__CU_SMR) {
            regs(yp, xp);
            return;
        }
        for (k = 0; k < n; k++) if (xp[k * inner] > m) m = xp[k * inner];
        if (m == -INFINITY) m = 0;
        for (k = 0; k < n; k++) s = dl__cu_dadd(s, (double)dl__expf(xp[k * inner] - m));
        if (log) {
            float ls = (float)::log(s);
            for (k = 0; k < n; k++) yp[k * inner] = dl__cu_fsub(dl__cu_fsub(xp[k * inner], m), ls);
        } else {
            float inv = (float)(1.0 / s);
            for (k = 0; k < n; k++) yp[k * inner] = dl__cu_fmul(dl__expf(xp[k * inner] - m), inv);
        }
    }
};

/* contiguous rows (inner == 1): a group of G threads per row, the same
   arithmetic with the sum's tree fixed */
template <int G>
__global__ void __launch_bounds__(DL__CU_THREADS)
dl__cu_softmax_rows(bool log, float *y, const float *x, int64_t rows, int64_t n)
{
    DL__CU_PDL_ENTER();
    __shared__ double sh[9];
    const int gpb = DL__CU_THREADS / G, g = threadIdx.x / G, t = threadIdx.x % G;
    int64_t base;
    for (base = (int64_t)blockIdx.x * gpb; base < rows; base += (int64_t)gridDim.x * gpb) {
        int64_t row = base + g, k;
        bool ok = row < rows;
        const float *xp = x + (ok ? row : 0) * n;
        float *yp = y + (ok ? row : 0) * n;
        float m = -INFINITY;
        double s = 0;
        if (ok) for (k = t; k < n; k += G) if (xp[k] > m) m = xp[k];
        m = (float)dl__cu_group_all<DL__R_MAX, G>((double)m, sh);   /* never NaN: NaNs were skipped */
        if (m == -INFINITY) m = 0;
        if (ok) for (k = t; k < n; k += G) s = dl__cu_dadd(s, (double)dl__expf(xp[k] - m));
        s = dl__cu_group_all<DL__R_SUM, G>(s, sh);
        if (!ok) continue;
        if (log) {
            float ls = (float)::log(s);
            for (k = t; k < n; k += G) yp[k] = dl__cu_fsub(dl__cu_fsub(xp[k], m), ls);
        } else {
            float inv = (float)(1.0 / s);
            for (k = t; k < n; k += G) yp[k] = dl__cu_fmul(dl__expf(xp[k] - m), inv);
        }
    }
}

static void dl__cu_softmax(dl__dev *d, bool log, float *y, const float *x, int64_t outer, int64_t n,
                           int64_t inner)
{
    dl__cuimpl *m = dl__cu_enter(d);
    y = DL__CUP(d, y);
    x = DL__CUP(d, x);
    if (outer * inner <= 0 || n <= 0) return;
    if (inner > 1 || m->emulate || n <= 8) {
        dl__cuf_softmax f;
        f.log = log; f.y = y; f.x = x; f.n = n; f.inner = inner;
        dl__cu_run<int64_t>(d, "softmax", outer * inner, f);
        return;
    }
    if (n <= 1024)
        dl__cu_go(m, dl__cu_softmax_rows<32>, dl__cu_grid(m, outer, DL__CU_THREADS / 32), DL__CU_THREADS, 0, log, y,
                  x, outer, n);
    else
        dl__cu_go(m, dl__cu_softmax_rows<256>, dl__cu_grid(m, outer, 1), DL__CU_THREADS, 0, log, y, x, outer, n);
    dl__cu_launched(d, "softmax rows");
}

/* ===========================================================================
 * Losses and dropout
 * ========================================================================= */

/* valid (outer*inner) and the first bad target (atomicMin) */
struct dl__cuf_cm_valid {
    float *valid; const int64_t *t64; const int32_t *t32; int64_t C, ignore; unsigned long long *res;
    DL__HD void operator()(int64_t j) const
    {
        int64_t t = t64 ? t64[j] : (int64_t)t32[j];
        if (t == ignore) { valid[j] = 0.0f; return; }
        if (t < 0 || t >= C) { valid[j] = 0.0f; if (res) dl__cu_min_index(res, j); return; }
        valid[j] = 1.0f;
    }
};

/* onehot (outer, C, inner): 1 where the target names the class; the
   element of class 0 also writes its sample's valid (one launch for both) */
struct dl__cuf_cm_onehot {
    float *onehot; dl__cuf_cm_valid v; int64_t inner;
    DL__HD void operator()(int64_t e) const
    {
        int64_t i = e % inner, q = e / inner, c = q % v.C, o = q / v.C, j = o * inner + i;
        int64_t t = v.t64 ? v.t64[j] : (int64_t)v.t32[j];
        onehot[e] = (t != v.ignore && t == c) ? 1.0f : 0.0f;
        if (c == 0) v(j);
    }
};

/* after a kernel that wrote the first bad target's index to m->dres (or
   ~0): -1, or that index with the target's value in *bad (waits) */
static int64_t dl__cu_bad_target(dl__dev *d, const int64_t *t64, const int32_t *t32, int64_t *bad, const char *what)
{
    dl__cuimpl *m = DL__CUI(d);
    unsigned long long r;
    if (!dl__cu_get(d, m->hres, m->dres, sizeof r, what)) return -1;
    memcpy(&r, m->hres, sizeof r);
    if (r == ~0ull) return -1;
    if (t64) {
        if (!dl__cu_get(d, bad, t64 + r, sizeof(int64_t), what)) return -1;
    } else {
        int32_t v = 0;
        if (!dl__cu_get(d, &v, t32 + r, sizeof v, what)) return -1;
        *bad = v;
    }
    return (int64_t)r;
}

static int64_t dl__cu_class_mask(dl__dev *d, float *onehot, float *valid, const void *target, bool i64,
                                 int64_t outer, int64_t C, int64_t inner, int64_t ignore_index, int64_t *bad)
{
    dl__cuimpl *m = dl__cu_enter(d);
    dl__cuf_cm_valid fv;
    dl__cuf_cm_onehot fo;
    const int64_t *t64 = i64 ? (const int64_t *)DL__CUP(d, target) : NULL;
    const int32_t *t32 = i64 ? NULL : (const int32_t *)DL__CUP(d, target);
    if (outer <= 0 || inner <= 0) return -1;
    /* a graph cannot stop for a bad target (PyTorch's graphs do not either):
       inside a capture the check is skipped (no result slot to reset, none
       written), and a target out of range counts as ignore_index (valid 0,
       a zero one-hot row) */
    if (!m->cap) dl__cu_memset(d, m->dres, 0xff, sizeof(unsigned long long));
    fv.valid = DL__CUP(d, valid); fv.t64 = t64; fv.t32 = t32; fv.C = C; fv.ignore = ignore_index;
    fv.res = m->cap ? NULL : (unsigned long long *)m->dres;
    if (C > 0) {
        fo.onehot = DL__CUP(d, onehot); fo.v = fv; fo.inner = inner;
        dl__cu_run<int64_t>(d, "class_mask", outer * C * inner, fo);
    } else {
        dl__cu_run<int64_t>(d, "class_mask", outer * inner, fv);
    }
    if (m->cap) return -1;
    return dl__cu_bad_target(d, t64, t32, bad, "class_mask");
}

/* ---- class-index losses in one pass each way (dl__backend.class_loss) ----
   Forward: T partial sums, thread t over the positions t, t+T, ... (nll,
   smoothing and the mean's weights in double, and its first bad target),
   then one thread adds them in order and writes the loss: two launches,
   the same order on every GPU and emulated. T depends on the size only.
   From logits (cross entropy), the thread first writes its positions' log
   softmax (up to DL__CU_CLS_LSM logits a thread; above, the softmax launch). */
static int64_t dl__cu_cls_T(int64_t P) { return P <= 256 ? P : P / 64 < 256 ? 256 : P / 64 > 2048 ? 2048 : P / 64; }

static DL__HD inline int64_t dl__cu_cls_target(const dl__clsargs &a, int64_t j)
{
    return a.i64 ? ((const int64_t *)a.t)[j] : (int64_t)((const int32_t *)a.t)[j];
}

struct dl__cuf_clspart {
    dl__clsargs a; float *loss; double *part; unsigned long long *first; int64_t P, T;
    bool lsm;   /* position j's log_softmax first (a.x into a.lpw: the softmax kernel's line j) */
    DL__HD void operator()(int64_t t) const
    {
        double sn = 0.0, ss = 0.0, sd = 0.0;
        unsigned long long bad = ~0ull;
        int64_t j, k;
        for (j = t; j < P; j += T) {
            int64_t o = j / a.inner, i = j - o * a.inner, c = dl__cu_cls_target(a, j);
            if (lsm) {
                dl__cuf_softmax sf;
                sf.log = true; sf.y = a.lpw; sf.x = a.x; sf.n = a.C; sf.inner = a.inner;
                sf(j);
            }
            const float *row = a.lp + o * a.C * a.inner + i;
            float nll = 0.0f, sm = 0.0f;
            bool v = c != a.ignore;
            if (v && (c < 0 || c >= a.C)) {
                if (bad == ~0ull) bad = (unsigned long long)j;
                v = false;
            }
            if (v) {
                float wc = a.w ? a.w[c] : 1.0f;
                nll = -dl__cu_fmul(wc, row[c * a.inner]);
                sd += (double)wc;
                if (a.e != 0.0f) {
                    double r = 0.0;
                    for (k = 0; k < a.C; k++) r += (double)(a.w ? dl__cu_fmul(a.w[k], row[k * a.inner]) : row[k * a.inner]);
                    sm = -(float)r;
                }
            }
            if (a.red == DL_REDUCTION_NONE)
                loss[j] = a.e != 0.0f ? dl__cu_fadd(dl__cu_fmul(a.e1, nll), dl__cu_fmul(a.eC, sm)) : nll;
            sn += (double)nll;
            ss += (double)sm;
        }
        part[3 * t] = sn;
        part[3 * t + 1] = ss;
        part[3 * t + 2] = sd;
        first[t] = bad;
    }
};

struct dl__cu_clsp { double n, s, d; unsigned long long f; };   /* a partial of dl__cuf_clspart */
/* partial k, written by other blocks of the launch (dl__cu_ldcg) */
static DL__HD inline dl__cu_clsp dl__cu_clsp_ld(const double *part, const unsigned long long *first, int64_t k)
{
    dl__cu_clsp v;
    v.f = dl__cu_ldcg(first + k);
    v.n = dl__cu_ldcg(part + 3 * k);
    v.s = dl__cu_ldcg(part + 3 * k + 1);
    v.d = dl__cu_ldcg(part + 3 * k + 2);
    return v;
}
struct dl__cuf_clsfin {
    dl__clsargs a; float *loss, *den; const double *part; const unsigned long long *first;
    unsigned long long *res; int64_t T;
    const dl__cu_clsp *st;   /* the partials staged in shared memory (dl__cu_cls_k), or NULL */
    DL__HD void operator()(int64_t) const
    {
        double sn = 0.0, ss = 0.0, sd = 0.0, sw = 0.0;
        unsigned long long bad = ~0ull;
        float fn, fs;
        int64_t t;
        /* (written by other blocks of the launch: dl__cu_run_fin) */
        dl__cu_inorder<8>(T, [&](int64_t k) { return st ? st[k] : dl__cu_clsp_ld(part, first, k); },
                          [&](int64_t, const dl__cu_clsp &v) {
                              sn += v.n;
                              ss += v.s;
                              sd += v.d;
                              if (v.f < bad) bad = v.f;
                          });
        if (res) *res = bad;
        if (a.e != 0.0f && a.w)
            for (t = 0; t < a.C; t++) sw += (double)a.w[t];
        else sw = (double)a.C;
        den[0] = (float)sd;
        den[1] = (float)sw;
        if (a.red == DL_REDUCTION_NONE) return;
        fn = (float)sn;
        fs = (float)ss;
        if (a.red == DL_REDUCTION_MEAN) {
            fn = dl__cu_fdiv(fn, den[0]);
            fs = dl__cu_fdiv(fs, den[0]);
        }
        loss[0] = a.e != 0.0f ? dl__cu_fadd(dl__cu_fmul(a.e1, fn), dl__cu_fmul(a.eC, fs)) : fn;
    }
};

/* Backward: a thread per element of dx, the row's sum of dlp in closed form */
struct dl__cuf_clsbwd {
    dl__clsargs a; float *dx; const float *g, *den;
    DL__HD void operator()(int64_t el) const { dx[el] = val(el); }
    DL__HD float val(int64_t el) const
    {
        int64_t q = el / a.inner, i = el - q * a.inner, c = q % a.C, o = q / a.C;
        int64_t j = o * a.inner + i, ct = dl__cu_cls_target(a, j);
        bool v = ct != a.ignore && ct >= 0 && ct < a.C;
        float gj = !g ? 1.0f : a.red == DL_REDUCTION_NONE ? g[j] : g[0];   /* NULL: the implied seed */
        float s = a.red == DL_REDUCTION_MEAN ? dl__cu_fdiv(gj, den[0]) : gj;
        float s1 = a.e != 0.0f ? dl__cu_fmul(a.e1, s) : s, s2 = dl__cu_fmul(a.eC, s), r = 0.0f;
        if (v) {
            float wc = a.w ? a.w[c] : 1.0f;
            r = c == ct ? dl__cu_fmul(s1, wc) : 0.0f;
            if (a.e != 0.0f) r = dl__cu_fadd(r, dl__cu_fmul(s2, wc));
        }
        r = -r;
        if (a.logits) {
            float S = 0.0f;
            if (v) {
                S = dl__cu_fmul(s1, a.w ? a.w[ct] : 1.0f);
                if (a.e != 0.0f) S = dl__cu_fadd(S, dl__cu_fmul(s2, den[1]));
                S = -S;
            }
            r = dl__cu_fsub(r, dl__cu_fmul(dl__expf(a.lp[el]), S));   /* (dl.h's exp: the CPU's bits) */
        }
        return r;
    }
};

/* dl__cu_colsum's rd for a backward that makes a gradient dx (rows, C)
   element by element (f.val(e): the class loss's, batch norm's over (N,
   C)) with the bias gradient of the Linear that made its input: column c,
   row k, written, and added */
template <typename I, typename F>
struct dl__cur_el {
    typedef float raw;
    F f; I C;
    DL__HD float get(I c, I k) const { return f.val(k * C + c); }
    DL__HD float put(I c, I k, float v) const
    {
        f.dx[k * C + c] = v;
        return v;
    }
};

/* The class loss's launch on a real GPU while its T partials fit in
   shared memory: dl__cu_each_fin's, except that the last block first reads
   every partial into shared memory (a thread each, all in flight at once),
   then its thread 0 adds them in order (dl__cuf_clsfin reading that copy):
   the same adds in the same order, one wait for the reads where the
   thread's own 8 at a time made 32 (on an H200 under ncu, the MLP's loss
   launch took 23.5 us that way and 16.7 this way; PyTorch's softmax and
   nll_loss 13). */
#define DL__CU_CLS_ST 1024
__global__ void __launch_bounds__(DL__CU_THREADS) dl__cu_cls_k(int64_t n, dl__cuf_clspart f, dl__cuf_clsfin fin,
                                                               unsigned *ticket)
{
    DL__CU_PDL_ENTER();
    __shared__ dl__cu_clsp st[DL__CU_CLS_ST];
    int64_t stride = (int64_t)blockDim.x * (int64_t)gridDim.x, i, k;
    for (i = (int64_t)blockIdx.x * (int64_t)blockDim.x + (int64_t)threadIdx.x; i < n; i += stride) f(i);
    if (!dl__cu_last_block(ticket)) return;
    for (k = (int64_t)threadIdx.x; k < fin.T; k += DL__CU_THREADS) st[k] = dl__cu_clsp_ld(fin.part, fin.first, k);
    __syncthreads();
    if (threadIdx.x == 0) {
        fin.st = st;
        fin(0);
    }
}

/* a's pointers as the device's */
static dl__clsargs dl__cu_cls_dev(dl__dev *d, const dl__clsargs *a)
{
    dl__clsargs r = *a;
    r.x = a->x ? DL__CUP(d, a->x) : NULL;
    r.lpw = a->lpw ? DL__CUP(d, a->lpw) : NULL;
    r.lp = DL__CUP(d, a->lp);
    r.t = DL__CUP(d, a->t);
    r.w = a->w ? DL__CUP(d, a->w) : NULL;
    return r;
}

/* the logits' log_softmax in the partials' threads (a line each, the
   softmax kernel's arithmetic) while a thread's lines hold at most this
   many logits (a few microseconds of loops: the small nets' steps, one
   line a thread); above, the softmax entry's launch first, a thread or a
   warp per line */
#ifndef DL__CU_CLS_LSM
#define DL__CU_CLS_LSM 128
#endif

static int64_t dl__cu_class_loss(dl__dev *d, float *loss, float *den, const dl__clsargs *a, int64_t *bad)
{
    dl__cuimpl *m = dl__cu_enter(d);
    int64_t P = a->outer * a->inner, T = dl__cu_cls_T(P);
    dl__cuf_clspart fp;
    dl__cuf_clsfin ff;
    double *part = NULL;
    fp.a = ff.a = dl__cu_cls_dev(d, a);
    fp.lsm = a->x && a->C > 0 && T > 0 && (P + T - 1) / T * a->C <= DL__CU_CLS_LSM;
    if (a->x && !fp.lsm && P > 0 && a->C > 0) dl__cu_softmax(d, true, a->lpw, a->x, a->outer, a->C, a->inner);
    if (T > 0) {
        part = (double *)dl__cu_scratch(d, (sizeof(double) * 3 + sizeof(unsigned long long)) * (size_t)T);
        if (!part) return -1;
        fp.loss = DL__CUP(d, loss); fp.part = part; fp.first = (unsigned long long *)(part + 3 * T);
        fp.P = P; fp.T = T;
    }
    ff.loss = DL__CUP(d, loss); ff.den = DL__CUP(d, den); ff.part = part;
    ff.first = part ? (const unsigned long long *)(part + 3 * T) : NULL;
    ff.res = m->cap ? NULL : (unsigned long long *)m->dres;   /* a graph cannot stop for a bad target */
    ff.T = T;
    ff.st = NULL;
    if (!m->emulate && T > 0 && T <= DL__CU_CLS_ST) {   /* the same, the last block's reads staged */
        dl__cu_go(m, dl__cu_cls_k, dl__cu_grid(m, T, DL__CU_THREADS), DL__CU_THREADS, 0, T, fp, ff, m->ticket);
        dl__cu_launched(d, "class loss");
    } else {
        dl__cu_run_fin<int64_t>(d, "class loss", T, fp, 1, ff);   /* the partials, then their sum: one launch */
    }
    if (m->cap) return -1;
    return dl__cu_bad_target(d, a->i64 ? (const int64_t *)fp.a.t : NULL, a->i64 ? NULL : (const int32_t *)fp.a.t,
                             bad, "class loss");
}

/* with db (dl__cu_colsum_fused's sizes), dx's column sums in the same
   launch: the staged column sum, reading dx's elements as it writes them */
static void dl__cu_class_loss_bwd(dl__dev *d, float *dx, float *db, const float *g, const float *den,
                                  const dl__clsargs *a)
{
    dl__cuf_clsbwd f;
    dl__cu_enter(d);
    f.a = dl__cu_cls_dev(d, a);
    f.dx = DL__CUP(d, dx); f.g = g ? DL__CUP(d, g) : NULL; f.den = DL__CUP(d, den);
    if (!db) {
        dl__cu_run<int64_t>(d, "class loss backward", a->outer * a->C * a->inner, f);
    } else if (dl__cu_small(a->outer * a->C)) {
        dl__cur_el<int32_t, dl__cuf_clsbwd> rd;
        rd.f = f; rd.C = (int32_t)a->C;
        dl__cu_colsum_go<int32_t>(d, "class loss backward", (int32_t)a->C, (int32_t)a->outer, rd, DL__CUP(d, db));
    } else {
        dl__cur_el<int64_t, dl__cuf_clsbwd> rd;
        rd.f = f; rd.C = a->C;
        dl__cu_colsum_go<int64_t>(d, "class loss backward", a->C, a->outer, rd, DL__CUP(d, db));
    }
}

struct dl__cuf_dropout {
    float *mask; float p, scale; uint64_t seed, offset; const uint64_t *live;
    DL__HD void operator()(int64_t i) const
    {
        uint64_t sd, of;
        dl__cu_draw(live, seed, offset, &sd, &of);
        mask[i] = dl__rng_uniform01(sd, of + (uint64_t)i) < p ? 0.0f : scale;
    }
};

static void dl__cu_dropout_mask(dl__dev *d, float *mask, int64_t n, float p, float scale, uint64_t seed,
                                uint64_t offset)
{
    dl__cuf_dropout f;
    dl__cu_enter(d);
    f.live = dl__cu_live(d, seed, &offset);
    f.mask = DL__CUP(d, mask); f.p = p; f.scale = scale; f.seed = seed; f.offset = offset;
    dl__cu_run<int64_t>(d, "dropout_mask", n, f);
}

struct dl__cuf_bce {
    float *out; const float *x, *y;
    DL__HD void operator()(int64_t i) const
    {
        out[i] = dl__bce_logitsf(x[i], y[i]);
    }
};

static void dl__cu_bce_logits(dl__dev *d, float *out, const float *x, const float *y, int64_t n)
{
    dl__cuf_bce f;
    dl__cu_enter(d);
    f.out = DL__CUP(d, out); f.x = DL__CUP(d, x); f.y = DL__CUP(d, y);
    dl__cu_run<int64_t>(d, "bce_logits", n, f);
}

/* ===========================================================================
 * Convolution: im2col, col2im, bias
 * ========================================================================= */

/* col (Ca*K, n, Lb): element e = ((c*K + kk)*n + s)*Lb + pos <- x (n, Ca, ia...) */
template <typename I>
static DL__HD inline float dl__cu_i2c_at(const float *x, I n, const dl__cgeom &g, I e)
{
    I Lb = (I)g.Lb, K = (I)g.K, ib1 = (I)g.ib[1], ib2 = (I)g.ib[2], k1 = (I)g.k[1], k2 = (I)g.k[2];
    I row = e / Lb, pos = e - row * Lb, s = row % n, q = row / n, c = q / K, kk = q - c * K;
    I o2 = pos % ib2, o1 = (pos / ib2) % ib1, o0 = pos / (ib2 * ib1);
    I q2 = kk % k2, q1 = (kk / k2) % k1, q0 = kk / (k2 * k1);
    I j0 = o0 * (I)g.s[0] + q0 * (I)g.d[0] - (I)g.p[0];
    I j1 = o1 * (I)g.s[1] + q1 * (I)g.d[1] - (I)g.p[1];
    I j2 = o2 * (I)g.s[2] + q2 * (I)g.d[2] - (I)g.p[2];
    if (j0 >= 0 && j0 < (I)g.ia[0] && j1 >= 0 && j1 < (I)g.ia[1] && j2 >= 0 && j2 < (I)g.ia[2])
        return x[(s * (I)g.Ca + c) * (I)g.La + (j0 * (I)g.ia[1] + j1) * (I)g.ia[2] + j2];
    return 0.0f;
}

template <typename I>
struct dl__cuf_im2col {
    float *col; const float *x; I n; dl__cgeom g;
    DL__HD void operator()(I e) const { col[e] = dl__cu_i2c_at<I>(x, n, g, e); }
};

static void dl__cu_im2col(dl__dev *d, float *col, const float *x, int64_t n, const dl__cgeom *g)
{
    int64_t total = g->Ca * g->K * n * g->Lb;
    dl__cu_enter(d);
    col = DL__CUP(d, col);
    x = DL__CUP(d, x);
    if (dl__cu_small(total) && dl__cu_small(n * g->Ca * g->La)) {
        dl__cuf_im2col<int32_t> f;
        f.col = col; f.x = x; f.n = (int32_t)n; f.g = *g;
        dl__cu_run<int32_t>(d, "im2col", total, f);
    } else {
        dl__cuf_im2col<int64_t> f;
        f.col = col; f.x = x; f.n = n; f.g = *g;
        dl__cu_run<int64_t>(d, "im2col", total, f);
    }
}

/* the output o = t / s that tap offset t reaches (t = j + pad - kk dil):
   false where t is negative, s does not divide it, or o >= n */
template <typename I>
static DL__HD inline bool dl__cu_tap(I t, I s, I n, I *o)
{
    if (t < 0 || t % s) return false;
    *o = t / s;
    return *o < n;
}

/* x (n, Ca, ia...) element e = sum over the kernel offsets kk (in order, as
   the CPU adds them) of the col entries that cover it: a gather, no atomics */
template <typename I>
struct dl__cuf_col2im {
    float *x; const float *col; I n; dl__cgeom g;
    DL__HD void operator()(I e) const
    {
        I La = (I)g.La, K = (I)g.K, Ca = (I)g.Ca, Lb = (I)g.Lb;
        I ia1 = (I)g.ia[1], ia2 = (I)g.ia[2], k1 = (I)g.k[1], k2 = (I)g.k[2];
        I plane = e / La, pos = e - plane * La, s = plane / Ca, c = plane - s * Ca;
        I j2 = pos % ia2, j1 = (pos / ia2) % ia1, j0 = pos / (ia2 * ia1), kk;
        float acc = 0.0f;
        for (kk = 0; kk < K; kk++) {
            I q2 = kk % k2, q1 = (kk / k2) % k1, q0 = kk / (k2 * k1);
            I o0, o1, o2;
            if (!dl__cu_tap<I>(j0 + (I)g.p[0] - q0 * (I)g.d[0], (I)g.s[0], (I)g.ib[0], &o0) ||
                !dl__cu_tap<I>(j1 + (I)g.p[1] - q1 * (I)g.d[1], (I)g.s[1], (I)g.ib[1], &o1) ||
                !dl__cu_tap<I>(j2 + (I)g.p[2] - q2 * (I)g.d[2], (I)g.s[2], (I)g.ib[2], &o2))
                continue;
            acc = dl__cu_fadd(acc, col[((c * K + kk) * n + s) * Lb + (o0 * (I)g.ib[1] + o1) * (I)g.ib[2] + o2]);
        }
        x[e] = acc;
    }
};

static void dl__cu_col2im(dl__dev *d, float *x, const float *col, int64_t n, const dl__cgeom *g)
{
    int64_t total = n * g->Ca * g->La;
    dl__cu_enter(d);
    x = DL__CUP(d, x);
    col = DL__CUP(d, col);
    if (dl__cu_small(total) && dl__cu_small(g->Ca * g->K * n * g->Lb)) {
        dl__cuf_col2im<int32_t> f;
        f.x = x; f.col = col; f.n = (int32_t)n; f.g = *g;
        dl__cu_run<int32_t>(d, "col2im", total, f);
    } else {
        dl__cuf_col2im<int64_t> f;
        f.x = x; f.col = col; f.n = n; f.g = *g;
        dl__cu_run<int64_t>(d, "col2im", total, f);
    }
}

template <typename I>
struct dl__cuf_bias {
    float *y; const float *b; I C, L;
    DL__HD void operator()(I e) const { y[e] = dl__cu_fadd(y[e], b[(e / L) % C]); }
};

static void dl__cu_bias_add(dl__dev *d, float *y, const float *b, int64_t n, int64_t C, int64_t L)
{
    int64_t total = n * C * L;
    dl__cu_enter(d);
    y = DL__CUP(d, y);
    b = DL__CUP(d, b);
    if (L <= 0 || C <= 0) return;
    if (dl__cu_small(total)) {
        dl__cuf_bias<int32_t> f;
        f.y = y; f.b = b; f.C = (int32_t)C; f.L = (int32_t)L;
        dl__cu_run<int32_t>(d, "bias_add", total, f);
    } else {
        dl__cuf_bias<int64_t> f;
        f.y = y; f.b = b; f.C = C; f.L = L;
        dl__cu_run<int64_t>(d, "bias_add", total, f);
    }
}

/* ---- Convolution through cuBLAS, chunks of samples, no layout copies.

   Shapes (dl__cgeom): x (n, Ca, ia...), y (n, Cb, ib...), w (Cb, Ca, k...);
   CaK = Ca K rows of im2col's matrix, col (CaK, cnt, Lb) for a chunk of
   cnt samples: sample s's Lb columns start at col + s Lb, rows cnt Lb
   apart. A strided-batched GEMM with a sample per batch entry then reads
   or writes each sample's block of x, y and col where it lies, so no pass
   reorders (Cb, n, Lb) into (n, Cb, Lb) or back, and the scratch is one
   chunk's (under DL__CU_I2C_FLOATS floats, or one sample), never the
   batch's. Every conv product runs in the convolutions' math mode
   (dl__cu_cgemm: TF32 unless dl_set_allow_tf32_conv(ctx, false)).

   Launches and bytes per chunk (floats; CaK Lb per sample is im2col's
   matrix, the largest term):
     forward  im2col, GEMM into y, (bias once)     writes CaK Lb, reads it
     dx       GEMM into col, col2im gather         writes CaK Lb, reads it
     dw       see dl__cu_conv_i2c_wgrad
   1x1 convolutions (stride 1, no padding: x_s (Ca, L) is im2col's matrix
   itself) skip im2col and col2im: forward and dx are one strided-batched
   GEMM over all n samples, no scratch.

   Declines groups (dl.h's whole-batch path does them, in exact fp32), a
   sample's matrices past cuBLAS's 32-bit sizes, and no memory for even one
   sample's scratch (the caller's path then reports it). */
#ifndef DL__CU_I2C_FLOATS
#define DL__CU_I2C_FLOATS ((int64_t)1 << 24)
#endif

/* the geometry within cuBLAS's int sizes and 64-bit offsets with margin */
static bool dl__cu_conv_ok(const dl__cgeom *g, int64_t n)
{
    int64_t caK = g->Ca * g->K;
    return g->G == 1 && n > 0 && n <= INT_MAX && g->Ca > 0 && g->Cb > 0 && g->Lb > 0 && g->La > 0 && caK > 0 &&
           caK <= INT_MAX && g->Cb <= INT_MAX && g->Lb <= INT_MAX && g->La <= INT_MAX &&
           caK <= (INT64_MAX / 16) / g->Lb && g->Cb <= (INT64_MAX / 16) / (caK + g->Lb) &&
           g->Ca <= (INT64_MAX / 16) / g->La;
}

/* kernel 1, stride 1, no padding (dilation is moot): a product per sample */
static bool dl__cu_pointwise(const dl__cgeom *g)
{
    int i;
    if (g->K != 1) return false;
    for (i = 0; i < 3; i++)   /* (a transposed conv's output_padding makes ia > ib: not pointwise) */
        if (g->s[i] != 1 || g->p[i] != 0 || g->ia[i] != g->ib[i]) return false;
    return true;
}

/* Step-memory scratch of `per` floats a sample for *nb samples: nb under
   DL__CU_I2C_FLOATS floats (at least one sample) and nb Lb within cuBLAS's
   int, halved while the memory is not there (a memory_limit, a full GPU).
   NULL: not even one sample's. The caller rewinds the arena. */
static float *dl__cu_chunks(dl__dev *d, int64_t per, int64_t n, int64_t Lb, int64_t *nb)
{
    int64_t b = DL__CU_I2C_FLOATS / per;
    float *p;
    if (b > n) b = n;
    if (b > INT_MAX / Lb) b = INT_MAX / Lb;
    if (b < 1) b = 1;
    while (!(p = (float *)dl__arena_alloc(d->ctx, &d->data, sizeof(float) * (size_t)(b * per), true)) && b > 1)
        b = (b + 1) / 2;
    if (p) dl__track_peak(d);
    *nb = b;
    return p;
}

/* DL_CUDNN=1 (the default) gives cuDNN the convolutions with at least this
   many input and output channels: there its implicit GEMMs on tensor cores
   win (a ResNet's 3x3s: 4x the cuBLAS path's time on the H200); LeNet's
   1->6 and 6->16 are faster through im2col and cuBLAS (step_lenet 0.41x
   PyTorch that way, 0.65x through cuDNN in TF32) and skip loading cuDNN's
   engines at start-up (1.4 s of make run DEVICE=cuda). DL_CUDNN=2: every
   conv cuDNN takes (the tests' way to cover it); DL_CUDNN=0: none. */
#ifndef DL__DNN_MIN_C
#define DL__DNN_MIN_C 16
#endif

#ifdef DL_CUDNN
/* cuDNN's convolutions (-DDL_CUDNN, link -lcudnn; the Makefile adds both
   where it finds cudnn.h), as PyTorch's: conv_i2c, convT_i2c and
   conv_i2c_wgrad below hand a real GPU's convolution (groups 1, DL_CUDNN's
   channel rule) to cudnnConvolutionForward / BackwardData / BackwardFilter,
   and take their cuBLAS path where cuDNN declines (an emulated device never
   calls it). A plan per (direction, batch, geometry, math mode) keeps the
   descriptors and the algorithm: the first of cuDNN's heuristic list
   (cudnnGet*Algorithm_v7, PyTorch's way with cudnn.benchmark off) that is
   deterministic, so a run, a replay and the next run give the same bits.
   Exact fp32 (dl_set_allow_tf32_conv(ctx, false)) sets CUDNN_FMA_MATH and
   takes only plain-sum algorithms (implicit GEMM and the like, no FFT or
   Winograd), so its results stay within fp32 rounding of the CPU's. The
   workspace comes from step memory, as im2col's chunks; the handle is made
   at the first convolution outside a capture (cudnnCreate synchronizes).
   DL_CUDNN_CHECK=1 runs each call's twin by dl.h's own kernels too and
   prints both's largest difference (docs/cuda.md). */
enum { DL__DNN_FWD, DL__DNN_DATA, DL__DNN_FILTER };

typedef struct dl__dnn_plan {
    int kind;
    bool tf32, ok;                    /* ok false: cuDNN declined this one */
    int64_t n;
    dl__cgeom g;
    cudnnTensorDescriptor_t a, b;     /* x (n, Ca, ia...), y (n, Cb, ib...) */
    cudnnFilterDescriptor_t w;        /* (Cb, Ca, k...) */
    cudnnConvolutionDescriptor_t conv;
    int algo;
    size_t ws;
} dl__dnn_plan;

static void dl__dnn_plan_free(dl__dnn_plan *p)
{
    if (p->a) (void)cudnnDestroyTensorDescriptor(p->a);
    if (p->b) (void)cudnnDestroyTensorDescriptor(p->b);
    if (p->w) (void)cudnnDestroyFilterDescriptor(p->w);
    if (p->conv) (void)cudnnDestroyConvolutionDescriptor(p->conv);
}

static void dl__dnn_teardown(dl__cuimpl *m)
{
    size_t i;
    for (i = 0; i < m->nplans; i++) dl__dnn_plan_free(&m->plans[i]);
    DL_FREE(m->plans);
    m->plans = NULL;
    m->nplans = m->capplans = 0;
    if (m->dnn) (void)cudnnDestroy(m->dnn);
    m->dnn = NULL;
}

static bool dl__dnn_same(const dl__dnn_plan *p, int kind, bool tf32, int64_t n, const dl__cgeom *g)
{
    int i;
    if (p->kind != kind || p->tf32 != tf32 || p->n != n || p->g.nsp != g->nsp || p->g.Ca != g->Ca ||
        p->g.Cb != g->Cb || p->g.G != g->G)
        return false;
    for (i = 0; i < 3; i++)   /* all 3 slots: the real dims are the last nsp */
        if (p->g.ia[i] != g->ia[i] || p->g.ib[i] != g->ib[i] || p->g.k[i] != g->k[i] || p->g.s[i] != g->s[i] ||
            p->g.p[i] != g->p[i] || p->g.d[i] != g->d[i])
            return false;
    return true;
}

/* packed (n, c, sp...) descriptor of nd dims: dl__cgeom keeps its real
   spatial dims last of 3 slots, padded by 1s in front, so the nd - 2 used
   here are the last slots (a 1-d conv is (n, c, 1, L)) */
static bool dl__dnn_tensor(cudnnTensorDescriptor_t t, int nd, int64_t n, int64_t c, const int64_t *sp)
{
    int dim[5], str[5], i;
    dim[0] = (int)n; dim[1] = (int)c;
    for (i = 0; i < nd - 2; i++) dim[2 + i] = (int)sp[5 - nd + i];
    str[nd - 1] = 1;
    for (i = nd - 2; i >= 0; i--) str[i] = str[i + 1] * dim[i + 1];
    return cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, nd, dim, str) == CUDNN_STATUS_SUCCESS;
}

/* The algorithms that sum plainly (implicit GEMM and the like; not FFT or
   Winograd, whose transforms round otherwise than the CPU's sums), a bit
   per cuDNN algorithm number of each direction */
#define DL__DNN_PLAIN_FWD (1u << CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM | \
                           1u << CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM | \
                           1u << CUDNN_CONVOLUTION_FWD_ALGO_GEMM | 1u << CUDNN_CONVOLUTION_FWD_ALGO_DIRECT)
#define DL__DNN_PLAIN_DATA (1u << CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 | 1u << CUDNN_CONVOLUTION_BWD_DATA_ALGO_1)
#define DL__DNN_PLAIN_FILTER (1u << CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 | \
                              1u << CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 | 1u << CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3)

/* p's algorithm: the first of cuDNN's list (r, cnt, best first) that is
   deterministic, and in exact fp32 also of FMA math and summing plainly */
template <typename P>
static void dl__dnn_pick(dl__dnn_plan *p, const P *r, int cnt, unsigned plain)
{
    int i;
    for (i = 0; i < cnt; i++) {
        bool ok = r[i].status == CUDNN_STATUS_SUCCESS && r[i].determinism == CUDNN_DETERMINISTIC &&
                  (p->tf32 || ((r[i].mathType == CUDNN_DEFAULT_MATH || r[i].mathType == CUDNN_FMA_MATH) &&
                                ((plain >> (int)r[i].algo) & 1u)));
        if (ok) {
            p->algo = (int)r[i].algo;
            p->ws = r[i].memory;
            if (p->tf32) (void)cudnnSetConvolutionMathType(p->conv, r[i].mathType);
            return;
        }
    }
}

/* the plan of one convolution: made at its first call, NULL where cuDNN
   does not take it (asymmetric padding, a size past its ints, no handle) */
static dl__dnn_plan *dl__dnn_get(dl__dev *d, int kind, int64_t n, const dl__cgeom *g)
{
    dl__cuimpl *m = DL__CUI(d);
    bool tf32 = m->tf32_conv;
    int nd = (g->nsp < 2 ? 2 : g->nsp) + 2, i, cnt = 0, pad[3], str[3], dil[3], wd[5], out[5];
    dl__dnn_plan *p;
    size_t k;
    for (k = 0; k < m->nplans; k++)
        if (dl__dnn_same(&m->plans[k], kind, tf32, n, g)) return m->plans[k].ok ? &m->plans[k] : NULL;
    if (!m->dnn) {
        if (m->cap) return NULL;   /* not made inside a capture: cudnnCreate synchronizes */
        if (m->dnn_check)
            fprintf(stderr, "cuDNN check: library %zu (header %d), its CUDA runtime %zu\n", cudnnGetVersion(),
                    CUDNN_VERSION, cudnnGetCudartVersion());
        if (cudnnCreate(&m->dnn) != CUDNN_STATUS_SUCCESS || cudnnSetStream(m->dnn, m->stream) != CUDNN_STATUS_SUCCESS) {
            if (m->dnn) (void)cudnnDestroy(m->dnn);
            m->dnn = NULL;
            m->dnn_mode = 0;   /* the cuBLAS path from then on */
            (void)cudaGetLastError();
            dl__warn(d->ctx, "cuda:%d: cuDNN would not start; convolutions take cuBLAS", d->id.index);
            return NULL;
        }
    }
    if (!dl__cu_vgrow((void **)&m->plans, &m->capplans, m->nplans + 1, sizeof(dl__dnn_plan))) return NULL;
    p = &m->plans[m->nplans++];
    memset(p, 0, sizeof *p);
    p->kind = kind; p->tf32 = tf32; p->n = n; p->g = *g;
    if (g->nsp < 1 || g->nsp > 3 || g->G != 1) return NULL;
    /* cuDNN's legacy descriptors count in int: larger tensors take the chunked cuBLAS path */
    if (n > INT_MAX / g->Ca / g->La || n > INT_MAX / g->Cb / g->Lb || g->Cb > INT_MAX / g->Ca / g->K) return NULL;
    for (i = 0; i < nd - 2; i++) {   /* slot j of 3 (a 1-d conv's first is pad 0, stride 1, k 1) */
        int j = 5 - nd + i;
        pad[i] = (int)g->p[j];
        str[i] = (int)g->s[j];
        dil[i] = (int)g->d[j];
        wd[2 + i] = (int)g->k[j];
    }
    wd[0] = (int)g->Cb; wd[1] = (int)g->Ca;
    if (cudnnCreateTensorDescriptor(&p->a) != CUDNN_STATUS_SUCCESS ||
        cudnnCreateTensorDescriptor(&p->b) != CUDNN_STATUS_SUCCESS ||
        cudnnCreateFilterDescriptor(&p->w) != CUDNN_STATUS_SUCCESS ||
        cudnnCreateConvolutionDescriptor(&p->conv) != CUDNN_STATUS_SUCCESS ||
        !dl__dnn_tensor(p->a, nd, n, g->Ca, g->ia) || !dl__dnn_tensor(p->b, nd, n, g->Cb, g->ib) ||
        cudnnSetFilterNdDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, nd, wd) != CUDNN_STATUS_SUCCESS ||
        cudnnSetConvolutionNdDescriptor(p->conv, nd - 2, pad, str, dil, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT) != CUDNN_STATUS_SUCCESS ||
        cudnnSetConvolutionMathType(p->conv, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH) != CUDNN_STATUS_SUCCESS ||
        cudnnGetConvolutionNdForwardOutputDim(p->conv, p->a, p->w, nd, out) != CUDNN_STATUS_SUCCESS)
        return NULL;
    /* symmetric padding only: dl.h's left padding must give dl.h's output size */
    if (out[0] != (int)n || out[1] != (int)g->Cb) return NULL;
    for (i = 0; i < nd - 2; i++)
        if (out[2 + i] != (int)g->ib[5 - nd + i]) return NULL;
    p->algo = -1;
    if (kind == DL__DNN_FWD) {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        if (cudnnGetConvolutionForwardAlgorithm_v7(m->dnn, p->a, p->w, p->conv, p->b, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                   &cnt, r) == CUDNN_STATUS_SUCCESS)
            dl__dnn_pick(p, r, cnt, DL__DNN_PLAIN_FWD);
    } else if (kind == DL__DNN_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        if (cudnnGetConvolutionBackwardDataAlgorithm_v7(m->dnn, p->w, p->b, p->conv, p->a,
                                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &cnt,
                                                        r) == CUDNN_STATUS_SUCCESS)
            dl__dnn_pick(p, r, cnt, DL__DNN_PLAIN_DATA);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        if (cudnnGetConvolutionBackwardFilterAlgorithm_v7(m->dnn, p->a, p->b, p->conv, p->w,
                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &cnt,
                                                          r) == CUDNN_STATUS_SUCCESS)
            dl__dnn_pick(p, r, cnt, DL__DNN_PLAIN_FILTER);
    }
    (void)cudaGetLastError();
    if (p->algo < 0) return NULL;
    p->ok = true;
    return p;
}

static bool dl__cu_conv_run(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                            const dl__cgeom *g, bool T);
static bool dl__cu_conv_i2c_wgrad(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n,
                                  const dl__cgeom *g);

/* DL_CUDNN_CHECK=1: the same convolution by dl.h's own path (direct sums
   or im2col + cuBLAS, as without cuDNN), both read back and compared; each
   call's worst difference to stderr */
static void dl__dnn_check(dl__dev *d, const dl__dnn_plan *p, const float *out, const float *in1, const float *in2,
                          int64_t n, const dl__cgeom *g)
{
    dl__cuimpl *m = DL__CUI(d);
    size_t cnt = (size_t)(p->kind == DL__DNN_FWD ? n * g->Cb * g->Lb : p->kind == DL__DNN_DATA ? n * g->Ca * g->La
                                                                                            : g->Cb * g->Ca * g->K);
    float *ref = NULL, *ha = (float *)malloc(cnt * sizeof(float)), *hb = (float *)malloc(cnt * sizeof(float));
    double worst = 0, big = 0;
    size_t i, at = 0;
    if (!ha || !hb || cudaMalloc((void **)&ref, cnt * sizeof(float)) != cudaSuccess) {
        free(ha); free(hb);
        return;
    }
    m->dnn_bypass = true;
    if (p->kind == DL__DNN_FILTER) dl__cu_conv_i2c_wgrad(d, ref, in1, in2, n, g);
    else dl__cu_conv_run(d, ref, in1, in2, NULL, n, g, p->kind == DL__DNN_DATA);
    m->dnn_bypass = false;
    (void)cudaStreamSynchronize(m->stream);
    (void)cudaMemcpy(ha, out, cnt * sizeof(float), cudaMemcpyDeviceToHost);
    (void)cudaMemcpy(hb, ref, cnt * sizeof(float), cudaMemcpyDeviceToHost);
    for (i = 0; i < cnt; i++) {
        double e = fabs((double)ha[i] - hb[i]);
        if (!(e <= worst)) { worst = e; at = i; }
        if (fabs((double)hb[i]) > big) big = fabs((double)hb[i]);
    }
    fprintf(stderr, "cuDNN check %s: n %lld Ca %lld Cb %lld ia %lldx%lldx%lld ib %lldx%lldx%lld k %lldx%lldx%lld "
            "s %lld p %lld d %lld tf32 %d algo %d ws %zu: max diff %.3g at %zu (cudnn %.6g dl.h %.6g), "
            "max |ref| %.3g%s\n",
            p->kind == DL__DNN_FWD ? "fwd" : p->kind == DL__DNN_DATA ? "dgrad" : "wgrad", (long long)n,
            (long long)g->Ca, (long long)g->Cb, (long long)g->ia[0], (long long)g->ia[1], (long long)g->ia[2],
            (long long)g->ib[0], (long long)g->ib[1], (long long)g->ib[2], (long long)g->k[0], (long long)g->k[1],
            (long long)g->k[2], (long long)g->s[2], (long long)g->p[2], (long long)g->d[2], (int)p->tf32, p->algo,
            p->ws, worst, at, ha[at], hb[at], big, worst > 1e-2 * (big > 1 ? big : 1) ? "  WRONG" : "");
    cudaFree(ref);
    free(ha); free(hb);
}

/* kind FWD: out (n, Cb, ib) = conv(in1 x, in2 w); DATA: out (n, Ca, ia) =
   convT(in1 (n, Cb, ib), in2 w); FILTER: out dw = wgrad(in1 x, in2 gy).
   false: cuDNN declined (no work queued); true: queued, or the device's
   error recorded. */
/* whether cuDNN is asked to take this geometry (it may still decline) */
static bool dl__dnn_may(const dl__cuimpl *m, const dl__cgeom *g)
{
    if (m->emulate || m->dnn_bypass || !m->dnn_mode) return false;
    return m->dnn_mode == 2 || (g->Ca >= DL__DNN_MIN_C && g->Cb >= DL__DNN_MIN_C);
}

static bool dl__dnn_conv(dl__dev *d, int kind, float *out, const float *in1, const float *in2, int64_t n,
                         const dl__cgeom *g)
{
    dl__cuimpl *m = DL__CUI(d);
    dl__dnn_plan *p;
    dl__mark mk;
    void *ws = NULL;
    float one = 1.0f, zero = 0.0f;
    cudnnStatus_t st;
    if (!dl__dnn_may(m, g)) return false;
    dl__cu_enter(d);
    if (!(p = dl__dnn_get(d, kind, n, g))) return false;
    mk = dl__arena_mark(&d->data);
    if (p->ws && !(ws = dl__arena_alloc(d->ctx, &d->data, p->ws, true))) {
        dl__arena_rewind(&d->data, mk);
        return false;   /* no memory for its workspace: the cuBLAS path, which chunks */
    }
    if (ws) dl__track_peak(d);
    if (kind == DL__DNN_FWD)
        st = cudnnConvolutionForward(m->dnn, &one, p->a, in1, p->w, in2, p->conv, (cudnnConvolutionFwdAlgo_t)p->algo,
                                     ws, p->ws, &zero, p->b, out);
    else if (kind == DL__DNN_DATA)
        st = cudnnConvolutionBackwardData(m->dnn, &one, p->w, in2, p->b, in1, p->conv,
                                          (cudnnConvolutionBwdDataAlgo_t)p->algo, ws, p->ws, &zero, p->a, out);
    else
        st = cudnnConvolutionBackwardFilter(m->dnn, &one, p->a, in1, p->b, in2, p->conv,
                                            (cudnnConvolutionBwdFilterAlgo_t)p->algo, ws, p->ws, &zero, p->w, out);
    dl__arena_rewind(&d->data, mk);
    if (st != CUDNN_STATUS_SUCCESS) {
        dl__dev_fail(d, "cuda:%d cuDNN convolution (%s): %s", d->id.index,
                     kind == DL__DNN_FWD ? "forward" : kind == DL__DNN_DATA ? "input gradient" : "weight gradient",
                     cudnnGetErrorString(st));
        return true;
    }
    dl__cu_launched(d, kind == DL__DNN_FWD ? "cudnn conv" : kind == DL__DNN_DATA ? "cudnn conv dx" : "cudnn conv dw");
    if (m->dnn_check && !m->cap) dl__dnn_check(d, p, out, in1, in2, n, g);
    return true;
}
#endif

/* dw (rows) = (acc ? dw : 0) + part[0] + ... + part[cnt-1], in that order */
template <typename I>
struct dl__cuf_psum {
    float *dw; const float *part; I rows, cnt; bool acc;
    DL__HD void operator()(I e) const
    {
        float v = acc ? dw[e] : 0.0f;
        dl__cu_inorder<16>(cnt, [&](I k) { return dl__cu_ldcg(part + k * rows + e); },   /* (dl__cu_run_fin) */
                           [&](I, float p) { v = dl__cu_fadd(v, p); });
        dw[e] = v;
    }
};

/* ---- Direct convolution for few channels (LeNet's 1->6 and 6->16, a
   grayscale stem): each output element is one thread's sum over its
   Ca/G * K inputs, read where they lie, with the bias added in the same
   pass; no im2col matrix, no GEMM, one launch. Where a sample's im2col
   matrix is many times its input (K = 25 of them for a 5x5) and the
   products are too thin for cuBLAS's tiles (M = 6 or 16), the im2col path
   spends its time moving that matrix: LeNet's first conv writes and reads
   K * Lb = 19,600 floats a sample through im2col, where this path reads
   784 and writes 4,704.
     forward   y (n, Cb, ib...) element (s, co, o) = sum over ci, kk
               (in that order) of x (s, ci, o*stride + kk*dil - pad)
               w (co, ci, kk), then + bias (co)
     convT     y (n, Ca, ia...) element (s, ci, j) = sum over co, kk of
               x (s, co, o) w (co, ci, kk) for the o with o*stride +
               kk*dil - pad = j (the input gradient: col2im's gather with
               the product folded in), then + bias (ci)
     wgrad     dw (Cb, Ca/G, k...) element (co, ci, kk) = sum over the
               samples s and output positions o of gy (s, co, o)
               x (s, ci, o*stride + kk*dil - pad): one thread per element
               and chunk of samples (about DL__CU_DIRECT_THREADS threads
               in all, a constant, so every GPU sums in the same order),
               then the chunks' partials added in order (dl__cuf_psum);
               declined where that leaves under a quarter of those
               threads with over 4,096 products each
   Products and sums round separately (no FMA), as the CPU's. Taken where
   the GEMMs are thin: fewer than DL__DNN_MIN_C channels in or out per
   group and at most DL__CU_DIRECT_MACS products per output position
   (Cb/G Ca/G K); groups included (the im2col path has none). Exact fp32
   in either math mode. DL_CONV_DIRECT=0 turns it off (the im2col path). */
#ifndef DL__CU_DIRECT_MACS
#define DL__CU_DIRECT_MACS 4096
#endif
#ifndef DL__CU_DIRECT_THREADS
#define DL__CU_DIRECT_THREADS 65536
#endif

/* true where the direct path takes this geometry (n samples) */
static bool dl__cu_direct_ok(const dl__cuimpl *m, const dl__cgeom *g, int64_t n)
{
    int64_t Cag, Cbg;
    if (!m->direct || n <= 0 || g->G < 1 || g->Ca % g->G || g->Cb % g->G || g->K < 1) return false;
    Cag = g->Ca / g->G;
    Cbg = g->Cb / g->G;
    if (Cag < 1 || Cbg < 1 || (Cag >= DL__DNN_MIN_C && Cbg >= DL__DNN_MIN_C)) return false;
    return Cag * g->K <= DL__CU_DIRECT_MACS / Cbg;
}

/* 32-bit indices when every element count of the call is below 2^30 */
static bool dl__cu_direct_small(const dl__cgeom *g, int64_t n)
{
    return dl__cu_small(n * g->Ca * g->La) && dl__cu_small(n * g->Cb * g->Lb) &&
           dl__cu_small(g->Cb * (g->Ca / g->G) * g->K * n);
}

/* [*lo, *hi): the taps q < k with b + q d in [0, n) (d > 0): the loops
   below visit only those, no test per product */
template <typename I>
static DL__HD inline void dl__cu_taps(I b, I d, I n, I k, I *lo, I *hi)
{
    I h = n - b > 0 ? (n - b + d - 1) / d : 0;
    *lo = b < 0 ? (d - 1 - b) / d : 0;
    *hi = h < k ? h : k;
}

template <typename I>
struct dl__cuf_dconv {
    float *y; const float *x, *w, *b; dl__cgeom g; int act;   /* act: dl__cu_act's (-1: none) */
    DL__HD void operator()(I e) const
    {
        I Lb = (I)g.Lb, ib1 = (I)g.ib[1], ib2 = (I)g.ib[2];
        I pos = e % Lb, t = e / Lb;
        y[e] = at(t / (I)g.Cb, t % (I)g.Cb, pos / (ib2 * ib1), (pos / ib2) % ib1, pos % ib2);
    }
    /* output (s, co, o0, o1, o2): act(the products' sum + bias) */
    DL__HD float at(I s, I co, I o0, I o1, I o2) const
    {
        I La = (I)g.La, K = (I)g.K, Cag = (I)(g.Ca / g.G), Cbg = (I)(g.Cb / g.G);
        I ia1 = (I)g.ia[1], ia2 = (I)g.ia[2];
        I k1 = (I)g.k[1], k2 = (I)g.k[2], d0 = (I)g.d[0], d1 = (I)g.d[1], d2 = (I)g.d[2];
        I b0 = o0 * (I)g.s[0] - (I)g.p[0], b1 = o1 * (I)g.s[1] - (I)g.p[1], b2 = o2 * (I)g.s[2] - (I)g.p[2];
        I l0, h0, l1, h1, l2, h2, ci, q0, q1, q2;
        const float *xs = x + (s * (I)g.Ca + co / Cbg * Cag) * La, *wc = w + co * Cag * K;
        float acc = 0.0f;
        dl__cu_taps<I>(b0, d0, (I)g.ia[0], (I)g.k[0], &l0, &h0);
        dl__cu_taps<I>(b1, d1, ia1, k1, &l1, &h1);
        dl__cu_taps<I>(b2, d2, ia2, k2, &l2, &h2);
        for (ci = 0; ci < Cag; ci++)
            for (q0 = l0; q0 < h0; q0++)
                for (q1 = l1; q1 < h1; q1++) {
                    I xi = ci * La + ((b0 + q0 * d0) * ia1 + b1 + q1 * d1) * ia2 + b2;
                    const float *wr = wc + ((ci * (I)g.k[0] + q0) * k1 + q1) * k2;
                    for (q2 = l2; q2 < h2; q2++) acc = dl__cu_fadd(acc, dl__cu_fmul(xs[xi + q2 * d2], wr[q2]));
                }
        return dl__cu_act(act, b ? dl__cu_fadd(acc, b[co]) : acc);
    }
};

/* The conv (+ activation) and the 2x2, stride-2 average pool after it
   (a 2-d conv, ib (1, H, W), H and W even): a thread per pooled output
   (s, co, i, j) writes the four outputs of its window to y, as
   dl__cuf_dconv, and their mean to yp, as dl__cuf_avgpool (0 + the four
   in row order, then / 4): the two kernels' bits in one launch */
template <typename I>
struct dl__cuf_dconv_pool {
    dl__cuf_dconv<I> c; float *yp;
    DL__HD void operator()(I e) const
    {
        I H = (I)c.g.ib[1], W = (I)c.g.ib[2], wp = W / 2, lp = H / 2 * wp;
        I pos = e % lp, t = e / lp, s = t / (I)c.g.Cb, co = t % (I)c.g.Cb, i = pos / wp * 2, j = pos % wp * 2;
        float *ys = c.y + t * (I)c.g.Lb + i * W + j, sum = 0.0f, v;
        v = c.at(s, co, 0, i, j);         ys[0] = v;     sum = dl__cu_fadd(sum, v);
        v = c.at(s, co, 0, i, j + 1);     ys[1] = v;     sum = dl__cu_fadd(sum, v);
        v = c.at(s, co, 0, i + 1, j);     ys[W] = v;     sum = dl__cu_fadd(sum, v);
        v = c.at(s, co, 0, i + 1, j + 1); ys[W + 1] = v; sum = dl__cu_fadd(sum, v);
        yp[e] = dl__cu_fdiv(sum, 4.0f);
    }
};

/* S1: stride 1 in every dim, where output o = j + pad - kk*dil needs no
   division (the input gradient of LeNet's and most small convs) */
/* S1: stride 1 in every dim: output o = a - q d, the taps q with o in
   [0, n) a range (a = j + pad), no division per product */
template <typename I>
static DL__HD inline void dl__cu_taps1(I a, I d, I n, I k, I *lo, I *hi)
{
    I h = a >= 0 ? a / d + 1 : 0;
    *lo = a - n >= 0 ? (a - n) / d + 1 : 0;
    *hi = h < k ? h : k;
}

template <typename I, bool S1>
struct dl__cuf_dconvT {
    float *y; const float *x, *w, *b; dl__cgeom g; int act;
    DL__HD void operator()(I e) const
    {
        I Lb = (I)g.Lb, La = (I)g.La, K = (I)g.K, Cag = (I)(g.Ca / g.G), Cbg = (I)(g.Cb / g.G);
        I ia1 = (I)g.ia[1], ia2 = (I)g.ia[2], ib0 = (I)g.ib[0], ib1 = (I)g.ib[1], ib2 = (I)g.ib[2];
        I k0 = (I)g.k[0], k1 = (I)g.k[1], k2 = (I)g.k[2], d0 = (I)g.d[0], d1 = (I)g.d[1], d2 = (I)g.d[2];
        I pos = e % La, t = e / La, ci = t % (I)g.Ca, s = t / (I)g.Ca, grp = ci / Cag, cl = ci - grp * Cag;
        I j2 = pos % ia2, j1 = (pos / ia2) % ia1, j0 = pos / (ia2 * ia1);
        I a0 = j0 + (I)g.p[0], a1 = j1 + (I)g.p[1], a2 = j2 + (I)g.p[2];
        float acc = 0.0f;
        I c, q0, q1, q2, o0, o1, o2;
        if (S1) {
            I l0, h0, l1, h1, l2, h2;
            dl__cu_taps1<I>(a0, d0, ib0, k0, &l0, &h0);
            dl__cu_taps1<I>(a1, d1, ib1, k1, &l1, &h1);
            dl__cu_taps1<I>(a2, d2, ib2, k2, &l2, &h2);
            for (c = grp * Cbg; c < (grp + 1) * Cbg; c++) {
                const float *xs = x + (s * (I)g.Cb + c) * Lb, *wc = w + (c * Cag + cl) * K;
                for (q0 = l0; q0 < h0; q0++)
                    for (q1 = l1; q1 < h1; q1++) {
                        I xi = ((a0 - q0 * d0) * ib1 + a1 - q1 * d1) * ib2 + a2;
                        const float *wr = wc + (q0 * k1 + q1) * k2;
                        for (q2 = l2; q2 < h2; q2++) acc = dl__cu_fadd(acc, dl__cu_fmul(xs[xi - q2 * d2], wr[q2]));
                    }
            }
        } else {
            I s0 = (I)g.s[0], s1 = (I)g.s[1], s2 = (I)g.s[2];
            for (c = grp * Cbg; c < (grp + 1) * Cbg; c++) {
                const float *xs = x + (s * (I)g.Cb + c) * Lb, *wc = w + (c * Cag + cl) * K;
                for (q0 = 0; q0 < k0; q0++) {
                    if (!dl__cu_tap<I>(a0 - q0 * d0, s0, ib0, &o0)) continue;
                    for (q1 = 0; q1 < k1; q1++) {
                        const float *xr, *wr;
                        if (!dl__cu_tap<I>(a1 - q1 * d1, s1, ib1, &o1)) continue;
                        xr = xs + (o0 * ib1 + o1) * ib2;
                        wr = wc + (q0 * k1 + q1) * k2;
                        for (q2 = 0; q2 < k2; q2++)
                            if (dl__cu_tap<I>(a2 - q2 * d2, s2, ib2, &o2))
                                acc = dl__cu_fadd(acc, dl__cu_fmul(xr[o2], wr[q2]));
                    }
                }
            }
        }
        y[e] = dl__cu_act(act, b ? dl__cu_fadd(acc, b[ci]) : acc);
    }
};

/* part (nch, rows) or dw (rows) when nch is 1: element (k, r) sums samples
   [k cs, (k+1) cs) of weight r = (co, ci, kk) */
template <typename I>
struct dl__cuf_dconvW {
    float *part; const float *x, *gy; I n, cs; dl__cgeom g;
    DL__HD void operator()(I e) const
    {
        I Lb = (I)g.Lb, La = (I)g.La, K = (I)g.K, Cag = (I)(g.Ca / g.G), Cbg = (I)(g.Cb / g.G);
        I rows = (I)g.Cb * Cag * K, ia1 = (I)g.ia[1], ia2 = (I)g.ia[2];
        I ib1 = (I)g.ib[1], ib2 = (I)g.ib[2], k1 = (I)g.k[1], k2 = (I)g.k[2];
        I s0 = (I)g.s[0], s1 = (I)g.s[1], s2 = (I)g.s[2];
        I k = e / rows, r = e - k * rows, kk = r % K, t = r / K, ci = t % Cag, co = t / Cag;
        I q2 = kk % k2, q1 = (kk / k2) % k1, q0 = kk / (k2 * k1);
        I c0 = q0 * (I)g.d[0] - (I)g.p[0], c1 = q1 * (I)g.d[1] - (I)g.p[1], c2 = q2 * (I)g.d[2] - (I)g.p[2];
        I s, se = (k + 1) * cs < n ? (k + 1) * cs : n, o0, o1, o2, l0, h0, l1, h1, l2, h2;
        float acc = 0.0f;
        /* the outputs o whose input o s + c lies inside: ranges as the taps' */
        dl__cu_taps<I>(c0, s0, (I)g.ia[0], (I)g.ib[0], &l0, &h0);
        dl__cu_taps<I>(c1, s1, ia1, (I)g.ib[1], &l1, &h1);
        dl__cu_taps<I>(c2, s2, ia2, ib2, &l2, &h2);
        for (s = k * cs; s < se; s++) {
            const float *gs = gy + (s * (I)g.Cb + co) * Lb, *xs = x + (s * (I)g.Ca + co / Cbg * Cag + ci) * La;
            for (o0 = l0; o0 < h0; o0++)
                for (o1 = l1; o1 < h1; o1++) {
                    I xi = ((o0 * s0 + c0) * ia1 + o1 * s1 + c1) * ia2 + c2;
                    const float *gr = gs + (o0 * ib1 + o1) * ib2;
                    for (o2 = l2; o2 < h2; o2++) acc = dl__cu_fadd(acc, dl__cu_fmul(gr[o2], xs[xi + o2 * s2]));
                }
        }
        part[e] = acc;
    }
};

/* ---- The direct sums in shared memory (DL_CONV_DIRECT=1, the default):
   a block takes a sample (forward, input gradient) or a chunk of samples
   (weight gradient), or a band of its output rows where a whole sample's
   channels of a group do not fit in DL__CU_TILE_SH floats with the
   weights (and the partials); it copies them in once, with the padding
   written as zeros, then each thread sums for up to 4 channels (and a
   pooled output's 2x2 window: up to 16 sums) out of shared memory, so
   each value read serves 4 to 16 products. The per-element kernels above
   read x and w from global memory for every product, one sum a thread:
   on an H200 (ncu, 2026-11-28) LeNet's convolutions ran at 0.23-0.61
   waves with a long dependent chain a thread, ~490 us of an 800 us step
   where PyTorch's cuDNN took ~260. The forward and the input gradient add
   in the per-element kernels' order (ci, then the taps; the padding's
   products are zeros, which change no sum), so they give the same bits;
   the weight gradient adds a chunk's samples, then the output rows of a
   part of a band, then the parts, then the (chunk, band) partials
   (DL__CU_TILE_CHUNKS chunks at most, a constant: every GPU adds in the
   same order). 2-d and 1-d convolutions; the input gradient at stride 1;
   the weight gradient with kernels at most DL__CU_TILE_KW wide.
   DL_CONV_DIRECT=2 keeps the per-element kernels (an A/B of the two on
   one GPU). */
#ifndef DL__CU_TILE_SH
#define DL__CU_TILE_SH 12288          /* floats: 48 KB, what a block gets without opting in */
#endif
#define DL__CU_TILE_CHUNKS 256
#define DL__CU_TILE_KW 8
#ifndef DL__CU_TILE_CT
#define DL__CU_TILE_CT 4              /* channels a thread (gpu_kit.sh's bench-ct1, -ct2: 1, 2) */
#endif

/* channels an item of C: the fewest items of at most DL__CU_TILE_CT, as
   even as a fixed size makes them (6: 3 + 3, not 4 + 2); which item sums
   a channel changes no sum's order */
static DL__HD inline int dl__cu_tile_ct(int C)
{
    int n = (C + DL__CU_TILE_CT - 1) / DL__CU_TILE_CT;
    return (C + n - 1) / n;
}

/* A block kernel in phases with barriers between: f.nblk blocks
   (grid-stride), f.nt threads a block (a multiple of 32, at most
   DL__CU_THREADS), f.shf floats of shared memory; block b runs phases
   0 .. f.phases(b) - 1, thread t of phase p being f.run(sh, b, p, t).
   What a phase reads of sh an earlier phase wrote. */
template <typename F>
__global__ void __launch_bounds__(DL__CU_THREADS) dl__cu_tile_k(F f)
{
    DL__CU_PDL_ENTER();
    extern __shared__ float dl__cu_tsh[];
    int64_t b;
    for (b = (int64_t)blockIdx.x; b < f.nblk; b += (int64_t)gridDim.x) {
        int p, np = f.phases(b);
        for (p = 0; p < np; p++) {
            f.run(dl__cu_tsh, b, p, (int)threadIdx.x);
            __syncthreads();
        }
    }
}

/* an emulated device's dl__cu_tile_k: each phase thread after thread.
   The block's f.shf floats start as NaNs (a read of a slot no phase wrote
   shows in the result); the rest of the host array holds a NaN of its own
   bits, checked after each block: a GPU gives a block f.shf floats, and a
   write past them, which the host array would take silently, fails the
   launch there (an illegal address), so here it stops the test. */
#define DL__CU_SH_GUARD 0x7fe5a5a5u
template <typename F>
struct dl__cuh_tile {
    F f;
    void operator()(int64_t) const
    {
        float sh[DL__CU_TILE_SH];   /* (48 KB of the host thread's stack, as the block's shared memory) */
        int64_t b, i;
        int p, t;
        if (f.shf > DL__CU_TILE_SH || f.nt <= 0 || f.nt > DL__CU_THREADS || f.nt % 32) {
            fprintf(stderr, "dl_cuda.cuh: a tile launch of %d threads and %lld floats of shared memory (at most "
                    "%d threads, a multiple of 32, and %d floats): a GPU refuses it\n", f.nt, (long long)f.shf,
                    DL__CU_THREADS, DL__CU_TILE_SH);
            abort();
        }
        for (i = 0; i < f.nblk; i++) {
            uint32_t g = DL__CU_SH_GUARD;
            b = dl__cu_emu_at(i, f.nblk);
            for (t = 0; t < (int)f.shf; t++) sh[t] = NAN;
            for (; t < DL__CU_TILE_SH; t++) memcpy(&sh[t], &g, sizeof g);
            for (p = 0; p < f.phases(b); p++)
                for (t = 0; t < f.nt; t++) f.run(sh, b, p, (int)dl__cu_emu_at(t, f.nt));
            for (t = (int)f.shf; t < DL__CU_TILE_SH; t++) {
                memcpy(&g, &sh[t], sizeof g);
                if (g != DL__CU_SH_GUARD) {
                    fprintf(stderr, "dl_cuda.cuh: block %lld of a tile launch wrote float %d of its shared memory, "
                            "past the %lld it was given (a GPU fails the launch)\n", (long long)b, t,
                            (long long)f.shf);
                    abort();
                }
            }
        }
    }
};

/* the tile launches so far (what tests/test_cuda.c counts) */
static size_t dl__cu_ntiles;

template <typename F>
static void dl__cu_tile_go(dl__dev *d, const char *name, const F &f)
{
    dl__cuimpl *m = DL__CUI(d);
    if (f.nblk <= 0) return;
    dl__cu_ntiles++;
    if (m->emulate) {
        dl__cuh_tile<F> h;
        h.f = f;
        dl__cu_host(d, h);   /* (recorded inside a capture) */
        return;
    }
    dl__cu_go(m, dl__cu_tile_k<F>, dl__cu_grid(m, f.nblk, 1), (unsigned)f.nt, f.shf * sizeof(float), f);
    dl__cu_launched(d, name);
}

/* threads for `items` items: a multiple of 32, at most DL__CU_THREADS */
static int dl__cu_tile_nt(int64_t items)
{
    int64_t t = (items + 31) / 32 * 32;
    return (int)(t < 32 ? 32 : t > DL__CU_THREADS ? DL__CU_THREADS : t);
}

/* thread t of nt: dst (C, PH, PW) = src (C, H, W) (channel stride cs) at
   row r + o1, column q + o2, and 0 where that lies outside */
static DL__HD inline void dl__cu_tile_pad(float *dst, const float *src, int C, int H, int W, int PH, int PW, int o1,
                                          int o2, int64_t cs, int t, int nt)
{
    int i, n = C * PH * PW;
    for (i = t; i < n; i += nt) {
        int q = i % PW, r = i / PW % PH, c = i / (PW * PH), sr = r + o1, sc = q + o2;
        dst[i] = sr >= 0 && sr < H && sc >= 0 && sc < W ? src[c * cs + sr * W + sc] : 0.0f;
    }
}

/* thread t of nt: dst[0, n) = src[0, n) */
static DL__HD inline void dl__cu_tile_cp(float *dst, const float *src, int n, int t, int nt)
{
    int i;
    for (i = t; i < n; i += nt) dst[i] = src[i];
}

/* input rows (or columns) that n outputs read at stride st through a
   kernel of k taps at dilation dil, padding included */
static int64_t dl__cu_tile_span(int64_t n, int64_t st, int64_t k, int64_t dil)
{
    return (n - 1) * st + (k - 1) * dil + 1;
}

/* the weight gradient's tile rows of w floats lie w apart, or w + 1 where
   w is even. A warp's threads read the rows of a kernel's taps down a
   column (x) and of its output channels (gy) at the same time, and rows an
   even number apart share banks of shared memory: at d2l LeNet's padded
   32, x's 5 taps fell in one bank, 5 reads one after another (a model of
   the 32 banks over a warp's addresses, LeNet's and LeNet-BN's layers:
   x's reads from up to 8-way conflicts to at most 2-way, gy's from up to
   5-way to at most 2-way; not measured on a GPU). The
   forward's pooled reads fare better at the plain width (d2l LeNet's
   conv2: 3-way there, 5 at 15), so it keeps it. The extra column is
   written and never read. */
static int64_t dl__cu_tile_rs(int64_t w) { return w % 2 ? w : w + 1; }

/* true where the tiles take this 2-d (or 1-d) geometry */
static bool dl__cu_tile_2d(const dl__cgeom *g)
{
    return g->ia[0] == 1 && g->ib[0] == 1 && g->k[0] == 1 && g->p[0] == 0;
}

/* The forward (+ activation; NP 4: + the 2x2 average pool), a block per
   (sample, group, band of R output rows): the rows of x's group channels
   that the band reads, padded, (Cag, PH, PW), then the group's weights
   (Cbg, Cag, K); an item is up to 4 output channels at one output (NP 1)
   or pooled output (NP 4: its window's four; R even) */
template <int NP>
struct dl__cut_conv {
    float *y, *yp; const float *x, *w, *b; dl__cgeom g; int act, nt, PH, PW, R, nbd; int64_t nblk; size_t shf;
    dl__cut_conv() {}
    template <int M>
    explicit dl__cut_conv(const dl__cut_conv<M> &o)   /* the same launch with the other NP */
        : y(o.y), yp(o.yp), x(o.x), w(o.w), b(o.b), g(o.g), act(o.act), nt(o.nt), PH(o.PH), PW(o.PW), R(o.R),
          nbd(o.nbd), nblk(o.nblk), shf(o.shf) {}
    DL__HD int phases(int64_t) const { return 2; }
    DL__HD void run(float *sh, int64_t blk, int p, int t) const
    {
        const int G = (int)g.G, Cag = (int)(g.Ca / G), Cbg = (int)(g.Cb / G), K = (int)g.K, Lb = (int)g.Lb;
        const int k1 = (int)g.k[1], k2 = (int)g.k[2], ib1 = (int)g.ib[1], ib2 = (int)g.ib[2];
        const int s1 = (int)g.s[1], s2 = (int)g.s[2], d1 = (int)g.d[1], d2 = (int)g.d[2];
        const int s = (int)(blk / (G * nbd)), grp = (int)(blk / nbd % G), r0 = (int)(blk % nbd) * R;
        const int nr = ib1 - r0 < R ? ib1 - r0 : R;   /* the band's output rows */
        const int sw = NP == 4 ? ib2 / 2 : ib2, spots = NP == 4 ? nr / 2 * sw : nr * ib2;
        const int ct = dl__cu_tile_ct(Cbg), ntile = (Cbg + ct - 1) / ct;
        float *xt = sh, *wt = sh + Cag * PH * PW;
        int it;
        if (p == 0) {
            dl__cu_tile_pad(xt, x + ((int64_t)s * g.Ca + grp * Cag) * g.La, Cag, (int)g.ia[1], (int)g.ia[2], PH, PW,
                            r0 * s1 - (int)g.p[1], -(int)g.p[2], g.La, t, nt);
            dl__cu_tile_cp(wt, w + (int64_t)grp * Cbg * Cag * K, Cbg * Cag * K, t, nt);
            return;
        }
        for (it = t; it < ntile * spots; it += nt) {
            const int co0 = it / spots * ct, sp = it % spots, nc = Cbg - co0 < ct ? Cbg - co0 : ct;
            const int l1 = sp / sw * (NP == 4 ? 2 : 1), o2 = sp % sw * (NP == 4 ? 2 : 1), o1 = r0 + l1;
            float acc[DL__CU_TILE_CT][NP];
            int ci, q1, q2, j, e;
            for (j = 0; j < DL__CU_TILE_CT; j++)
                for (e = 0; e < NP; e++) acc[j][e] = 0.0f;
            for (ci = 0; ci < Cag; ci++)
                for (q1 = 0; q1 < k1; q1++) {
                    const float *xr = xt + (ci * PH + l1 * s1 + q1 * d1) * PW + o2 * s2;
                    const float *wr = wt + ((co0 * Cag + ci) * k1 + q1) * k2;
                    for (q2 = 0; q2 < k2; q2++) {
                        float xv[NP];
                        xv[0] = xr[q2 * d2];
                        if (NP == 4) {
                            xv[NP == 4 ? 1 : 0] = xr[q2 * d2 + s2];
                            xv[NP == 4 ? 2 : 0] = xr[s1 * PW + q2 * d2];
                            xv[NP == 4 ? 3 : 0] = xr[s1 * PW + s2 + q2 * d2];
                        }
                        DL__CU_UNROLL
                        for (j = 0; j < DL__CU_TILE_CT; j++)
                            if (j < nc) {
                                float wv = wr[j * Cag * K + q2];
                                DL__CU_UNROLL
                                for (e = 0; e < NP; e++) acc[j][e] = dl__cu_fadd(acc[j][e], dl__cu_fmul(xv[e], wv));
                            }
                    }
                }
            DL__CU_UNROLL
            for (j = 0; j < DL__CU_TILE_CT && j < nc; j++) {   /* (unrolled: acc stays in registers) */
                const int co = grp * Cbg + co0 + j;
                float *yo = y + ((int64_t)s * g.Cb + co) * Lb + o1 * ib2 + o2, sum = 0.0f;
                DL__CU_UNROLL
                for (e = 0; e < NP; e++) {
                    float v = dl__cu_act(act, b ? dl__cu_fadd(acc[j][e], b[co]) : acc[j][e]);
                    yo[e / 2 * ib2 + e % 2] = v;
                    sum = dl__cu_fadd(sum, v);
                }
                if (NP == 4) yp[((int64_t)s * g.Cb + co) * (Lb / 4) + o1 / 2 * sw + o2 / 2] = dl__cu_fdiv(sum, 4.0f);
            }
        }
    }
};

/* The input gradient (and conv_transpose's forward) at stride 1, a block
   per (sample, group, band of R rows of y): x (the output side, (n, Cb,
   ib)) of the group's channels, padded so that every tap reads inside,
   (Cbg, GH, GW) for the band's rows, then the group's weights; an item is
   up to 4 input channels at one position. y (s, ci, j) = act(sum over co,
   q (in that order) of x (s, co, j + p - q d) w (co, ci, q), + bias (ci)):
   at tile row j - r0 + (k - 1 - q) d. */
struct dl__cut_convT {
    float *y; const float *x, *w, *b; dl__cgeom g; int act, nt, GH, GW, R, nbd; int64_t nblk; size_t shf;
    DL__HD int phases(int64_t) const { return 2; }
    DL__HD void run(float *sh, int64_t blk, int p, int t) const
    {
        const int G = (int)g.G, Cag = (int)(g.Ca / G), Cbg = (int)(g.Cb / G), K = (int)g.K, La = (int)g.La;
        const int k1 = (int)g.k[1], k2 = (int)g.k[2], ia1 = (int)g.ia[1], ia2 = (int)g.ia[2];
        const int d1 = (int)g.d[1], d2 = (int)g.d[2];
        const int s = (int)(blk / (G * nbd)), grp = (int)(blk / nbd % G), r0 = (int)(blk % nbd) * R;
        const int nr = ia1 - r0 < R ? ia1 - r0 : R, npos = nr * ia2;
        const int ct = dl__cu_tile_ct(Cag), ntile = (Cag + ct - 1) / ct;
        float *xt = sh, *wt = sh + Cbg * GH * GW;
        int it;
        if (p == 0) {
            dl__cu_tile_pad(xt, x + ((int64_t)s * g.Cb + grp * Cbg) * g.Lb, Cbg, (int)g.ib[1], (int)g.ib[2], GH, GW,
                            r0 + (int)(g.p[1] - (g.k[1] - 1) * g.d[1]), (int)(g.p[2] - (g.k[2] - 1) * g.d[2]), g.Lb,
                            t, nt);
            dl__cu_tile_cp(wt, w + (int64_t)grp * Cbg * Cag * K, Cbg * Cag * K, t, nt);
            return;
        }
        for (it = t; it < ntile * npos; it += nt) {
            const int c0 = it / npos * ct, lp = it % npos, l1 = lp / ia2, j2 = lp % ia2;
            const int pos = (r0 + l1) * ia2 + j2, nc = Cag - c0 < ct ? Cag - c0 : ct;
            float acc[DL__CU_TILE_CT];
            int co, q1, q2, j;
            for (j = 0; j < DL__CU_TILE_CT; j++) acc[j] = 0.0f;
            for (co = 0; co < Cbg; co++)
                for (q1 = 0; q1 < k1; q1++) {
                    const float *xr = xt + (co * GH + l1 + (k1 - 1 - q1) * d1) * GW + j2 + (k2 - 1) * d2;
                    const float *wr = wt + ((co * Cag + c0) * k1 + q1) * k2;
                    for (q2 = 0; q2 < k2; q2++) {
                        float xv = xr[-q2 * d2];
                        DL__CU_UNROLL
                        for (j = 0; j < DL__CU_TILE_CT; j++)
                            if (j < nc) acc[j] = dl__cu_fadd(acc[j], dl__cu_fmul(xv, wr[j * K + q2]));
                    }
                }
            DL__CU_UNROLL
            for (j = 0; j < DL__CU_TILE_CT && j < nc; j++) {   /* (unrolled: acc stays in registers) */
                const int ci = grp * Cag + c0 + j;
                y[((int64_t)s * g.Ca + ci) * La + pos] = dl__cu_act(act, b ? dl__cu_fadd(acc[j], b[ci]) : acc[j]);
            }
        }
    }
};

/* The weight gradient's partials, a block per (chunk of cs samples, band
   of RB output rows, group, CB of the group's output channels): per
   sample, the rows of x's group channels that the band reads, padded (as
   the forward's), and the band's rows of gy's CB channels, then each item
   (part pp of the band's rows, co, ci, q1) adds the sample's products to
   its k2 sums (kept in shared memory between samples); then the parts
   added in order into part (chunk and band, rows). RB, CB (what fits in
   shared memory) and P follow from the shapes alone, so does the order.
   Tile rows lie PW and GW floats apart (odd: dl__cu_tile_rs). */
struct dl__cut_wgrad {
    float *part; const float *x, *gy; dl__cgeom g; int n, cs, P, rpp, CB, RB, nbd, nt, PH, PW, GW; int64_t nblk;
    size_t shf;
    DL__HD int ncb() const { return ((int)(g.Cb / g.G) + CB - 1) / CB; }
    DL__HD int ns(int64_t blk) const
    {
        int k = (int)(blk / (g.G * ncb() * nbd)), e = (k + 1) * cs < n ? (k + 1) * cs : n;
        return e - k * cs;
    }
    DL__HD int phases(int64_t blk) const { return 2 * ns(blk) + 1; }
    DL__HD void run(float *sh, int64_t blk, int p, int t) const
    {
        const int G = (int)g.G, Cag = (int)(g.Ca / G), Cbg = (int)(g.Cb / G), K = (int)g.K, Lb = (int)g.Lb;
        const int k1 = (int)g.k[1], k2 = (int)g.k[2], ib1 = (int)g.ib[1], ib2 = (int)g.ib[2];
        const int s1 = (int)g.s[1], s2 = (int)g.s[2], d1 = (int)g.d[1], d2 = (int)g.d[2];
        const int nb = ncb(), cb0 = (int)(blk % nb) * CB, grp = (int)(blk / nb % G);
        const int band = (int)(blk / (nb * G) % nbd), k = (int)(blk / ((int64_t)nb * G * nbd)), r0 = band * RB;
        const int cbn = Cbg - cb0 < CB ? Cbg - cb0 : CB, ipp = cbn * Cag * k1, re = r0 + RB < ib1 ? r0 + RB : ib1;
        const int64_t row0 = (int64_t)(grp * Cbg + cb0) * Cag * K;   /* the block's first weight */
        float *xt = sh, *gt = sh + Cag * PH * PW, *res = gt + CB * RB * GW;
        int it;
        if (p == 2 * ns(blk)) {   /* the parts, in order */
            for (it = t; it < ipp * k2; it += nt) {
                float v = 0.0f;
                int q;
                for (q = 0; q < P; q++) v = dl__cu_fadd(v, res[q * ipp * k2 + it]);
                part[((int64_t)k * nbd + band) * g.Cb * Cag * K + row0 + it] = v;
            }
            return;
        }
        if (p % 2 == 0) {
            const int s = k * cs + p / 2;
            dl__cu_tile_pad(xt, x + ((int64_t)s * g.Ca + grp * Cag) * g.La, Cag, (int)g.ia[1], (int)g.ia[2], PH, PW,
                            r0 * s1 - (int)g.p[1], -(int)g.p[2], g.La, t, nt);
            dl__cu_tile_pad(gt, gy + ((int64_t)s * g.Cb + grp * Cbg + cb0) * Lb, cbn, ib1, ib2, RB, GW, r0, 0, Lb, t,
                            nt);
            return;
        }
        for (it = t; it < P * ipp; it += nt) {
            const int pp = it / ipp, r = it % ipp, q1 = r % k1, ci = r / k1 % Cag, co = r / (k1 * Cag);
            const int oe = r0 + (pp + 1) * rpp < re ? r0 + (pp + 1) * rpp : re;
            float acc[DL__CU_TILE_KW], *rs = res + (int64_t)it * k2;
            int o1, o2, q;
            DL__CU_UNROLL
            for (q = 0; q < DL__CU_TILE_KW; q++) acc[q] = p == 1 || q >= k2 ? 0.0f : rs[q];
            for (o1 = r0 + pp * rpp; o1 < oe; o1++) {
                const float *gr = gt + (co * RB + o1 - r0) * GW, *xr = xt + (ci * PH + (o1 - r0) * s1 + q1 * d1) * PW;
                for (o2 = 0; o2 < ib2; o2++) {
                    const float gv = gr[o2], *xo = xr + o2 * s2;
                    DL__CU_UNROLL
                    for (q = 0; q < DL__CU_TILE_KW; q++)
                        if (q < k2) acc[q] = dl__cu_fadd(acc[q], dl__cu_fmul(gv, xo[q * d2]));
                }
            }
            DL__CU_UNROLL
            for (q = 0; q < DL__CU_TILE_KW; q++)
                if (q < k2) rs[q] = acc[q];
        }
    }
};

/* dw (rows) = the chunks' partials (cnt, rows) added: a warp a row, lane l
   the partials l, l + 32, ... in order, then the 32 lanes' sums in order */
struct dl__cut_psum {
    float *dw; const float *part; int rows, cnt, nt; int64_t nblk; size_t shf;
    DL__HD int phases(int64_t) const { return 2; }
    DL__HD void run(float *sh, int64_t blk, int p, int t) const
    {
        const int row = (int)blk * (DL__CU_THREADS / 32) + t / 32, lane = t % 32;
        if (row >= rows) return;
        if (p == 0) {
            float v = 0.0f;
            int m = cnt > lane ? (cnt - lane + 31) / 32 : 0;
            dl__cu_inorder<8>(m, [&](int q) { return part[(int64_t)(lane + 32 * q) * rows + row]; },
                              [&](int, float u) { v = dl__cu_fadd(v, u); });
            sh[t] = v;
        } else if (lane == 0) {
            float v = sh[t];
            int q;
            for (q = 1; q < 32; q++) v = dl__cu_fadd(v, sh[t + q]);
            dw[row] = v;
        }
    }
};

/* the tiles' forward or convT (T) (+ act, + the pool into yp); false:
   they do not take it (the per-element kernels then may). Bands of R
   rows (of y), the most that fit in shared memory (even with the pool). */
static bool dl__cu_tile_fwd(dl__dev *d, float *y, float *yp, const float *x, const float *w, const float *bias,
                            int64_t n, const dl__cgeom *g, bool T, int act)
{
    const int64_t G = g->G, Cag = g->Ca / G, Cbg = g->Cb / G, wk = Cbg * Cag * g->K;
    const int64_t rows = T ? g->ia[1] : g->ib[1], step = yp ? 2 : 1;
    int64_t R, PH = 0, PW, sh = 0, nbd, items;
    if (DL__CUI(d)->direct != 1 || !dl__cu_tile_2d(g) || !dl__cu_direct_small(g, n)) return false;
    if (T && (g->s[1] != 1 || g->s[2] != 1 || yp)) return false;
    PW = T ? dl__cu_tile_span(g->ia[2], 1, g->k[2], g->d[2]) : dl__cu_tile_span(g->ib[2], g->s[2], g->k[2], g->d[2]);
    for (R = rows - rows % step; R >= step; R -= step) {
        PH = T ? dl__cu_tile_span(R, 1, g->k[1], g->d[1]) : dl__cu_tile_span(R, g->s[1], g->k[1], g->d[1]);
        sh = (T ? Cbg : Cag) * PH * PW + wk;
        if (sh <= DL__CU_TILE_SH) break;
    }
    if (R < step) return false;
    if (!y) return true;   /* (the answer only) */
    nbd = (rows + R - 1) / R;
    if (T) items = (Cag + DL__CU_TILE_CT - 1) / DL__CU_TILE_CT * R * g->ia[2];
    else items = (Cbg + DL__CU_TILE_CT - 1) / DL__CU_TILE_CT * (R / step) * (g->ib[2] / step);
    dl__cu_enter(d);
    y = DL__CUP(d, y);
    x = DL__CUP(d, x);
    w = DL__CUP(d, w);
    if (bias) bias = DL__CUP(d, bias);
    if (T) {
        dl__cut_convT f;
        f.y = y; f.x = x; f.w = w; f.b = bias; f.g = *g; f.act = act; f.GH = (int)PH; f.GW = (int)PW;
        f.R = (int)R; f.nbd = (int)nbd; f.nblk = n * G * nbd; f.shf = (size_t)sh; f.nt = dl__cu_tile_nt(items);
        dl__cu_tile_go(d, "conv tiles (transposed)", f);
    } else {
        dl__cut_conv<1> f;   /* (the fields dl__cut_conv<4> has too) */
        f.y = y; f.yp = yp ? DL__CUP(d, yp) : NULL; f.x = x; f.w = w; f.b = bias; f.g = *g; f.act = act;
        f.PH = (int)PH; f.PW = (int)PW; f.R = (int)R; f.nbd = (int)nbd; f.nblk = n * G * nbd; f.shf = (size_t)sh;
        f.nt = dl__cu_tile_nt(items);
        if (yp) dl__cu_tile_go(d, "conv tiles + activation + avg pool", dl__cut_conv<4>(f));
        else dl__cu_tile_go(d, act < 0 ? "conv tiles" : "conv tiles + activation", f);
    }
    return true;
}

/* where a weight gradient's partials (nch chunks of rows) go: dw itself
   for one chunk, else step memory (NULL: none left) */
static float *dl__cu_wgrad_part(dl__dev *d, float *dw, int64_t nch, int64_t rows)
{
    float *part;
    if (nch <= 1) return DL__CUP(d, dw);
    part = (float *)dl__arena_alloc(d->ctx, &d->data, sizeof(float) * (size_t)(nch * rows), true);
    if (!part) return NULL;
    dl__track_peak(d);
    return DL__CUP(d, part);
}

/* the tiles' weight gradient; false: they do not take it (or no memory
   for the partials: the per-element kernels then may) */
static bool dl__cu_tile_wgrad(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n, const dl__cgeom *g)
{
    const int64_t G = g->G, Cag = g->Ca / G, Cbg = g->Cb / G, rows = g->Cb * Cag * g->K;
    const int64_t PW = dl__cu_tile_rs(dl__cu_tile_span(g->ib[2], g->s[2], g->k[2], g->d[2]));
    const int64_t GW = dl__cu_tile_rs(g->ib[2]);
    int64_t nch, cs, P = 1, rpp = 1, sh = 0, CB = 1, nb = 1, RB, PH = 1, nbd;
    dl__mark mk;
    float *part;
    dl__cut_wgrad f;
    if (DL__CUI(d)->direct != 1 || !dl__cu_tile_2d(g) || !dl__cu_direct_small(g, n) || g->k[2] > DL__CU_TILE_KW)
        return false;
    /* bands of RB output rows (all of them, then halves, quarters ...),
       each with the group's output channels in the fewest even shares
       (CB) whose tiles fit; the parts P give about a block's threads of
       items */
    for (RB = g->ib[1];; RB = (RB + 1) / 2) {
        PH = dl__cu_tile_span(RB, g->s[1], g->k[1], g->d[1]);
        for (nb = 1; nb <= Cbg; nb++) {
            const int64_t ipp = (CB = (Cbg + nb - 1) / nb) * Cag * g->k[1];
            P = (DL__CU_THREADS + ipp - 1) / ipp;
            if (P > RB) P = RB;
            rpp = (RB + P - 1) / P;
            P = (RB + rpp - 1) / rpp;
            sh = Cag * PH * PW + CB * RB * GW + P * ipp * g->k[2];
            if (sh <= DL__CU_TILE_SH) break;
        }
        if (nb <= Cbg || RB == 1) break;
    }
    if (nb > Cbg) return false;
    nbd = (g->ib[1] + RB - 1) / RB;
    nch = n < DL__CU_TILE_CHUNKS ? n : DL__CU_TILE_CHUNKS;
    cs = (n + nch - 1) / nch;
    nch = (n + cs - 1) / cs;
    dl__cu_enter(d);
    mk = dl__arena_mark(&d->data);
    part = dl__cu_wgrad_part(d, dw, nch * nbd, rows);
    if (!part) return false;
    f.part = part; f.x = DL__CUP(d, x); f.gy = DL__CUP(d, gy); f.g = *g; f.n = (int)n; f.cs = (int)cs;
    f.P = (int)P; f.rpp = (int)rpp; f.CB = (int)CB; f.RB = (int)RB; f.nbd = (int)nbd; f.PH = (int)PH;
    f.PW = (int)PW; f.GW = (int)GW; f.shf = (size_t)sh; f.nblk = nch * nbd * G * f.ncb();
    f.nt = dl__cu_tile_nt(P * CB * Cag * g->k[1]);
    dl__cu_tile_go(d, "conv tiles (weight grad)", f);
    if (nch * nbd > 1) {
        dl__cut_psum ps;
        ps.dw = DL__CUP(d, dw); ps.part = part; ps.rows = (int)rows; ps.cnt = (int)(nch * nbd);
        ps.nt = DL__CU_THREADS;
        ps.nblk = (rows + DL__CU_THREADS / 32 - 1) / (DL__CU_THREADS / 32); ps.shf = DL__CU_THREADS;
        dl__cu_tile_go(d, "conv tiles (weight grad sum)", ps);
    }
    dl__arena_rewind(&d->data, mk);
    return true;
}

template <typename I, typename F>
static void dl__cu_direct_go(dl__dev *d, int64_t total, float *y, const float *x, const float *w, const float *b,
                             const dl__cgeom *g, int act)
{
    F f;
    f.y = y; f.x = x; f.w = w; f.b = b; f.g = *g; f.act = act;
    dl__cu_run<I>(d, act < 0 ? "conv direct" : "conv direct + activation", total, f);
}

/* forward (T false) or convT (T true) by the direct path, then the
   activation act (dl__cu_act's; -1: none); false: declined */
static bool dl__cu_direct(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                          const dl__cgeom *g, bool T, int act)
{
    int64_t total = T ? n * g->Ca * g->La : n * g->Cb * g->Lb;
    bool s1 = g->s[0] == 1 && g->s[1] == 1 && g->s[2] == 1;
    if (!dl__cu_direct_ok(DL__CUI(d), g, n)) return false;
    if (dl__cu_tile_fwd(d, y, NULL, x, w, bias, n, g, T, act)) return true;
    dl__cu_enter(d);
    y = DL__CUP(d, y);
    x = DL__CUP(d, x);
    w = DL__CUP(d, w);
    if (bias) bias = DL__CUP(d, bias);
    if (dl__cu_direct_small(g, n)) {
        if (!T) dl__cu_direct_go<int32_t, dl__cuf_dconv<int32_t> >(d, total, y, x, w, bias, g, act);
        else if (s1) dl__cu_direct_go<int32_t, dl__cuf_dconvT<int32_t, true> >(d, total, y, x, w, bias, g, act);
        else dl__cu_direct_go<int32_t, dl__cuf_dconvT<int32_t, false> >(d, total, y, x, w, bias, g, act);
    } else {
        if (!T) dl__cu_direct_go<int64_t, dl__cuf_dconv<int64_t> >(d, total, y, x, w, bias, g, act);
        else if (s1) dl__cu_direct_go<int64_t, dl__cuf_dconvT<int64_t, true> >(d, total, y, x, w, bias, g, act);
        else dl__cu_direct_go<int64_t, dl__cuf_dconvT<int64_t, false> >(d, total, y, x, w, bias, g, act);
    }
    return true;
}

/* the partials (nch chunks of samples), then their sums in order; those
   in the partials' launch (its last block) while they are at most two
   rows a thread of one block (LeNet's first conv: 150 weights; its second,
   2,400, keeps the sums' own launch, a thread per weight) */
template <typename I>
static void dl__cu_direct_wgrad_run(dl__dev *d, float *dw, float *part, const float *x, const float *gy, int64_t n,
                                    int64_t cs, int64_t nch, int64_t rows, const dl__cgeom *g)
{
    dl__cuf_dconvW<I> f;
    dl__cuf_psum<int64_t> ps;
    f.part = part; f.x = x; f.gy = gy; f.n = (I)n; f.cs = (I)cs; f.g = *g;
    ps.dw = dw; ps.part = part; ps.rows = rows; ps.cnt = nch; ps.acc = false;
    if (nch > 1 && rows <= 2 * DL__CU_THREADS) {
        dl__cu_run_fin<I>(d, "conv direct (weight grad)", nch * rows, f, rows, ps);
        return;
    }
    dl__cu_run<I>(d, "conv direct (weight grad)", nch * rows, f);
    if (nch > 1) dl__cu_run<int64_t>(d, "conv direct (weight grad sum)", rows, ps);
}

/* the weight gradient by the direct path; false: declined (or no memory
   for the partials: the caller's path then reports it) */
static bool dl__cu_direct_wgrad(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n,
                                const dl__cgeom *g)
{
    int64_t rows = g->Cb * (g->Ca / g->G) * g->K, nch, cs;
    dl__mark mk;
    float *part;
    if (!dl__cu_direct_ok(DL__CUI(d), g, n)) return false;
    if (dl__cu_tile_wgrad(d, dw, x, gy, n, g)) return true;
    nch = (DL__CU_DIRECT_THREADS + rows - 1) / rows;
    if (nch > n) nch = n;
    cs = (n + nch - 1) / nch;
    nch = (n + cs - 1) / cs;
    /* few weights and few samples, long sums (a long 1-d signal): too few
       threads, each too long a loop; cuBLAS's GEMM splits such sums */
    if (nch * rows < DL__CU_DIRECT_THREADS / 4 && cs * g->Lb > 4096) return false;
    mk = dl__arena_mark(&d->data);
    part = dl__cu_wgrad_part(d, dw, nch, rows);
    if (!part) return false;
    x = DL__CUP(d, x);
    gy = DL__CUP(d, gy);
    if (dl__cu_direct_small(g, n)) dl__cu_direct_wgrad_run<int32_t>(d, DL__CUP(d, dw), part, x, gy, n, cs, nch, rows, g);
    else dl__cu_direct_wgrad_run<int64_t>(d, DL__CUP(d, dw), part, x, gy, n, cs, nch, rows, g);
    dl__arena_rewind(&d->data, mk);
    return true;
}

/* The forward (T false) and the transposed conv (T true), the one GEMM
   read the other way:
     conv_i2c   y (n, Cb, ib...) = conv(x, w) + bias (Cb). Per chunk,
                im2col, then one strided-batched GEMM, w (Cb, CaK) the
                shared left operand, that writes each sample's (Cb, Lb)
                block of y in place;
     convT_i2c  y (n, Ca, ia...) = convT(x (n, Cb, ib...), w) + bias (Ca):
                conv's input gradient. Per chunk, one strided-batched GEMM
                col_s (CaK, Lb) = w^T x_s (Cb, Lb) that writes each
                sample's columns of col in place (x read where it lies),
                then col2im's gather into y.
   1x1: y_s = w x_s (w^T x_s), one GEMM for all n. Each element is the sum
   dl.h's whole-batch path computes. */
static bool dl__cu_conv_run(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                            const dl__cgeom *g, bool T)
{
    int64_t caK = g->Ca * g->K, nb, n0;
    int64_t Cx = T ? g->Cb : g->Ca, Lx = T ? g->Lb : g->La, Cy = T ? g->Ca : g->Cb, Ly = T ? g->La : g->Lb;
    dl__mark mk;
    float *col;
    bool ok = dl__cu_conv_ok(g, n);
#ifdef DL_CUDNN
    if (ok && dl__dnn_conv(d, T ? DL__DNN_DATA : DL__DNN_FWD, y, x, w, n, g)) {
        if (bias) dl__cu_bias_add(d, y, bias, n, Cy, Ly);
        return true;
    }
#endif
    if (dl__cu_direct(d, y, x, w, bias, n, g, T, -1)) return true;
    if (!ok) return false;
    if (dl__cu_pointwise(g)) {   /* y_s (Cy, L) = w or w^T (Cy, Cx) x_s (Cx, L), w stored (Cb, Ca) */
        dl__cu_cgemm(d, T, false, Cy, Ly, Cx, w, g->Ca, 0, x, Lx, Cx * Lx, 0.0f, y, Ly, Cy * Ly, n);
    } else {
        mk = dl__arena_mark(&d->data);
        col = dl__cu_chunks(d, caK * g->Lb, n, g->Lb, &nb);
        if (!col) return false;
        for (n0 = 0; n0 < n; n0 += nb) {
            int64_t cnt = n - n0 < nb ? n - n0 : nb;
            const float *xs = x + n0 * Cx * Lx;
            float *ys = y + n0 * Cy * Ly;
            if (!T) dl__cu_im2col(d, col, xs, cnt, g);
            if (T) dl__cu_cgemm(d, true, false, caK, g->Lb, g->Cb, w, caK, 0, xs, g->Lb, g->Cb * g->Lb, 0.0f, col,
                                cnt * g->Lb, g->Lb, cnt);
            else dl__cu_cgemm(d, false, false, g->Cb, g->Lb, caK, w, caK, 0, col, cnt * g->Lb, g->Lb, 0.0f, ys,
                              g->Lb, g->Cb * g->Lb, cnt);
            if (T) dl__cu_col2im(d, ys, col, cnt, g);
        }
        dl__arena_rewind(&d->data, mk);
    }
    if (bias) dl__cu_bias_add(d, y, bias, n, Cy, Ly);
    return true;
}

static bool dl__cu_conv_i2c(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                            const dl__cgeom *g)
{
    return dl__cu_conv_run(d, y, x, w, bias, n, g, false);
}

static bool dl__cu_convT_i2c(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                             const dl__cgeom *g)
{
    return dl__cu_conv_run(d, y, x, w, bias, n, g, true);
}

/* the pooled launch (dl__cuf_dconv_pool) with index type I */
template <typename I>
static void dl__cu_dconv_pool_go(dl__dev *d, float *y, float *yp, const float *x, const float *w, const float *bias,
                                 int64_t n, const dl__cgeom *g, int act)
{
    dl__cuf_dconv_pool<I> f;
    f.c.y = DL__CUP(d, y); f.c.x = DL__CUP(d, x); f.c.w = DL__CUP(d, w); f.c.b = bias ? DL__CUP(d, bias) : NULL;
    f.c.g = *g; f.c.act = act; f.yp = DL__CUP(d, yp);
    dl__cu_run<I>(d, "conv direct + activation + avg pool", n * g->Cb * g->Lb / 4, f);
}

/* A convolution and the activation after it as one launch
   (dl__backend.conv_act), where the direct path would take the conv and
   cuDNN is not asked to: each output element is act(sum + bias), the
   value the direct path then the unary kernel give, written once (a
   launch and two passes over y fewer); false, doing nothing, elsewhere. */
static bool dl__cu_conv_act(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                            const dl__cgeom *g, int act, float *yp)
{
#ifdef DL_CUDNN
    if (dl__dnn_may(DL__CUI(d), g) && dl__cu_conv_ok(g, n)) return false;
#endif
    if (!dl__cu_direct_ok(DL__CUI(d), g, n)) return false;
    if (y && !yp) return dl__cu_direct(d, y, x, w, bias, n, g, false, act);
    if (g->ib[0] != 1 || g->ib[1] % 2 || g->ib[2] % 2) return false;   /* the pool: 2-d, even H and W */
    if (!y) return true;                                               /* the answer only */
    if (dl__cu_tile_fwd(d, y, yp, x, w, bias, n, g, false, act)) return true;
    dl__cu_enter(d);
    if (dl__cu_direct_small(g, n)) dl__cu_dconv_pool_go<int32_t>(d, y, yp, x, w, bias, n, g, act);
    else dl__cu_dconv_pool_go<int64_t>(d, y, yp, x, w, bias, n, g, act);
    return true;
}

/* one launch for the weight gradient's two operands of a chunk: col (CaK,
   cnt, Lb) = im2col(x), then gt (Cb, cnt, Lb) = gy (cnt, Cb, Lb) reordered */
template <typename I>
struct dl__cuf_i2c_gt {
    float *col, *gt; const float *x, *gy; I n, ncol; dl__cgeom g;
    DL__HD void operator()(I e) const
    {
        if (e < ncol) {
            col[e] = dl__cu_i2c_at<I>(x, n, g, e);
        } else {
            I f = e - ncol, Lb = (I)g.Lb, row = f / Lb, pos = f - row * Lb, s = row % n, cb = row / n;
            gt[f] = gy[(s * (I)g.Cb + cb) * Lb + pos];
        }
    }
};


/* The backend's conv_i2c_wgrad: dw (Cb, CaK) = sum_s gy_s (Cb, Lb) col_s^T.
   The sum runs over (s, l), but gy is laid out (n, Cb, Lb): its columns
   (s, l) are not one stride apart, so no single GEMM reads it in place.
   Two ways, chosen by the bytes they add to im2col's per sample:
     partials  a strided-batched GEMM writes each sample's product
               part_s (Cb, CaK) (K = Lb), then one pass sums them over s
               in order into dw: 2 Cb CaK floats moved a sample (1x1: on x
               itself, no im2col);
     reorder   gy's chunk copied to (Cb, cnt, Lb) in im2col's launch, then
               one GEMM with K = cnt Lb accumulates into dw: 2 Cb Lb a
               sample.
   Partials when CaK < Lb (1x1: Ca Cb < (Ca + Cb) Lb, the reorder copying x
   too): early, wide layers (LeNet's first conv: 300 floats a sample against
   9,408; a ResNet's 3x3 on 64 channels at 28x28: 73,728 against 100,352);
   the reorder for deep ones (512 channels at 4x4: 16,384 against 4,718,592
   for the partials). Both sum in a fixed order: the same bits every run.
   Launches a chunk: 3 (im2col, GEMM, sum; 1x1: 2) or 2. */
static bool dl__cu_conv_i2c_wgrad(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n,
                                  const dl__cgeom *g)
{
    int64_t caK = g->Ca * g->K, rows = g->Cb * caK, nb, n0;
    bool pw = dl__cu_pointwise(g), partials;
    dl__mark mk;
    float *sc;
    bool ok = dl__cu_conv_ok(g, n);
    dl__cu_enter(d);
#ifdef DL_CUDNN
    if (ok && dl__dnn_conv(d, DL__DNN_FILTER, dw, x, gy, n, g)) return true;
#endif
    if (dl__cu_direct_wgrad(d, dw, x, gy, n, g)) return true;
    if (!ok) return false;
    partials = pw ? g->Ca * g->Cb < (g->Ca + g->Cb) * g->Lb : caK < g->Lb;
    mk = dl__arena_mark(&d->data);
    sc = dl__cu_chunks(d, partials ? rows + (pw ? 0 : caK * g->Lb) : (caK + g->Cb) * g->Lb, n, g->Lb, &nb);
    if (!sc) return false;
    for (n0 = 0; n0 < n; n0 += nb) {
        int64_t cnt = n - n0 < nb ? n - n0 : nb;
        const float *xs = x + n0 * g->Ca * g->La, *gs = gy + n0 * g->Cb * g->Lb;
        if (partials) {
            float *part = sc, *col = sc + nb * rows;
            int64_t tot = cnt * rows;
            if (!pw) dl__cu_im2col(d, col, xs, cnt, g);
            dl__cu_cgemm(d, false, true, g->Cb, caK, g->Lb, gs, g->Lb, g->Cb * g->Lb, pw ? xs : col,
                         pw ? g->La : cnt * g->Lb, pw ? g->Ca * g->La : g->Lb, 0.0f, part, caK, rows, cnt);
            if (dl__cu_small(tot)) {
                dl__cuf_psum<int32_t> f;
                f.dw = DL__CUP(d, dw); f.part = DL__CUP(d, part); f.rows = (int32_t)rows; f.cnt = (int32_t)cnt;
                f.acc = n0 > 0;
                dl__cu_run<int32_t>(d, "conv weight grad (sum)", rows, f);
            } else {
                dl__cuf_psum<int64_t> f;
                f.dw = DL__CUP(d, dw); f.part = DL__CUP(d, part); f.rows = rows; f.cnt = cnt; f.acc = n0 > 0;
                dl__cu_run<int64_t>(d, "conv weight grad (sum)", rows, f);
            }
        } else {
            float *col = sc, *gt = sc + nb * caK * g->Lb;
            int64_t ncol = caK * cnt * g->Lb, tot = ncol + g->Cb * cnt * g->Lb;
            if (dl__cu_small(tot) && dl__cu_small(cnt * g->Ca * g->La) && dl__cu_small(cnt * g->Cb * g->Lb)) {
                dl__cuf_i2c_gt<int32_t> f;
                f.col = DL__CUP(d, col); f.gt = DL__CUP(d, gt); f.x = DL__CUP(d, xs); f.gy = DL__CUP(d, gs);
                f.n = (int32_t)cnt; f.ncol = (int32_t)ncol; f.g = *g;
                dl__cu_run<int32_t>(d, "conv weight grad (im2col)", tot, f);
            } else {
                dl__cuf_i2c_gt<int64_t> f;
                f.col = DL__CUP(d, col); f.gt = DL__CUP(d, gt); f.x = DL__CUP(d, xs); f.gy = DL__CUP(d, gs);
                f.n = cnt; f.ncol = ncol; f.g = *g;
                dl__cu_run<int64_t>(d, "conv weight grad (im2col)", tot, f);
            }
            dl__cu_cgemm(d, false, true, g->Cb, caK, cnt * g->Lb, gt, cnt * g->Lb, 0, col, cnt * g->Lb, 0,
                         n0 > 0 ? 1.0f : 0.0f, dw, caK, 0, 1);
        }
    }
    dl__arena_rewind(&d->data, mk);
    return true;
}

/* ===========================================================================
 * Pooling
 * ========================================================================= */

/* dl__pwin of the CPU backend (window of output o along dim i) */
static DL__HD inline void dl__cu_pwin(const dl__pgeom &g, int i, int64_t o, int64_t *lo, int64_t *hi,
                                      int64_t *padded)
{
    if (g.adaptive) {
        *lo = o * g.ia[i] / g.ob[i];
        *hi = ((o + 1) * g.ia[i] + g.ob[i] - 1) / g.ob[i];
        *padded = *hi - *lo;
    } else {
        int64_t a = o * g.s[i] - g.p[i], b = a + g.k[i];
        if (b > g.ia[i] + g.p[i]) b = g.ia[i] + g.p[i];
        *padded = b - a;
        *lo = a < 0 ? 0 : a;
        *hi = b > g.ia[i] ? g.ia[i] : b;
    }
}

/* one output of one plane, the CPU's loop: the first maximum, NaN wins */
struct dl__cuf_maxpool {
    float *y; int64_t *idx; const float *x; dl__pgeom g;
    DL__HD void operator()(int64_t e) const
    {
        int64_t q = e / g.Lb, oi = e - q * g.Lb, o[3], st[3], en[3], j0, j1, j2, best = -1;
        const float *xp = x + q * g.La;
        float m = -INFINITY;
        int i;
        o[2] = oi % g.ob[2];
        o[1] = (oi / g.ob[2]) % g.ob[1];
        o[0] = oi / (g.ob[2] * g.ob[1]);
        for (i = 0; i < 3; i++) {
            st[i] = o[i] * g.s[i] - g.p[i];
            en[i] = st[i] + (g.k[i] - 1) * g.d[i] + 1;
            if (en[i] > g.ia[i]) en[i] = g.ia[i];
            while (st[i] < 0) st[i] += g.d[i];
        }
        for (j0 = st[0]; j0 < en[0]; j0 += g.d[0])
            for (j1 = st[1]; j1 < en[1]; j1 += g.d[1])
                for (j2 = st[2]; j2 < en[2]; j2 += g.d[2]) {
                    int64_t at = (j0 * g.ia[1] + j1) * g.ia[2] + j2;
                    float v = xp[at];
                    if (best < 0 || v > m || v != v) { m = v; best = at; }
                }
        y[e] = m;
        if (idx) idx[e] = best;
    }
};

static void dl__cu_max_pool(dl__dev *d, float *y, int64_t *idx, const float *x, int64_t planes,
                            const dl__pgeom *g)
{
    dl__cuf_maxpool f;
    dl__cu_enter(d);
    f.y = DL__CUP(d, y); f.idx = idx ? DL__CUP(d, idx) : NULL; f.x = DL__CUP(d, x); f.g = *g;
    dl__cu_run<int64_t>(d, "max_pool", planes * g->Lb, f);
}

/* one plane at a time, the CPU's loop (the emulated device's unpool) */
struct dl__cuf_unpool_plane {
    float *dx; const float *g; const int64_t *idx; int64_t Lin, Lout;
    DL__HD void operator()(int64_t q) const
    {
        float *d = dx + q * Lin;
        const float *gq = g + q * Lout;
        const int64_t *iq = idx + q * Lout;
        int64_t j, o;
        for (j = 0; j < Lin; j++) d[j] = 0.0f;
        for (o = 0; o < Lout; o++)
            if (iq[o] >= 0 && iq[o] < Lin) d[iq[o]] = dl__cu_fadd(d[iq[o]], gq[o]);
    }
};

/* One warp per plane: zero it, then 32 outputs at a time; lanes aiming at
   the same input (__match_any_sync) are added by the lowest of them in lane
   order, so every input sums its outputs in ascending order, as the CPU. */
__global__ void __launch_bounds__(DL__CU_THREADS)
dl__cu_unpool_warp(float *dx, const float *g, const int64_t *idx, int64_t planes, int64_t Lin, int64_t Lout)
{
    DL__CU_PDL_ENTER();
    __shared__ float sv[DL__CU_THREADS];
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, wb = threadIdx.x & ~31;
    int64_t q = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (; q < planes; q += nw) {
        float *d = dx + q * Lin;
        const float *gq = g + q * Lout;
        const int64_t *iq = idx + q * Lout;
        int64_t j, base;
        for (j = lane; j < Lin; j += 32) d[j] = 0.0f;
        __syncwarp();
        for (base = 0; base < Lout; base += 32) {
            int64_t o = base + lane, t = o < Lout ? iq[o] : -1;
            bool ok = t >= 0 && t < Lin;
            unsigned long long key = ok ? (unsigned long long)t : ~0ull - (unsigned long long)lane;
            unsigned grp;
            sv[threadIdx.x] = ok ? gq[o] : 0.0f;
            grp = __match_any_sync(full, key);
            __syncwarp();
            if (ok && lane == __ffs(grp) - 1) {
                float s = d[t];
                unsigned mm = grp;
                while (mm) {
                    s = dl__cu_fadd(s, sv[wb + __ffs(mm) - 1]);
                    mm &= mm - 1;
                }
                d[t] = s;
            }
            __syncwarp();
        }
    }
}

static void dl__cu_unpool(dl__dev *d, float *dx, const float *g, const int64_t *idx, int64_t planes,
                          int64_t Lin, int64_t Lout)
{
    dl__cuimpl *m = dl__cu_enter(d);
    dx = DL__CUP(d, dx);
    g = DL__CUP(d, g);
    idx = DL__CUP(d, idx);
    if (planes <= 0) return;
    if (m->emulate) {
        dl__cuf_unpool_plane f;
        f.dx = dx; f.g = g; f.idx = idx; f.Lin = Lin; f.Lout = Lout;
        dl__cu_run<int64_t>(d, "unpool", planes, f);
        return;
    }
    dl__cu_go(m, dl__cu_unpool_warp, dl__cu_grid(m, planes, DL__CU_THREADS / 32), DL__CU_THREADS, 0, dx, g, idx,
              planes, Lin, Lout);
    dl__cu_launched(d, "unpool");
}

struct dl__cuf_gather {
    float *y; const float *x; const int64_t *idx; int64_t Lin, Lout;
    DL__HD void operator()(int64_t e) const
    {
        int64_t q = e / Lout, t = idx[e];
        y[e] = (t >= 0 && t < Lin) ? x[q * Lin + t] : 0.0f;
    }
};

static void dl__cu_gather(dl__dev *d, float *y, const float *x, const int64_t *idx, int64_t planes,
                          int64_t Lin, int64_t Lout)
{
    dl__cuf_gather f;
    dl__cu_enter(d);
    f.y = DL__CUP(d, y); f.x = DL__CUP(d, x); f.idx = DL__CUP(d, idx); f.Lin = Lin; f.Lout = Lout;
    dl__cu_run<int64_t>(d, "gather", planes * Lout, f);
}

/* ---- embedding (dl__backend.embed, embed_bwd) ----
   Forward: a thread per element of y (per index where D is 0), the first
   bad index by atomicMin as class_mask's. Backward in idx's order without
   atomics on floats: a thread per row v of dw finds where its indices lie
   (off[v]: the valid indices below v, cnt[v]: those equal to v) and lists
   their positions in ascending order (perm, a stable counting sort; each
   thread reads all of idx: V n compares, a broadcast per warp); then a
   thread per element of dw adds its rows of g in that order from 0, as the
   CPU's loop (the same bits). */
struct dl__cuf_embed {
    float *y; const float *w; const void *idx; bool i64; int64_t V, D, zrow;
    unsigned long long *res;
    DL__HD void operator()(int64_t e) const
    {
        int64_t Dk = D > 0 ? D : 1, i = e / Dk, c = e - i * Dk, t = dl__emb_at(idx, i64, i);
        bool ok = t >= 0 && t < V;
        if (!ok && res && c == 0) dl__cu_min_index(res, i);
        if (D > 0) y[e] = ok && t != zrow ? w[t * D + c] : 0.0f;
    }
};

static int64_t dl__cu_embed(dl__dev *d, float *y, const float *w, const void *idx, bool i64, int64_t n, int64_t V,
                            int64_t D, int64_t zrow, int64_t *bad)
{
    dl__cuimpl *m = dl__cu_enter(d);
    dl__cuf_embed f;
    if (n <= 0) return -1;
    f.y = DL__CUP(d, y); f.w = DL__CUP(d, w); f.idx = DL__CUP(d, idx); f.i64 = i64;
    f.V = V; f.D = D; f.zrow = zrow;
    /* inside a capture no check (as class_mask): a bad index reads zeros */
    if (!m->cap) dl__cu_memset(d, m->dres, 0xff, sizeof(unsigned long long));
    f.res = m->cap ? NULL : (unsigned long long *)m->dres;
    dl__cu_run<int64_t>(d, "embed", n * (D > 0 ? D : 1), f);
    if (m->cap) return -1;
    return dl__cu_bad_target(d, i64 ? (const int64_t *)f.idx : NULL, i64 ? NULL : (const int32_t *)f.idx, bad,
                             "embed");
}

struct dl__cuf_embb_list {
    const void *idx; bool i64; int64_t n, V, pad; int64_t *perm, *off, *cnt;
    DL__HD void operator()(int64_t v) const
    {
        int64_t i, below = 0, c = 0, k = 0;
        for (i = 0; i < n; i++) {
            int64_t t = dl__emb_at(idx, i64, i);
            if (t < 0 || t >= V || t == pad) continue;
            below += t < v;
            c += t == v;
        }
        off[v] = below;
        cnt[v] = c;
        for (i = 0; k < c && i < n; i++)
            if (dl__emb_at(idx, i64, i) == v) perm[below + k++] = i;
    }
};

struct dl__cuf_embb_sum {
    float *dw; const float *g; const int64_t *perm, *off, *cnt; int64_t D;
    DL__HD void operator()(int64_t e) const
    {
        int64_t v = e / D, c = e - v * D, k, o = off[v], nk = cnt[v];
        float s = 0.0f;
        for (k = 0; k < nk; k++) s = dl__cu_fadd(s, g[perm[o + k] * D + c]);
        dw[e] = s;
    }
};

static void dl__cu_embed_bwd(dl__dev *d, float *dw, const float *g, const void *idx, bool i64, int64_t n,
                             int64_t V, int64_t D, int64_t pad, int64_t *scratch)
{
    dl__cuf_embb_list fl;
    dl__cuf_embb_sum fs;
    dl__cu_enter(d);
    if (V <= 0 || D <= 0) return;
    scratch = DL__CUP(d, scratch);
    fl.idx = DL__CUP(d, idx); fl.i64 = i64;
    fl.n = n; fl.V = V; fl.pad = pad;
    fl.perm = scratch; fl.off = scratch + n; fl.cnt = scratch + n + V;
    dl__cu_run<int64_t>(d, "embed_bwd_list", V, fl);
    fs.dw = DL__CUP(d, dw); fs.g = DL__CUP(d, g); fs.perm = fl.perm; fs.off = fl.off; fs.cnt = fl.cnt; fs.D = D;
    dl__cu_run<int64_t>(d, "embed_bwd_sum", V * D, fs);
}

/* dtype conversion: a thread per element, dl__convert_at (the CPU's) */
struct dl__cuf_convert {
    void *y; const void *x; int yt, xt;
    DL__HD void operator()(int64_t i) const { dl__convert_at(y, yt, x, xt, i); }
};
static void dl__cu_convert(dl__dev *d, void *y, int yt, const void *x, int xt, int64_t n)
{
    dl__cuf_convert f;
    dl__cu_enter(d);
    f.y = DL__CUP(d, y); f.x = DL__CUP(d, x); f.yt = yt; f.xt = xt;
    dl__cu_run<int64_t>(d, "convert", n, f);
}

/* torch.where: a thread per element (a NULL a or b: the value) */
struct dl__cuf_select {
    float *y; const float *c, *a, *b; float av, bv;
    DL__HD void operator()(int64_t i) const { y[i] = c[i] != 0.0f ? (a ? a[i] : av) : (b ? b[i] : bv); }
};
static void dl__cu_select(dl__dev *d, float *y, const float *c, const float *a, const float *b, int64_t n,
                          float av, float bv)
{
    dl__cuf_select f;
    dl__cu_enter(d);
    f.y = DL__CUP(d, y); f.c = DL__CUP(d, c); f.a = a ? DL__CUP(d, a) : NULL; f.b = b ? DL__CUP(d, b) : NULL;
    f.av = av; f.bv = bv;
    dl__cu_run<int64_t>(d, "select", n, f);
}

/* a loader's batch from the dataset kept on the device as bytes: one
   thread per output pixel, dl__batch_px (the CPU's math, in double where a
   contraction could change it); the thread of a sample's pixel 0 copies its
   label (a thread per sample when samples are empty: only labels). The
   sample order and each sample's crop and flip (plan) come from the host
   once per epoch. */
template <typename I>
struct dl__cuf_load_batch {
    float *x; int64_t *y; const uint8_t *data; const int64_t *labels, *plan; dl__batchgeom g;
    DL__HD void operator()(I e) const
    {
        I sn = g.sn ? (I)g.sn : (I)1, j = e / sn, r = e - j * sn;
        int64_t i = plan[2 * (int64_t)j];
        if (g.sn) x[e] = dl__batch_px(data + i * g.sn, (int64_t)r, plan[2 * (int64_t)j + 1], &g);
        if (r == 0) y[j] = labels[i];
    }
};

static void dl__cu_load_batch(dl__dev *d, float *x, int64_t *y, const uint8_t *data, const int64_t *labels,
                              const int64_t *plan, int64_t cnt, const dl__batchgeom *g)
{
    int64_t n = cnt * (g->sn ? g->sn : 1);
    dl__cu_enter(d);
    if (dl__cu_small(n)) {
        dl__cuf_load_batch<int32_t> f;
        f.x = DL__CUP(d, x); f.y = DL__CUP(d, y); f.data = DL__CUP(d, data); f.labels = DL__CUP(d, labels);
        f.plan = DL__CUP(d, plan); f.g = *g;
        dl__cu_run<int32_t>(d, "load_batch", n, f);
    } else {
        dl__cuf_load_batch<int64_t> f;
        f.x = DL__CUP(d, x); f.y = DL__CUP(d, y); f.data = DL__CUP(d, data); f.labels = DL__CUP(d, labels);
        f.plan = DL__CUP(d, plan); f.g = *g;
        dl__cu_run<int64_t>(d, "load_batch", n, f);
    }
}

/* one output: the mean of its window, the CPU's loop (in double past
   DL__AVG_DSUM elements) */
struct dl__cuf_avgpool {
    float *y; const float *x; dl__pgeom g;
    DL__HD void operator()(int64_t e) const
    {
        int64_t q = e / g.Lb, oi = e - q * g.Lb, o0, o1, o2, l[3], h[3], pc[3], j0, j1, j2, div;
        const float *xp = x + q * g.La;
        float s = 0.0f;
        double sd = 0.0;
        bool dsum;
        o2 = oi % g.ob[2];
        o1 = (oi / g.ob[2]) % g.ob[1];
        o0 = oi / (g.ob[2] * g.ob[1]);
        dl__cu_pwin(g, 0, o0, &l[0], &h[0], &pc[0]);
        dl__cu_pwin(g, 1, o1, &l[1], &h[1], &pc[1]);
        dl__cu_pwin(g, 2, o2, &l[2], &h[2], &pc[2]);
        if (l[0] >= h[0] || l[1] >= h[1] || l[2] >= h[2]) { y[e] = 0.0f; return; }
        div = (g.count_include_pad || g.adaptive) ? pc[0] * pc[1] * pc[2]
                                                  : (h[0] - l[0]) * (h[1] - l[1]) * (h[2] - l[2]);
        dsum = (h[0] - l[0]) * (h[1] - l[1]) * (h[2] - l[2]) > DL__AVG_DSUM;
        for (j0 = l[0]; j0 < h[0]; j0++)
            for (j1 = l[1]; j1 < h[1]; j1++)
                for (j2 = l[2]; j2 < h[2]; j2++) {
                    float v = xp[(j0 * g.ia[1] + j1) * g.ia[2] + j2];
                    if (dsum) sd = dl__cu_dadd(sd, (double)v);
                    else s = dl__cu_fadd(s, v);
                }
        y[e] = dsum ? (float)dl__cu_ddiv(sd, (double)div) : dl__cu_fdiv(s, (float)div);
    }
};

static void dl__cu_avg_pool(dl__dev *d, float *y, const float *x, int64_t planes, const dl__pgeom *g)
{
    dl__cuf_avgpool f;
    dl__cu_enter(d);
    f.y = DL__CUP(d, y); f.x = DL__CUP(d, x); f.g = *g;
    dl__cu_run<int64_t>(d, "avg_pool", planes * g->Lb, f);
}

/* outputs of dim i whose windows may hold input j: [*lo, *hi] (checked
   against dl__cu_pwin by the caller) */
static DL__HD inline void dl__cu_pcand(const dl__pgeom &g, int i, int64_t j, int64_t *lo, int64_t *hi)
{
    int64_t a, b;
    if (g.adaptive) {
        a = j * g.ob[i] / g.ia[i] - 1;
        b = ((j + 1) * g.ob[i] + g.ia[i] - 1) / g.ia[i];
    } else {
        int64_t t = j + g.p[i] - g.k[i];
        a = t < 0 ? 0 : t / g.s[i];
        b = (j + g.p[i]) / g.s[i];
    }
    *lo = a < 0 ? 0 : a;
    *hi = b > g.ob[i] - 1 ? g.ob[i] - 1 : b;
}

/* the adjoint, gathered: input element e sums y[o] / divisor(o) over the
   outputs o whose windows hold it, in ascending o (the CPU's order) */
struct dl__cuf_avgpool_adj {
    float *dx; const float *gy; dl__pgeom g;
    DL__HD void operator()(int64_t e) const
    {
        int64_t q = e / g.La, pos = e - q * g.La, j[3], lo[3], hi[3], o0, o1, o2;
        int64_t l[3], h[3], pc[3];
        const float *yp = gy + q * g.Lb;
        float acc = 0.0f;
        int i;
        j[2] = pos % g.ia[2];
        j[1] = (pos / g.ia[2]) % g.ia[1];
        j[0] = pos / (g.ia[2] * g.ia[1]);
        for (i = 0; i < 3; i++) dl__cu_pcand(g, i, j[i], &lo[i], &hi[i]);
        for (o0 = lo[0]; o0 <= hi[0]; o0++) {
            dl__cu_pwin(g, 0, o0, &l[0], &h[0], &pc[0]);
            if (j[0] < l[0] || j[0] >= h[0]) continue;
            for (o1 = lo[1]; o1 <= hi[1]; o1++) {
                dl__cu_pwin(g, 1, o1, &l[1], &h[1], &pc[1]);
                if (j[1] < l[1] || j[1] >= h[1]) continue;
                for (o2 = lo[2]; o2 <= hi[2]; o2++) {
                    int64_t div;
                    dl__cu_pwin(g, 2, o2, &l[2], &h[2], &pc[2]);
                    if (j[2] < l[2] || j[2] >= h[2]) continue;
                    div = (g.count_include_pad || g.adaptive) ? pc[0] * pc[1] * pc[2]
                                                              : (h[0] - l[0]) * (h[1] - l[1]) * (h[2] - l[2]);
                    acc = dl__cu_fadd(acc, dl__cu_fdiv(yp[(o0 * g.ob[1] + o1) * g.ob[2] + o2], (float)div));
                }
            }
        }
        dx[e] = acc;
    }
};

static void dl__cu_avg_pool_adj(dl__dev *d, float *dx, const float *gy, int64_t planes, const dl__pgeom *g)
{
    dl__cuf_avgpool_adj f;
    dl__cu_enter(d);
    f.dx = DL__CUP(d, dx); f.gy = DL__CUP(d, gy); f.g = *g;
    dl__cu_run<int64_t>(d, "avg_pool_adj", planes * g->La, f);
}

/* ===========================================================================
 * Fused normalization: batch norm over x (N, C, L) per channel, layer norm
 * over the rows of x (rows, cols)
 * ========================================================================= */

/* The per-job routines below (a channel, a row) are written once for a
   group of G threads: thread t of G strides over the job's elements, then
   red() combines the group's partial sums with a fixed tree. The emulated
   device runs them with t = 0, G = 1 and red() the identity: exactly the
   CPU's sequential loop. */
struct dl__cu_seqsum {
    DL__HD double operator()(double v) const { return v; }
};

template <int G>
struct dl__cu_grpsum {
    double *sh;
    DL__HD double operator()(double v) const
    {
#ifdef __CUDA_ARCH__
        return dl__cu_group_all<DL__R_SUM, G>(v, sh);
#else
        return v;
#endif
    }
};

/* jobs [0, njobs), one per group of G threads (G = 32: a warp; 256: a block) */
template <int G, typename J>
__global__ void __launch_bounds__(DL__CU_THREADS) dl__cu_groups_k(int64_t njobs, J job)
{
    DL__CU_PDL_ENTER();
    __shared__ double sh[9];
    const int gpb = DL__CU_THREADS / G;
    dl__cu_grpsum<G> red;
    int64_t j;
    red.sh = sh;
    for (j = (int64_t)blockIdx.x * gpb + threadIdx.x / G; j < njobs; j += (int64_t)gridDim.x * gpb)
        job(red, j, threadIdx.x % G, G);
}

template <typename J>
struct dl__cuf_seqjob {
    J job;
    DL__HD void operator()(int64_t j) const { job(dl__cu_seqsum(), j, 0, 1); }
};

/* Runs job j for j in [0, njobs), each over about `per` elements: a warp per
   job up to 1024 of them, else a block (emulated: the sequential loop). */
template <typename J>
static void dl__cu_groups(dl__dev *d, const char *name, int64_t njobs, int64_t per, const J &job)
{
    dl__cuimpl *m = DL__CUI(d);
    if (njobs <= 0) return;
    if (m->emulate) {
        dl__cuf_seqjob<J> f;
        f.job = job;
        dl__cu_run<int64_t>(d, name, njobs, f);
        return;
    }
    if (per <= 1024)
        dl__cu_go(m, dl__cu_groups_k<32, J>, dl__cu_grid(m, njobs, DL__CU_THREADS / 32), DL__CU_THREADS, 0, njobs,
                  job);
    else
        dl__cu_go(m, dl__cu_groups_k<DL__CU_THREADS, J>, dl__cu_grid(m, njobs, 1), DL__CU_THREADS, 0, njobs, job);
    dl__cu_launched(d, name);
}

/* row r of x (rows, n): mean, invstd, y (dl__ln_fwd_task) */
struct dl__cuj_ln_fwd {
    float *y, *mean, *invstd; const float *x, *w, *b; int64_t n; float eps;
    template <typename R>
    DL__HD void operator()(const R &red, int64_t r, int64_t t, int64_t G) const
    {
        const float *xr = x + r * n;
        float *yr = y + r * n, m, is;
        double s = 0, q = 0, md;
        int64_t j;
        for (j = t; j < n; j += G) s = dl__cu_dadd(s, (double)xr[j]);
        s = red(s);
        md = n ? s / (double)n : 0.0;
        for (j = t; j < n; j += G) {
            double dv = (double)xr[j] - md;
            q = dl__cu_dadd(q, dl__cu_dmul(dv, dv));
        }
        q = red(q);
        m = (float)md;
        is = (float)(1.0 / sqrt((n ? q / (double)n : 0.0) + (double)eps));
        if (t == 0) { mean[r] = m; invstd[r] = is; }
        for (j = t; j < n; j += G) {
            float v = dl__cu_fmul(dl__cu_fsub(xr[j], m), is);
            if (w) v = dl__cu_fmul(v, w[j]);
            if (b) v = dl__cu_fadd(v, b[j]);
            yr[j] = v;
        }
    }
};

/* row r: dx = invstd (gw - mean(gw) - xhat mean(gw xhat)), gw = g w (dl__ln_dx_task) */
struct dl__cuj_ln_dx {
    float *dx; const float *g, *x, *mean, *invstd, *w; int64_t n;
    template <typename R>
    DL__HD void operator()(const R &red, int64_t r, int64_t t, int64_t G) const
    {
        const float *xr = x + r * n, *gr = g + r * n;
        float *dr = dx + r * n, m = mean[r], is = invstd[r], a, bb;
        double sa = 0, sb = 0;
        int64_t j;
        for (j = t; j < n; j += G) {
            double gw = dl__cu_dmul((double)gr[j], (double)(w ? w[j] : 1.0f));
            sa = dl__cu_dadd(sa, gw);
            sb = dl__cu_dadd(sb, dl__cu_dmul(gw, (double)dl__cu_fmul(dl__cu_fsub(xr[j], m), is)));
        }
        sa = red(sa);
        sb = red(sb);
        a = (float)(sa / (double)n);
        bb = (float)(sb / (double)n);
        for (j = t; j < n; j += G) {
            float gw = dl__cu_fmul(gr[j], w ? w[j] : 1.0f);
            float xh = dl__cu_fmul(dl__cu_fmul(dl__cu_fsub(xr[j], m), is), bb);
            dr[j] = dl__cu_fmul(is, dl__cu_fsub(dl__cu_fsub(gw, a), xh));
        }
    }
};

/* column j of the rows: dw = sum(g xhat), db = sum(g), rows in order (dl__ln_dwb_task) */
struct dl__cuf_ln_dwb {
    float *dw, *db; const float *g, *x, *mean, *invstd; int64_t rows, cols;
    DL__HD void operator()(int64_t j) const
    {
        double sw = 0, sb = 0;
        int64_t r;
        for (r = 0; r < rows; r++) {
            float gv = g[r * cols + j];
            float xh = dl__cu_fmul(dl__cu_fsub(x[r * cols + j], mean[r]), invstd[r]);
            sw = dl__cu_dadd(sw, dl__cu_dmul((double)gv, (double)xh));
            sb = dl__cu_dadd(sb, (double)gv);
        }
        if (dw) dw[j] = (float)sw;
        if (db) db[j] = (float)sb;
    }
};

/* ---- Batch norm over x (N, C, L): every channel split over many blocks.

   Channel c has M = N L elements; element k = n L + l of it lies at
   (n C + c) L + l. The sums (statistics: of d = x - K and d^2 with K =
   x[c L], the channel's first element, as the CPU's one-pass shifted sums;
   backward: of g and g (x - mean)) run in two passes:
     pass 1  S chunks per channel, S = ceil(DL__CU_BN_BLOCKS / C) (at most
             M), one block of 256 threads per chunk: thread t sums the
             chunk's elements t, t + 256, ... in order, in double, then the
             block's fixed tree (dl__cu_group_all); 2 doubles a chunk;
     pass 2  a thread per channel adds its S partials in order s = 0, 1 ...
             and finishes as the CPU (dl__bn_stats_fin, dl__bn_sums_fin).
             It runs in pass 1's launch, in the block that finishes last
             (dl__cu_last_block's ticket). A launch fewer per pass: one
             graph node for batch norm's statistics, one for its backward
             sums, one for a convolution's bias gradient.
   C S >= DL__CU_BN_BLOCKS = 512 blocks whatever C is: 3.9 per SM of an H100
   (132 SMs), where one block per channel (before) gave 6 or 16 busy SMs to
   LeNet-BN's layers. The split is a function of (N, C, L) alone, so the
   bits are the same on any GPU and every run, and the emulated device,
   which runs the same chunks and the same tree on the host, computes the
   same sums in the same order. Pass 1 reads x (and g) once: 4 (8) bytes
   an element, four loads in flight per thread; pass 2 reads 16 C S bytes.
   Against the CPU: the same terms in double, summed in another order (the
   CPU: 32 interleaved partials per channel), so mean and var differ from
   the CPU's by the double sums' rounding, about 1e-16 relative, before
   they are rounded to float: almost always the same floats.
   Apply and dx are one pass each, a thread per element (32-bit indices
   when the sizes allow), with per-channel coefficients from pass 2. Where
   the backward's dx is also to be summed per channel (the bias gradient of
   the convolution that made x: dl__conv_bias_of), the dx pass is passes 1
   and 2 of that sum instead (dl__cu_bn_dx_sums_run), each element computed,
   written and added as it is read: the bits of the dx pass, then of the
   convolution's own sum over it, in one launch and one read fewer. */
#ifndef DL__CU_BN_BLOCKS
#define DL__CU_BN_BLOCKS 512
#endif

/* The gradient at element l of a plane (rows of width pw, even) through a
   2x2, stride-2 max pool's adjoint and then a fused ReLU's mask, from the
   plane's pooled gradient g, pooled output yp and indices ix: the unpool's
   0 + g where ix names l (else 0), then DL__B_RELU_GRAD of that and the
   ReLU'd element the pool took (yp there): the two backward ops' bits. */
template <typename I>
static DL__HD inline float dl__cu_maxadj(const float *g, const float *yp, const int64_t *ix, I l, I pw)
{
    I i = l / pw, p = (i >> 1) * (pw >> 1) + ((l - i * pw) >> 1);
    return ix[p] == (int64_t)l ? dl__cu_bin<DL__B_RELU_GRAD>(dl__cu_fadd(0.0f, g[p]), yp[p]) : 0.0f;
}

/* n / d for 0 <= n < 2^31 by a multiply-high and a shift (Granlund and
   Montgomery's round-up method, PyTorch's IntDivider): s = ceil(log2 d),
   m = 2^32 (2^s - d) / d + 1, n / d = (umulhi(n, m) + n) >> s. Instead of
   the 20-odd instructions of a 32-bit division in a kernel that moves 8 to
   16 bytes an element. */
struct dl__cu_div {
    uint32_t d, m, s;
    void init(uint32_t d_)
    {
        d = d_ ? d_ : 1;
        for (s = 0; s < 32 && ((uint64_t)1 << s) < d; s++) {}
        m = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << s) - d)) / d + 1);
    }
    DL__HD uint32_t div(uint32_t n) const
    {
#ifdef __CUDA_ARCH__
        return (__umulhi(n, m) + n) >> s;
#else
        return (uint32_t)((((uint64_t)n * m) >> 32) + n) >> s;
#endif
    }
};

/* the channel (e / L) % C of element e of x (N, C, L): by dl__cu_div with
   32-bit indices, by division with 64-bit ones */
template <typename I> struct dl__cu_chan;
template <> struct dl__cu_chan<int32_t> {
    dl__cu_div L, C;
    void init(int64_t C_, int64_t L_) { C.init((uint32_t)C_); L.init((uint32_t)L_); }
    DL__HD int32_t of(int32_t e) const
    {
        uint32_t t = L.div((uint32_t)e);
        return (int32_t)(t - C.div(t) * C.d);
    }
};
template <> struct dl__cu_chan<int64_t> {
    int64_t C, L;
    void init(int64_t C_, int64_t L_) { C = C_; L = L_; }
    DL__HD int64_t of(int64_t e) const { return (e / L) % C; }
};

/* dx = k (g - a - xhat bb), k = w invstd, (a, bb) = coef (train) or 0
   (dl__bn_dx_task); gm: the masked g written there too (no pass 1 ran);
   pix: g through a max pool's adjoint and the ReLU (dl__cu_maxadj; ry the
   pool's output, L = pw H) */
template <typename I>
struct dl__cuf_bn_dx {
    float *dx, *gm; const float *g, *x, *mean, *invstd, *w, *coef, *ry; const int64_t *pix; I L, pw;
    dl__cu_chan<I> ch;
    void init(float *dx_, float *gm_, const float *g_, const float *x_, const float *mean_, const float *invstd_,
              const float *w_, const float *coef_, const float *ry_, const int64_t *pix_, int64_t pw_, int64_t C,
              int64_t L_)
    {
        dx = dx_; gm = gm_; g = g_; x = x_; mean = mean_; invstd = invstd_; w = w_; coef = coef_; ry = ry_;
        pix = pix_; L = (I)L_; pw = (I)pw_;
        ch.init(C, L_);
    }
    DL__HD void operator()(I e) const
    {
        float ge, v = val(e, &ge);
        if (gm) gm[e] = ge;
        if (dx) dx[e] = v;
    }
    DL__HD float val(I e) const
    {
        float ge;
        return val(e, &ge);
    }
    /* element e's dx, and in *gep its masked g */
    DL__HD float val(I e, float *gep) const { return at(e, ch.of(e), pix ? e / L : 0, gep); }
    /* the same of element e of channel c in plane q = e / L (with pix) */
    DL__HD float at(I e, I c, I q, float *gep) const
    {
        float is = invstd[c], wc = w ? w[c] : 1.0f, m = mean[c], k = dl__cu_fmul(is, wc);
        float a = coef ? coef[2 * c] : 0.0f, bb = coef ? coef[2 * c + 1] : 0.0f;
        /* eval (no coef): no xhat term, so an inf or NaN x still gets k g */
        float xh = coef ? dl__cu_fmul(dl__cu_fmul(dl__cu_fsub(x[e], m), is), bb) : 0.0f;
        float ge = pix ? dl__cu_maxadj<I>(g + q * (L / 4), ry + q * (L / 4), pix + q * (L / 4), e - q * L, pw)
                   : ry && ry[e] <= 0 ? 0.0f : g[e];   /* a fused ReLU's mask (DL__B_RELU_GRAD) */
        *gep = ge;
        return dl__cu_fmul(k, dl__cu_fsub(dl__cu_fsub(ge, a), xh));
    }
};

/* thread t (of G) of pass-1 job j = c S + s: its two sums over chunk s of
   channel c (ST: statistics, else the backward's), elements in order */
template <bool ST, typename I>
struct dl__cu_bnpart {
    const float *x, *g, *mean, *ry; I C, L, M, S;   /* ry: a fused activation's output or NULL */
    float *gm;                                      /* with ry: its gradient written there (or NULL) */
    int act;                                        /* with ry: which (dl__cu_actg; batch norm: ReLU) */
    I pw;   /* > 0 (with ry): g is a 2x2 average pool's gradient (N, C, L/4), rows of width pw */
    const int64_t *pix;   /* with pw and ry: the pool is a max pool, these its indices (N, C, L/4),
                             ry its output (dl__cu_maxadj) */
    bool dxm;              /* (not ST, no x, g, ry): the sums of batch norm's dx, dxr.at of each element,
                              which it writes (and dxr.gm) as it reads them: dl__cu_bn_dx_sums */
    dl__cuf_bn_dx<I> dxr;
    const float *xb;       /* (ST) or NULL: the statistics of z = x + xb[c], z written to xz as read
                              (a Linear's bias add: dl__cu_bn_stats_add) */
    float *xz;
    /* g at element (n, l) of channel c's gc: itself, or with pw the pool's
       adjoint there, 0 + g / 4 (dl__cuf_avgpool_adj's one window) */
    DL__HD float gat(const float *gc, I n, I l, I CL) const
    {
        I i;
        if (!pw) return gc[n * CL + l];
        i = l / pw;
        return dl__cu_fadd(0.0f, dl__cu_fdiv(gc[n * (CL / 4) + (i >> 1) * (pw >> 1) + ((l - i * pw) >> 1)], 4.0f));
    }
    DL__HD void sums(I j, I t, I G, double *pa, double *pb) const
    {
        I c = j / S, s = j - c * S, q = M / S, r = M - q * S;
        I lo = s * q + (s < r ? s : r), hi = lo + q + (s < r ? 1 : 0), k = lo + t, n, l, CL = C * L;
        I gq = G / L, gr = G - gq * L;   /* k += G is (n, l) += (gq, gr), then one carry: no division */
        const float *xc = x ? x + c * L : NULL, *gc = ST || !g ? NULL : g + c * (pw ? L / 4 : L);
        const float *rc = ST || !ry ? NULL : ry + c * (pix ? L / 4 : L);
        const int64_t *ic = ST || !pix ? NULL : pix + c * (L / 4);
        float *mc = ST || !rc || !gm ? NULL : gm + c * L;
        double a = 0.0, b = 0.0, K;
        *pa = *pb = 0.0;
        if (k >= hi) return;
        K = ST ? dl__bn_shift(xb ? dl__cu_fadd(xc[0], xb[c]) : xc[0]) : xc ? (double)mean[c] : 0.0;
        n = k / L;
        l = k - n * L;
        for (; k < hi; k += 4 * G) {   /* four loads issued before the four adds, in order */
            float xv[4], gv[4];
            int u, cnt = 0;
            for (u = 0; u < 4 && k + u * G < hi; u++, cnt++) {
                I at = n * CL + l;
                xv[u] = ST || xc ? xc[at] : 0.0f;
                if (ST && xb) {   /* the binary add's rounding, each element written once */
                    xv[u] = dl__cu_fadd(xv[u], xb[c]);
                    xz[at + c * L] = xv[u];
                }
                if (!ST && dxm) {   /* element at + c L, in plane n C + c */
                    float ge;
                    gv[u] = dxr.at(at + c * L, c, n * C + c, &ge);
                    if (dxr.gm) dxr.gm[at + c * L] = ge;
                    if (dxr.dx) dxr.dx[at + c * L] = gv[u];
                } else if (!ST) {
                    I pq = n * (CL / 4);   /* (with ic: the pooled plane's start) */
                    gv[u] = ic ? dl__cu_maxadj<I>(gc + pq, rc + pq, ic + pq, l, pw)
                            : rc ? dl__cu_actg(act, gat(gc, n, l, CL), rc[at]) : gc[at];
                }
                if (mc) mc[at] = gv[u];                                /* each element once */
                n += gq;
                l += gr;
                if (l >= L) { l -= L; n++; }
            }
            for (u = 0; u < cnt; u++) {
                double dv = (double)xv[u] - K;
                if (ST) {
                    a = dl__cu_dadd(a, dv);
                    b = dl__cu_dadd(b, dl__cu_dmul(dv, dv));
                } else {
                    a = dl__cu_dadd(a, (double)gv[u]);
                    if (xc) b = dl__cu_dadd(b, dl__cu_dmul((double)gv[u], dv));
                }
            }
        }
        *pa = a;
        *pb = b;
    }
};

/* Pass 2 reads the C S pairs of partials that pass 1's blocks wrote; where
   they fit in DL__CU_BN_ST doubles of shared memory (C S <= 1024: the
   small nets' channels) the last block first copies them there, a thread
   a value, all the reads in flight at once, and each channel's thread then
   adds its S pairs in order from that copy (the same adds, the same bits)
   where it read them from L2, 8 at a time (S / 8 trips: 11 for 6 channels,
   S = 86). */
#ifndef DL__CU_BN_ST
#define DL__CU_BN_ST 2048
#endif

template <bool ST, typename I, typename F>
__global__ void __launch_bounds__(DL__CU_THREADS) dl__cu_bn_pass1(dl__cu_bnpart<ST, I> p, I jobs, double *part,
                                                                  F fin, int64_t C, unsigned *ticket)
{
    DL__CU_PDL_ENTER();
    __shared__ double sh[9], st[DL__CU_BN_ST];
    I j;
    int64_t c;
    for (j = (I)blockIdx.x; j < jobs; j += (I)gridDim.x) {
        double a, b;
        p.sums(j, (I)threadIdx.x, (I)DL__CU_THREADS, &a, &b);
        a = dl__cu_group_all<DL__R_SUM, DL__CU_THREADS>(a, sh);
        b = dl__cu_group_all<DL__R_SUM, DL__CU_THREADS>(b, sh);
        if (threadIdx.x == 0) {
            part[2 * j] = a;
            part[2 * j + 1] = b;
        }
    }
    if (!dl__cu_last_block(ticket)) return;
    if (2 * (int64_t)jobs <= DL__CU_BN_ST) {   /* pass 2 from a copy in shared memory: the reads at once */
        for (c = (int64_t)threadIdx.x; c < 2 * (int64_t)jobs; c += DL__CU_THREADS) st[c] = dl__cu_ldcg(part + c);
        __syncthreads();
        for (c = (int64_t)threadIdx.x; c < C; c += DL__CU_THREADS) fin.go(c, st);
        return;
    }
    for (c = (int64_t)threadIdx.x; c < C; c += DL__CU_THREADS) fin(c);   /* pass 2 */
}

/* a block's fixed tree (dl__cu_group_all<DL__R_SUM, 256>) on the host: in
   each warp lane l takes lane l + o (o = 16, 8 ... 1, __shfl_down_sync),
   then warp 0 does the same over the 8 warps' sums (lanes 8..31: zero) */
static double dl__cu_tree256(double *v)
{
    double u[32];
    int w, o, l;
    for (w = 0; w < DL__CU_THREADS / 32; w++)
        for (o = 16; o > 0; o >>= 1)
            for (l = 0; l < o; l++) v[32 * w + l] = v[32 * w + l] + v[32 * w + l + o];
    for (l = 0; l < 32; l++) u[l] = l < DL__CU_THREADS / 32 ? v[32 * l] : 0.0;
    for (o = 16; o > 0; o >>= 1)
        for (l = 0; l < o; l++) u[l] = u[l] + u[l + o];
    return u[0];
}

/* an emulated device's pass 1: job j's threads one after the other, then
   the block's tree; then pass 2, channel by channel */
template <bool ST, typename I, typename F>
struct dl__cuh_bnpart {
    dl__cu_bnpart<ST, I> p; I jobs; double *part; F fin; int64_t C;
    void operator()(int64_t) const
    {
        double va[DL__CU_THREADS], vb[DL__CU_THREADS];
        I j, t, i, q;
        int64_t c;
        for (i = 0; i < jobs; i++) {
            j = (I)dl__cu_emu_at(i, jobs);
            for (t = 0; t < DL__CU_THREADS; t++) va[t] = vb[t] = NAN;
            for (q = 0; q < DL__CU_THREADS; q++) {
                t = (I)dl__cu_emu_at(q, DL__CU_THREADS);
                p.sums(j, t, (I)DL__CU_THREADS, &va[t], &vb[t]);
            }
            part[2 * j] = dl__cu_tree256(va);
            part[2 * j + 1] = dl__cu_tree256(vb);
        }
        for (c = 0; c < C; c++) fin(dl__cu_emu_at(c, C));
    }
};

/* passes 1 and 2 over (N, C, L), one launch: part (C S, 2), S chunks per
   channel, then fin(c) for every channel (F: dl__cuf_bn_fin or _sfin) */
template <bool ST, typename I, typename F>
static void dl__cu_bn_pass_run(dl__dev *d, double *part, const float *x, const float *g, const float *mean,
                               const float *ry, float *gm, int act, int64_t pw, const int64_t *pix, int64_t C,
                               int64_t L, int64_t M, int64_t S, const F &fin, const dl__cuf_bn_dx<I> *dxr = NULL,
                               const float *xb = NULL, float *xz = NULL)
{
    dl__cuimpl *m = DL__CUI(d);
    dl__cu_bnpart<ST, I> p;
    I jobs = (I)(C * S);
    p.x = x; p.g = g; p.mean = mean; p.ry = ry; p.gm = gm; p.act = act; p.pw = (I)pw; p.pix = pix;
    p.C = (I)C; p.L = (I)L; p.M = (I)M; p.S = (I)S;
    p.dxm = dxr != NULL;
    p.dxr = dxr ? *dxr : dl__cuf_bn_dx<I>();
    p.xb = xb; p.xz = xz;
    if (m->emulate) {   /* the same threads, one after the other, then the block's tree */
        dl__cuh_bnpart<ST, I, F> f;
        f.p = p; f.jobs = jobs; f.part = part; f.fin = fin; f.C = C;
        dl__cu_host(d, f);   /* (recorded inside a capture) */
        return;
    }
    dl__cu_go(m, dl__cu_bn_pass1<ST, I, F>, dl__cu_grid(m, jobs, 1), DL__CU_THREADS, 0, p, jobs, part, fin, C,
              m->ticket);
    dl__cu_launched(d, ST    ? (xb ? "bias add + bn_stats" : "bn_stats")
                       : x   ? "bn_backward sums"
                       : dxr ? "bn_backward dx + channel sums"
                             : "channel sums");
}

/* chunks per channel: C S >= DL__CU_BN_BLOCKS, at most M (a chunk has an element) */
static int64_t dl__cu_bn_split(int64_t C, int64_t M)
{
    int64_t S = (DL__CU_BN_BLOCKS + C - 1) / C;
    if (S > M) S = M;
    return S < 1 ? 1 : S;
}

/* the partials' scratch: (C S, 2) doubles, then extra bytes */
static double *dl__cu_bn_scratch(dl__dev *d, int64_t N, int64_t C, int64_t L, int64_t *S, size_t extra)
{
    *S = dl__cu_bn_split(C, N * L);
    return (double *)dl__cu_scratch(d, sizeof(double) * (size_t)(2 * C * *S) + extra);
}

/* passes 1 and 2 with 32-bit indices where x's elements and the jobs allow */
template <bool ST, typename F>
static void dl__cu_bn_pass(dl__dev *d, double *part, const float *x, const float *g, const float *mean,
                           const float *ry, float *gm, int act, int64_t pw, const int64_t *pix, int64_t N,
                           int64_t C, int64_t L, int64_t S, const F &fin, const float *xb = NULL, float *xz = NULL)
{
    if (dl__cu_small(N * C * L + 4 * DL__CU_THREADS * (int64_t)C) && dl__cu_small(C * S))
        dl__cu_bn_pass_run<ST, int32_t, F>(d, part, x, g, mean, ry, gm, act, pw, pix, C, L, N * L, S, fin, NULL, xb,
                                           xz);
    else
        dl__cu_bn_pass_run<ST, int64_t, F>(d, part, x, g, mean, ry, gm, act, pw, pix, C, L, N * L, S, fin, NULL, xb,
                                           xz);
}

/* pass 2 of the statistics, channel c: its S partials in order, then the
   CPU's dl__bn_stats_fin: s = mean(x - K), var = mean((x - K)^2) - s^2 */
struct dl__cuf_bn_fin {
    float *mean, *invstd, *var; const double *part; const float *x, *xb; int64_t S, L; double M; float eps;
    float *rm, *rv; int64_t *nbt; float keep, mom, vmom;   /* dl__bn_running (NULL: none) */
    DL__HD void operator()(int64_t c) const { go(c, NULL); }
    /* st: the partials staged in shared memory (dl__cu_bn_pass1), or NULL */
    DL__HD void go(int64_t c, const double *st) const
    {
        double a = 0.0, b = 0.0, sm, q;
        const double *pc = (st ? st : part) + 2 * c * S;   /* (a, b) pairs */
        dl__cu_inorder<8>(S, [&](int64_t s) { return dl__cu_pair(pc + 2 * s, st != NULL); },
                          [&](int64_t, dl__cu_dd v) { a = dl__cu_dadd(a, v.a); b = dl__cu_dadd(b, v.b); });
        sm = a / M;
        q = dl__cu_dadd(b / M, -dl__cu_dmul(sm, sm));
        if (q < 0.0) q = 0.0;                                /* rounding; NaN stays */
        mean[c] = (float)dl__cu_dadd(dl__bn_shift(xb ? dl__cu_fadd(x[c * L], xb[c]) : x[c * L]), sm);
        var[c] = (float)q;
        invstd[c] = (float)(1.0 / sqrt(dl__cu_dadd(q, (double)eps)));
        if (nbt && c == 0) *nbt += 1;
        if (rm) {   /* the unary AFFINE keep r + 0, then axpy's r + mom stat: their bits */
            rm[c] = dl__cu_fadd(dl__cu_fadd(dl__cu_fmul(keep, rm[c]), 0.0f), dl__cu_fmul(mom, mean[c]));
            if (rv) rv[c] = dl__cu_fadd(dl__cu_fadd(dl__cu_fmul(keep, rv[c]), 0.0f), dl__cu_fmul(vmom, var[c]));
        }
    }
};

/* pass 2 of the backward sums, channel c (dl__bn_sums_fin): db, dw, and
   dx's coefficients coef (C, 2) = (mean(g), mean(g xhat)) as floats */
struct dl__cuf_bn_sfin {
    float *dw, *db, *coef; const double *part; const float *invstd; int64_t S; double M;
    DL__HD void operator()(int64_t c) const { go(c, NULL); }
    DL__HD void go(int64_t c, const double *st) const   /* (st: as dl__cuf_bn_fin's) */
    {
        double sg = 0.0, sgx = 0.0, is = invstd ? (double)invstd[c] : 1.0;
        const double *pc = (st ? st : part) + 2 * c * S;   /* (sum g, sum g x) pairs */
        dl__cu_inorder<8>(S, [&](int64_t s) { return dl__cu_pair(pc + 2 * s, st != NULL); },
                          [&](int64_t, dl__cu_dd v) { sg = dl__cu_dadd(sg, v.a); sgx = dl__cu_dadd(sgx, v.b); });
        sgx = dl__cu_dmul(sgx, is);                          /* sum(g xhat) */
        if (db) db[c] = (float)sg;
        if (dw) dw[c] = (float)sgx;
        if (coef) {
            coef[2 * c] = (float)(sg / M);
            coef[2 * c + 1] = (float)(sgx / M);
        }
    }
};

/* value v of channel c normalized: v sc + sh, sc = invstd w, sh = b - mean sc
   (dl__bn_apply_task's roundings) */
template <typename I>
static DL__HD inline float dl__cu_bn_val(float v, const float *mean, const float *invstd, const float *w,
                                         const float *b, I c)
{
    float sc = dl__cu_fmul(invstd[c], w ? w[c] : 1.0f);
    float sh = dl__cu_fsub(b ? b[c] : 0.0f, dl__cu_fmul(mean[c], sc));
    return dl__cu_fadd(dl__cu_fmul(v, sc), sh);
}

/* y = x sc + sh, one thread per element; r: then + r (dl_add's rounding);
   relu: then DL__U_RELU's max(y, 0) */
template <typename I>
struct dl__cuf_bn_apply {
    float *y; const float *x, *mean, *invstd, *w, *b, *r; dl__cu_chan<I> ch; bool relu;
    DL__HD void operator()(I e) const
    {
        float v = dl__cu_bn_val<I>(x[e], mean, invstd, w, b, ch.of(e));
        if (r) v = dl__cu_fadd(v, r[e]);
        y[e] = !relu || v > 0 || v != v ? v : 0.0f;
    }
};

/* Batch norm, its ReLU and a 2x2, stride-2 max pool (bn_pool): a thread per
   pooled output e of (N C, H/2, W/2) takes its window's four elements in
   row order through bn_apply's expression and ReLU, then max_pool's choice
   (the first largest, NaN wins), and writes it and its index in the plane:
   the three ops' bits, without the ReLU'd (N, C, H, W) tensor. */
template <typename I>
struct dl__cuf_bn_pool {
    float *yp; int64_t *idx; const float *x, *mean, *invstd, *w, *b; I C, W, Lp;
    DL__HD void operator()(I e) const
    {
        I q = e / Lp, o = e - q * Lp, Wp = W >> 1, r = o / Wp, at0 = 2 * r * W + 2 * (o - r * Wp);
        const float *xq = x + q * 4 * Lp;
        float m = -INFINITY;
        int64_t best = -1;
        int u;
        for (u = 0; u < 4; u++) {
            I at = at0 + (I)(u >> 1) * W + (I)(u & 1);
            float v = dl__cu_bn_val<I>(xq[at], mean, invstd, w, b, q % C);
            v = v > 0 || v != v ? v : 0.0f;
            if (best < 0 || v > m || v != v) { m = v; best = (int64_t)at; }
        }
        yp[e] = m;
        if (idx) idx[e] = best;
    }
};

/* eval mode's mean and invstd from the running statistics, a thread per
   channel (bn_eval): the copy's and the two unary kernels' bits (one = 1,
   p = -0.5 arrive as the unary launches' arguments do, not as constants
   the compiler could fold into another powf) */
struct dl__cuf_bn_eval {
    float *mean, *invstd; const float *rm, *rv; float one, eps, p;
    DL__HD void operator()(int64_t c) const
    {
        mean[c] = rm[c];
        invstd[c] = dl__cu_un<DL__U_POW>(dl__cu_un<DL__U_AFFINE>(rv[c], one, eps), p, 0.0f);
    }
};

static void dl__cu_bn_eval(dl__dev *d, float *mean, float *invstd, const float *rm, const float *rv, int64_t C,
                           float eps)
{
    dl__cuf_bn_eval f;
    dl__cu_enter(d);
    if (C <= 0) return;
    f.mean = DL__CUP(d, mean); f.invstd = DL__CUP(d, invstd); f.rm = DL__CUP(d, rm); f.rv = DL__CUP(d, rv);
    f.one = 1.0f; f.eps = eps; f.p = -0.5f;
    dl__cu_run<int64_t>(d, "bn eval statistics", C, f);
}

/* the statistics of x (N, C, L), or with xb those of z = x + xb[c], which
   pass 1 writes as it reads x (the binary add's bits: dl__cu_bn_stats_add) */
static void dl__cu_bn_stats_go(dl__dev *d, float *mean, float *invstd, float *var, const float *x, int64_t N,
                               int64_t C, int64_t L, float eps, const dl__bn_running *rs, const float *xb, float *z)
{
    dl__cuf_bn_fin f;
    int64_t S;
    double *part;
    dl__cu_enter(d);
    if (C <= 0 || N * L <= 0) return;
    x = DL__CUP(d, x);
    xb = xb ? DL__CUP(d, xb) : NULL;
    z = xb ? DL__CUP(d, z) : NULL;
    part = dl__cu_bn_scratch(d, N, C, L, &S, 0);
    if (!part) return;
    f.mean = DL__CUP(d, mean); f.invstd = DL__CUP(d, invstd); f.var = DL__CUP(d, var); f.part = part; f.x = x;
    f.xb = xb;
    f.S = S; f.L = L; f.M = (double)(N * L); f.eps = eps;
    f.rm = rs ? DL__CUP(d, rs->rm) : NULL;
    f.rv = rs && rs->rv ? DL__CUP(d, rs->rv) : NULL;
    f.nbt = rs && rs->nbt ? DL__CUP(d, rs->nbt) : NULL;
    f.keep = rs ? rs->keep : 0.0f; f.mom = rs ? rs->mom : 0.0f; f.vmom = rs ? rs->vmom : 0.0f;
    dl__cu_bn_pass<true>(d, part, x, NULL, NULL, NULL, NULL, -1, 0, NULL, N, C, L, S, f, xb, z);
}

static void dl__cu_bn_stats(dl__dev *d, float *mean, float *invstd, float *var, const float *x, int64_t N,
                            int64_t C, int64_t L, float eps, const dl__bn_running *rs)
{
    dl__cu_bn_stats_go(d, mean, invstd, var, x, N, C, L, eps, rs, NULL, NULL);
}

/* dl__backend.bn_stats_add: a Linear's bias add (x (N, C) + xb) in the statistics' launch */
static void dl__cu_bn_stats_add(dl__dev *d, float *mean, float *invstd, float *var, float *z, const float *x,
                                const float *xb, int64_t N, int64_t C, float eps, const dl__bn_running *rs)
{
    dl__cu_bn_stats_go(d, mean, invstd, var, x, N, C, 1, eps, rs, xb, z);
}

template <typename I>
static void dl__cu_bn_apply_run(dl__dev *d, float *y, const float *x, const float *mean, const float *invstd,
                                const float *w, const float *b, const float *r, int64_t n, int64_t C, int64_t L,
                                bool relu)
{
    dl__cuf_bn_apply<I> f;
    f.y = y; f.x = x; f.mean = mean; f.invstd = invstd; f.w = w; f.b = b; f.r = r; f.ch.init(C, L); f.relu = relu;
    dl__cu_run<I>(d, "bn_apply", n, f);
}

static void dl__cu_bn_apply(dl__dev *d, float *y, const float *x, const float *mean, const float *invstd,
                            const float *w, const float *b, const float *r, int64_t N, int64_t C, int64_t L,
                            bool relu)
{
    int64_t n = N * C * L;
    dl__cu_enter(d);
    if (C <= 0 || L <= 0 || n <= 0) return;
    y = DL__CUP(d, y); x = DL__CUP(d, x); mean = DL__CUP(d, mean); invstd = DL__CUP(d, invstd);
    w = w ? DL__CUP(d, w) : NULL; b = b ? DL__CUP(d, b) : NULL; r = r ? DL__CUP(d, r) : NULL;
    if (dl__cu_small(n)) dl__cu_bn_apply_run<int32_t>(d, y, x, mean, invstd, w, b, r, n, C, L, relu);
    else dl__cu_bn_apply_run<int64_t>(d, y, x, mean, invstd, w, b, r, n, C, L, relu);
}

template <typename I>
static void dl__cu_bn_pool_run(dl__dev *d, float *yp, int64_t *idx, const float *x, const float *mean,
                               const float *invstd, const float *w, const float *b, int64_t np, int64_t C,
                               int64_t W, int64_t Lp)
{
    dl__cuf_bn_pool<I> f;
    f.yp = yp; f.idx = idx; f.x = x; f.mean = mean; f.invstd = invstd; f.w = w; f.b = b;
    f.C = (I)C; f.W = (I)W; f.Lp = (I)Lp;
    dl__cu_run<I>(d, "bn_apply + max_pool", np, f);
}

static void dl__cu_bn_pool(dl__dev *d, float *yp, int64_t *idx, const float *x, const float *mean,
                           const float *invstd, const float *w, const float *b, int64_t N, int64_t C, int64_t H,
                           int64_t W)
{
    int64_t Lp = (H / 2) * (W / 2), np = N * C * Lp;
    dl__cu_enter(d);
    if (np <= 0) return;
    yp = DL__CUP(d, yp); idx = idx ? DL__CUP(d, idx) : NULL; x = DL__CUP(d, x); mean = DL__CUP(d, mean);
    invstd = DL__CUP(d, invstd); w = w ? DL__CUP(d, w) : NULL; b = b ? DL__CUP(d, b) : NULL;
    if (dl__cu_small(N * C * H * W)) dl__cu_bn_pool_run<int32_t>(d, yp, idx, x, mean, invstd, w, b, np, C, W, Lp);
    else dl__cu_bn_pool_run<int64_t>(d, yp, idx, x, mean, invstd, w, b, np, C, W, Lp);
}

template <typename I>
static void dl__cu_bn_dx_run(dl__dev *d, float *dx, float *gm, const float *g, const float *x, const float *mean,
                             const float *invstd, const float *w, const float *coef, const float *ry,
                             const int64_t *pix, int64_t pw, int64_t n, int64_t C, int64_t L, float *sdb)
{
    dl__cuf_bn_dx<I> f;
    f.init(dx, gm, g, x, mean, invstd, w, coef, ry, pix, pw, C, L);
    if (sdb) {   /* (N, C): dx's columns summed in the same launch */
        dl__cur_el<I, dl__cuf_bn_dx<I> > rd;   /* (L 1, no pool, no gm) */
        rd.f = f; rd.C = (I)C;
        dl__cu_colsum_go<I>(d, "bn_backward dx", (I)C, (I)(n / C), rd, sdb);
        return;
    }
    dl__cu_run<I>(d, dx ? "bn_backward dx" : "bn_backward mask", n, f);
}

/* dx (N, C, L > 1) as dl__cu_bn_dx_run's, in a pass that also adds it up
   per channel into sdb: dl__cu_chan_sum's pass over that dx (the same
   chunks S, threads and trees, the bits of the reduce after it) where each
   element is computed, written and added, in one launch; part: (C S, 2)
   doubles of scratch (pass 1's, whose values its launch has used) */
template <typename I>
static void dl__cu_bn_dx_sums_run(dl__dev *d, double *part, int64_t S, float *dx, float *gm, const float *g,
                                  const float *x, const float *mean, const float *invstd, const float *w,
                                  const float *coef, const float *ry, const int64_t *pix, int64_t pw, int64_t N,
                                  int64_t C, int64_t L, float *sdb)
{
    dl__cuf_bn_dx<I> f;
    dl__cuf_bn_sfin fin;
    f.init(dx, gm, g, x, mean, invstd, w, coef, ry, pix, pw, C, L);
    fin.dw = NULL; fin.db = sdb; fin.coef = NULL; fin.part = part; fin.invstd = NULL; fin.S = S;
    fin.M = (double)(N * L);
    dl__cu_bn_pass_run<false, I, dl__cuf_bn_sfin>(d, part, NULL, NULL, NULL, NULL, NULL, -1, 0, NULL, C, L, N * L, S,
                                                  fin, &f);
}

/* gm (with ry): the masked g, written by pass 1 where it runs (the dx pass
   then reads it in place of g and ry), else by the dx pass, else by a pass
   of its own. pix (with ry, no gm): g and ry are a 2x2 max pool's gradient
   and output, pix its indices, rows of width pw (bn_pool_bwd) */
static void dl__cu_bn_bwd_go(dl__dev *d, float *dx, float *dw, float *db, const float *g, const float *x,
                             const float *mean, const float *invstd, const float *w, int64_t N, int64_t C,
                             int64_t L, bool train, const float *ry, float *gm, const int64_t *pix, int64_t pw,
                             float *sdb)
{
    float *coef = NULL;
    double *part = NULL;
    int64_t n = N * C * L, S = 1;
    dl__cu_enter(d);
    dx = dx ? DL__CUP(d, dx) : NULL; dw = dw ? DL__CUP(d, dw) : NULL; db = db ? DL__CUP(d, db) : NULL;
    /* (the caller's rule: L 1, the columns; L > 1, the channels) */
    sdb = dx && sdb && (L > 1 || (!pix && !(ry && gm))) ? DL__CUP(d, sdb) : NULL;
    g = DL__CUP(d, g); x = DL__CUP(d, x); mean = DL__CUP(d, mean); invstd = DL__CUP(d, invstd);
    w = w ? DL__CUP(d, w) : NULL;
    ry = ry ? DL__CUP(d, ry) : NULL;
    gm = ry && gm ? DL__CUP(d, gm) : NULL;
    pix = ry && pix ? DL__CUP(d, pix) : NULL;
    if (!pix) pw = 0;
    if (C <= 0) return;
    if (dw || db || (dx && train)) {
        dl__cuf_bn_sfin f;
        part = dl__cu_bn_scratch(d, n > 0 ? N : 1, C, n > 0 ? L : 1, &S, sizeof(float) * (size_t)(2 * C));
        if (!part) return;
        if (dx && train) coef = (float *)(part + 2 * C * S);
        f.dw = dw; f.db = db; f.coef = coef; f.part = part; f.invstd = invstd; f.S = S; f.M = (double)(N * L);
        if (n > 0) {
            dl__cu_bn_pass<false>(d, part, x, g, mean, ry, gm, DL__U_RELU, pw, pix, N, C, L, S, f);
            if (gm) {   /* written: the dx pass reads it */
                g = gm;
                ry = NULL;
                gm = NULL;
            }
        } else {   /* no elements: the sums are zero (as the CPU's) */
            dl__cu_memset(d, part, 0, sizeof(double) * 2 * (size_t)(C * S));
            dl__cu_run<int64_t>(d, "bn_backward sums", C, f);
        }
    }
    if (sdb && L > 1 && n > 0) {   /* dx and the channels' sums (pass 1's scratch, its S: the same split) */
        if (!part && !(part = dl__cu_bn_scratch(d, N, C, L, &S, 0))) return;
        if (dl__cu_small(n + 4 * DL__CU_THREADS * C) && dl__cu_small(C * S))   /* (dl__cu_bn_pass's rule) */
            dl__cu_bn_dx_sums_run<int32_t>(d, part, S, dx, gm, g, x, mean, invstd, w, coef, ry, pix, pw, N, C, L, sdb);
        else dl__cu_bn_dx_sums_run<int64_t>(d, part, S, dx, gm, g, x, mean, invstd, w, coef, ry, pix, pw, N, C, L, sdb);
    } else if ((dx || gm) && L > 0 && n > 0) {
        if (dl__cu_small(n)) dl__cu_bn_dx_run<int32_t>(d, dx, gm, g, x, mean, invstd, w, coef, ry, pix, pw, n, C, L, sdb);
        else dl__cu_bn_dx_run<int64_t>(d, dx, gm, g, x, mean, invstd, w, coef, ry, pix, pw, n, C, L, sdb);
    }
}

static void dl__cu_bn_backward(dl__dev *d, float *dx, float *dw, float *db, const float *g, const float *x,
                               const float *mean, const float *invstd, const float *w, int64_t N, int64_t C,
                               int64_t L, bool train, const float *ry, float *gm, float *sdb)
{
    dl__cu_bn_bwd_go(d, dx, dw, db, g, x, mean, invstd, w, N, C, L, train, ry, gm, NULL, 0, sdb);
}

static void dl__cu_bn_pool_bwd(dl__dev *d, float *dx, float *dw, float *db, const float *g, const float *x,
                               const float *mean, const float *invstd, const float *w, int64_t N, int64_t C,
                               int64_t H, int64_t W, bool train, const float *yp, const int64_t *idx, float *sdb)
{
    dl__cu_bn_bwd_go(d, dx, dw, db, g, x, mean, invstd, w, N, C, H * W, train, yp, NULL, idx, W, sdb);
}

/* A Linear's bias and activation (dl__backend.bias_act): y = act(x + b[c])
   for x (rows, cols), a thread per element, the binary kernel's add and the
   unary kernel's expression: one launch and one pass where dl_add then the
   activation took two of each. The backward (bias_act_bwd): each column's
   rows in order, the activation's gradient gx = GOP(g, y) written and
   added up for db in the reduce's own order (its sequential column sum,
   which the reduce takes where cols >= 8192 or rows < 1024; elsewhere the
   entry declines): a thread per column below 32 rows, dl__cu_colsum's
   staged reads from 32 (as the reduce): the mask's pass and the reduce's
   launch become one, with the same bits. */
template <int ACT, typename I>
struct dl__cuf_bias_act {
    float *y; const float *x, *b; I cols;
    DL__HD void operator()(I e) const { y[e] = dl__cu_un<ACT>(dl__cu_bin<DL__B_ADD>(x[e], b[e % cols]), 0.0f, 0.0f); }
};

template <int GOP, typename I>
struct dl__cuf_bias_act_bwd {
    float *gx, *db; const float *g, *y; I r, cols;
    DL__HD void operator()(I c) const
    {
        double m = 0.0;
        dl__cu_inorder<16>(r, [&](I k) { return dl__cu_bin<GOP>(g[k * cols + c], y[k * cols + c]); },
                           [&](I k, float v) { gx[k * cols + c] = v; m = dl__cu_dadd(m, (double)v); });
        db[c] = (float)m;
    }
};

/* dl__cu_colsum's rd for the backward: gx = GOP(g, y), written, and added */
struct dl__cu_gy { float g, y; };
template <int GOP, typename I>
struct dl__cur_bact {
    typedef dl__cu_gy raw;
    float *gx; const float *g, *y; I cols;
    DL__HD dl__cu_gy get(I c, I k) const
    {
        dl__cu_gy v;
        v.g = g[k * cols + c];
        v.y = y[k * cols + c];
        return v;
    }
    DL__HD float put(I c, I k, dl__cu_gy v) const
    {
        float r = dl__cu_bin<GOP>(v.g, v.y);
        gx[k * cols + c] = r;
        return r;
    }
};

template <int ACT, typename I>
static void dl__cu_bias_act_run(dl__dev *d, float *y, const float *x, const float *b, int64_t n, int64_t cols)
{
    dl__cuf_bias_act<ACT, I> f;
    f.y = y; f.x = x; f.b = b; f.cols = (I)cols;
    dl__cu_run<I>(d, "bias_act", n, f);
}

template <int ACT>
static void dl__cu_bias_act_i(dl__dev *d, float *y, const float *x, const float *b, int64_t n, int64_t cols)
{
    if (dl__cu_small(n)) dl__cu_bias_act_run<ACT, int32_t>(d, y, x, b, n, cols);
    else dl__cu_bias_act_run<ACT, int64_t>(d, y, x, b, n, cols);
}

static void dl__cu_bias_act(dl__dev *d, float *y, const float *x, const float *b, int64_t rows, int64_t cols,
                            int act)
{
    int64_t n = rows * cols;
    dl__cu_enter(d);
    if (n <= 0) return;
    y = DL__CUP(d, y); x = DL__CUP(d, x); b = DL__CUP(d, b);
    if (act == DL__U_RELU) dl__cu_bias_act_i<DL__U_RELU>(d, y, x, b, n, cols);
    else if (act == DL__U_SIGMOID) dl__cu_bias_act_i<DL__U_SIGMOID>(d, y, x, b, n, cols);
    else dl__cu_bias_act_i<DL__U_TANH>(d, y, x, b, n, cols);
}

template <int GOP, typename I>
static void dl__cu_bias_act_bwd_run(dl__dev *d, float *gx, float *db, const float *g, const float *y, int64_t rows,
                                    int64_t cols)
{
    dl__cuf_bias_act_bwd<GOP, I> f;
    if (rows >= DL__CU_TILE_MIN) {   /* the same adds, staged (dl__cu_colsum) */
        dl__cur_bact<GOP, I> rd;
        rd.gx = gx; rd.g = g; rd.y = y; rd.cols = (I)cols;
        dl__cu_colsum_go<I>(d, "bias_act backward", (I)cols, (I)rows, rd, db);
        return;
    }
    f.gx = gx; f.db = db; f.g = g; f.y = y; f.r = (I)rows; f.cols = (I)cols;
    dl__cu_run<I>(d, "bias_act backward", cols, f);
}

template <int GOP>
static void dl__cu_bias_act_bwd_i(dl__dev *d, float *gx, float *db, const float *g, const float *y, int64_t rows,
                                  int64_t cols)
{
    if (dl__cu_small(rows * cols)) dl__cu_bias_act_bwd_run<GOP, int32_t>(d, gx, db, g, y, rows, cols);
    else dl__cu_bias_act_bwd_run<GOP, int64_t>(d, gx, db, g, y, rows, cols);
}

static bool dl__cu_bias_act_bwd(dl__dev *d, float *gx, float *db, const float *g, const float *y, int64_t rows,
                                int64_t cols, int act)
{
    if (!dl__cu_colsum_fused(rows, cols)) return false;
    if (!gx) return true;
    dl__cu_enter(d);
    gx = DL__CUP(d, gx); db = DL__CUP(d, db); g = DL__CUP(d, g); y = DL__CUP(d, y);
    if (act == DL__U_RELU) dl__cu_bias_act_bwd_i<DL__B_RELU_GRAD>(d, gx, db, g, y, rows, cols);
    else if (act == DL__U_SIGMOID) dl__cu_bias_act_bwd_i<DL__B_SIGMOID_GRAD>(d, gx, db, g, y, rows, cols);
    else dl__cu_bias_act_bwd_i<DL__B_TANH_GRAD>(d, gx, db, g, y, rows, cols);
    return true;
}

/* y[c] = sum of x (N, C, L) over N and L (a convolution's bias gradient):
   batch norm's backward sums with x as g and no second sum, so C S >= 512
   blocks read x once and pass 2 adds each channel's partials in order
   (one launch: pass 1's last block runs pass 2; a fixed order: the same
   bits every run and emulated).
   Before, a pass over the rows of L then a thread per channel down the N
   rows, each pass a launch and the first a block per row. With ry (a
   fused activation's output, dl__cu_conv_act): the sums of gm = the
   activation's gradient of x, which pass 1 writes as it reads each
   element once, the bits of the activation's backward then this sum;
   with pw > 0 too, x is the gradient of a 2x2 average pool of rows of
   width pw (N, C, L/4), read through the pool's adjoint (its bits). */
static void dl__cu_chan_sum(dl__dev *d, float *y, const float *x, int64_t N, int64_t C, int64_t L,
                            const float *ry, float *gm, int act, int64_t pw)
{
    dl__cuf_bn_sfin f;
    int64_t S;
    double *part;
    dl__cu_enter(d);
    if (C <= 0 || N * L <= 0) return;
    part = dl__cu_bn_scratch(d, N, C, L, &S, 0);
    if (!part) return;
    f.dw = NULL; f.db = DL__CUP(d, y); f.coef = NULL; f.part = part; f.invstd = NULL; f.S = S;
    f.M = (double)(N * L);
    dl__cu_bn_pass<false>(d, part, NULL, DL__CUP(d, x), NULL, ry ? DL__CUP(d, ry) : NULL, gm ? DL__CUP(d, gm) : NULL,
                          act, ry ? pw : 0, NULL, N, C, L, S, f);
}

static void dl__cu_ln_forward(dl__dev *d, float *y, float *mean, float *invstd, const float *x,
                              const float *w, const float *b, int64_t rows, int64_t cols, float eps)
{
    dl__cuj_ln_fwd j;
    dl__cu_enter(d);
    j.y = DL__CUP(d, y); j.mean = DL__CUP(d, mean); j.invstd = DL__CUP(d, invstd); j.x = DL__CUP(d, x);
    j.w = w ? DL__CUP(d, w) : NULL; j.b = b ? DL__CUP(d, b) : NULL; j.n = cols; j.eps = eps;
    dl__cu_groups(d, "ln_forward", rows, cols, j);
}

static void dl__cu_ln_backward(dl__dev *d, float *dx, float *dw, float *db, const float *g, const float *x,
                               const float *mean, const float *invstd, const float *w, int64_t rows,
                               int64_t cols)
{
    dl__cu_enter(d);
    dx = dx ? DL__CUP(d, dx) : NULL; dw = dw ? DL__CUP(d, dw) : NULL; db = db ? DL__CUP(d, db) : NULL;
    g = DL__CUP(d, g); x = DL__CUP(d, x); mean = DL__CUP(d, mean); invstd = DL__CUP(d, invstd);
    w = w ? DL__CUP(d, w) : NULL;
    if (rows <= 0 || cols <= 0) return;
    if (dx) {
        dl__cuj_ln_dx j;
        j.dx = dx; j.g = g; j.x = x; j.mean = mean; j.invstd = invstd; j.w = w; j.n = cols;
        dl__cu_groups(d, "ln_backward dx", rows, cols, j);
    }
    if (dw || db) {
        dl__cuf_ln_dwb f;
        f.dw = dw; f.db = db; f.g = g; f.x = x; f.mean = mean; f.invstd = invstd; f.rows = rows; f.cols = cols;
        dl__cu_run<int64_t>(d, "ln_backward dw db", cols, f);
    }
}

/* ===========================================================================
 * Optimizers
 * ========================================================================= */

/* element i of the CPU's dl__cpu_sgd, operation for operation (the
   per-tensor kernel and the multi-tensor one both run this) */
static DL__HD inline void dl__cu_sgd_at(float *p, const float *g, float *buf, int64_t i, const dl__sgd_args &a)
{
    float dd = a.maximize ? -g[i] : g[i];
    if (a.wd != 0.0f) dd = dl__cu_fadd(dd, dl__cu_fmul(a.wd, p[i]));
    if (a.momentum != 0.0f) {
        float b = a.first ? dd : dl__cu_fadd(dl__cu_fmul(buf[i], a.momentum), dl__cu_fmul(a.one_m_dampening, dd));
        buf[i] = b;
        dd = a.nesterov ? dl__cu_fadd(dd, dl__cu_fmul(a.momentum, b)) : b;
    }
    p[i] = dl__cu_fadd(p[i], dl__cu_fmul(-a.lr, dd));
}

struct dl__cuf_sgd {
    float *p; const float *g; float *buf; dl__sgd_args a;
    DL__HD void operator()(int64_t i) const { dl__cu_sgd_at(p, g, buf, i, a); }
};

static void dl__cu_sgd(dl__dev *d, float *p, const float *g, float *buf, int64_t n, const dl__sgd_args *a)
{
    dl__cuf_sgd f;
    dl__cu_enter(d);
    f.p = DL__CUP(d, p); f.g = DL__CUP(d, g); f.buf = buf ? DL__CUP(d, buf) : NULL; f.a = *a;
    dl__cu_run<int64_t>(d, "sgd", n, f);
}

/* element i of the CPU's dl__cpu_adam, operation for operation */
static DL__HD inline void dl__cu_adam_at(float *p, const float *g, float *m, float *v, float *vmax, int64_t i,
                                         const dl__adam_args &a)
{
    float gi = a.maximize ? -g[i] : g[i], pi = p[i], mi, vi, vv, denom;
    if (a.decay != 1.0f) pi = dl__cu_fmul(pi, a.decay);
    if (a.wd != 0.0f) gi = dl__cu_fadd(gi, dl__cu_fmul(a.wd, pi));
    mi = dl__cu_fadd(dl__cu_fmul(m[i], a.beta1), dl__cu_fmul(a.one_m_beta1, gi));
    vi = dl__cu_fadd(dl__cu_fmul(v[i], a.beta2), dl__cu_fmul(dl__cu_fmul(a.one_m_beta2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    vv = vi;
    if (a.amsgrad) {
        if (!(vmax[i] >= vv)) vmax[i] = vv;   /* NaN propagates */
        vv = vmax[i];
    }
    denom = dl__cu_fadd(dl__cu_fdiv(dl__cu_fsqrt(vv), a.bc2_sqrt), a.eps);
    p[i] = dl__cu_fadd(pi, dl__cu_fdiv(dl__cu_fmul(a.neg_step_size, mi), denom));
}

struct dl__cuf_adam {
    float *p; const float *g; float *m, *v, *vmax; dl__adam_args a;
    DL__HD void operator()(int64_t i) const { dl__cu_adam_at(p, g, m, v, vmax, i, a); }
};

static void dl__cu_adam(dl__dev *d, float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                        const dl__adam_args *a)
{
    dl__cuf_adam f;
    dl__cu_enter(d);
    f.p = DL__CUP(d, p); f.g = DL__CUP(d, g); f.m = DL__CUP(d, m); f.v = DL__CUP(d, v);
    f.vmax = vmax ? DL__CUP(d, vmax) : NULL; f.a = *a;
    dl__cu_run<int64_t>(d, "adam", n, f);
}

/* sum of squares in double: fixed chunks (a function of n only), each a
   block's fixed tree, then one block over the partials */
static double dl__cu_sumsq(dl__dev *d, const float *x, int64_t n)
{
    dl__cuimpl *m = dl__cu_enter(d);
    double r = 0;
    x = DL__CUP(d, x);
    if (n <= 0) return 0;
    if (m->cap) { dl__cap_refuse(d, "a read to the host (sumsq)"); return 0; }
    if (m->emulate) {
        int64_t i;
        for (i = 0; i < n; i++) r += (double)x[i] * (double)x[i];
        return r;
    }
    {
        int64_t nb = (n + DL__CU_RCHUNK - 1) / DL__CU_RCHUNK, chunk;
        double *part;
        if (nb > 1024) nb = 1024;
        chunk = (n + nb - 1) / nb;
        part = (double *)dl__cu_scratch(d, sizeof(double) * (size_t)nb);
        if (!part) return 0;
        dl__cu_rowred_launch<DL__R_SUM, float, true>(d, x, 1, n, chunk, nb, NULL, part);
        dl__cu_rowred_launch<DL__R_SUM, double, false>(d, part, 1, nb, nb, 1, NULL, (double *)m->dres);
    }
    if (!dl__cu_get(d, m->hres, m->dres, sizeof r, "sumsq")) return 0;
    memcpy(&r, m->hres, sizeof r);
    return r;
}

/* ===========================================================================
 * Multi-tensor updates: one launch for a list of tensors (dl__backend.mt_*)
 * ========================================================================= */

/* A list's device copy: the entries (device pointers) and their element
   offsets, kept while the list stays the same; room for cap entries and
   argcap bytes of arguments is made once (an optimizer reserves it when it
   is made, so that its steps never allocate). The table's bytes stay in
   pinned host memory: an eager run copies them once, a capture's graph at
   the start of each run. The argument structs go through a pinned host
   block and a device block, the host waiting for the last copy out of it
   (ev) before it writes it again. Once a capture has used a list (pinned),
   a change of the list makes a new one: the old stays (older) until the
   owner frees them all, since a captured graph may still run it. */
typedef struct dl__cumt {
    struct dl__cumt *older;
    int nt, cap;
    bool pinned, loaded;              /* a capture uses it; an eager copy of htab is queued */
    dl__mtent *host;                  /* the list as dl.h gave it (to see a change) */
    unsigned char *htab;              /* pinned: the device table's bytes */
    dl__mtent *dt;                    /* device: the entries, then int64 offsets (cap + 1) */
    const int64_t *doff;
    int64_t total;
    void *hargs, *dargs;
    size_t argcap;
    cudaEvent_t ev;
} dl__cumt;

/* element i of the concatenated list: found by bisection of the offsets,
   then the per-tensor kernel's arithmetic on that tensor's element */
struct dl__cuf_mt {
    const dl__mtent *t; const int64_t *off; const void *args; int nt, kind; dl__mtacc acc;
    DL__HD void operator()(int64_t i) const
    {
        int lo = dl__cu_mt_find(off, nt, i);
        {
            const dl__mtent &e = t[lo];
            int64_t j = i - off[lo];
            if (!(DL__CU_EXP & 2) && lo < DL__AXM && ((acc.has >> lo) & 1))   /* the backward's sum, first */
                ((float *)e.g)[j] = dl__cu_fadd((acc.first >> lo) & 1 ? 0.0f : e.g[j], acc.src[lo][j]);
            if (kind == DL__MT_ZERO) e.p[j] = 0.0f;
            else if (kind == DL__MT_SGD) dl__cu_sgd_at(e.p, e.g, e.s0, j, ((const dl__sgd_args *)args)[e.arg]);
            else dl__cu_adam_at(e.p, e.g, e.s0, e.s1, e.s2, j, ((const dl__adam_args *)args)[e.arg]);
        }
    }
};

static void dl__cu_hostfree(dl__cuimpl *m, void *p)
{
    if (!p) return;
    if (m->emulate) DL_FREE(p);
    else (void)cudaFreeHost(p);
}

static void *dl__cu_hostalloc(dl__cuimpl *m, size_t bytes)
{
    void *p = NULL;
    if (m->emulate) return DL_MALLOC(bytes);
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) { (void)cudaGetLastError(); return NULL; }
    return p;
}

/* a list and the lists it replaced */
static void dl__cu_mt_free(dl__dev *d, void *cache)
{
    dl__cumt *c = (dl__cumt *)cache;
    dl__cuimpl *m;
    if (!c) return;
    m = dl__cu_enter(d);
    if (!m->emulate && !m->cap)   /* its last run may be under way (a capture waited for it at begin) */
        (void)cudaStreamSynchronize(m->stream);
    while (c) {
        dl__cumt *o = c->older;
        dl__cu_hostfree(m, c->hargs);
        dl__cu_hostfree(m, c->htab);
        if (c->ev) (void)cudaEventDestroy(c->ev);
        dl__cu_block_put(d, c->dt);
        dl__cu_block_put(d, c->dargs);
        DL_FREE(c->host);
        DL_FREE(c);
        c = o;
    }
    if (!m->emulate) (void)cudaGetLastError();
}

static void *dl__cu_raw0(dl__dev *d, const void *p) { return p ? (void *)((uintptr_t)p - d->tag) : NULL; }

/* the bytes of a list's table: cap entries, then cap + 1 offsets */
static size_t dl__cu_mt_bytes(const dl__cumt *c)
{
    return sizeof(dl__mtent) * (size_t)c->cap + sizeof(int64_t) * (size_t)(c->cap + 1);
}

/* room for a list of cap entries and argbytes of arguments (old: the list
   it replaces, kept as older); NULL with the failure recorded */
static dl__cumt *dl__cu_mt_new(dl__dev *d, dl__cumt *old, int cap, size_t argbytes)
{
    dl__cuimpl *m = DL__CUI(d);
    size_t tb = sizeof(dl__mtent) * (size_t)cap, bytes;
    dl__cumt *c = (dl__cumt *)DL_MALLOC(sizeof(dl__cumt));
    cudaError_t e = cudaSuccess;
    if (!c) goto fail;
    memset(c, 0, sizeof *c);
    c->cap = cap;
    bytes = dl__cu_mt_bytes(c);
    if (!(c->host = (dl__mtent *)DL_MALLOC(tb)) || !(c->htab = (unsigned char *)dl__cu_hostalloc(m, bytes)) ||
        !(c->dt = (dl__mtent *)dl__cu_block_get(d, bytes, &e)))
        goto fail;
    memset(c->htab, 0, bytes);
    c->doff = (const int64_t *)(const void *)((const unsigned char *)c->dt + tb);
    if (argbytes) {
        c->argcap = argbytes;
        if (!(c->dargs = dl__cu_block_get(d, argbytes, &e)) || !(c->hargs = dl__cu_hostalloc(m, argbytes))) goto fail;
    }
    if (!m->emulate && (e = cudaEventCreateWithFlags(&c->ev, cudaEventDisableTiming)) != cudaSuccess) goto fail;
    c->older = old;
    return c;
fail:
    dl__cu_fail(d, "multi-tensor update: memory for its tensor list", e == cudaSuccess ? cudaErrorMemoryAllocation : e);
    dl__cu_mt_free(d, c);
    return NULL;
}

/* c holds the list t (nt <= c->cap) from now on; its device copy is made
   before the next run */
static void dl__cu_mt_fill(dl__dev *d, dl__cumt *c, int nt, const dl__mtent *t)
{
    size_t tb = sizeof(dl__mtent) * (size_t)c->cap;
    int k;
    dl__cu_wait(d, "cudaStreamSynchronize (multi-tensor table)");   /* its last copy out of htab is done */
    memcpy(c->host, t, sizeof(dl__mtent) * (size_t)nt);
    c->nt = nt;
    c->total = 0;
    for (k = 0; k < nt; k++) {   /* the device's own pointers (an emulated device's untagged) */
        dl__mtent r = t[k];
        r.p = (float *)dl__cu_raw0(d, t[k].p);
        r.g = (const float *)dl__cu_raw0(d, t[k].g);
        r.s0 = (float *)dl__cu_raw0(d, t[k].s0);
        r.s1 = (float *)dl__cu_raw0(d, t[k].s1);
        r.s2 = (float *)dl__cu_raw0(d, t[k].s2);
        memcpy(c->htab + sizeof(dl__mtent) * (size_t)k, &r, sizeof r);
        memcpy(c->htab + tb + sizeof(int64_t) * (size_t)k, &c->total, sizeof c->total);
        c->total += t[k].n;
    }
    memcpy(c->htab + tb + sizeof(int64_t) * (size_t)nt, &c->total, sizeof c->total);
    c->loaded = false;
}

static bool dl__cucap_pre(dl__dev *d, void *dst, const void *src, size_t bytes, bool run, cudaEvent_t ev);

/* t NULL: room for nt tensors and argbytes, nothing run (an optimizer's creation) */
static void dl__cu_mt_apply(dl__dev *d, void **cache, int kind, int nt, const dl__mtent *t, const void *args,
                            size_t argbytes, const dl__mtacc *acc)
{
    dl__cuimpl *m = dl__cu_enter(d);
    dl__cumt *c = (dl__cumt *)*cache;
    dl__cuf_mt f;
    if (!t) {
        if (!c && nt > 0 && (c = dl__cu_mt_new(d, NULL, nt, argbytes)) != NULL) *cache = c;
        return;
    }
    if (nt <= 0 || ((DL__CU_EXP & 2) && kind == DL__MT_ZERO)) return;
    if (!c || c->nt != nt || argbytes > c->argcap || memcmp(c->host, t, sizeof(dl__mtent) * (size_t)nt) != 0) {
        if (!c || c->pinned || nt > c->cap || argbytes > c->argcap) {   /* a new list (the old kept) */
            dl__cumt *n = dl__cu_mt_new(d, c, c && c->cap > nt ? c->cap : nt,
                                        c && c->argcap > argbytes ? c->argcap : argbytes);
            if (!n) return;
            *cache = c = n;
        }
        dl__cu_mt_fill(d, c, nt, t);
    }
    if (m->cap) c->pinned = true;
    if (!c->loaded) {   /* the table on the device: queued once, or at each run of a capture */
        if (m->cap) {
            if (!dl__cucap_pre(d, c->dt, c->htab, dl__cu_mt_bytes(c), false, NULL)) return;
        } else if (m->emulate) {
            memcpy(c->dt, c->htab, dl__cu_mt_bytes(c));
            c->loaded = true;
        } else {
            if (!dl__cu_ok(d, "cudaMemcpyAsync (multi-tensor table)",
                           cudaMemcpyAsync(c->dt, c->htab, dl__cu_mt_bytes(c), cudaMemcpyHostToDevice, m->stream)))
                return;
            c->loaded = true;
        }
    }
    if (argbytes) {
        /* a capture began on a synchronized stream: no copy out of hargs is pending */
        if (!m->emulate && !m->cap &&
            !dl__cu_ok(d, "cudaEventSynchronize (multi-tensor)", cudaEventSynchronize(c->ev)))
            return;
        memcpy(c->hargs, args, argbytes);
        if (m->cap) {   /* every run of the graph copies them first (a replay's hook rewrites them) */
            if (!dl__cucap_pre(d, c->dargs, c->hargs, argbytes, true, c->ev)) return;
        } else if (m->emulate) {
            memcpy(c->dargs, c->hargs, argbytes);
        } else if (!dl__cu_ok(d, "cudaMemcpyAsync (multi-tensor)",
                              cudaMemcpyAsync(c->dargs, c->hargs, argbytes, cudaMemcpyHostToDevice, m->stream)) ||
                   !dl__cu_ok(d, "cudaEventRecord (multi-tensor)", cudaEventRecord(c->ev, m->stream))) {
            return;
        }
    }
    f.t = c->dt; f.off = c->doff; f.args = c->dargs; f.nt = nt; f.kind = kind;
    memset(&f.acc, 0, sizeof f.acc);
    if (acc) {   /* (the sums' sources: device pointers) */
        int k;
        f.acc.has = acc->has;
        f.acc.first = acc->first;
        for (k = 0; k < DL__AXM; k++) {
            const float *sk = acc->src[k];
            if ((acc->has >> k) & 1) f.acc.src[k] = DL__CUP(d, sk);
        }
    }
    dl__cu_run<int64_t>(d, kind == DL__MT_ZERO ? "zero (multi-tensor)" : acc ? "gradient sums + optimizer "
                        "(multi-tensor)" : "optimizer (multi-tensor)", c->total, f);
}

/* the arguments of the next run of this list's update (a capture's: the
   list the capture was recorded with, maybe no longer the current one) */
static void dl__cu_mt_args(dl__dev *d, void *cache, const void *args, size_t argbytes)
{
    dl__cuimpl *m = dl__cu_enter(d);
    dl__cumt *c = (dl__cumt *)cache;
    if (!c || !argbytes || argbytes > c->argcap) return;
    if (!m->emulate && !dl__cu_ok(d, "cudaEventSynchronize (multi-tensor)", cudaEventSynchronize(c->ev))) return;
    memcpy(c->hargs, args, argbytes);
}

/* ===========================================================================
 * Capture: stream capture into a CUDA graph (dl__backend.cap_*; dl.h's
 * section "capture and replay" has the whole story)
 * ========================================================================= */

/* a copy from pinned host memory at the start of every run, and the event
   recorded after the run's copies (once per event); run: the host rewrites
   the source between runs (a value of the run: dl__cu_setarg's) */
static bool dl__cucap_pre(dl__dev *d, void *dst, const void *src, size_t bytes, bool run, cudaEvent_t ev)
{
    dl__cucap *c = DL__CUI(d)->cap;
    size_t i;
    if ((DL__CU_EXP & 1) && run) return true;   /* (a table's copy stays: its kernels would read garbage) */
    if (!dl__cu_vgrow((void **)&c->pre, &c->cappre, c->npre + 1, sizeof(dl__cu_pre)) ||
        !dl__cu_vgrow((void **)&c->ev, &c->capev, c->nev + 1, sizeof(cudaEvent_t))) {
        c->failed = true;
        dl__dev_fail(d, "cuda:%d: out of host memory recording a capture", d->id.index);
        return false;
    }
    c->pre[c->npre].dst = dst;
    c->pre[c->npre].src = src;
    c->pre[c->npre].bytes = bytes;
    c->pre[c->npre].run = run;
    c->npre++;
    if (!ev) return true;
    for (i = 0; i < c->nev; i++) if (c->ev[i] == ev) return true;
    c->ev[c->nev++] = ev;
    return true;
}

/* dl__cu_setk's node: one warp, args[0] its dl__cu_setarg */
static cudaKernelNodeParams dl__cu_setk_params(void **args)
{
    cudaKernelNodeParams kp = cudaKernelNodeParams();
    kp.func = (void *)dl__cu_setk;
    kp.gridDim = dim3(1, 1, 1);
    kp.blockDim = dim3(32, 1, 1);
    kp.kernelParams = args;
    return kp;
}

/* the run's values (the copies marked run) into c->set's parameters, as
   their sources hold them now; false: they do not fit (c->set unchanged) */
static bool dl__cucap_pack(dl__cucap *c)
{
    size_t i;
    int n = 0, off = 0;
    for (i = 0; i < c->npre; i++) {
        const dl__cu_pre *p = &c->pre[i];
        if (!p->run) continue;
        if (n == DL__CU_SETN || p->bytes > (size_t)(DL__CU_SETPAY - off)) return false;
        c->set->dst[n] = p->dst;
        c->set->len[n] = (int)p->bytes;
        c->set->off[n] = off;
        memcpy(c->set->pay + off, p->src, p->bytes);
        off += (int)((p->bytes + 7) / 8 * 8);
        n++;
    }
    c->set->n = n;
    return true;
}

static void dl__cu_cap_free(dl__dev *d, void *cv)
{
    dl__cuimpl *m = dl__cu_enter(d);
    dl__cucap *c = (dl__cucap *)cv;
    size_t i;
    if (!c) return;
    if (m->cap == c) {   /* still recording: the stream stops, the graph is dropped */
        m->cap = NULL;
        if (!m->emulate) {
            cudaGraph_t g = NULL;
            if (cudaStreamEndCapture(m->stream, &g) == cudaSuccess && g) (void)cudaGraphDestroy(g);
        }
    }
    if (!m->emulate) {
        /* a run of it may be under way; not while another capture records
           (that would end it; its begin waited for every run before) */
        if (!m->cap) (void)cudaStreamSynchronize(m->stream);
        if (c->exec) (void)cudaGraphExecDestroy(c->exec);
        if (c->graph) (void)cudaGraphDestroy(c->graph);
        if (c->hrng) (void)cudaFreeHost(c->hrng);
        if (c->rng_ev) (void)cudaEventDestroy(c->rng_ev);
        (void)cudaGetLastError();
    } else {
        DL_FREE(c->hrng);
    }
    for (i = 0; i < c->nops; i++) DL_FREE(c->ops[i].f);
    for (i = 0; i < c->nblocks; i++) dl__cu_block_put(d, c->blocks[i]);
    DL_FREE(c->ops);
    DL_FREE(c->blocks);
    DL_FREE(c->pre);
    DL_FREE(c->ev);
    DL_FREE(c->set);
    DL_FREE(c);
}

/* The stream (an emulated device: the list) starts recording, after the
   work queued so far has finished. The run's {seed, counter} are its first
   copy. NULL with the failure recorded. */
static void *dl__cu_cap_begin(dl__dev *d, uint64_t rng0)
{
    dl__cuimpl *m = dl__cu_enter(d);
    dl__cucap *c = (dl__cucap *)DL_MALLOC(sizeof(dl__cucap));
    cudaError_t e = cudaSuccess;
    if (!c) { dl__dev_fail(d, "cuda:%d: out of host memory for a capture", d->id.index); return NULL; }
    memset(c, 0, sizeof *c);
    c->rng0 = rng0;
    m->cap = c;
    if (!(c->drng = (uint64_t *)dl__cucap_block(d, 2 * sizeof(uint64_t)))) goto fail;
    if (m->emulate) c->hrng = (uint64_t *)DL_MALLOC(2 * sizeof(uint64_t));
    else if ((e = cudaHostAlloc((void **)&c->hrng, 2 * sizeof(uint64_t), cudaHostAllocDefault)) != cudaSuccess ||
             (e = cudaEventCreateWithFlags(&c->rng_ev, cudaEventDisableTiming)) != cudaSuccess) {
        dl__cu_fail(d, "capture set-up", e);
        goto fail;
    }
    if (!c->hrng || !dl__cucap_pre(d, c->drng, c->hrng, 2 * sizeof(uint64_t), true, c->rng_ev)) goto fail;
    if (!m->emulate &&
        (!dl__cu_ok(d, "cudaStreamSynchronize (capture)", cudaStreamSynchronize(m->stream)) ||
         !dl__cu_ok(d, "cudaStreamBeginCapture",
                    cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeRelaxed))))
        goto fail;
    return c;
fail:
    if (!d->failed) dl__dev_fail(d, "cuda:%d: out of memory starting a capture", d->id.index);
    m->cap = NULL;
    dl__cu_cap_free(d, c);
    return NULL;
}

/* the per-run copies become the graph's first nodes: every node without a
   dependency (a root) waits for them, and their events follow them; with
   c->set, its kernel node takes the place of the copies marked run (and
   their events) */
static bool dl__cu_graph_prefix(dl__dev *d, dl__cucap *c)
{
    size_t nroot = 0, i, j, np = 0;
    cudaGraphNode_t *roots = NULL, *cp = NULL, evn;
    bool ok = false;
    if (!dl__cu_ok(d, "cudaGraphGetRootNodes", cudaGraphGetRootNodes(c->graph, NULL, &nroot))) return false;
    roots = (cudaGraphNode_t *)DL_MALLOC(sizeof(cudaGraphNode_t) * (nroot + 1));
    cp = (cudaGraphNode_t *)DL_MALLOC(sizeof(cudaGraphNode_t) * (c->npre + 1));
    if (!roots || !cp) { dl__dev_fail(d, "cuda:%d: out of host memory finishing a capture", d->id.index); goto out; }
    if (!dl__cu_ok(d, "cudaGraphGetRootNodes", cudaGraphGetRootNodes(c->graph, roots, &nroot))) goto out;
    for (i = 0; i < c->npre; i++) {
        if (c->set && c->pre[i].run) continue;
        if (!dl__cu_ok(d, "cudaGraphAddMemcpyNode1D",
                       cudaGraphAddMemcpyNode1D(&cp[np++], c->graph, NULL, 0, c->pre[i].dst, c->pre[i].src,
                                                c->pre[i].bytes, cudaMemcpyHostToDevice)))
            goto out;
    }
    if (c->set) {
        void *args[1] = {c->set};
        cudaKernelNodeParams kp = dl__cu_setk_params(args);
        if (!dl__cu_ok(d, "cudaGraphAddKernelNode", cudaGraphAddKernelNode(&c->setnode, c->graph, NULL, 0, &kp)))
            goto out;
        cp[np++] = c->setnode;
    } else {
        for (i = 0; i < c->nev; i++)
            if (!dl__cu_ok(d, "cudaGraphAddEventRecordNode",
                           cudaGraphAddEventRecordNode(&evn, c->graph, cp, np, c->ev[i])))
                goto out;
    }
    for (i = 0; i < nroot; i++)
        for (j = 0; j < np; j++)
#if CUDART_VERSION >= 13000
            if (!dl__cu_ok(d, "cudaGraphAddDependencies",
                           cudaGraphAddDependencies(c->graph, &cp[j], &roots[i], NULL, 1)))
#else
            if (!dl__cu_ok(d, "cudaGraphAddDependencies", cudaGraphAddDependencies(c->graph, &cp[j], &roots[i], 1)))
#endif
                goto out;
    ok = true;
out:
    DL_FREE(roots);
    DL_FREE(cp);
    return ok;
}

/* Stops recording; a GPU's graph gets its per-run copies and is
   instantiated. false: the capture failed (the reason recorded). */
static bool dl__cu_cap_end(dl__dev *d, void *cv)
{
    dl__cuimpl *m = dl__cu_enter(d);
    dl__cucap *c = (dl__cucap *)cv;
    size_t nodes = 0;
    m->cap = NULL;
    if (m->replay_args && !c->failed) {   /* (no values to set, or too many: the copies) */
        size_t i;
        for (i = 0; i < c->npre && !c->pre[i].run; i++) {}
        if (i < c->npre && (c->set = (dl__cu_setarg *)DL_MALLOC(sizeof(dl__cu_setarg))) != NULL &&
            !dl__cucap_pack(c)) {
            DL_FREE(c->set);
            c->set = NULL;
        }
    }
    if (m->emulate) {
        c->empty = c->nops == 0;
        return !c->failed;
    }
    {
        cudaError_t e = cudaStreamEndCapture(m->stream, &c->graph);
        if (e != cudaSuccess || !c->graph) {
            dl__cu_fail(d, "cudaStreamEndCapture", e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated);
            (void)cudaGetLastError();
            return false;
        }
    }
    if (c->failed) return false;
    if (!dl__cu_ok(d, "cudaGraphGetNodes", cudaGraphGetNodes(c->graph, NULL, &nodes))) return false;
    c->empty = nodes == 0;
    if (c->empty) return true;
    return dl__cu_graph_prefix(d, c) && dl__cu_ok(d, "cudaGraphInstantiate", cudaGraphInstantiate(&c->exec, c->graph, 0));
}

/* One run: the host writes the run's {seed, counter} once the previous
   run has copied them (it waits for nothing else), then one launch. */
static bool dl__cu_cap_launch(dl__dev *d, void *cv, uint64_t seed, uint64_t rng)
{
    dl__cuimpl *m = dl__cu_enter(d);
    dl__cucap *c = (dl__cucap *)cv;
    size_t i;
    if (c->empty) return true;
    if (!m->emulate && !c->set &&
        !dl__cu_ok(d, "cudaEventSynchronize (replay)", cudaEventSynchronize(c->rng_ev)))
        return false;
    c->hrng[0] = seed;
    c->hrng[1] = rng;
    if (c->set) (void)dl__cucap_pack(c);   /* (they fitted at the end of the capture: they fit) */
    if (m->emulate) {   /* the graph's first nodes, then its work */
        for (i = 0; i < c->npre; i++)
            if (!c->set || !c->pre[i].run) memcpy(c->pre[i].dst, c->pre[i].src, c->pre[i].bytes);
        if (c->set) dl__cu_set_run(*c->set, 0, 1);
        for (i = 0; i < c->nops; i++) c->ops[i].run(c->ops[i].f, c->ops[i].n);
        return true;
    }
    if (c->set) {
        void *args[1] = {c->set};
        cudaKernelNodeParams kp = dl__cu_setk_params(args);
        if (!dl__cu_ok(d, "cudaGraphExecKernelNodeSetParams", cudaGraphExecKernelNodeSetParams(c->exec, c->setnode, &kp)))
            return false;
    }
    if (!dl__cu_ok(d, "cudaGraphLaunch", cudaGraphLaunch(c->exec, m->stream))) return false;
    return !m->sync_each || dl__cu_ok(d, "cudaStreamSynchronize (replay)", cudaStreamSynchronize(m->stream));
}

/* ===========================================================================
 * The backend, and opening / closing devices
 * ========================================================================= */

static const dl__backend dl__cuda_backend = {
    "cuda",
    dl__cu_alloc, dl__cu_free, dl__cu_upload, dl__cu_download, dl__cu_copy, dl__cu_peer,
    dl__cu_sync,
    dl__cu_prof_mark, dl__cu_prof_seconds, dl__cu_prof_release,
    dl__cu_rand, dl__cu_arange, dl__cu_fill, dl__cu_add_i64,
    dl__cu_unary, dl__cu_binary, dl__cu_reduce, dl__cu_argmax, dl__cu_onehot, dl__cu_copy_nd,
    dl__cu_axpy, dl__cu_nonfinite, dl__cu_gemm, dl__cu_softmax,
    dl__cu_class_mask, dl__cu_dropout_mask, dl__cu_bce_logits,
    dl__cu_im2col, dl__cu_col2im, dl__cu_bias_add, dl__cu_max_pool, dl__cu_unpool,
    dl__cu_gather, dl__cu_load_batch, dl__cu_avg_pool, dl__cu_avg_pool_adj,
    dl__cu_bn_stats, dl__cu_bn_apply, dl__cu_bn_backward, dl__cu_ln_forward, dl__cu_ln_backward,
    dl__cu_sgd, dl__cu_adam, dl__cu_sumsq, dl__cu_scale,
    NULL, NULL,   /* conv_s1, conv_s1_wgrad: the padded grid is a CPU cache layout; */
    NULL, NULL,   /* conv_wg, conv_wg_wgrad: so is Winograd here (cuBLAS on im2col instead) */
    dl__cu_conv_i2c, dl__cu_convT_i2c, dl__cu_conv_i2c_wgrad,
    dl__cu_cap_begin, dl__cu_cap_end, dl__cu_cap_launch, dl__cu_cap_free,
    dl__cu_mt_apply, dl__cu_mt_args, dl__cu_mt_free,
    dl__cu_axpy_multi,
    dl__cu_class_loss, dl__cu_class_loss_bwd,
    dl__cu_chan_sum,
    dl__cu_eq_i64,
    dl__cu_bias_act, dl__cu_bias_act_bwd,
    dl__cu_conv_act,
    dl__cu_bn_pool, dl__cu_bn_pool_bwd,
    dl__cu_bn_eval,
    dl__cu_colsum_fused,
    dl__cu_bn_stats_add,
    dl__cu_embed, dl__cu_embed_bwd,
    dl__cu_convert, dl__cu_select,
    NULL,  /* softmax_bwd: the binary and reduce launches */
    dl__cu_unary_bwd,
    dl__cu_cumsum
};

static int dl__cuda_count(void)
{
    int n = 0;
    if (dl__cu_emu_count() > 0) return dl__cu_emu;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { (void)cudaGetLastError(); return 0; }
    return n > 0 ? n : 0;
}

/* everything d->impl holds, given back (a partly opened device too) */
static void dl__cu_teardown(dl__dev *d)
{
    dl__cuimpl *m = DL__CUI(d);
    size_t i;
    int k;
    if (!m) return;
    if (!m->emulate) {
        (void)cudaSetDevice(m->ordinal);
        if (m->stream) (void)cudaStreamSynchronize(m->stream);
        if (m->blas) (void)cublasDestroy(m->blas);
#ifdef DL_CUDNN
        dl__dnn_teardown(m);
#endif
        for (k = 0; k < 2; k++) {
            if (m->stage[k]) (void)cudaFreeHost(m->stage[k]);
            if (m->stage_ev[k]) (void)cudaEventDestroy(m->stage_ev[k]);
        }
        if (m->hres) (void)cudaFreeHost(m->hres);
        if (m->peer_ev) (void)cudaEventDestroy(m->peer_ev);
        for (k = 0; k < m->npev; k++) (void)cudaEventDestroy(m->pev[k]);
    } else if (m->hres) {
        DL_FREE(m->hres);
    }
    /* every block: the cache, scratch, workspace, and anything still live */
    for (i = 0; i < m->nlive; i++) dl__cu_raw_free(d, m->live[i].p);
    m->nlive = 0;
    dl__cu_release_cache(d);
    if (!m->emulate && m->stream) (void)cudaStreamDestroy(m->stream);
    (void)cudaGetLastError();
    DL_FREE(m->freel);
    DL_FREE(m->live);
    DL_FREE(m->pev);
    DL_FREE(m);
    d->impl = NULL;
}

static void dl__cuda_close(dl__dev *d)
{
    if (d) dl__cu_teardown(d);
}

static const char *dl__cu_envflag(const char *name)
{
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0 ? e : NULL;
}

/* a mode variable: unset or empty 1 (the default), else one digit 0..top;
   -1 for any other value */
static int dl__cu_envmode(const char *name, int top)
{
    const char *e = getenv(name);
    if (!e || !*e) return 1;
    return e[0] >= '0' && e[0] <= '0' + top && !e[1] ? e[0] - '0' : -1;
}

/* cuda:index for ctx: stream, cuBLAS handle (+ workspace), pinned staging,
   result buffers. NULL with DL_ERR_DEVICE naming op when there is no such GPU. */
static dl__dev *dl__cuda_open(dl_ctx *ctx, int index, const char *op)
{
    dl__dev *d;
    dl__cuimpl *m;
    cudaError_t e = cudaSuccess;
    cublasStatus_t st;
    const char *what = "";
    int n = 0, k, dnn_mode, direct, replay_args, pdl;
    long ws_mib = 32;
    bool emu = dl__cu_emu_count() > 0;
    if (emu) {
        n = dl__cu_emu;
    } else {
        e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess || n <= 0) {
            (void)cudaGetLastError();
            dl__err(ctx, DL_ERR_DEVICE, "%s: cuda:%d requested but no CUDA device is available: %s", op,
                    index, e != cudaSuccess ? cudaGetErrorString(e) : "the CUDA runtime found no GPU");
            return NULL;
        }
    }
    if (index < 0 || index >= n) {
        dl__err(ctx, DL_ERR_DEVICE, "%s: cuda:%d requested but this machine has %d CUDA device%s "
                "(cuda:0 to cuda:%d)%s", op, index, n, n == 1 ? "" : "s", n - 1,
                emu ? " (emulated: DL_CUDA_EMULATE)" : "");
        return NULL;
    }
    dnn_mode = dl__cu_envmode("DL_CUDNN", 2);
    if (dnn_mode < 0) {
        dl__err(ctx, DL_ERR_ARG, "%s: opening cuda:%d: DL_CUDNN=%s must be 0 (no convolution through cuDNN), 1 "
                "(those with at least %d input and output channels; the default) or 2 (every one cuDNN takes)",
                op, index, getenv("DL_CUDNN"), DL__DNN_MIN_C);
        return NULL;
    }
    replay_args = dl__cu_envmode("DL_CUDA_REPLAY_ARGS", 1);
    if (replay_args < 0) {
        dl__err(ctx, DL_ERR_ARG, "%s: opening cuda:%d: DL_CUDA_REPLAY_ARGS=%s must be 1 (a replay's changing "
                "values set as one kernel node's parameters; the default) or 0 (copied from pinned host memory "
                "by the graph's first nodes)", op, index, getenv("DL_CUDA_REPLAY_ARGS"));
        return NULL;
    }
    pdl = getenv("DL_CUDA_PDL") && *getenv("DL_CUDA_PDL") ? dl__cu_envmode("DL_CUDA_PDL", 1) : 0;
    if (pdl < 0) {
        dl__err(ctx, DL_ERR_ARG, "%s: opening cuda:%d: DL_CUDA_PDL=%s must be 0 (each kernel launched after the "
                "previous one ends; the default) or 1 (programmatic dependent launches, compute capability 9.0 "
                "and up)", op, index, getenv("DL_CUDA_PDL"));
        return NULL;
    }
    if (getenv("DL_CUDA_BLAS_WS") && *getenv("DL_CUDA_BLAS_WS")) {
        const char *w = getenv("DL_CUDA_BLAS_WS");
        char *end = NULL;
        ws_mib = strtol(w, &end, 10);
        if (*w < '0' || *w > '9' || *end || ws_mib < 0 || ws_mib > 4096) {
            dl__err(ctx, DL_ERR_ARG, "%s: opening cuda:%d: DL_CUDA_BLAS_WS=%s must be a whole number of MiB from 0 "
                    "to 4096 (cuBLAS's workspace; the default 32; 0: none, so no split-K GEMM)", op, index, w);
            return NULL;
        }
    }
    direct = dl__cu_envmode("DL_CONV_DIRECT", 2);
    if (direct < 0) {
        dl__err(ctx, DL_ERR_ARG, "%s: opening cuda:%d: DL_CONV_DIRECT=%s must be 0 (every convolution through "
                "im2col and cuBLAS, or cuDNN), 1 (those with under %d input or output channels per group by "
                "direct sums, in shared memory where they fit; the default) or 2 (direct sums, a thread an "
                "element)", op, index, getenv("DL_CONV_DIRECT"), DL__DNN_MIN_C);
        return NULL;
    }
    d = dl__dev_new(ctx, dl_cuda(index), &dl__cuda_backend);
    m = (dl__cuimpl *)DL_MALLOC(sizeof(dl__cuimpl));
    if (!d || !m) {
        DL_FREE(d);
        DL_FREE(m);
        dl__err(ctx, DL_ERR_OOM, "%s: out of host memory opening cuda:%d", op, index);
        return NULL;
    }
    memset(m, 0, sizeof *m);
#ifdef DL_CUDNN
    m->dnn_mode = dnn_mode;
    m->dnn_check = dl__cu_envflag("DL_CUDNN_CHECK") != NULL;
#endif
    d->impl = m;
    m->direct = direct;
    m->replay_args = replay_args == 1;
    m->pdl = emu && pdl == 1;   /* (emulated: the mode only; a GPU's below) */
    m->ordinal = index;
    m->emulate = emu;
    m->sync_each = dl__cu_envflag("DL_CUDA_SYNC") != NULL;
    if (emu) {
#if UINTPTR_MAX > 0xffffffffu
        d->tag = (uintptr_t)1 << 52;   /* host code that touches its data faults */
#endif
        m->max_blocks = 1;
        m->hres = DL_MALLOC(64);
        m->dres = dl__cu_block_get(d, 64, &e);
        if (!m->hres || !m->dres) { what = "host memory"; e = cudaErrorMemoryAllocation; goto fail; }
        dl__cuda_set_tf32(d, ctx->allow_tf32, ctx->allow_tf32_conv);
        return d;
    }
    {
        int nsm = 0;
#define DL__CU_TRY(call, name) do { what = name; if ((e = (call)) != cudaSuccess) goto fail; } while (0)
        DL__CU_TRY(cudaSetDevice(index), "cudaSetDevice");
        DL__CU_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, index),
                   "cudaDeviceGetAttribute");
        m->max_blocks = (nsm > 0 ? nsm : 1) * (2048 / DL__CU_THREADS);
        if (pdl) {   /* (the kernels wait only in code built for 9.0 and up: else plain launches) */
            cudaFuncAttributes fa;
            DL__CU_TRY(cudaFuncGetAttributes(&fa, dl__cu_setk), "cudaFuncGetAttributes");
            m->pdl = fa.ptxVersion >= 90;   /* (__CUDA_ARCH__ of the code that runs) */
        }
        DL__CU_TRY(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), "cudaStreamCreate");
        for (k = 0; k < 2; k++)
            DL__CU_TRY(cudaEventCreateWithFlags(&m->stage_ev[k], cudaEventDisableTiming), "cudaEventCreate");
        DL__CU_TRY(cudaEventCreateWithFlags(&m->peer_ev, cudaEventDisableTiming), "cudaEventCreate");
        DL__CU_TRY(cudaHostAlloc(&m->hres, 64, cudaHostAllocDefault), "cudaHostAlloc");
        m->dres = dl__cu_block_get(d, 64, &e);
        m->ticket = (unsigned *)dl__cu_block_get(d, 64, &e);
        if (!m->dres || !m->ticket) { what = "cudaMalloc"; goto fail; }
        DL__CU_TRY(cudaMemsetAsync(m->ticket, 0, 64, m->stream), "cudaMemsetAsync");
        for (k = 0; k < 2; k++)   /* without pinned staging, uploads go through CUDA and wait */
            if (cudaHostAlloc((void **)&m->stage[k], DL__CU_STAGE, cudaHostAllocDefault) != cudaSuccess) {
                (void)cudaGetLastError();
                if (m->stage[0]) (void)cudaFreeHost(m->stage[0]);
                m->stage[0] = m->stage[1] = NULL;
                break;
            }
#undef DL__CU_TRY
    }
    st = cublasCreate(&m->blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        m->blas = NULL;
        dl__err(ctx, DL_ERR_DEVICE, "%s: cuda:%d: cublasCreate: %s", op, index, cublasGetStatusString(st));
        dl__cu_teardown(d);
        DL_FREE(d);
        return NULL;
    }
    what = "cuBLAS set-up";
    if (cublasSetStream(m->blas, m->stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(m->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
        e = cudaErrorUnknown;
        goto fail;
    }
    /* cuBLAS's workspace from our cache (32 MiB, NVIDIA's advice for Hopper; DL_CUDA_BLAS_WS MiB,
       where 0 gives it none: its algorithms that split K and add the parts in a second kernel, a
       graph node more each, cannot run then; an experiment, not yet measured) */
    m->blas_ws_size = (size_t)ws_mib << 20;
    m->blas_ws = m->blas_ws_size ? dl__cu_block_get(d, m->blas_ws_size, &e) : NULL;
    if (!m->blas_ws_size) (void)cublasSetWorkspace(m->blas, NULL, 0);
    if (m->blas_ws && cublasSetWorkspace(m->blas, m->blas_ws, m->blas_ws_size) != CUBLAS_STATUS_SUCCESS) {
        dl__cu_block_put(d, m->blas_ws);
        m->blas_ws = NULL;
    }
    (void)cudaGetLastError();
    m->blas_tf32 = 0;   /* CUBLAS_DEFAULT_MATH, set above */
    dl__cuda_set_tf32(d, ctx->allow_tf32, ctx->allow_tf32_conv);
    return d;
fail:
    dl__err(ctx, DL_ERR_DEVICE, "%s: cuda:%d: %s: %s", op, index, what, cudaGetErrorString(e));
    dl__cu_teardown(d);
    DL_FREE(d);
    return NULL;
}

#endif /* DL__CUDA_CUH */
