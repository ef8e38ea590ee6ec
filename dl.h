/* dl.h - v0.1 - a deep-learning library in one C header: tensors, dynamic-tape
   autograd, layers, optimizers.                         public domain / MIT-0

   Do this:
       #define DL_IMPLEMENTATION
   before you include this file in *one* C (or C++) file to create the
   implementation. Every other file includes it without the define. With
   DL_CUDA that one file is compiled by nvcc (docs/cuda.md, Building).

   QUICK START (compiled and run by `make test`: tests/snippets_check.sh)

       #define DL_IMPLEMENTATION
       #include "dl.h"
       #include <stdio.h>
       int main(void) {
           dl_ctx *ctx = dl_ctx_init(NULL);              // NULL: defaults
           dl_tensor *w = dl_param(dl_randn(ctx, DL_SHAPE(3, 1))); // persistent, requires grad
           for (int step = 0; step < 100; step++) {
               dl_tensor *x = dl_randn(ctx, DL_SHAPE(16, 3));   // step memory
               dl_tensor *y = dl_sum(x, DL_DIMS(1), true);      // target: row sums
               dl_tensor *d = dl_sub(dl_matmul(x, w), y);
               dl_tensor *loss = dl_mean(dl_mul(d, d), DL_ALL, false);
               if (!loss) { fprintf(stderr, "%s\n", dl_error_message(ctx)); break; }
               dl_backward(loss);                             // grads land in w->grad
               dl_sgd_update(w, 0.1f);                        // w -= 0.1 * grad; grad = 0
               if (step % 20 == 0) printf("step %d loss %.5f\n", step, dl_item(loss));
               dl_step_end(ctx);                              // frees all step memory: O(1)
           }
           dl_ctx_free(ctx);                                  // frees everything
           return 0;
       }

   BUILD FLAGS (define before including, in every file that includes dl.h)
       DL_IMPLEMENTATION   emit the implementation (one translation unit)
       DL_NO_IMPLEMENTATION  ignore this file's DL_IMPLEMENTATION: the implementation
                           is linked from another object (make builds dl.h once for
                           all the one-file programs of examples/ that way)
       DL_OPENBLAS         matrix products through cblas_sgemm (link -lopenblas)
       DL_ZLIB             dl_idx_load reads .gz files (link -lz)
       DL_CUDA             tensors on NVIDIA GPUs too (dl_cuda(i)): dl_cuda.cuh, the
                           implementation file compiled by nvcc -x cu (link -lcudart
                           -lcublas); DL_CUDA_EMULATE=N emulates N GPUs in host memory;
                           on GPUs, convolutions with under 16 channels per group are
                           direct sums (env DL_CONV_DIRECT=0: im2col and cuBLAS)
       DL_CUDNN            with DL_CUDA: convolutions through cuDNN (link -lcudnn) where
                           it takes them; env DL_CUDNN=0|1|2 (none, 16+ channels: the
                           default, all) chooses at run time (docs/cuda.md)
       DL_NO_WINOGRAD      3x3 convolutions as direct sums only: no Winograd F(4x4, 3x3)
                           (AVX-512 builds take it otherwise: faster, within 1e-4
                           relative of the direct sums)
       DL_NO_THREADS       single-threaded build (no pthreads; implied where the
                           compiler lacks GCC's __atomic builtins)
       DL_ABORT_ON_ERROR   trap at the first error (for a debugger)
       DL_DEBUG            checks that cost memory: a dl_free()d tensor's header is
                           kept, poisoned, so a use after free is an error naming
                           it (make sanitize builds with it)
       DL_NO_MMAP          no address-space reservation for step headers (then a
                           stale step tensor is detected through the next step only)
       DL_MALLOC/DL_REALLOC/DL_FREE   host allocator (define all three or none)
       DL_ASSERT(x)        internal invariants (default: assert)
       DL_MAX_DIMS         most dimensions a tensor may have (default 8)
       DL_API              storage class of the public functions (default extern)
       DL_MPI              dl_comm across processes over MPI (build with mpicc,
                           launch with mpirun; see DATA PARALLEL)
       DL_NCCL             dl_comm over NCCL (nvcc, link -lnccl; with DL_MPI the
                           unique id goes over MPI)

   CONCEPTS
     Tensors. float32 values (int32/int64 for labels and indices), contiguous
       row-major. Shapes are passed as a dl_shape value: DL_SHAPE(2, 3, 4).
       reshape/flatten/squeeze/unsqueeze are views sharing storage;
       permute/transpose/narrow/cat copy. Elementwise binary ops broadcast as
       NumPy/PyTorch do.
     Context and memory. A dl_ctx owns everything. Tensors made by ops and
       creators live in *step memory*, released all at once (O(1)) by
       dl_step_end(); the blocks are kept, so a steady loop stops calling
       malloc after its first step. dl_keep() copies a tensor into *persistent*
       memory (parameters, optimizer state, datasets), freed by dl_free() or
       dl_ctx_free(). Using a step tensor after its step ended is an error
       (DL_ERR_STALE), however many steps later: step tensor headers get
       addresses that are never reused (on 64-bit POSIX systems; elsewhere,
       and with DL_NO_MMAP, through the next step only).
     Tape and backward. An op records a tape node when an input requires grad
       and grad mode is on. dl_backward(loss) walks the tape in reverse
       creation order and accumulates gradients into leaves' ->grad, then
       releases the graph (retain_graph keeps it). Backward rules are written
       with dl.h's own ops, so create_graph gives gradients of gradients.
       A tensor's storage has a version (torch's t._version) that every
       in-place write through the API bumps: dl_write, dl_fill_, dl_copy_,
       zero_grad, optimizer steps, dl_init_*, dl_load, the collectives, batch
       norm's running statistics; views share it. An op keeps the versions
       of what its backward reads (a custom function: of its dl_fn_save
       tensors), and dl_backward refuses (DL_ERR_GRAPH, PyTorch's "modified
       by an inplace operation" message) when one moved since the forward,
       instead of computing the gradient from the new values.
     Devices. A tensor lives on one device; ops never move data implicitly.
     Layers and losses. dl_conv1d/2d/3d, dl_conv_transpose*, pooling,
       dl_batch_norm, dl_layer_norm, dl_dropout, dl_cross_entropy and friends
       are ops like the rest, with descriptor structs: a zeroed desc (or NULL)
       means PyTorch's defaults, and {.field = v} means the keyword argument
       (dl_conv_desc_make, dl_pool_desc_make fill the common cases).
     Modules and optimizers. A dl_module is a forward callback with named
       parameters, buffers and children (PyTorch's state_dict names and
       default initialization); dl_nn_linear, dl_nn_conv2d, dl_nn_sequential
       ... are built in, user modules are a state struct and a callback.
       dl_sgd/dl_adam/dl_adamw step them; dl_save/dl_load write and read
       safetensors checkpoints (parameters, buffers, optimizer state).
     Data. dl_idx_load reads (Fashion-)MNIST files; dl_tensor_dataset plus
       dl_loader give shuffled, augmented minibatches prepared by worker
       threads, or, with dl_loader_desc.device_data, made on the device
       from the whole dataset kept there as bytes (the same batches: order,
       crops, flips and normalization bit for bit).
     Errors. An op given bad input returns NULL and records one message that
       names the op, the operands and the rule; an op given NULL returns NULL
       silently, so a whole forward pass needs one check. Calls that return
       no tensor return a dl_result. Messages also go to a log callback
       (default: stderr).

   DATA PARALLEL
     dl_allreduce(t, n, DL_REDUCE_SUM or _MEAN) sums n same-shaped float32
     tensors, one per device of one context, in place: a chunked ring
     (reduce-scatter, then all-gather) through the backends' copy entries
     (on CPU devices only, one fused pass over host memory that sums in the
     ring's order), so every replica ends with the same bits; dl_broadcast copies one to the
     rest. dl_ddp trains replicas of a model as one model on the full batch:

       dl_module *net[2]; dl_optim *opt[2];            // ctx: cpu_devices = 2
       for (int i = 0; i < 2; i++) {
           net[i] = make_model(ctx);                   // the same model twice
           dl_module_to(net[i], dl_cpu_device(i));     // or dl_cuda(i)
           opt[i] = dl_adam(net[i], &ad);
       }
       dl_ddp *dp = dl_ddp_init(2, net, opt, NULL);    // replica 0's weights to all
       while (dl_loader_next(loader, &x, &y) > 0) {
           float loss;                                 // loss_fn(m, x, y, user) per replica
           if (dl_ddp_step(dp, x, y, loss_fn, NULL, &loss) != DL_OK) break;
           dl_step_end(ctx);
       }

     dl_ddp_step splits the batch by rows, runs forward and backward on each
     replica, sums the gradients (weighted by each part's rows, in flat
     buckets of dl_ddp_desc.bucket_bytes) and steps every optimizer. The
     replicas of one context run one after another on the calling thread
     (a context is single-threaded); each kernel uses the context's thread
     pool, and CUDA devices queue work asynchronously, so devices overlap.
     Batch-norm running statistics stay per replica, as in PyTorch's
     DataParallel; evaluate with replica 0. DL_DEBUG builds check after each
     step that the replicas' parameters are identical (dl_ddp_check).
     Across processes (-DDL_MPI, mpirun -np N): dl_comm_init(ctx, &{.backend =
     DL_COMM_MPI}) and dl_ddp_desc.comm; each process passes its part of the
     batch (the same size everywhere) and the training code is unchanged. A
     peer that stops answering fails the call after DL_COMM_TIMEOUT seconds
     (default 300) instead of hanging. For replicas that compute at the same
     time in one process, make the ranks threads: g = dl_comm_group_new(N),
     then in each thread its own context and dl_comm_init(ctx,
     &{.backend = DL_COMM_THREADS, .group = g, .rank = r}), the same
     training code as under MPI (examples/data_parallel.c --ranks N).
     With one replica per MPI process, thread rank or NCCL rank, a
     bucket's sum starts while backward still runs: backward calls a hook
     when a parameter's gradient is complete, and each bucket whose
     gradients are all done is started at once. Thread ranks post it and go
     on (the last rank to post sums it for all); under MPI each bucket runs
     its own ring (its own tag), moved along at every hook and finished
     after backward; under NCCL (CUDA build) ncclAllReduce runs on the
     communicator's own stream after an event on the device's, and the
     device's stream waits for it before the gradients are read back. The
     thread and MPI paths give the bits of summing after backward. The
     replicas of one context sum their buckets after backward.

   CAPTURE AND REPLAY
     The tape is rebuilt every step, and most of a small model's step is
     that host work: checks, tensor headers, tape nodes, a call or a launch
     per kernel. dl_capture_begin(ctx) .. dl_capture_end(cap) records the
     backend work of one step and dl_replay(cap) runs it again on the same
     tensors, without any of that: PyTorch's torch.cuda.graph and
     CUDAGraph.replay(), on every device (CPU devices replay a list of
     kernel calls; a GPU launches one CUDA graph). PyTorch's whole-network
     capture, as a loop (compiled and run by `make test`):

       dl_tensor *x = dl_keep(dl_zeros(ctx, DL_SHAPE(16, 4)));   // static inputs
       dl_tensor *y = dl_keep(dl_zeros(ctx, DL_SHAPE(16, 2)));
       dl_optim *opt = dl_adam(net, NULL);
       dl_tensor *loss = NULL;
       dl_capture *cap = NULL;
       for (int step = 1; step <= 60; step++) {
           float xb[64], yb[32];                     // this step's batch
           for (int i = 0; i < 64; i++) xb[i] = (float)((step * 7 + i) % 13) / 13.0f;
           for (int i = 0; i < 32; i++) yb[i] = xb[2 * i] - xb[2 * i + 1];
           dl_write(x, xb, 64);                      // into the static inputs
           dl_write(y, yb, 32);
           if (step == 4) cap = dl_capture_begin(ctx);   // after 3 eager steps
           if (step <= 4) {                          // eager, or recorded
               dl_optim_zero_grad(opt);
               loss = dl_mse_loss(dl_module_forward(net, x), y, NULL);
               dl_backward(loss);
               dl_optim_step(opt);
           } else if (dl_replay(cap) != DL_OK) break;    // the same work again
           if (step == 4 && dl_capture_end(cap) != DL_OK) break;
           if (step % 20 == 0) printf("loss at step %d: %.5f\n", step, dl_item(loss));
           dl_step_end(ctx);                         // the capture's tensors stay
       }
       dl_capture_free(cap);

     Unlike torch.cuda.graph, dl_capture_end has run the step once, so step
     k of a loop is step k whether it ran eagerly, was captured or was
     replayed, to the bit; and the tensors made inside (the loss,
     activations) belong to the capture: dl_step_end leaves them,
     dl_capture_free releases them. What changes from step to step is read
     at each replay: the RNG counter (dropout), the optimizer's step counts
     and bias corrections, learning rates (dl_optim_set_lr between replays),
     batch norm's num_batches_tracked. The rest is baked in: shapes,
     train/eval mode, the host code's decisions. That is the price of a
     static graph.
     Refused inside a capture (the op fails, naming itself; dl_capture_end
     returns the first error and the capture cannot replay): host reads
     (dl_item, dl_read, dl_data, dl_to to the host, anomaly mode,
     dl_clip_grad_norm), host writes (dl_write, dl_from_array,
     dl_loader_next: write static inputs between replays), persistent
     allocations (warm up first: an eager step makes the gradients and the
     optimizer state), a step tensor made before the capture or one made by
     another capture, collectives, dl_step_end, a second step of one
     optimizer. Freeing the capture, or a persistent tensor or optimizer it
     uses (or moving one with dl_module_to), makes a later replay an error
     (DL_ERR_STALE), not a crash. A replay allocates nothing. On CPU
     devices it keeps cross entropy's check of the targets (a bad one fails
     that replay); docs/capture.md has the details.

   PROFILING
     DL_PROFILE=1 in the environment (or dl_ctx_desc.profile = 1, or
     dl_profile_enable) counts and times every op call and every backward
     node, per device, and dl_ctx_free prints the table that torch.profiler's
     prof.key_averages().table() prints, sorted by total time (to stderr;
     dl_profile_print(ctx, file) prints it on demand, dl_profile_rows gives
     the rows, dl_profile_reset starts over):

         DL_PROFILE=1 build/lenet --epochs 1

     A row is an op ("dl_conv2d") or a backward node ("dl_conv2d backward").
     Total is the time from the op's start to its result; self is the total
     less the time of the ops it called: dl_linear's total holds its
     dl_matmul and dl_add, which are counted under their own names too, and
     a backward node's total holds the ops of its backward rule. Times are
     host wall time on CPU devices and CUDA events on GPUs (the time of the
     device's stream, read without synchronizing until the table is made;
     host time on emulated devices). Creators (dl_zeros, dl_from_array) and
     dl_module_forward are not ops here; dl_optim_step and
     dl_optim_zero_grad are. A call that fails is not counted. Off, each
     hook is one test of a pointer (docs/profiling.md: what it costs, on
     and off, and how to read the table).

   DOES NOT
     - do in-place ops on tensors in a graph (except the documented updates
       of persistent tensors: gradients, optimizer steps);
     - detect use after dl_free() of a persistent tensor outside DL_DEBUG builds
       (as C's free: undefined);
     - support float64 or float16 (yet);
     - synchronize batch-norm statistics across replicas (SyncBatchNorm), or
       overlap the gradient allreduce with backward between the replicas of
       one context (across thread ranks, MPI and NCCL it does);
     - capture copies between GPUs, or between the host and a GPU, or
       collectives (docs/capture.md lists what a capture refuses);
     - promise more GPU testing than this: the CUDA backend (DL_CUDA) and the
       NCCL communicator (DL_NCCL) are tested on emulated devices (make
       test-cuda-emu), and ran on one NVIDIA H100 at 7a1c176: make test-cuda
       151 passed, 1 failed; make test-cuda-all 12,217 passed, 2 failed (the
       three failures were test expectations, not the backend); make
       test-nccl 988 passed. Capture and replay on a GPU, and the
       multi-tensor optimizers, came after that run; they then ran on one
       H200 (2026-11-26, docs/cuda.md, Status).

   CONTENTS: the implementation (below the declarations, in the file that
   defines DL_IMPLEMENTATION) reads top to bottom in this order; each part
   starts with a line "// >>section NAME" (search for it):
     threads and gemm          thread pool; SGEMM (AVX-512 / AVX2 / portable kernels)
     memory                    arenas: persistent and step memory, per device
     devices and backends      dl__backend (every kernel + memory + transfers), dl__dev;
                               elementwise math as one X-macro line per op
     errors, io: files, context
     tensors                   tensor headers, views, the stale-step check
     backend: CPU              the CPU instance of dl__backend (dl_cuda.cuh: the CUDA one)
     capture and replay        recording the CPU's backend calls; dl_capture_begin/end, dl_replay
     autograd: recording       the tape: nodes recorded by ops
     tensors: creation and reading
     autograd: backward        the backward walk, gradient accumulation and recycling
     autograd: custom functions
     ops: elementwise, shape, reductions, matmul and softmax, normalization,
          dropout, losses, convolution and pooling (each op: forward, then its
          backward rule beside it)
     nn: modules, init, built-in modules, layer modules
     optim, optim: schedules and clipping
     data                      IDX files, datasets, the threaded loader
     io: safetensors, io: tensorboard
     dist                      allreduce, communicators (local, MPI, NCCL), data parallel
     debug                     gradcheck, graph (DOT), anomaly mode; the profiler

   API INDEX: every public type, macro and function, one line each, in the
   order of the declarations below (tests/api_index_check.sh keeps it so);
   the PyTorch equivalent where there is one (F: torch.nn.functional).
     types and macros
       DL_MAX_DIMS                most dims a tensor may have (default 8; define before including)
       DL_API                     storage class of the public functions (default extern)
       dl_result                  enum: DL_OK or a failure code (DL_ERR_SHAPE, DL_ERR_OOM ...)
       dl_dtype                   enum: DL_DTYPE_F32, _I32, _I64 (torch.float32, int32, int64)
       dl_device_type             enum: DL_DEVICE_DEFAULT (0), DL_DEVICE_CPU, DL_DEVICE_CUDA
       dl_device                  {type, index}: torch.device("cpu:1")
       dl_shape                   a shape or a list of dims by value ({ndim, d[]})
       DL_SHAPE                   DL_SHAPE(2, 3): a dl_shape literal (torch.Size([2, 3])); () is dl_shape_make(0, NULL)
       DL_DIMS                    DL_DIMS(0, -1): dims for reductions and permute (dim=(0, -1))
       DL_ALL                     every dim (x.sum() with no dim)
       DL_ZERO                    a real zero in a desc field where 0 means a non-zero default (-0.0f)
       dl_ctx                     opaque context: owns every tensor, module, optimizer, loader
       dl_tensor                  a tensor: ndim, shape, numel, dtype, device, data, grad ...
       dl_log_fn                  error log callback: void (*)(void *user, const char *message)
       dl_ctx_desc                context settings: seed, threads, memory limit, log, devices
       dl_memory_stats            bytes persistent/step/reserved/headers, peak, allocator calls
     context
       dl_ctx_init                make a context (desc NULL: defaults); NULL on OOM
       dl_ctx_free                free the context and everything it owns
       dl_step_end                end a step: release step memory and the tape, O(1)
       dl_step                    current step number
       dl_manual_seed             torch.manual_seed
       dl_set_num_threads         torch.set_num_threads
       dl_num_threads             torch.get_num_threads
       dl_memory_stats_get        a device's memory use (torch.cuda.memory_stats)
     devices
       dl_cpu                     cpu:0, the host
       dl_cpu_device              cpu:index (virtual CPU devices 1 ...)
       dl_cuda                    cuda:index (builds with DL_CUDA)
       dl_device_parse            torch.device("cpu:1") from a name; type -1 when bad
       dl_device_name             "cpu:1" for a dl_device
       dl_device_count            devices of a type (torch.cuda.device_count)
       dl_ctx_device              where creators put tensors now
       dl_set_device              torch.set_default_device
       dl_sync                    torch.cuda.synchronize: wait for every device
       dl_set_allow_tf32          torch.backends.cuda.matmul.allow_tf32 (CUDA matrix products; default off)
       dl_set_allow_tf32_conv     torch.backends.cudnn.allow_tf32 (CUDA convolutions; default on)
       dl_tensor_ctx              the context a tensor belongs to
     errors
       dl_last_error              code of the most recent failure (DL_OK when none)
       dl_error_message           its message ("" when none)
       dl_clear_error             forget the last failure
       dl_result_string           "DL_ERR_SHAPE" for a dl_result
       dl_set_log                 route error messages to a callback
       dl_log_silent              a log callback that drops messages
     tensors: creation
       dl_shape_make              a dl_shape from ndim and an array of dims
       dl_dims_all                what DL_ALL expands to
       dl_empty                   torch.empty (uninitialized)
       dl_zeros                   torch.zeros
       dl_ones                    torch.ones
       dl_full                    torch.full
       dl_arange                  torch.arange(start, end, step)
       dl_rand                    torch.rand: U[0,1)
       dl_randn                   torch.randn: N(0,1)
       dl_from_array              torch.tensor(floats).view(shape) (copies)
       dl_from_int64              the same for int64 (labels)
       dl_from_int32              the same for int32
       dl_zeros_like              torch.zeros_like
       dl_ones_like               torch.ones_like
       dl_copy                    x.clone() (differentiable)
       dl_keep                    detach().clone() into persistent memory (keeps requires_grad)
       dl_param                   nn.Parameter: a persistent leaf that requires grad
       dl_free                    free a persistent tensor early
       dl_to                      x.to(device), differentiable
       dl_set_name                label a tensor (graphs, TensorBoard); returns it
     tensors: writing values
       dl_write                   x.copy_(torch.tensor(host floats)): the host-to-tensor transfer
       dl_fill_                   x.fill_(v)
       dl_copy_                   dst.copy_(src), src broadcast
     tensors: reading back
       dl_item                    x.item()
       dl_read                    x.tolist() into a float buffer: the tensor-to-host transfer
       dl_read_int64              the same into int64 (labels, indices)
       dl_data                    the float data pointer of a CPU tensor (x.numpy())
       dl_size                    x.size(dim)
       dl_same_shape              a.shape == b.shape
       dl_print                   print(x): shape and up to 64 values
     ops: shape
       dl_reshape                 x.reshape / x.view (a view)
       dl_flatten                 torch.flatten(x, start, end) (a view)
       dl_squeeze                 x.squeeze(dim) (a view)
       dl_unsqueeze               x.unsqueeze(dim) (a view)
       dl_permute                 x.permute(dims) (copies)
       dl_transpose               x.transpose(d0, d1) (copies)
       dl_narrow                  x.narrow(dim, start, length) (copies)
       dl_cat                     torch.cat
       dl_stack                   torch.stack
       dl_expand                  x.expand(shape) (copies)
       dl_sum_to                  sum broadcast dims away to a shape (the backward of broadcasting)
     ops: elementwise
       dl_add                     a + b
       dl_sub                     a - b
       dl_mul                     a * b
       dl_div                     a / b
       dl_maximum                 torch.maximum
       dl_minimum                 torch.minimum
       dl_eq                      torch.eq (float32 1/0; float32 or int64 pairs)
       dl_add_scalar              a + s
       dl_sub_scalar              a - s
       dl_mul_scalar              a * s
       dl_div_scalar              a / s
       dl_rsub_scalar             s - a
       dl_pow                     a ** p
       dl_neg                     -a
       dl_exp                     torch.exp
       dl_log                     torch.log
       dl_sqrt                    torch.sqrt
       dl_abs                     torch.abs
       dl_erf                     torch.erf
       dl_clamp                   torch.clamp(a, lo, hi)
       dl_relu                    F.relu
       dl_leaky_relu              F.leaky_relu
       dl_sigmoid                 torch.sigmoid
       dl_tanh                    torch.tanh
       dl_gelu                    F.gelu (erf form)
       dl_silu                    F.silu
     ops: reductions
       dl_sum                     x.sum(dims, keepdim)
       dl_mean                    x.mean(dims, keepdim)
       dl_max                     x.amax(dims, keepdim)
       dl_min                     x.amin(dims, keepdim)
       dl_max_dim                 torch.max(x, dim, keepdim): values and indices
       dl_min_dim                 torch.min(x, dim, keepdim): values and indices
       dl_var                     x.var(dims, correction, keepdim)
       dl_argmax                  x.argmax(dim, keepdim) (int64)
     ops: linear algebra and softmax
       dl_matmul                  torch.matmul
       dl_linear                  F.linear(x, w, b): x w^T + b
       dl_softmax                 torch.softmax(x, dim)
       dl_log_softmax             torch.log_softmax(x, dim)
     autograd
       dl_backward_desc           backward options: grad (seed), retain_graph, create_graph
       dl_requires_grad           x.requires_grad_(on)
       dl_backward                loss.backward()
       dl_backward_ex             out.backward(grad, retain_graph, create_graph)
       dl_grad                    torch.autograd.grad
       dl_zero_grad               x.grad.zero_()
       dl_detach                  x.detach()
       dl_no_grad_begin           enter torch.no_grad() (nestable)
       dl_no_grad_end             leave it
       dl_is_grad_enabled         torch.is_grad_enabled()
       dl_sgd_update              p -= lr * p.grad; p.grad = 0 (a bare SGD step)
       dl_fn_ctx                  opaque: the ctx of a custom function (save_for_backward)
       dl_function                torch.autograd.Function: name, forward, backward callbacks
       dl_function_apply          Function.apply
       dl_fn_save                 ctx.save_for_backward (one tensor)
       dl_fn_saved                ctx.saved_tensors[i]
       dl_fn_needs_grad           ctx.needs_input_grad[i]
     capture and replay (static graphs; CAPTURE AND REPLAY above)
       dl_capture                 opaque: one recorded step (torch.cuda.CUDAGraph)
       dl_capture_begin           enter `with torch.cuda.graph(g):` (record what follows)
       dl_capture_end             leave it: replayable, and the step has run once
       dl_replay                  g.replay()
       dl_capture_free            del g: its memory and tensors
     debug
       DL_GRADCHECK_MAX_INPUTS    most inputs dl_gradcheck takes (8)
       dl_gradcheck_fn            the function dl_gradcheck differentiates
       dl_gradcheck_desc          eps, atol, rtol, seed (zero: defaults)
       dl_gradcheck_result        per input: max abs/rel error, worst index; ok
       dl_gradcheck               torch.autograd.gradcheck
       dl_graph_dot               the graph behind a tensor as Graphviz DOT (torchviz)
       dl_set_anomaly             torch.autograd.set_detect_anomaly
       dl_profile_row             one row of the profile: name, device, calls, self and total seconds
       dl_profile_enable          torch.profiler: prof.start() / prof.stop() (DL_PROFILE=1 starts it)
       dl_profile_reset           forget what the profiler recorded
       dl_profile_rows            prof.key_averages(): rows by total time
       dl_profile_print           print(prof.key_averages().table()) to a FILE *
     ops: normalization and dropout
       dl_batch_norm              F.batch_norm
       dl_layer_norm              F.layer_norm
       dl_dropout                 F.dropout
     ops: losses (input, target, desc; desc NULL: PyTorch's defaults)
       dl_reduction               enum: DL_REDUCTION_MEAN (0), _SUM, _NONE, _BATCHMEAN (kl_div)
       dl_loss_desc               reduction, ignore_index, label_smoothing, weight, pos_weight ...
       dl_cross_entropy           F.cross_entropy (class-index targets)
       dl_nll_loss                F.nll_loss
       dl_mse_loss                F.mse_loss
       dl_l1_loss                 F.l1_loss
       dl_smooth_l1_loss          F.smooth_l1_loss (beta)
       dl_huber_loss              F.huber_loss (delta)
       dl_binary_cross_entropy    F.binary_cross_entropy
       dl_binary_cross_entropy_with_logits F.binary_cross_entropy_with_logits (pos_weight)
       dl_kl_div                  F.kl_div (log_target; DL_REDUCTION_BATCHMEAN)
     ops: convolution and pooling
       DL_MAX_SPATIAL             most spatial dims (3)
       dl_conv_desc               stride, padding, dilation, output_padding, groups, padding_same
       dl_conv_desc_make          a dl_conv_desc with one stride/padding/dilation for every dim
       dl_conv1d                  F.conv1d
       dl_conv2d                  F.conv2d
       dl_conv3d                  F.conv3d
       dl_conv_transpose1d        F.conv_transpose1d
       dl_conv_transpose2d        F.conv_transpose2d
       dl_conv_transpose3d        F.conv_transpose3d
       dl_pool_desc               kernel, stride, padding, dilation, ceil_mode, no_count_include_pad (= !count_include_pad)
       dl_pool_desc_make          a dl_pool_desc from PyTorch's keyword arguments
       dl_max_pool1d              F.max_pool1d
       dl_max_pool2d              F.max_pool2d
       dl_max_pool3d              F.max_pool3d
       dl_avg_pool1d              F.avg_pool1d
       dl_avg_pool2d              F.avg_pool2d
       dl_avg_pool3d              F.avg_pool3d
       dl_adaptive_avg_pool1d     F.adaptive_avg_pool1d
       dl_adaptive_avg_pool2d     F.adaptive_avg_pool2d
       dl_adaptive_avg_pool3d     F.adaptive_avg_pool3d
     nn: modules
       dl_module                  opaque: nn.Module
       dl_module_fn               a module's forward: dl_tensor *(*)(dl_module *m, dl_tensor *x)
       dl_module_new              a new (user) module: type name, forward, zeroed state block
       dl_module_state            the module's state block
       dl_module_type             its type name ("Linear")
       dl_module_ctx              its context
       dl_module_param            register_parameter (from an initial value)
       dl_module_buffer           register_buffer
       dl_module_add              add_module (a named child)
       dl_module_forward          model(x)
       dl_module_forward_relu     F.relu(m(x)), fused for BatchNorm (on a GPU: Linear, small conv)
       dl_module_forward_add_relu F.relu(bn(x) + r), fused for a BatchNorm
       dl_module_train            model.train() / model.eval()
       dl_module_to               model.to(device)
       dl_module_training         model.training
       dl_module_child            a direct child by name (model.fc1)
       dl_module_get              model.get_parameter / get_buffer by dotted name
       dl_named_tensor            {name, t, is_buffer}: one state_dict entry
       dl_module_state_dict       model.state_dict(): names and tensors, in order
       dl_module_named_parameters model.named_parameters() (a shared one once)
       dl_module_num_params       sum(p.numel() for p in model.parameters())
       dl_module_zero_grad        model.zero_grad() (grads set to 0, kept)
       dl_nn_linear               nn.Linear
       dl_nn_sequential           nn.Sequential
       dl_nn_relu                 nn.ReLU
       dl_nn_sigmoid              nn.Sigmoid
       dl_nn_tanh                 nn.Tanh
       dl_nn_gelu                 nn.GELU
       dl_nn_silu                 nn.SiLU
       dl_nn_flatten              nn.Flatten
       dl_init_uniform            nn.init.uniform_
       dl_init_normal             nn.init.normal_
       dl_init_constant           nn.init.constant_
       dl_init_kaiming_uniform    nn.init.kaiming_uniform_(a=a)
       dl_init_kaiming_normal     nn.init.kaiming_normal_(a=a)
       dl_init_xavier_uniform     nn.init.xavier_uniform_(gain)
       dl_init_xavier_normal      nn.init.xavier_normal_(gain)
       dl_fan_in                  fan_in of a weight (nn.init._calculate_fan_in_and_fan_out)
       dl_fan_out                 fan_out of a weight
     optim
       dl_optim                   opaque: an optimizer
       dl_sgd_desc                torch.optim.SGD's arguments (zeroed: its defaults)
       dl_adam_desc               torch.optim.Adam/AdamW's arguments (zeroed: their defaults)
       dl_param_group             a param group: params, n, lr, weight_decay
       dl_sgd                     torch.optim.SGD(model.parameters())
       dl_adam                    torch.optim.Adam(model.parameters())
       dl_adamw                   torch.optim.AdamW(model.parameters())
       dl_sgd_params              SGD over a list of tensors
       dl_adam_params             Adam over a list of tensors
       dl_adamw_params            AdamW over a list of tensors
       dl_sgd_groups              SGD over param groups
       dl_adam_groups             Adam over param groups
       dl_adamw_groups            AdamW over param groups
       dl_module_decay_groups     two groups: weights (decay) and biases/norm weights (no decay)
       dl_optim_step              opt.step()
       dl_optim_zero_grad         opt.zero_grad() (grads set to 0, kept)
       dl_optim_set_lr            set the lr (every group scaled alike, as a scheduler)
       dl_optim_lr                opt.param_groups[0]["lr"]
       dl_optim_num_groups        len(opt.param_groups)
       dl_optim_set_group_lr      opt.param_groups[g]["lr"] = lr
       dl_optim_group_lr          opt.param_groups[g]["lr"]
       dl_optim_steps             optimizer steps taken
       dl_optim_free              free an optimizer early
       dl_lr_step                 StepLR's lr at an epoch
       dl_lr_cosine               CosineAnnealingLR's lr at a step
       dl_lr_warmup               linear warmup's lr at a step (LinearLR)
       dl_clip_grad_norm          nn.utils.clip_grad_norm_(model.parameters(), max_norm)
     io: safetensors checkpoints
       dl_save                    module + optimizer + run state to a safetensors file
       dl_load                    read it back (checked before anything changes)
       dl_save_module             safetensors.torch.save_file(model.state_dict())
       dl_load_module             model.load_state_dict(load_file(path)) (strict)
       dl_kv                      {key, value}: a string metadata pair
       dl_save_meta               dl_save with extra __metadata__ strings
       dl_checkpoint_meta         read one __metadata__ value of a file
     nn: layer modules
       dl_nn_conv                 nn.Conv1d/2d/3d or ConvTranspose*d with a kernel per dim
       dl_nn_conv1d               nn.Conv1d
       dl_nn_conv2d               nn.Conv2d
       dl_nn_conv3d               nn.Conv3d
       dl_nn_conv_transpose1d     nn.ConvTranspose1d
       dl_nn_conv_transpose2d     nn.ConvTranspose2d
       dl_nn_conv_transpose3d     nn.ConvTranspose3d
       dl_nn_max_pool1d           nn.MaxPool1d
       dl_nn_max_pool2d           nn.MaxPool2d
       dl_nn_max_pool3d           nn.MaxPool3d
       dl_nn_avg_pool1d           nn.AvgPool1d
       dl_nn_avg_pool2d           nn.AvgPool2d
       dl_nn_avg_pool3d           nn.AvgPool3d
       dl_nn_adaptive_avg_pool1d  nn.AdaptiveAvgPool1d
       dl_nn_adaptive_avg_pool2d  nn.AdaptiveAvgPool2d
       dl_nn_adaptive_avg_pool3d  nn.AdaptiveAvgPool3d
       dl_nn_batch_norm1d         nn.BatchNorm1d
       dl_nn_batch_norm2d         nn.BatchNorm2d
       dl_nn_batch_norm3d         nn.BatchNorm3d
       dl_nn_layer_norm           nn.LayerNorm
       dl_nn_dropout              nn.Dropout
     io: tensorboard
       dl_summary_writer          opaque: torch.utils.tensorboard.SummaryWriter
       dl_summary_open            SummaryWriter(logdir)
       dl_summary_scalar          w.add_scalar
       dl_summary_scalar_tensor   w.add_scalar(tag, loss), without waiting for a GPU
       dl_summary_histogram       w.add_histogram
       dl_summary_image           w.add_image / add_images
       dl_summary_graph           w.add_graph (the recorded tape)
       dl_summary_flush           w.flush() (and fsync)
       dl_summary_close           w.close()
       dl_summary_path            the events file's path
     data
       dl_idx_load                read an IDX ((Fashion-)MNIST) file into a tensor
       dl_transform_desc          per-sample transform: scale, mean, std, hflip, crop_padding
       dl_dataset                 a Dataset: length, sample_shape, get callback, user
       dl_tensor_dataset          TensorDataset(x, y) with an optional transform
       dl_loader_desc             batch_size, shuffle, drop_last, num_workers, seed, device
       dl_loader                  opaque: a DataLoader
       dl_loader_new              DataLoader(ds, ...)
       dl_loader_next             the next batch (for x, y in loader)
       dl_loader_num_batches      len(loader)
       dl_loader_epoch            epochs started so far
       dl_loader_set_epoch        sampler.set_epoch: resume at an epoch
     multi-device: allreduce, communicators, data parallel
       dl_reduce_op               enum: DL_REDUCE_SUM, DL_REDUCE_MEAN (dist.ReduceOp)
       dl_allreduce               dist.all_reduce over one tensor per device, in place (ring)
       dl_broadcast               dist.broadcast: t[root] to the others
       dl_comm_backend            enum: DL_COMM_LOCAL, DL_COMM_MPI, DL_COMM_NCCL, DL_COMM_THREADS
       dl_comm_group              opaque: the ranks of DL_COMM_THREADS (threads of this process)
       dl_comm_desc               communicator settings: backend, timeout, group, rank ...
       dl_comm                    opaque: a process group (dist.init_process_group)
       DL_MAX_THREAD_RANKS        the most ranks of a thread group (64)
       dl_comm_group_new          a group of N thread ranks, each to join with dl_comm_init
       dl_comm_group_free         free a group (after every rank's dl_comm_free)
       dl_comm_init               make a communicator (desc NULL: local, this process)
       dl_comm_rank               dist.get_rank
       dl_comm_size               dist.get_world_size
       dl_comm_allreduce          allreduce over local devices and every process
       dl_comm_broadcast          broadcast from a root over every process
       dl_comm_barrier            dist.barrier
       dl_comm_free               dist.destroy_process_group
       dl_ddp                     opaque: DistributedDataParallel over replicas
       dl_ddp_desc                data-parallel settings: communicator, bucket size ...
       dl_ddp_loss_fn             loss callback: (module, x, y, user) -> loss
       dl_ddp_init                DDP(model): check replicas and ranks, broadcast rank 0's state
       dl_ddp_step                split a batch, forward/backward per replica, allreduce, step
       dl_ddp_sync_grads          allreduce the gradients in buckets (after your own backward)
       dl_ddp_check               replicas still identical (checksums; DL_DEBUG does it each step)
       dl_ddp_module              local replica i
       dl_ddp_free                release early (else dl_ctx_free)
*/
#ifndef DL_H
#define DL_H

/* The implementation uses POSIX.1-2008 file calls (lstat, realpath) where
   the platform has them; a strict -std=c99 build hides them unless asked,
   so the implementation unit asks (this only adds declarations). */
#if defined(DL_IMPLEMENTATION) && defined(__STRICT_ANSI__) && !defined(_POSIX_C_SOURCE) && \
    !defined(_XOPEN_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE) && \
    (defined(__unix__) || defined(__APPLE__))
#define _POSIX_C_SOURCE 200809L
#endif

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifndef DL_MAX_DIMS
#define DL_MAX_DIMS 8
#endif
#ifndef DL_API
#define DL_API extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ types */

typedef enum dl_result {
    DL_OK = 0,
    DL_ERR_ARG,          /* bad argument: NULL where not allowed, out-of-range dim */
    DL_ERR_SHAPE,        /* shapes do not fit the op's rule */
    DL_ERR_DTYPE,        /* wrong dtype for the op */
    DL_ERR_DEVICE,       /* operands on different devices, or device missing */
    DL_ERR_STALE,        /* tensor used after the step that made it ended */
    DL_ERR_GRAPH,        /* autograd misuse: freed graph, no grad, ... */
    DL_ERR_OOM,          /* allocation failed, or size overflow, or memory limit */
    DL_ERR_IO,           /* file could not be opened, read or written */
    DL_ERR_FORMAT,       /* file contents are malformed */
    DL_ERR_NAN,          /* anomaly mode found NaN/Inf */
    DL_ERR_UNSUPPORTED   /* valid request this build cannot do */
} dl_result;

typedef enum dl_dtype { DL_DTYPE_F32 = 0, DL_DTYPE_I32, DL_DTYPE_I64 } dl_dtype;
/* A device: type and index. A zeroed dl_device (type DL_DEVICE_DEFAULT) means
   "the default" wherever a desc takes one: the context's default device. */
typedef enum dl_device_type { DL_DEVICE_DEFAULT = 0, DL_DEVICE_CPU, DL_DEVICE_CUDA } dl_device_type;
typedef struct dl_device { int type; int index; } dl_device;

/* A shape (or a list of dims) by value: DL_SHAPE(2, 3), DL_DIMS(0, -1).
   DL_SHAPE() with no arguments is not a scalar's shape: it counts one
   (empty) argument, so it is (0), one dim of size 0 (and its empty braces
   are not ISO C). The 0-d shape () is dl_shape_make(0, NULL). */
typedef struct dl_shape { int ndim; int64_t d[DL_MAX_DIMS]; } dl_shape;

#define DL__NARG(...) DL__NARG_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define DL__NARG_(a1, a2, a3, a4, a5, a6, a7, a8, n, ...) n
#ifdef __cplusplus
#define DL_SHAPE(...) (dl_shape{DL__NARG(__VA_ARGS__), {__VA_ARGS__}})
#else
#define DL_SHAPE(...) ((dl_shape){DL__NARG(__VA_ARGS__), {__VA_ARGS__}})
#endif
#define DL_DIMS(...) DL_SHAPE(__VA_ARGS__)
#define DL_ALL dl_dims_all()      /* reduce over every dim */
/* Zero means default: a zeroed desc field is PyTorch's default. Where that
   default is not zero but zero is also a value a port may want (AdamW's
   weight_decay 0.01, Adam's betas and eps, lr, a param group's lr and
   weight_decay, smooth_l1's beta, gradcheck's atol and rtol), DL_ZERO asks
   for a real zero: d.weight_decay = DL_ZERO is AdamW(weight_decay=0).
   README.md, section "Zero means default", lists every such field. */
#define DL_ZERO (-0.0f)

typedef struct dl_ctx dl_ctx;
typedef struct dl_tensor dl_tensor;
typedef struct dl__dev dl__dev;
typedef struct dl__node dl__node;

/* A tensor. Fields above the line are public and read-only; use the
   functions to change anything. */
struct dl_tensor {
    int ndim;
    int64_t shape[DL_MAX_DIMS];
    int64_t numel;
    dl_dtype dtype;
    dl_device device;
    void *data;               /* host pointer on the CPU, device pointer on a GPU */
    bool requires_grad;
    dl_tensor *grad;          /* leaves: accumulated gradient (NULL until first) */
    char name[32];            /* optional label, shown by dl_graph_dot */
    /* ---- private bookkeeping ---- */
    uint32_t magic_;
    bool owns_;               /* persistent and owns its data */
    dl_ctx *ctx_;
    dl__node *node_;          /* the tape node that made it; NULL for leaves */
    dl__dev *dev_;            /* its device (memory and backend) */
    uint64_t step_;           /* step it was made in; 0 = persistent */
    bool sdata_;              /* a step tensor that owns its arena block (not a view) */
    bool viewed_;             /* another tensor shares its data */
    uint32_t ver_;            /* version of its storage: in-place writes so far (a view's
                                 counter is its base's) */
    dl_tensor *vbase_;        /* a view: the tensor whose storage it shares (NULL: none) */
    bool detached_;           /* a view from dl_detach (or of one): writable whatever its base */
    bool bwd_tmp_;            /* made inside a backward without create_graph */
    int32_t gref_;            /* backward: how many gradient slots hold it */
    int32_t pend_;            /* backward with a ready hook: gradients still to come (leaves) */
    dl_tensor *pnext_, *pprev_; /* list of persistent tensors */
};

typedef void (*dl_log_fn)(void *user, const char *message);

/* Context settings; zero means default for every field. The environment
   variables DL_CPU_DEVICES=N, DL_STRICT=1 and DL_DEVICE=cpu:1 fill
   cpu_devices, strict_devices and device only where the desc leaves them at
   zero (a NULL desc: all three), so a whole program or test suite can be
   moved to another device from outside while a field set in the desc always
   keeps its value. */
typedef struct dl_ctx_desc {
    uint64_t seed;            /* RNG seed (0: 0x5eed) */
    int num_threads;          /* kernel threads: 0 = every core; more than the cores is
                                 clamped to them (a warning in the log); < 0 or > 1024 is an
                                 error (dl_ctx_init returns NULL) */
    size_t memory_limit;      /* bytes per device (0: no limit) */
    dl_log_fn log;            /* error log (NULL: stderr; dl_log_silent: none) */
    void *log_user;
    int cpu_devices;          /* CPU devices cpu:0 .. cpu:N-1 (0: DL_CPU_DEVICES=N, else 1,
                                 the host) */
    bool strict_devices;      /* virtual CPU devices (cpu:1 ...) hand out tagged data pointers
                                 that fault when host code touches them (false: DL_STRICT=1) */
    dl_device device;         /* where creators put tensors (zero: DL_DEVICE=cpu:1 ..., else cpu:0) */
    int profile;              /* 1: count and time every op from the start (dl_profile_*; the
                                 table is printed at dl_ctx_free); -1: off; 0: DL_PROFILE=1 in
                                 the environment turns it on */
    /* TF32 tensor cores on CUDA devices, PyTorch's two switches (dl_set_allow_tf32,
       dl_set_allow_tf32_conv): 1 on, -1 off, 0 the environment's DL_ALLOW_TF32=0|1 /
       DL_ALLOW_TF32_CONV=0|1, else PyTorch's default (matmul off, conv on) */
    int allow_tf32;           /* matrix products: torch.backends.cuda.matmul.allow_tf32 */
    int allow_tf32_conv;      /* convolutions: torch.backends.cudnn.allow_tf32 */
} dl_ctx_desc;

typedef struct dl_memory_stats {
    size_t persistent_bytes;  /* live persistent tensor data + headers */
    size_t step_bytes;        /* step memory handed out in the current step */
    size_t step_reserved;     /* step memory blocks held for reuse */
    size_t header_bytes;      /* step tensor headers and tape nodes in use; their addresses
                                 are never reused, so this moves, bounded by about two
                                 steps' worth plus a few MiB */
    size_t peak_bytes;        /* peak of persistent_bytes + step_bytes */
    uint64_t alloc_calls;     /* calls to the device allocator so far */
    size_t capture_bytes;     /* step memory that finished captures hold (dl_capture_free) */
} dl_memory_stats;

/* --- context */
DL_API dl_ctx *dl_ctx_init(const dl_ctx_desc *desc);  /* NULL on OOM */
DL_API void dl_ctx_free(dl_ctx *ctx);                  /* frees every tensor; NULL ok */
DL_API void dl_step_end(dl_ctx *ctx);       /* release all step memory and the tape: O(1) */
DL_API uint64_t dl_step(const dl_ctx *ctx); /* current step number (starts at 1) */
DL_API void dl_manual_seed(dl_ctx *ctx, uint64_t seed);
DL_API dl_result dl_set_num_threads(dl_ctx *ctx, int n);  /* as dl_ctx_desc.num_threads */
DL_API int dl_num_threads(const dl_ctx *ctx);
DL_API dl_result dl_memory_stats_get(dl_ctx *ctx, dl_device dev, dl_memory_stats *out);
/* --- devices: cpu:0 (the host), virtual CPU devices cpu:1 ... (dl_ctx_desc.
   cpu_devices, DL_CPU_DEVICES=N), cuda:0 ... (builds with DL_CUDA). */
DL_API dl_device dl_cpu(void);                     /* cpu:0 */
DL_API dl_device dl_cpu_device(int index);         /* cpu:index */
DL_API dl_device dl_cuda(int index);               /* cuda:index */
DL_API dl_device dl_device_parse(const char *name); /* "cpu", "cpu:1", "cuda:0"; type -1: bad */
DL_API const char *dl_device_name(dl_device dev);  /* "cuda:1" (a per-thread buffer, 8 at a time) */
DL_API int dl_device_count(dl_ctx *ctx, dl_device_type type);  /* CUDA: 0 without DL_CUDA or a GPU */
DL_API dl_device dl_ctx_device(const dl_ctx *ctx); /* where creators put tensors */
/* torch.set_default_device: creators (dl_zeros, dl_from_array, modules'
   parameters ...) put tensors on dev from now on */
DL_API dl_result dl_set_device(dl_ctx *ctx, dl_device dev);
DL_API dl_result dl_sync(dl_ctx *ctx);             /* wait for every device's queued work */
/* TF32 tensor cores on CUDA devices (10-bit mantissa products, about 1e-3
   relative error; several times fp32's speed), as PyTorch's two switches.
   Matrix products (dl_matmul, dl_linear): off by default, exact fp32, as
   torch.backends.cuda.matmul.allow_tf32 = False. Convolutions (forward and
   both gradients): on by default, as torch.backends.cudnn.allow_tf32 = True.
   dl_ctx_desc.allow_tf32 / allow_tf32_conv and DL_ALLOW_TF32 /
   DL_ALLOW_TF32_CONV set them at dl_ctx_init (docs/cuda.md). No effect on
   CPU devices, which compute in fp32. */
DL_API dl_result dl_set_allow_tf32(dl_ctx *ctx, bool allow);      /* matrix products (default off) */
DL_API dl_result dl_set_allow_tf32_conv(dl_ctx *ctx, bool allow); /* convolutions (default on) */
DL_API dl_ctx *dl_tensor_ctx(const dl_tensor *t);

/* --- errors
   The code and message of the most recent failure in ctx. They stay until
   dl_clear_error() or the next failure: a later success does not clear them,
   so check return values (NULL, a dl_result) first, then read the message.
   ctx NULL: the failures that had no context to go to (a NULL ctx given to a
   creator, dl_cat of zero tensors, dl_ctx_init), kept per thread. */
DL_API dl_result dl_last_error(const dl_ctx *ctx);     /* DL_OK when none */
DL_API const char *dl_error_message(const dl_ctx *ctx); /* "" when none */
DL_API void dl_clear_error(dl_ctx *ctx);
DL_API const char *dl_result_string(dl_result r);       /* "DL_ERR_SHAPE" ... */
DL_API void dl_set_log(dl_ctx *ctx, dl_log_fn fn, void *user);
DL_API void dl_log_silent(void *user, const char *message);  /* a log that drops */

/* --- tensors: creation (step memory, on the context's device: dl_ctx_device,
   cpu:0 unless dl_ctx_desc.device, DL_DEVICE or dl_set_device say otherwise) */
DL_API dl_shape dl_shape_make(int ndim, const int64_t *dims);
DL_API dl_shape dl_dims_all(void);
DL_API dl_tensor *dl_empty(dl_ctx *ctx, dl_shape shape);           /* uninitialized */
DL_API dl_tensor *dl_zeros(dl_ctx *ctx, dl_shape shape);
DL_API dl_tensor *dl_ones(dl_ctx *ctx, dl_shape shape);
DL_API dl_tensor *dl_full(dl_ctx *ctx, dl_shape shape, float value);
/* [start,end) as torch.arange: the count and the values worked out in double
   (0, 0.3, 0.1 gives 3 elements, as there) */
DL_API dl_tensor *dl_arange(dl_ctx *ctx, double start, double end, double step);
DL_API dl_tensor *dl_rand(dl_ctx *ctx, dl_shape shape);            /* U[0,1) */
DL_API dl_tensor *dl_randn(dl_ctx *ctx, dl_shape shape);           /* N(0,1) */
DL_API dl_tensor *dl_from_array(dl_ctx *ctx, dl_shape shape, const float *values);  /* copies */
DL_API dl_tensor *dl_from_int64(dl_ctx *ctx, dl_shape shape, const int64_t *values);
DL_API dl_tensor *dl_from_int32(dl_ctx *ctx, dl_shape shape, const int32_t *values);
DL_API dl_tensor *dl_zeros_like(dl_tensor *t);   /* on t's device */
DL_API dl_tensor *dl_ones_like(dl_tensor *t);
DL_API dl_tensor *dl_copy(dl_tensor *t);      /* new storage; differentiable (clone) */
/* A persistent copy without history (detach + clone into persistent memory).
   A leaf keeps its requires_grad flag; an op's output gives a plain tensor. */
DL_API dl_tensor *dl_keep(dl_tensor *t);
DL_API dl_tensor *dl_param(dl_tensor *t);     /* dl_keep + requires_grad: a trainable leaf */
DL_API void dl_free(dl_tensor *t);            /* persistent tensors only; NULL ok */
/* A copy on dev (t itself when it is there already), differentiable: the
   gradient flows back to t's device. */
DL_API dl_tensor *dl_to(dl_tensor *t, dl_device dev);
DL_API dl_tensor *dl_set_name(dl_tensor *t, const char *name); /* returns t */

/* --- tensors: writing values (in place, as Tensor.copy_ / fill_). Into a
   leaf that requires grad only inside dl_no_grad_begin/end (as PyTorch);
   never into an op's output that is part of a graph. Not recorded for
   autograd: dl_copy_ refuses a src that requires grad while grad mode is
   on (torch would record it; dl_copy(src) is the differentiable copy). */
DL_API dl_result dl_write(dl_tensor *t, const float *src, int64_t n);  /* n must equal numel */
DL_API dl_result dl_fill_(dl_tensor *t, float value);
DL_API dl_result dl_copy_(dl_tensor *dst, dl_tensor *src);  /* src broadcasts to dst's shape */

/* --- tensors: reading back */
DL_API float dl_item(dl_tensor *t);           /* the one element; NaN + error otherwise */
DL_API dl_result dl_read(dl_tensor *t, float *dst, int64_t n);   /* n must equal numel */
DL_API dl_result dl_read_int64(dl_tensor *t, int64_t *dst, int64_t n);
DL_API float *dl_data(dl_tensor *t);          /* CPU float32 data, else NULL + error */
/* negative dims count from the end; -1 for a dim out of range (an error,
   in dl_error_message) or a NULL t */
DL_API int64_t dl_size(const dl_tensor *t, int dim);
DL_API bool dl_same_shape(const dl_tensor *a, const dl_tensor *b);
DL_API void dl_print(dl_tensor *t);           /* shape and (up to 64) values to stdout */

/* --- ops: shape (views share storage; the rest copy). Dims may be negative. */
DL_API dl_tensor *dl_reshape(dl_tensor *t, dl_shape shape);   /* one dim may be -1 */
DL_API dl_tensor *dl_flatten(dl_tensor *t, int start_dim, int end_dim);
DL_API dl_tensor *dl_squeeze(dl_tensor *t, int dim);          /* drop a size-1 dim */
DL_API dl_tensor *dl_unsqueeze(dl_tensor *t, int dim);        /* insert a size-1 dim */
DL_API dl_tensor *dl_permute(dl_tensor *t, dl_shape perm);
DL_API dl_tensor *dl_transpose(dl_tensor *t, int dim0, int dim1);
DL_API dl_tensor *dl_narrow(dl_tensor *t, int dim, int64_t start, int64_t length);
DL_API dl_tensor *dl_cat(int n, dl_tensor *const *ts, int dim);
DL_API dl_tensor *dl_stack(int n, dl_tensor *const *ts, int dim);
DL_API dl_tensor *dl_expand(dl_tensor *t, dl_shape shape);    /* broadcast to shape (copies) */
DL_API dl_tensor *dl_sum_to(dl_tensor *t, dl_shape shape);    /* sum broadcast dims away */

/* --- ops: elementwise, NumPy broadcasting */
DL_API dl_tensor *dl_add(dl_tensor *a, dl_tensor *b);
DL_API dl_tensor *dl_sub(dl_tensor *a, dl_tensor *b);
DL_API dl_tensor *dl_mul(dl_tensor *a, dl_tensor *b);
DL_API dl_tensor *dl_div(dl_tensor *a, dl_tensor *b);
DL_API dl_tensor *dl_maximum(dl_tensor *a, dl_tensor *b);   /* ties split the grad */
DL_API dl_tensor *dl_minimum(dl_tensor *a, dl_tensor *b);
/* torch.eq: 1 where a == b, else 0, as float32 (dl.h has no bool dtype:
   dl_sum counts, as (pred == y).float().sum()); a and b both float32 or
   both int64 (class indices: dl_argmax's and the labels). No gradient. */
DL_API dl_tensor *dl_eq(dl_tensor *a, dl_tensor *b);
DL_API dl_tensor *dl_add_scalar(dl_tensor *a, float s);
DL_API dl_tensor *dl_sub_scalar(dl_tensor *a, float s);
DL_API dl_tensor *dl_mul_scalar(dl_tensor *a, float s);
DL_API dl_tensor *dl_div_scalar(dl_tensor *a, float s);
DL_API dl_tensor *dl_rsub_scalar(dl_tensor *a, float s);     /* s - a */
DL_API dl_tensor *dl_pow(dl_tensor *a, float exponent);
DL_API dl_tensor *dl_neg(dl_tensor *a);
DL_API dl_tensor *dl_exp(dl_tensor *a);
DL_API dl_tensor *dl_log(dl_tensor *a);
DL_API dl_tensor *dl_sqrt(dl_tensor *a);
DL_API dl_tensor *dl_abs(dl_tensor *a);
DL_API dl_tensor *dl_erf(dl_tensor *a);
DL_API dl_tensor *dl_clamp(dl_tensor *a, float lo, float hi);  /* grad 1 on (lo,hi), 0 at the bounds */
DL_API dl_tensor *dl_relu(dl_tensor *a);
DL_API dl_tensor *dl_leaky_relu(dl_tensor *a, float negative_slope);
DL_API dl_tensor *dl_sigmoid(dl_tensor *a);
DL_API dl_tensor *dl_tanh(dl_tensor *a);
DL_API dl_tensor *dl_gelu(dl_tensor *a);      /* x * Phi(x), erf form (PyTorch default) */
DL_API dl_tensor *dl_silu(dl_tensor *a);      /* x * sigmoid(x) (SiLU, swish) */

/* --- ops: reductions. dims: DL_DIMS(...) or DL_ALL; keepdim keeps size-1 dims */
DL_API dl_tensor *dl_sum(dl_tensor *t, dl_shape dims, bool keepdim);
DL_API dl_tensor *dl_mean(dl_tensor *t, dl_shape dims, bool keepdim);
DL_API dl_tensor *dl_max(dl_tensor *t, dl_shape dims, bool keepdim); /* torch.amax: the
                                            gradient split evenly among ties */
DL_API dl_tensor *dl_min(dl_tensor *t, dl_shape dims, bool keepdim);
/* torch.max(t, dim) / torch.min(t, dim): the values, and in *indices (NULL:
   not wanted) the int64 index of the first largest (smallest) along dim; the
   whole gradient goes to that index */
DL_API dl_tensor *dl_max_dim(dl_tensor *t, int dim, bool keepdim, dl_tensor **indices);
DL_API dl_tensor *dl_min_dim(dl_tensor *t, int dim, bool keepdim, dl_tensor **indices);
DL_API dl_tensor *dl_var(dl_tensor *t, dl_shape dims, int correction, bool keepdim);
                                            /* correction 1: unbiased (PyTorch default) */
DL_API dl_tensor *dl_argmax(dl_tensor *t, int dim, bool keepdim);  /* int64, first max */

/* --- ops: linear algebra and softmax */
DL_API dl_tensor *dl_matmul(dl_tensor *a, dl_tensor *b);  /* torch.matmul rules */
/* F.linear: x (*,in), w (out,in), b (out) or NULL -> x w^T + b (*,out), one
   GEMM with w as a transposed operand (no copy of w) */
DL_API dl_tensor *dl_linear(dl_tensor *x, dl_tensor *w, dl_tensor *b);
DL_API dl_tensor *dl_softmax(dl_tensor *t, int dim);
DL_API dl_tensor *dl_log_softmax(dl_tensor *t, int dim);

/* --- autograd */
typedef struct dl_backward_desc {
    dl_tensor *grad;        /* seed gradient (NULL: ones; output must be one element) */
    bool retain_graph;      /* keep the graph for another backward */
    bool create_graph;      /* record the backward itself (higher-order grads);
                               implies retain_graph */
} dl_backward_desc;

DL_API dl_tensor *dl_requires_grad(dl_tensor *t, bool on);  /* leaves only; returns t */
DL_API dl_result dl_backward(dl_tensor *loss);
DL_API dl_result dl_backward_ex(dl_tensor *out, const dl_backward_desc *desc);
/* torch.autograd.grad: d out / d inputs[i] into grads[i] (NULL where out does not
   depend on it); leaves' ->grad untouched. With create_graph the results carry
   history (differentiate them again). */
DL_API dl_result dl_grad(dl_tensor *out, int n, dl_tensor *const *inputs,
                         dl_tensor **grads, const dl_backward_desc *desc);
DL_API void dl_zero_grad(dl_tensor *t);          /* grad = 0 (kept allocated) */
DL_API dl_tensor *dl_detach(dl_tensor *t);       /* shares data, no history */
DL_API void dl_no_grad_begin(dl_ctx *ctx);       /* nestable, as torch.no_grad() */
DL_API void dl_no_grad_end(dl_ctx *ctx);
DL_API bool dl_is_grad_enabled(const dl_ctx *ctx);
DL_API void dl_sgd_update(dl_tensor *param, float lr);  /* p -= lr*grad; grad = 0 */

/* Custom differentiable functions, as torch.autograd.Function.
   forward runs with grad mode off and may save tensors with dl_fn_save;
   backward gets the output gradient and fills grad_inputs[i] (leave NULL for
   inputs without a gradient). It runs with grad mode on only under
   create_graph, so writing it with dl.h ops gives higher-order grads.
   Each gradient must have its input's shape and device (else dl_backward
   fails naming both); an int32/int64 one is cast to float32 by value, as
   PyTorch casts to the input's dtype. A backward that returns an error, or
   whose own ops failed, fails dl_backward with a message under the
   function's name ("in the backward of NAME: ..."). */
typedef struct dl_fn_ctx dl_fn_ctx;
typedef struct dl_function {
    const char *name;
    dl_tensor *(*forward)(dl_fn_ctx *fc, int n, dl_tensor *const *inputs, void *user);
    dl_result (*backward)(dl_fn_ctx *fc, dl_tensor *grad_out, dl_tensor **grad_inputs,
                          void *user);
} dl_function;
DL_API dl_tensor *dl_function_apply(const dl_function *fn, int n, dl_tensor *const *inputs,
                                    void *user);
DL_API void dl_fn_save(dl_fn_ctx *fc, dl_tensor *t);         /* up to 8 tensors */
DL_API dl_tensor *dl_fn_saved(dl_fn_ctx *fc, int i);
DL_API bool dl_fn_needs_grad(dl_fn_ctx *fc, int i);          /* input i wants a grad */

/* --- capture and replay: a static graph of one training step (PyTorch's
   torch.cuda.graph and CUDAGraph.replay; the doc block's CAPTURE AND
   REPLAY). dl_capture_begin records the backend work of the ops that
   follow; dl_capture_end stops, makes it replayable and has run the step
   once (so step k of a loop is step k whether it ran eagerly, was captured
   or replayed); dl_replay runs the recorded work again on the same
   tensors, with the RNG counter, optimizer steps, learning rates and
   num_batches_tracked read anew. Tensors made inside the capture belong to
   it: dl_step_end leaves them, dl_capture_free releases them. What a replay
   cannot repeat is refused inside the capture, naming the op: host reads
   and writes, persistent allocations (warm up first), tensors from before
   the capture. dl_capture_begin returns NULL (with an error) when a capture
   is already recording, in anomaly mode, with a dl_ddp hook installed, or
   out of memory. */
typedef struct dl_capture dl_capture;
DL_API dl_capture *dl_capture_begin(dl_ctx *ctx);
DL_API dl_result dl_capture_end(dl_capture *cap);   /* the first refusal or error, else DL_OK */
DL_API dl_result dl_replay(dl_capture *cap);        /* an error once anything it uses is freed */
DL_API void dl_capture_free(dl_capture *cap);       /* NULL ok; also ends a capture running */

/* --- debug */
#define DL_GRADCHECK_MAX_INPUTS 8
typedef dl_tensor *(*dl_gradcheck_fn)(void *user, dl_tensor *const *inputs);
typedef struct dl_gradcheck_desc {
    double eps;             /* finite-difference step (0: 1e-3) */
    double atol, rtol;      /* pass when |analytic-numeric| <= atol + rtol*|numeric|
                               (0: 1e-3, 1e-2; DL_ZERO: 0) */
    uint64_t seed;          /* projection vector seed (0: 1) */
} dl_gradcheck_desc;
typedef struct dl_gradcheck_result {
    int n;                                      /* inputs */
    double max_abs_err[DL_GRADCHECK_MAX_INPUTS];
    double max_rel_err[DL_GRADCHECK_MAX_INPUTS]; /* |a-n|/max(|a|,|n|) where either > atol */
    int64_t worst_index[DL_GRADCHECK_MAX_INPUTS];
    bool ok;
} dl_gradcheck_result;
/* Compares d(sum(f(inputs) * r))/d inputs (r: fixed random) with central
   differences for every element of every input that requires grad. */
DL_API dl_result dl_gradcheck(dl_ctx *ctx, dl_gradcheck_fn f, void *user, int n,
                              dl_tensor *const *inputs, const dl_gradcheck_desc *desc,
                              dl_gradcheck_result *result);
DL_API dl_result dl_graph_dot(dl_tensor *root, const char *path);  /* Graphviz DOT */
DL_API void dl_set_anomaly(dl_ctx *ctx, bool on);  /* NaN/Inf check on every op output */

/* --- debug: the profiler (PROFILING above; docs/profiling.md), torch.profiler's
   key_averages() table. Times in seconds, per device: host wall time on CPU
   devices, CUDA events on GPUs. */
typedef struct dl_profile_row {
    char name[80];          /* "dl_conv2d", or a backward node: "dl_conv2d backward" */
    dl_device device;
    int64_t calls;
    double self_s;          /* time in the op less the ops it called (its children) */
    double total_s;         /* all the time from the op's start to its end */
} dl_profile_row;
DL_API void dl_profile_enable(dl_ctx *ctx, bool on);   /* profiler.start() / stop() */
DL_API void dl_profile_reset(dl_ctx *ctx);             /* forget the counts and times so far */
/* key_averages(): up to cap rows, by device then total time (largest first);
   returns how many rows there are (rows NULL: just count them) */
DL_API int dl_profile_rows(dl_ctx *ctx, dl_profile_row *rows, int cap);
/* print(prof.key_averages().table()): one table per device to stream, a
   FILE * (NULL: stderr); DL_ERR_IO when the stream's write fails */
DL_API dl_result dl_profile_print(dl_ctx *ctx, void *stream);

/* Normalization, dropout and losses. Semantics follow torch.nn.functional;
   where they differ it says so below. */

/* --- ops: normalization and dropout */

/* Batch normalization of x (N,C) or (N,C,d1,...) per channel C.
   training: normalizes with the batch statistics (mean, biased variance over
     every dim but 1; needs more than one value per channel). If running_mean
     and running_var (C) are given (both or neither) they are updated in place,
     without history: r = (1 - momentum) r + momentum * stat, with the
     UNBIASED batch variance for running_var (as PyTorch). They must not
     require grad.
   eval (training false): normalizes with running_mean/running_var, which
     must be given.
   weight and bias (C) may each be NULL (no scale / no shift).
   y = (x - mean) / sqrt(var + eps) * weight + bias. Differentiable in x,
   weight and bias (and twice: written with dl.h ops). */
DL_API dl_tensor *dl_batch_norm(dl_tensor *x, dl_tensor *running_mean, dl_tensor *running_var,
                                dl_tensor *weight, dl_tensor *bias, bool training,
                                float momentum, float eps);
/* Layer normalization over the last normalized_shape.ndim dims of x, which
   must equal normalized_shape (mean and biased variance over those dims).
   weight and bias have shape normalized_shape, or are NULL. */
DL_API dl_tensor *dl_layer_norm(dl_tensor *x, dl_shape normalized_shape, dl_tensor *weight,
                                dl_tensor *bias, float eps);
/* Inverted dropout: each element is zeroed with probability p and the kept
   ones are scaled by 1/(1-p). The mask comes from the context's RNG
   (dl_manual_seed makes it repeat). Returns x itself when !training or
   p == 0; p == 1 gives zeros (gradient zero); p outside [0,1] is an error. */
DL_API dl_tensor *dl_dropout(dl_tensor *x, float p, bool training);

/* --- ops: losses
   Every loss is loss(input, target, desc) with desc NULL (or zeroed) meaning
   PyTorch's defaults; only the fields a loss uses may be set (others are an
   error naming the field). */

typedef enum dl_reduction {
    DL_REDUCTION_MEAN = 0,    /* mean over elements (weighted mean for class losses) */
    DL_REDUCTION_SUM,
    DL_REDUCTION_NONE,        /* per-element (per-sample) losses */
    DL_REDUCTION_BATCHMEAN    /* dl_kl_div only: sum / input.shape[0] */
} dl_reduction;

typedef struct dl_loss_desc {
    dl_reduction reduction;   /* 0: mean */
    bool has_ignore_index;    /* false: PyTorch's default ignore_index -100 */
    int64_t ignore_index;     /* cross entropy, nll: targets equal to it add nothing; used
                                 only with has_ignore_index (set without it: an error) */
    float label_smoothing;    /* cross entropy: in [0,1] */
    dl_tensor *weight;        /* cross entropy, nll: per-class weights (C);
                                 bce, bce_with_logits: weight broadcast to the input */
    dl_tensor *pos_weight;    /* bce_with_logits: weight of positive targets, broadcast
                                 to the input (typically (C), one per class) */
    float beta;               /* smooth_l1: 0 -> 1.0 (PyTorch's default); DL_ZERO -> 0 (= L1) */
    float delta;              /* huber: 0 -> 1.0 (PyTorch's default); must be > 0 */
    bool log_target;          /* kl_div: target holds log-probabilities */
} dl_loss_desc;

/* Cross entropy = nll_loss(log_softmax(logits, 1), target), as
   F.cross_entropy with class-index targets. logits (N,C) or (N,C,d1,...)
   (also (C) with a 0-d target); target int64 or int32, (N) or (N,d1,...),
   values in [0,C) or ignore_index (anything else is an error).
   Mean reduction divides by the sum of weight[target] over non-ignored
   targets (their count without weights); if every target is ignored the
   mean is NaN and the gradient 0, as PyTorch. (If targets count but their
   weights sum to 0, PyTorch's gradient is NaN on their rows, as the fused
   CUDA op's; the CPU's composite gives 0 there.) label_smoothing e gives
   (1-e) * nll + e/C * sum_c(-weight[c] log p_c) (reduced the same way).
   Stable for large logits. Probability (float) targets are not supported.
   The weight tensor gets a gradient if it requires one (PyTorch refuses).
   On CUDA one fused op (a weight that requires grad: the composite). */
DL_API dl_tensor *dl_cross_entropy(dl_tensor *logits, dl_tensor *target, const dl_loss_desc *d);
/* Negative log likelihood of log-probabilities (N,C) or (N,C,d1,...);
   targets and options as dl_cross_entropy (no label_smoothing). */
DL_API dl_tensor *dl_nll_loss(dl_tensor *log_probs, dl_tensor *target, const dl_loss_desc *d);
/* Elementwise losses: input and target must have the SAME shape (PyTorch
   broadcasts with a warning; dl.h reports DL_ERR_SHAPE). Differentiable in
   both. */
DL_API dl_tensor *dl_mse_loss(dl_tensor *input, dl_tensor *target, const dl_loss_desc *d);  /* (x-y)^2 */
DL_API dl_tensor *dl_l1_loss(dl_tensor *input, dl_tensor *target, const dl_loss_desc *d);   /* |x-y| */
/* |x-y| < beta: 0.5 (x-y)^2 / beta, else |x-y| - 0.5 beta (beta 0: L1) */
DL_API dl_tensor *dl_smooth_l1_loss(dl_tensor *input, dl_tensor *target, const dl_loss_desc *d);
/* |x-y| < delta: 0.5 (x-y)^2, else delta (|x-y| - 0.5 delta) */
DL_API dl_tensor *dl_huber_loss(dl_tensor *input, dl_tensor *target, const dl_loss_desc *d);
/* -w (y log p + (1-y) log(1-p)), each log clamped to >= -100 as PyTorch;
   p in [0,1] */
DL_API dl_tensor *dl_binary_cross_entropy(dl_tensor *p, dl_tensor *y, const dl_loss_desc *d);
/* -w (pw y log sigmoid(x) + (1-y) log(1 - sigmoid(x))), computed stably as
   (1-y) x + (1 + (pw-1) y) softplus(-x): finite for any |x|. */
DL_API dl_tensor *dl_binary_cross_entropy_with_logits(dl_tensor *x, dl_tensor *y, const dl_loss_desc *d);
/* KL divergence of log-probabilities `input` from `target` (probabilities,
   or log-probabilities with log_target): target (log target - input),
   0 where target is 0. PyTorch's reduction 'mean' averages over elements;
   DL_REDUCTION_BATCHMEAN (the mathematically correct one) divides by N. */
DL_API dl_tensor *dl_kl_div(dl_tensor *input, dl_tensor *target, const dl_loss_desc *d);


/* --- ops: convolution, transposed convolution and pooling

   Layouts are PyTorch's: channels first, row-major. Every function takes a
   batched input (N,C,spatial...) or an unbatched one (C,spatial...), which
   gives an unbatched result. Output sizes follow torch.nn.functional
   exactly (floor division; ceil_mode as PyTorch: the last window must start
   inside the input or the left padding). All of them are differentiable to
   any order (their backward rules are written with these same ops). */

#define DL_MAX_SPATIAL 3

/* --- ops: convolution. Zero means default for every field. */
typedef struct dl_conv_desc {
    int64_t stride[DL_MAX_SPATIAL];          /* 0: 1 */
    int64_t padding[DL_MAX_SPATIAL];         /* zero padding on each side */
    int64_t dilation[DL_MAX_SPATIAL];        /* 0: 1 */
    int64_t output_padding[DL_MAX_SPATIAL];  /* transposed conv only: extra size on the
                                                right; must be < stride or < dilation */
    int64_t groups;                          /* 0: 1 */
    bool padding_same;                       /* PyTorch padding='same': output size = input
                                                size (stride 1 only; padding[] ignored; odd
                                                total padding puts the extra on the right) */
} dl_conv_desc;

/* The same stride, padding and dilation in every spatial dim (0: default). */
DL_API dl_conv_desc dl_conv_desc_make(int64_t stride, int64_t padding, int64_t dilation,
                                      int64_t groups);

/* y = cross-correlation of x with w, plus b, as torch.nn.functional.conv*d.
   x (N,C,L) / (N,C,H,W) / (N,C,D,H,W); w (OC, C/groups, k...); b (OC) or NULL;
   d NULL: stride 1, no padding. y (N, OC, out...) with
   out = (in + 2*padding - dilation*(k-1) - 1) / stride + 1. */
DL_API dl_tensor *dl_conv1d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);
DL_API dl_tensor *dl_conv2d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);
DL_API dl_tensor *dl_conv3d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);

/* Transposed convolution (the input gradient of conv*d), as
   torch.nn.functional.conv_transpose*d. x (N, C_in, in...);
   w (C_in, OC/groups, k...); b (OC) or NULL; y (N, OC, out...) with
   out = (in-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1. */
DL_API dl_tensor *dl_conv_transpose1d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);
DL_API dl_tensor *dl_conv_transpose2d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);
DL_API dl_tensor *dl_conv_transpose3d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);

/* --- ops: pooling. Zero means PyTorch's default for every field. */
typedef struct dl_pool_desc {
    int64_t kernel[DL_MAX_SPATIAL];   /* required, >= 1 */
    int64_t stride[DL_MAX_SPATIAL];   /* 0: = kernel */
    int64_t padding[DL_MAX_SPATIAL];  /* each side, at most kernel/2 (max: -inf, avg: zeros) */
    int64_t dilation[DL_MAX_SPATIAL]; /* 0: 1 (max pooling only) */
    bool ceil_mode;                   /* ceil instead of floor in the output size */
    bool no_count_include_pad;        /* avg: = !count_include_pad, PyTorch's keyword
                                         inverted so that zero is its default True; true:
                                         divide by the elements inside x only */
} dl_pool_desc;

/* kernel, stride (0: = kernel) and padding in every spatial dim; dilation 1;
   ceil_mode and count_include_pad as PyTorch's keyword arguments (PyTorch's
   default count_include_pad=True is true here; the desc stores it inverted:
   .no_count_include_pad = !count_include_pad). */
DL_API dl_pool_desc dl_pool_desc_make(int64_t kernel, int64_t stride, int64_t padding,
                                      bool ceil_mode, bool count_include_pad);

/* y = max over each (dilated) window, as torch.nn.functional.max_pool*d.
   x (N,C,spatial...) -> y (N,C,out...), out = (in + 2*padding -
   dilation*(kernel-1) - 1) / stride + 1 (ceil with ceil_mode). The gradient
   goes to the first maximum of each window (NaN wins). */
DL_API dl_tensor *dl_max_pool1d(dl_tensor *x, const dl_pool_desc *d);
DL_API dl_tensor *dl_max_pool2d(dl_tensor *x, const dl_pool_desc *d);
DL_API dl_tensor *dl_max_pool3d(dl_tensor *x, const dl_pool_desc *d);

/* y = mean over each window, as torch.nn.functional.avg_pool*d: divisor
   = window size including padding (count_include_pad) or only the elements
   inside x; a ceil_mode window that passes the right padding is clipped. */
DL_API dl_tensor *dl_avg_pool1d(dl_tensor *x, const dl_pool_desc *d);
DL_API dl_tensor *dl_avg_pool2d(dl_tensor *x, const dl_pool_desc *d);
DL_API dl_tensor *dl_avg_pool3d(dl_tensor *x, const dl_pool_desc *d);

/* Adaptive average pooling to output_size (one entry per spatial dim, >= 0):
   window i of a dim of size L covers [floor(i*L/out), ceil((i+1)*L/out)).
   dl_adaptive_avg_pool2d(x, DL_SHAPE(1, 1)) is global average pooling. */
DL_API dl_tensor *dl_adaptive_avg_pool1d(dl_tensor *x, dl_shape output_size);
DL_API dl_tensor *dl_adaptive_avg_pool2d(dl_tensor *x, dl_shape output_size);
DL_API dl_tensor *dl_adaptive_avg_pool3d(dl_tensor *x, dl_shape output_size);


/* --- nn: modules, initializers; --- optim: optimizers, LR schedules,
   gradient clipping; --- io: safetensors checkpoints.

   MODULES (PyTorch nn.Module semantics)
     A module is a forward callback, a zeroed block of user state, named
     parameters and buffers, and named children. Everything is owned by the
     context (dl_ctx_free frees it); parameters and buffers are persistent
     tensors, so a forward inside a training loop only makes step tensors.
     Names follow PyTorch's state_dict: a module's own parameters, then its
     buffers, then each child's, recursively, joined with '.' ("0.weight",
     "layer1.0.conv1.weight", "bn.running_mean").

     Wrapping a functional op as a module (what the built-ins do; snippets
     marked so are compiled by `make test`: tests/snippets_check.sh):

         typedef struct { dl_module *fc1, *fc2; } mlp_state;
         static dl_tensor *mlp_forward(dl_module *m, dl_tensor *x) {
             mlp_state *s = (mlp_state *)dl_module_state(m);
             return dl_module_forward(s->fc2, dl_relu(dl_module_forward(s->fc1, x)));
         }
         dl_module *mlp(dl_ctx *ctx) {
             dl_module *m = dl_module_new(ctx, "MLP", mlp_forward, sizeof(mlp_state));
             mlp_state *s;
             if (!m) return NULL;
             s = (mlp_state *)dl_module_state(m);
             s->fc1 = dl_module_add(m, "fc1", dl_nn_linear(ctx, 784, 128, true));
             s->fc2 = dl_module_add(m, "fc2", dl_nn_linear(ctx, 128, 10, true));
             return s->fc1 && s->fc2 ? m : NULL;
         }

     A layer around a functional op (Conv2d, BatchNorm) keeps its settings and
     tensor pointers in the state block, registers parameters with
     dl_module_param (PyTorch's conv init: dl_init_kaiming_uniform(w, sqrt(5)),
     bias dl_init_uniform(b, -1/sqrt(fan_in), 1/sqrt(fan_in)) with
     fan_in = dl_fan_in(w)) and running statistics with dl_module_buffer, and
     branches on dl_module_training(m) in its forward.
*/

/* --- nn */
typedef struct dl_module dl_module;
typedef dl_tensor *(*dl_module_fn)(dl_module *m, dl_tensor *x);

/* A new module of the given type name ("Linear"; shown in messages) whose
   forward is the callback, with state_bytes of zeroed state. Owned by ctx.
   NULL (with an error) on OOM. forward may be NULL for a pure container. */
DL_API dl_module *dl_module_new(dl_ctx *ctx, const char *type, dl_module_fn forward,
                                size_t state_bytes);
DL_API void *dl_module_state(dl_module *m);        /* the state_bytes block (NULL if 0) */
DL_API const char *dl_module_type(const dl_module *m);
DL_API dl_ctx *dl_module_ctx(const dl_module *m);
/* Registers a persistent float32 copy of init (step or persistent) as parameter
   `name` (no '.', unique in m), with requires_grad; returns it. NULL init: NULL. */
DL_API dl_tensor *dl_module_param(dl_module *m, const char *name, dl_tensor *init);
/* Same for a buffer: persistent, no grad, any dtype (bn.running_mean,
   bn.num_batches_tracked as int64); saved in checkpoints, not optimized. */
DL_API dl_tensor *dl_module_buffer(dl_module *m, const char *name, dl_tensor *init);
/* Adds child under `name` (unique in parent; digits for Sequential). Returns
   child; NULL child: NULL without a new message (its constructor failed). */
DL_API dl_module *dl_module_add(dl_module *parent, const char *name, dl_module *child);
DL_API dl_tensor *dl_module_forward(dl_module *m, dl_tensor *x);  /* NULL x -> NULL silently */
/* dl_relu(dl_module_forward(m, x)), the same values and gradients, with the
   ReLU fused into m's op where m is a BatchNorm (in its normalization pass
   and its backward's, as a Sequential's BatchNorm, ReLU: on a GPU two
   launches and two passes over the data fewer), or, on a GPU, a Linear with
   a bias (the bias and the ReLU in one pass each way, as a Sequential's
   Linear, ReLU) or a convolution the direct sums take (fewer than 16
   channels in or out: the ReLU in its launch, the mask in the bias sum's,
   as a Sequential's Conv, ReLU). For a module's own forward (a residual
   block's relu(bn1(conv1(x)))). */
DL_API dl_tensor *dl_module_forward_relu(dl_module *m, dl_tensor *x);
/* dl_relu(dl_add(dl_module_forward(m, x), r)) likewise: a residual block's
   tail relu(bn2(conv2(h)) + shortcut), one op where m is a BatchNorm and r
   has x's shape, device and dtype (the add and the ReLU in the
   normalization pass, r's gradient written by the backward's first pass:
   on a GPU three launches and five passes over the data fewer a block);
   otherwise the three ops, with their errors (a broadcast r). NULL x or r:
   NULL, with no new message (an earlier op failed). */
DL_API dl_tensor *dl_module_forward_add_relu(dl_module *m, dl_tensor *x, dl_tensor *r);
DL_API void dl_module_train(dl_module *m, bool on);   /* recursive: .train() / .eval() */
/* model.to(dev): moves every parameter and buffer (and their grads) in place,
   so names, pointers held by the caller and optimizers stay valid (an
   optimizer moves its state to its parameters' devices at its next step). */
DL_API dl_result dl_module_to(dl_module *m, dl_device dev);
DL_API bool dl_module_training(const dl_module *m);   /* new modules are in training mode */
DL_API dl_module *dl_module_child(dl_module *m, const char *name);  /* direct child or NULL */
/* "layer1.0.conv1.weight" -> that parameter or buffer; NULL + DL_ERR_ARG naming
   the first part that does not exist. */
DL_API dl_tensor *dl_module_get(dl_module *m, const char *path);
/* The module's tensors with their full names, as PyTorch's state_dict()
   (parameters and buffers, in order; a shared tensor under each of its
   names) and named_parameters() (parameters only, a shared one once).
   Returns the count and points *out at an array owned by m, valid until the
   next call of the same function on m or a change to m or its children;
   -1 (with an error) on OOM. Printing a state_dict (compiled by `make test`):
       const dl_named_tensor *p;
       int n = dl_module_state_dict(net, &p);
       for (int i = 0; i < n; i++)
           printf("%s %lld%s\n", p[i].name, (long long)p[i].t->numel, p[i].is_buffer ? " (buffer)" : ""); */
typedef struct dl_named_tensor {
    const char *name;         /* "0.weight", "layer1.0.bn1.running_mean" */
    dl_tensor *t;
    bool is_buffer;
} dl_named_tensor;
DL_API int dl_module_state_dict(dl_module *m, const dl_named_tensor **out);
DL_API int dl_module_named_parameters(dl_module *m, const dl_named_tensor **out);
DL_API int64_t dl_module_num_params(dl_module *m);   /* elements; shared params once */
DL_API void dl_module_zero_grad(dl_module *m);       /* grads = 0 (kept allocated) */

/* built-ins */
/* Linear: x (*,in) -> x W^T + b (*,out); weight (out,in), bias (out).
   Init as PyTorch: W ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)),
   b ~ U(-1/sqrt(in), 1/sqrt(in)). */
DL_API dl_module *dl_nn_linear(dl_ctx *ctx, int64_t in, int64_t out, bool bias);
/* Sequential: the children in order, named "0","1",... A ReLU followed by a
   max pool runs as the max pool, then the ReLU, on the pooled quarter of the
   data: both are monotone, so the values, the pool's chosen element and
   the gradients are the same (NaN included); the recorded graph shows the
   pool first. A BatchNorm followed by a ReLU runs as one op (the ReLU in
   batch norm's pass, its mask in the backward's), the same bits; on the
   CPU not where a max pool follows (there the order rule saves more). On
   a GPU a Linear or a small convolution and the ReLU, Sigmoid or Tanh
   after it are one op too, and so is a 2x2, stride-2 AvgPool2d after a
   small convolution's activation (d2l's LeNet): the same bits. */
DL_API dl_module *dl_nn_sequential(dl_ctx *ctx, int n, dl_module *const *mods);
DL_API dl_module *dl_nn_relu(dl_ctx *ctx);
DL_API dl_module *dl_nn_sigmoid(dl_ctx *ctx);
DL_API dl_module *dl_nn_tanh(dl_ctx *ctx);
DL_API dl_module *dl_nn_gelu(dl_ctx *ctx);
DL_API dl_module *dl_nn_silu(dl_ctx *ctx);
DL_API dl_module *dl_nn_flatten(dl_ctx *ctx);        /* flatten(1,-1) */

/* init helpers, in place on a float32 CPU tensor, from the context RNG (as
   torch.nn.init). fan_in = shape[1]*prod(shape[2:]), fan_out = shape[0]*prod(shape[2:]);
   tensors with fewer than 2 dims get DL_ERR_SHAPE where a fan is needed. */
DL_API void dl_init_uniform(dl_tensor *t, float lo, float hi);          /* U(lo, hi) */
DL_API void dl_init_normal(dl_tensor *t, float mean, float std);
DL_API void dl_init_constant(dl_tensor *t, float v);
/* fan_in mode, leaky_relu gain sqrt(2/(1+a^2)): U(-b,b), b = gain*sqrt(3/fan_in) */
DL_API void dl_init_kaiming_uniform(dl_tensor *t, float a);
DL_API void dl_init_kaiming_normal(dl_tensor *t, float a);             /* std gain/sqrt(fan_in) */
DL_API void dl_init_xavier_uniform(dl_tensor *t, float gain); /* b = gain*sqrt(6/(in+out)) */
DL_API void dl_init_xavier_normal(dl_tensor *t, float gain);  /* std gain*sqrt(2/(in+out)) */
DL_API int64_t dl_fan_in(const dl_tensor *w);       /* -1 when w has fewer than 2 dims */
DL_API int64_t dl_fan_out(const dl_tensor *w);

/* --- optim
   Update math is PyTorch's single-tensor (for-loop) implementation
   (torch/optim/sgd.py, adam.py, adamw.py); scalars such as bias corrections
   are computed in double as Python does. State (momentum buffers, exp_avg,
   exp_avg_sq, max_exp_avg_sq, per-parameter step counts) is allocated when the
   optimizer is made, so a step never allocates. Parameters without a ->grad
   are skipped (and their step count does not advance). */
typedef struct dl_optim dl_optim;
/* Zero means PyTorch's default for every field (torch 2.x: SGD's lr is 1e-3).
   nesterov needs momentum > 0 and dampening 0. maximize ascends. */
typedef struct dl_sgd_desc {
    float lr, momentum, dampening, weight_decay;
    bool nesterov, maximize;
} dl_sgd_desc;
/* Zero means PyTorch's default: lr 1e-3, beta1 0.9, beta2 0.999, eps 1e-8,
   weight_decay 0 (Adam) or 0.01 (AdamW). Where zero is a meaningful value
   but not the default (lr, the betas, eps, AdamW's weight_decay), write
   DL_ZERO for an actual zero: AdamW(weight_decay=0) is .weight_decay = DL_ZERO. */
typedef struct dl_adam_desc {
    float lr, beta1, beta2, eps, weight_decay;
    bool amsgrad, maximize;
} dl_adam_desc;
/* A parameter group, as a dict in torch.optim's param list: its own lr and
   weight decay. lr 0: the optimizer's, DL_ZERO: 0 (a frozen group);
   weight_decay 0: the optimizer's, DL_ZERO: none (biases and norm weights,
   typically). */
typedef struct dl_param_group {
    dl_tensor *const *params;
    int n;
    float lr, weight_decay;
} dl_param_group;
/* Optimizers over a module's parameters (state_dict order, shared ones once),
   over a list of persistent float32 tensors, or over groups. Owned by the
   context. */
DL_API dl_optim *dl_sgd(dl_module *m, const dl_sgd_desc *d);      /* NULL d: defaults */
DL_API dl_optim *dl_adam(dl_module *m, const dl_adam_desc *d);
DL_API dl_optim *dl_adamw(dl_module *m, const dl_adam_desc *d);   /* decoupled: p *= 1 - lr*wd */
DL_API dl_optim *dl_sgd_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_sgd_desc *d);
DL_API dl_optim *dl_adam_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_adam_desc *d);
DL_API dl_optim *dl_adamw_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_adam_desc *d);
DL_API dl_optim *dl_sgd_groups(dl_ctx *ctx, int ngroups, const dl_param_group *g, const dl_sgd_desc *d);
DL_API dl_optim *dl_adam_groups(dl_ctx *ctx, int ngroups, const dl_param_group *g, const dl_adam_desc *d);
DL_API dl_optim *dl_adamw_groups(dl_ctx *ctx, int ngroups, const dl_param_group *g, const dl_adam_desc *d);
/* The common split: out[0] the parameters with 2 or more dims (weights,
   the optimizer's weight decay), out[1] the rest (biases, norm weights: no
   weight decay). Returns 2 (the arrays belong to m). */
DL_API int dl_module_decay_groups(dl_module *m, dl_param_group out[2]);
DL_API dl_result dl_optim_step(dl_optim *o);   /* one update of every parameter with a grad */
DL_API void dl_optim_zero_grad(dl_optim *o);   /* grads = 0 (kept allocated) */
/* Learning rates. dl_optim_set_lr sets group 0's lr and scales every other
   group by the same factor relative to its initial lr, as PyTorch's
   schedulers act on every group; lr must be finite and >= 0. */
DL_API dl_result dl_optim_set_lr(dl_optim *o, float lr);
DL_API float dl_optim_lr(const dl_optim *o);                 /* group 0's */
DL_API int dl_optim_num_groups(const dl_optim *o);
DL_API dl_result dl_optim_set_group_lr(dl_optim *o, int group, float lr);
DL_API float dl_optim_group_lr(const dl_optim *o, int group);
DL_API int64_t dl_optim_steps(const dl_optim *o);  /* dl_optim_step calls so far */
DL_API void dl_optim_free(dl_optim *o);        /* early release (else dl_ctx_free); NULL ok */

/* schedules: pure functions of the epoch/step t (0-based), as
   torch.optim.lr_scheduler's closed forms. A step_size or t_max <= 0
   gives NaN (PyTorch divides by zero), which dl_optim_set_lr refuses. */
DL_API float dl_lr_step(float base, int64_t epoch, int64_t step_size, float gamma); /* StepLR: base*gamma^(epoch/step_size) */
DL_API float dl_lr_cosine(float base, int64_t t, int64_t t_max, float eta_min);
                /* CosineAnnealingLR: eta_min + (base-eta_min)*(1+cos(pi*t/t_max))/2 */
DL_API float dl_lr_warmup(float base, int64_t t, int64_t warmup);
                /* base*min(1,(t+1)/warmup): = LinearLR(start_factor=1/warmup, total_iters=warmup-1) */
/* torch.nn.utils.clip_grad_norm_: total = L2 norm of all grads (shared params
   once); grads *= min(1, max_norm/(total+1e-6)); returns total (0 without grads). */
DL_API float dl_clip_grad_norm(dl_module *m, float max_norm);

/* --- io: safetensors checkpoints
   File: 8-byte little-endian header length N, N bytes of JSON (padded with
   spaces to a multiple of 8), then the raw little-endian data:
     {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
      "__metadata__": {"format": "pt", "dl.optim": "adam", "dl.lr": "0.001", ...}}
   Tensors: the module's state_dict (its dtypes: F32, I64, I32), then with an
   optimizer "optim.step" (I64 scalar: dl_optim_steps) and per parameter
   "optim.<param>.step" (I64 scalar) and its state:
   "optim.<param>.momentum_buffer" (SGD with momentum), "optim.<param>.exp_avg",
   "optim.<param>.exp_avg_sq", "optim.<param>.max_exp_avg_sq" (amsgrad).
   <param> is the parameter's state_dict name in m ("param<i>" for an
   optimizer parameter that m does not hold). Names have no length limit (a
   path is as long as the module tree is deep); a tree more than 256 modules
   deep is refused (its state_dict too). Hyper-parameters go in
   __metadata__ as strings; dl_load restores the learning rate only (the rest
   stay as the optimizer was made).
   Writing: a uniquely named temporary file in the destination's directory,
   synced to disk, then renamed over the destination (and the directory
   synced): a crash never leaves a half-written checkpoint in place of a good
   one, and concurrent savers never collide. A destination that exists but is
   not a regular file (a directory, device, pipe) is refused, not replaced; a
   symbolic link is written through to its target (POSIX builds).
   dl_load checks the whole file (header, every offset against the file size,
   dtypes, shapes, names: a missing or extra tensor is an error) before it
   changes anything, so a failed load leaves m and o as they were. With o NULL
   the optim.* tensors of a file are ignored; files written by
   safetensors.torch.save_file (no __metadata__) load into a module.
   Errors: DL_ERR_IO (open/read/write, with the system's reason),
   DL_ERR_FORMAT (malformed, mismatched). */
DL_API dl_result dl_save(const char *path, dl_module *m, dl_optim *o);  /* o may be NULL */
DL_API dl_result dl_load(const char *path, dl_module *m, dl_optim *o);  /* o may be NULL */
/* Module state only (its state_dict: what PyTorch's load_state_dict(strict=True)
   accepts), and its reader: a file written by dl_save_module, dl_save, or
   PyTorch's safetensors.torch.save_file(model.state_dict()); an error names
   the first missing, unexpected or mis-shaped key. */
DL_API dl_result dl_save_module(const char *path, dl_module *m);
DL_API dl_result dl_load_module(const char *path, dl_module *m);
/* String metadata in the file's __metadata__ (run settings, say), next to what
   dl_save writes; keys must not be "format" or start with "dl.". */
typedef struct dl_kv { const char *key, *value; } dl_kv;
DL_API dl_result dl_save_meta(const char *path, dl_module *m, dl_optim *o, int nmeta, const dl_kv *meta);
/* Reads one __metadata__ value (any key, "dl.lr" too) into value (cap bytes
   with the NUL); DL_ERR_FORMAT when the file has no such key. */
DL_API dl_result dl_checkpoint_meta(dl_ctx *ctx, const char *path, const char *key, char *value,
                                    size_t cap);


/* --- nn: layer modules around the functional ops (PyTorch names, defaults
   and initialization: weights kaiming_uniform(a=sqrt(5)), biases
   U(-1/sqrt(fan_in), 1/sqrt(fan_in)); batch norm weight 1, bias 0, running
   mean 0, var 1, momentum 0.1, eps 1e-5). kernel is the same in every
   spatial dim; dl_nn_conv takes one per dim. desc NULL: defaults. */
DL_API dl_module *dl_nn_conv(dl_ctx *ctx, int spatial, int64_t in, int64_t out, const int64_t *kernel,
                             const dl_conv_desc *d, bool bias, bool transposed);
DL_API dl_module *dl_nn_conv1d(dl_ctx *ctx, int64_t in, int64_t out, int64_t kernel, const dl_conv_desc *d, bool bias);
DL_API dl_module *dl_nn_conv2d(dl_ctx *ctx, int64_t in, int64_t out, int64_t kernel, const dl_conv_desc *d, bool bias);
DL_API dl_module *dl_nn_conv3d(dl_ctx *ctx, int64_t in, int64_t out, int64_t kernel, const dl_conv_desc *d, bool bias);
DL_API dl_module *dl_nn_conv_transpose1d(dl_ctx *ctx, int64_t in, int64_t out, int64_t kernel, const dl_conv_desc *d, bool bias);
DL_API dl_module *dl_nn_conv_transpose2d(dl_ctx *ctx, int64_t in, int64_t out, int64_t kernel, const dl_conv_desc *d, bool bias);
DL_API dl_module *dl_nn_conv_transpose3d(dl_ctx *ctx, int64_t in, int64_t out, int64_t kernel, const dl_conv_desc *d, bool bias);
DL_API dl_module *dl_nn_max_pool1d(dl_ctx *ctx, const dl_pool_desc *d);
DL_API dl_module *dl_nn_max_pool2d(dl_ctx *ctx, const dl_pool_desc *d);
DL_API dl_module *dl_nn_max_pool3d(dl_ctx *ctx, const dl_pool_desc *d);
DL_API dl_module *dl_nn_avg_pool1d(dl_ctx *ctx, const dl_pool_desc *d);
DL_API dl_module *dl_nn_avg_pool2d(dl_ctx *ctx, const dl_pool_desc *d);
DL_API dl_module *dl_nn_avg_pool3d(dl_ctx *ctx, const dl_pool_desc *d);
DL_API dl_module *dl_nn_adaptive_avg_pool1d(dl_ctx *ctx, dl_shape output_size);
DL_API dl_module *dl_nn_adaptive_avg_pool2d(dl_ctx *ctx, dl_shape output_size);
DL_API dl_module *dl_nn_adaptive_avg_pool3d(dl_ctx *ctx, dl_shape output_size);
DL_API dl_module *dl_nn_batch_norm1d(dl_ctx *ctx, int64_t channels);   /* x (N,C) or (N,C,L) */
DL_API dl_module *dl_nn_batch_norm2d(dl_ctx *ctx, int64_t channels);   /* x (N,C,H,W) */
DL_API dl_module *dl_nn_batch_norm3d(dl_ctx *ctx, int64_t channels);   /* x (N,C,D,H,W) */
DL_API dl_module *dl_nn_layer_norm(dl_ctx *ctx, dl_shape normalized_shape);
DL_API dl_module *dl_nn_dropout(dl_ctx *ctx, float p);                 /* off in eval mode */

/* --- io: tensorboard
   Event files for TensorBoard, as torch.utils.tensorboard.SummaryWriter writes
   them (add_scalar, add_histogram, add_image/add_images, add_graph), with no
   dependency: TFRecord framing (8-byte little-endian length, masked CRC-32C of
   it, the serialized Event, masked CRC-32C of that) around Event, Summary and
   GraphDef protobuf messages encoded by dl.h (fields in number order, proto3
   defaults left out: the bytes protobuf's deterministic serializer writes).
   dl_summary_open creates logdir (and its parents) and a new file
   logdir/events.out.tfevents.<unix time>.<host>.<pid>.<n> whose first record
   is file_version "brain.Event:2"; view it with `tensorboard --logdir DIR`.
   Each record reaches the file in one write when it is made, so after a
   crash TensorBoard reads every whole record (a GPU value given to
   dl_summary_scalar_tensor, and the scalars after it: when its queue is
   written, see there); a write that fails (full disk) is DL_ERR_IO naming
   the file, and its partial record is cut off again so the file stays
   readable. The writer belongs to the context (dl_ctx_free
   closes it); one thread at a time per writer. Tensors are read with dl_read.
   A tag must be non-empty UTF-8 (DL_ERR_ARG otherwise: protobuf's readers
   drop a record whose string is not UTF-8); graph names are cleaned to
   [A-Za-z0-9_./-].
     histogram: TensorFlow's default buckets, the layout of TensorBoard's own
       histograms: limits -DBL_MAX, -1e20 < -1e-12*1.1^k <= -1e-12, 0, the
       same positive, DBL_MAX; a value v counts in the bucket of the first
       limit > v. Written from the first to the last non-empty bucket, runs
       of empty buckets merged into one (TF's Histogram::EncodeToProto, less
       its empty runs at the ends: TensorBoard takes min and max as the outer
       edges). float32, int32 or int64 tensors; values must be finite.
     image: (C,H,W), or (N,C,H,W) tiled into one grid 8 images wide (zero
       fill, PyTorch's add_images), C = 1 gray, 3 RGB, 4 RGBA, written as an
       8-bit PNG (stored deflate blocks: no zlib). float32 values are [0,1]:
       v*255 clipped to 0..255 and truncated, as PyTorch's add_image; int32 and
       int64 values are 0..255, clipped.
     graph: the tape behind root as a GraphDef, the picture of dl_graph_dot:
       a node per op named <op>_<k> (k counts that op in tape order; op: the
       dl op's name or the custom function's), per leaf its dl_set_name name
       (else Parameter_<k>, Buffer_<k>, Input_<k>) with op "Parameter"
       (requires grad), "Buffer" (persistent, no grad) or "Input"; inputs as
       edges; attrs _output_shapes, dtype, requires_grad, tensor_name. */
typedef struct dl_summary_writer dl_summary_writer;
/* new events file in logdir (created if missing); NULL + error on failure */
DL_API dl_summary_writer *dl_summary_open(dl_ctx *ctx, const char *logdir);
/* add_scalar: value stored as float32 (Summary.Value.simple_value) */
DL_API dl_result dl_summary_scalar(dl_summary_writer *w, const char *tag, int64_t step, double value);
/* add_scalar of t, a tensor of one float32 element (a loss), without the
   wait for the device that PyTorch's loss.item() costs: a GPU tensor's value
   is copied on its device and queued, and the queue's records (with the
   wall times of their calls, scalars given after it queued behind it) are
   written by one read of the device at the writer's next histogram, image,
   graph, flush or close, when 512 are queued, or when a value comes from
   another GPU. Host memory (cpu:N) is read and written now. Refused
   inside a capture, as dl_item. */
DL_API dl_result dl_summary_scalar_tensor(dl_summary_writer *w, const char *tag, int64_t step, dl_tensor *t);
/* add_histogram(tag, t, step) with TensorFlow's default buckets (above) */
DL_API dl_result dl_summary_histogram(dl_summary_writer *w, const char *tag, int64_t step, dl_tensor *t);
/* add_image (C,H,W) / add_images (N,C,H,W) as one PNG (above) */
DL_API dl_result dl_summary_image(dl_summary_writer *w, const char *tag, int64_t step, dl_tensor *img);
/* add_graph: the recorded graph that computed root (call before dl_step_end) */
DL_API dl_result dl_summary_graph(dl_summary_writer *w, dl_tensor *root);
/* writes the queued scalars, then syncs the file to disk (fsync) */
DL_API dl_result dl_summary_flush(dl_summary_writer *w);
/* sync and close now (else dl_ctx_free closes it); NULL ok; w is gone after */
DL_API dl_result dl_summary_close(dl_summary_writer *w);
/* the events file's path (NULL for NULL) */
DL_API const char *dl_summary_path(const dl_summary_writer *w);

/* --- data */
/* Read an IDX file ((Fashion-)MNIST format) into a persistent tensor with
   the file's dims, converted to float32 (images: raw 0..255 values) or int64
   (labels). Checks magic, type code, dims and the file size before reading;
   gzip files need -DDL_ZLIB (link -lz); otherwise the error says to gunzip. */
DL_API dl_result dl_idx_load(dl_ctx *ctx, const char *path, dl_dtype as, dl_tensor **out);

/* Per-sample transform of an image dataset: x = (raw * scale - mean) / std,
   then (training only) a random horizontal flip and a random crop after zero
   padding by crop_padding. scale 0 means 1; std 0 means 1. */
typedef struct dl_transform_desc {
    float scale, mean, std;
    bool hflip;
    int64_t crop_padding;
} dl_transform_desc;

/* A dataset: length, the shape of one sample, and a get function that fills
   one sample's floats and its label. get may be called from worker threads
   at once for different indices; rng is a per-sample seeded generator for
   augmentation (the same sample position gets the same numbers whatever the
   worker count). */
typedef struct dl_dataset dl_dataset;
struct dl_dataset {
    int64_t length;
    dl_shape sample_shape;
    dl_result (*get)(const dl_dataset *ds, int64_t index, float *x, int64_t *y, uint64_t rng[4]);
    void *user;
};
/* A dataset over x (N, ...) float32 and y (N) int64 persistent tensors,
   with an optional transform (NULL: none); augmentation only when train. */
DL_API dl_dataset *dl_tensor_dataset(dl_ctx *ctx, dl_tensor *x, dl_tensor *y,
                                     const dl_transform_desc *t, bool train);

typedef struct dl_loader_desc {
    int64_t batch_size;     /* 0: 1 */
    bool shuffle;
    bool drop_last;
    int num_workers;        /* threads preparing the next batch (0: in the caller) */
    uint64_t seed;          /* shuffling and augmentation (0: 1) */
    dl_device device;       /* where batches go (zero: the context's default device) */
    bool device_data;       /* keep the whole dataset on `device` as bytes and make each
                               batch there: gather, crop, flip, normalize (the same bits
                               as the host's batches). The dataset must come from
                               dl_tensor_dataset with x of whole numbers 0..255 (raw
                               pixels; the transform's scale/mean/std normalize them);
                               num_workers is not used */
} dl_loader_desc;
typedef struct dl_loader dl_loader;
DL_API dl_loader *dl_loader_new(dl_ctx *ctx, const dl_dataset *ds, const dl_loader_desc *d);
/* The next minibatch as step tensors x (B, sample...) and y (B) int64:
   1 with a batch; 0 at the end of an epoch (the next call starts the next
   epoch, with a new order); -1 on error (dl_error_message tells), so (an
   outline, not compiled)
       while ((rc = dl_loader_next(l, &x, &y)) > 0) { ... }
       if (rc < 0) { report dl_error_message(ctx) } */
DL_API int dl_loader_next(dl_loader *l, dl_tensor **x, dl_tensor **y);
DL_API int64_t dl_loader_num_batches(const dl_loader *l);
DL_API int64_t dl_loader_epoch(const dl_loader *l);   /* epochs started so far */
/* Continue as if `epochs` epochs had run (the next epoch's order and
   augmentation are those of epoch epochs+1): for resuming, as PyTorch's
   sampler.set_epoch. Any batch in progress is dropped. epochs must be in
   0..2^63-2; else an error (dl_error_message) and the loader is unchanged. */
DL_API void dl_loader_set_epoch(dl_loader *l, int64_t epochs);

/* --- dist */
/* Data parallelism (DESIGN.md section 10). In one process: dl_allreduce and
   dl_broadcast over one tensor per device (virtual CPU devices or GPUs),
   a chunked ring through the backends' copy entries. Across processes: a
   dl_comm (MPI with -DDL_MPI, NCCL with -DDL_NCCL). On top: dl_ddp, which
   keeps replicas of a model identical (see the doc block, DATA PARALLEL). */
typedef enum dl_reduce_op { DL_REDUCE_SUM = 0, DL_REDUCE_MEAN } dl_reduce_op;
/* In place: every t[i] = t[0] + ... + t[n-1] (MEAN: divided by n). The n
   tensors: float32, one shape, one context, each on its own device. A ring
   (reduce-scatter, then all-gather): each segment is summed once in a fixed
   order and copied, so every replica gets the same bits. Bad input is an
   error before any data moves. */
DL_API dl_result dl_allreduce(dl_tensor *const *t, int n, dl_reduce_op op);
/* In place: every t[i] = t[root] (any dtype; same rules as dl_allreduce). */
DL_API dl_result dl_broadcast(dl_tensor *const *t, int n, int root);

/* A communicator across processes. Each process passes its own replicas
   (one tensor per local device, n >= 1, the same n in every process); the
   reduction runs over all of them: in-process ring, then across processes,
   then a broadcast back to the local replicas (the same bits everywhere).
   DL_COMM_LOCAL: one process (rank 0 of 1). DL_COMM_MPI (-DDL_MPI, launch
   with mpirun): MPI_Init if nobody did; MPI errors come back as results
   (MPI_ERRORS_RETURN on the communicator, point-to-point messages only: a
   rank handed more than it expects fails with MPI_ERR_TRUNCATE, the job
   goes on); a peer that stops answering fails the call after `timeout`
   seconds instead of hanging (the communicator is then unusable in both
   cases), except in dl_comm_init itself, whose MPI_Comm_dup waits for
   every rank without a timeout. dl_comm_allreduce and dl_comm_broadcast
   first check that every process passes the same sizes and number of
   local tensors (DL_ERR_SHAPE on all of them otherwise). DL_COMM_NCCL (-DDL_NCCL, CUDA tensors; with -DDL_MPI the
   unique id goes over MPI, else a 1-rank communicator). DL_COMM_THREADS:
   the ranks are threads of this process, each with its own context (a
   context is single-threaded), so their replicas train at the same time:
   make a group once with dl_comm_group_new(size), then each thread calls
   dl_comm_init(its ctx, &{.backend = DL_COMM_THREADS, .group, .rank}); the
   collectives meet in host memory, and a rank that does not arrive within
   `timeout` fails the others. */
typedef enum dl_comm_backend { DL_COMM_LOCAL = 0, DL_COMM_MPI, DL_COMM_NCCL, DL_COMM_THREADS } dl_comm_backend;
typedef struct dl_comm_group dl_comm_group;
typedef struct dl_comm_desc {
    dl_comm_backend backend;
    double timeout;         /* seconds to wait for a peer (0: env DL_COMM_TIMEOUT, else 300) */
    dl_device device;       /* NCCL: this process's GPU (zero: cuda:(rank % GPUs)) */
    dl_comm_group *group;   /* THREADS: the group from dl_comm_group_new */
    int rank;               /* THREADS: this thread's rank, 0..size-1 (each once) */
} dl_comm_desc;
typedef struct dl_comm dl_comm;
/* THREADS: a group of `size` ranks (1..DL_MAX_THREAD_RANKS); NULL on a bad
   size or no memory. Free it after every rank's dl_comm_free. */
#define DL_MAX_THREAD_RANKS 64
DL_API dl_comm_group *dl_comm_group_new(int size);
DL_API void dl_comm_group_free(dl_comm_group *g);   /* NULL ok; refused while a rank has joined */
DL_API dl_comm *dl_comm_init(dl_ctx *ctx, const dl_comm_desc *d);  /* NULL d: local */
DL_API int dl_comm_rank(const dl_comm *c);          /* this process (0 for NULL) */
DL_API int dl_comm_size(const dl_comm *c);          /* processes (1 for NULL) */
DL_API dl_result dl_comm_allreduce(dl_comm *c, dl_tensor *const *t, int n, dl_reduce_op op);
/* every process's t[i] = process root's t[0] */
DL_API dl_result dl_comm_broadcast(dl_comm *c, dl_tensor *const *t, int n, int root);
DL_API dl_result dl_comm_barrier(dl_comm *c);       /* local devices synced, then all processes */
DL_API void dl_comm_free(dl_comm *c);               /* MPI_Finalize if dl_comm_init did MPI_Init */
/* (A freed group, communicator or dl_ddp is gone, as memory after free():
   passing one again is undefined; the checks catch NULL and other objects.) */

/* Data-parallel training: n replicas of one model (built n times, each
   moved to its own device, same parameter names and shapes), each with its
   optimizer. dl_ddp_init copies replica 0's parameters and buffers to the
   others (and process rank 0's to every process). Across ranks it first
   checks that every rank holds the same model (as PyTorch's DDP does): each
   state_dict entry's name, dtype, shape and kind, in order, against rank
   0's; a difference fails dl_ddp_init on every rank with one message naming
   the first difference (DL_ERR_SHAPE), and the communicator stays usable.
   dl_ddp_step splits the
   batch along dim 0 (near-equal parts, the first ones one row larger),
   runs loss(replica, x part, y part) and backward on each replica, sums the
   gradients weighted by each part's share of the batch (bucketed into flat
   buffers of bucket_bytes), and steps every optimizer: the same update as
   one model on the full batch. With one replica per MPI process,
   DL_COMM_THREADS rank or NCCL rank (n = 1), every bucket's sum starts
   from backward as soon as its gradients are complete, overlapping the
   rest of backward.
   Batch-norm running statistics stay per replica (as in PyTorch's
   DataParallel): evaluate with replica 0. */
typedef struct dl_ddp dl_ddp;
typedef struct dl_ddp_desc {
    dl_comm *comm;          /* NULL: this process's replicas only */
    int64_t bucket_bytes;   /* gradient fusion buffer (0: 25 MB, as PyTorch's DDP) */
} dl_ddp_desc;
/* the loss of one replica m on its part of the batch (x, y on m's device) */
typedef dl_tensor *(*dl_ddp_loss_fn)(dl_module *m, dl_tensor *x, dl_tensor *y, void *user);
DL_API dl_ddp *dl_ddp_init(int n, dl_module *const *replicas, dl_optim *const *optims,
                           const dl_ddp_desc *d);
/* one training step; *loss (may be NULL): the full batch's loss (all processes) */
DL_API dl_result dl_ddp_step(dl_ddp *dp, dl_tensor *x, dl_tensor *y, dl_ddp_loss_fn loss,
                             void *user, float *loss_out);
/* gradients = their mean over every replica (for loops that do their own
   forward and backward, one replica per process) */
DL_API dl_result dl_ddp_sync_grads(dl_ddp *dp);
/* checks that every replica holds the same parameters (a checksum per
   tensor), in every process (then a collective call); DL_DEBUG builds run
   it after each dl_ddp_step */
DL_API dl_result dl_ddp_check(dl_ddp *dp);
DL_API dl_module *dl_ddp_module(dl_ddp *dp, int i);  /* local replica i (NULL if out of range) */
DL_API void dl_ddp_free(dl_ddp *dp);                  /* early release (else dl_ctx_free); NULL ok */

#ifdef __cplusplus
}
#endif
#endif /* DL_H */

/* ======================================================================== */
/*                              IMPLEMENTATION                              */
/* ======================================================================== */
#if defined(DL_IMPLEMENTATION) && !defined(DL_NO_IMPLEMENTATION)
#ifndef DL__IMPLEMENTED
#define DL__IMPLEMENTED

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <stdarg.h>
#include <float.h>
#include <assert.h>
#include <limits.h>
#include <time.h>
#if !defined(DL_NO_THREADS) && !defined(__GNUC__)
#define DL_NO_THREADS   /* the thread pool needs GCC's __atomic builtins (gcc, clang, icx) */
#endif
#ifndef DL_NO_THREADS
#include <pthread.h>
#include <time.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#define DL__UNIX 1
#include <unistd.h>
#include <fcntl.h>
#include <errno.h>
#include <sys/types.h>
#include <sys/stat.h>
#include <sys/mman.h>
/* lstat and realpath (POSIX.1-2008) are declared: glibc says so with
   __USE_XOPEN2K8; other systems declare them unless a strict mode hides them */
#if defined(__USE_XOPEN2K8) || (!defined(__GLIBC__) && !defined(__STRICT_ANSI__)) || \
    (!defined(__GLIBC__) && defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200809L)
#define DL__POSIX2008 1
#endif
#endif
#ifdef DL_OPENBLAS
#include <cblas.h>
#endif

#if defined(DL_MALLOC) && defined(DL_REALLOC) && defined(DL_FREE)
#elif !defined(DL_MALLOC) && !defined(DL_REALLOC) && !defined(DL_FREE)
#define DL_MALLOC(sz) malloc(sz)
#define DL_REALLOC(p, sz) realloc(p, sz)
#define DL_FREE(p) free(p)
#else
#error "dl.h: define all of DL_MALLOC, DL_REALLOC and DL_FREE, or none of them"
#endif
#ifndef DL_ASSERT
#define DL_ASSERT(x) assert(x)
#endif
#if DL_MAX_DIMS < 4 || DL_MAX_DIMS > 16
#error "dl.h: DL_MAX_DIMS must be between 4 and 16"
#endif
#if defined(__GNUC__)
#define DL__UNUSED __attribute__((unused))
#else
#define DL__UNUSED
#endif

#define DL__MAGIC 0x444c5431u
#define DL__FREED 0x46524545u        /* DL_DEBUG: a dl_free()d header */
#define DL__CAP_GEN ((uint64_t)1 << 62)  /* a capture's tensors: step_ = DL__CAP_GEN | its serial */
#define DL__NSAVED 8

// >>section threads and gemm
/* A small persistent thread pool splits kernels into contiguous chunks
   (fixed by the size, the grain and the thread count; a thread that
   finishes its own share takes chunks not yet started from the others');
   each output element is computed by one thread in a fixed order, so
   results do not depend on the thread count. The matrix product packs
   panels of A and B into contiguous buffers (BLIS-style blocking) and runs
   a register-tiled micro-kernel over them. */

#ifndef DL__RESTRICT
#if defined(__GNUC__) || defined(_MSC_VER)
#define DL__RESTRICT __restrict
#else
#define DL__RESTRICT
#endif
#endif

/* ===========================================================================
 * Thread pool
 * ========================================================================= */

typedef void (*dl__task_fn)(void *arg, int64_t begin, int64_t end); /* [begin,end) */
typedef struct dl__pool dl__pool;

#ifndef DL_NO_THREADS
typedef struct dl__pool_worker {
    dl__pool *pool;
    int index;                 /* 1..nthreads-1 (0 is the caller) */
} dl__pool_worker;
#endif

/* chunks of a parallel loop per thread, at most (dl__parallel_for) */
#ifndef DL__POOL_SHARE
#define DL__POOL_SHARE 4
#endif

struct dl__pool {
    int nthreads;              /* threads including the caller */
#ifndef DL_NO_THREADS
    pthread_t *threads;        /* nthreads-1 workers */
    dl__pool_worker *workers;
    int nstarted;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    uint64_t generation;       /* bumped for every job */
    int stop;
    int busy;                  /* a parallel_for is in flight */
    int sleepers;              /* workers in cv_work's wait (under mu) */
    int caller_waits;          /* the caller sleeps on cv_done (under mu) */
    /* current job (under mu) */
    dl__task_fn fn;
    void *arg;
    int64_t n;
    int64_t chunk;
    int64_t nchunks;
    /* atomics (__atomic builtins): the chunks finished, and per thread the
       next chunk of its share, tagged with the job (generation << 32) */
    int64_t done;
    uint64_t *next;
#endif
    /* SGEMM pack buffers kept between calls (dl__gemm_buf_get/put) */
    void *gemm_raw;
    size_t gemm_cap;
    int gemm_busy;
};

/* Deterministic split of [0,n) into contiguous chunks of size *chunk.
   Returns the number of chunks (>= 1 when n > 0, 0 when n <= 0).
   Depends only on n, grain and nthreads. */
static DL__UNUSED int64_t dl__split(int64_t n, int64_t grain, int nthreads, int64_t *chunk)
{
    int64_t nch, ch;
    if (n <= 0) {
        *chunk = 1;
        return 0;
    }
    if (grain < 1) grain = 1;
    if (nthreads < 1) nthreads = 1;
    nch = n / grain;
    if (nch > (int64_t)nthreads) nch = (int64_t)nthreads;
    if (nch < 1) nch = 1;
    ch = (n + nch - 1) / nch;
    nch = (n + ch - 1) / ch;
    *chunk = ch;
    return nch;
}

static DL__UNUSED int dl__pool_size(const dl__pool *p)
{
    return p ? p->nthreads : 1;
}

#ifndef DL_NO_THREADS

/* How long a thread spins before it sleeps: a worker after its job, for the
   next one, and the caller for the workers' last chunks. A training step runs
   its ops microseconds apart, so the workers stay awake through a step and a
   job starts without a futex wake-up (several microseconds on a VM, more when
   the host has descheduled an idle vCPU). 0 makes every wait sleep at once. */
#ifndef DL__POOL_SPIN_US
#define DL__POOL_SPIN_US 50
#endif

/* microseconds on a monotonic clock; where a strict build hides
   clock_gettime, pause instructions counted at ~25 ns each stand in */
static double dl__pool_clock_us(int rounds)
{
#if defined(CLOCK_MONOTONIC)
    struct timespec ts;
    (void)rounds;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
#else
    return 0.025 * (double)rounds;
#endif
}

static void dl__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One more round of a spin that began at *t0 (round i = 0 sets it): false
   when DL__POOL_SPIN_US have passed and the thread should sleep instead */
static bool dl__pool_spinning(int i, double *t0)
{
    if (DL__POOL_SPIN_US <= 0) return false;
    if ((i & 63) == 0) {
        double t = dl__pool_clock_us(i);
        if (i == 0) *t0 = t;
        else if (t - *t0 > DL__POOL_SPIN_US) return false;
    }
    dl__cpu_relax();
    return true;
}

/* chunks in each thread's first share of nch */
static int64_t dl__pool_per(const dl__pool *p, int64_t nch) { return (nch + p->nthreads - 1) / p->nthreads; }

/* The next chunk of job `gen` (per chunks to a thread, nch in all) from
   thread t's share, or -1 when it has none left (or the job is over) */
static int64_t dl__pool_claim(dl__pool *p, int t, uint64_t gen, int64_t per, int64_t nch)
{
    uint64_t *slot = &p->next[t], v = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    int64_t end = (int64_t)(t + 1) * per < nch ? (int64_t)(t + 1) * per : nch;
    for (;;) {
        int64_t i = (int64_t)(v & 0xFFFFFFFFu);
        if ((v >> 32) != (gen & 0xFFFFFFFFu) || i >= end) return -1;
        if (__atomic_compare_exchange_n(slot, &v, v + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return i;
    }
}

/* Thread self's chunks of job gen, then whatever the others have not
   started, in thread order; the one that finishes the last chunk wakes the
   caller. The chunks are the same whoever runs them: results do not depend
   on the thread that ran a chunk. */
static void dl__pool_work(dl__pool *p, int self, uint64_t gen, dl__task_fn fn, void *arg, int64_t n, int64_t chunk,
                          int64_t nch)
{
    int64_t per = dl__pool_per(p, nch);
    int k;
    for (k = 0; k < p->nthreads; k++) {
        int t = (self + k) % p->nthreads;
        int64_t i;
        while ((i = dl__pool_claim(p, t, gen, per, nch)) >= 0) {
            int64_t b = i * chunk, e = b + chunk < n ? b + chunk : n;
            fn(arg, b, e);
            if (__atomic_add_fetch(&p->done, 1, __ATOMIC_ACQ_REL) == nch && self != 0) {
                pthread_mutex_lock(&p->mu);
                if (p->caller_waits) pthread_cond_signal(&p->cv_done);
                pthread_mutex_unlock(&p->mu);
            }
        }
    }
}

static void *dl__pool_worker_main(void *varg)
{
    dl__pool_worker *w = (dl__pool_worker *)varg;
    dl__pool *p = w->pool;
    uint64_t seen = 0; /* generation starts at 0 in dl__pool_create, so a
                          late-starting worker still sees the first job */
    pthread_mutex_lock(&p->mu);
    for (;;) {
        dl__task_fn fn;
        void *arg;
        int64_t n, chunk, nch;
        if (__atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) == seen && !__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
            double t0 = 0;
            int i;
            pthread_mutex_unlock(&p->mu);
            for (i = 0; __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) == seen &&
                        !__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE) && dl__pool_spinning(i, &t0);
                 i++) {
            }
            pthread_mutex_lock(&p->mu);
        }
        while (p->generation == seen && !p->stop) {
            p->sleepers++;
            pthread_cond_wait(&p->cv_work, &p->mu);
            p->sleepers--;
        }
        if (p->stop) break;
        seen = p->generation;
        fn = p->fn;
        arg = p->arg;
        n = p->n;
        chunk = p->chunk;
        nch = p->nchunks;
        pthread_mutex_unlock(&p->mu);
        /* a job that is already over (its caller ran every chunk) offers
           nothing: the tags name another generation */
        dl__pool_work(p, w->index, seen, fn, arg, n, chunk, nch);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static DL__UNUSED void dl__pool_destroy(dl__pool *p)
{
    int i;
    if (!p) return;
    if (p->nstarted > 0 || p->threads) {
        pthread_mutex_lock(&p->mu);
        __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
        for (i = 0; i < p->nstarted; i++) pthread_join(p->threads[i], NULL);
    }
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_work);
    pthread_mutex_destroy(&p->mu);
    DL_FREE(p->gemm_raw);
    DL_FREE(p->next);
    DL_FREE(p->workers);
    DL_FREE(p->threads);
    DL_FREE(p);
}

static DL__UNUSED dl__pool *dl__pool_create(int nthreads)
{
    dl__pool *p;
    int i;
    if (nthreads <= 0) {
#if defined(_SC_NPROCESSORS_ONLN)
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = nc > 0 ? (nc > 1024 ? 1024 : (int)nc) : 1;
#else
        nthreads = 1;
#endif
    }
    p = (dl__pool *)DL_MALLOC(sizeof(dl__pool));
    if (!p) return NULL;
    memset(p, 0, sizeof(*p));
    p->nthreads = nthreads;
    p->threads = NULL;
    p->workers = NULL;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        DL_FREE(p);
        return NULL;
    }
    if (pthread_cond_init(&p->cv_work, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        DL_FREE(p);
        return NULL;
    }
    if (pthread_cond_init(&p->cv_done, NULL) != 0) {
        pthread_cond_destroy(&p->cv_work);
        pthread_mutex_destroy(&p->mu);
        DL_FREE(p);
        return NULL;
    }
    if (nthreads > 1) {
        p->threads = (pthread_t *)DL_MALLOC(sizeof(pthread_t) * (size_t)(nthreads - 1));
        p->workers = (dl__pool_worker *)DL_MALLOC(sizeof(dl__pool_worker) * (size_t)(nthreads - 1));
        p->next = (uint64_t *)DL_MALLOC(sizeof(uint64_t) * (size_t)nthreads);
        if (!p->threads || !p->workers || !p->next) {
            dl__pool_destroy(p);
            return NULL;
        }
        for (i = 0; i < nthreads - 1; i++) {
            p->workers[i].pool = p;
            p->workers[i].index = i + 1;
            if (pthread_create(&p->threads[i], NULL, dl__pool_worker_main, &p->workers[i]) != 0)
                break;
            p->nstarted++;
        }
        /* if some threads failed to start, shrink the pool */
        p->nthreads = p->nstarted + 1;
    }
    return p;
}

/* fn over [0, n) in chunks of at least `grain` (up to DL__POOL_SHARE per
   thread), fixed by n, grain and the thread count alone. Each thread first
   runs its own share of the chunks in order, then takes chunks not yet
   started from the others' shares: a thread that wakes late, or runs on a
   core that something else is using, does less, and the caller never waits
   for a thread that has not started. */
static DL__UNUSED void dl__parallel_for(dl__pool *p, int64_t n, int64_t grain, dl__task_fn fn, void *arg)
{
    int64_t chunk, nch, per;
    uint64_t gen;
    int t;
    if (n <= 0) return;
    if (!p || p->nthreads <= 1) {
        fn(arg, 0, n);
        return;
    }
    nch = dl__split(n, grain, p->nthreads * DL__POOL_SHARE, &chunk);
    if (nch <= 1) {
        fn(arg, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    if (p->busy) {
        /* nested call (from inside a task) or concurrent caller: serial */
        pthread_mutex_unlock(&p->mu);
        fn(arg, 0, n);
        return;
    }
    p->busy = 1;
    gen = p->generation + 1;
    per = dl__pool_per(p, nch);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    p->nchunks = nch;
    __atomic_store_n(&p->done, 0, __ATOMIC_RELEASE);
    for (t = 0; t < p->nthreads; t++)
        __atomic_store_n(&p->next[t], ((gen & 0xFFFFFFFFu) << 32) | (uint64_t)(t * per), __ATOMIC_RELEASE);
    /* spinning workers see the new generation once mu is released */
    __atomic_store_n(&p->generation, gen, __ATOMIC_RELEASE);
    if (p->sleepers) pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);

    dl__pool_work(p, 0, gen, fn, arg, n, chunk, nch);

    {   /* spin for the workers' last chunks, then sleep */
        double t0 = 0;
        int i;
        for (i = 0; __atomic_load_n(&p->done, __ATOMIC_ACQUIRE) < nch && dl__pool_spinning(i, &t0); i++) {
        }
    }
    pthread_mutex_lock(&p->mu);
    p->caller_waits = 1;
    while (__atomic_load_n(&p->done, __ATOMIC_ACQUIRE) < nch) pthread_cond_wait(&p->cv_done, &p->mu);
    p->caller_waits = 0;
    p->busy = 0;
    pthread_mutex_unlock(&p->mu);
}

#else /* DL_NO_THREADS */

static DL__UNUSED dl__pool *dl__pool_create(int nthreads)
{
    dl__pool *p = (dl__pool *)DL_MALLOC(sizeof(dl__pool));
    (void)nthreads;
    if (!p) return NULL;
    memset(p, 0, sizeof(*p));
    p->nthreads = 1;
    return p;
}

static DL__UNUSED void dl__pool_destroy(dl__pool *p)
{
    if (!p) return;
    DL_FREE(p->gemm_raw);
    DL_FREE(p);
}

static DL__UNUSED void dl__parallel_for(dl__pool *p, int64_t n, int64_t grain, dl__task_fn fn, void *arg)
{
    (void)p;
    (void)grain;
    if (n <= 0) return;
    fn(arg, 0, n);
}

#endif /* DL_NO_THREADS */

/* ===========================================================================
 * SGEMM
 * =========================================================================
   C = alpha op(A) op(B) + beta C, row-major, BLIS-style. op(A) is packed into
   MR-row slivers (a[p*MR + r]); op(B) into NR-column slivers (b[p*NR + c]),
   or, when B is not transposed and op(A) has few rows, read in place. A
   register-blocked micro-kernel computes one MR x NR tile of C per pair of
   slivers: AVX-512 8x32, AVX2+FMA 6x16 (explicit intrinsics, chosen at
   compile time from __AVX512F__ / __AVX2__ && __FMA__), portable C 4x24.
   Loops: rows of op(A) in blocks of MC, K in blocks of at most KC (packed A
   block), columns in blocks of NC (packed B block, L2-resident), then A
   slivers outside, B slivers inside. Threads split C into column (or row)
   ranges, never K. With AVX-512, small products (at most 12 rows of op(A),
   or K N <= 4096) pack nothing: the kernel broadcasts op(A) from where it
   is, either transpose, and loads B's narrow last sliver under a mask
   (dl__gemm_kernel_da); a tile's last 1..8 columns past 16 take a 256-bit
   vector (dl__h8), half a 512-bit FMA where those run as two halves.

   Determinism: the K blocks are chosen from K alone, and every kernel
   variant, edge tile and fallback computes each element of C the same way:
   acc = 0; acc = fma(a, b, acc) for p in order within the block; then
   C = alpha*acc (beta == 0, C not read), fma(alpha, acc, C) (beta == 1, and
   every later K block), or fma(alpha, acc, beta*C). So the result does not
   depend on the thread count, the split, or which path a tile took; the
   scalar dl__gemm_ref gives the same bits. The one exception in summation
   order, the skinny "dot" path (op(B) = B^T with few rows, long K; its own
   scalar twin dl__gemm_dot_ref), is chosen from the shape alone. */

#if defined(__AVX512F__)
#include <immintrin.h>
#define DL__GEMM_AVX512 1
#define DL__GEMM_MR 8
#define DL__GEMM_NR 32
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DL__GEMM_AVX2 1
#define DL__GEMM_MR 6
#define DL__GEMM_NR 16
#else
#define DL__GEMM_MR 4
#define DL__GEMM_NR 24
#endif
#define DL__GEMM_KC 256                                       /* most of K per block */
#define DL__GEMM_MC ((1024 / DL__GEMM_MR) * DL__GEMM_MR)      /* rows of A per packed block */
#define DL__GEMM_NC ((512 / DL__GEMM_NR) * DL__GEMM_NR)       /* columns of B per packed block */
#if defined(DL__GEMM_AVX512)
#define DL__GEMM_NV 16                       /* floats per vector */
#elif defined(DL__GEMM_AVX2)
#define DL__GEMM_NV 8
#else
#define DL__GEMM_NV DL__GEMM_NR
#endif
#define DL__GEMM_DIRECT_M (4 * DL__GEMM_MR)  /* op(A) rows up to which B (not transposed) is read in place */
#define DL__GEMM_PACK_COST 8.0               /* multiply-adds a packed element costs, about */
#define DL__GEMM_READ_COST 2.0               /* ... and an element of B read in place */
#ifndef DL__GEMM_PAR_MIN                     /* multiply-adds below which one thread runs (a worker */
#define DL__GEMM_PAR_MIN 2e5                 /* spinning for work starts in <1 us); tests set 0 */
#endif
#define DL__GEMM_REF_MAX 512.0               /* multiply-adds below which the scalar path runs */
#ifndef DL__GEMM_DYN                         /* most chunks per thread (1: balanced halves, the */
#define DL__GEMM_DYN 1                       /* fastest on a quiet machine; tests use more) */
#endif
#ifndef DL__GEMM_CHUNK_SHARE
#define DL__GEMM_CHUNK_SHARE 0.04            /* ... while their repeated packing costs at most this */
#endif

#if defined(__GNUC__)
#define DL__GEMM_INLINE static inline __attribute__((always_inline))
#else
#define DL__GEMM_INLINE static inline
#endif

/* Fused multiply-add of the portable kernel and the scalar paths: fmaf where
   the target has it in hardware (the intrinsics paths always do), else a
   multiply and an add (strict -std=c99 keeps gcc from contracting). */
#if defined(DL__GEMM_AVX512) || defined(DL__GEMM_AVX2) || defined(__FMA__) || defined(__ARM_FEATURE_FMA) || \
    defined(__aarch64__)
#define DL__GEMM_FMA(a, b, c) fmaf((a), (b), (c))
#else
#define DL__GEMM_FMA(a, b, c) ((c) + (a) * (b))
#endif

/* element (i,p) of op(A), element (p,j) of op(B) */
#define DL__OPA(A, lda, ta, i, p) ((ta) ? (A)[(int64_t)(p) * (lda) + (i)] : (A)[(int64_t)(i) * (lda) + (p)])
#define DL__OPB(B, ldb, tb, p, j) ((tb) ? (B)[(int64_t)(j) * (ldb) + (p)] : (B)[(int64_t)(p) * (ldb) + (j)])
/* the same with B's rows (as stored) given by a table of starts, or not (NULL) */
#define DL__OPBR(B, ldb, brow, tb, p, j) \
    ((brow) ? ((tb) ? (B)[(brow)[j] + (p)] : (B)[(brow)[p] + (j)]) : DL__OPB(B, ldb, tb, p, j))

/* how a finished accumulator meets C: 0 C = alpha*acc (C not read),
   1 C = fma(alpha, acc, C), 2 C = fma(alpha, acc, beta*C) */
static int dl__gemm_mode(float beta)
{
    return beta == 0.0f ? 0 : (beta == 1.0f ? 1 : 2);
}

/* the kernels' mode: 3 is mode 0 with alpha == 1, C = acc (1*acc is acc,
   bit for bit: the multiply is saved) */
static DL__UNUSED int dl__gemm_mode_k(float alpha, float beta)
{
    int mode = dl__gemm_mode(beta);
    return mode == 0 && alpha == 1.0f ? 3 : mode;
}

static int64_t dl__round_up(int64_t x, int64_t m)
{
    return (x + m - 1) / m * m;
}

/* the K block of the kernels: equal blocks of at most KC, from K alone */
static int64_t dl__gemm_kc(int64_t K)
{
    int64_t nkb = (K + DL__GEMM_KC - 1) / DL__GEMM_KC;
    return (K + nkb - 1) / nkb;
}

/* C := beta*C on an (M,N) block; beta == 0 writes zeros without reading C. */
static void dl__gemm_scale(int64_t M, int64_t N, float beta, float *C, int64_t ldc)
{
    int64_t i, j;
    if (beta == 1.0f) return;
    for (i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (beta == 0.0f) {
            for (j = 0; j < N; j++) c[j] = 0.0f;
        } else {
            for (j = 0; j < N; j++) c[j] *= beta;
        }
    }
}

/* Scalar path with exactly the kernels' arithmetic (same K blocks of kc, same
   fma order, same final update): tiny problems and allocation failure. */
static void dl__gemm_ref(bool transa, bool transb, int64_t M, int64_t N, int64_t K, int64_t kcb, float alpha,
                         const float *A, int64_t lda, const float *B, int64_t ldb, const int64_t *brow,
                         float beta, float *C, int64_t ldc)
{
    int64_t i, j, p, pc;
    for (i = 0; i < M; i++) {
        float *c = C + i * ldc;
        for (j = 0; j < N; j++) {
            for (pc = 0; pc < K; pc += kcb) {
                int64_t pe = K - pc < kcb ? K : pc + kcb;
                int mode = dl__gemm_mode(pc == 0 ? beta : 1.0f);
                float acc = 0.0f;
                for (p = pc; p < pe; p++)
                    acc = DL__GEMM_FMA(DL__OPA(A, lda, transa, i, p), DL__OPBR(B, ldb, brow, transb, p, j), acc);
                if (mode == 0) c[j] = alpha * acc;
                else if (mode == 1) c[j] = DL__GEMM_FMA(alpha, acc, c[j]);
                else c[j] = DL__GEMM_FMA(alpha, acc, beta * c[j]);
            }
        }
    }
}

#if defined(DL__GEMM_AVX512) || defined(DL__GEMM_AVX2)
/* in-register transpose of 8 rows of 8 floats */
DL__GEMM_INLINE void dl__gemm_tr8(__m256 *r)
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* rows [0,n) of `cols` (1..8) floats at src (row stride lds), zero rows
   after, transposed: column q < cols of the block goes to dst + q*ldd (8
   floats stored each) */
DL__GEMM_INLINE void dl__gemm_tr8_copy(const float *src, int64_t lds, int n, int cols, float *dst, int64_t ldd)
{
    __m256 r[8];
    int q;
    if (cols == 8) {
        for (q = 0; q < 8; q++) r[q] = q < n ? _mm256_loadu_ps(src + q * lds) : _mm256_setzero_ps();
    } else {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (q = 0; q < 8; q++) r[q] = q < n ? _mm256_maskload_ps(src + q * lds, m) : _mm256_setzero_ps();
    }
    dl__gemm_tr8(r);
    for (q = 0; q < cols; q++) _mm256_storeu_ps(dst + q * ldd, r[q]);
}
#endif

/* d[0:w) = s[0:n) followed by zeros (n <= w; w is MR or NR). Never reads
   s[n:]; may write up to 8 floats past d + w (AVX2, w = 6: rewritten by the
   next row, or slack at the end of the buffer). */
DL__GEMM_INLINE void dl__gemm_copy_pad(float *DL__RESTRICT d, const float *DL__RESTRICT s, int n, const int w)
{
    int c;
#if defined(DL__GEMM_AVX512)
    for (c = 0; c < w; c += 16) {
        int k = n - c < 0 ? 0 : (n - c > 16 ? 16 : n - c), ws = w - c < 16 ? w - c : 16;
        _mm512_mask_storeu_ps(d + c, (__mmask16)((1u << ws) - 1u),
                              _mm512_maskz_loadu_ps((__mmask16)((1u << k) - 1u), s + c));
    }
#elif defined(DL__GEMM_AVX2)
    for (c = 0; c < w; c += 8) {
        int k = n - c < 0 ? 0 : (n - c > 8 ? 8 : n - c);
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_storeu_ps(d + c, k == 8 ? _mm256_loadu_ps(s + c) : _mm256_maskload_ps(s + c, m));
    }
#else
    for (c = 0; c < w; c++) d[c] = c < n ? s[c] : 0.0f;
#endif
}

/* Pack rows [i0, i0+mc) x cols [p0, p0+kc) of op(A) into MR-row slivers:
   sliver s holds dst[s*kc*MR + p*MR + r]; rows beyond mc are zero. May write
   up to 8 floats past the end (the buffers have the slack). */
static void dl__gemm_pack_a(bool transa, const float *A, int64_t lda, int64_t i0, int64_t mc, int64_t p0,
                            int64_t kc, float *DL__RESTRICT dst)
{
    int64_t s, p;
    for (s = 0; s < mc; s += DL__GEMM_MR) {
        int mr = (int)(mc - s < DL__GEMM_MR ? mc - s : DL__GEMM_MR);
        if (transa) {
            const float *src = A + p0 * lda + i0 + s;
            for (p = 0; p < kc; p++) dl__gemm_copy_pad(dst + p * DL__GEMM_MR, src + p * lda, mr, DL__GEMM_MR);
        } else {
            const float *src = A + (i0 + s) * lda + p0;
            p = 0;
#if defined(DL__GEMM_AVX512) || defined(DL__GEMM_AVX2)
            /* 8 columns at a time; with MR < 8 each 8-float store runs over
               into the next column's (or sliver's) place, rewritten next */
            for (; p + 8 <= kc; p += 8) dl__gemm_tr8_copy(src + p, lda, mr, 8, dst + p * DL__GEMM_MR, DL__GEMM_MR);
            if (p < kc) dl__gemm_tr8_copy(src + p, lda, mr, (int)(kc - p), dst + p * DL__GEMM_MR, DL__GEMM_MR);
#else
            for (; p < kc; p++) {
                float *d = dst + p * DL__GEMM_MR;
                int r;
                for (r = 0; r < DL__GEMM_MR; r++) d[r] = r < mr ? src[r * lda + p] : 0.0f;
            }
#endif
        }
        dst += kc * DL__GEMM_MR;
    }
}

/* Pack rows [p0, p0+kc) x cols [j0, j0+nc) of op(B) into NR-column slivers:
   sliver s holds dst[s*kc*NR + p*NR + c]; columns beyond nc are zero. */
static void dl__gemm_pack_b(bool transb, const float *B, int64_t ldb, const int64_t *brow, int64_t p0, int64_t kc,
                            int64_t j0, int64_t nc, float *DL__RESTRICT dst)
{
    int64_t s, p;
    int c;
    for (s = 0; s < nc; s += DL__GEMM_NR) {
        int nr = (int)(nc - s < DL__GEMM_NR ? nc - s : DL__GEMM_NR);
        if (brow && !transb) {  /* row p of B starts at B + brow[p] */
            for (p = 0; p < kc; p++) dl__gemm_copy_pad(dst + p * DL__GEMM_NR, B + brow[p0 + p] + j0 + s, nr, DL__GEMM_NR);
        } else if (brow) {      /* row j of B (column j of op(B)) starts at B + brow[j] */
            for (c = 0; c < DL__GEMM_NR; c++) {
                const float *r = c < nr ? B + brow[j0 + s + c] + p0 : NULL;
                for (p = 0; p < kc; p++) dst[p * DL__GEMM_NR + c] = r ? r[p] : 0.0f;
            }
        } else if (!transb) {
            const float *src = B + p0 * ldb + j0 + s;
            for (p = 0; p < kc; p++) dl__gemm_copy_pad(dst + p * DL__GEMM_NR, src + p * ldb, nr, DL__GEMM_NR);
        } else {
            const float *src = B + (j0 + s) * ldb + p0;
            p = 0;
#if defined(DL__GEMM_AVX512) || defined(DL__GEMM_AVX2)
            for (; p + 8 <= kc; p += 8)
                for (c = 0; c < DL__GEMM_NR; c += 8)
                    dl__gemm_tr8_copy(src + c * ldb + p, ldb, nr - c < 0 ? 0 : nr - c, 8, dst + p * DL__GEMM_NR + c,
                                      DL__GEMM_NR);
            if (p < kc)
                for (c = 0; c < DL__GEMM_NR; c += 8)
                    dl__gemm_tr8_copy(src + c * ldb + p, ldb, nr - c < 0 ? 0 : nr - c, (int)(kc - p),
                                      dst + p * DL__GEMM_NR + c, DL__GEMM_NR);
#else
            for (; p < kc; p++) {
                float *d = dst + p * DL__GEMM_NR;
                for (c = 0; c < DL__GEMM_NR; c++) d[c] = c < nr ? src[c * ldb + p] : 0.0f;
            }
#endif
        }
        dst += kc * DL__GEMM_NR;
    }
}

/* Micro-kernels: acc(MR,NR) = sum_p a[p*MR+i] * b[p*bs+j] (b: a packed
   sliver, bs = NR, or B itself, bs = ldb; or, boff not NULL, row p at
   b + boff[p] and bs = 0; AVX-512's dl__gemm_kernel_da also reads a in
   place), then the tile C(mr,nr) is updated as dl__gemm_mode(beta) says
   (dl__gemm_mode_k: the same bits). Rows and columns beyond mr, nr are
   neither read nor written. */
#if defined(DL__GEMM_AVX512)

DL__GEMM_INLINE void dl__gemm_out16(float *c, __m512 acc, __mmask16 m, __m512 va, __m512 vb, int mode)
{
    __m512 r;
    if (mode == 3) {
        r = acc;
    } else if (mode == 0) {
        r = _mm512_mul_ps(va, acc);
    } else {
        __m512 old = _mm512_maskz_loadu_ps(m, c);
        r = mode == 1 ? _mm512_fmadd_ps(va, acc, old) : _mm512_fmadd_ps(va, acc, _mm512_mul_ps(vb, old));
    }
    _mm512_mask_storeu_ps(c, m, r);
}

/* A last vector of at most 8 columns (nr 17..24) as a 256-bit vector
   (dl__h8): where 512-bit FMAs run as two halves (Zen 4) it costs half a
   full one; the same fma in each lane. Without AVX-512VL it is a 512-bit
   vector under the mask (and the kernels do not ask for it). */
#if defined(__AVX512VL__)
#define DL__GEMM_HALF 1
typedef __m256 dl__h8;
DL__GEMM_INLINE dl__h8 dl__h8_zero(void)
{
    return _mm256_setzero_ps();
}
DL__GEMM_INLINE dl__h8 dl__h8_load(const float *p, __mmask16 m, int masked)
{
    return masked ? _mm256_maskz_loadu_ps((__mmask8)m, p) : _mm256_loadu_ps(p);
}
/* (a broadcast again rather than the low half of the 512-bit one: the
   compilers reuse that register, and g++ 12 warns on the cast) */
DL__GEMM_INLINE dl__h8 dl__h8_fma(float a, dl__h8 b, dl__h8 c)
{
    return _mm256_fmadd_ps(_mm256_set1_ps(a), b, c);
}
/* C is updated through the 512-bit path (once a tile, not in its loop);
   the upper half zero (the maskz form: g++ 12 warns on the undefined
   source of the others) */
DL__GEMM_INLINE __m512 dl__h8_wide(dl__h8 x)
{
    return _mm512_castpd_ps(
        _mm512_maskz_insertf64x4((__mmask8)0xFF, _mm512_setzero_pd(), _mm256_castps_pd(x), 0));
}
#else
#define DL__GEMM_HALF 0
typedef __m512 dl__h8;
DL__GEMM_INLINE dl__h8 dl__h8_zero(void)
{
    return _mm512_setzero_ps();
}
DL__GEMM_INLINE dl__h8 dl__h8_load(const float *p, __mmask16 m, int masked)
{
    return masked ? _mm512_maskz_loadu_ps(m, p) : _mm512_loadu_ps(p);
}
DL__GEMM_INLINE dl__h8 dl__h8_fma(float a, dl__h8 b, dl__h8 c)
{
    return _mm512_fmadd_ps(_mm512_set1_ps(a), b, c);
}
DL__GEMM_INLINE __m512 dl__h8_wide(dl__h8 x)
{
    return x;
}
#endif

#define DL__K16_ROW(r)                                                   \
    if (R > r) {                                                         \
        const __m512 a_ = _mm512_set1_ps(a[r * ars]);                    \
        c##r##0 = _mm512_fmadd_ps(a_, b0, c##r##0);                      \
        if (H) c##r##h = dl__h8_fma(a[r * ars], bh, c##r##h);            \
        else if (V > 1) c##r##1 = _mm512_fmadd_ps(a_, b1, c##r##1);      \
    }
#define DL__K16_OUT(r)                                                                    \
    if (R > r) {                                                                          \
        if (V > 1) {                                                                      \
            dl__gemm_out16(c + r * ldc, c##r##0, (__mmask16)0xFFFF, va, vb, mode);        \
            dl__gemm_out16(c + r * ldc + 16, H ? dl__h8_wide(c##r##h) : c##r##1, m, va, vb, mode); \
        } else {                                                                          \
            dl__gemm_out16(c + r * ldc, c##r##0, m, va, vb, mode);                        \
        }                                                                                 \
    }

/* R rows (1..8) x V vectors of 16 columns (1..2), the second one a dl__h8
   of at most 8 columns when H; m masks the last vector. Row r of step p of
   A is a[p*acs + r*ars]: a packed sliver (ars 1, acs MR) or op(A) in place
   (dl__gemm_kernel_da). MB: B's last vector loaded under m (B in place, a
   sliver narrower than NR). */
DL__GEMM_INLINE void dl__gemm_k16(const int R, const int V, const int H, const int MB, int64_t kc,
                                  const float *DL__RESTRICT a, const int64_t ars, const int64_t acs,
                                  const float *DL__RESTRICT b, int64_t bs, const int64_t *boff, float *c,
                                  int64_t ldc, __mmask16 m, float alpha, float beta)
{
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    dl__h8 c0h = dl__h8_zero(), c1h = c0h, c2h = c0h, c3h = c0h, c4h = c0h, c5h = c0h, c6h = c0h, c7h = c0h;
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    const int mode = dl__gemm_mode_k(alpha, beta);
    int64_t p;
    for (p = 0; p < kc; p++) {
        const float *bp = boff ? b + boff[p] : b;
        const __m512 b0 = MB && V == 1 ? _mm512_maskz_loadu_ps(m, bp) : _mm512_loadu_ps(bp);
        const __m512 b1 = V > 1 && !H ? (MB ? _mm512_maskz_loadu_ps(m, bp + 16) : _mm512_loadu_ps(bp + 16)) : b0;
        const dl__h8 bh = H ? dl__h8_load(bp + 16, m, MB) : c0h;
        DL__K16_ROW(0)
        DL__K16_ROW(1)
        DL__K16_ROW(2)
        DL__K16_ROW(3)
        DL__K16_ROW(4)
        DL__K16_ROW(5)
        DL__K16_ROW(6)
        DL__K16_ROW(7)
        a += acs;
        b += bs;
    }
    DL__K16_OUT(0)
    DL__K16_OUT(1)
    DL__K16_OUT(2)
    DL__K16_OUT(3)
    DL__K16_OUT(4)
    DL__K16_OUT(5)
    DL__K16_OUT(6)
    DL__K16_OUT(7)
}

/* tiles of mr rows: from a packed sliver of A (B never masked) ... */
#define DL__K16_CASES(V, H, O)                                                                        \
    switch (mr) {                                                                                    \
    case 8: dl__gemm_k16(8, V, H, 0, kc, a, 1, DL__GEMM_MR, b, bs, O, c, ldc, m, alpha, beta); break;  \
    case 7: dl__gemm_k16(7, V, H, 0, kc, a, 1, DL__GEMM_MR, b, bs, O, c, ldc, m, alpha, beta); break;  \
    case 6: dl__gemm_k16(6, V, H, 0, kc, a, 1, DL__GEMM_MR, b, bs, O, c, ldc, m, alpha, beta); break;  \
    case 5: dl__gemm_k16(5, V, H, 0, kc, a, 1, DL__GEMM_MR, b, bs, O, c, ldc, m, alpha, beta); break;  \
    case 4: dl__gemm_k16(4, V, H, 0, kc, a, 1, DL__GEMM_MR, b, bs, O, c, ldc, m, alpha, beta); break;  \
    case 3: dl__gemm_k16(3, V, H, 0, kc, a, 1, DL__GEMM_MR, b, bs, O, c, ldc, m, alpha, beta); break;  \
    case 2: dl__gemm_k16(2, V, H, 0, kc, a, 1, DL__GEMM_MR, b, bs, O, c, ldc, m, alpha, beta); break;  \
    default: dl__gemm_k16(1, V, H, 0, kc, a, 1, DL__GEMM_MR, b, bs, O, c, ldc, m, alpha, beta); break; \
    }
/* ... and from op(A) and B in place (no row table) */
#define DL__KDA_CASES(V, H, MB)                                                                       \
    switch (mr) {                                                                                    \
    case 8: dl__gemm_k16(8, V, H, MB, kc, a, ars, acs, b, ldb, NULL, c, ldc, m, alpha, beta); break;   \
    case 7: dl__gemm_k16(7, V, H, MB, kc, a, ars, acs, b, ldb, NULL, c, ldc, m, alpha, beta); break;   \
    case 6: dl__gemm_k16(6, V, H, MB, kc, a, ars, acs, b, ldb, NULL, c, ldc, m, alpha, beta); break;   \
    case 5: dl__gemm_k16(5, V, H, MB, kc, a, ars, acs, b, ldb, NULL, c, ldc, m, alpha, beta); break;   \
    case 4: dl__gemm_k16(4, V, H, MB, kc, a, ars, acs, b, ldb, NULL, c, ldc, m, alpha, beta); break;   \
    case 3: dl__gemm_k16(3, V, H, MB, kc, a, ars, acs, b, ldb, NULL, c, ldc, m, alpha, beta); break;   \
    case 2: dl__gemm_k16(2, V, H, MB, kc, a, ars, acs, b, ldb, NULL, c, ldc, m, alpha, beta); break;   \
    default: dl__gemm_k16(1, V, H, MB, kc, a, ars, acs, b, ldb, NULL, c, ldc, m, alpha, beta); break;  \
    }

static void dl__gemm_kernel(int64_t kc, const float *a, const float *b, int64_t bs, const int64_t *boff, float *c,
                            int64_t ldc, int mr, int nr, float alpha, float beta)
{
    if (nr > 16) {
        const __mmask16 m = (__mmask16)(0xFFFFu >> (32 - nr));
        if (DL__GEMM_HALF && nr <= 24) {
            if (boff) { DL__K16_CASES(2, 1, boff) } else { DL__K16_CASES(2, 1, (const int64_t *)NULL) }
        } else {
            if (boff) { DL__K16_CASES(2, 0, boff) } else { DL__K16_CASES(2, 0, (const int64_t *)NULL) }
        }
    } else {
        const __mmask16 m = (__mmask16)(0xFFFFu >> (16 - nr));
        if (boff) { DL__K16_CASES(1, 0, boff) } else { DL__K16_CASES(1, 0, (const int64_t *)NULL) }
    }
}

/* Small products without packing (dl__sgemm_block's direct_a): op(A) read
   in place, row r of step p at a[p*acs + r*ars] (either transpose), B in
   place with row stride ldb, the last vector of a sliver narrower than NR
   loaded under the mask (no copy of that sliver). The same fmas in the
   same order as the packed kernels. For few rows of op(A) (B streams
   through once or twice) or a small B (K N floats, in L1). */
#define DL__GEMM_DA 1
#define DL__GEMM_DA_M 12
#define DL__GEMM_DA_KN 4096

static void dl__gemm_kernel_da(int64_t kc, const float *a, int64_t ars, int64_t acs, const float *b, int64_t ldb,
                               float *c, int64_t ldc, int mr, int nr, float alpha, float beta)
{
    if (nr == DL__GEMM_NR) {
        const __mmask16 m = (__mmask16)0xFFFF;
        DL__KDA_CASES(2, 0, 0)
    } else if (nr > 16) {
        const __mmask16 m = (__mmask16)(0xFFFFu >> (32 - nr));
        if (DL__GEMM_HALF && nr <= 24) { DL__KDA_CASES(2, 1, 1) } else { DL__KDA_CASES(2, 0, 1) }
    } else {
        const __mmask16 m = (__mmask16)(0xFFFFu >> (16 - nr));
        DL__KDA_CASES(1, 0, 1)
    }
}

#elif defined(DL__GEMM_AVX2)

DL__GEMM_INLINE void dl__gemm_out8(float *c, __m256 acc, int full, __m256i m, __m256 va, __m256 vb, int mode)
{
    __m256 r;
    if (mode == 3) {
        r = acc;
    } else if (mode == 0) {
        r = _mm256_mul_ps(va, acc);
    } else {
        __m256 old = full ? _mm256_loadu_ps(c) : _mm256_maskload_ps(c, m);
        r = mode == 1 ? _mm256_fmadd_ps(va, acc, old) : _mm256_fmadd_ps(va, acc, _mm256_mul_ps(vb, old));
    }
    if (full) _mm256_storeu_ps(c, r);
    else _mm256_maskstore_ps(c, m, r);
}

#define DL__K8_ROW(r)                                                    \
    if (R > r) {                                                         \
        const __m256 a_ = _mm256_broadcast_ss(a + r);                    \
        c##r##0 = _mm256_fmadd_ps(a_, b0, c##r##0);                      \
        if (V > 1) c##r##1 = _mm256_fmadd_ps(a_, b1, c##r##1);           \
    }
#define DL__K8_OUT(r)                                                         \
    if (R > r) {                                                              \
        if (V > 1) {                                                          \
            dl__gemm_out8(c + r * ldc, c##r##0, 1, m, va, vb, mode);          \
            dl__gemm_out8(c + r * ldc + 8, c##r##1, full, m, va, vb, mode);   \
        } else {                                                              \
            dl__gemm_out8(c + r * ldc, c##r##0, full, m, va, vb, mode);       \
        }                                                                     \
    }

/* R rows (1..6) x V vectors of 8 columns (1..2); m masks the last vector */
DL__GEMM_INLINE void dl__gemm_k8(const int R, const int V, int64_t kc, const float *DL__RESTRICT a,
                                 const float *DL__RESTRICT b, int64_t bs, const int64_t *boff, float *c,
                                 int64_t ldc, int full, __m256i m, float alpha, float beta)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    const int mode = dl__gemm_mode_k(alpha, beta);
    int64_t p;
    for (p = 0; p < kc; p++) {
        const float *bp = boff ? b + boff[p] : b;
        const __m256 b0 = _mm256_loadu_ps(bp);
        const __m256 b1 = V > 1 ? _mm256_loadu_ps(bp + 8) : b0;
        DL__K8_ROW(0)
        DL__K8_ROW(1)
        DL__K8_ROW(2)
        DL__K8_ROW(3)
        DL__K8_ROW(4)
        DL__K8_ROW(5)
        a += DL__GEMM_MR;
        b += bs;
    }
    DL__K8_OUT(0)
    DL__K8_OUT(1)
    DL__K8_OUT(2)
    DL__K8_OUT(3)
    DL__K8_OUT(4)
    DL__K8_OUT(5)
}

#define DL__K8_CASES(V, O)                                                             \
    switch (mr) {                                                                     \
    case 6: dl__gemm_k8(6, V, kc, a, b, bs, O, c, ldc, full, m, alpha, beta); break;     \
    case 5: dl__gemm_k8(5, V, kc, a, b, bs, O, c, ldc, full, m, alpha, beta); break;     \
    case 4: dl__gemm_k8(4, V, kc, a, b, bs, O, c, ldc, full, m, alpha, beta); break;     \
    case 3: dl__gemm_k8(3, V, kc, a, b, bs, O, c, ldc, full, m, alpha, beta); break;     \
    case 2: dl__gemm_k8(2, V, kc, a, b, bs, O, c, ldc, full, m, alpha, beta); break;     \
    default: dl__gemm_k8(1, V, kc, a, b, bs, O, c, ldc, full, m, alpha, beta); break;    \
    }

static void dl__gemm_kernel(int64_t kc, const float *a, const float *b, int64_t bs, const int64_t *boff, float *c,
                            int64_t ldc, int mr, int nr, float alpha, float beta)
{
    const int last = nr > 8 ? nr - 8 : nr, full = last == 8;
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(last), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    if (nr > 8) {
        if (boff) { DL__K8_CASES(2, boff) } else { DL__K8_CASES(2, (const int64_t *)NULL) }
    } else {
        if (boff) { DL__K8_CASES(1, boff) } else { DL__K8_CASES(1, (const int64_t *)NULL) }
    }
}

#else /* portable C */

static void dl__gemm_kernel(int64_t kc, const float *DL__RESTRICT a, const float *DL__RESTRICT b, int64_t bs,
                            const int64_t *boff, float *c, int64_t ldc, int mr, int nr, float alpha, float beta)
{
    float acc[DL__GEMM_MR][DL__GEMM_NR];
    int64_t p;
    int i, j, mode = dl__gemm_mode(beta);
    for (i = 0; i < DL__GEMM_MR; i++)
        for (j = 0; j < DL__GEMM_NR; j++) acc[i][j] = 0.0f;
    for (p = 0; p < kc; p++) {
        const float *bp = boff ? b + boff[p] : b;
        for (i = 0; i < DL__GEMM_MR; i++) {
            const float ai = a[i];
            for (j = 0; j < DL__GEMM_NR; j++) acc[i][j] = DL__GEMM_FMA(ai, bp[j], acc[i][j]);
        }
        a += DL__GEMM_MR;
        b += bs;
    }
    for (i = 0; i < mr; i++) {
        float *ci = c + i * ldc;
        if (mode == 0) {
            for (j = 0; j < nr; j++) ci[j] = alpha * acc[i][j];
        } else if (mode == 1) {
            for (j = 0; j < nr; j++) ci[j] = DL__GEMM_FMA(alpha, acc[i][j], ci[j]);
        } else {
            for (j = 0; j < nr; j++) ci[j] = DL__GEMM_FMA(alpha, acc[i][j], beta * ci[j]);
        }
    }
}

#endif

/* Skinny products with op(B) = B^T, few rows of C and a long K (weight
   gradients: C = dY X^T): C(i,j) is the dot product of rows A_i and
   B_j, both contiguous along K, so nothing is transposed. Vectors run along
   K: lane l of the accumulator of (i,j) sums the products with k = l (mod 16)
   in order of k. K is walked in chunks of DL__GEMM_DOT_KK read in place
   (rows of B through the row table when there is one; the last vector of a
   chunk loaded with its missing lanes as zeros), with the accumulators parked
   exactly in a buffer between chunks (so the chunking changes nothing); at
   the end the 16 lanes are summed by one fixed tree and C is updated as by
   the kernels. A tile is up to 4 rows of A x 6 rows of B; threads split the
   rows of B. Whether this path runs depends on the shape alone. */
#if defined(DL__GEMM_AVX512)
#define DL__GEMM_DOT 1
#ifndef DL__GEMM_DOT_KK
#define DL__GEMM_DOT_KK 512
#endif
#define DL__GEMM_DOT_NB 240      /* rows of B per pass over K (bounds the parked accumulators) */
#define DL__GEMM_DOT_MAX_M 64
/* keeps a value in a register: gcc would rather fold the load of b into each
   of the four multiply-adds that use it, which costs more loads */
#if defined(__GNUC__)
#define DL__GEMM_INREG(x) __asm__("" : "+v"(x))
#else
#define DL__GEMM_INREG(x) (void)0
#endif

#define DL__DOT_Z(r) __m512 d##r##0 = z, d##r##1 = z, d##r##2 = z, d##r##3 = z, d##r##4 = z, d##r##5 = z
#define DL__DOT_S(s, LD)                                            \
    if (S > s) {                                                    \
        __m512 b_ = LD(b##s + o);                                   \
        DL__GEMM_INREG(b_);                                         \
        d0##s = _mm512_fmadd_ps(a0, b_, d0##s);                     \
        if (R > 1) d1##s = _mm512_fmadd_ps(a1, b_, d1##s);          \
        if (R > 2) d2##s = _mm512_fmadd_ps(a2, b_, d2##s);          \
        if (R > 3) d3##s = _mm512_fmadd_ps(a3, b_, d3##s);          \
    }
/* pair (r,s) parks at P + r*pst + s*16 */
#define DL__DOT_PARK1(r, s, OP) \
    if (R > r && S > s) OP(r, s)
#define DL__DOT_PARK(OP)                                                            \
    DL__DOT_PARK1(0, 0, OP) DL__DOT_PARK1(0, 1, OP) DL__DOT_PARK1(0, 2, OP)         \
    DL__DOT_PARK1(0, 3, OP) DL__DOT_PARK1(0, 4, OP) DL__DOT_PARK1(0, 5, OP)         \
    DL__DOT_PARK1(1, 0, OP) DL__DOT_PARK1(1, 1, OP) DL__DOT_PARK1(1, 2, OP)         \
    DL__DOT_PARK1(1, 3, OP) DL__DOT_PARK1(1, 4, OP) DL__DOT_PARK1(1, 5, OP)         \
    DL__DOT_PARK1(2, 0, OP) DL__DOT_PARK1(2, 1, OP) DL__DOT_PARK1(2, 2, OP)         \
    DL__DOT_PARK1(2, 3, OP) DL__DOT_PARK1(2, 4, OP) DL__DOT_PARK1(2, 5, OP)         \
    DL__DOT_PARK1(3, 0, OP) DL__DOT_PARK1(3, 1, OP) DL__DOT_PARK1(3, 2, OP)         \
    DL__DOT_PARK1(3, 3, OP) DL__DOT_PARK1(3, 4, OP) DL__DOT_PARK1(3, 5, OP)
#define DL__DOT_GET(r, s) d##r##s = _mm512_load_ps(P + r * pst + s * 16);
#define DL__DOT_PUT(r, s) _mm512_store_ps(P + r * pst + s * 16, d##r##s);
#define DL__DOT_OUT(r, s) dl__gemm_dot_out(c + r * ldc + s, d##r##s, alpha, beta, mode);

/* the fixed tree over the 16 lanes, then the kernels' update of C */
DL__GEMM_INLINE void dl__gemm_dot_out(float *c, __m512 d, float alpha, float beta, int mode)
{
    float s;
    /* (the maskz forms: g++ 12 warns on the undefined source of the others) */
    d = _mm512_add_ps(d, _mm512_maskz_shuffle_f32x4((__mmask16)0xFFFF, d, d, 0x4E));
    d = _mm512_add_ps(d, _mm512_maskz_shuffle_f32x4((__mmask16)0xFFFF, d, d, 0xB1));
    d = _mm512_add_ps(d, _mm512_maskz_permute_ps((__mmask16)0xFFFF, d, 0x4E));
    d = _mm512_add_ps(d, _mm512_maskz_permute_ps((__mmask16)0xFFFF, d, 0xB1));
    s = _mm512_cvtss_f32(d);
    if (mode == 0) *c = alpha * s;
    else if (mode == 1) *c = DL__GEMM_FMA(alpha, s, *c);
    else *c = DL__GEMM_FMA(alpha, s, beta * *c);
}

/* R rows of a (1..4, row stride kas) x S rows of b (1..6, starting at
   bq[s]), over nv vectors, the last one holding only `tail` lanes when tail
   > 0 (the others loaded as zeros, as a zero-padded copy would give); that
   `reps` times, a and the rows of b moved on by ras and rbs floats each time
   (blocks of K that are not contiguous: the samples of dl__s1r_wgrad).
   first: start from zero, else from P; last: finish into C, else park in P. */
#define DL__DOT_LDU(p) _mm512_loadu_ps(p)
#define DL__DOT_LDM(p) _mm512_maskz_loadu_ps(tm, p)
#define DL__DOT_STEP(LD)                                            \
    {                                                               \
        const __m512 a0 = LD(a + o);                                \
        const __m512 a1 = R > 1 ? LD(a + kas + o) : z;              \
        const __m512 a2 = R > 2 ? LD(a + 2 * kas + o) : z;          \
        const __m512 a3 = R > 3 ? LD(a + 3 * kas + o) : z;          \
        DL__DOT_S(0, LD)                                            \
        DL__DOT_S(1, LD)                                            \
        DL__DOT_S(2, LD)                                            \
        DL__DOT_S(3, LD)                                            \
        DL__DOT_S(4, LD)                                            \
        DL__DOT_S(5, LD)                                            \
    }
DL__GEMM_INLINE void dl__gemm_dot_tile(const int R, const int S, int64_t nv, int tail, const float *DL__RESTRICT a,
                                       int64_t kas, const float *const *bq, int64_t reps, int64_t ras, int64_t rbs,
                                       float *P, int64_t pst, int first, int last, float *c, int64_t ldc, float alpha,
                                       float beta)
{
    const __m512 z = _mm512_setzero_ps();
    const int mode = dl__gemm_mode(beta);
    const float *b0 = bq[0], *b1 = S > 1 ? bq[1] : b0, *b2 = S > 2 ? bq[2] : b0, *b3 = S > 3 ? bq[3] : b0,
                *b4 = S > 4 ? bq[4] : b0, *b5 = S > 5 ? bq[5] : b0;
    int64_t v, o, rp, nfull = tail ? nv - 1 : nv;
    DL__DOT_Z(0);
    DL__DOT_Z(1);
    DL__DOT_Z(2);
    DL__DOT_Z(3);
    if (!first) {
        DL__DOT_PARK(DL__DOT_GET)
    }
    for (rp = 0; rp < reps; rp++) {
        for (v = 0, o = 0; v < nfull; v++, o += 16) DL__DOT_STEP(DL__DOT_LDU)
        if (tail) {
            const __mmask16 tm = (__mmask16)((1u << tail) - 1u);
            DL__DOT_STEP(DL__DOT_LDM)
        }
        a += ras;
        b0 += rbs; b1 += rbs; b2 += rbs; b3 += rbs; b4 += rbs; b5 += rbs;
    }
    if (last) {
        DL__DOT_PARK(DL__DOT_OUT)
    } else {
        DL__DOT_PARK(DL__DOT_PUT)
    }
}

#define DL__DOT_SCASES(R)                                                                              \
    switch (ns) {                                                                                      \
    case 6: dl__gemm_dot_tile(R, 6, nv, tail, a, kas, bq, reps, ras, rbs, P, pst, first, last, c, ldc, alpha, beta); break; \
    case 5: dl__gemm_dot_tile(R, 5, nv, tail, a, kas, bq, reps, ras, rbs, P, pst, first, last, c, ldc, alpha, beta); break; \
    case 4: dl__gemm_dot_tile(R, 4, nv, tail, a, kas, bq, reps, ras, rbs, P, pst, first, last, c, ldc, alpha, beta); break; \
    case 3: dl__gemm_dot_tile(R, 3, nv, tail, a, kas, bq, reps, ras, rbs, P, pst, first, last, c, ldc, alpha, beta); break; \
    case 2: dl__gemm_dot_tile(R, 2, nv, tail, a, kas, bq, reps, ras, rbs, P, pst, first, last, c, ldc, alpha, beta); break; \
    default: dl__gemm_dot_tile(R, 1, nv, tail, a, kas, bq, reps, ras, rbs, P, pst, first, last, c, ldc, alpha, beta); break; \
    }

static void dl__gemm_dot(int nr, int ns, int64_t nv, int tail, const float *a, int64_t kas, const float *const *bq,
                         int64_t reps, int64_t ras, int64_t rbs, float *P, int64_t pst, int first, int last, float *c,
                         int64_t ldc, float alpha, float beta)
{
    switch (nr) {
    case 4: DL__DOT_SCASES(4) break;
    case 3: DL__DOT_SCASES(3) break;
    case 2: DL__DOT_SCASES(2) break;
    default: DL__DOT_SCASES(1) break;
    }
}

/* Whether A B^T takes the dot path: from the shape alone. Cost model in
   cycles: the dot path runs at ~3/4 of the kernel's speed plus ~5 cycles a
   pair for the lane sum; the packed path (~93%) transposes both operands at
   ~0.4 cycles an element. */
static int dl__gemm_use_dot(bool transa, bool transb, int64_t M, int64_t N, int64_t K)
{
    double work = (double)M * (double)N * (double)K;
    return !transa && transb && M <= DL__GEMM_DOT_MAX_M &&
           work * (1.0 / 24.0 - 1.0 / 30.0) + 5.0 * (double)M * (double)N < 0.4 * (double)(M + N) * (double)K;
}

/* Scalar path with exactly the dot path's arithmetic (16 lanes along K, the
   zero padding of the last vector, the same tree): allocation failure. */
static void dl__gemm_dot_ref(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                             const float *B, int64_t ldb, const int64_t *brow, float beta, float *C, int64_t ldc)
{
    int64_t i, j, k, ks = dl__round_up(K, 16);
    int l, st, mode = dl__gemm_mode(beta);
    for (i = 0; i < M; i++) {
        for (j = 0; j < N; j++) {
            float d[16], e[16], *c = C + i * ldc + j;
            for (l = 0; l < 16; l++) d[l] = 0.0f;
            for (k = 0; k < ks; k++)
                d[k % 16] = DL__GEMM_FMA(k < K ? A[i * lda + k] : 0.0f,
                                         k < K ? B[(brow ? brow[j] : j * ldb) + k] : 0.0f, d[k % 16]);
            for (st = 8; st >= 1; st /= 2) {
                for (l = 0; l < 16; l++) e[l] = d[l] + d[l ^ st];
                for (l = 0; l < 16; l++) d[l] = e[l];
            }
            if (mode == 0) *c = alpha * d[0];
            else if (mode == 1) *c = DL__GEMM_FMA(alpha, d[0], *c);
            else *c = DL__GEMM_FMA(alpha, d[0], beta * *c);
        }
    }
}
#endif

/* Work handed out in order, one index at a time, to the threads of a job
   (dl__claim, an atomic add as the pool's claims): a thread that starts
   late or shares its core takes less. */
typedef struct dl__claimer {
    int64_t next;
} dl__claimer;

static int64_t dl__claim(dl__claimer *c)
{
#ifndef DL_NO_THREADS
    return __atomic_fetch_add(&c->next, 1, __ATOMIC_RELAXED);
#else
    return c->next++;
#endif
}

/* task(arg, slot, slot + 1) on nslots threads (inline for one) that claim
   their work from c */
static void dl__claim_run(dl__pool *pool, dl__claimer *c, int64_t nslots, dl__task_fn task, void *arg)
{
    c->next = 0;
    if (nslots <= 1) task(arg, 0, 1);
    else dl__parallel_for(pool, nslots, 1, task, arg);
}

typedef struct dl__sgemm_job {
    bool transa, transb;
    int64_t M, N, K;
    float alpha, beta;
    const float *A;
    int64_t lda;
    const float *B;
    int64_t ldb;
    const int64_t *brow; /* NULL, or row r of B as stored starts at B + brow[r] (ldb unused) */
    float *C;
    int64_t ldc;
    int64_t kc;         /* K block (from K alone) */
    int64_t mc, nc;     /* rows of op(A) / columns of op(B) per packed block */
    int direct_b;       /* read B in place (not transposed; few rows of A) */
    int direct_a;       /* ... and op(A) too: small products (dl__gemm_kernel_da) */
    int dot;            /* the dot-product path (dl__sgemm_dot_block) */
    int split_n;        /* 1: tasks index column units; 0: MR row slivers */
    int64_t unit_n;     /* columns per unit of the column split (NR, or a vector for narrow C) */
    int64_t chunk;      /* units per chunk */
    int64_t units;      /* units of the split */
    int64_t nchunks;    /* chunks, claimed in order by the threads */
    dl__claimer cl;     /* hands them out */
    float *bufs;        /* per-thread buffers, each buf_stride floats */
    int64_t a_size;     /* floats for packed A in each buffer */
    int64_t buf_stride;
} dl__sgemm_job;

/* The loop nest on C[m0:m1, n0:n1] with private pack buffers. */
static void dl__sgemm_block(const dl__sgemm_job *J, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float *abuf,
                            float *bbuf)
{
    int64_t ic, pc, jc, jr, ir;
    for (ic = m0; ic < m1; ic += J->mc) {
        int64_t mc = m1 - ic < J->mc ? m1 - ic : J->mc;
        for (pc = 0; pc < J->K; pc += J->kc) {
            int64_t kc = J->K - pc < J->kc ? J->K - pc : J->kc;
            float beta = pc == 0 ? J->beta : 1.0f;
#ifdef DL__GEMM_DA
            if (J->direct_a) {
                /* A and B in place: B sliver by sliver, each used by all
                   the row tiles (near-equal: 10 rows as 5 + 5, not 8 + 2) */
                int64_t ars = J->transa ? 1 : J->lda, acs = J->transa ? J->lda : 1;
                int64_t nt = (mc + DL__GEMM_MR - 1) / DL__GEMM_MR, t;
                for (jr = n0; jr < n1; jr += DL__GEMM_NR) {
                    int nr = (int)(n1 - jr < DL__GEMM_NR ? n1 - jr : DL__GEMM_NR);
                    for (t = 0; t < nt; t++) {
                        int64_t r0 = ic + mc * t / nt, r1 = ic + mc * (t + 1) / nt;
                        dl__gemm_kernel_da(kc, J->A + r0 * ars + pc * acs, ars, acs, J->B + pc * J->ldb + jr, J->ldb,
                                           J->C + r0 * J->ldc + jr, J->ldc, (int)(r1 - r0), nr, J->alpha, beta);
                    }
                }
                continue;
            }
#endif
            dl__gemm_pack_a(J->transa, J->A, J->lda, ic, mc, pc, kc, abuf);
            if (J->direct_b) {
                /* each B sliver straight from B (the last, narrow one packed
                   with zero padding), used by all the A slivers */
                for (jr = n0; jr < n1; jr += DL__GEMM_NR) {
                    int nr = (int)(n1 - jr < DL__GEMM_NR ? n1 - jr : DL__GEMM_NR);
                    const float *bp = J->brow ? J->B + jr : J->B + pc * J->ldb + jr;
                    const int64_t *boff = J->brow ? J->brow + pc : NULL;
                    int64_t bs = J->brow ? 0 : J->ldb;
                    if (nr < DL__GEMM_NR) {
                        dl__gemm_pack_b(false, J->B, J->ldb, J->brow, pc, kc, jr, nr, bbuf);
                        bp = bbuf;
                        bs = DL__GEMM_NR;
                        boff = NULL;
                    }
#if defined(DL__GEMM_AVX512) || defined(DL__GEMM_AVX2)
                    else if (!boff && mc <= DL__GEMM_MR && jr + 3 * DL__GEMM_NR <= n1) {
                        /* one A sliver: B streams through once, so fetch
                           the sliver after next (the prefetchers miss it) */
                        const char *q = (const char *)(bp + 2 * DL__GEMM_NR);
                        int64_t p;
                        for (p = 0; p < kc; p++, q += J->ldb * (int64_t)sizeof(float)) {
                            _mm_prefetch(q, _MM_HINT_T0);
                            if (DL__GEMM_NR * sizeof(float) > 64) _mm_prefetch(q + 64, _MM_HINT_T0);
                        }
                    }
#endif
                    for (ir = 0; ir < mc; ir += DL__GEMM_MR) {
                        int mr = (int)(mc - ir < DL__GEMM_MR ? mc - ir : DL__GEMM_MR);
                        dl__gemm_kernel(kc, abuf + ir * kc, bp, bs, boff, J->C + (ic + ir) * J->ldc + jr, J->ldc, mr, nr,
                                        J->alpha, beta);
                    }
                }
                continue;
            }
            for (jc = n0; jc < n1; jc += J->nc) {
                int64_t nc = n1 - jc < J->nc ? n1 - jc : J->nc;
                dl__gemm_pack_b(J->transb, J->B, J->ldb, J->brow, pc, kc, jc, nc, bbuf);
                for (ir = 0; ir < mc; ir += DL__GEMM_MR) {
                    int mr = (int)(mc - ir < DL__GEMM_MR ? mc - ir : DL__GEMM_MR);
                    float *c = J->C + (ic + ir) * J->ldc + jc;
                    for (jr = 0; jr < nc; jr += DL__GEMM_NR) {
                        int nr = (int)(nc - jr < DL__GEMM_NR ? nc - jr : DL__GEMM_NR);
                        dl__gemm_kernel(kc, abuf + ir * kc, bbuf + jr * kc, DL__GEMM_NR, NULL, c + jr, J->ldc, mr, nr,
                                        J->alpha, beta);
                    }
                }
            }
        }
    }
}

#ifdef DL__GEMM_DOT
/* C[0:M, n0:n1] by dot products, DL__GEMM_DOT_NB rows of B at a time, A
   and B read in place. buf: the parked accumulators (M x NB x 16) */
static void dl__sgemm_dot_block(const dl__sgemm_job *J, int64_t n0, int64_t n1, float *buf)
{
    int64_t ga = (J->M + 3) / 4, nb0, kb, g, h;
    float *P = buf;
    for (nb0 = n0; nb0 < n1; nb0 += DL__GEMM_DOT_NB) {
        int64_t nt = n1 - nb0 < DL__GEMM_DOT_NB ? n1 - nb0 : DL__GEMM_DOT_NB, gb = (nt + 5) / 6;
        for (kb = 0; kb < J->K; kb += DL__GEMM_DOT_KK) {
            int64_t kk = J->K - kb < DL__GEMM_DOT_KK ? J->K - kb : DL__GEMM_DOT_KK;
            int first = kb == 0, last = kb + kk >= J->K, tail = (int)(kk % 16);
            for (g = 0; g < gb; g++) {
                /* near-equal groups: at most 6 rows of B, 4 of A */
                int64_t j0 = nb0 + nt * g / gb, j1 = nb0 + nt * (g + 1) / gb, r;
                const float *bq[6];
                for (r = j0; r < j1; r++) bq[r - j0] = J->B + (J->brow ? J->brow[r] : r * J->ldb) + kb;
                for (h = 0; h < ga; h++) {
                    int64_t i0 = J->M * h / ga, i1 = J->M * (h + 1) / ga;
                    dl__gemm_dot((int)(i1 - i0), (int)(j1 - j0), (kk + 15) / 16, tail, J->A + i0 * J->lda + kb,
                                 J->lda, bq, 1, 0, 0, P + (i0 * nt + (j0 - nb0)) * 16, nt * 16, first, last,
                                 J->C + i0 * J->ldc + j0, J->ldc, J->alpha, J->beta);
                }
            }
        }
    }
}
#endif

/* units [begin, end) with the buffers of one thread */
static void dl__sgemm_chunk(const dl__sgemm_job *J, int64_t begin, int64_t end, float *abuf)
{
    float *bbuf = abuf ? abuf + J->a_size : NULL;
#ifdef DL__GEMM_DOT
    if (J->dot) {
        dl__sgemm_dot_block(J, begin, end, abuf);
        return;
    }
#endif
    if (J->split_n) {
        int64_t n0 = begin * J->unit_n, n1 = end * J->unit_n;
        if (n1 > J->N) n1 = J->N;
        dl__sgemm_block(J, 0, J->M, n0, n1, abuf, bbuf);
    } else {
        int64_t m0 = begin * DL__GEMM_MR, m1 = end * DL__GEMM_MR;
        if (m1 > J->M) m1 = J->M;
        dl__sgemm_block(J, m0, m1, 0, J->N, abuf, bbuf);
    }
}

/* One task per thread: it claims chunks in order until none is left, so a
   thread that starts late (or shares its core) does less of the work. Which
   thread computes a chunk does not change its bits. [begin, end) are thread
   slots; a serial run (nested call) gets them all and uses slot 0's buffers. */
static void dl__sgemm_task(void *varg, int64_t begin, int64_t end)
{
    dl__sgemm_job *J = (dl__sgemm_job *)varg;
    float *abuf = J->bufs ? J->bufs + begin * J->buf_stride : NULL; /* none: direct_a */
    (void)end;
    for (;;) {
        int64_t c = dl__claim(&J->cl), u0, u1;
        if (c >= J->nchunks) break;
        u0 = c * J->chunk;
        u1 = u0 + J->chunk < J->units ? u0 + J->chunk : J->units;
        dl__sgemm_chunk(J, u0, u1, abuf);
    }
}

/* Pack buffers: the pool keeps one between calls (taken by one call at a
   time); otherwise, or when it is taken, a malloc for this call. Returns the
   64-byte aligned buffer, NULL when out of memory; *raw is what
   dl__gemm_buf_put frees (NULL for the pool's). */
static float *dl__gemm_buf_get(dl__pool *pool, size_t bytes, void **raw)
{
    void *r = NULL;
    *raw = NULL;
    bytes += 64;
    if (pool) {
        int mine = 0;
#ifndef DL_NO_THREADS
        pthread_mutex_lock(&pool->mu);
#endif
        if (!pool->gemm_busy) pool->gemm_busy = mine = 1;
#ifndef DL_NO_THREADS
        pthread_mutex_unlock(&pool->mu);
#endif
        if (mine) {
            if (pool->gemm_cap < bytes) {
                DL_FREE(pool->gemm_raw);
                pool->gemm_cap = 0;
                pool->gemm_raw = DL_MALLOC(bytes);
                if (pool->gemm_raw) pool->gemm_cap = bytes;
            }
            r = pool->gemm_raw;
            if (!r) {
#ifndef DL_NO_THREADS
                pthread_mutex_lock(&pool->mu);
#endif
                pool->gemm_busy = 0;
#ifndef DL_NO_THREADS
                pthread_mutex_unlock(&pool->mu);
#endif
                return NULL;
            }
        }
    }
    if (!r) {
        r = DL_MALLOC(bytes);
        if (!r) return NULL;
        *raw = r;
    }
    return (float *)(void *)(((uintptr_t)r + 63) & ~(uintptr_t)63);
}

static void dl__gemm_buf_put(dl__pool *pool, void *raw)
{
    if (raw) {
        DL_FREE(raw);
        return;
    }
#ifndef DL_NO_THREADS
    pthread_mutex_lock(&pool->mu);
#endif
    pool->gemm_busy = 0;
#ifndef DL_NO_THREADS
    pthread_mutex_unlock(&pool->mu);
#endif
}

/* C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C.   Row-major.
   op(A) = A (M,K) with row stride lda if !transa, else A is stored (K,M)
   with row stride lda and op(A)=A^T.  Same for B: (K,N) with ldb, or
   stored (N,K) when transb.  C has row stride ldc.
   beta == 0 means C is write-only (never read). brow (not NULL): row r of
   B as stored starts at B + brow[r] (ldb ignored; with transb, op(B) is
   that B transposed): an "implicit" B, such as the shifted views of a
   padded image that a stride-1 convolution multiplies (the same bits as
   the same B stored plainly). */
static void dl__sgemm_rows(dl__pool *pool, bool transa, bool transb, int64_t M, int64_t N, int64_t K, float alpha,
                           const float *A, int64_t lda, const float *B, int64_t ldb, const int64_t *brow, float beta,
                           float *C, int64_t ldc)
{
    dl__sgemm_job J;
    int64_t units_m, units_n, units, nch, chunk, b_size;
    double work = (double)M * (double)N * (double)K, cost_a, cost_b;
    int nthreads;
    void *raw;

    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        dl__gemm_scale(M, N, beta, C, ldc);
        return;
    }
    J.kc = dl__gemm_kc(K);
    if (work < DL__GEMM_REF_MAX) {
        dl__gemm_ref(transa, transb, M, N, K, J.kc, alpha, A, lda, B, ldb, brow, beta, C, ldc);
        return;
    }

    nthreads = work < DL__GEMM_PAR_MIN ? 1 : dl__pool_size(pool);
    J.direct_b = !transb && M <= DL__GEMM_DIRECT_M;
    J.direct_a = 0;
#ifdef DL__GEMM_DA
    J.direct_a = !transb && !brow && (M <= DL__GEMM_DA_M || K * N <= DL__GEMM_DA_KN);
    if (J.direct_a) J.direct_b = 1;
#endif
    /* what an element of op(A) or op(B) costs, packed or read in place */
    cost_a = J.direct_a ? DL__GEMM_READ_COST : DL__GEMM_PACK_COST;
    cost_b = J.direct_b ? DL__GEMM_READ_COST : DL__GEMM_PACK_COST;
    J.dot = 0;
#ifdef DL__GEMM_DOT
    J.dot = dl__gemm_use_dot(transa, transb, M, N, K); /* from the shape alone: its order differs */
    if (J.dot) {
        /* split the rows of B; P: parked accumulators of M x N pairs (any
           task may be run on the whole range) */
        J.split_n = 1;
        J.unit_n = 1;
        units = N;
        nch = dl__split(units, 1, nthreads, &chunk);
        J.a_size = K > DL__GEMM_DOT_KK ? M * DL__GEMM_DOT_NB * 16 : 16;
        J.buf_stride = J.a_size;
        J.mc = J.nc = 0;
        goto run;
    }
#endif
    /* split C into column ranges (each thread packs all of A and its part of
       B) or row ranges (all of B, part of A): whichever gives the smaller
       largest share of multiply-adds plus packing (or reading B in place);
       narrow C splits by vectors */
    units_m = (M + DL__GEMM_MR - 1) / DL__GEMM_MR;
    J.unit_n = (N + DL__GEMM_NR - 1) / DL__GEMM_NR >= 2 * (int64_t)nthreads ? DL__GEMM_NR : DL__GEMM_NV;
    units_n = (N + J.unit_n - 1) / J.unit_n;
    {
        int64_t tn = units_n < nthreads ? units_n : nthreads, tm = units_m < nthreads ? units_m : nthreads;
        double wn = (double)((units_n + tn - 1) / tn * J.unit_n), wm = (double)((units_m + tm - 1) / tm * DL__GEMM_MR);
        double cn, cm;
        if (wn > (double)N) wn = (double)N;
        if (wm > (double)M) wm = (double)M;
        cn = wn * (double)M * (double)K + cost_a * (double)M * (double)K + cost_b * wn * (double)K;
        cm = wm * (double)N * (double)K + cost_a * wm * (double)K + cost_b * (double)N * (double)K;
        J.split_n = cn <= cm;
    }
    units = J.split_n ? units_n : units_m;
    nch = dl__split(units, 1, nthreads, &chunk);

    /* buffers sized for the whole problem (capped by MC/NC), so that a task
       may safely run any range (e.g. serial fallback of a nested call) */
    J.mc = dl__round_up(M < DL__GEMM_MC ? M : DL__GEMM_MC, DL__GEMM_MR);
    J.nc = dl__round_up(N < DL__GEMM_NC ? N : DL__GEMM_NC, DL__GEMM_NR);
    J.a_size = dl__round_up(J.mc * J.kc + 8, 16);
    b_size = J.direct_b ? J.kc * DL__GEMM_NR : J.nc * J.kc;
    J.buf_stride = J.a_size + dl__round_up(b_size + 8, 16);
#ifdef DL__GEMM_DOT
run:
#endif
    raw = NULL;
    J.bufs = J.direct_a ? NULL : dl__gemm_buf_get(pool, (size_t)(nch * J.buf_stride) * sizeof(float), &raw);
    if (!J.bufs && !J.direct_a) {
        /* out of memory: the same arithmetic, without buffers */
#ifdef DL__GEMM_DOT
        if (J.dot) {
            dl__gemm_dot_ref(M, N, K, alpha, A, lda, B, ldb, brow, beta, C, ldc);
            return;
        }
#endif
        dl__gemm_ref(transa, transb, M, N, K, J.kc, alpha, A, lda, B, ldb, brow, beta, C, ldc);
        return;
    }
    J.transa = transa;
    J.transb = transb;
    J.M = M;
    J.N = N;
    J.K = K;
    J.alpha = alpha;
    J.beta = beta;
    J.A = A;
    J.lda = lda;
    J.B = B;
    J.ldb = ldb;
    J.brow = brow;
    J.C = C;
    J.ldc = ldc;
    /* chunks, claimed dynamically: one per thread (a worker that wakes late
       finds its chunk taken), or up to DL__GEMM_DYN per thread while what
       each chunk packs again (A, or B for a row split) stays under
       DL__GEMM_CHUNK_SHARE of the work */
    J.units = units;
    {
        int64_t per = nch > 1 ? DL__GEMM_DYN : 1;
        double again = J.dot ? (double)M * (double)K
                             : (J.split_n ? cost_a * (double)M * (double)K : cost_b * (double)N * (double)K);
        while (per > 1 && (double)(nch * per) * again > DL__GEMM_CHUNK_SHARE * work) per--;
        J.nchunks = nch * per < units ? nch * per : units;
    }
    J.chunk = (units + J.nchunks - 1) / J.nchunks;
    J.nchunks = (units + J.chunk - 1) / J.chunk;
    (void)chunk;
    dl__claim_run(pool, &J.cl, nch, dl__sgemm_task, &J);
    if (J.bufs) dl__gemm_buf_put(pool, raw);
}

static DL__UNUSED void dl__sgemm(dl__pool *pool, bool transa, bool transb, int64_t M, int64_t N, int64_t K,
                                 float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                                 float beta, float *C, int64_t ldc)
{
    dl__sgemm_rows(pool, transa, transb, M, N, K, alpha, A, lda, B, ldb, NULL, beta, C, ldc);
}

// >>section memory
/* Memory has two lifetimes. Persistent tensors (parameters, optimizer state)
   are allocated one by one and linked into a list the context frees. Step
   tensors' data comes from an arena: a list of large chunks handed out by
   bumping an offset. dl_step_end() sets every offset back to zero and keeps
   the chunks, so a training loop that makes the same tensors each step stops
   calling the allocator after its first step.

   Step tensor headers (and tape nodes) are what a user's dl_tensor pointer
   points at, so their addresses are never reused: on 64-bit POSIX systems
   they are bump-allocated from a large reserved range of address space
   (dl__hregion), and the pages of steps older than the previous one are given
   back to the system in batches (mapped again as read-only zeros). A pointer
   from any earlier step therefore still points at a readable header: intact
   (its step number says it is stale) or zeroed (its address says which
   context it came from); either way the op reports DL_ERR_STALE instead of
   reading recycled memory. Where address space cannot be reserved, headers
   come from two arenas used on alternate steps, which detects a stale tensor
   through the next step only. */

typedef struct dl__chunk {
    struct dl__chunk *next;
    size_t size, used;
    unsigned char *mem;       /* 64-byte aligned start inside this allocation */
} dl__chunk;

#define DL__ARENA_FREE 64
typedef struct dl__arena {
    dl__chunk *head, *cur;
    size_t used, reserved;    /* bytes handed out this step; bytes held */
    size_t min_chunk;
    dl__dev *dev;             /* chunks from this device's backend (NULL: host memory) */
    int nfree;                /* blocks given back within the step (backward's gradients) */
    void *free_p[DL__ARENA_FREE];
    size_t free_n[DL__ARENA_FREE];
} dl__arena;

typedef struct dl__mark { dl__chunk *cur; size_t cur_used, used; } dl__mark;

/* A reserved range of address space for step headers: [0, released) given
   back, [released, rw_hi) committed read-write, pos: next free byte. */
typedef struct dl__hregion {
    struct dl__hregion *next;         /* older regions */
    unsigned char *base;
    size_t size, pos, rw_hi, released;
    uint64_t retire_step;             /* 0: current; else released once ctx->step >= it */
} dl__hregion;

typedef struct dl__hmark { dl__hregion *r; size_t pos; dl__mark m; } dl__hmark;

// >>section devices and backends
/* A device (dl__dev) is one place where tensor data lives: cpu:0 (the host),
   a virtual CPU device cpu:i, or cuda:i. It owns its memory (persistent
   allocations and an arena of step memory), its statistics and a pointer to
   its backend: one struct of entry points per device type (dl__backend).
   Ops reach tensor data only through the backend of the tensor's device:
   memory (allocate, free, copies between host and device), synchronization,
   random fills, and every kernel. Kernels get raw device pointers, sizes
   and strides (in elements) and know nothing of autograd. The CPU backend is
   below; dl_cuda.cuh is the second instance, for NVIDIA GPUs.

   Strict virtual CPU devices (dl_ctx_desc.strict_devices, DL_STRICT=1) hand
   out data pointers that are not host addresses: the real address plus a tag
   (bit 52) that the CPU backend takes off at its entry points. Host code that
   touches such a tensor's data directly faults at once instead of working on
   the CPU and crashing later on a GPU. */

#if defined(__CUDACC__)
#define DL__HD __host__ __device__
#else
#define DL__HD
#endif

typedef struct dl__backend dl__backend;

struct dl__dev {
    dl_device id;
    const dl__backend *be;
    dl_ctx *ctx;
    dl__arena data;                   /* step memory: O(1) release at dl_step_end */
    size_t held;                      /* step memory set aside: captures' arenas (and during a
                                         capture, the device's own), counted by memory_limit */
    size_t persistent_bytes, peak_bytes;
    uint64_t alloc_calls;             /* calls to the backend's allocator */
    uintptr_t tag;                    /* strict devices: added to every data pointer */
    bool failed;                      /* a backend call failed: errmsg says what */
    char errmsg[256];
    void *impl;                       /* the backend's own state (CUDA: stream, handles) */
};

static dl_result dl__dev_check(dl__dev *d, const char *op);

/* For backends: record a failure (the op that called reports it, with its
   name, through dl__done; transfers report it themselves). */
static void dl__dev_fail(dl__dev *d, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* exp(x) for float, branch-free so loops of it vectorize (libm's expf is a
   call per element): n = round(x / ln 2) by the 1.5 * 2^23 trick,
   r = x - n ln 2 in two parts (Cody-Waite), e^r by Cephes' degree-6
   polynomial on |r| <= ln2/2 (fused multiply-adds where the target has
   them: DL__GEMM_FMA), times 2^n built from bits in two halves (so
   subnormal results round once). Within 2 ulp of the true value over the
   whole range (tests/test_ops.c checks every float from -104 to 89 in steps);
   +-inf and NaN as expf. */
static DL__HD inline float dl__expf(float x)
{
    float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);   /* NaN passes */
    float t = DL__GEMM_FMA(xc, 1.44269504088896341f, 12582912.0f);
    float n = t - 12582912.0f;
    float r = DL__GEMM_FMA(n, -0.693359375f, xc), p, s1, s2;
    uint32_t tb, b1, b2;
    int32_t ni, n1;
    r = DL__GEMM_FMA(n, 2.12194440e-4f, r);
    p = 1.9875691500e-4f;
    p = DL__GEMM_FMA(p, r, 1.3981999507e-3f);
    p = DL__GEMM_FMA(p, r, 8.3334519073e-3f);
    p = DL__GEMM_FMA(p, r, 4.1665795894e-2f);
    p = DL__GEMM_FMA(p, r, 1.6666665459e-1f);
    p = DL__GEMM_FMA(p, r, 5.0000001201e-1f);
    p = DL__GEMM_FMA(p, r * r, r) + 1.0f;
    memcpy(&tb, &t, 4);
    ni = (int32_t)(tb - 0x4B400000u);            /* n as an integer, |n| <= 150 */
    n1 = ni / 2;
    b1 = (uint32_t)(n1 + 127) << 23;
    b2 = (uint32_t)(ni - n1 + 127) << 23;
    memcpy(&s1, &b1, 4);
    memcpy(&s2, &b2, 4);
    return p * s1 * s2;
}

/* 1/(1+exp(-x)) for x >= 0, exp(x)/(1+exp(x)) below (no overflow): one
   exp, of -|x|, and one division, so that a vector loop computes no branch
   it throws away */
static DL__HD inline float dl__sigmoidf(float x)
{
    float e = dl__expf(-fabsf(x));
    return (x >= 0 ? 1.0f : e) / (1.0f + e);
}

/* x sigmoid(x) as x/(1+exp(-x)) and x exp(x)/(1+exp(x)), the same way */
static DL__HD inline float dl__siluf(float x)
{
    float e = dl__expf(-fabsf(x));
    return (x >= 0 ? x : x * e) / (1.0f + e);
}

/* Elementwise math: one expression per op, used by every backend (CPU loops
   here, CUDA kernels in dl_cuda.cuh), so a device adds launches, not math.
   x is the input, a and b the op's scalar attributes. */
#define DL__UNARY_OPS(X) \
    X(NEG, -x) \
    X(EXP, dl__expf(x)) \
    X(LOG, logf(x)) \
    X(SQRT, sqrtf(x)) \
    X(ABS, fabsf(x)) \
    X(SIGN, (float)((x > 0) - (x < 0))) \
    X(ERF, erff(x)) \
    X(RELU, (x > 0 || x != x) ? x : 0.0f) \
    X(LEAKY, x > 0 ? x : x * a) \
    X(SIGMOID, dl__sigmoidf(x)) \
    X(SILU, dl__siluf(x)) \
    X(TANH, tanhf(x)) \
    X(GELU, 0.5f * x * (1.0f + erff(x * 0.70710678118654752f))) \
    X(POW, a == 2.0f ? x * x : a == 1.0f ? x : a == 0.5f ? sqrtf(x) : powf(x, a)) \
    X(CLAMP, x < a ? a : (x > b ? b : x)) \
    X(AFFINE, a * x + b) \
    X(DIVS, x / a) \
    X(GT, x > a ? 1.0f : 0.0f) \
    X(NLE, x <= a ? 0.0f : 1.0f) \
    X(LEAKY_MASK, x > 0 ? 1.0f : a) \
    X(INRANGE, (x >= a && x <= b) ? 1.0f : 0.0f) \
    X(INSIDE, (x > a && x < b) ? 1.0f : 0.0f)

/* p and q are the two inputs */
#define DL__BINARY_OPS(X) \
    X(ADD, p + q) \
    X(SUB, p - q) \
    X(MUL, p * q) \
    X(DIV, p / q) \
    X(MAX, (p > q || p != p) ? p : q) \
    X(MIN, (p < q || p != p) ? p : q) \
    X(GT_HALF, p > q ? 1.0f : (p == q ? 0.5f : 0.0f)) \
    X(LT_HALF, p < q ? 1.0f : (p == q ? 0.5f : 0.0f)) \
    X(EQ, p == q ? 1.0f : 0.0f) \
    X(RELU_GRAD, q <= 0 ? 0.0f : p) \
    X(SIGMOID_GRAD, p * (q * (1.0f - q))) \
    X(TANH_GRAD, p * (1.0f - q * q))

#define DL__OPENUM(nm, ex) DL__U_##nm,
enum { DL__UNARY_OPS(DL__OPENUM) DL__U_COUNT };
#undef DL__OPENUM
#define DL__OPENUM(nm, ex) DL__B_##nm,
enum { DL__BINARY_OPS(DL__OPENUM) DL__B_COUNT };
#undef DL__OPENUM
enum { DL__R_SUM, DL__R_MAX, DL__R_MIN };
enum { DL__RAND_UNIFORM, DL__RAND_NORMAL };

/* Broadcast plan of a binary op: output shape, and per-operand strides with
   0 on broadcast dims. */
typedef struct dl__bcast {
    int ndim;
    int64_t shape[DL_MAX_DIMS], sa[DL_MAX_DIMS], sb[DL_MAX_DIMS];
    int64_t n;
} dl__bcast;

/* batch norm's running statistics, updated by bn_stats in training:
   r = (1 - momentum) r + momentum stat, the variance's factor vmom =
   momentum n/(n-1) (unbiased); and the module's num_batches_tracked += 1.
   Each pointer may be NULL (not updated). */
typedef struct dl__bn_running { float *rm, *rv; int64_t *nbt; float keep, mom, vmom; } dl__bn_running;

/* Geometry of one convolution, padded to 3 spatial dims: a 1-d/2-d conv
   gets leading dims of size 1 (kernel 1, stride 1, no padding, dilation 1).
   "a" is the conv input side (N,Ca,ia...), "b" the output side (N,Cb,ib...). */
typedef struct dl__cgeom {
    int nsp;
    int64_t N, Ca, Cb, G;
    int64_t ia[3], ib[3], k[3], s[3], p[3], d[3];  /* p: left padding */
    int64_t La, Lb, K;                             /* products of ia, ib, k */
} dl__cgeom;

/* A stride-1 convolution without im2col (dl__backend.conv_s1): the input
   is copied once, zero-padded, into a grid of P = ib + d(k-1) positions per
   dim (channel-major: plane (c, n) at (c*n + n) * Pa), and output position
   o sits at grid index o.S; kernel offset kk then reads the grid shifted by
   off(kk) = sum k_i d_i S_i, so row (c, kk) of im2col's matrix is the plain
   run xpad + c*n*Pa + off(kk) and one GEMM with a table of row starts
   (dl__sgemm_rows) gives every output on the grid, (Cb, n*Pa), of which
   the valid positions are copied out. Pays Pa/Lb times the GEMM columns
   (the grid's margins) to skip writing and reading K times the input: each
   extra column costs Cb multiply-adds per row of the implicit matrix, where
   im2col costs a copy per row and column, so the grid is taken while
   (Pa/Lb - 1) * Cb <= DL__S1_WASTE (measured: ResNet's 7x7 and 4x4 stages
   with 64 and 128 channels are faster through im2col, LeNet's valid 5x5 on
   10x10 with 16 channels through the grid), and Pa <= DL__S1_MAX_GROW Lb. */
#ifndef DL__S1_WASTE
#define DL__S1_WASTE 32.0
#endif
#ifndef DL__S1_MAX_GROW
#define DL__S1_MAX_GROW 4.0
#endif
typedef struct dl__s1geom { int64_t P[3], S[3], Pa; } dl__s1geom;

/* the grid of g; false when the path does not apply: a stride other than
   1, groups, negative padding, or a grid too much larger than the output */
static DL__UNUSED bool dl__s1_make(const dl__cgeom *g, dl__s1geom *q)
{
    int i;
    if (g->G != 1 || g->Lb <= 0) return false;
    for (i = 0; i < 3; i++)
        if (g->s[i] != 1 || g->p[i] < 0 || g->ib[i] <= 0) return false;
    q->Pa = 1;
    for (i = 2; i >= 0; i--) {
        q->P[i] = g->ib[i] + g->d[i] * (g->k[i] - 1);
        q->S[i] = q->Pa;
        q->Pa *= q->P[i];
    }
    q->Pa = (q->Pa + 15) / 16 * 16;   /* planes start on a vector: the weight gradient's GEMM
                                         then sums each sample in the same lanes wherever it sits
                                         in the batch (so a batch split over replicas sums alike) */
    return (double)q->Pa <= DL__S1_MAX_GROW * (double)g->Lb &&
           ((double)q->Pa / (double)g->Lb - 1.0) * (double)g->Cb <= DL__S1_WASTE;
}

/* The geometry of the conv that a stride-1 conv's adjoint is: input and
   output sides swapped, padded by d(k-1) - p (t: the conv with w
   transposed and flipped). Its own inverse. */
static DL__UNUSED void dl__cgeom_flip(const dl__cgeom *g, dl__cgeom *t)
{
    int i;
    *t = *g;
    t->Ca = g->Cb;
    t->Cb = g->Ca;
    t->La = g->Lb;
    t->Lb = g->La;
    for (i = 0; i < 3; i++) {
        t->ia[i] = g->ib[i];
        t->ib[i] = g->ia[i];
        t->p[i] = g->d[i] * (g->k[i] - 1) - g->p[i];
    }
}

/* floats of conv_s1's scratch for n samples: the row table (int64), the
   padded input, the output side's grid and the flipped weights (flip) */
static DL__UNUSED int64_t dl__s1_floats(const dl__cgeom *g, const dl__s1geom *q, int64_t n, bool flip)
{
    return 2 * g->Ca * g->K + 16 + (flip ? g->Ca * g->Cb * g->K + 16 : 0) + (g->Ca + g->Cb) * n * q->Pa;
}

/* A loader's batch made on its device from the dataset kept there as bytes
   (dl_loader_desc.device_data): samples of sn = C*H*W pixels; the crop's
   zero padding; the normalization (v * scale - mean) * inv_std. */
typedef struct dl__batchgeom {
    int64_t sn, C, H, W, pad;
    float scale, mean, inv_std;
} dl__batchgeom;

/* (v * scale - mean) * inv_std, as every loader computes it: in double,
   where v * scale is exact (24 + 24 bits), so neither a contraction into an
   FMA nor the device changes the bits */
static DL__HD inline float dl__px_norm(float v, float scale, float mean, float inv_std)
{
    return (float)(((double)v * (double)scale - (double)mean) * (double)inv_std);
}

/* Pixel r (c, row, col) of a sample made from its bytes src: the sample
   shifted by (dy, dx) - pad in a zero-padded frame (the random crop) and
   mirrored when flip (the random horizontal flip), then normalized.
   aug = flip | dy << 1 | dx << 32; aug 0 with pad 0 is the plain sample. */
static DL__HD inline float dl__batch_px(const uint8_t *src, int64_t r, int64_t aug, const dl__batchgeom *g)
{
    int64_t HW = g->H * g->W, c = r / HW, q = r - c * HW, row = q / g->W, col = q - row * g->W;
    int64_t dy = (aug >> 1) & 0x7fffffff, dx = aug >> 32;
    int64_t sr = row + dy - g->pad, sq = ((aug & 1) ? g->W - 1 - col : col) + dx - g->pad;
    float v = (sr >= 0 && sr < g->H && sq >= 0 && sq < g->W) ? (float)src[c * HW + sr * g->W + sq] : 0.0f;
    return dl__px_norm(v, g->scale, g->mean, g->inv_std);
}

/* Geometry of one pooling: input ia, output ob, per-dim windows. */
typedef struct dl__pgeom {
    int64_t ia[3], ob[3], k[3], s[3], p[3], d[3];
    int64_t La, Lb;
    bool adaptive, count_include_pad;
} dl__pgeom;

/* Optimizer updates, element by element in the order of PyTorch's
   single-tensor code (torch/optim/sgd.py, adam.py). */
typedef struct dl__sgd_args {
    float lr, momentum, one_m_dampening, wd;
    bool nesterov, maximize, first;   /* first: no momentum buffer yet (buf = d_p) */
} dl__sgd_args;

typedef struct dl__adam_args {
    float wd;                         /* Adam: grad += wd * p */
    float decay;                      /* AdamW: p *= decay (1 - lr*wd); 1 for Adam */
    float beta1, one_m_beta1, beta2, one_m_beta2, bc2_sqrt, eps, neg_step_size;
    bool amsgrad, maximize;
} dl__adam_args;

/* A class-index loss (dl__backend.class_loss): lp (outer, C, inner)
   log-probabilities (cross entropy's log_softmax of its logits: logits
   true), targets t (outer*inner; int64 if i64, else int32), w (C) class
   weights or NULL (ones), red a dl_reduction, e label smoothing with
   e1 = 1 - e and eC = e / C (floats, as the composite rounds them). */
typedef struct dl__clsargs {
    const float *x;     /* class_loss with logits: lpw = log_softmax(x) first (else NULL) */
    float *lpw;
    const float *lp;
    const void *t;
    const float *w;
    int64_t outer, C, inner, ignore;
    int red;
    float e, e1, eC;
    bool i64, logits;
} dl__clsargs;

/* One tensor of a multi-tensor update (dl__backend.mt_apply): p (DL__MT_ZERO:
   the tensor zeroed), its gradient, its optimizer state (NULL where unused:
   s0 momentum buffer or exp_avg, s1 exp_avg_sq, s2 max_exp_avg_sq), numel,
   and which argument struct it takes. */
typedef struct dl__mtent {
    float *p;
    const float *g;
    float *s0, *s1, *s2;
    int64_t n, arg;
} dl__mtent;
enum { DL__MT_ZERO = 0, DL__MT_SGD, DL__MT_ADAM };

/* One list's multi-tensor state (an optimizer's parameters, a module's
   gradients): per device it spans, the backend's cache; ents, the scratch
   where one device's entries are put together. */
#define DL__MT_DEVS 8
typedef struct dl__mtset {
    dl__dev *dev[DL__MT_DEVS];
    void *cache[DL__MT_DEVS];
    dl__mtent *ents;
    int cap;
} dl__mtset;

/* The backend: every entry takes the device first. Copies and kernels are
   queued in order on the device (CPU: done on return); download, sync and
   the entries that return a host value wait for the device. A failure is
   recorded in the context (dl__dev_fail) and sets d->failed. */
struct dl__backend {
    const char *name;
    /* memory */
    void *(*alloc)(dl__dev *d, size_t bytes);                 /* 64-byte aligned; NULL: none */
    void (*free)(dl__dev *d, void *p);
    void (*upload)(dl__dev *d, void *dst, const void *src, size_t bytes);   /* host -> d */
    void (*download)(dl__dev *d, void *dst, const void *src, size_t bytes); /* d -> host */
    void (*copy)(dl__dev *d, void *dst, const void *src, size_t bytes);     /* within d */
    /* between two devices of this backend (dst on dd, src on sd) */
    void (*peer)(dl__dev *dd, void *dst, dl__dev *sd, const void *src, size_t bytes);
    void (*sync)(dl__dev *d);
    /* the profiler's marks (optional; NULL: the host clock): prof_mark is a
       token for "now" in the device's queue (-1: none to give), prof_seconds
       the time between two tokens (waiting for the second), prof_release
       the end of the tokens handed out so far (they may be reused) */
    int64_t (*prof_mark)(dl__dev *d);
    double (*prof_seconds)(dl__dev *d, int64_t a, int64_t b);
    void (*prof_release)(dl__dev *d);
    /* fills: random (counter-based: y[i] from (seed, offset + i), the same on
       every backend), arange, one int64 += v */
    void (*rand)(dl__dev *d, int dist, float *y, int64_t n, uint64_t seed, uint64_t offset,
                 float a, float b);
    void (*arange)(dl__dev *d, float *y, int64_t n, double start, double step);
    void (*fill)(dl__dev *d, float *y, int64_t n, float v);
    void (*add_i64)(dl__dev *d, int64_t *p, int64_t v);
    /* elementwise, reductions, copies */
    void (*unary)(dl__dev *d, int op, float *y, const float *x, int64_t n, float a, float b);
    void (*binary)(dl__dev *d, int op, float *y, const float *a, const float *b, const dl__bcast *bc);
    void (*reduce)(dl__dev *d, int op, float *y, const float *x, int64_t outer, int64_t r, int64_t inner);
    void (*argmax)(dl__dev *d, int64_t *idx, const float *x, int64_t outer, int64_t r, int64_t inner);
    void (*onehot)(dl__dev *d, float *y, const int64_t *idx, int64_t outer, int64_t r, int64_t inner);
    void (*copy_nd)(dl__dev *d, size_t esize, int ndim, const int64_t *shape, void *dst,
                    const int64_t *dst_strides, const void *src, const int64_t *src_strides);
    void (*axpy)(dl__dev *d, float *y, const float *x, int64_t n, float alpha);
    int64_t (*nonfinite)(dl__dev *d, const float *x, int64_t n);       /* first index or -1 */
    /* C = alpha op(A) op(B) + beta C, row-major, batch of them at strides sA, sB, sC */
    void (*gemm)(dl__dev *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB,
                 float beta, float *C, int64_t ldc, int64_t sC, int64_t batch);
    void (*softmax)(dl__dev *d, bool log, float *y, const float *x, int64_t outer, int64_t n,
                    int64_t inner);
    /* losses and dropout. class_mask: class-index targets (outer*inner of them,
       int64 if i64 else int32) -> onehot (outer, C, inner) and valid (outer*inner);
       returns -1, or the first flat index of a target outside [0,C) that is not
       ignore_index (its value in *bad). */
    int64_t (*class_mask)(dl__dev *d, float *onehot, float *valid, const void *target, bool i64,
                          int64_t outer, int64_t C, int64_t inner, int64_t ignore_index, int64_t *bad);
    /* mask[i] = scale, or 0 where the counter-based uniform of (seed, offset + i) < p */
    void (*dropout_mask)(dl__dev *d, float *mask, int64_t n, float p, float scale, uint64_t seed,
                         uint64_t offset);
    /* out[i] = max(x,0) - x*y + log1p(exp(-|x|)) */
    void (*bce_logits)(dl__dev *d, float *out, const float *x, const float *y, int64_t n);
    /* convolution and pooling. im2col: col (Ca*K, n, Lb) <- patches of x (n, Ca, ia...);
       col2im: x (n, Ca, ia...) = sum of col over the patches (x overwritten) */
    void (*im2col)(dl__dev *d, float *col, const float *x, int64_t n, const dl__cgeom *g);
    void (*col2im)(dl__dev *d, float *x, const float *col, int64_t n, const dl__cgeom *g);
    void (*bias_add)(dl__dev *d, float *y, const float *b, int64_t n, int64_t C, int64_t L);
    /* y (planes, ob...) = window max of x; idx (or NULL) = arg-max within the plane */
    void (*max_pool)(dl__dev *d, float *y, int64_t *idx, const float *x, int64_t planes,
                     const dl__pgeom *g);
    /* dx (planes, Lin) = 0, then dx[idx] += g (planes, Lout) */
    void (*unpool)(dl__dev *d, float *dx, const float *g, const int64_t *idx, int64_t planes,
                   int64_t Lin, int64_t Lout);
    /* y (planes, Lout) = x (planes, Lin)[idx]  (0 where idx < 0) */
    void (*gather)(dl__dev *d, float *y, const float *x, const int64_t *idx, int64_t planes,
                   int64_t Lin, int64_t Lout);
    /* a loader's batch from the dataset on the device (dl__batchgeom): for
       sample j < cnt, i = plan[2j], x[j] (sn floats) = dl__batch_px of
       data + i*sn (bytes) with aug plan[2j+1], y[j] = labels[i] */
    void (*load_batch)(dl__dev *d, float *x, int64_t *y, const uint8_t *data, const int64_t *labels,
                       const int64_t *plan, int64_t cnt, const dl__batchgeom *g);
    void (*avg_pool)(dl__dev *d, float *y, const float *x, int64_t planes, const dl__pgeom *g);
    void (*avg_pool_adj)(dl__dev *d, float *dx, const float *gy, int64_t planes, const dl__pgeom *g);
    /* fused normalization. Batch norm over x (N, C, L), per channel: bn_stats
       gives mean, invstd = 1/sqrt(var + eps) and the biased var, and where
       rs is not NULL updates the running statistics in the same pass
       (dl__bn_running: rm = keep rm + mom mean, rv = keep rv + vmom var,
       with two roundings each, as a scale and an axpy would; nbt += 1); bn_apply
       y = (x - mean) invstd w + b (w, b NULL: 1, 0), then + r where r (x's
       shape: a residual) is not NULL, with relu then ReLU'd (DL__U_RELU's
       expression): each step rounded as its own op would; bn_backward gives dx =
       w invstd (g - mean(g) - xhat mean(g xhat)) in training (w invstd g in
       eval), dw = sum(g xhat), db = sum(g) (outputs may be NULL, not all
       three), where ry (a fused ReLU's output, or NULL) makes g ry <= 0 ? 0 : g
       first (DL__B_RELU_GRAD's), and gm (or NULL; with ry) gets that masked g
       too (the residual's gradient). Layer norm
       over the rows of x (rows, cols) likewise, with w, b of size cols. */
    void (*bn_stats)(dl__dev *d, float *mean, float *invstd, float *var, const float *x, int64_t N,
                     int64_t C, int64_t L, float eps, const dl__bn_running *rs);
    void (*bn_apply)(dl__dev *d, float *y, const float *x, const float *mean, const float *invstd,
                     const float *w, const float *b, const float *r, int64_t N, int64_t C, int64_t L,
                     bool relu);
    void (*bn_backward)(dl__dev *d, float *dx, float *dw, float *db, const float *g, const float *x,
                        const float *mean, const float *invstd, const float *w, int64_t N, int64_t C,
                        int64_t L, bool train, const float *ry, float *gm);
    void (*ln_forward)(dl__dev *d, float *y, float *mean, float *invstd, const float *x,
                       const float *w, const float *b, int64_t rows, int64_t cols, float eps);
    void (*ln_backward)(dl__dev *d, float *dx, float *dw, float *db, const float *g, const float *x,
                        const float *mean, const float *invstd, const float *w, int64_t rows,
                        int64_t cols);
    /* optimizers */
    void (*sgd)(dl__dev *d, float *p, const float *g, float *buf, int64_t n, const dl__sgd_args *a);
    void (*adam)(dl__dev *d, float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                 const dl__adam_args *a);
    double (*sumsq)(dl__dev *d, const float *x, int64_t n);
    void (*scale)(dl__dev *d, float *x, int64_t n, float s);
    /* optional (NULL: convolution uses im2col + gemm): a stride-1
       convolution of n samples through a padded grid (dl__s1_make; scratch
       of dl__s1_floats). y (n, Cb, ib...) = conv(x (n, Ca, ia...), w) + bias
       (bias may be NULL); w is (Cb, Ca, k...), or with flip (Ca, Cb, k...)
       used transposed and flipped in space: the adjoint of that conv */
    void (*conv_s1)(dl__dev *d, float *y, const float *x, const float *w, const float *bias, float *scratch,
                    int64_t n, const dl__cgeom *g, bool flip);
    /* optional, with conv_s1: the weight gradient of such a conv, dw (Cb, Ca, k...) =
       beta * dw + sum over n samples of gy (n, Cb, ib...) times the patches
       of x (n, Ca, ia...). false: declined, for an x it cannot do exactly
       (the grid's margins meet zeros of gy: where x holds inf or NaN,
       0 * inf would be NaN); the caller then takes im2col */
    bool (*conv_s1_wgrad)(dl__dev *d, float *dw, const float *x, const float *gy, float *scratch, int64_t n,
                          const dl__cgeom *g, float beta);
    /* optional (NULL: none), tried before conv_s1: a conv by Winograd's
       F(2x2, 3x3) or F(4x4, 3x3), for the geometries the backend takes (the CPU's:
       dl__wg_ok). conv_wg as conv_s1 (flip likewise); conv_wg_wgrad writes
       dw (Cb, Ca, 3, 3), the weight gradient over the n samples. false:
       declined (another geometry, inf or NaN in an operand, no memory):
       the caller takes another path */
    bool (*conv_wg)(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                    const dl__cgeom *g, bool flip);
    bool (*conv_wg_wgrad)(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n, const dl__cgeom *g);
    /* optional (NULL: none), tried after those: y (n, Cb, ib...) = conv(x, w) + bias for any
       geometry the backend takes (the CPU's: no groups, a sample's im2col
       matrix small enough to stay in its cache; CUDA's: no groups, chunks
       of samples through one strided-batched GEMM), im2col's sums. false:
       declined; the caller takes whole-batch im2col */
    bool (*conv_i2c)(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                     const dl__cgeom *g);
    /* optional (NULL: none; the CPU has neither), tried after conv_s1 / conv_wg, the
       backward's twins of conv_i2c (CUDA's: chunks of samples, products written in
       place, no layout copy). convT_i2c: y (n, Ca, ia...) = the transposed conv
       of x (n, Cb, ib...) with w (Cb, Ca, k...) + bias (Ca, or NULL): the input
       gradient of a conv, and conv_transpose's forward. conv_i2c_wgrad: dw (Cb,
       Ca, k...) = the weight gradient over the n samples of x (n, Ca, ia...)
       and gy (n, Cb, ib...). false: declined; the caller takes whole-batch im2col */
    bool (*convT_i2c)(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                      const dl__cgeom *g);
    bool (*conv_i2c_wgrad)(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n, const dl__cgeom *g);
    /* optional (NULL: dl.h records the device's calls itself, as it does the
       CPU's): a device that captures its own work (CUDA: stream capture into
       a graph). cap_begin starts recording d's work for a capture whose RNG
       counter stood at rng0 (NULL on failure: d's error says why); cap_end
       stops and makes it runnable (false: failed); cap_launch runs it once
       with the generator's seed and counter at the start of that run (the
       run at dl_capture_end gets rng0); cap_free releases it (and ends a
       recording). Inside a capture the device refuses host reads itself. */
    void *(*cap_begin)(dl__dev *d, uint64_t rng0);
    bool (*cap_end)(dl__dev *d, void *cap);
    bool (*cap_launch)(dl__dev *d, void *cap, uint64_t seed, uint64_t rng);
    void (*cap_free)(dl__dev *d, void *cap);
    /* optional (NULL: an entry call per tensor): multi-tensor updates, one
       launch for nt tensors (PyTorch's multi_tensor_apply). The list is the
       same from step to step (parameters do not move), so the backend keeps
       its own copy in *cache and rebuilds it only when the list changes.
       kind DL__MT_ZERO: every t[i].p = 0; DL__MT_SGD / DL__MT_ADAM: the
       sgd / adam entry's update of each tensor with the argument struct
       args[t[i].arg] (argbytes of dl__sgd_args / dl__adam_args), element for
       element the same arithmetic. mt_args gives a cache the arguments of
       its next run without running it (a replay's optimizer hook: a
       captured run reads them); mt_free releases a cache. */
    void (*mt_apply)(dl__dev *d, void **cache, int kind, int nt, const dl__mtent *t, const void *args,
                     size_t argbytes);
    void (*mt_args)(dl__dev *d, void *cache, const void *args, size_t argbytes);
    void (*mt_free)(dl__dev *d, void *cache);
    /* optional (NULL: an axpy per tensor): y[k] += x[k] (n[k] floats) for
       k < nt <= DL__AXM in one launch, element for element axpy's
       arithmetic with alpha 1: a backward's leaf gradients (no two y alike) */
    void (*axpy_multi)(dl__dev *d, int nt, float *const *y, const float *const *x, const int64_t *n);
    /* optional (NULL: cross entropy and nll_loss are composites of the
       entries above): a class-index loss in one pass each way (dl__clsargs).
       Per position j (outer*inner of them) with target c_j: v_j = c_j is not
       ignore_index; nll_j = -v_j w[c_j] lp[j,c_j]; sm_j = -v_j sum_c w_c
       lp[j,c]. class_loss: NONE: loss[j] = e1 nll_j + eC sm_j (nll_j when
       e = 0); SUM: loss[0] = the same of the sums; MEAN: of the sums each
       divided by den[0] = sum_j v_j w[c_j]; den[1] = sum_c w_c; first, with
       a->x, lp (a->lpw) = the softmax entry's log_softmax of x over C.
       Returns -1, or as class_mask the first bad target (inside a capture:
       no check, a bad target counts as ignored). class_loss_bwd: dx (outer, C, inner) =
       dlp - (logits ? exp(lp) sum_c dlp : 0), dlp[j,c] = -v_j (e1 s_j w_c
       [c = c_j] + eC s_j w_c) (e1 s_j w_c [c = c_j] when e = 0), s_j =
       g[0]/den[0] (MEAN), g[0] (SUM), g[j] (NONE); g NULL: ones (backward's
       implied seed, one element). */
    int64_t (*class_loss)(dl__dev *d, float *loss, float *den, const dl__clsargs *a, int64_t *bad);
    void (*class_loss_bwd)(dl__dev *d, float *dx, const float *g, const float *den, const dl__clsargs *a);
    /* optional (NULL: reduce twice): y[c] = sum of x (N, C, L) over N and
       L, N > 1 and L > 1 (a sum over every dim but one of a contiguous
       tensor: a convolution's bias gradient, dl_sum(g, (0, 2, 3))). With
       ry (needs conv_act): the sums of gm = the activation act's backward
       of x given its output ry (DL__B_*_GRAD of x and ry), gm written:
       those two ops' bits; ry NULL: gm unused, act ignored. With ry and pw
       > 0, x is the gradient of ry's 2x2, stride-2 average pool (rows of
       width pw; (N, C, L/4)), taken through the pool's adjoint (its bits:
       0 + x / 4) where the activation's backward reads it. */
    void (*chan_sum)(dl__dev *d, float *y, const float *x, int64_t N, int64_t C, int64_t L, const float *ry,
                     float *gm, int act, int64_t pw);
    /* y[i] = a[i] == b[i] ? 1 : 0 for int64 a, b (dl_eq's int64 pairs) */
    void (*eq_i64)(dl__dev *d, float *y, const int64_t *a, const int64_t *b, int64_t n);
    /* optional (NULL: the binary entry's add, then the unary entry's
       activation; backward: the mask, then the reduce entry): a Linear's
       bias and activation, act DL__U_RELU, DL__U_SIGMOID or DL__U_TANH.
       bias_act: y = act(x + b[c]) for x (rows, cols), b (cols), with the
       binary entry's add and the unary entry's expression (a = b = 0).
       bias_act_bwd: gx = the activation's backward from its output y
       (DL__B_RELU_GRAD, DL__B_SIGMOID_GRAD, DL__B_TANH_GRAD of g and y) and
       db = gx summed over the rows as the reduce entry would add them;
       returns false, doing nothing, where the reduce entry would add them
       otherwise (gx NULL: only the answer). */
    void (*bias_act)(dl__dev *d, float *y, const float *x, const float *b, int64_t rows, int64_t cols,
                     int act);
    bool (*bias_act_bwd)(dl__dev *d, float *gx, float *db, const float *g, const float *y, int64_t rows,
                         int64_t cols, int act);
    /* optional (NULL: the conv entries, then the unary entry): y = act(conv(x,
       w) + bias), n samples, act DL__U_RELU, SIGMOID or TANH, with the bits
       of conv_i2c then the unary entry (a = b = 0); yp not NULL: also yp =
       y's 2x2, stride-2 average pool (a 2-d conv), with avg_pool's bits;
       returns false, doing nothing, where it would not (y NULL: only the
       answer, for the pooled variant) */
    bool (*conv_act)(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                     const dl__cgeom *g, int act, float *yp);
    /* optional (NULL: bn_apply with relu, then max_pool; backward: unpool,
       then bn_backward with ry): batch norm, its ReLU and a 2x2, stride-2
       max pool of x (N, C, H, W), H and W even. bn_pool: yp (N, C, H/2,
       W/2) = max_pool of bn_apply's ReLU'd y, idx (or NULL) its indices, as
       max_pool's; bn_pool_bwd: bn_backward of g (yp's gradient) taken
       through the unpool at idx and the ReLU's mask of yp: those ops' bits */
    void (*bn_pool)(dl__dev *d, float *yp, int64_t *idx, const float *x, const float *mean, const float *invstd,
                    const float *w, const float *b, int64_t N, int64_t C, int64_t H, int64_t W);
    void (*bn_pool_bwd)(dl__dev *d, float *dx, float *dw, float *db, const float *g, const float *x,
                        const float *mean, const float *invstd, const float *w, int64_t N, int64_t C, int64_t H,
                        int64_t W, bool train, const float *yp, const int64_t *idx);
    /* optional (NULL: copy, then the unary entry twice): eval-mode batch
       norm's mean = rm and invstd = (rv + eps)^-0.5 over C channels in one
       pass, with DL__U_AFFINE (1, eps) then DL__U_POW (-0.5)'s bits */
    void (*bn_eval)(dl__dev *d, float *mean, float *invstd, const float *rm, const float *rv, int64_t C, float eps);
};
#define DL__AXM 48

/* the backend of a tensor's device */
#define DL__BE(t) ((t)->dev_->be)

/* nanoseconds on a monotonic clock (the profiler's host marks) */
static int64_t dl__prof_now(void)
{
#if defined(CLOCK_MONOTONIC)
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
#else
    return (int64_t)((double)clock() * (1e9 / (double)CLOCKS_PER_SEC));
#endif
}


typedef dl_result (*dl__bwd_fn)(dl__node *n, dl_tensor *g, dl_tensor **gin);
/* reads: the tensors whose values the backward rule reads (bit i: input i,
   i < 7; DL__RD_OUT: the output); cross: inputs it reads only when another
   input needs a gradient (a product's factors). Their versions are kept at
   record and checked before the rule runs (PyTorch's saved variables). */
typedef struct dl__op { const char *name; dl__bwd_fn backward; unsigned char reads, cross; } dl__op;
#define DL__RD_OUT 0x80

struct dl__node {
    const dl__op *op;
    dl_tensor *out;
    int nin;
    dl_tensor **in;
    int nsaved;
    dl_tensor *saved[DL__NSAVED];
    uint32_t ver[8];                  /* versions at record: of the inputs and output the
                                         op reads (a custom function: of its saved tensors) */
    float f[4];                       /* attributes: scalars */
    int64_t i[DL_MAX_DIMS + 2];       /* attributes: dims, sizes */
    int ni;
    dl_tensor *gacc;                  /* gradient of out, during backward */
    int64_t id;                       /* position on the tape */
    uint64_t visit;
    bool released;
    const dl_function *fn;            /* custom functions */
    void *user;
    const char *pname;                /* the op that recorded it, while profiling ("dl_conv2d"
                                         for a node of op dl_conv): its backward's name */
};

struct dl_fn_ctx { dl__node node; };

/* Objects the context owns besides tensors (modules, optimizers, loaders):
   each registers a destructor that dl_ctx_free runs, newest first. */
typedef struct dl__owned { struct dl__owned *next; void (*destroy)(void *p); void *p; } dl__owned;
typedef struct dl__prof dl__prof;

#define DL__MAX_CPU 64
#define DL__MAX_CUDA 16

typedef struct dl__dfree { struct dl__dfree *next; dl_tensor *t; dl__dev *d; void *p; } dl__dfree;
struct dl_ctx {
    uint64_t step;
    uint32_t mod_mark;                /* the last dl__mod_contains walk's mark */
    dl__dfree *dfree;                 /* storage dl_module_to moved from: freed at dl_step_end (this
                                         step's views and tape may still read it, as in torch) */
    dl__dev *cpu[DL__MAX_CPU];        /* cpu:0 (the host) and virtual CPU devices */
    int ncpu;
    dl__dev *cuda[DL__MAX_CUDA];      /* CUDA devices, set up on first use */
    dl__dev *defdev;                  /* where creators put tensors (dl_ctx_desc.device) */
    bool strict;                      /* virtual CPU devices tag their pointers */
    dl__hregion *hreg;                /* step headers and nodes (never-reused addresses) */
    size_t hkeep;                     /* offset in hreg of the previous step's first header */
    size_t hstep;                     /* offset in hreg of this step's first header */
    size_t hcommitted;                /* bytes committed in all regions */
    dl__arena hdr[2];                 /* without address space: headers by step parity */
    dl_ctx *reg_next;                 /* registry of contexts (stale pointer reports) */
    dl_tensor *persist;               /* persistent tensors */
    dl_tensor *freed;                 /* DL_DEBUG: dl_free()d headers, poisoned */
    size_t memory_limit;              /* per device (0: none) */
    uint64_t alloc_calls;             /* host allocations: headers, tape, modules ... */
    dl__node **tape;
    int64_t ntape, captape;
    int no_grad;                      /* no_grad nesting depth */
    bool backward_nograd;             /* inside a backward without create_graph */
    const dl_tensor *seed_one;        /* inside a backward: its implied ones, left unfilled (a
                                         fused class loss's backward reads them as 1) */
    bool anomaly;
    const char *in_backward_of;       /* op whose backward is running */
    dl_result err;
    uint64_t nerr;                    /* failures recorded so far (a backward that set none) */
    char msg[768];
    dl_log_fn log;
    void *log_user;
    uint64_t seed, rng_offset;        /* the counter-based generator: next draw's counter */
    bool allow_tf32;                  /* CUDA matrix products may use TF32 (dl_set_allow_tf32) */
    bool allow_tf32_conv;             /* CUDA convolutions may use TF32 (dl_set_allow_tf32_conv) */
    dl__pool *pool;
    int nthreads;
    char shbuf[8][128];
    int shi;
    uint64_t visit;
    dl__owned *owned;
    /* backward calls it once a leaf's gradient is complete (dl_ddp starts
       a bucket's allreduce from it); a result other than DL_OK stops the
       backward */
    dl_result (*ready_fn)(void *user, dl_tensor *leaf);
    void *ready_user;
    /* capture and replay: the capture being recorded (NULL: none), the live
       captures, the husks of freed ones (so that a late dl_replay is an
       error, not a crash), released capture header regions */
    dl_capture *cap, *caps, *dead;
    uint64_t capserial;
    dl__hregion *capreg;
    dl__arena capgrave;               /* without address space: freed captures' headers */
    dl__prof *prof;                   /* the profiler while it records (NULL: off, and every hook is
                                         one test of this pointer); section "debug: profiler" */
    dl__prof *prof_data;              /* its tables, kept while it does not record */
};

/* The profiler's hooks (section "debug: profiler"): a span opens at an op's
   first argument check (dl__live) and closes at its dl__done (or dl__end);
   the backward walk opens one per node; an error drops the open ones. */
static void dl__prof_begin(dl_ctx *ctx, dl__dev *d, const char *name, bool bwd);
static void dl__prof_end(dl_ctx *ctx, const char *name, bool bwd);
static void dl__prof_drop(dl_ctx *ctx, const char *name);
static void dl__prof_fail(dl_ctx *ctx);
static void dl__prof_step(dl_ctx *ctx);
static void dl__prof_free(dl_ctx *ctx);
static const char *dl__prof_top(const dl_ctx *ctx);

static void dl__err(dl_ctx *ctx, dl_result code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* capture and replay (its section follows the CPU backend): the hooks that
   memory, errors, tensors and ops call while a capture runs or lives */
static void *dl__cap_halloc(dl_ctx *ctx, size_t need);           /* headers and nodes */
static void dl__cap_note_err(dl_ctx *ctx);                       /* an error fails the capture */
static bool dl__cap_gen_live(dl_ctx *ctx, uint64_t gen);         /* a capture's tensors' step_ */
static uint64_t dl__cap_gen(dl_ctx *ctx);                        /* the running capture's */
static bool dl__cap_input(const char *op, const char *arg, dl_tensor *t);   /* dl__live's part */
static void dl__cap_use(dl_tensor *t);                           /* a persistent tensor it touches */
static void dl__cap_bump(dl_tensor *t);                          /* its version moved inside */
static bool dl__cap_persistent(dl_ctx *ctx, const char *op);     /* refuses persistent allocation */
static bool dl__cap_refused(dl_ctx *ctx, const char *op, const char *what, const char *hint);
static void dl__cap_owner_gone(dl_ctx *ctx, void *owner, const char *what);   /* (an optimizer) */
static void dl__cap_refuse(dl__dev *d, const char *what);        /* a device entry's refusal */
static void dl__cap_forget(dl_tensor *t, const char *how);       /* t's storage goes away */
static void dl__caps_free(dl_ctx *ctx);                          /* dl_ctx_free's part */
static size_t dl__cap_saved(dl_capture *c, dl__dev *d);           /* d's own arena, set aside */

static void *dl__malloc(dl_ctx *ctx, size_t bytes)
{
    void *p;
    if (ctx) ctx->alloc_calls++;
    p = DL_MALLOC(bytes ? bytes : 1);
    return p;
}

/* the context's memory_limit holds for each device */
static bool dl__dev_limit_ok(dl__dev *d, size_t extra)
{
    size_t total = d->persistent_bytes + d->data.reserved + d->held + extra;
    return d->ctx->memory_limit == 0 || total <= d->ctx->memory_limit;
}

static bool dl__dev_limit_ok(dl__dev *d, size_t extra);
static void *dl__dev_alloc(dl__dev *d, size_t bytes);

static void *dl__arena_alloc(dl_ctx *ctx, dl__arena *a, size_t bytes, bool count_limit)
{
    size_t need;
    dl__chunk *ch;
    size_t size;
    if (bytes > ((size_t)-1) / 2) return NULL;
    need = (bytes + 63) & ~(size_t)63;
    if (a->nfree) {   /* a block of exactly this size given back earlier in the step */
        int i;
        for (i = a->nfree - 1; i >= 0; i--)
            if (a->free_n[i] == need) {
                void *p = a->free_p[i];
                a->nfree--;
                a->free_p[i] = a->free_p[a->nfree];
                a->free_n[i] = a->free_n[a->nfree];
                a->used += need;
                return p;
            }
    }
    while (a->cur) {
        if (a->cur->size - a->cur->used >= need) {
            void *p = a->cur->mem + a->cur->used;
            a->cur->used += need;
            a->used += need;
            return p;
        }
        if (!a->cur->next) break;
        a->cur = a->cur->next;   /* the rest of this chunk waits for the next step */
    }
    size = a->reserved > a->min_chunk ? a->reserved : a->min_chunk;
    if (size < need) size = need;
    if (count_limit && a->dev && !dl__dev_limit_ok(a->dev, size)) {
        size = need;                        /* try the exact size before failing */
        if (!dl__dev_limit_ok(a->dev, size)) return NULL;
    }
    if (size > ((size_t)-1) - sizeof(dl__chunk) - 64) return NULL;
    if (a->dev) {   /* device memory; the chunk's bookkeeping stays on the host */
        ch = (dl__chunk *)dl__malloc(ctx, sizeof(dl__chunk));
        if (!ch) return NULL;
        ch->mem = (unsigned char *)dl__dev_alloc(a->dev, size);
        if (!ch->mem) { DL_FREE(ch); return NULL; }
    } else {
        ch = (dl__chunk *)dl__malloc(ctx, sizeof(dl__chunk) + 64 + size);
        if (!ch) return NULL;
        ch->mem = (unsigned char *)(((uintptr_t)(ch + 1) + 63) & ~(uintptr_t)63);
    }
    ch->size = size;
    ch->used = need;
    if (a->cur) { ch->next = a->cur->next; a->cur->next = ch; }
    else { ch->next = a->head; a->head = ch; }
    a->cur = ch;
    a->reserved += size;
    a->used += need;
    return ch->mem;
}

static void dl__arena_reset(dl__arena *a)
{
    dl__chunk *c;
    for (c = a->head; c; c = c->next) c->used = 0;
    a->cur = a->head;
    a->used = 0;
    a->nfree = 0;
}

/* Gives a block of this step back for reuse within the step (dropped when
   the list is full: it comes back at dl_step_end anyway). */
static void dl__arena_give(dl__arena *a, void *p, size_t bytes)
{
    size_t need = (bytes + 63) & ~(size_t)63;
    if (a->nfree == DL__ARENA_FREE) return;
    a->free_p[a->nfree] = p;
    a->free_n[a->nfree] = need;
    a->nfree++;
    a->used -= need < a->used ? need : a->used;
}

static void dl__arena_free(dl__arena *a)
{
    dl__chunk *c = a->head;
    while (c) {
        dl__chunk *n = c->next;
        if (a->dev) a->dev->be->free(a->dev, c->mem);
        DL_FREE(c);
        c = n;
    }
    a->head = a->cur = NULL;
    a->used = a->reserved = 0;
}

static dl__mark dl__arena_mark(const dl__arena *a)
{
    dl__mark m;
    m.cur = a->cur;
    m.cur_used = a->cur ? a->cur->used : 0;
    m.used = a->used;
    return m;
}

/* Give back everything allocated since m (chunks after m.cur were empty then). */
static void dl__arena_rewind(dl__arena *a, dl__mark m)
{
    dl__chunk *c;
    a->nfree = 0;
    if (!m.cur) { dl__arena_reset(a); return; }
    for (c = m.cur->next; c; c = c->next) c->used = 0;
    m.cur->used = m.cur_used;
    a->cur = m.cur;
    a->used = m.used;
}

/* ---- step headers: never-reused addresses */

#if defined(DL__UNIX) && !defined(DL_NO_MMAP) && UINTPTR_MAX > 0xffffffffu
#define DL__HVM 1
#define DL__HREGION ((size_t)16 << 30)        /* address space per region */
#define DL__HCOMMIT ((size_t)1 << 20)         /* committed at a time */
#define DL__HRELEASE ((size_t)4 << 20)        /* given back in batches of */
#endif

/* Contexts are listed so that a zeroed (released) header can still be
   traced to the context that made it, for the error message. */
static dl_ctx *dl__registry;
#if !defined(DL_NO_THREADS)
static pthread_mutex_t dl__registry_mu = PTHREAD_MUTEX_INITIALIZER;
#define DL__REG_LOCK() pthread_mutex_lock(&dl__registry_mu)
#define DL__REG_UNLOCK() pthread_mutex_unlock(&dl__registry_mu)
#else
#define DL__REG_LOCK() ((void)0)
#define DL__REG_UNLOCK() ((void)0)
#endif

#ifdef DL__HVM
static size_t dl__page(void)
{
    long v = sysconf(_SC_PAGESIZE);   /* (no cache: a static written by two contexts' threads races) */
    return v > 0 ? (size_t)v : 4096;
}

/* Replaces [p, p+n) with fresh read-only zero pages (the old pages go back
   to the system); prot PROT_NONE reserves instead. */
static void *dl__vm_map(void *p, size_t n, int prot)
{
    void *r;
#ifdef MAP_ANONYMOUS
    r = mmap(p, n, prot, MAP_PRIVATE | MAP_ANONYMOUS | (p ? MAP_FIXED : 0), -1, 0);
#else
    int fd = open("/dev/zero", O_RDWR);
    if (fd < 0) return NULL;
    r = mmap(p, n, prot, MAP_PRIVATE | (p ? MAP_FIXED : 0), fd, 0);
    close(fd);
#endif
    return r == MAP_FAILED ? NULL : r;
}

/* a region of size bytes of address space (DL__HREGION: the steps'), at least min + a commit */
static dl__hregion *dl__hregion_new(dl_ctx *ctx, size_t min, size_t size)
{
    dl__hregion *r;
    if (size < min + DL__HCOMMIT) size = (min + DL__HCOMMIT + dl__page()) & ~(dl__page() - 1);
    r = (dl__hregion *)DL_MALLOC(sizeof *r);
    if (!r) return NULL;
    ctx->alloc_calls++;
    memset(r, 0, sizeof *r);
    r->base = (unsigned char *)dl__vm_map(NULL, size, PROT_NONE);
    if (!r->base) { DL_FREE(r); return NULL; }
    r->size = size;
    return r;
}

/* Gives [r->released, upto) back (whole pages only). */
static void dl__hregion_release(dl_ctx *ctx, dl__hregion *r, size_t upto)
{
    size_t ps = dl__page(), lo = r->released, hi = upto & ~(ps - 1);
    if (hi <= lo) return;
    if (dl__vm_map(r->base + lo, hi - lo, PROT_READ)) {
        r->released = hi;
        ctx->hcommitted -= hi - lo;
    }
}

/* need bytes at r's end, committing pages as it goes; NULL when r is full */
static void *dl__hregion_take(dl_ctx *ctx, dl__hregion *r, size_t need)
{
    if (r->pos + need > r->size) return NULL;
    if (r->pos + need > r->rw_hi) {
        size_t grow = need > DL__HCOMMIT ? need : DL__HCOMMIT;
        grow = (grow + dl__page() - 1) & ~(dl__page() - 1);
        if (r->rw_hi + grow > r->size) grow = r->size - r->rw_hi;
        if (mprotect(r->base + r->rw_hi, grow, PROT_READ | PROT_WRITE) != 0) return NULL;
        r->rw_hi += grow;
        ctx->hcommitted += grow;
    }
    r->pos += need;
    return r->base + r->pos - need;
}

static void *dl__halloc_vm(dl_ctx *ctx, size_t need)
{
    dl__hregion *r = ctx->hreg;
    if (!r || r->pos + need > r->size) {
        /* a fresh region; the old one is released once its last step is over */
        dl__hregion *n = dl__hregion_new(ctx, need, DL__HREGION);
        if (!n) return NULL;
        if (r) r->retire_step = ctx->step + 2;
        n->next = r;
        ctx->hreg = r = n;
        ctx->hkeep = ctx->hstep = 0;
    }
    return dl__hregion_take(ctx, r, need);
}
#endif

/* Memory for a step tensor header, tape node or small per-step array (inside
   a capture: the capture's own). */
static void *dl__halloc(dl_ctx *ctx, size_t bytes)
{
    size_t need = (bytes + 63) & ~(size_t)63;
    if (ctx->cap) return dl__cap_halloc(ctx, need);
#ifdef DL__HVM
    if (ctx->hreg) return dl__halloc_vm(ctx, need);
#endif
    return dl__arena_alloc(ctx, &ctx->hdr[ctx->step & 1], need, false);
}

static dl__hmark dl__hmark_get(dl_ctx *ctx)
{
    dl__hmark m;
    m.r = ctx->hreg;
    m.pos = m.r ? m.r->pos : 0;
    m.m = dl__arena_mark(&ctx->hdr[ctx->step & 1]);
    return m;
}

/* Within one step: forget everything allocated since the mark (gradcheck's
   temporaries, which nothing else points at). */
static void dl__hrewind(dl_ctx *ctx, dl__hmark m)
{
    if (m.r && m.r == ctx->hreg) {
        m.r->pos = m.pos;
        return;
    }
    if (!ctx->hreg) dl__arena_rewind(&ctx->hdr[ctx->step & 1], m.m);
}

/* dl_step_end's part: the headers of the step before the one that just
   ended are dead; give them back in batches. */
static void dl__hstep_end(dl_ctx *ctx)
{
#ifdef DL__HVM
    dl__hregion *r = ctx->hreg, *o;
    if (r) {
        ctx->hkeep = ctx->hstep;
        ctx->hstep = r->pos;
        if (ctx->hkeep - r->released >= DL__HRELEASE) dl__hregion_release(ctx, r, ctx->hkeep);
        for (o = r->next; o; o = o->next)
            if (o->retire_step && ctx->step >= o->retire_step && o->released < o->rw_hi) {
                dl__hregion_release(ctx, o, o->rw_hi);
                o->released = o->rw_hi;
            }
        return;
    }
#endif
    dl__arena_reset(&ctx->hdr[ctx->step & 1]);   /* headers of step-2: now free */
}

static void dl__hstore_init(dl_ctx *ctx)
{
    ctx->hdr[0].min_chunk = ctx->hdr[1].min_chunk = (size_t)64 << 10;
#ifdef DL__HVM
    ctx->hreg = dl__hregion_new(ctx, 0, DL__HREGION);   /* NULL: the arena fallback */
#endif
    DL__REG_LOCK();
    ctx->reg_next = dl__registry;
    dl__registry = ctx;
    DL__REG_UNLOCK();
}

static void dl__hstore_free(dl_ctx *ctx)
{
    dl_ctx **pp;
    DL__REG_LOCK();
    for (pp = &dl__registry; *pp; pp = &(*pp)->reg_next)
        if (*pp == ctx) { *pp = ctx->reg_next; break; }
    DL__REG_UNLOCK();
#ifdef DL__HVM
    while (ctx->hreg) {
        dl__hregion *r = ctx->hreg;
        ctx->hreg = r->next;
        munmap(r->base, r->size);
        DL_FREE(r);
    }
#endif
    dl__arena_free(&ctx->hdr[0]);
    dl__arena_free(&ctx->hdr[1]);
}

/* The context whose header memory holds p (for a zeroed, released header);
   *cap: p was a header of a capture that dl_capture_free released. */
static dl_ctx *dl__header_owner(const void *p, bool *cap)
{
    dl_ctx *c, *found = NULL;
    *cap = false;
    DL__REG_LOCK();
    for (c = dl__registry; c && !found; c = c->reg_next) {
#ifdef DL__HVM
        dl__hregion *r;
        int k;
        for (k = 0; k < 2 && !found; k++)
            for (r = k ? c->capreg : c->hreg; r; r = r->next)
                if ((const unsigned char *)p >= r->base && (const unsigned char *)p < r->base + r->size) {
                    found = c;
                    *cap = k == 1;
                    break;
                }
#else
        (void)p;
#endif
    }
    DL__REG_UNLOCK();
    return found;
}

static void dl__track_peak(dl__dev *d)
{
    size_t now = d->persistent_bytes + d->data.used;
    if (now > d->peak_bytes) d->peak_bytes = now;
}

/* device memory through the backend, counted */
static void *dl__dev_alloc(dl__dev *d, size_t bytes)
{
    d->alloc_calls++;
    return d->be->alloc(d, bytes ? bytes : 1);
}

// >>section errors
/* One message per failure: the op that failed, its operands (shape, device)
   and the rule. Ops given NULL return NULL without a new message, so the
   message a user reads after a whole forward pass is the first cause. */

static const char *dl__dev_str(dl_device d, char *buf, size_t n)
{
    if (d.type == DL_DEVICE_CPU) snprintf(buf, n, "cpu:%d", d.index);
    else if (d.type == DL_DEVICE_CUDA) snprintf(buf, n, "cuda:%d", d.index);
    else if (d.type == DL_DEVICE_DEFAULT) snprintf(buf, n, "the default device");
    else snprintf(buf, n, "device type %d", d.type);
    return buf;
}

/* "(2,3)" for a tensor, in one of eight rotating buffers of the context. */
static const char *dl__sh(const dl_tensor *t)
{
    dl_ctx *ctx = t->ctx_;
    char *b = ctx->shbuf[ctx->shi++ & 7];
    int i, k = 0;
    k += snprintf(b + k, 128 - (size_t)k, "(");
    for (i = 0; i < t->ndim && k < 100; i++)
        k += snprintf(b + k, 128 - (size_t)k, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    snprintf(b + k, 128 - (size_t)k, ")");
    return b;
}

static const char *dl__shp(dl_ctx *ctx, const dl_shape *s)
{
    char *b = ctx->shbuf[ctx->shi++ & 7];
    int i, k = 0;
    k += snprintf(b + k, 128 - (size_t)k, "(");
    for (i = 0; i < s->ndim && i < DL_MAX_DIMS && k < 100; i++)
        k += snprintf(b + k, 128 - (size_t)k, i ? ",%lld" : "%lld", (long long)s->d[i]);
    snprintf(b + k, 128 - (size_t)k, ")");
    return b;
}

static const char *dl__dtype_str(dl_dtype t)
{
    return t == DL_DTYPE_F32 ? "float32" : t == DL_DTYPE_I32 ? "int32" : "int64";
}

/* Failures with no context to record them in (a NULL ctx given to a
   creator, dl_cat of nothing, dl_ctx_init itself) go here, one slot per
   thread; dl_error_message(NULL) reads it. */
#if defined(__cplusplus) && __cplusplus >= 201103L
#define DL__TLS thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define DL__TLS _Thread_local
#elif defined(__GNUC__)
#define DL__TLS __thread
#elif defined(_MSC_VER)
#define DL__TLS __declspec(thread)
#else
#define DL__TLS
#endif
static DL__TLS dl_result dl__noctx_err;
static DL__TLS char dl__noctx_msg[256];

/* A failure with no context to keep it: the thread's context-less slot,
   reported through log (NULL: stderr; dl_ctx_init passes its desc's log). */
static void dl__noctx_fail(dl_log_fn log, void *user, dl_result code, const char *msg)
{
    if (msg != dl__noctx_msg) {   /* a copy, cut to the slot (a context's message is longer) */
        size_t n = strlen(msg);
        if (n >= sizeof dl__noctx_msg) n = sizeof dl__noctx_msg - 1;
        memcpy(dl__noctx_msg, msg, n);
        dl__noctx_msg[n] = 0;
    }
    dl__noctx_err = code;
    if (log) log(user, dl__noctx_msg);
    else fprintf(stderr, "dl.h: %s\n", dl__noctx_msg);
#ifdef DL_ABORT_ON_ERROR
    abort();
#endif
}

static void dl__err(dl_ctx *ctx, dl_result code, const char *fmt, ...)
{
    va_list ap;
    int k = 0;
    if (!ctx) {
        va_start(ap, fmt);
        vsnprintf(dl__noctx_msg, sizeof dl__noctx_msg, fmt, ap);
        va_end(ap);
        dl__noctx_fail(NULL, NULL, code, dl__noctx_msg);
        return;
    }
    if (ctx->in_backward_of)
        k = snprintf(ctx->msg, sizeof ctx->msg, "in the backward of %s: ", ctx->in_backward_of);
    if (k < 0 || (size_t)k >= sizeof ctx->msg) k = 0;
    va_start(ap, fmt);
    vsnprintf(ctx->msg + k, sizeof ctx->msg - (size_t)k, fmt, ap);
    va_end(ap);
    ctx->err = code;
    ctx->nerr++;
    if (ctx->prof) dl__prof_fail(ctx);   /* the ops in progress failed: not counted */
    if (ctx->cap) dl__cap_note_err(ctx);   /* an error inside a capture fails it */
    if (ctx->log) ctx->log(ctx->log_user, ctx->msg);
#ifdef DL_ABORT_ON_ERROR
    abort();
#endif
}

static void dl__log_stderr(void *user, const char *m)
{
    (void)user;
    fprintf(stderr, "dl.h: %s\n", m);
}

void dl_log_silent(void *user, const char *message) { (void)user; (void)message; }

const char *dl_result_string(dl_result r)
{
    static const char *names[] = {
        "DL_OK", "DL_ERR_ARG", "DL_ERR_SHAPE", "DL_ERR_DTYPE", "DL_ERR_DEVICE",
        "DL_ERR_STALE", "DL_ERR_GRAPH", "DL_ERR_OOM", "DL_ERR_IO", "DL_ERR_FORMAT",
        "DL_ERR_NAN", "DL_ERR_UNSUPPORTED"};
    if ((int)r < 0 || (int)r >= (int)(sizeof names / sizeof names[0])) return "DL_ERR_?";
    return names[r];
}

dl_result dl_last_error(const dl_ctx *ctx) { return ctx ? ctx->err : dl__noctx_err; }
const char *dl_error_message(const dl_ctx *ctx) { return ctx ? ctx->msg : dl__noctx_msg; }
void dl_clear_error(dl_ctx *ctx)
{
    if (ctx) { ctx->err = DL_OK; ctx->msg[0] = 0; }
    else { dl__noctx_err = DL_OK; dl__noctx_msg[0] = 0; }
}
void dl_set_log(dl_ctx *ctx, dl_log_fn fn, void *user)
{
    if (!ctx) return;
    ctx->log = fn ? fn : dl__log_stderr;
    ctx->log_user = user;
}

/* Every tensor argument passes here: it must be a live tensor of this step,
   persistent, or made by a capture not yet freed (inside a capture, see
   dl__cap_input). A header whose magic is wrong cannot name its context,
   so nothing can be reported: the op returns NULL. dl__live is an op's
   check (it also opens the op's profiler span); calls that are not ops
   (dl_data, dl_backward, modules, optimizers ...) check with dl__valid. */
static bool dl__valid(const char *op, const char *arg, const dl_tensor *t)
{
    dl_ctx *ctx;
    bool capt;
    if (!t) return false;
    if (t->magic_ != DL__MAGIC) {
#ifdef DL_DEBUG
        if (t->magic_ == DL__FREED) {
            dl__err(t->ctx_, DL_ERR_ARG, "%s: %s %s was freed by dl_free() (use after free)", op,
                    arg, t->name[0] ? t->name : "(unnamed)");
            return false;
        }
#endif
        ctx = dl__header_owner(t, &capt);    /* a released step header reads as zeros */
        if (ctx && capt)
            dl__err(ctx, DL_ERR_STALE, "%s: %s was made inside a capture that dl_capture_free() "
                    "released; copy it with dl_keep() before freeing the capture to use it later",
                    op, arg);
        else if (ctx)
            dl__err(ctx, DL_ERR_STALE, "%s: %s is a step tensor from an earlier step (before step "
                    "%llu), which dl_step_end() released; copy it with dl_keep() to use it in "
                    "later steps", op, arg, (unsigned long long)(ctx->step ? ctx->step - 1 : 0));
        return false;
    }
    ctx = t->ctx_;
    if (t->step_ != 0 && t->step_ != ctx->step && !dl__cap_gen_live(ctx, t->step_)) {
        if (t->step_ & DL__CAP_GEN)
            dl__err(ctx, DL_ERR_STALE, "%s: %s %s was made inside a capture that dl_capture_free() "
                    "released; copy it with dl_keep() before freeing the capture to use it later",
                    op, arg, dl__sh(t));
        else
            dl__err(ctx, DL_ERR_STALE,
                "%s: %s %s was made in step %llu, which dl_step_end() released (now step "
                "%llu); copy it with dl_keep() to use it in later steps",
                op, arg, dl__sh(t), (unsigned long long)t->step_, (unsigned long long)ctx->step);
        return false;
    }
    return ctx->cap ? dl__cap_input(op, arg, (dl_tensor *)t) : true;
}

static bool dl__live(const char *op, const char *arg, const dl_tensor *t)
{
    dl_ctx *ctx;
    /* the checks above, inline (every op passes): dl__valid decides and reports the rest
       (a capture's tensor, a tensor used inside a capture) */
    if ((!t || t->magic_ != DL__MAGIC || (t->step_ != 0 && t->step_ != t->ctx_->step) || t->ctx_->cap) &&
        !dl__valid(op, arg, t))
        return false;
    ctx = t->ctx_;
    if (ctx->prof) dl__prof_begin(ctx, t->dev_, op, false);
    return true;
}

static bool dl__f32(const char *op, const char *arg, const dl_tensor *t)
{
    if (t->dtype == DL_DTYPE_F32) return true;
    dl__err(t->ctx_, DL_ERR_DTYPE, "%s: %s %s has dtype %s; this op needs float32", op, arg,
            dl__sh(t), dl__dtype_str(t->dtype));
    return false;
}

/* Two operands must share a context and a device. */
static bool dl__pair(const char *op, const dl_tensor *a, const dl_tensor *b)
{
    char da[32], db[32];
    if (a->ctx_ != b->ctx_) {
        dl__err(a->ctx_, DL_ERR_ARG, "%s: a and b belong to different contexts", op);
        return false;
    }
    if (a->device.type != b->device.type || a->device.index != b->device.index) {
        dl__err(a->ctx_, DL_ERR_DEVICE, "%s: a is on %s and b is on %s; move one with dl_to()",
                op, dl__dev_str(a->device, da, sizeof da), dl__dev_str(b->device, db, sizeof db));
        return false;
    }
    return true;
}

/* Normalize a possibly negative dim against ndim (insert: ndim+1 positions). */
static bool dl__dim(const char *op, const dl_tensor *t, int *dim, int ndim)
{
    int d = *dim;
    if (ndim == 0) {
        dl__err(t->ctx_, DL_ERR_ARG, "%s: dim %d: the tensor of shape %s has no dims to choose from", op, d,
                dl__sh(t));
        return false;
    }
    if (d < -ndim || d >= ndim) {
        dl__err(t->ctx_, DL_ERR_ARG, "%s: dim %d is out of range for a tensor of shape %s "
                "(valid: %d..%d)", op, d, dl__sh(t), -ndim, ndim - 1);
        return false;
    }
    *dim = d < 0 ? d + ndim : d;
    return true;
}

// >>section io: files (writing atomically, reading whole)
/* Every file dl.h writes goes through dl__wopen/dl__wput/dl__wclose: the
   bytes go to a new, uniquely named temporary file in the destination's
   directory, which is flushed to disk (fsync) and renamed over the
   destination; then the directory itself is synced. A crash or a full disk
   therefore never leaves a half-written file in place of a good one, and two
   writers of one path never share a temporary. The destination must be a
   regular file (or not exist yet): a device, directory or pipe is refused,
   never replaced. A symbolic link is written through to its target (POSIX
   builds); the link itself stays. Files are read whole by dl__read_file,
   which refuses directories and other non-regular files by name. */

typedef struct dl__wfile {
    char *final, *tmp;        /* destination (symlinks resolved) and temporary */
    bool ok;
    int err;                  /* errno of the first failure (0: none) */
#ifdef DL__UNIX
    int fd;
#else
    FILE *f;
#endif
} dl__wfile;

static char *dl__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = (char *)DL_MALLOC(n);
    if (d) memcpy(d, s, n);
    return d;
}

static const char *dl__errno_str(int e) { return e > 0 ? strerror(e) : e < 0 ? "out of memory" : "unknown error"; }

/* Opens the temporary for path. false + error (nothing created) on failure. */
static bool dl__wopen(dl_ctx *ctx, const char *op, const char *path, dl__wfile *w)
{
    const char *slash;
    size_t dirlen, n;
    int attempt;
#ifdef DL__UNIX
    int mode = -1, shortname = 0;
#endif
    memset(w, 0, sizeof *w);
    if (!path || !path[0]) {
        dl__err(ctx, DL_ERR_ARG, "%s: the path is %s", op, path ? "empty" : "NULL");
        return false;
    }
    w->final = dl__strdup(path);
    if (!w->final) goto oom;
#ifdef DL__UNIX
    {
        struct stat st;
#ifdef DL__POSIX2008
        int hops = 0;
        while (lstat(w->final, &st) == 0 && S_ISLNK(st.st_mode)) {
            /* follow the link: its target, relative to the link's directory */
            char buf[4096], *next;
            ssize_t k = readlink(w->final, buf, sizeof buf - 1);
            const char *slash0 = strrchr(w->final, '/');
            size_t dl = (buf[0] == '/' || !slash0) ? 0 : (size_t)(slash0 - w->final) + 1;
            if (k <= 0 || (size_t)k >= sizeof buf - 1 || ++hops > 40) {
                dl__err(ctx, DL_ERR_IO, "%s: %s is a symbolic link that cannot be followed (%s); "
                        "refusing to replace the link", op, path,
                        k < 0 ? dl__errno_str(errno) : "too long or a loop");
                goto fail;
            }
            buf[k] = 0;
            if (buf[0] == '/') dl = 0;
            next = (char *)DL_MALLOC(dl + (size_t)k + 1);
            if (!next) goto oom;
            memcpy(next, w->final, dl);
            memcpy(next + dl, buf, (size_t)k + 1);
            DL_FREE(w->final);
            w->final = next;
        }
#endif
        if (stat(w->final, &st) == 0) {
            if (!S_ISREG(st.st_mode)) {
                dl__err(ctx, DL_ERR_IO, "%s: %s exists and is not a regular file (%s); refusing to "
                        "replace it", op, w->final, S_ISDIR(st.st_mode) ? "a directory" :
                        S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a pipe or socket");
                goto fail;
            }
            mode = (int)(st.st_mode & 07777);   /* the new file keeps the old one's permissions */
        }
    }
#endif
    slash = strrchr(w->final, '/');
    dirlen = slash ? (size_t)(slash - w->final) + 1 : 0;
    n = strlen(w->final) + 64;
    w->tmp = (char *)DL_MALLOC(n);
    if (!w->tmp) goto oom;
    for (attempt = 0; attempt < 100; attempt++) {
#ifdef DL__UNIX
        if (shortname)   /* the file's name is near the file system's limit: no room to add to it */
            snprintf(w->tmp, n, "%.*s.dl-tmp-%ld-%d", (int)dirlen, w->final, (long)getpid(),
                     attempt + (int)(((uintptr_t)w >> 4) & 0xffff) * 100);
        else
            snprintf(w->tmp, n, "%.*s.%s.tmp-%ld-%d", (int)dirlen, w->final, w->final + dirlen,
                     (long)getpid(), attempt + (int)(((uintptr_t)w >> 4) & 0xffff) * 100);
        w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (w->fd >= 0) {
            if (mode >= 0 && chmod(w->tmp, (mode_t)mode) != 0) { /* best effort, as cp's */ }
            w->ok = true;
            return true;
        }
        if (errno == EEXIST) continue;
        if (errno == ENAMETOOLONG && !shortname) { shortname = 1; attempt--; continue; }
        dl__err(ctx, DL_ERR_IO, "%s: cannot create a file in the directory of %s (%s)%s", op, w->final,
                dl__errno_str(errno), errno == ENAMETOOLONG ? "" : ": does the directory exist, is it writable?");
        goto fail;
#else
        FILE *probe;
        snprintf(w->tmp, n, "%s.tmp-%d", w->final, attempt + (int)(((uintptr_t)w >> 4) & 0xffff) * 100);
        probe = fopen(w->tmp, "rb");
        if (probe) { fclose(probe); continue; }
        w->f = fopen(w->tmp, "wb");
        if (w->f) { w->ok = true; return true; }
        dl__err(ctx, DL_ERR_IO, "%s: cannot create a file next to %s: does the directory exist, is "
                "it writable?", op, w->final);
        goto fail;
#endif
    }
    dl__err(ctx, DL_ERR_IO, "%s: cannot find a free temporary name next to %s", op, w->final);
    goto fail;
oom:
    dl__err(ctx, DL_ERR_OOM, "%s: out of memory", op);
fail:
    DL_FREE(w->final);
    DL_FREE(w->tmp);
    w->final = w->tmp = NULL;
    w->ok = false;
    return false;
}

static void dl__wput(dl__wfile *w, const void *data, size_t n)
{
    const char *p = (const char *)data;
    if (!w->ok) return;
#ifdef DL__UNIX
    while (n > 0) {
        ssize_t k = write(w->fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { w->ok = false; w->err = k < 0 ? errno : ENOSPC; return; }
        p += k;
        n -= (size_t)k;
    }
#else
    if (n && fwrite(p, 1, n, w->f) != n) w->ok = false;
#endif
}

/* Finishes the file: sync, close, rename over the destination, sync the
   directory. On any failure the temporary is removed and the destination is
   untouched. */
static dl_result dl__wclose(dl_ctx *ctx, const char *op, dl__wfile *w)
{
    dl_result rc = DL_OK;
    if (!w->tmp) return DL_ERR_IO;
#ifdef DL__UNIX
    if (w->ok && fsync(w->fd) != 0 && errno != EINVAL) { w->ok = false; w->err = errno; }
    if (close(w->fd) != 0 && w->ok) { w->ok = false; w->err = errno; }
#else
    if (w->ok && (fflush(w->f) != 0 || ferror(w->f))) w->ok = false;
    if (fclose(w->f) != 0) w->ok = false;
#endif
    if (!w->ok) {
        remove(w->tmp);
        dl__err(ctx, DL_ERR_IO, "%s: writing %s failed: %s; %s is unchanged", op, w->tmp,
                dl__errno_str(w->err), w->final);
        rc = DL_ERR_IO;
        goto done;
    }
#ifdef _WIN32
    remove(w->final);                 /* rename does not replace on Windows */
#endif
    if (rename(w->tmp, w->final) != 0) {
#ifdef DL__UNIX
        int e = errno;
#else
        int e = 0;
#endif
        remove(w->tmp);
        dl__err(ctx, DL_ERR_IO, "%s: cannot rename %s to %s: %s", op, w->tmp, w->final, dl__errno_str(e));
        rc = DL_ERR_IO;
        goto done;
    }
#ifdef DL__UNIX
    {   /* make the rename itself durable */
        const char *slash = strrchr(w->final, '/');
        int dfd;
        if (slash) {
            size_t k = (size_t)(slash - w->final);
            char *dir = (char *)DL_MALLOC(k + 2);
            if (dir) {
                memcpy(dir, w->final, k ? k : 1);
                dir[k ? k : 1] = 0;
                dfd = open(dir, O_RDONLY);
                DL_FREE(dir);
            } else dfd = -1;
        } else dfd = open(".", O_RDONLY);
        if (dfd >= 0) { (void)fsync(dfd); close(dfd); }
    }
#endif
done:
    DL_FREE(w->final);
    DL_FREE(w->tmp);
    w->final = w->tmp = NULL;
    return rc;
}

/* Reads a whole regular file into a new buffer (DL_FREE it). */
static dl_result dl__read_file(dl_ctx *ctx, const char *op, const char *path, unsigned char **out,
                               size_t *size)
{
    FILE *f;
    long sz;
    size_t got;
    unsigned char *buf;
    *out = NULL;
    *size = 0;
    if (!path) { dl__err(ctx, DL_ERR_ARG, "%s: path is NULL", op); return DL_ERR_ARG; }
#ifdef DL__UNIX
    {
        struct stat st;
        if (stat(path, &st) != 0) {
            dl__err(ctx, DL_ERR_IO, "%s: cannot open '%s': %s", op, path, dl__errno_str(errno));
            return DL_ERR_IO;
        }
        if (S_ISDIR(st.st_mode)) {
            dl__err(ctx, DL_ERR_IO, "%s: '%s' is a directory, not a file", op, path);
            return DL_ERR_IO;
        }
        if (!S_ISREG(st.st_mode)) {
            dl__err(ctx, DL_ERR_IO, "%s: '%s' is not a regular file (a device or pipe)", op, path);
            return DL_ERR_IO;
        }
    }
#endif
    f = fopen(path, "rb");
    if (!f) {
        dl__err(ctx, DL_ERR_IO, "%s: cannot open '%s' for reading (does it exist?)", op, path);
        return DL_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0 || sz == LONG_MAX ||
        (unsigned long)sz > (unsigned long)(((size_t)-1) / 2) || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        dl__err(ctx, DL_ERR_IO, "%s: cannot determine the size of '%s' (not a regular file?)", op, path);
        return DL_ERR_IO;
    }
    buf = (unsigned char *)dl__malloc(ctx, (size_t)sz + 1);
    if (!buf) {
        fclose(f);
        dl__err(ctx, DL_ERR_OOM, "%s: '%s': cannot allocate %ld bytes to read it", op, path, sz);
        return DL_ERR_OOM;
    }
    got = sz ? fread(buf, 1, (size_t)sz, f) : 0;
    if (got != (size_t)sz || ferror(f)) {
        fclose(f);
        DL_FREE(buf);
        dl__err(ctx, DL_ERR_IO, "%s: reading '%s' failed after %zu of %ld bytes", op, path, got, sz);
        return DL_ERR_IO;
    }
    fclose(f);
    *out = buf;
    *size = (size_t)sz;
    return DL_OK;
}

/* The length of the UTF-8 character that starts s (n > 0 bytes left), 0 when
   the bytes there are not one as protobuf and Graphviz read UTF-8: no
   overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t dl__utf8_char(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t len, i;
    uint32_t cp;
    if (u[0] < 0x80) return 1;
    if (u[0] >= 0xc2 && u[0] <= 0xdf) { len = 2; cp = u[0] & 0x1fu; }
    else if (u[0] >= 0xe0 && u[0] <= 0xef) { len = 3; cp = u[0] & 0x0fu; }
    else if (u[0] >= 0xf0 && u[0] <= 0xf4) { len = 4; cp = u[0] & 0x07u; }
    else return 0;
    if (n < len) return 0;
    for (i = 1; i < len; i++) {
        if ((u[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (u[i] & 0x3fu);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) return 0;
    if (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) return 0;
    return len;
}

/* The offset of the first byte of s that is not valid UTF-8; -1 when all are. */
static int64_t dl__utf8_bad(const char *s)
{
    size_t n = strlen(s), i = 0, k;
    while (i < n) {
        if ((k = dl__utf8_char(s + i, n - i)) == 0) return (int64_t)i;
        i += k;
    }
    return -1;
}

typedef struct dl__sb { char *s; size_t n, cap; bool oom; } dl__sb;

static void dl__sb_put(dl__sb *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 1024;
        char *p;
        while (nc < b->n + n + 1) nc *= 2;
        p = (char *)DL_REALLOC(b->s, nc);
        if (!p) { b->oom = true; return; }
        b->s = p;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void dl__sb_str(dl__sb *b, const char *s) { dl__sb_put(b, s, strlen(s)); }

/* printf into a string builder */
static void dl__sbf(dl__sb *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void dl__sbf(dl__sb *b, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    int k;
    va_start(ap, fmt);
    k = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (k < 0) { b->oom = true; return; }
    if ((size_t)k < sizeof buf) { dl__sb_put(b, buf, (size_t)k); return; }
    {
        char *big = (char *)DL_MALLOC((size_t)k + 1);
        if (!big) { b->oom = true; return; }
        va_start(ap, fmt);
        vsnprintf(big, (size_t)k + 1, fmt, ap);
        va_end(ap);
        dl__sb_put(b, big, (size_t)k);
        DL_FREE(big);
    }
}

// >>section context
/* splitmix64 fills a xoshiro256** state from one seed */
static void dl__seed_state(uint64_t seed, uint64_t *s)
{
    int i;
    uint64_t z = seed ? seed : 0x5eed;
    for (i = 0; i < 4; i++) {
        uint64_t x;
        z += 0x9e3779b97f4a7c15ull;
        x = z;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        s[i] = x ^ (x >> 31);
    }
}

/* The context's generator is (seed, offset): a fill of n numbers uses the
   counters offset .. offset+n-1 and moves the offset on by n, so the same
   seed and the same sequence of draws give the same numbers on any device. */
void dl_manual_seed(dl_ctx *ctx, uint64_t seed)
{
    if (!ctx) return;
    if (dl__cap_refused(ctx, "dl_manual_seed", "reseeding", "seed before dl_capture_begin() or between "
                        "replays (a replay reads the generator's seed and counter)")) return;
    ctx->seed = seed ? seed : 0x5eed;
    ctx->rng_offset = 0;
}

static uint64_t dl__rng_take(dl_ctx *ctx, int64_t n)
{
    uint64_t o = ctx->rng_offset;
    ctx->rng_offset += (uint64_t)(n > 0 ? n : 0);
    return o;
}

static uint64_t dl__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t dl__rng_next(uint64_t *s)
{
    uint64_t r = dl__rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = dl__rotl(s[3], 45);
    return r;
}

static float dl__rng_uniform(uint64_t *s) { return (float)(dl__rng_next(s) >> 40) * (1.0f / 16777216.0f); }


/* Logged, not an error: the call goes on. */
static void dl__warn(dl_ctx *ctx, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void dl__warn(dl_ctx *ctx, const char *fmt, ...)
{
    char buf[320];
    va_list ap;
    int k = snprintf(buf, sizeof buf, "warning: ");
    va_start(ap, fmt);
    vsnprintf(buf + k, sizeof buf - (size_t)k, fmt, ap);
    va_end(ap);
    if (ctx && ctx->log) ctx->log(ctx->log_user, buf);
    else if (!ctx) fprintf(stderr, "dl.h: %s\n", buf);
}

static int dl__cores(void)
{
#if defined(DL__UNIX) && defined(_SC_NPROCESSORS_ONLN)
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    return nc > 0 ? (nc > 1024 ? 1024 : (int)nc) : 1;
#else
    return 1;
#endif
}

/* Kernel threads: 0 means every core; more than the cores is clamped to
   them (a warning); negative or over 1024 is an error. */
static bool dl__threads_ok(dl_ctx *ctx, const char *op, int n, int *out)
{
    int cores = dl__cores();
    if (n < 0 || n > 1024) {
        dl__err(ctx, DL_ERR_ARG, "%s: num_threads=%d must be between 0 (all %d cores) and 1024", op,
                n, cores);
        return false;
    }
    if (n > cores) {
        dl__warn(ctx, "%s: num_threads=%d is more than the %d cores; using %d", op, n, cores, cores);
        n = cores;
    }
    *out = n == 0 ? cores : n;
    return true;
}

/* ---- devices of a context */

static const dl__backend *dl__cpu_be(void);
#ifdef DL_CUDA
static dl__dev *dl__cuda_open(dl_ctx *ctx, int index, const char *op);   /* dl_cuda.cuh */
static void dl__cuda_close(dl__dev *d);
static int dl__cuda_count(void);
static void dl__cuda_set_tf32(dl__dev *d, bool matmul, bool conv);
#endif

static const char *dl__dev_str(dl_device d, char *buf, size_t n);
static dl_device dl__devdef(void) { dl_device d; d.type = DL_DEVICE_DEFAULT; d.index = 0; return d; }

static dl__dev *dl__dev_new(dl_ctx *ctx, dl_device id, const dl__backend *be)
{
    dl__dev *d = (dl__dev *)dl__malloc(ctx, sizeof(dl__dev));
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    d->id = id;
    d->be = be;
    d->ctx = ctx;
    d->data.min_chunk = (size_t)1 << 20;
    d->data.dev = d;
    return d;
}

static void dl__dev_free(dl__dev *d)
{
    if (!d) return;
    dl__arena_free(&d->data);
#ifdef DL_CUDA
    if (d->id.type == DL_DEVICE_CUDA) dl__cuda_close(d);
#endif
    DL_FREE(d);
}

static void dl__devs_free(dl_ctx *ctx)
{
    int i;
    for (i = 0; i < DL__MAX_CPU; i++) { dl__dev_free(ctx->cpu[i]); ctx->cpu[i] = NULL; }
    for (i = 0; i < DL__MAX_CUDA; i++) { dl__dev_free(ctx->cuda[i]); ctx->cuda[i] = NULL; }
}

/* "cpu", "cpu:1", "cuda", "cuda:0" -> a device; type -1 when malformed */
dl_device dl_device_parse(const char *name)
{
    dl_device d;
    const char *rest = NULL;
    d.type = -1;
    d.index = 0;
    if (!name) return d;
    if (strncmp(name, "cpu", 3) == 0) { d.type = DL_DEVICE_CPU; rest = name + 3; }
    else if (strncmp(name, "cuda", 4) == 0) { d.type = DL_DEVICE_CUDA; rest = name + 4; }
    else return d;
    if (*rest == 0) return d;
    if (*rest != ':' || rest[1] < '0' || rest[1] > '9') { d.type = -1; return d; }
    {
        char *end = NULL;
        long v = strtol(rest + 1, &end, 10);
        if (*end || v < 0 || v > 1023) d.type = -1;
        else d.index = (int)v;
    }
    return d;
}

/* The device a dl_device names in ctx; NULL with an error naming it when it
   does not exist or its backend is not compiled in. */
static dl__dev *dl__device(dl_ctx *ctx, dl_device dev, const char *op)
{
    char b[32];
    if (dev.type == DL_DEVICE_DEFAULT) return ctx->defdev ? ctx->defdev : ctx->cpu[0];
    if (dev.type == DL_DEVICE_CPU) {
        if (dev.index >= 0 && dev.index < ctx->ncpu) return ctx->cpu[dev.index];
        dl__err(ctx, DL_ERR_DEVICE, "%s: %s does not exist: this context has %d CPU device%s "
                "(more with dl_ctx_desc.cpu_devices, or DL_CPU_DEVICES=N where that is 0)", op,
                dl__dev_str(dev, b, sizeof b), ctx->ncpu, ctx->ncpu == 1 ? "" : "s");
        return NULL;
    }
    if (dev.type == DL_DEVICE_CUDA) {
#ifdef DL_CUDA
        if (dev.index < 0 || dev.index >= DL__MAX_CUDA) {
            dl__err(ctx, DL_ERR_DEVICE, "%s: %s: CUDA device indices go from 0 to %d", op,
                    dl__dev_str(dev, b, sizeof b), DL__MAX_CUDA - 1);
            return NULL;
        }
        if (!ctx->cuda[dev.index] && ctx->cap) {
            dl__err(ctx, DL_ERR_UNSUPPORTED, "%s: %s is first used inside a capture, which records "
                    "the devices open at dl_capture_begin(); use it before", op, dl__dev_str(dev, b, sizeof b));
            return NULL;
        }
        if (!ctx->cuda[dev.index]) ctx->cuda[dev.index] = dl__cuda_open(ctx, dev.index, op);
        return ctx->cuda[dev.index];    /* NULL: dl__cuda_open said why */
#else
        dl__err(ctx, DL_ERR_DEVICE, "%s: %s requested but dl.h was built without DL_CUDA "
                "(compile the implementation file with nvcc -DDL_CUDA; see the README)", op,
                dl__dev_str(dev, b, sizeof b));
        return NULL;
#endif
    }
    dl__err(ctx, DL_ERR_DEVICE, "%s: device type %d is not DL_DEVICE_DEFAULT, DL_DEVICE_CPU or "
            "DL_DEVICE_CUDA", op, dev.type);
    return NULL;
}

/* cpu:0 .. cpu:N-1, strict mode, the default device: each from the desc,
   or, where the desc leaves the field at zero, from the environment
   (DL_CPU_DEVICES, DL_STRICT, DL_DEVICE), so that a whole test suite can be
   run on another device without changing it while an explicit desc keeps
   what it asked for. */
static bool dl__devs_init(dl_ctx *ctx, const dl_ctx_desc *desc)
{
    const char *env;
    int n = desc && desc->cpu_devices > 0 ? desc->cpu_devices : 1, i;
    dl_device def = desc ? desc->device : dl__devdef();
    ctx->strict = desc && desc->strict_devices;
    if (desc && (desc->cpu_devices < 0 || desc->cpu_devices > DL__MAX_CPU)) {
        dl__err(ctx, DL_ERR_ARG, "dl_ctx_init: cpu_devices=%d must be between 0 (1 device) and %d",
                desc->cpu_devices, DL__MAX_CPU);
        return false;
    }
    if ((!desc || desc->cpu_devices == 0) && (env = getenv("DL_CPU_DEVICES")) && *env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (*end || v < 1 || v > DL__MAX_CPU) {
            dl__err(ctx, DL_ERR_ARG, "dl_ctx_init: DL_CPU_DEVICES=%s must be a number from 1 to %d",
                    env, DL__MAX_CPU);
            return false;
        }
        n = (int)v;
    }
    if (!ctx->strict && (env = getenv("DL_STRICT")) && *env) ctx->strict = strcmp(env, "0") != 0;
    if (def.type == DL_DEVICE_DEFAULT && (env = getenv("DL_DEVICE")) && *env) {
        def = dl_device_parse(env);
        if (def.type < 0) {
            dl__err(ctx, DL_ERR_ARG, "dl_ctx_init: DL_DEVICE=%s is not a device name (cpu, cpu:1, "
                    "cuda, cuda:0 ...)", env);
            return false;
        }
    }
    for (i = 0; i < n; i++) {
        dl_device id;
        id.type = DL_DEVICE_CPU;
        id.index = i;
        ctx->cpu[i] = dl__dev_new(ctx, id, dl__cpu_be());
        if (!ctx->cpu[i]) { dl__err(ctx, DL_ERR_OOM, "dl_ctx_init: out of memory"); return false; }
#if UINTPTR_MAX > 0xffffffffu
        if (ctx->strict && i > 0) ctx->cpu[i]->tag = (uintptr_t)1 << 52;
#endif
    }
    ctx->ncpu = n;
    ctx->defdev = dl__device(ctx, def, "dl_ctx_init");
    return ctx->defdev != NULL;
}

/* One TF32 switch: the desc's field v (1 on, -1 off), else the environment
   variable env (0 or 1), else def (PyTorch's default). Read before any
   device opens (DL_DEVICE=cuda:0 opens it in dl__devs_init). */
static bool dl__tf32_opt(dl_ctx *ctx, const char *field, int v, const char *env, bool def, bool *out)
{
    const char *e;
    if (v < -1 || v > 1) {
        dl__err(ctx, DL_ERR_ARG, "dl_ctx_init: %s=%d must be 1 (on), -1 (off) or 0 (the environment's "
                "%s, else PyTorch's default: %s)", field, v, env, def ? "on" : "off");
        return false;
    }
    if (v) {
        *out = v > 0;
        return true;
    }
    if ((e = getenv(env)) && *e) {
        if (strcmp(e, "0") != 0 && strcmp(e, "1") != 0) {
            dl__err(ctx, DL_ERR_ARG, "dl_ctx_init: %s=%s must be 0 (off) or 1 (on)", env, e);
            return false;
        }
        *out = e[0] == '1';
        return true;
    }
    *out = def;
    return true;
}

dl_ctx *dl_ctx_init(const dl_ctx_desc *desc)
{
    dl_ctx *ctx = (dl_ctx *)DL_MALLOC(sizeof(dl_ctx));
    dl_log_fn log = desc && desc->log ? desc->log : NULL;   /* NULL: stderr */
    if (!ctx) {
        dl__noctx_fail(log, desc ? desc->log_user : NULL, DL_ERR_OOM, "dl_ctx_init: out of memory for the context");
        return NULL;
    }
    memset(ctx, 0, sizeof *ctx);
    ctx->step = 1;
    dl__hstore_init(ctx);
    ctx->log = NULL;                     /* a failure is reported once, at the end */
    if (desc) {
        ctx->memory_limit = desc->memory_limit;
        ctx->log_user = desc->log_user;
    }
    dl_manual_seed(ctx, desc ? desc->seed : 0);
    if (desc && (desc->num_threads < 0 || desc->num_threads > 1024)) {
        dl__err(ctx, DL_ERR_ARG, "dl_ctx_init: num_threads=%d must be between 0 (all %d cores) and 1024",
                desc->num_threads, dl__cores());
        /* no context is returned: the message goes to the thread's context-less slot */
        dl__noctx_fail(log, ctx->log_user, ctx->err, ctx->msg);
        dl__hstore_free(ctx);
        DL_FREE(ctx);
        return NULL;
    }
    ctx->log = log ? log : dl__log_stderr;     /* the clamp's warning goes to the log */
    dl__threads_ok(ctx, "dl_ctx_init", desc ? desc->num_threads : 0, &ctx->nthreads);
    ctx->pool = dl__pool_create(ctx->nthreads);
    ctx->alloc_calls++;
    ctx->log = NULL;
    if (!dl__tf32_opt(ctx, "allow_tf32", desc ? desc->allow_tf32 : 0, "DL_ALLOW_TF32", false, &ctx->allow_tf32) ||
        !dl__tf32_opt(ctx, "allow_tf32_conv", desc ? desc->allow_tf32_conv : 0, "DL_ALLOW_TF32_CONV", true,
                      &ctx->allow_tf32_conv) ||
        !dl__devs_init(ctx, desc)) {
        dl__noctx_fail(log, ctx->log_user, ctx->err, ctx->msg);   /* no context is returned */
        dl_ctx_free(ctx);
        return NULL;
    }
    ctx->log = log ? log : dl__log_stderr;
    {   /* the profiler: the desc's choice, else DL_PROFILE=1 */
        const char *env = getenv("DL_PROFILE");
        int on = desc ? desc->profile : 0;
        if (on == 0 && env && *env && strcmp(env, "0") != 0) on = 1;
        if (on > 0) dl_profile_enable(ctx, true);
    }
    return ctx;
}

static void dl__persist_unlink(dl_tensor *t)
{
    dl_ctx *ctx = t->ctx_;
    if (t->pprev_) t->pprev_->pnext_ = t->pnext_;
    else ctx->persist = t->pnext_;
    if (t->pnext_) t->pnext_->pprev_ = t->pprev_;
}

static size_t dl__esize(dl_dtype t) { return t == DL_DTYPE_I64 ? 8 : 4; }

static void dl__persist_release(dl_tensor *t)
{
    dl__dev *d = t->dev_;
#ifdef DL_DEBUG
    dl_ctx *ctx = t->ctx_;
#endif
    size_t bytes = (size_t)t->numel * dl__esize(t->dtype) + sizeof(dl_tensor);
    if (t->ctx_->caps) dl__cap_forget(t, "freed");   /* a capture that uses t cannot replay */
    dl__persist_unlink(t);
    d->persistent_bytes -= bytes < d->persistent_bytes ? bytes : d->persistent_bytes;
    if (t->owns_) d->be->free(d, t->data);
#ifdef DL_DEBUG
    /* debug builds keep the header, poisoned, so that a use after dl_free is
       an error naming the tensor; dl_ctx_free releases it */
    t->magic_ = DL__FREED;
    t->data = NULL;
    t->pnext_ = ctx->freed;
    ctx->freed = t;
#else
    t->magic_ = 0;
    DL_FREE(t);
#endif
}

/* Register p to be destroyed by dl_ctx_free (false, with an error, on OOM). */
static DL__UNUSED bool dl__own(dl_ctx *ctx, void (*destroy)(void *p), void *p)
{
    dl__owned *o = (dl__owned *)dl__malloc(ctx, sizeof(dl__owned));
    if (!o) { dl__err(ctx, DL_ERR_OOM, "out of memory"); return false; }
    o->destroy = destroy;
    o->p = p;
    o->next = ctx->owned;
    ctx->owned = o;
    return true;
}

/* Destroy p now (and forget it) if the context owns it. */
static DL__UNUSED void dl__disown(dl_ctx *ctx, void *p)
{
    dl__owned **pp = &ctx->owned;
    while (*pp) {
        if ((*pp)->p == p) {
            dl__owned *o = *pp;
            *pp = o->next;
            o->destroy(o->p);
            DL_FREE(o);
            return;
        }
        pp = &(*pp)->next;
    }
}

static void dl__dfree_all(dl_ctx *ctx)
{
    while (ctx->dfree) {
        dl__dfree *f = ctx->dfree;
        ctx->dfree = f->next;
        f->d->be->free(f->d, f->p);
        DL_FREE(f);
    }
}

void dl_ctx_free(dl_ctx *ctx)
{
    if (!ctx) return;
    dl__caps_free(ctx);        /* first: a capture running on CUDA ends before its stream goes */
    dl__prof_free(ctx);   /* prints the table first when something was recorded */
    while (ctx->owned) {
        dl__owned *o = ctx->owned;
        ctx->owned = o->next;
        o->destroy(o->p);
        DL_FREE(o);
    }
    while (ctx->persist) dl__persist_release(ctx->persist);
    while (ctx->freed) { dl_tensor *t = ctx->freed; ctx->freed = t->pnext_; DL_FREE(t); }
    dl__dfree_all(ctx);
    dl__devs_free(ctx);
    dl__hstore_free(ctx);
    DL_FREE(ctx->tape);
    dl__pool_destroy(ctx->pool);
    DL_FREE(ctx);
}

void dl_step_end(dl_ctx *ctx)
{
    int i;
    if (!ctx) return;
    if (ctx->cap) {   /* fails the capture (dl__err) */
        dl__err(ctx, DL_ERR_ARG, "dl_step_end: inside a capture: end it with dl_capture_end() "
                "first (the capture's tensors outlive dl_step_end anyway)");
        return;
    }
    ctx->step++;
    dl__dfree_all(ctx);
    for (i = 0; i < ctx->ncpu; i++) dl__arena_reset(&ctx->cpu[i]->data);
    for (i = 0; i < DL__MAX_CUDA; i++) if (ctx->cuda[i]) dl__arena_reset(&ctx->cuda[i]->data);
    dl__hstep_end(ctx);
    ctx->ntape = 0;
    if (ctx->prof) dl__prof_step(ctx);
}

uint64_t dl_step(const dl_ctx *ctx) { return ctx ? ctx->step : 0; }

dl_result dl_set_num_threads(dl_ctx *ctx, int n)
{
    dl__pool *p;
    if (!ctx) return DL_ERR_ARG;
    if (!dl__threads_ok(ctx, "dl_set_num_threads", n, &n)) return DL_ERR_ARG;
    p = dl__pool_create(n);
    if (!p) { dl__err(ctx, DL_ERR_OOM, "dl_set_num_threads: cannot start %d threads", n); return DL_ERR_OOM; }
    dl__pool_destroy(ctx->pool);
    ctx->pool = p;
    ctx->nthreads = n;
    return DL_OK;
}

int dl_num_threads(const dl_ctx *ctx) { return ctx ? dl__pool_size(ctx->pool) : 0; }

dl_device dl_cpu(void) { dl_device d; d.type = DL_DEVICE_CPU; d.index = 0; return d; }
dl_device dl_cpu_device(int index) { dl_device d; d.type = DL_DEVICE_CPU; d.index = index; return d; }
dl_device dl_cuda(int index) { dl_device d; d.type = DL_DEVICE_CUDA; d.index = index; return d; }

const char *dl_device_name(dl_device dev)
{
    static DL__TLS char buf[8][32];
    static DL__TLS int k;
    char *b = buf[k++ & 7];
    return dl__dev_str(dev, b, 32);
}

int dl_device_count(dl_ctx *ctx, dl_device_type type)
{
    if (!ctx) return 0;
    if (type == DL_DEVICE_CPU) return ctx->ncpu;
#ifdef DL_CUDA
    if (type == DL_DEVICE_CUDA) return dl__cuda_count();
#endif
    return 0;
}

dl_device dl_ctx_device(const dl_ctx *ctx) { return ctx && ctx->defdev ? ctx->defdev->id : dl_cpu(); }

dl_result dl_set_device(dl_ctx *ctx, dl_device dev)
{
    dl__dev *d;
    if (!ctx) return DL_ERR_ARG;
    d = dl__device(ctx, dev, "dl_set_device");
    if (!d) return ctx->err;
    ctx->defdev = d;
    return DL_OK;
}

dl_result dl_sync(dl_ctx *ctx)
{
    int i;
    if (!ctx) return DL_ERR_ARG;
    for (i = 0; i < DL__MAX_CUDA; i++)
        if (ctx->cuda[i]) {
            ctx->cuda[i]->be->sync(ctx->cuda[i]);
            if (dl__dev_check(ctx->cuda[i], "dl_sync") != DL_OK) return DL_ERR_DEVICE;
        }
    return DL_OK;
}

/* TF32 on the CUDA devices, the two switches (matmul, conv) of the context:
   the open devices take them now, the devices opened later at their opening. */
static dl_result dl__tf32_apply(dl_ctx *ctx, const char *op)
{
#ifdef DL_CUDA
    int i;
    for (i = 0; i < DL__MAX_CUDA; i++)
        if (ctx->cuda[i]) {
            dl__cuda_set_tf32(ctx->cuda[i], ctx->allow_tf32, ctx->allow_tf32_conv);
            if (dl__dev_check(ctx->cuda[i], op) != DL_OK) return DL_ERR_DEVICE;
        }
#else
    (void)ctx;
    (void)op;
#endif
    return DL_OK;
}

dl_result dl_set_allow_tf32(dl_ctx *ctx, bool allow)
{
    if (!ctx) return DL_ERR_ARG;
    ctx->allow_tf32 = allow;
    return dl__tf32_apply(ctx, "dl_set_allow_tf32");
}

dl_result dl_set_allow_tf32_conv(dl_ctx *ctx, bool allow)
{
    if (!ctx) return DL_ERR_ARG;
    ctx->allow_tf32_conv = allow;
    return dl__tf32_apply(ctx, "dl_set_allow_tf32_conv");
}

dl_ctx *dl_tensor_ctx(const dl_tensor *t) { return t && t->magic_ == DL__MAGIC ? t->ctx_ : NULL; }

dl_result dl_memory_stats_get(dl_ctx *ctx, dl_device dev, dl_memory_stats *out)
{
    dl__dev *d;
    if (!ctx || !out) return DL_ERR_ARG;
    memset(out, 0, sizeof *out);
    d = dl__device(ctx, dev, "dl_memory_stats_get");
    if (!d) return ctx->err;
    out->persistent_bytes = d->persistent_bytes;
    out->step_bytes = d->data.used;
    out->step_reserved = d->data.reserved;
    out->peak_bytes = d->peak_bytes;
    out->alloc_calls = d->alloc_calls;
    out->capture_bytes = d->held - (ctx->cap ? dl__cap_saved(ctx->cap, d) : 0);
    if (d == ctx->cpu[0]) {   /* the host: headers, tape and the library's own objects too */
        out->step_reserved += ctx->hdr[0].reserved + ctx->hdr[1].reserved;
        out->header_bytes = ctx->hcommitted;
        out->alloc_calls += ctx->alloc_calls;
    }
    return DL_OK;
}

// >>section tensors
dl_shape dl_shape_make(int ndim, const int64_t *dims)
{
    dl_shape s;
    int i;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    for (i = 0; i < ndim && i < DL_MAX_DIMS; i++) s.d[i] = dims ? dims[i] : 0;
    return s;
}

dl_shape dl_dims_all(void) { dl_shape s; memset(&s, 0, sizeof s); return s; }

static bool dl__numel(dl_ctx *ctx, const char *op, int ndim, const int64_t *shape, int64_t *numel)
{
    int i;
    int64_t n = 1, nz = 1;   /* nz: of the nonzero sizes, so that strides never overflow either */
    if (ndim < 0 || ndim > DL_MAX_DIMS) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: %d dims requested; at most DL_MAX_DIMS=%d", op, ndim,
                DL_MAX_DIMS);
        return false;
    }
    for (i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            dl_shape s = dl_shape_make(ndim, shape);
            dl__err(ctx, DL_ERR_SHAPE, "%s: shape %s has a negative size at dim %d", op,
                    dl__shp(ctx, &s), i);
            return false;
        }
        if (shape[i] && nz > (INT64_MAX / 8) / shape[i]) {
            dl_shape s = dl_shape_make(ndim, shape);
            dl__err(ctx, DL_ERR_OOM, "%s: shape %s has too many elements (size overflow%s)", op,
                    dl__shp(ctx, &s), n == 0 ? " in its nonzero sizes" : "");
            return false;
        }
        n *= shape[i];
        if (shape[i]) nz *= shape[i];
    }
    *numel = n;
    return true;
}

/* Make a tensor header + storage on device d. share NULL: allocate; else
   share that (device) memory. */
static dl_tensor *dl__make(dl__dev *d, const char *op, dl_dtype dtype, int ndim,
                           const int64_t *shape, bool persistent, void *share)
{
    dl_ctx *ctx = d->ctx;
    int64_t numel;
    size_t bytes;
    dl_tensor *t;
    char db[32];
    if (!dl__numel(ctx, op, ndim, shape, &numel)) return NULL;
    if ((uint64_t)numel > (uint64_t)(((size_t)-1) / 16)) {
        dl__err(ctx, DL_ERR_OOM, "%s: %lld elements do not fit in memory", op, (long long)numel);
        return NULL;
    }
    bytes = (size_t)numel * dl__esize(dtype);
    if (persistent) {
        if (ctx->cap && !dl__cap_persistent(ctx, op)) return NULL;
        if (!share && !dl__dev_limit_ok(d, bytes + sizeof(dl_tensor))) {
            dl__err(ctx, DL_ERR_OOM, "%s: %zu bytes on %s would pass the context's memory_limit of "
                    "%zu per device", op, bytes, dl__dev_str(d->id, db, sizeof db), ctx->memory_limit);
            return NULL;
        }
        t = (dl_tensor *)dl__malloc(ctx, sizeof(dl_tensor));
        if (!t) goto oom;
        memset(t, 0, sizeof *t);
        if (!share) {
            t->data = dl__dev_alloc(d, bytes);
            if (!t->data) { DL_FREE(t); goto oom; }
            t->owns_ = true;
        }
        t->ctx_ = ctx;
        t->pnext_ = ctx->persist;
        if (ctx->persist) ctx->persist->pprev_ = t;
        ctx->persist = t;
        d->persistent_bytes += bytes + sizeof(dl_tensor);
    } else {
        t = (dl_tensor *)dl__halloc(ctx, sizeof(dl_tensor));
        if (!t) goto oom;
        memset(t, 0, sizeof *t);
        if (!share) {
            t->data = dl__arena_alloc(ctx, &d->data, bytes, true);
            if (!t->data) goto oom;
            t->sdata_ = true;
        }
        t->bwd_tmp_ = ctx->backward_nograd;
        t->step_ = ctx->cap ? dl__cap_gen(ctx) : ctx->step;   /* a capture's tensors are its own */
        t->ctx_ = ctx;
    }
    if (share) t->data = share;
    t->magic_ = DL__MAGIC;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    t->numel = numel;
    t->dtype = dtype;
    t->device = d->id;
    t->dev_ = d;
    dl__track_peak(d);
    return t;
oom:
    {
        dl_shape sh = dl_shape_make(ndim, shape);
        dl__err(ctx, DL_ERR_OOM, "%s: cannot allocate %zu bytes for a %s %s tensor on %s%s", op,
                bytes, dl__dtype_str(dtype), dl__shp(ctx, &sh), dl__dev_str(d->id, db, sizeof db),
                ctx->memory_limit ? " (memory_limit reached?)" : "");
    }
    return NULL;
}

/* A new float32 step tensor shaped like t, on t's device. */
static dl_tensor *dl__like(const char *op, const dl_tensor *t)
{
    return dl__make(t->dev_, op, DL_DTYPE_F32, t->ndim, t->shape, false, NULL);
}

/* The version of t's storage (torch's t._version): every in-place write
   into its values through the API (dl_write, dl_fill_, dl_copy_, zero_grad,
   an optimizer step, dl_load ...) bumps it, and a view shares its base's.
   A node keeps the versions of the tensors its backward reads; backward
   refuses to run it when one has moved since (dl__saved_ok). */
static uint32_t *dl__ver(dl_tensor *t) { return &(t->vbase_ ? t->vbase_ : t)->ver_; }
static void dl__bump_version(dl_tensor *t)
{
    if (!t) return;
    (*dl__ver(t))++;
    if (t->ctx_->cap) dl__cap_bump(t);   /* a replay writes it in place again */
}
/* a collective wrote t[0..n) in place, all but t[keep] (-1: none kept) */
static dl_result dl__bump_list(dl_result rc, dl_tensor *const *t, int n, int keep)
{
    int i;
    if (rc == DL_OK) for (i = 0; i < n; i++) if (i != keep) dl__bump_version(t[i]);
    return rc;
}

static dl_tensor *dl__new(dl__dev *d, const char *op, int ndim, const int64_t *shape)
{
    return dl__make(d, op, DL_DTYPE_F32, ndim, shape, false, NULL);
}

/* ---- the counter-based generator: the same numbers on every device.
   Element i of a random fill is a pure function of (seed, offset + i):
   Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
   3", SC 2011) of the counter, keyed by the seed. Uniforms take the top 24
   bits (exact in float). Normals use Box-Muller with a log and a cosine
   written here with only IEEE basic operations and explicit fmaf (no libm,
   no contraction left to the compiler), so the CPU and the CUDA backend
   produce the same bits. */

static DL__HD inline void dl__philox(uint64_t counter, uint64_t key, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    int r;
    for (r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* U[0,1) from the top 24 bits */
static DL__HD inline float dl__rng_uniform01(uint64_t seed, uint64_t counter)
{
    uint32_t r[4];
    dl__philox(counter, seed, r);
    return (float)(r[0] >> 8) * (1.0f / 16777216.0f);
}

/* log(u) for u in (0, 1]: u = m 2^e with m in [sqrt(1/2), sqrt(2));
   log m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172 (series to s^9) */
static DL__HD inline float dl__det_log(float u)
{
    int e;
    float m = frexpf(u, &e), s, s2, p;
    if (m < 0.70710678f) { m = m * 2.0f; e = e - 1; }
    s = (m - 1.0f) / (m + 1.0f);
    s2 = s * s;
    p = fmaf(s2, 0.11111111f, 0.14285714f);
    p = fmaf(s2, p, 0.2f);
    p = fmaf(s2, p, 0.33333333f);
    p = fmaf(s2, p, 1.0f);
    return fmaf((float)e, 0.69314718f, (2.0f * s) * p);
}

/* cos(2 pi u) for u in [0, 1): quarter turns are exact, then sin or cos of
   an angle in [0, pi/4] by series (to phi^9, phi^8) */
static DL__HD inline float dl__det_cos2pi(float u)
{
    float x = u * 4.0f, r, t, ph, p2, sn, cs, v;
    int q = (int)x;
    bool swap;
    r = x - (float)q;                      /* exact */
    swap = r > 0.5f;
    t = swap ? 1.0f - r : r;               /* exact for r in [0.5, 1) */
    ph = t * 1.5707963f;
    p2 = ph * ph;
    sn = fmaf(p2, 2.7557319e-6f, -1.9841270e-4f);
    sn = fmaf(p2, sn, 8.3333333e-3f);
    sn = fmaf(p2, sn, -0.16666667f);
    sn = fmaf(p2 * ph, sn, ph);
    cs = fmaf(p2, 2.4801587e-5f, -1.3888889e-3f);
    cs = fmaf(p2, cs, 4.1666667e-2f);
    cs = fmaf(p2, cs, -0.5f);
    cs = fmaf(p2, cs, 1.0f);
    if (swap) { v = cs; cs = sn; sn = v; }   /* angle r pi/2 = pi/2 - t pi/2 */
    switch (q & 3) {
    case 0: return cs;
    case 1: return -sn;
    case 2: return -cs;
    default: return sn;
    }
}

/* N(0,1) by Box-Muller from one Philox block */
static DL__HD inline float dl__rng_normal01(uint64_t seed, uint64_t counter)
{
    uint32_t r[4];
    float u1, u2;
    dl__philox(counter, seed, r);
    u1 = ((float)(r[0] >> 8) + 0.5f) * (1.0f / 16777216.0f);     /* (0, 1) */
    u2 = (float)(r[1] >> 8) * (1.0f / 16777216.0f);               /* [0, 1) */
    return sqrtf(-2.0f * dl__det_log(u1)) * dl__det_cos2pi(u2);
}

/* element i of a fill: uniform in [a, b), or normal with mean a, std b */
static DL__HD inline float dl__rng_value(int dist, uint64_t seed, uint64_t counter, float a, float b)
{
    if (dist == DL__RAND_UNIFORM) return fmaf(dl__rng_uniform01(seed, counter), b - a, a);
    return fmaf(dl__rng_normal01(seed, counter), b, a);
}

// >>section backend: CPU
/* The CPU backend: host memory (tagged on strict virtual devices), loops
   split across the context's thread pool, the register-tiled GEMM above (or
   OpenBLAS). Each entry takes the tag off its pointers first (DL__RAW). */

#define DL__RAW(d, p) ((void *)((uintptr_t)(p) - (d)->tag))
/* an optional pointer (may be NULL) */
#define DL__RAW0(d, p) ((p) ? DL__RAW(d, p) : NULL)

/* 64-byte aligned host memory; the raw pointer is kept just before it */
static void *dl__cpu_alloc(dl__dev *d, size_t bytes)
{
    unsigned char *raw, *p;
    if (bytes > ((size_t)-1) - 128) return NULL;
    raw = (unsigned char *)DL_MALLOC(bytes + 64 + sizeof(void *));
    if (!raw) return NULL;
    p = (unsigned char *)(((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63);
    memcpy(p - sizeof(void *), &raw, sizeof(void *));
    return p + d->tag;
}

static void dl__cpu_free(dl__dev *d, void *p)
{
    void *raw;
    if (!p) return;
    p = DL__RAW(d, p);
    memcpy(&raw, (unsigned char *)p - sizeof(void *), sizeof(void *));
    DL_FREE(raw);
}

static void dl__cpu_upload(dl__dev *d, void *dst, const void *src, size_t n)
{
    if (n) memcpy(DL__RAW(d, dst), src, n);
}

static void dl__cpu_download(dl__dev *d, void *dst, const void *src, size_t n)
{
    if (n) memcpy(dst, DL__RAW(d, src), n);
}

static void dl__cpu_copy(dl__dev *d, void *dst, const void *src, size_t n)
{
    if (n) memmove(DL__RAW(d, dst), DL__RAW(d, src), n);
}

static void dl__cpu_peer(dl__dev *dd, void *dst, dl__dev *sd, const void *src, size_t n)
{
    if (n) memcpy(DL__RAW(dd, dst), DL__RAW(sd, src), n);
}

static void dl__cpu_sync(dl__dev *d) { (void)d; }

typedef struct dl__rand_args { int dist; float *y; uint64_t seed, offset; float a, b; } dl__rand_args;

static void dl__rand_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__rand_args *u = (const dl__rand_args *)arg;
    int64_t i;
    for (i = lo; i < hi; i++) u->y[i] = dl__rng_value(u->dist, u->seed, u->offset + (uint64_t)i, u->a, u->b);
}

static void dl__cpu_rand(dl__dev *d, int dist, float *y, int64_t n, uint64_t seed, uint64_t offset,
                         float a, float b)
{
    dl__rand_args u;
    u.dist = dist; u.y = (float *)DL__RAW(d, y); u.seed = seed; u.offset = offset; u.a = a; u.b = b;
    dl__parallel_for(d->ctx->pool, n, 1 << 13, dl__rand_task, &u);
}

static void dl__cpu_arange(dl__dev *d, float *y, int64_t n, double start, double step)
{
    int64_t i;
    y = (float *)DL__RAW(d, y);
    for (i = 0; i < n; i++) y[i] = (float)(start + (double)i * step);
}

static void dl__cpu_add_i64(dl__dev *d, int64_t *p, int64_t v)
{
    p = (int64_t *)DL__RAW(d, p);
    *p += v;
}

static void dl__cpu_eq_i64(dl__dev *d, float *y, const int64_t *a, const int64_t *b, int64_t n)
{
    int64_t i;
    y = (float *)DL__RAW(d, y);
    a = (const int64_t *)DL__RAW(d, a);
    b = (const int64_t *)DL__RAW(d, b);
    for (i = 0; i < n; i++) y[i] = a[i] == b[i] ? 1.0f : 0.0f;
}

typedef struct dl__un_args { int op; float *y; const float *x; float a, b; } dl__un_args;

static void dl__un_task(void *p, int64_t lo, int64_t hi)
{
    const dl__un_args *u = (const dl__un_args *)p;
    float *y = u->y;
    const float *xs = u->x;
    float a = u->a, b = u->b;
    int64_t i;
    switch (u->op) {
#define DL__CASE(nm, ex) case DL__U_##nm: for (i = lo; i < hi; i++) { float x = xs[i]; y[i] = (ex); } break;
    DL__UNARY_OPS(DL__CASE)
#undef DL__CASE
    default: DL_ASSERT(0);
    }
    (void)a; (void)b;
}

static void dl__cpu_unary(dl__dev *d, int op, float *y, const float *x, int64_t n, float a, float b)
{
    y = (float *)DL__RAW(d, y);
    x = (const float *)DL__RAW(d, x);
    dl__un_args u;
    u.op = op; u.y = y; u.x = x; u.a = a; u.b = b;
    dl__parallel_for(d->ctx->pool, n, 1 << 15, dl__un_task, &u);
}

/* One row of a binary op: y[i] = a[i*sa] op b[i*sb]. */
static void dl__bin_row(int op, float *y, const float *a, int64_t sa, const float *b, int64_t sb,
                        int64_t n)
{
    int64_t i;
    switch (op) {
#define DL__CASE(nm, ex) case DL__B_##nm: for (i = 0; i < n; i++) { float p = a[i * sa], q = b[i * sb]; y[i] = (ex); } break;
    DL__BINARY_OPS(DL__CASE)
#undef DL__CASE
    default: DL_ASSERT(0);
    }
}

typedef struct dl__bin_args {
    int op; float *y; const float *a, *b; const dl__bcast *bc; int64_t row;
} dl__bin_args;

static void dl__bin_flat_task(void *p, int64_t lo, int64_t hi)
{
    const dl__bin_args *u = (const dl__bin_args *)p;
    int64_t sb = u->bc->sb[u->bc->ndim - 1] ? 1 : 0, sa = u->bc->sa[u->bc->ndim - 1] ? 1 : 0;
    dl__bin_row(u->op, u->y + lo, u->a + lo * sa, sa, u->b + lo * sb, sb, hi - lo);
}

static void dl__bin_rows_task(void *p, int64_t lo, int64_t hi)
{
    const dl__bin_args *u = (const dl__bin_args *)p;
    const dl__bcast *bc = u->bc;
    int last = bc->ndim - 1;
    int64_t r;
    for (r = lo; r < hi; r++) {
        int64_t oa = 0, ob = 0, rem = r;
        int d;
        for (d = last - 1; d >= 0; d--) {
            int64_t k = rem % bc->shape[d];
            rem /= bc->shape[d];
            oa += k * bc->sa[d];
            ob += k * bc->sb[d];
        }
        dl__bin_row(u->op, u->y + r * u->row, u->a + oa, bc->sa[last], u->b + ob, bc->sb[last],
                    u->row);
    }
}

static void dl__cpu_binary(dl__dev *d, int op, float *y, const float *a, const float *b,
                           const dl__bcast *bc)
{
    y = (float *)DL__RAW(d, y);
    a = (const float *)DL__RAW(d, a);
    b = (const float *)DL__RAW(d, b);
    dl__bin_args u;
    int k;
    bool a_full = true, b_full = true, b_zero = true, a_zero = true;
    int64_t st = 1;
    u.op = op; u.y = y; u.a = a; u.b = b; u.bc = bc;
    if (bc->n == 0) return;
    if (bc->ndim == 0) { dl__bin_row(op, y, a, 0, b, 0, 1); return; }
    for (k = bc->ndim - 1; k >= 0; k--) {
        if (bc->shape[k] == 1) continue;
        if (bc->sa[k] != st) a_full = false;
        if (bc->sb[k] != st) b_full = false;
        if (bc->sa[k] != 0) a_zero = false;
        if (bc->sb[k] != 0) b_zero = false;
        st *= bc->shape[k];
    }
    if ((a_full || a_zero) && (b_full || b_zero)) {
        /* contiguous or scalar operands: one flat row, split across threads */
        dl__bcast flat = *bc;
        flat.ndim = 1;
        flat.sa[0] = a_zero ? 0 : 1;
        flat.sb[0] = b_zero ? 0 : 1;
        u.bc = &flat;
        dl__parallel_for(d->ctx->pool, bc->n, 1 << 15, dl__bin_flat_task, &u);
        return;
    }
    u.row = bc->shape[bc->ndim - 1];
    if (u.row == 0) return;
    dl__parallel_for(d->ctx->pool, bc->n / u.row, (1 << 15) / u.row + 1, dl__bin_rows_task, &u);
}

typedef struct dl__red_args {
    int op; float *y; const float *x; int64_t r, inner;
} dl__red_args;

/* eight interleaved partial sums (element k goes to k % 8) added in a fixed
   tree: vectorizes, no long chain of dependent adds, and the order depends
   on the length alone */
static double dl__acc8_total(const double *a)
{
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

static void dl__red_task(void *p, int64_t lo, int64_t hi)
{
    const dl__red_args *u = (const dl__red_args *)p;
    int64_t o, k, i, r = u->r, inner = u->inner;
    for (o = lo; o < hi; o++) {
        const float *x = u->x + o * r * inner;
        float *y = u->y + o * inner;
        if (inner == 1) {
            if (u->op == DL__R_SUM) {
                double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                int j;
                for (k = 0; k + 8 <= r; k += 8)
                    for (j = 0; j < 8; j++) a[j] += x[k + j];
                for (; k < r; k++) a[k & 7] += x[k];
                y[0] = (float)dl__acc8_total(a);
            } else {
                float m = r ? x[0] : (u->op == DL__R_MAX ? -INFINITY : INFINITY);
                for (k = 1; k < r; k++) {
                    float v = x[k];
                    if (v != v) { m = v; break; }
                    if (u->op == DL__R_MAX ? v > m : v < m) m = v;
                }
                y[0] = m;
            }
            continue;
        }
        if (u->op == DL__R_SUM) {
            for (i = 0; i < inner; i++) y[i] = 0.0f;
            for (k = 0; k < r; k++)
                for (i = 0; i < inner; i++) y[i] += x[k * inner + i];
        } else {
            if (r == 0) { for (i = 0; i < inner; i++) y[i] = u->op == DL__R_MAX ? -INFINITY : INFINITY; continue; }
            for (i = 0; i < inner; i++) y[i] = x[i];
            for (k = 1; k < r; k++)
                for (i = 0; i < inner; i++) {
                    float v = x[k * inner + i];
                    if (u->op == DL__R_MAX ? (v > y[i] || v != v) : (v < y[i] || v != v)) y[i] = v;
                }
        }
    }
}

static void dl__cpu_reduce(dl__dev *d, int op, float *y, const float *x, int64_t outer, int64_t r,
                           int64_t inner)
{
    y = (float *)DL__RAW(d, y);
    x = (const float *)DL__RAW(d, x);
    dl__red_args u;
    u.op = op; u.y = y; u.x = x; u.r = r; u.inner = inner;
    dl__parallel_for(d->ctx->pool, outer, (1 << 15) / (r * inner + 1) + 1, dl__red_task, &u);
}

static void dl__cpu_argmax(dl__dev *d, int64_t *idx, const float *x, int64_t outer, int64_t r,
                           int64_t inner)
{
    idx = (int64_t *)DL__RAW(d, idx);
    x = (const float *)DL__RAW(d, x);
    int64_t o, i, k;
    (void)d;
    for (o = 0; o < outer; o++)
        for (i = 0; i < inner; i++) {
            const float *p = x + o * r * inner + i;
            int64_t best = 0;
            float m = r ? p[0] : 0.0f;
            for (k = 1; k < r; k++) {
                float v = p[k * inner];
                if (m != m) break;
                if (v > m || v != v) { m = v; best = k; }
            }
            idx[o * inner + i] = best;
        }
}

static void dl__cpu_onehot(dl__dev *d, float *y, const int64_t *idx, int64_t outer, int64_t r,
                           int64_t inner)
{
    y = (float *)DL__RAW(d, y);
    idx = (const int64_t *)DL__RAW(d, idx);
    int64_t o, i;
    (void)d;
    memset(y, 0, sizeof(float) * (size_t)(outer * r * inner));
    for (o = 0; o < outer; o++)
        for (i = 0; i < inner; i++) {
            int64_t k = idx[o * inner + i];
            if (k >= 0 && k < r) y[(o * r + k) * inner + i] = 1.0f;
        }
}

typedef struct dl__copy_args {
    size_t esize; int ndim; const int64_t *shape; char *dst; const int64_t *ds;
    const char *src; const int64_t *ss;
} dl__copy_args;

static void dl__copy_task(void *p, int64_t lo, int64_t hi)
{
    const dl__copy_args *u = (const dl__copy_args *)p;
    int last = u->ndim - 1;
    int64_t row = u->shape[last], r, i, sd = u->ds[last], ss = u->ss[last];
    for (r = lo; r < hi; r++) {
        int64_t od = 0, os = 0, rem = r;
        int d;
        for (d = last - 1; d >= 0; d--) {
            int64_t k = rem % u->shape[d];
            rem /= u->shape[d];
            od += k * u->ds[d];
            os += k * u->ss[d];
        }
        if (u->esize == 4) {
            float *dp = (float *)u->dst + od;
            const float *sp = (const float *)u->src + os;
            if (sd == 1 && ss == 1) memcpy(dp, sp, 4 * (size_t)row);
            else for (i = 0; i < row; i++) dp[i * sd] = sp[i * ss];
        } else {
            int64_t *dp = (int64_t *)u->dst + od;
            const int64_t *sp = (const int64_t *)u->src + os;
            for (i = 0; i < row; i++) dp[i * sd] = sp[i * ss];
        }
    }
}

static void dl__cpu_copy_nd(dl__dev *d, size_t esize, int ndim, const int64_t *shape, void *dst,
                            const int64_t *ds, const void *src, const int64_t *ss)
{
    dst = (void *)DL__RAW(d, dst);
    src = (const void *)DL__RAW(d, src);
    dl__copy_args u;
    int64_t rows = 1, one = 1, zero = 0;
    int k;
    if (ndim == 0) { ndim = 1; shape = &one; ds = &zero; ss = &zero; }
    for (k = 0; k < ndim - 1; k++) rows *= shape[k];
    if (shape[ndim - 1] == 0 || rows == 0) return;
    u.esize = esize; u.ndim = ndim; u.shape = shape; u.dst = (char *)dst; u.ds = ds;
    u.src = (const char *)src; u.ss = ss;
    dl__parallel_for(d->ctx->pool, rows, (1 << 14) / shape[ndim - 1] + 1, dl__copy_task, &u);
}

static void dl__cpu_fill(dl__dev *d, float *y, int64_t n, float v)
{
    y = (float *)DL__RAW(d, y);
    int64_t i;
    (void)d;
    for (i = 0; i < n; i++) y[i] = v;
}

static void dl__cpu_axpy(dl__dev *d, float *y, const float *x, int64_t n, float alpha)
{
    y = (float *)DL__RAW(d, y);
    x = (const float *)DL__RAW(d, x);
    int64_t i;
    (void)d;
    if (alpha == 1.0f) for (i = 0; i < n; i++) y[i] += x[i];
    else for (i = 0; i < n; i++) y[i] += alpha * x[i];
}

static void dl__cpu_gemm(dl__dev *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb,
                         int64_t sB, float beta, float *C, int64_t ldc, int64_t sC, int64_t batch)
{
    A = (const float *)DL__RAW(d, A);
    B = (const float *)DL__RAW(d, B);
    C = (float *)DL__RAW(d, C);
    int64_t i;
    for (i = 0; i < batch; i++) {
#ifdef DL_OPENBLAS
        if (M > 0 && N > 0 && K > 0 && M < INT32_MAX && N < INT32_MAX && K < INT32_MAX) {
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                        (int)M, (int)N, (int)K, alpha, A + i * sA, (int)lda, B + i * sB, (int)ldb,
                        beta, C + i * sC, (int)ldc);
            continue;
        }
#endif
        dl__sgemm(d->ctx->pool, ta, tb, M, N, K, alpha, A + i * sA, lda, B + i * sB, ldb, beta,
                  C + i * sC, ldc);
    }
}

typedef struct dl__sm_args { bool log; float *y; const float *x; int64_t n, inner; } dl__sm_args;

static void dl__sm_task(void *p, int64_t lo, int64_t hi)
{
    const dl__sm_args *u = (const dl__sm_args *)p;
    int64_t j, k, n = u->n, in = u->inner;
    for (j = lo; j < hi; j++) {
        int64_t o = j / in, i = j % in;
        const float *x = u->x + o * n * in + i;
        float *y = u->y + o * n * in + i;
        float m = -INFINITY;
        double s = 0;
        for (k = 0; k < n; k++) if (x[k * in] > m) m = x[k * in];
        if (m == -INFINITY) m = 0;   /* all -inf: exp gives zeros, log gives -inf */
        for (k = 0; k < n; k++) s += exp((double)(x[k * in] - m));
        if (u->log) {
            float ls = (float)log(s);
            for (k = 0; k < n; k++) y[k * in] = x[k * in] - m - ls;
        } else {
            float inv = (float)(1.0 / s);
            for (k = 0; k < n; k++) y[k * in] = expf(x[k * in] - m) * inv;
        }
    }
}

static void dl__cpu_softmax(dl__dev *d, bool log, float *y, const float *x, int64_t outer,
                            int64_t n, int64_t inner)
{
    y = (float *)DL__RAW(d, y);
    x = (const float *)DL__RAW(d, x);
    dl__sm_args u;
    u.log = log; u.y = y; u.x = x; u.n = n; u.inner = inner;
    dl__parallel_for(d->ctx->pool, outer * inner, (1 << 14) / (n + 1) + 1, dl__sm_task, &u);
}

static int64_t dl__cpu_nonfinite(dl__dev *d, const float *x, int64_t n)
{
    x = (const float *)DL__RAW(d, x);
    int64_t i;
    (void)d;
    for (i = 0; i < n; i++) if (!(x[i] - x[i] == 0.0f)) return i;
    return -1;
}


static int64_t dl__cpu_class_mask(dl__dev *d, float *onehot, float *valid, const void *target,
                                     bool i64, int64_t outer, int64_t C, int64_t inner,
                                     int64_t ignore_index, int64_t *bad)
{
    onehot = (float *)DL__RAW(d, onehot);
    valid = (float *)DL__RAW(d, valid);
    target = (const void *)DL__RAW(d, target);
    int64_t o, i;
    (void)d;
    if (outer > 0 && C > 0 && inner > 0) memset(onehot, 0, sizeof(float) * (size_t)(outer * C * inner));
    for (o = 0; o < outer; o++)
        for (i = 0; i < inner; i++) {
            int64_t j = o * inner + i;
            int64_t t = i64 ? ((const int64_t *)target)[j] : (int64_t)((const int32_t *)target)[j];
            if (t == ignore_index) { valid[j] = 0.0f; continue; }
            if (t < 0 || t >= C) { *bad = t; return j; }
            valid[j] = 1.0f;
            onehot[(o * C + t) * inner + i] = 1.0f;
        }
    return -1;
}

typedef struct dl__drop_args { float *mask; float p, scale; uint64_t seed, offset; } dl__drop_args;

static void dl__drop_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__drop_args *u = (const dl__drop_args *)arg;
    int64_t i;
    for (i = lo; i < hi; i++)
        u->mask[i] = dl__rng_uniform01(u->seed, u->offset + (uint64_t)i) < u->p ? 0.0f : u->scale;
}

static void dl__cpu_dropout_mask(dl__dev *d, float *mask, int64_t n, float p, float scale,
                                 uint64_t seed, uint64_t offset)
{
    dl__drop_args u;
    mask = (float *)DL__RAW(d, mask);
    u.mask = mask; u.p = p; u.scale = scale; u.seed = seed; u.offset = offset;
    dl__parallel_for(d->ctx->pool, n, 1 << 15, dl__drop_task, &u);
}

typedef struct dl__nn_bce_args { float *out; const float *x, *y; } dl__nn_bce_args;

static void dl__nn_bce_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__nn_bce_args *u = (const dl__nn_bce_args *)arg;
    int64_t i;
    for (i = lo; i < hi; i++) {
        float x = u->x[i];
        u->out[i] = (x > 0 ? x : 0.0f) - x * u->y[i] + log1pf(expf(-fabsf(x)));
    }
}

static void dl__cpu_bce_logits(dl__dev *d, float *out, const float *x, const float *y, int64_t n)
{
    out = (float *)DL__RAW(d, out);
    x = (const float *)DL__RAW(d, x);
    y = (const float *)DL__RAW(d, y);
    dl__nn_bce_args u;
    u.out = out; u.x = x; u.y = y;
    dl__parallel_for(d->ctx->pool, n, 1 << 15, dl__nn_bce_task, &u);
}


/* Outputs o in [*lo, *hi) are those with 0 <= o*s + off < in (o < out). */
static void dl__crange(int64_t off, int64_t s, int64_t in, int64_t out, int64_t *lo, int64_t *hi)
{
    int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t b = in - off <= 0 ? 0 : (in - off - 1) / s + 1;
    if (b > out) b = out;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* The windows of one kernel offset kk: the output range [l, h) of each
   dim whose input o*s + off lies inside the input (outside it: padding) */
typedef struct dl__krange { int64_t off[3], l[3], h[3]; } dl__krange;

static void dl__krange_make(const dl__cgeom *g, int64_t kk, dl__krange *k)
{
    int64_t kd[3], i;
    kd[2] = kk % g->k[2];
    kd[1] = (kk / g->k[2]) % g->k[1];
    kd[0] = kk / (g->k[2] * g->k[1]);
    for (i = 0; i < 3; i++) {
        k->off[i] = kd[i] * g->d[i] - g->p[i];
        dl__crange(k->off[i], g->s[i], g->ia[i], g->ib[i], &k->l[i], &k->h[i]);
    }
    if (k->l[1] >= k->h[1] || k->l[2] >= k->h[2]) k->l[0] = k->h[0] = 0;   /* all padding */
}

typedef struct dl__i2c_args { float *col; const float *x; int64_t n; const dl__cgeom *g; } dl__i2c_args;

/* col rows ((channel, kernel offset), sample) [lo, hi): each written once,
   zeros where the window lies in the padding; the geometry of a (channel,
   kernel offset) pair is worked out once for its run of samples, and rows
   are copied by inline loops (most are a few floats long) */
static void dl__im2col_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__i2c_args *u = (const dl__i2c_args *)arg;
    const dl__cgeom *g = u->g;
    const int64_t ib1 = g->ib[1], ib2 = g->ib[2], s1 = g->s[1], s2 = g->s[2], P = ib1 * ib2;
    const int64_t rs1 = g->ia[2], rs0 = g->ia[1] * g->ia[2];
    int64_t r = lo;
    while (r < hi) {
        int64_t q = r / u->n, n0 = r % u->n, n1 = u->n - n0 < hi - r ? u->n : n0 + (hi - r), nn;
        int64_t c = q / g->K, o0, o1, o2, l2, h2, off2;
        dl__krange k;
        dl__krange_make(g, q % g->K, &k);
        l2 = k.l[2];
        h2 = k.h[2];
        off2 = k.off[2];
        for (nn = n0; nn < n1; nn++) {
            const float *x = u->x + (nn * g->Ca + c) * g->La;
            float *dst = u->col + (q * u->n + nn) * g->Lb;
            if (k.l[0] > 0) memset(dst, 0, sizeof(float) * (size_t)(k.l[0] * P));
            for (o0 = k.l[0]; o0 < k.h[0]; o0++) {
                float *d0 = dst + o0 * P;
                const float *x0 = x + (o0 * g->s[0] + k.off[0]) * rs0;
                if (k.l[1] > 0) memset(d0, 0, sizeof(float) * (size_t)(k.l[1] * ib2));
                for (o1 = k.l[1]; o1 < k.h[1]; o1++) {
                    float *DL__RESTRICT dr = d0 + o1 * ib2;
                    const float *DL__RESTRICT xr = x0 + (o1 * s1 + k.off[1]) * rs1;
                    for (o2 = 0; o2 < l2; o2++) dr[o2] = 0.0f;
                    if (s2 == 1)
                        for (o2 = l2; o2 < h2; o2++) dr[o2] = xr[o2 + off2];
                    else
                        for (o2 = l2; o2 < h2; o2++) dr[o2] = xr[o2 * s2 + off2];
                    for (o2 = h2; o2 < ib2; o2++) dr[o2] = 0.0f;
                }
                if (k.h[1] < ib1) memset(d0 + k.h[1] * ib2, 0, sizeof(float) * (size_t)((ib1 - k.h[1]) * ib2));
            }
            if (k.h[0] * P < g->Lb)
                memset(dst + k.h[0] * P, 0, sizeof(float) * (size_t)(g->Lb - k.h[0] * P));
        }
        r += n1 - n0;
    }
}

/* Small planes (ResNet's 7x7 and 4x4 stages, strided convs): most rows
   are a few floats, and the per-row geometry above costs more than the
   copy. There a table gives, for every (kernel offset, output position),
   the index in the input plane, or La (a zero slot past the plane) where
   the window lies in the padding; each (sample, channel) plane is copied
   once into a buffer with that zero slot, and every row is gathered from
   it; col2im scatters each row into a zeroed plane, or (stride 1, where
   each offset reads most of the plane) gathers every plane element's value
   at each offset. The same values (im2col) and the same additions in the
   same order (col2im), so the same bits as the row loops (test_conv
   section 6). The tables live in step host memory for the call; the
   per-plane buffers on the stack (at most DL__I2C_TAB floats). Measured on
   the small ResNet (batch 256, one thread): its 4x4 conv forward 10.3 ->
   6.9 ms, backward 20.9 -> 15.1 ms; the training step 435 -> 384 ms. */
#ifndef DL__I2C_TAB
#define DL__I2C_TAB 4096   /* most K * Lb entries (and La floats) for the table path */
#endif

typedef struct dl__i2t_args {
    float *out;
    const float *in;
    int64_t n;
    const dl__cgeom *g;
    const int32_t *idx;   /* (K, Lb): the input index of each output position, La: padding */
    const int32_t *inv;   /* col2im, or NULL: (K, La), the index in the plane's K rows, K*Lb: none */
} dl__i2t_args;

static bool dl__i2c_tab_ok(const dl__cgeom *g)
{
    return g->K * g->Lb <= DL__I2C_TAB && g->La < DL__I2C_TAB && g->ib[2] < 32;
}

static void dl__i2c_tab_make(const dl__cgeom *g, int32_t *idx)
{
    const int64_t rs1 = g->ia[2], rs0 = g->ia[1] * g->ia[2];
    int64_t kk, o0, o1, o2;
    for (kk = 0; kk < g->K; kk++) {
        dl__krange k;
        int32_t *t = idx + kk * g->Lb;
        dl__krange_make(g, kk, &k);
        for (o0 = 0; o0 < g->ib[0]; o0++)
            for (o1 = 0; o1 < g->ib[1]; o1++)
                for (o2 = 0; o2 < g->ib[2]; o2++) {
                    bool in = o0 >= k.l[0] && o0 < k.h[0] && o1 >= k.l[1] && o1 < k.h[1] && o2 >= k.l[2] &&
                              o2 < k.h[2];
                    *t++ = (int32_t)(in ? (o0 * g->s[0] + k.off[0]) * rs0 + (o1 * g->s[1] + k.off[1]) * rs1 +
                                              o2 * g->s[2] + k.off[2]
                                        : g->La);
                }
    }
}

/* col2im's gather table: inv (K, La), the index kk*Lb + j of the output
   position j that reads input i at kernel offset kk, or K*Lb (none) */
static void dl__i2c_tab_invert(const dl__cgeom *g, const int32_t *idx, int32_t *inv)
{
    int64_t kk, j;
    for (j = 0; j < g->K * g->La; j++) inv[j] = (int32_t)(g->K * g->Lb);
    for (kk = 0; kk < g->K; kk++)
        for (j = 0; j < g->Lb; j++)
            if (idx[kk * g->Lb + j] < g->La) inv[kk * g->La + idx[kk * g->Lb + j]] = (int32_t)(kk * g->Lb + j);
}

/* (channel, sample) units [lo, hi): the K rows of each */
static void dl__im2col_tab_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__i2t_args *u = (const dl__i2t_args *)arg;
    const dl__cgeom *g = u->g;
    const int64_t Lb = g->Lb, La = g->La, K = g->K, n = u->n;
    float xz[DL__I2C_TAB];
    int64_t q, kk, j;
    xz[La] = 0.0f;
    for (q = lo; q < hi; q++) {
        int64_t c = q / n, nn = q % n;
        memcpy(xz, u->in + (nn * g->Ca + c) * La, sizeof(float) * (size_t)La);
        for (kk = 0; kk < K; kk++) {
            float *DL__RESTRICT dst = u->out + ((c * K + kk) * n + nn) * Lb;
            const int32_t *DL__RESTRICT t = u->idx + kk * Lb;
            for (j = 0; j < Lb; j++) dst[j] = xz[t[j]];
        }
    }
}

/* planes (sample, channel) [lo, hi): zero, then every kernel offset added
   in increasing order, as dl__col2im_task. With inv (stride 1: each
   offset's windows cover most of the plane) the plane's K rows are copied
   into a buffer with a zero slot and each element gathers its value at
   every offset (inv: the buffer index, or the zero slot; adding that +0
   leaves the same bits, as the sum starts at +0 and is never -0); else
   each row is scattered into the plane through idx. */
static void dl__col2im_tab_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__i2t_args *u = (const dl__i2t_args *)arg;
    const dl__cgeom *g = u->g;
    const int64_t Lb = g->Lb, La = g->La, K = g->K, n = u->n;
    float buf[DL__I2C_TAB + 1];
    int64_t q, kk, i;
    buf[K * Lb] = 0.0f;
    for (q = lo; q < hi; q++) {
        int64_t nn = q / g->Ca, c = q % g->Ca;
        float *DL__RESTRICT x = u->out + q * La;
        if (u->inv) {
            for (kk = 0; kk < K; kk++)
                memcpy(buf + kk * Lb, u->in + ((c * K + kk) * n + nn) * Lb, sizeof(float) * (size_t)Lb);
            for (i = 0; i < La; i++) x[i] = 0.0f;
            for (kk = 0; kk < K; kk++) {
                const int32_t *DL__RESTRICT t = u->inv + kk * La;
                for (i = 0; i < La; i++) x[i] += buf[t[i]];
            }
            continue;
        }
        for (i = 0; i <= La; i++) buf[i] = 0.0f;
        for (kk = 0; kk < K; kk++) {
            const float *DL__RESTRICT src = u->in + ((c * K + kk) * n + nn) * Lb;
            const int32_t *DL__RESTRICT t = u->idx + kk * Lb;
            for (i = 0; i < Lb; i++) buf[t[i]] += src[i];
        }
        memcpy(x, buf, sizeof(float) * (size_t)La);
    }
}

/* the row loops, for every geometry (the table path's reference in tests) */
static void dl__cpu_im2col_rows(dl__dev *d, float *col, const float *x, int64_t n, const dl__cgeom *g)
{
    col = (float *)DL__RAW(d, col);
    x = (const float *)DL__RAW(d, x);
    dl__i2c_args u;
    u.col = col; u.x = x; u.n = n; u.g = g;
    dl__parallel_for(d->ctx->pool, n * g->Ca * g->K, (1 << 14) / (g->Lb + 1) + 1, dl__im2col_task, &u);
}

/* im2col (c2i false) or col2im through the tables; false, with nothing
   done, where they do not apply or find no memory (the loops then) */
static bool dl__i2c_tab_run(dl__dev *d, float *out, const float *in, int64_t n, const dl__cgeom *g, bool c2i)
{
    dl_ctx *ctx = d->ctx;
    dl__hmark m = dl__hmark_get(ctx);
    bool gather = c2i && g->La <= 2 * g->Lb;   /* col2im reading most of the plane at every offset */
    int32_t *idx = dl__i2c_tab_ok(g) ? (int32_t *)dl__halloc(ctx, sizeof(int32_t) *
                                                             (size_t)(g->K * (g->Lb + (gather ? g->La : 0)))) : NULL;
    dl__i2t_args u;
    if (!idx) return false;
    dl__i2c_tab_make(g, idx);
    u.inv = NULL;
    if (gather) {
        u.inv = idx + g->K * g->Lb;
        dl__i2c_tab_invert(g, idx, idx + g->K * g->Lb);
    }
    u.out = (float *)DL__RAW(d, out);
    u.in = (const float *)DL__RAW(d, in);
    u.n = n; u.g = g; u.idx = idx;
    dl__parallel_for(ctx->pool, n * g->Ca, (1 << 14) / (g->K * g->Lb + 1) + 1,
                     c2i ? dl__col2im_tab_task : dl__im2col_tab_task, &u);
    dl__hrewind(ctx, m);
    return true;
}

static void dl__cpu_im2col(dl__dev *d, float *col, const float *x, int64_t n, const dl__cgeom *g)
{
    if (!dl__i2c_tab_run(d, col, x, n, g, false)) dl__cpu_im2col_rows(d, col, x, n, g);
}

#define DL__C2I_KB 32   /* kernel offsets whose windows a col2im task keeps at hand */

/* planes (sample, channel) [lo, hi) of x: zeroed, then every kernel offset
   added in increasing order (a fixed accumulation order, whatever the split) */
static void dl__col2im_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__i2c_args *u = (const dl__i2c_args *)arg;
    const dl__cgeom *g = u->g;
    const int64_t ib1 = g->ib[1], ib2 = g->ib[2], s1 = g->s[1], s2 = g->s[2], P = ib1 * ib2;
    const int64_t rs1 = g->ia[2], rs0 = g->ia[1] * g->ia[2];
    dl__krange kr[DL__C2I_KB];
    int64_t q, kb, j;
    memset(u->col + lo * g->La, 0, sizeof(float) * (size_t)((hi - lo) * g->La));   /* (col: the output here) */
    for (kb = 0; kb < g->K; kb += DL__C2I_KB) {
        int64_t kn = g->K - kb < DL__C2I_KB ? g->K - kb : DL__C2I_KB;
        for (j = 0; j < kn; j++) dl__krange_make(g, kb + j, &kr[j]);
        for (q = lo; q < hi; q++) {
            float *x = u->col + q * g->La;
            int64_t n = q / g->Ca, c = q % g->Ca;
            for (j = 0; j < kn; j++) {
                const dl__krange *k = &kr[j];
                const float *src = u->x + ((c * g->K + kb + j) * u->n + n) * g->Lb;
                int64_t o0, o1, o2, l2 = k->l[2], h2 = k->h[2], off2 = k->off[2];
                for (o0 = k->l[0]; o0 < k->h[0]; o0++) {
                    float *x0 = x + (o0 * g->s[0] + k->off[0]) * rs0;
                    const float *s0 = src + o0 * P;
                    for (o1 = k->l[1]; o1 < k->h[1]; o1++) {
                        float *DL__RESTRICT xr = x0 + (o1 * s1 + k->off[1]) * rs1;
                        const float *DL__RESTRICT sr = s0 + o1 * ib2;
                        if (s2 == 1)
                            for (o2 = l2; o2 < h2; o2++) xr[o2 + off2] += sr[o2];
                        else
                            for (o2 = l2; o2 < h2; o2++) xr[o2 * s2 + off2] += sr[o2];
                    }
                }
            }
        }
    }
}

static void dl__cpu_col2im_rows(dl__dev *d, float *x, const float *col, int64_t n, const dl__cgeom *g)
{
    x = (float *)DL__RAW(d, x);
    col = (const float *)DL__RAW(d, col);
    dl__i2c_args u;
    u.col = x; u.x = col; u.n = n; u.g = g;
    dl__parallel_for(d->ctx->pool, n * g->Ca, (1 << 14) / (g->K * g->Lb + 1) + 1, dl__col2im_task, &u);
}

static void dl__cpu_col2im(dl__dev *d, float *x, const float *col, int64_t n, const dl__cgeom *g)
{
    if (!dl__i2c_tab_run(d, x, col, n, g, true)) dl__cpu_col2im_rows(d, x, col, n, g);
}

typedef struct dl__s1_args {
    const dl__cgeom *g;
    const dl__s1geom *q;
    float *xp;           /* padded input grid (Ca, n*Pa) */
    const float *x;      /* input (n, Ca, ia...) */
    float *grid;         /* the output side on the grid (Cb, n*Pa) */
    float *y;            /* output (n, Cb, ib...) */
    const float *gy;     /* output gradient (n, Cb, ib...) */
    const float *bias;
    float *wt;           /* flipped weights (Cb, Ca, K) */
    const float *w;      /* weights as given, (Ca, Cb, K) */
    int64_t n;
} dl__s1_args;

/* grid planes (c, sample) [lo, hi): zeros, then the input rows at the padding offset */
static void dl__s1_pad_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__s1_args *u = (const dl__s1_args *)arg;
    const dl__cgeom *g = u->g;
    const dl__s1geom *q = u->q;
    int64_t r, i0, i1, m = q->P[2] - g->p[2] < g->ia[2] ? q->P[2] - g->p[2] : g->ia[2];
    for (r = lo; r < hi; r++) {
        float *dst = u->xp + r * q->Pa;
        const float *src = u->x + ((r % u->n) * g->Ca + r / u->n) * g->La;
        memset(dst, 0, sizeof(float) * (size_t)q->Pa);
        if (m <= 0) continue;
        for (i0 = 0; i0 < g->ia[0] && i0 + g->p[0] < q->P[0]; i0++)
            for (i1 = 0; i1 < g->ia[1] && i1 + g->p[1] < q->P[1]; i1++)
                memcpy(dst + (i0 + g->p[0]) * q->S[0] + (i1 + g->p[1]) * q->S[1] + g->p[2],
                       src + (i0 * g->ia[1] + i1) * g->ia[2], sizeof(float) * (size_t)m);
    }
}

/* output planes (sample, channel) [lo, hi): the valid grid positions, + bias */
static void dl__s1_out_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__s1_args *u = (const dl__s1_args *)arg;
    const dl__cgeom *g = u->g;
    const dl__s1geom *q = u->q;
    int64_t r, o0, o1, o2, ib2 = g->ib[2];
    for (r = lo; r < hi; r++) {
        int64_t nn = r / g->Cb, c = r % g->Cb;
        float b = u->bias ? u->bias[c] : 0.0f;
        const float *src = u->grid + (c * u->n + nn) * q->Pa;
        float *dst = u->y + r * g->Lb;
        for (o0 = 0; o0 < g->ib[0]; o0++)
            for (o1 = 0; o1 < g->ib[1]; o1++) {
                const float *DL__RESTRICT sr = src + o0 * q->S[0] + o1 * q->S[1];
                float *DL__RESTRICT dr = dst + (o0 * g->ib[1] + o1) * ib2;
                if (u->bias)
                    for (o2 = 0; o2 < ib2; o2++) dr[o2] = sr[o2] + b;
                else
                    for (o2 = 0; o2 < ib2; o2++) dr[o2] = sr[o2];
            }
    }
}

/* wt (Cb, Ca, K)[o][i][kk] = w (Ca, Cb, K)[i][o][K-1-kk], rows o in [lo, hi) */
static void dl__s1_flip_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__s1_args *u = (const dl__s1_args *)arg;
    const dl__cgeom *g = u->g;
    int64_t o, i, kk, K = g->K;
    for (o = lo; o < hi; o++)
        for (i = 0; i < g->Ca; i++)
            for (kk = 0; kk < K; kk++) u->wt[(o * g->Ca + i) * K + kk] = u->w[(i * g->Cb + o) * K + K - 1 - kk];
}

/* brow[c*K + kk] = the start of row (c, kk) of the implicit im2col matrix
   of n samples in the padded grid; returns its columns: up to the last one
   a valid output needs, so that a row reads at most up to the end of plane
   (c, n-1) (off(kk) + o.S < Pa) */
static int64_t dl__s1_rows(const dl__cgeom *g, const dl__s1geom *q, int64_t n, int64_t *brow)
{
    int64_t c, kk;
    for (c = 0; c < g->Ca; c++)
        for (kk = 0; kk < g->K; kk++) {
            int64_t k2 = kk % g->k[2], k1 = (kk / g->k[2]) % g->k[1], k0 = kk / (g->k[2] * g->k[1]);
            brow[c * g->K + kk] = c * n * q->Pa + k0 * g->d[0] * q->S[0] + k1 * g->d[1] * q->S[1] + k2 * g->d[2];
        }
    return (n - 1) * q->Pa + (g->ib[0] - 1) * q->S[0] + (g->ib[1] - 1) * q->S[1] + g->ib[2];
}

/* What both entries start with, scratch laid out as the row table, the
   padded input, the output side's grid and (flip) the flipped weights:
   fills u, pads x into its grid, writes the row table; returns its columns */
static int64_t dl__s1_begin(dl__pool *pool, const dl__cgeom *g, const dl__s1geom *q, dl__s1_args *u,
                            const float *x, float *scratch, int64_t n, int64_t **brow)
{
    memset(u, 0, sizeof *u);
    u->g = g;
    u->q = q;
    u->x = x;
    u->n = n;
    *brow = (int64_t *)(void *)scratch;
    u->xp = scratch + 2 * g->Ca * g->K + 16;
    u->grid = u->xp + g->Ca * n * q->Pa;
    dl__parallel_for(pool, g->Ca * n, 1 + (1 << 14) / (q->Pa + 1), dl__s1_pad_task, u);
    return dl__s1_rows(g, q, n, *brow);
}

static void dl__cpu_conv_s1_grid(dl__dev *d, float *y, const float *x, const float *w, const float *bias,
                                 float *scratch, int64_t n, const dl__cgeom *g, bool flip)
{
    dl__s1geom q;
    dl__s1_args u;
    dl__pool *pool = d->ctx->pool;
    int64_t *brow, cols;
    const float *A;
    if (!dl__s1_make(g, &q) || n <= 0) return;    /* the caller checked */
    cols = dl__s1_begin(pool, g, &q, &u, (const float *)DL__RAW(d, x), (float *)DL__RAW(d, scratch), n, &brow);
    u.y = (float *)DL__RAW(d, y);
    u.bias = (const float *)DL__RAW0(d, bias);
    u.w = A = (const float *)DL__RAW(d, w);
    if (flip) {
        u.wt = u.grid + g->Cb * n * q.Pa;
        dl__parallel_for(pool, g->Cb, 1 + (1 << 14) / (g->Ca * g->K + 1), dl__s1_flip_task, &u);
        A = u.wt;
    }
    dl__sgemm_rows(pool, false, false, g->Cb, cols, g->Ca * g->K, 1.0f, A, g->Ca * g->K, u.xp, 0, brow, 0.0f,
                   u.grid, n * q.Pa);
    dl__parallel_for(pool, n * g->Cb, 1 + (1 << 14) / (g->Lb + 1), dl__s1_out_task, &u);
}

/* grid planes (channel, sample) [lo, hi) of the output side: zeros, then
   the rows of gy at their grid positions (the inverse of dl__s1_out_task) */
static void dl__s1_grid_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__s1_args *u = (const dl__s1_args *)arg;
    const dl__cgeom *g = u->g;
    const dl__s1geom *q = u->q;
    int64_t r, o0, o1, ib2 = g->ib[2];
    for (r = lo; r < hi; r++) {
        float *dst = u->grid + r * q->Pa;
        const float *src = u->gy + ((r % u->n) * g->Cb + r / u->n) * g->Lb;
        memset(dst, 0, sizeof(float) * (size_t)q->Pa);
        for (o0 = 0; o0 < g->ib[0]; o0++)
            for (o1 = 0; o1 < g->ib[1]; o1++)
                memcpy(dst + o0 * q->S[0] + o1 * q->S[1], src + (o0 * g->ib[1] + o1) * ib2, sizeof(float) * (size_t)ib2);
    }
}

static bool dl__cpu_conv_s1_wgrad_grid(dl__dev *d, float *dw, const float *x, const float *gy, float *scratch,
                                       int64_t n, const dl__cgeom *g, float beta)
{
    dl__s1geom q;
    dl__s1_args u;
    dl__pool *pool = d->ctx->pool;
    int64_t *brow, cols;
    if (!dl__s1_make(g, &q) || n <= 0) return true;    /* the caller checked */
    if (dl__cpu_nonfinite(d, x, n * g->Ca * g->La) >= 0) return false;
    cols = dl__s1_begin(pool, g, &q, &u, (const float *)DL__RAW(d, x), (float *)DL__RAW(d, scratch), n, &brow);
    u.gy = (const float *)DL__RAW(d, gy);          /* gy onto the grid, zeros in the margins */
    dl__parallel_for(pool, g->Cb * n, 1 + (1 << 14) / (q.Pa + 1), dl__s1_grid_task, &u);
    /* dw (Cb, Ca*K) = beta dw + grid (Cb, cols) @ B^T, row (c, kk) of B the shifted view of the padded input */
    dl__sgemm_rows(pool, false, true, g->Cb, g->Ca * g->K, cols, 1.0f, u.grid, n * q.Pa, u.xp, 0, brow, beta,
                   (float *)DL__RAW(d, dw), g->Ca * g->K);
    return true;
}

/* op(A) (M, K) packed whole for dl__gemm_strip: K blocks of kc, block pc
   at dst + pc round_up(M, MR) */
static void dl__gemm_pack_all(bool transa, const float *A, int64_t lda, int64_t M, int64_t K, int64_t kc, float *dst)
{
    int64_t pc;
    for (pc = 0; pc < K; pc += kc)
        dl__gemm_pack_a(transa, A, lda, 0, M, pc, K - pc < kc ? K - pc : kc, dst + pc * dl__round_up(M, DL__GEMM_MR));
}

/* C[0:M, 0:nr) (row stride ldc) = A B over all of K, A packed whole
   (dl__gemm_pack_all), B's row p at b + p bs, or with boff at b + boff[p]
   (bs 0); whole vectors of a row are read */
static void dl__gemm_strip(const float *ap, int64_t M, int64_t K, int64_t kc, const float *b, int64_t bs,
                           const int64_t *boff, float *c, int64_t ldc, int nr)
{
    int64_t Mup = dl__round_up(M, DL__GEMM_MR), pc, ir;
    for (pc = 0; pc < K; pc += kc) {
        int64_t kb = K - pc < kc ? K - pc : kc;
        for (ir = 0; ir < M; ir += DL__GEMM_MR)
            dl__gemm_kernel(kb, ap + pc * Mup + ir * kb, b + pc * bs, bs, boff ? boff + pc : NULL, c + ir * ldc, ldc,
                            (int)(M - ir < DL__GEMM_MR ? M - ir : DL__GEMM_MR), nr, 1.0f, pc ? 1.0f : 0.0f);
    }
}

/* rows [lo, hi) of y (rows of L, C channels in turn) += their channel's b */
static void dl__bias_rows(float *y, const float *b, int64_t C, int64_t L, int64_t lo, int64_t hi)
{
    int64_t r, i;
    for (r = lo; r < hi; r++) {
        float v = b[r % C], *DL__RESTRICT yr = y + r * L;
        for (i = 0; i < L; i++) yr[i] += v;
    }
}

/* The row variant of the padded-grid path, for 1-d and 2-d convs (the CPU
   takes it where it applies: dl__s1r_make). The grid pays GEMM columns
   for its margins (a valid 5x5 conv on 14x14 planes: 196 columns for 100
   outputs) and copies the outputs out. Here each sample's input is copied
   k2 times, once per kernel column kw, into planes of P1 = ib1 + d1(k1-1)
   padded rows cut to the output's width W = ib2:
       X[c, kw][r][j] = xpad[r][j + kw d2]        (zeros in the padding)
   so that row (c, kh, kw) of im2col's matrix is the plain run of
   Lb = ib1 W floats at X[c, kw] + kh d1 W: the GEMM has exactly the
   output's columns and writes the sample's (Cb, Lb) block in place in y.
   The copy (k2 P1/ib1 times the sample's input) is made by the thread that
   multiplies it, into its own buffer, so it stays in its cache. Forward and
   input gradient (flip): one sample at a time, the same sums in the same
   order as im2col (the same bits). Weight gradient (the dot path's tiles,
   AVX-512): threads split dw's columns; each walks the samples in chunks,
   copying the planes of its channels, and sums each sample's products
   lane-wise with the accumulators parked between chunks. */
typedef struct dl__s1r {
    int64_t P1, W, Pr;  /* padded rows, row width, floats per (c, kw) plane */
    int64_t per;        /* floats of one sample's planes: Ca k2 Pr */
} dl__s1r;

/* Ca k2 Pr floats per sample at most (the thread buffers) */
#ifndef DL__S1R_MAX_PER
#define DL__S1R_MAX_PER ((int64_t)1 << 20)
#endif
/* the weight gradient's samples per chunk: their planes and gy in about this many floats
   (measured: 128 KiB beat 32 KiB and 512 KiB on LeNet's convs) */
#ifndef DL__S1R_CHUNK
#define DL__S1R_CHUNK ((int64_t)1 << 15)
#endif

/* whether the row variant applies to g (stride 1, no groups: dl__s1_make said yes) */
static bool dl__s1r_make(const dl__cgeom *g, dl__s1r *r)
{
    if (g->ia[0] != 1 || g->ib[0] != 1 || g->k[0] != 1 || g->p[0] != 0 || g->Ca * g->k[2] <= 0) return false;
    r->P1 = g->ib[1] + g->d[1] * (g->k[1] - 1);
    r->W = g->ib[2];
    r->Pr = r->P1 * r->W;
    return r->Pr <= DL__S1R_MAX_PER / (g->Ca * g->k[2]) && (r->per = g->Ca * g->k[2] * r->Pr) > 0;
}

/* d[0:n) = s[0:n) (a short run: a masked vector at the end) */
static void dl__copy_run(float *DL__RESTRICT d, const float *DL__RESTRICT s, int64_t n)
{
#if defined(DL__GEMM_AVX512)
    for (; n >= 16; n -= 16, d += 16, s += 16) _mm512_storeu_ps(d, _mm512_loadu_ps(s));
    if (n > 0) {
        const __mmask16 m = (__mmask16)((1u << n) - 1u);
        _mm512_mask_storeu_ps(d, m, _mm512_maskz_loadu_ps(m, s));
    }
#else
    if (n > 0) memcpy(d, s, sizeof(float) * (size_t)n);
#endif
}

/* The input's runs of the planes of channels [c0, c1) of one sample x
   (Ca, ia1, ia2), plane (c, kw) at dst + ((c - c0) k2 + kw) Pr. The
   padding is never written: the buffer was zeroed once (it is the same
   for every sample). */
static void dl__s1r_fill(const dl__cgeom *g, const dl__s1r *r, float *dst, const float *x, int64_t c0, int64_t c1)
{
    int64_t c, kw, ih, ia1 = g->ia[1], ia2 = g->ia[2], W = r->W, p1 = g->p[1];
    int64_t nh = ia1 < r->P1 - p1 ? ia1 : r->P1 - p1;   /* input rows inside the planes */
    for (c = c0; c < c1; c++)
        for (kw = 0; kw < g->k[2]; kw++) {
            int64_t sh = kw * g->d[2] - g->p[2];         /* column j reads iw = j + sh */
            int64_t j0 = sh < 0 ? -sh : 0, j1 = ia2 - sh < W ? ia2 - sh : W;
            float *d = dst + ((c - c0) * g->k[2] + kw) * r->Pr + p1 * W + j0;
            const float *src = x + c * ia1 * ia2 + sh + j0;
            if (j1 > j0)
                for (ih = 0; ih < nh; ih++, d += W, src += ia2) dl__copy_run(d, src, j1 - j0);
        }
}

typedef struct dl__s1r_job {
    const dl__cgeom *g;
    dl__s1r r;
    const float *x, *gy, *bias, *ap;  /* ap: the packed weights (forward) */
    float *y;                         /* forward: the output; weight gradient: dw */
    const int64_t *brow;              /* row (c, kk) of the implicit matrix, in a sample's planes */
    int64_t n, kc, stride;            /* samples; K block; floats per thread buffer */
    float *bufs;
    dl__claimer cl;
    const int32_t *i2c;               /* conv_i2c: the im2col table (dl__i2c_tab_make), NULL: by rows */
    /* weight gradient */
    int64_t chunk, units, uslot, ga, gb, nslots;
    float beta;
    /* input gradient as im2col's adjoint: the col2im table */
    const int64_t *tidx, *toff;
    const int32_t *tln;
} dl__s1r_job;

/* forward: samples claimed one at a time; each copied into the thread's
   buffer, multiplied by the packed weights, + bias */
static void dl__s1r_task(void *arg, int64_t begin, int64_t end)
{
    dl__s1r_job *J = (dl__s1r_job *)arg;
    const dl__cgeom *g = J->g;
    float *xb = J->bufs + begin * J->stride;
    int64_t M = g->Cb, Lb = g->Lb, n, jr;
    (void)end;
    memset(xb, 0, sizeof(float) * (size_t)J->r.per);
    while ((n = dl__claim(&J->cl)) < J->n) {
        float *y = J->y + n * M * Lb;
        dl__s1r_fill(g, &J->r, xb, J->x + n * g->Ca * g->La, 0, g->Ca);
        for (jr = 0; jr < Lb; jr += DL__GEMM_NR)
            dl__gemm_strip(J->ap, M, g->Ca * g->K, J->kc, xb + jr, 0, J->brow, y + jr, Lb,
                           (int)(Lb - jr < DL__GEMM_NR ? Lb - jr : DL__GEMM_NR));
        if (J->bias) dl__bias_rows(y, J->bias, M, Lb, 0, M);
    }
}

/* The row table of the sample planes of channels [c0, ...): row (c, kh, kw)
   at ((c - c0) k2 + kw) Pr + kh d1 W, for rows [r0, r1) into brow[0..) */
static void dl__s1r_rows(const dl__cgeom *g, const dl__s1r *r, int64_t c0, int64_t r0, int64_t r1, int64_t *brow)
{
    int64_t i;
    for (i = r0; i < r1; i++) {
        int64_t c = i / g->K, kk = i % g->K;
        brow[i - r0] = ((c - c0) * g->k[2] + kk % g->k[2]) * r->Pr + (kk / g->k[2]) * g->d[1] * r->W;
    }
}

/* Buffers of the row variant from the pool's GEMM buffer: `head` floats,
   then nslots thread buffers of `stride` floats, zeros from `used` on (the
   kernels read whole vectors past a plane's end). NULL: no memory. */
static float *dl__s1r_bufs(dl__pool *pool, int64_t head, int64_t nslots, int64_t stride, int64_t used, void **raw)
{
    float *b = dl__gemm_buf_get(pool, sizeof(float) * (size_t)(head + nslots * stride), raw);
    int64_t i;
    if (b)
        for (i = 0; i < nslots; i++) memset(b + head + i * stride + used, 0, sizeof(float) * (size_t)(stride - used));
    return b;
}

/* runs a job's task on nslots threads claiming samples, then gives the buffers back */
static void dl__s1r_run(dl__pool *pool, dl__s1r_job *J, int64_t nslots, dl__task_fn task, void *raw)
{
    dl__claim_run(pool, &J->cl, nslots, task, J);
    dl__gemm_buf_put(pool, raw);
}

/* y (n, Cb, ib...) = conv(x, w) + bias, or with flip the conv with w (Ca, Cb, k...) transposed and flipped.
   false: no memory for the buffers (the caller takes the grid) */
static bool dl__cpu_conv_s1_rows(dl__dev *d, float *y, const float *x, const float *w, const float *bias,
                                 int64_t n, const dl__cgeom *g, const dl__s1r *r, bool flip)
{
    dl__pool *pool = d->ctx->pool;
    dl__s1r_job J;
    int64_t M = g->Cb, K = g->Ca * g->K, Mup = dl__round_up(M, DL__GEMM_MR), nslots = dl__pool_size(pool);
    int64_t afl = dl__round_up(Mup * K + 16, 16), wfl = flip ? dl__round_up(M * K + 16, 16) : 0;
    int64_t tfl = dl__round_up(2 * K + 16, 16);
    void *raw;
    float *buf;
    const float *A = w;
    memset(&J, 0, sizeof J);
    if (nslots > n) nslots = n;
    J.stride = dl__round_up(r->per + 48, 16);
    buf = dl__s1r_bufs(pool, afl + wfl + tfl, nslots, J.stride, r->per, &raw);
    if (!buf) return false;
    J.g = g;
    J.r = *r;
    J.x = x;
    J.y = y;
    J.bias = bias;
    J.n = n;
    J.kc = dl__gemm_kc(K);
    J.ap = buf;
    J.brow = (const int64_t *)(void *)(buf + afl + wfl);
    J.bufs = buf + afl + wfl + tfl;
    dl__s1r_rows(g, r, 0, 0, K, (int64_t *)(void *)(buf + afl + wfl));
    if (flip) {
        dl__s1_args u;
        memset(&u, 0, sizeof u);
        u.g = g;
        u.w = w;
        u.wt = buf + afl;
        dl__s1_flip_task(&u, 0, M);
        A = u.wt;
    }
    dl__gemm_pack_all(false, A, K, M, K, J.kc, buf);
    dl__s1r_run(pool, &J, nslots, dl__s1r_task, raw);
    return true;
}

/* The CPU's conv_i2c: im2col a sample at a time. For the convs that
   neither conv_s1 nor Winograd take (strided ones: the ResNet's
   downsampling 3x3 and 1x1 convs), each thread claims a sample, builds its
   im2col matrix (Ca K, Lb) in the thread's buffer (1-d and 2-d: by rows,
   dl__i2c_rows; 3-d: im2col's table), and multiplies the packed weights
   by it straight into the sample's (Cb, Lb) block of y: no whole-batch
   matrix passing through memory and no permute after the GEMM. The same
   kernel and K blocks as im2col's GEMM, so the same bits. Declines:
   groups, fewer than 128 output positions (a GEMM of so few columns runs
   slower than whole-batch im2col's: measured 1.1-1.25x on the ResNet's
   14x14 and 7x7 stride-2 convs), 3-d planes the table does not take, a
   matrix over DL__I2C_MAX_PER floats, no memory. */
#ifndef DL__I2C_MAX_PER
#define DL__I2C_MAX_PER ((int64_t)1 << 17)
#endif
/* One sample's im2col matrix (Ca K, Lb) of a 2-d conv, by rows: each
   plane copied into pad (rows Wp floats, its border zero: the caller
   zeroed it once), then each kernel offset's OH rows cut from it; a
   stride of 2 along the width takes the even lanes of two vectors. The
   same values as the table's gather. */
static void dl__i2c_rows(const dl__cgeom *g, float *pad, int64_t Wp, const float *x, float *dst)
{
    const int64_t H = g->ia[1], W = g->ia[2], OH = g->ib[1], OW = g->ib[2], k1 = g->k[1], k2 = g->k[2];
    const int64_t s1 = g->s[1], s2 = g->s[2];
    int64_t c, ih, kh, kw, oh, ow;
#if defined(DL__GEMM_AVX512)
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
#endif
    for (c = 0; c < g->Ca; c++) {
        for (ih = 0; ih < H; ih++) memcpy(pad + (ih + g->p[1]) * Wp + g->p[2], x + (c * H + ih) * W, sizeof(float) * (size_t)W);
        for (kh = 0; kh < k1; kh++)
            for (kw = 0; kw < k2; kw++)
                for (oh = 0; oh < OH; oh++) {
                    const float *src = pad + (oh * s1 + kh * g->d[1]) * Wp + kw * g->d[2];
                    float *d = dst + ((c * k1 + kh) * k2 + kw) * g->Lb + oh * OW;
                    if (s2 == 1) dl__copy_run(d, src, OW);
#if defined(DL__GEMM_AVX512)
                    else if (s2 == 2)
                        for (ow = 0; ow < OW; ow += 16) {
                            const __mmask16 m = (__mmask16)(OW - ow >= 16 ? 0xFFFFu : (1u << (OW - ow)) - 1u);
                            _mm512_mask_storeu_ps(d + ow, m, _mm512_permutex2var_ps(_mm512_loadu_ps(src + 2 * ow), even,
                                                                                    _mm512_loadu_ps(src + 2 * ow + 16)));
                        }
#endif
                    else
                        for (ow = 0; ow < OW; ow++) d[ow] = src[ow * s2];
                }
    }
}

/* a thread's buffer: the matrix (with the kernels' read-past margin), then
   for dl__i2c_rows the zero-bordered plane, rows of dl__i2c_padw floats
   (32 past the right border: two whole vectors at stride 2) */
static int64_t dl__i2c_colfl(const dl__cgeom *g) { return dl__round_up(g->Ca * g->K * g->Lb + 48, 16); }
static int64_t dl__i2c_padw(const dl__cgeom *g) { return g->ia[2] + 2 * g->p[2] + 32; }

static void dl__i2c_task(void *arg, int64_t begin, int64_t end)
{
    dl__s1r_job *J = (dl__s1r_job *)arg;
    const dl__cgeom *g = J->g;
    float *xb = J->bufs + begin * J->stride;
    int64_t M = g->Cb, Lb = g->Lb, n, jr;
    dl__i2t_args u;
    (void)end;
    u.g = g;
    u.n = 1;
    u.idx = J->i2c;
    u.inv = NULL;
    u.out = xb;
    while ((n = dl__claim(&J->cl)) < J->n) {
        float *y = J->y + n * M * Lb;
        u.in = J->x + n * g->Ca * g->La;
        if (J->i2c) dl__im2col_tab_task(&u, 0, g->Ca);
        else dl__i2c_rows(g, xb + dl__i2c_colfl(g), dl__i2c_padw(g), u.in, xb);
        for (jr = 0; jr < Lb; jr += DL__GEMM_NR)
            dl__gemm_strip(J->ap, M, g->Ca * g->K, J->kc, xb + jr, Lb, NULL, y + jr, Lb,
                           (int)(Lb - jr < DL__GEMM_NR ? Lb - jr : DL__GEMM_NR));
        if (J->bias) dl__bias_rows(y, J->bias, M, Lb, 0, M);
    }
}

static bool dl__cpu_conv_i2c(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                             const dl__cgeom *g)
{
    dl__pool *pool = d->ctx->pool;
    dl__s1r_job J;
    int64_t M = g->Cb, K = g->Ca * g->K, Mup = dl__round_up(M, DL__GEMM_MR), nslots = dl__pool_size(pool);
    int64_t afl, tfl;
    void *raw;
    float *buf;
    /* 2-d (or 1-d): dl__i2c_rows; a depth of 1 with depth padding (output
       depths of padding only) is 3-d */
    bool rows = g->ia[0] == 1 && g->k[0] == 1 && g->p[0] == 0 && g->ib[0] == 1;
    if (g->G != 1 || n <= 0 || M <= 0 || K <= 0 || g->Lb < 128 || (!rows && !dl__i2c_tab_ok(g)) ||
        g->Lb > DL__I2C_MAX_PER / K)
        return false;
    afl = dl__round_up(Mup * K + 16, 16);
    tfl = rows ? 0 : dl__round_up(g->K * g->Lb + 16, 16);   /* int32 entries, one float each */
    memset(&J, 0, sizeof J);
    if (nslots > n) nslots = n;
    J.stride = dl__i2c_colfl(g) + (rows ? (g->ia[1] + 2 * g->p[1] + 1) * dl__i2c_padw(g) + 16 : 0);
    if (J.stride > 2 * DL__I2C_MAX_PER) return false;
    buf = dl__s1r_bufs(pool, afl + tfl, nslots, J.stride, K * g->Lb, &raw);
    if (!buf) return false;
    J.g = g;
    J.x = (const float *)DL__RAW(d, x);
    J.y = (float *)DL__RAW(d, y);
    J.bias = (const float *)DL__RAW0(d, bias);
    J.n = n;
    J.kc = dl__gemm_kc(K);
    J.ap = buf;
    J.bufs = buf + afl + tfl;
    if (!rows) {
        dl__i2c_tab_make(g, (int32_t *)(void *)(buf + afl));
        J.i2c = (const int32_t *)(void *)(buf + afl);
    }
    dl__gemm_pack_all(false, (const float *)DL__RAW(d, w), K, M, K, J.kc, buf);
    dl__s1r_run(pool, &J, nslots, dl__i2c_task, raw);
    return true;
}

#ifdef DL__GEMM_DOT
/* weight gradient: slot s owns the units (tile of <= 6 columns of dw, group
   of <= 4 rows) [units s / nslots, units (s+1) / nslots), tile-major; per
   chunk of samples it copies the planes of the channels its columns read,
   then runs each unit's tile over the chunk's samples */
static void dl__s1r_wgrad_task(void *arg, int64_t begin, int64_t end)
{
    dl__s1r_job *J = (dl__s1r_job *)arg;
    const dl__cgeom *g = J->g;
    int64_t M = g->Cb, Lb = g->Lb, CK = g->Ca * g->K, s;
    int64_t *brow = (int64_t *)(void *)(J->bufs + begin * J->stride);
    float *park = J->bufs + begin * J->stride + dl__round_up(2 * CK + 16, 16);
    float *xb = park + J->uslot * 384;
    for (s = begin; s < end; s++) {
        int64_t u0 = J->units * s / J->nslots, u1 = J->units * (s + 1) / J->nslots, u, n0, nc, c0, c1, per, r0;
        if (u0 >= u1) continue;
        /* the columns [r0, r1) of the slot's tiles and their channels [c0, c1) */
        {
            int64_t t0 = u0 / J->ga, t1 = (u1 - 1) / J->ga, r1 = CK * (t1 + 1) / J->gb;
            r0 = CK * t0 / J->gb;
            c0 = r0 / g->K;
            c1 = (r1 - 1) / g->K + 1;
            per = (c1 - c0) * g->k[2] * J->r.Pr;
            dl__s1r_rows(g, &J->r, c0, r0, r1, brow);
            memset(xb, 0, sizeof(float) * (size_t)(J->chunk * per));
        }
        for (n0 = 0; n0 < J->n; n0 += J->chunk) {
            int64_t i;
            nc = J->n - n0 < J->chunk ? J->n - n0 : J->chunk;
            for (i = 0; i < nc; i++)
                dl__s1r_fill(g, &J->r, xb + i * per, J->x + (n0 + i) * g->Ca * g->La, c0, c1);
            for (u = u0; u < u1; u++) {
                int64_t t = u / J->ga, h = u % J->ga, j0 = CK * t / J->gb, j1 = CK * (t + 1) / J->gb;
                int64_t i0 = M * h / J->ga, i1 = M * (h + 1) / J->ga, j;
                const float *bq[6];
                for (j = j0; j < j1; j++) bq[j - j0] = xb + brow[j - r0];
                dl__gemm_dot((int)(i1 - i0), (int)(j1 - j0), (Lb + 15) / 16, (int)(Lb % 16),
                             J->gy + (n0 * M + i0) * Lb, Lb, bq, nc, M * Lb, per, park + (u - u0) * 384, 96,
                             n0 == 0, n0 + nc >= J->n, J->y + i0 * CK + j0, CK, 1.0f, J->beta);
            }
        }
    }
}

/* dw (Cb, Ca k...) = beta dw + the weight gradient over n samples; false: no memory */
static bool dl__cpu_conv_s1r_wgrad(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n,
                                   const dl__cgeom *g, const dl__s1r *r, float beta)
{
    dl__pool *pool = d->ctx->pool;
    dl__s1r_job J;
    int64_t CK = g->Ca * g->K;
    void *raw;
    memset(&J, 0, sizeof J);
    J.g = g;
    J.r = *r;
    J.x = x;
    J.gy = gy;
    J.y = dw;
    J.n = n;
    J.beta = beta;
    J.ga = (g->Cb + 3) / 4;
    J.gb = (CK + 5) / 6;
    J.units = J.ga * J.gb;
    /* samples per chunk: their planes and gy in about DL__S1R_CHUNK floats (from the shape alone) */
    J.chunk = DL__S1R_CHUNK / (r->per + g->Cb * g->Lb);
    if (J.chunk < 1) J.chunk = 1;
    if (J.chunk > n) J.chunk = n;
    J.nslots = dl__pool_size(pool);
    if (J.nslots > J.units) J.nslots = J.units;
    J.uslot = J.units / J.nslots + 1;   /* units of a slot, at most */
    J.stride = dl__round_up(2 * CK + 16, 16) + J.uslot * 384 + dl__round_up(J.chunk * r->per + 16, 16);
    J.bufs = dl__s1r_bufs(pool, 0, J.nslots, J.stride, J.stride, &raw);
    if (!J.bufs) return false;
    dl__parallel_for(pool, J.nslots, 1, dl__s1r_wgrad_task, &J);
    dl__gemm_buf_put(pool, raw);
    return true;
}
#endif

/* col2im for one channel of a sample: dx[ih][iw] = the sum over (kh, kw)
   of col (K, Lb)[kh k2 + kw][oh ib2 + ow] where the window put them,
   ih = oh + kh d1 - p1, iw = ow + kw d2 - p2. Each element is summed where
   it is written, 16 along a row at a time: the table (dl__s1s_table) lists
   for row ih and positions [iw0, iw0 + 16) the shifted runs of col to add
   (offset, first lane, lanes); the AVX-512 loop loads them masked into four
   chains of adds taken in turn. No store is read back. */
static int64_t dl__s1s_table(const dl__cgeom *g, int64_t *idx, int64_t *off, int32_t *ln)
{
    int64_t ih, iw0, kh, kw, q = 0, e = 0, ia2 = g->ia[2], ib2 = g->ib[2];
    for (ih = 0; ih < g->ia[1]; ih++)
        for (iw0 = 0; iw0 < ia2; iw0 += 16) {
            int64_t w = ia2 - iw0 < 16 ? ia2 - iw0 : 16;
            idx[q++] = e;
            for (kh = 0; kh < g->k[1]; kh++) {
                int64_t oh = ih - kh * g->d[1] + g->p[1];
                if (oh < 0 || oh >= g->ib[1]) continue;
                for (kw = 0; kw < g->k[2]; kw++) {
                    int64_t sh = kw * g->d[2] - g->p[2], lo = sh > iw0 ? sh : iw0, hi = ib2 + sh;
                    if (hi > iw0 + w) hi = iw0 + w;
                    if (lo >= hi) continue;
                    off[e] = (kh * g->k[2] + kw) * g->Lb + oh * ib2 + iw0 - sh;
                    ln[e++] = (int32_t)((lo - iw0) | (hi - lo) << 8);
                }
            }
        }
    idx[q] = e;
    return e;
}

static void dl__s1s_plane(const dl__cgeom *g, float *dx, const float *col, const int64_t *idx, const int64_t *off,
                          const int32_t *ln)
{
    int64_t ih, iw0, e, q = 0, ia2 = g->ia[2];
    for (ih = 0; ih < g->ia[1]; ih++, dx += ia2)
        for (iw0 = 0; iw0 < ia2; iw0 += 16, q++) {
            int64_t w = ia2 - iw0 < 16 ? ia2 - iw0 : 16;
#if defined(DL__GEMM_AVX512)
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, t;
            for (e = idx[q]; e < idx[q + 1]; e++) {
                t = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(
                                          (__mmask16)(((1u << (ln[e] >> 8)) - 1u) << (ln[e] & 255)), col + off[e]));
                a0 = a1;   /* the next term into the next chain */
                a1 = a2;
                a2 = a3;
                a3 = t;
            }
            _mm512_mask_storeu_ps(dx + iw0, (__mmask16)((1u << w) - 1u),
                                  _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#else
            float acc[16];
            int j;
            for (j = 0; j < 16; j++) acc[j] = 0.0f;
            for (e = idx[q]; e < idx[q + 1]; e++)
                for (j = ln[e] & 255; j < (ln[e] & 255) + (ln[e] >> 8); j++) acc[j] += col[off[e] + j];
            for (j = 0; j < w; j++) dx[iw0 + j] = acc[j];
#endif
        }
}

/* The input gradient of a conv whose output is much smaller than its
   input (a valid 5x5 conv, 10x10 from 14x14), and conv_transpose likewise:
   as the conv with flipped weights it would multiply the zeros around the
   output gradient (K times the input's positions); as im2col's adjoint it
   multiplies the output's positions only. A sample at a time, in the
   thread's buffer: col (Ca K, Lb) = w^T gy_n, then col2im into dx_n.
   g is the conv's own geometry (a: the input side, the result here). */
static void dl__s1s_task(void *arg, int64_t begin, int64_t end)
{
    dl__s1r_job *J = (dl__s1r_job *)arg;
    const dl__cgeom *g = J->g;
    int64_t M = g->Ca * g->K, Kg = g->Cb, Lb = g->Lb, n, jr, c;
    float *col = J->bufs + begin * J->stride, *bbuf = col + dl__round_up(M * Lb + 16, 16);
    (void)end;
    while ((n = dl__claim(&J->cl)) < J->n) {
        const float *gy = J->gy + n * Kg * Lb;
        float *dx = J->y + n * g->Ca * g->La;
        for (jr = 0; jr < Lb; jr += DL__GEMM_NR) {
            int nr = (int)(Lb - jr < DL__GEMM_NR ? Lb - jr : DL__GEMM_NR);
            if (nr < DL__GEMM_NR) {   /* the last sliver, zero-padded (B ends there) */
                dl__gemm_pack_b(false, gy, Lb, NULL, 0, Kg, jr, nr, bbuf);
                dl__gemm_strip(J->ap, M, Kg, J->kc, bbuf, DL__GEMM_NR, NULL, col + jr, Lb, nr);
            } else {
                dl__gemm_strip(J->ap, M, Kg, J->kc, gy + jr, Lb, NULL, col + jr, Lb, nr);
            }
        }
        for (c = 0; c < g->Ca; c++)
            dl__s1s_plane(g, dx + c * g->La, col + c * g->K * Lb, J->tidx, J->toff, J->tln);
        if (J->bias) dl__bias_rows(dx, J->bias, g->Ca, g->La, 0, g->Ca);
    }
}

/* y (n, Ca, ia...) for gt, the flipped conv's geometry (dl__cpu_conv_s1 with flip): false: no memory */
static bool dl__cpu_conv_s1_scatter(dl__dev *d, float *y, const float *gy, const float *w, const float *bias,
                                    int64_t n, const dl__cgeom *gt)
{
    dl__pool *pool = d->ctx->pool;
    dl__s1r_job J;
    dl__cgeom g;
    int64_t M, Mup, afl, tfl, nq, nslots = dl__pool_size(pool);
    void *raw;
    float *buf;
    memset(&J, 0, sizeof J);
    dl__cgeom_flip(gt, &g);
    M = g.Ca * g.K;
    Mup = dl__round_up(M, DL__GEMM_MR);
    J.kc = dl__gemm_kc(g.Cb);
    nq = g.ia[1] * ((g.ia[2] + 15) / 16);   /* table rows; terms: at most K each */
    afl = dl__round_up(Mup * g.Cb + 16, 16);
    tfl = dl__round_up(2 * (nq + 1) + 3 * nq * g.K + 16, 16);
    if (nslots > n) nslots = n;
    J.stride = dl__round_up(M * g.Lb + 16, 16) + dl__round_up(g.Cb * DL__GEMM_NR + 16, 16);
    buf = dl__s1r_bufs(pool, afl + tfl, nslots, J.stride, J.stride, &raw);
    if (!buf) return false;
    {
        int64_t *tidx = (int64_t *)(void *)(buf + afl), *toff = tidx + nq + 1;
        int32_t *tln = (int32_t *)(void *)(toff + nq * g.K);
        dl__s1s_table(&g, tidx, toff, tln);
        J.tidx = tidx;
        J.toff = toff;
        J.tln = tln;
    }
    J.g = &g;
    J.gy = gy;
    J.y = y;
    J.bias = bias;
    J.n = n;
    J.ap = buf;
    J.bufs = buf + afl + tfl;
    dl__gemm_pack_all(true, w, M, M, g.Cb, J.kc, buf);   /* A = w^T: w is (Cb, Ca K) */
    dl__s1r_run(pool, &J, nslots, dl__s1s_task, raw);
    return true;
}

/* the backend entries: the row variant where it applies and there is
   memory for it, else the grid */
static void dl__cpu_conv_s1(dl__dev *d, float *y, const float *x, const float *w, const float *bias, float *scratch,
                            int64_t n, const dl__cgeom *g, bool flip)
{
    dl__s1r r;
    if (n > 0 && dl__s1r_make(g, &r)) {
        float *yr = (float *)DL__RAW(d, y);
        const float *xr = (const float *)DL__RAW(d, x), *wr = (const float *)DL__RAW(d, w);
        const float *br = (const float *)DL__RAW0(d, bias);
        /* flip with 5/4 as many positions in as out: im2col's adjoint (dl__s1s_task) */
        if (flip && 4 * g->Lb > 5 * g->La && dl__cpu_conv_s1_scatter(d, yr, xr, wr, br, n, g)) return;
        if (g->Cb <= DL__GEMM_DIRECT_M && dl__cpu_conv_s1_rows(d, yr, xr, wr, br, n, g, &r, flip)) return;
    }
    dl__cpu_conv_s1_grid(d, y, x, w, bias, scratch, n, g, flip);
}

/* (the row variant multiplies exactly im2col's terms: any x) */
static bool dl__cpu_conv_s1_wgrad(dl__dev *d, float *dw, const float *x, const float *gy, float *scratch, int64_t n,
                                  const dl__cgeom *g, float beta)
{
#ifdef DL__GEMM_DOT
    dl__s1r r;
    if (g->Cb <= DL__GEMM_DOT_MAX_M && n > 0 && dl__s1r_make(g, &r) &&
        dl__cpu_conv_s1r_wgrad(d, (float *)DL__RAW(d, dw), (const float *)DL__RAW(d, x), (const float *)DL__RAW(d, gy),
                               n, g, &r, beta))
        return true;
#endif
    return dl__cpu_conv_s1_wgrad_grid(d, dw, x, gy, scratch, n, g, beta);
}

/* Winograd's F(2x2, 3x3) and F(4x4, 3x3) (Lavin and Gray, "Fast
   Algorithms for Convolutional Neural Networks", 2016) for 3x3, stride-1,
   dilation-1 2-d convs with channels in multiples of 16 (dl__wg_ok). Each
   m x m block of outputs (a tile) is A^T [(G g G^T) . (B^T d B)] A of the
   (m+2) x (m+2) input patch d under it, so a tile's 9 m^2 multiply-adds
   per channel pair become (m+2)^2 (m = 2: 16 for 36; m = 4: 36 for 144):
   one GEMM over the channels for each of the (m+2)^2 positions xi of that
   product. dl__wg_tile picks m for the plane (4 unless its tiles' waste
   undoes the gain); F(4x4, 3x3)'s larger constants round about 10 times
   more (up to 5e-5 of the largest output in the tests, against 4e-6).
   Vectors run along channels: a block of samples is transposed into a
   zero-padded position-major copy (xp), the transforms take 16 channels a
   vector, a GEMM broadcasts a tile's value against a row of transformed
   weights, and the output is transposed back. The weight gradient is the
   same product's adjoint: S[xi] (Co, Ci) = the sum over tiles of
   (A gy A^T)[xi] (B^T d B)[xi], dw = G^T S G, summed over fixed chunks of
   samples (from n alone) added in order, so the bits do not depend on the
   threads. The transforms add and subtract, so an inf among the inputs can
   meet another as inf - inf = NaN where direct sums give inf: the entries
   decline an operand holding inf or NaN. AVX-512 only. */
#if defined(DL__GEMM_AVX512) && !defined(DL_NO_WINOGRAD)
#define DL__WG 1
#ifndef DL__WG_TILES
#define DL__WG_TILES 64     /* F(2x2, 3x3)'s tiles per block of samples, at least (the GEMMs' rows);
                               F(4x4, 3x3): a quarter as many, the same outputs (measured as fast, and
                               it keeps a thread's buffers a third smaller) */
#endif
#ifndef DL__WG_CHUNKS
#define DL__WG_CHUNKS 8     /* the weight gradient's partial sums */
#endif
/* floats of a (T, C) slice of the buffers that hold one (T, C) per xi:
   padded by a cache line, so that the A2 slices a transform writes at once
   do not fall in the same cache sets when T C is a multiple of 1024
   (measured: F(4x4, 3x3) on 14x14 planes, 32 channels, 1.3x slower
   unpadded) */
#define DL__WG_XS(T, C) ((T) * (C) + 16)

static bool dl__wg_ok(const dl__cgeom *g, int64_t n)
{
    return n > 0 && g->G == 1 && g->ia[0] == 1 && g->ib[0] == 1 && g->k[0] == 1 && g->p[0] == 0 &&
           g->k[1] == 3 && g->k[2] == 3 &&
           g->s[1] == 1 && g->s[2] == 1 && g->d[1] == 1 && g->d[2] == 1 && g->p[1] >= 0 && g->p[1] <= 2 &&
           g->p[2] >= 0 && g->p[2] <= 2 && g->Ca > 0 && g->Cb > 0 && g->Ca % 16 == 0 && g->Cb % 16 == 0 &&
           g->ib[1] > 0 && g->ib[2] > 0 && g->ib[1] == g->ia[1] + 2 * g->p[1] - 2 &&
           g->ib[2] == g->ia[2] + 2 * g->p[2] - 2;
}

/* the output tile, 2 (F(2x2, 3x3)) or 4 (F(4x4, 3x3)): the one with fewer
   multiply-adds over the tiles that cover an OH x OW plane; 2 on a tie (its
   rounding is smaller) */
static int dl__wg_tile(int64_t OH, int64_t OW)
{
    return 36 * ((OH + 3) / 4) * ((OW + 3) / 4) < 16 * ((OH + 1) / 2) * ((OW + 1) / 2) ? 4 : 2;
}

typedef struct dl__wg_job {
    int64_t Ci, Co, L, OL, TH, TW, Hp, Wp, OH, OW, nb, T, CC, n, nblk, nchunk, stride, xpn, gpn;
    int64_t m, A2;                   /* output tiles m x m (2 or 4); A2 = (m + 2)^2 positions xi */
    const float *x, *w, *bias, *gy;
    float *y, *u, *s, *bufs, *bad;   /* bad: 16 floats a thread, NaN where an input held inf or NaN */
    const int64_t *xoff, *goff;      /* where position p of a plane goes in xp, in gp */
    bool flip;
    dl__claimer cl;
} dl__wg_job;

/* 16 rows of 16 floats transposed in place */
DL__GEMM_INLINE void dl__tr16(__m512 *r)
{
    const __mmask16 m16 = (__mmask16)0xFFFF;   /* (the maskz forms: g++ 12 warns on the others' undefined source) */
    const __mmask8 m8 = (__mmask8)0xFF;
    __m512 t[16];
    int i;
    for (i = 0; i < 8; i++) {
        t[2 * i] = _mm512_maskz_unpacklo_ps(m16, r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_maskz_unpackhi_ps(m16, r[2 * i], r[2 * i + 1]);
    }
    for (i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(m8, _mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(m8, _mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(m8, _mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(m8, _mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    for (i = 0; i < 4; i++) {
        t[i] = _mm512_maskz_shuffle_f32x4(m16, r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_maskz_shuffle_f32x4(m16, r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_maskz_shuffle_f32x4(m16, r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_maskz_shuffle_f32x4(m16, r[i + 8], r[i + 12], 0xdd);
    }
    for (i = 0; i < 8; i++) {
        r[i] = _mm512_maskz_shuffle_f32x4(m16, t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_maskz_shuffle_f32x4(m16, t[i], t[i + 8], 0xdd);
    }
}

/* 16 channels' planes (rows ss apart, n positions) into dst + off[p]
   (16 channels each); *bad turns NaN at an inf or NaN */
static void dl__wg_in(const float *src, int64_t ss, int64_t n, float *dst, const int64_t *off, __m512 *bad)
{
    const __m512 z = _mm512_setzero_ps();
    __m512 r[16], b = *bad;
    int64_t p;
    int i;
    for (p = 0; p < n; p += 16) {
        int w = n - p < 16 ? (int)(n - p) : 16;
        const __mmask16 m = (__mmask16)((1u << w) - 1u);
        for (i = 0; i < 16; i++) {
            r[i] = _mm512_maskz_loadu_ps(m, src + i * ss + p);
            b = _mm512_fmadd_ps(r[i], z, b);
        }
        dl__tr16(r);
        for (i = 0; i < w; i++) _mm512_storeu_ps(dst + off[p + i], r[i]);
    }
    *bad = b;
}

/* the reverse: n positions of 16 channels (sld apart) into 16 rows ds apart */
static void dl__wg_out(const float *src, int64_t sld, int64_t n, float *dst, int64_t ds)
{
    __m512 r[16];
    int64_t p;
    int i;
    for (p = 0; p < n; p += 16) {
        int w = n - p < 16 ? (int)(n - p) : 16;
        const __mmask16 m = (__mmask16)((1u << w) - 1u);
        for (i = 0; i < 16; i++) r[i] = i < w ? _mm512_loadu_ps(src + (p + i) * sld) : _mm512_setzero_ps();
        dl__tr16(r);
        for (i = 0; i < 16; i++) _mm512_mask_storeu_ps(dst + i * ds + p, m, r[i]);
    }
}

/* c (mr <= 8 rows ldc apart, 16 NV columns) = (acc ? c : 0) + the sum over
   k < K of a[r ars + k aks] b[k ldb + j], in order of k */
#define DL__WG_FMA(r)                                                   \
    {                                                                   \
        const __m512 a_ = _mm512_set1_ps(a##r[k * aks]);                \
        c##r##0 = _mm512_fmadd_ps(a_, b0, c##r##0);                     \
        if (NV > 1) c##r##1 = _mm512_fmadd_ps(a_, b1, c##r##1);         \
    }
#define DL__WG_PUT(r)                                                                   \
    if (mr > r) {                                                                       \
        float *c_ = c + r * ldc;                                                        \
        if (acc) c##r##0 = _mm512_add_ps(_mm512_loadu_ps(c_), c##r##0);                 \
        _mm512_storeu_ps(c_, c##r##0);                                                  \
        if (NV > 1) {                                                                   \
            if (acc) c##r##1 = _mm512_add_ps(_mm512_loadu_ps(c_ + 16), c##r##1);        \
            _mm512_storeu_ps(c_ + 16, c##r##1);                                         \
        }                                                                               \
    }
DL__GEMM_INLINE void dl__wg_kern(const int NV, int64_t K, const float *a, int64_t ars, int64_t aks, int mr,
                                 const float *b, int64_t ldb, float *c, int64_t ldc, int acc)
{
    const float *a0 = a, *a1 = a + (mr > 1 ? ars : 0), *a2 = a + (mr > 2 ? 2 * ars : 0),
                *a3 = a + (mr > 3 ? 3 * ars : 0), *a4 = a + (mr > 4 ? 4 * ars : 0), *a5 = a + (mr > 5 ? 5 * ars : 0),
                *a6 = a + (mr > 6 ? 6 * ars : 0), *a7 = a + (mr > 7 ? 7 * ars : 0);
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
           c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    int64_t k;
    for (k = 0; k < K; k++) {
        const __m512 b0 = _mm512_loadu_ps(b + k * ldb), b1 = NV > 1 ? _mm512_loadu_ps(b + k * ldb + 16) : b0;
        DL__WG_FMA(0) DL__WG_FMA(1) DL__WG_FMA(2) DL__WG_FMA(3)
        DL__WG_FMA(4) DL__WG_FMA(5) DL__WG_FMA(6) DL__WG_FMA(7)
    }
    DL__WG_PUT(0) DL__WG_PUT(1) DL__WG_PUT(2) DL__WG_PUT(3)
    DL__WG_PUT(4) DL__WG_PUT(5) DL__WG_PUT(6) DL__WG_PUT(7)
}

/* c (M, N: a multiple of 16) (+)= a (M, K: element (r, k) at r ars + k aks) b (K, N) */
static void dl__wg_gemm(int64_t M, int64_t N, int64_t K, const float *a, int64_t ars, int64_t aks, const float *b,
                        int64_t ldb, float *c, int64_t ldc, int acc)
{
    int64_t i, j;
    for (i = 0; i < M; i += 8) {
        int mr = (int)(M - i < 8 ? M - i : 8);
        for (j = 0; j < N; j += 32) {
            if (N - j >= 32) dl__wg_kern(2, K, a + i * ars, ars, aks, mr, b + j, ldb, c + i * ldc + j, ldc, acc);
            else dl__wg_kern(1, K, a + i * ars, ars, aks, mr, b + j, ldb, c + i * ldc + j, ldc, acc);
        }
    }
}

/* F(2x2, 3x3)'s v[xi] (row vs apart) = B^T d B for 16 channels, d the 4x4 patch at p
   (rows rs apart, columns Ci apart) */
DL__GEMM_INLINE void dl__wg_vtile(const float *p, int64_t rs, int64_t cs, float *v, int64_t vs)
{
    __m512 d[4][4], t[4][4];
    int i, j;
    for (i = 0; i < 4; i++)
        for (j = 0; j < 4; j++) d[i][j] = _mm512_loadu_ps(p + i * rs + j * cs);
    for (j = 0; j < 4; j++) {
        t[0][j] = _mm512_sub_ps(d[0][j], d[2][j]);
        t[1][j] = _mm512_add_ps(d[1][j], d[2][j]);
        t[2][j] = _mm512_sub_ps(d[2][j], d[1][j]);
        t[3][j] = _mm512_sub_ps(d[1][j], d[3][j]);
    }
    for (i = 0; i < 4; i++) {
        _mm512_storeu_ps(v + (4 * i) * vs, _mm512_sub_ps(t[i][0], t[i][2]));
        _mm512_storeu_ps(v + (4 * i + 1) * vs, _mm512_add_ps(t[i][1], t[i][2]));
        _mm512_storeu_ps(v + (4 * i + 2) * vs, _mm512_sub_ps(t[i][2], t[i][1]));
        _mm512_storeu_ps(v + (4 * i + 3) * vs, _mm512_sub_ps(t[i][1], t[i][3]));
    }
}

/* F(4x4, 3x3)'s one-dimensional transforms, 16 channels a vector: n
   values s apart in, rs apart out (Lavin and Gray's matrices, points 0,
   +-1, +-2) */
#define DL__WG_C(x) _mm512_set1_ps(x)
/* 6 = B^T 6 (input) */
DL__GEMM_INLINE void dl__wg4_bt(const __m512 *d, int s, __m512 *r, int rs)
{
    const __m512 a = _mm512_add_ps(d[s], d[2 * s]), b = _mm512_add_ps(d[3 * s], d[4 * s]);
    const __m512 e = _mm512_sub_ps(d[s], d[2 * s]), f = _mm512_sub_ps(d[4 * s], d[3 * s]);
    const __m512 h = _mm512_sub_ps(d[3 * s], d[s]), k = _mm512_sub_ps(d[4 * s], d[2 * s]);
    r[0] = _mm512_fmadd_ps(DL__WG_C(4.0f), d[0], _mm512_fmadd_ps(DL__WG_C(-5.0f), d[2 * s], d[4 * s]));
    r[rs] = _mm512_fnmadd_ps(DL__WG_C(4.0f), a, b);
    r[2 * rs] = _mm512_fmadd_ps(DL__WG_C(4.0f), e, f);
    r[3 * rs] = _mm512_fmadd_ps(DL__WG_C(2.0f), h, k);
    r[4 * rs] = _mm512_fnmadd_ps(DL__WG_C(2.0f), h, k);
    r[5 * rs] = _mm512_fmadd_ps(DL__WG_C(4.0f), d[s], _mm512_fmadd_ps(DL__WG_C(-5.0f), d[3 * s], d[5 * s]));
}
/* 6 = G 3 (weights) */
DL__GEMM_INLINE void dl__wg4_g(const __m512 *g, int s, __m512 *r, int rs)
{
    const __m512 a = _mm512_add_ps(g[0], g[2 * s]), b = _mm512_fmadd_ps(DL__WG_C(4.0f), g[2 * s], g[0]);
    r[0] = _mm512_mul_ps(DL__WG_C(0.25f), g[0]);
    r[rs] = _mm512_mul_ps(DL__WG_C(-1.0f / 6.0f), _mm512_add_ps(a, g[s]));
    r[2 * rs] = _mm512_mul_ps(DL__WG_C(-1.0f / 6.0f), _mm512_sub_ps(a, g[s]));
    r[3 * rs] = _mm512_mul_ps(DL__WG_C(1.0f / 24.0f), _mm512_fmadd_ps(DL__WG_C(2.0f), g[s], b));
    r[4 * rs] = _mm512_mul_ps(DL__WG_C(1.0f / 24.0f), _mm512_fnmadd_ps(DL__WG_C(2.0f), g[s], b));
    r[5 * rs] = g[2 * s];
}
/* 4 = A^T 6 (output) */
DL__GEMM_INLINE void dl__wg4_at(const __m512 *q, int s, __m512 *r, int rs)
{
    const __m512 a = _mm512_add_ps(q[s], q[2 * s]), b = _mm512_add_ps(q[3 * s], q[4 * s]);
    const __m512 e = _mm512_sub_ps(q[s], q[2 * s]), f = _mm512_sub_ps(q[3 * s], q[4 * s]);
    r[0] = _mm512_add_ps(_mm512_add_ps(q[0], a), b);
    r[rs] = _mm512_fmadd_ps(DL__WG_C(2.0f), f, e);
    r[2 * rs] = _mm512_fmadd_ps(DL__WG_C(4.0f), b, a);
    r[3 * rs] = _mm512_add_ps(_mm512_fmadd_ps(DL__WG_C(8.0f), f, e), q[5 * s]);
}
/* 6 = A 4 (output gradient) */
DL__GEMM_INLINE void dl__wg4_a(const __m512 *e, int s, __m512 *r, int rs)
{
    const __m512 a = _mm512_add_ps(e[0], e[2 * s]), b = _mm512_add_ps(e[s], e[3 * s]);
    const __m512 c = _mm512_fmadd_ps(DL__WG_C(4.0f), e[2 * s], e[0]), d = _mm512_fmadd_ps(DL__WG_C(4.0f), e[3 * s], e[s]);
    r[0] = e[0];
    r[rs] = _mm512_add_ps(a, b);
    r[2 * rs] = _mm512_sub_ps(a, b);
    r[3 * rs] = _mm512_fmadd_ps(DL__WG_C(2.0f), d, c);
    r[4 * rs] = _mm512_fnmadd_ps(DL__WG_C(2.0f), d, c);
    r[5 * rs] = e[3 * s];
}
/* 3 = G^T 6 (weight gradient) */
DL__GEMM_INLINE void dl__wg4_gt(const __m512 *q, int s, __m512 *r, int rs)
{
    const __m512 a = _mm512_add_ps(q[s], q[2 * s]), b = _mm512_add_ps(q[3 * s], q[4 * s]);
    const __m512 e = _mm512_sub_ps(q[s], q[2 * s]), f = _mm512_sub_ps(q[3 * s], q[4 * s]);
    r[0] = _mm512_fmadd_ps(DL__WG_C(0.25f), q[0],
                           _mm512_fmadd_ps(DL__WG_C(-1.0f / 6.0f), a, _mm512_mul_ps(DL__WG_C(1.0f / 24.0f), b)));
    r[rs] = _mm512_fmadd_ps(DL__WG_C(-1.0f / 6.0f), e, _mm512_mul_ps(DL__WG_C(1.0f / 12.0f), f));
    r[2 * rs] = _mm512_fmadd_ps(DL__WG_C(1.0f / 6.0f), _mm512_sub_ps(b, a), q[5 * s]);
}

/* o (k x k) = F x F^T for x (n x n, row-major), F the one-dimensional
   transform f (n values in, k out): f down each column, then along each row */
DL__GEMM_INLINE void dl__wg4_2d(void (*f)(const __m512 *, int, __m512 *, int), int n, int k, const __m512 *x,
                                __m512 *o)
{
    __m512 t[36];   /* k x n */
    int i, j;
    for (j = 0; j < n; j++) f(x + j, n, t + j, n);
    for (i = 0; i < k; i++) f(t + i * n, 1, o + i * k, 1);
}

/* F(4x4, 3x3)'s transform of one tile into the 36 xi, 16 channels:
   o[xi] (os apart) = F x F^T, x the n x n tile at p (rows rs apart,
   columns cs apart), F from f (n values to 6): v = B^T d B of a 6x6
   input patch (f = dl__wg4_bt), z = A e A^T of a 4x4 output gradient
   (f = dl__wg4_a) */
DL__GEMM_INLINE void dl__wg4_tile(void (*f)(const __m512 *, int, __m512 *, int), int n, const float *p, int64_t rs,
                                  int64_t cs, float *o, int64_t os)
{
    __m512 x[36], t[36];
    int i, j;
    for (i = 0; i < n; i++)
        for (j = 0; j < n; j++) x[n * i + j] = _mm512_loadu_ps(p + i * rs + j * cs);
    dl__wg4_2d(f, n, 6, x, t);
    for (i = 0; i < 36; i++) _mm512_storeu_ps(o + i * os, t[i]);
}

/* v (A2 slices DL__WG_XS(T, Ci) apart, each (T, Ci)) for the nc samples in xp */
static void dl__wg_vblock(const dl__wg_job *J, const float *xp, int64_t nc, float *v, int64_t T)
{
    int64_t i, th, tw, c, Ci = J->Ci, t = 0, m = J->m;
    for (i = 0; i < nc; i++)
        for (th = 0; th < J->TH; th++)
            for (tw = 0; tw < J->TW; tw++, t++) {
                const float *p = xp + ((i * J->Hp + m * th) * J->Wp + m * tw) * Ci;
                if (m == 4)
                    for (c = 0; c < Ci; c += 16) dl__wg4_tile(dl__wg4_bt, 6, p + c, J->Wp * Ci, Ci, v + t * Ci + c, DL__WG_XS(T, Ci));
                else
                    for (c = 0; c < Ci; c += 16) dl__wg_vtile(p + c, J->Wp * Ci, Ci, v + t * Ci + c, DL__WG_XS(T, Ci));
            }
}

/* samples [n0, n0 + nc) of x into xp (and of gy into gp): transposed, padding untouched */
static void dl__wg_load(const dl__wg_job *J, int64_t n0, int64_t nc, float *xp, float *gp, __m512 *bad)
{
    int64_t i, c;
    for (i = 0; i < nc; i++) {
        for (c = 0; c < J->Ci; c += 16)
            dl__wg_in(J->x + ((n0 + i) * J->Ci + c) * J->L, J->L, J->L, xp + i * J->xpn + c, J->xoff, bad);
        if (gp)
            for (c = 0; c < J->Co; c += 16)
                dl__wg_in(J->gy + ((n0 + i) * J->Co + c) * J->OL, J->OL, J->OL, gp + i * J->gpn + c, J->goff, bad);
    }
}

/* U[xi] (Ci, Co) = G g G^T for input channels [lo, hi), 16 output channels
   a vector; g = w[co][ci], or with flip w[ci][co] turned by 180 degrees */
static void dl__wg_u_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__wg_job *J = (const dl__wg_job *)arg;
    const int64_t Ci = J->Ci, Co = J->Co, P = Ci * Co;
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)(J->flip ? 9 : 9 * Ci)));
    const __m512 h = _mm512_set1_ps(0.5f);
    int64_t ci, co;
    for (ci = lo; ci < hi; ci++)
        for (co = 0; co < Co; co += 16) {
            const float *src = J->flip ? J->w + (ci * Co + co) * 9 : J->w + (co * Ci + ci) * 9;
            __m512 g[3][3], t[4][3];
            float *u = J->u + ci * Co + co;
            int i, j;
            for (i = 0; i < 3; i++)
                for (j = 0; j < 3; j++) g[i][j] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), (__mmask16)0xFFFF, idx,
                                                     src + (J->flip ? 8 - 3 * i - j : 3 * i + j), 4);
            if (J->m == 4) {   /* G g G^T, 6x6 */
                __m512 o[36];
                dl__wg4_2d(dl__wg4_g, 3, 6, &g[0][0], o);
                for (i = 0; i < 36; i++) _mm512_storeu_ps(u + i * P, o[i]);
            } else {           /* 4x4 */
                for (j = 0; j < 3; j++) {
                    t[0][j] = g[0][j];
                    t[1][j] = _mm512_mul_ps(h, _mm512_add_ps(_mm512_add_ps(g[0][j], g[1][j]), g[2][j]));
                    t[2][j] = _mm512_mul_ps(h, _mm512_add_ps(_mm512_sub_ps(g[0][j], g[1][j]), g[2][j]));
                    t[3][j] = g[2][j];
                }
                for (i = 0; i < 4; i++) {
                    _mm512_storeu_ps(u + 4 * i * P, t[i][0]);
                    _mm512_storeu_ps(u + (4 * i + 1) * P,
                                     _mm512_mul_ps(h, _mm512_add_ps(_mm512_add_ps(t[i][0], t[i][1]), t[i][2])));
                    _mm512_storeu_ps(u + (4 * i + 2) * P,
                                     _mm512_mul_ps(h, _mm512_add_ps(_mm512_sub_ps(t[i][0], t[i][1]), t[i][2])));
                    _mm512_storeu_ps(u + (4 * i + 3) * P, t[i][2]);
                }
            }
        }
}

/* One tile's outputs, 16 channels: y = A^T q A + bv, q's (m+2)^2 values
   qs apart; the first nr rows (ys apart) and nw columns (cs apart) of the
   m x m tile are written (a plane's odd edge cuts it). F(2x2, 3x3): */
DL__GEMM_INLINE void dl__wg_ytile(const float *q0, int64_t qs, float *y, int64_t ys, int64_t cs, int nr, int nw,
                                  __m512 bv)
{
    __m512 q[16], s0[4], s1[4];
    int j;
    for (j = 0; j < 16; j++) q[j] = _mm512_loadu_ps(q0 + j * qs);
    for (j = 0; j < 4; j++) {
        s0[j] = _mm512_add_ps(_mm512_add_ps(q[j], q[4 + j]), q[8 + j]);
        s1[j] = _mm512_sub_ps(_mm512_sub_ps(q[4 + j], q[8 + j]), q[12 + j]);
    }
    _mm512_storeu_ps(y, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s0[0], s0[1]), s0[2]), bv));
    if (nw > 1) _mm512_storeu_ps(y + cs, _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s0[1], s0[2]), s0[3]), bv));
    if (nr > 1) {
        _mm512_storeu_ps(y + ys, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s1[0], s1[1]), s1[2]), bv));
        if (nw > 1)
            _mm512_storeu_ps(y + ys + cs, _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s1[1], s1[2]), s1[3]), bv));
    }
}
/* F(4x4, 3x3): */
DL__GEMM_INLINE void dl__wg4_ytile(const float *q0, int64_t qs, float *y, int64_t ys, int64_t cs, int nr, int nw,
                                   __m512 bv)
{
    __m512 q[36], o[16];
    int r, j;
    for (j = 0; j < 36; j++) q[j] = _mm512_loadu_ps(q0 + j * qs);
    dl__wg4_2d(dl__wg4_at, 6, 4, q, o);
    for (r = 0; r < nr; r++)
        for (j = 0; j < nw; j++) _mm512_storeu_ps(y + r * ys + j * cs, _mm512_add_ps(o[4 * r + j], bv));
}

/* yt (samples, OH OW, Co): for output channels [co0, co0 + cc) of each of
   the T tiles, y = A^T q A (+ bias), q (A2 slices of (T, cc)) */
static void dl__wg_yblock(const dl__wg_job *J, const float *q, int64_t T, int64_t cc, int64_t co0, float *yt)
{
    int64_t Co = J->Co, OH = J->OH, OW = J->OW, m = J->m, qs = DL__WG_XS(T, cc), t, c;
    for (t = 0; t < T; t++) {
        int64_t ti = t % (J->TH * J->TW), oh = m * (ti / J->TW), ow = m * (ti % J->TW);
        int nr = (int)(OH - oh < m ? OH - oh : m), nw = (int)(OW - ow < m ? OW - ow : m);
        float *y0 = yt + ((t / (J->TH * J->TW) * OH + oh) * OW + ow) * Co + co0;
        for (c = 0; c < cc; c += 16) {
            const __m512 bv = J->bias ? _mm512_loadu_ps(J->bias + co0 + c) : _mm512_setzero_ps();
            if (m == 4) dl__wg4_ytile(q + t * cc + c, qs, y0 + c, OW * Co, Co, nr, nw, bv);
            else dl__wg_ytile(q + t * cc + c, qs, y0 + c, OW * Co, Co, nr, nw, bv);
        }
    }
}

/* One tile's z[xi] (zs apart) = A e A^T, 16 channels, e the m x m output
   gradient at p (rows rs apart, columns cs apart). F(2x2, 3x3) (F(4x4, 3x3):
   dl__wg4_tile): */
DL__GEMM_INLINE void dl__wg_ztile(const float *p, int64_t rs, int64_t cs, float *z, int64_t zs)
{
    const __m512 zero = _mm512_setzero_ps();
    __m512 d00 = _mm512_loadu_ps(p), d01 = _mm512_loadu_ps(p + cs), d10 = _mm512_loadu_ps(p + rs),
           d11 = _mm512_loadu_ps(p + rs + cs), q[4][2];
    int r;
    q[0][0] = d00; q[0][1] = d01;
    q[1][0] = _mm512_add_ps(d00, d10); q[1][1] = _mm512_add_ps(d01, d11);
    q[2][0] = _mm512_sub_ps(d00, d10); q[2][1] = _mm512_sub_ps(d01, d11);
    q[3][0] = _mm512_sub_ps(zero, d10); q[3][1] = _mm512_sub_ps(zero, d11);
    for (r = 0; r < 4; r++) {
        float *o = z + 4 * r * zs;
        _mm512_storeu_ps(o, q[r][0]);
        _mm512_storeu_ps(o + zs, _mm512_add_ps(q[r][0], q[r][1]));
        _mm512_storeu_ps(o + 2 * zs, _mm512_sub_ps(q[r][0], q[r][1]));
        _mm512_storeu_ps(o + 3 * zs, _mm512_sub_ps(zero, q[r][1]));
    }
}

/* z (A2 slices of (T, Co)) = A dy A^T for the m x m output gradient of each tile of the nc samples in gp */
static void dl__wg_zblock(const dl__wg_job *J, const float *gp, int64_t nc, float *z, int64_t T)
{
    int64_t Co = J->Co, zs = DL__WG_XS(T, J->Co), m = J->m, rs = m * J->TW * Co, i, th, tw, c, t = 0;
    for (i = 0; i < nc; i++)
        for (th = 0; th < J->TH; th++)
            for (tw = 0; tw < J->TW; tw++, t++) {
                const float *p = gp + i * J->gpn + (m * th * m * J->TW + m * tw) * Co;
                for (c = 0; c < Co; c += 16) {
                    if (m == 4) dl__wg4_tile(dl__wg4_a, 4, p + c, rs, Co, z + t * Co + c, zs);
                    else dl__wg_ztile(p + c, rs, Co, z + t * Co + c, zs);
                }
            }
}

/* forward: blocks of samples claimed in turn */
static void dl__wg_fwd_task(void *arg, int64_t slot, int64_t end)
{
    dl__wg_job *J = (dl__wg_job *)arg;
    int64_t Ci = J->Ci, Co = J->Co, CC = J->CC, b;
    float *xp = J->bufs + slot * J->stride, *v = xp + dl__round_up(J->nb * J->xpn, 16);
    float *m = v + J->A2 * DL__WG_XS(J->T, Ci), *yt = m + J->A2 * DL__WG_XS(J->T, CC);
    __m512 bad = _mm512_setzero_ps();
    (void)end;
    while ((b = dl__claim(&J->cl)) < J->nblk) {
        int64_t n0 = b * J->nb, nc = J->n - n0 < J->nb ? J->n - n0 : J->nb, T = nc * J->TH * J->TW;
        int64_t co0, xi, i, c;
        dl__wg_load(J, n0, nc, xp, NULL, &bad);
        dl__wg_vblock(J, xp, nc, v, T);
        for (co0 = 0; co0 < Co; co0 += CC) {
            int64_t cc = Co - co0 < CC ? Co - co0 : CC;
            for (xi = 0; xi < J->A2; xi++)
                dl__wg_gemm(T, cc, Ci, v + xi * DL__WG_XS(T, Ci), Ci, 1, J->u + xi * Ci * Co + co0, Co,
                            m + xi * DL__WG_XS(T, cc), cc, 0);
            dl__wg_yblock(J, m, T, cc, co0, yt);
        }
        for (i = 0; i < nc; i++)
            for (c = 0; c < Co; c += 16)
                dl__wg_out(yt + i * J->OL * Co + c, Co, J->OL, J->y + ((n0 + i) * Co + c) * J->OL, J->OL);
    }
    _mm512_storeu_ps(J->bad + 16 * slot, bad);
}

/* weight gradient: chunks of samples claimed in turn, each summed into its own S */
static void dl__wg_wgrad_task(void *arg, int64_t slot, int64_t end)
{
    dl__wg_job *J = (dl__wg_job *)arg;
    int64_t Ci = J->Ci, Co = J->Co, ch;
    float *xp = J->bufs + slot * J->stride, *v = xp + dl__round_up(J->nb * J->xpn, 16);
    float *gp = v + J->A2 * DL__WG_XS(J->T, Ci), *z = gp + dl__round_up(J->nb * J->gpn, 16);
    __m512 bad = _mm512_setzero_ps();
    (void)end;
    while ((ch = dl__claim(&J->cl)) < J->nchunk) {
        int64_t s0 = J->n * ch / J->nchunk, s1 = J->n * (ch + 1) / J->nchunk, n0;
        float *S = J->s + ch * J->A2 * Co * Ci;
        for (n0 = s0; n0 < s1; n0 += J->nb) {
            int64_t nc = s1 - n0 < J->nb ? s1 - n0 : J->nb, T = nc * J->TH * J->TW, xi;
            dl__wg_load(J, n0, nc, xp, gp, &bad);
            dl__wg_vblock(J, xp, nc, v, T);
            dl__wg_zblock(J, gp, nc, z, T);
            for (xi = 0; xi < J->A2; xi++)
                dl__wg_gemm(Co, Ci, T, z + xi * DL__WG_XS(T, Co), 1, Co, v + xi * DL__WG_XS(T, Ci), Ci,
                            S + xi * Co * Ci, Ci, n0 > s0);
        }
    }
    _mm512_storeu_ps(J->bad + 16 * slot, bad);
}

/* dw[co] = G^T (the chunks' S summed in order) G, 16 input channels a vector */
static void dl__wg_dw_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__wg_job *J = (const dl__wg_job *)arg;
    const int64_t Ci = J->Ci, Co = J->Co;
    const __m512 h = _mm512_set1_ps(0.5f);
    int64_t co, ci, ch;
    for (co = lo; co < hi; co++)
        for (ci = 0; ci < Ci; ci += 16) {
            __m512 s[36], t[3][4], o;
            float r[9][16], *dw = J->y + (co * Ci + ci) * 9;
            int i, j, l;
            for (i = 0; i < J->A2; i++) {
                s[i] = _mm512_loadu_ps(J->s + (i * Co + co) * Ci + ci);
                for (ch = 1; ch < J->nchunk; ch++)
                    s[i] = _mm512_add_ps(s[i], _mm512_loadu_ps(J->s + ((ch * J->A2 + i) * Co + co) * Ci + ci));
            }
            if (J->m == 4) {   /* G^T S G, S 6x6 */
                __m512 q[9];
                dl__wg4_2d(dl__wg4_gt, 6, 3, s, q);
                for (i = 0; i < 9; i++) _mm512_storeu_ps(r[i], q[i]);
            } else {           /* S 4x4 */
                for (j = 0; j < 4; j++) {
                    const __m512 p = _mm512_mul_ps(h, _mm512_add_ps(s[4 + j], s[8 + j]));
                    t[0][j] = _mm512_add_ps(s[j], p);
                    t[1][j] = _mm512_mul_ps(h, _mm512_sub_ps(s[4 + j], s[8 + j]));
                    t[2][j] = _mm512_add_ps(p, s[12 + j]);
                }
                for (i = 0; i < 3; i++) {
                    o = _mm512_mul_ps(h, _mm512_add_ps(t[i][1], t[i][2]));
                    _mm512_storeu_ps(r[3 * i], _mm512_add_ps(t[i][0], o));
                    _mm512_storeu_ps(r[3 * i + 1], _mm512_mul_ps(h, _mm512_sub_ps(t[i][1], t[i][2])));
                    _mm512_storeu_ps(r[3 * i + 2], _mm512_add_ps(o, t[i][3]));
                }
            }
            for (l = 0; l < 16; l++)
                for (i = 0; i < 9; i++) dw[9 * l + i] = r[i][l];
        }
}

/* the job's shape and per-thread buffers: head floats first (shared), then
   the slots; false: no memory */
static bool dl__wg_setup(dl__dev *d, dl__wg_job *J, const dl__cgeom *g, int64_t n, bool wgrad, int tile,
                         int64_t *nslots, void **raw)
{
    dl__pool *pool = d->ctx->pool;
    int64_t head, tabs, p, s, W = g->ia[2];
    float *buf;
    int64_t *xoff, *goff;
    J->Ci = g->Ca;
    J->Co = g->Cb;
    J->L = g->La;
    J->OL = g->Lb;
    J->OH = g->ib[1];
    J->OW = g->ib[2];
    J->m = tile ? tile : dl__wg_tile(J->OH, J->OW);
    J->A2 = (J->m + 2) * (J->m + 2);
    J->TH = (J->OH + J->m - 1) / J->m;
    J->TW = (J->OW + J->m - 1) / J->m;
    J->Hp = J->m * J->TH + 2;
    J->Wp = J->m * J->TW + 2;
    J->n = n;
    J->nb = (DL__WG_TILES * 4 / (J->m * J->m) + J->TH * J->TW - 1) / (J->TH * J->TW);
    if (J->nb > n) J->nb = n;
    J->T = J->nb * J->TH * J->TW;
    J->CC = J->Co < 64 ? J->Co : 64;
    J->xpn = J->Hp * J->Wp * J->Ci;
    J->gpn = J->m * J->m * J->TH * J->TW * J->Co;
    J->nblk = (n + J->nb - 1) / J->nb;
    J->nchunk = n < DL__WG_CHUNKS ? n : DL__WG_CHUNKS;
    *nslots = dl__pool_size(pool);
    if (*nslots > (wgrad ? J->nchunk : J->nblk)) *nslots = wgrad ? J->nchunk : J->nblk;
    J->stride = dl__round_up(J->nb * J->xpn, 16) + J->A2 * DL__WG_XS(J->T, J->Ci) +
                (wgrad ? dl__round_up(J->nb * J->gpn, 16) + J->A2 * DL__WG_XS(J->T, J->Co)
                       : J->A2 * DL__WG_XS(J->T, J->CC) + J->nb * J->OL * J->Co);
    J->stride = dl__round_up(J->stride, 16);
    tabs = dl__round_up(2 * (J->L + J->OL), 16);
    head = tabs + 16 * *nslots + J->A2 * J->Ci * J->Co * (wgrad ? J->nchunk : 1);
    buf = dl__gemm_buf_get(pool, sizeof(float) * (size_t)(head + *nslots * J->stride), raw);
    if (!buf) return false;
    xoff = (int64_t *)(void *)buf;
    goff = xoff + J->L;
    for (p = 0; p < J->L; p++)
        xoff[p] = ((p / W + g->p[1]) * J->Wp + p % W + g->p[2]) * J->Ci;
    for (p = 0; p < J->OL; p++) goff[p] = (p / J->OW * J->m * J->TW + p % J->OW) * J->Co;
    J->xoff = xoff;
    J->goff = goff;
    J->bad = buf + tabs;
    J->u = J->s = J->bad + 16 * *nslots;
    J->bufs = J->u + J->A2 * J->Ci * J->Co * (wgrad ? J->nchunk : 1);
    for (s = 0; s < *nslots; s++) {   /* the padding of xp and gp stays zero */
        float *b = J->bufs + s * J->stride;
        memset(b, 0, sizeof(float) * (size_t)J->nb * (size_t)J->xpn);
        if (wgrad) memset(b + dl__round_up(J->nb * J->xpn, 16) + J->A2 * DL__WG_XS(J->T, J->Ci), 0,
                          sizeof(float) * (size_t)J->nb * (size_t)J->gpn);
    }
    return true;
}

/* runs the task on the slots; false when an input held inf or NaN */
static bool dl__wg_run(dl__dev *d, dl__wg_job *J, int64_t nslots, dl__task_fn task)
{
    int64_t s;
    int i;
    bool ok = true;
    dl__claim_run(d->ctx->pool, &J->cl, nslots, task, J);
    for (s = 0; s < nslots; s++)
        for (i = 0; i < 16; i++) ok = ok && J->bad[16 * s + i] == 0.0f;
    return ok;
}

/* the backend entries (dl__backend.conv_wg, conv_wg_wgrad) through dl__wg_conv and
   dl__wg_wgrad with tile 0 (dl__wg_tile picks; tests force 2 or 4) */
static bool dl__wg_conv(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                        const dl__cgeom *g, bool flip, int tile)
{
    dl__wg_job J;
    int64_t nslots;
    void *raw;
    bool ok;
    if (!dl__wg_ok(g, n) || dl__cpu_nonfinite(d, w, g->Ca * g->Cb * 9) >= 0) return false;
    memset(&J, 0, sizeof J);
    if (!dl__wg_setup(d, &J, g, n, false, tile, &nslots, &raw)) return false;
    J.x = (const float *)DL__RAW(d, x);
    J.w = (const float *)DL__RAW(d, w);
    J.bias = (const float *)DL__RAW0(d, bias);
    J.y = (float *)DL__RAW(d, y);
    J.flip = flip;
    dl__parallel_for(d->ctx->pool, J.Ci, 1, dl__wg_u_task, &J);
    ok = dl__wg_run(d, &J, nslots, dl__wg_fwd_task);
    dl__gemm_buf_put(d->ctx->pool, raw);
    return ok;
}

static bool dl__wg_wgrad(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n, const dl__cgeom *g,
                         int tile)
{
    dl__wg_job J;
    int64_t nslots;
    void *raw;
    bool ok;
    if (!dl__wg_ok(g, n)) return false;
    memset(&J, 0, sizeof J);
    if (!dl__wg_setup(d, &J, g, n, true, tile, &nslots, &raw)) return false;
    J.x = (const float *)DL__RAW(d, x);
    J.gy = (const float *)DL__RAW(d, gy);
    J.y = (float *)DL__RAW(d, dw);
    ok = dl__wg_run(d, &J, nslots, dl__wg_wgrad_task);
    if (ok) dl__parallel_for(d->ctx->pool, J.Co, 1, dl__wg_dw_task, &J);
    dl__gemm_buf_put(d->ctx->pool, raw);
    return ok;
}

static bool dl__cpu_conv_wg(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                            const dl__cgeom *g, bool flip)
{
    return dl__wg_conv(d, y, x, w, bias, n, g, flip, 0);
}

static bool dl__cpu_conv_wg_wgrad(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n,
                                  const dl__cgeom *g)
{
    return dl__wg_wgrad(d, dw, x, gy, n, g, 0);
}
#endif

typedef struct dl__bias_args { float *y; const float *b; int64_t C, L; } dl__bias_args;

static void dl__bias_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__bias_args *u = (const dl__bias_args *)arg;
    dl__bias_rows(u->y, u->b, u->C, u->L, lo, hi);
}

static void dl__cpu_bias_add(dl__dev *d, float *y, const float *b, int64_t n, int64_t C, int64_t L)
{
    y = (float *)DL__RAW(d, y);
    b = (const float *)DL__RAW(d, b);
    dl__bias_args u;
    u.y = y; u.b = b; u.C = C; u.L = L;
    dl__parallel_for(d->ctx->pool, n * C, (1 << 15) / (L + 1) + 1, dl__bias_task, &u);
}

/* Window of output o along dim i: [*lo, *hi) inside the input, and the count
   PyTorch divides by with count_include_pad (window clipped at in + pad). */
static void dl__pwin(const dl__pgeom *g, int i, int64_t o, int64_t *lo, int64_t *hi, int64_t *padded)
{
    if (g->adaptive) {
        *lo = o * g->ia[i] / g->ob[i];
        *hi = ((o + 1) * g->ia[i] + g->ob[i] - 1) / g->ob[i];
        *padded = *hi - *lo;
    } else {
        int64_t a = o * g->s[i] - g->p[i], b = a + g->k[i];
        if (b > g->ia[i] + g->p[i]) b = g->ia[i] + g->p[i];
        *padded = b - a;
        *lo = a < 0 ? 0 : a;
        *hi = b > g->ia[i] ? g->ia[i] : b;
    }
}

typedef struct dl__pool_args {
    float *y; int64_t *idx; const float *x; const dl__pgeom *g;
} dl__pool_args;

/* The common 2-d window without dilation, a plane at a time: the window
   rows and columns are clipped once per output row and column, and the
   2x2 stride-2 window (LeNet's, ResNet's) is unrolled. Same tie and NaN
   rule as the general loop: the first maximum, a NaN wins. */
#define DL__MAXSTEP(at) do { float v_ = x[at]; if (v_ > m || v_ != v_) { m = v_; best = (at); } } while (0)
static void dl__maxpool2d_plane(const float *DL__RESTRICT x, float *DL__RESTRICT y,
                                int64_t *DL__RESTRICT idx, const dl__pgeom *g)
{
    int64_t H = g->ia[1], W = g->ia[2], OH = g->ob[1], OW = g->ob[2], o1, o2;
    if (g->k[1] == 2 && g->k[2] == 2 && g->s[1] == 2 && g->s[2] == 2 && g->p[1] == 0 && g->p[2] == 0 &&
        2 * OH <= H && 2 * OW <= W) {
        for (o1 = 0; o1 < OH; o1++) {
            int64_t r = 2 * o1 * W;
            float *yr = y + o1 * OW;
            int64_t *ir = idx ? idx + o1 * OW : NULL;
            o2 = 0;
#if defined(DL__GEMM_AVX512)
            /* 16 outputs at a time: the window's four taps as four vectors
               (even and odd columns of the two rows), the same sequential
               rule per lane; the tail with masks */
            for (; o2 < OW; o2 += 16) {
                const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
                int64_t nout = OW - o2 < 16 ? OW - o2 : 16, nin = 2 * nout;
                __mmask16 mo = (__mmask16)((1u << nout) - 1u);
                __mmask16 m0 = (__mmask16)(nin >= 16 ? 0xFFFFu : (1u << nin) - 1u);
                __mmask16 m1 = (__mmask16)(nin >= 32 ? 0xFFFFu : nin <= 16 ? 0u : (1u << (nin - 16)) - 1u);
                const float *p0 = x + r + 2 * o2, *p1 = p0 + W;
                __m512 a0 = _mm512_maskz_loadu_ps(m0, p0), a1 = _mm512_maskz_loadu_ps(m1, p0 + 16);
                __m512 b0 = _mm512_maskz_loadu_ps(m0, p1), b1 = _mm512_maskz_loadu_ps(m1, p1 + 16);
                __m512 m = _mm512_permutex2var_ps(a0, ev, a1), v;
                __m512i off = _mm512_setzero_si512();
                __mmask16 k;
#define DL__MAXV(src, o) do { v = (src); \
        k = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); \
        m = _mm512_mask_mov_ps(m, k, v); off = _mm512_mask_mov_epi32(off, k, _mm512_set1_epi32(o)); } while (0)
                DL__MAXV(_mm512_permutex2var_ps(a0, od, a1), 1);
                DL__MAXV(_mm512_permutex2var_ps(b0, ev, b1), (int)W);
                DL__MAXV(_mm512_permutex2var_ps(b0, od, b1), (int)W + 1);
#undef DL__MAXV
                _mm512_mask_storeu_ps(yr + o2, mo, m);
                if (ir) {
                    const __m512i lane = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
                    __m512i base = _mm512_add_epi64(_mm512_set1_epi64(r + 2 * o2), lane);
                    __m512i lo = _mm512_add_epi64(base, _mm512_maskz_cvtepi32_epi64((__mmask8)0xFF, _mm512_maskz_extracti64x4_epi64((__mmask8)0xF, off, 0)));
                    __m512i hi = _mm512_add_epi64(_mm512_add_epi64(base, _mm512_set1_epi64(16)),
                                                  _mm512_maskz_cvtepi32_epi64((__mmask8)0xFF, _mm512_maskz_extracti64x4_epi64((__mmask8)0xF, off, 1)));
                    _mm512_mask_storeu_epi64(ir + o2, (__mmask8)(mo & 0xFF), lo);
                    _mm512_mask_storeu_epi64(ir + o2 + 8, (__mmask8)(mo >> 8), hi);
                }
            }
#endif
            for (; o2 < OW; o2++) {
                int64_t at = r + 2 * o2, best = at;
                float m = x[at];
                DL__MAXSTEP(at + 1);
                DL__MAXSTEP(at + W);
                DL__MAXSTEP(at + W + 1);
                yr[o2] = m;
                if (ir) ir[o2] = best;
            }
        }
        return;
    }
    for (o1 = 0; o1 < OH; o1++) {
        int64_t r0 = o1 * g->s[1] - g->p[1], r1 = r0 + g->k[1];
        if (r0 < 0) r0 = 0;
        if (r1 > H) r1 = H;
        for (o2 = 0; o2 < OW; o2++) {
            int64_t c0 = o2 * g->s[2] - g->p[2], c1 = c0 + g->k[2], r, c, best = -1;
            float m = -INFINITY;
            if (c0 < 0) c0 = 0;
            if (c1 > W) c1 = W;
            for (r = r0; r < r1; r++)
                for (c = c0; c < c1; c++) {
                    float v = x[r * W + c];
                    if (best < 0 || v > m || v != v) { m = v; best = r * W + c; }
                }
            y[o1 * OW + o2] = m;
            if (idx) idx[o1 * OW + o2] = best;
        }
    }
}
#undef DL__MAXSTEP

static void dl__maxpool_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__pool_args *u = (const dl__pool_args *)arg;
    const dl__pgeom *g = u->g;
    int64_t q, o0, o1, o2;
    /* the 2-d plane: one depth window that holds depth 0 (its taps at -p0 + t d0) */
    if (g->ia[0] == 1 && g->ob[0] == 1 && g->p[0] % g->d[0] == 0 && g->d[1] == 1 && g->d[2] == 1) {
        for (q = lo; q < hi; q++)
            dl__maxpool2d_plane(u->x + q * g->La, u->y + q * g->Lb, u->idx ? u->idx + q * g->Lb : NULL, g);
        return;
    }
    for (q = lo; q < hi; q++) {
        const float *x = u->x + q * g->La;
        float *y = u->y + q * g->Lb;
        int64_t *idx = u->idx ? u->idx + q * g->Lb : NULL;
        for (o0 = 0; o0 < g->ob[0]; o0++)
            for (o1 = 0; o1 < g->ob[1]; o1++)
                for (o2 = 0; o2 < g->ob[2]; o2++) {
                    int64_t st[3], en[3], o[3], j0, j1, j2, best = -1;
                    float m = -INFINITY;
                    int i;
                    o[0] = o0; o[1] = o1; o[2] = o2;
                    for (i = 0; i < 3; i++) {
                        /* first in-range tap, and one past the last tap */
                        st[i] = o[i] * g->s[i] - g->p[i];
                        en[i] = st[i] + (g->k[i] - 1) * g->d[i] + 1;
                        if (en[i] > g->ia[i]) en[i] = g->ia[i];
                        while (st[i] < 0) st[i] += g->d[i];
                    }
                    for (j0 = st[0]; j0 < en[0]; j0 += g->d[0])
                        for (j1 = st[1]; j1 < en[1]; j1 += g->d[1])
                            for (j2 = st[2]; j2 < en[2]; j2 += g->d[2]) {
                                int64_t at = (j0 * g->ia[1] + j1) * g->ia[2] + j2;
                                float v = x[at];
                                if (best < 0 || v > m || v != v) { m = v; best = at; }
                            }
                    {
                        int64_t oi = (o0 * g->ob[1] + o1) * g->ob[2] + o2;
                        y[oi] = m;
                        if (idx) idx[oi] = best;
                    }
                }
    }
}

static void dl__cpu_max_pool(dl__dev *d, float *y, int64_t *idx, const float *x, int64_t planes,
                             const dl__pgeom *g)
{
    y = (float *)DL__RAW(d, y);
    idx = (int64_t *)DL__RAW0(d, idx);
    x = (const float *)DL__RAW(d, x);
    dl__pool_args u;
    u.y = y; u.idx = idx; u.x = x; u.g = g;
    dl__parallel_for(d->ctx->pool, planes, (1 << 14) / (g->La + 1) + 1, dl__maxpool_task, &u);
}

typedef struct dl__scat_args {
    float *dst; const float *src; const int64_t *idx; int64_t Lin, Lout; bool scatter;
} dl__scat_args;

static void dl__scat_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__scat_args *u = (const dl__scat_args *)arg;
    int64_t q, o;
    for (q = lo; q < hi; q++) {
        const int64_t *idx = u->idx + q * u->Lout;
        if (u->scatter) {
            float *dx = u->dst + q * u->Lin;
            const float *g = u->src + q * u->Lout;
            memset(dx, 0, sizeof(float) * (size_t)u->Lin);
            for (o = 0; o < u->Lout; o++)
                if (idx[o] >= 0 && idx[o] < u->Lin) dx[idx[o]] += g[o];
        } else {
            float *y = u->dst + q * u->Lout;
            const float *x = u->src + q * u->Lin;
            for (o = 0; o < u->Lout; o++)
                y[o] = (idx[o] >= 0 && idx[o] < u->Lin) ? x[idx[o]] : 0.0f;
        }
    }
}

static void dl__cpu_unpool(dl__dev *d, float *dx, const float *g, const int64_t *idx, int64_t planes,
                           int64_t Lin, int64_t Lout)
{
    dx = (float *)DL__RAW(d, dx);
    g = (const float *)DL__RAW(d, g);
    idx = (const int64_t *)DL__RAW(d, idx);
    dl__scat_args u;
    u.dst = dx; u.src = g; u.idx = idx; u.Lin = Lin; u.Lout = Lout; u.scatter = true;
    dl__parallel_for(d->ctx->pool, planes, (1 << 14) / (Lin + Lout + 1) + 1, dl__scat_task, &u);
}

static void dl__cpu_gather(dl__dev *d, float *y, const float *x, const int64_t *idx, int64_t planes,
                           int64_t Lin, int64_t Lout)
{
    y = (float *)DL__RAW(d, y);
    x = (const float *)DL__RAW(d, x);
    idx = (const int64_t *)DL__RAW(d, idx);
    dl__scat_args u;
    u.dst = y; u.src = x; u.idx = idx; u.Lin = Lin; u.Lout = Lout; u.scatter = false;
    dl__parallel_for(d->ctx->pool, planes, (1 << 14) / (Lout + 1) + 1, dl__scat_task, &u);
}

/* a loader's batch, a sample per task (dl__batch_px: the CUDA kernel's math) */
typedef struct dl__lb_args {
    float *x; int64_t *y; const uint8_t *data; const int64_t *labels, *plan; const dl__batchgeom *g;
} dl__lb_args;

static void dl__lb_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__lb_args *u = (const dl__lb_args *)arg;
    int64_t j, r, sn = u->g->sn;
    for (j = lo; j < hi; j++) {
        int64_t i = u->plan[2 * j], aug = u->plan[2 * j + 1];
        const uint8_t *src = u->data + i * sn;
        float *x = u->x + j * sn;
        for (r = 0; r < sn; r++) x[r] = dl__batch_px(src, r, aug, u->g);
        u->y[j] = u->labels[i];
    }
}

static void dl__cpu_load_batch(dl__dev *d, float *x, int64_t *y, const uint8_t *data, const int64_t *labels,
                               const int64_t *plan, int64_t cnt, const dl__batchgeom *g)
{
    dl__lb_args u;
    u.x = (float *)DL__RAW(d, x);
    u.y = (int64_t *)DL__RAW(d, y);
    u.data = (const uint8_t *)DL__RAW(d, data);
    u.labels = (const int64_t *)DL__RAW(d, labels);
    u.plan = (const int64_t *)DL__RAW(d, plan);
    u.g = g;
    dl__parallel_for(d->ctx->pool, cnt, (1 << 14) / (g->sn + 1) + 1, dl__lb_task, &u);
}

/* avg pooling, forward (adj = false: y = mean of window) or adjoint
   (adj = true: x[window] += y / divisor), one plane per task */
typedef struct dl__avg_args { float *x; float *y; const dl__pgeom *g; bool adj; } dl__avg_args;

/* The 2-d window (ia[0] == 1), a plane at a time: the column windows are
   worked out once per plane, and the 2x2 stride-2 window without padding is
   unrolled. Sums and adjoint contributions in the general loop's order, so
   the bits are the same. */
#define DL__AVG_MAXW 512
static void dl__avgpool2d_plane(float *DL__RESTRICT x, float *DL__RESTRICT y, const dl__pgeom *g,
                                bool adj)
{
    int64_t W = g->ia[2], OH = g->ob[1], OW = g->ob[2], o1, o2, j1, j2;
    int64_t cl[DL__AVG_MAXW], ch[DL__AVG_MAXW], cp[DL__AVG_MAXW];
    if (!g->adaptive && g->k[1] == 2 && g->k[2] == 2 && g->s[1] == 2 && g->s[2] == 2 &&
        g->p[1] == 0 && g->p[2] == 0 && 2 * OH <= g->ia[1] && 2 * OW <= W) {
#if defined(DL__GEMM_AVX512)
        /* the vector loop stores every position its windows cover */
        if (adj && (2 * OH < g->ia[1] || 2 * OW < W)) memset(x, 0, sizeof(float) * (size_t)g->La);
#else
        if (adj) memset(x, 0, sizeof(float) * (size_t)g->La);
#endif
        for (o1 = 0; o1 < OH; o1++) {
            float *xr = x + 2 * o1 * W, *yr = y + o1 * OW;
            o2 = 0;
#if defined(DL__GEMM_AVX512)
            /* 16 outputs at a time: the even and odd columns of the two rows
               as four vectors, the scalar loop's operations per lane (the
               adjoint adds to the zeros, as += does: -0 becomes +0) */
            for (; o2 < OW; o2 += 16) {
                const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
                const __m512 z = _mm512_setzero_ps(), q = _mm512_set1_ps(4.0f);
                int64_t nout = OW - o2 < 16 ? OW - o2 : 16, nin = 2 * nout;
                __mmask16 mo = (__mmask16)((1u << nout) - 1u);
                __mmask16 m0 = (__mmask16)(nin >= 16 ? 0xFFFFu : (1u << nin) - 1u);
                __mmask16 m1 = (__mmask16)(nin >= 32 ? 0xFFFFu : nin <= 16 ? 0u : (1u << (nin - 16)) - 1u);
                float *p0 = xr + 2 * o2, *p1 = p0 + W;
                if (adj) {
                    /* lanes 0-15 of the pairs: v0 v0 v1 v1 ... */
                    const __m512i lo = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
                    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
                    __m512 v = _mm512_add_ps(z, _mm512_div_ps(_mm512_maskz_loadu_ps(mo, yr + o2), q));
                    __m512 a = _mm512_maskz_permutexvar_ps((__mmask16)0xFFFF, lo, v),
                           b = _mm512_maskz_permutexvar_ps((__mmask16)0xFFFF, hi, v);
                    _mm512_mask_storeu_ps(p0, m0, a);
                    _mm512_mask_storeu_ps(p0 + 16, m1, b);
                    _mm512_mask_storeu_ps(p1, m0, a);
                    _mm512_mask_storeu_ps(p1 + 16, m1, b);
                } else {
                    __m512 a0 = _mm512_maskz_loadu_ps(m0, p0), a1 = _mm512_maskz_loadu_ps(m1, p0 + 16);
                    __m512 b0 = _mm512_maskz_loadu_ps(m0, p1), b1 = _mm512_maskz_loadu_ps(m1, p1 + 16);
                    __m512 t = _mm512_add_ps(z, _mm512_permutex2var_ps(a0, ev, a1));
                    t = _mm512_add_ps(t, _mm512_permutex2var_ps(a0, od, a1));
                    t = _mm512_add_ps(t, _mm512_permutex2var_ps(b0, ev, b1));
                    t = _mm512_add_ps(t, _mm512_permutex2var_ps(b0, od, b1));
                    _mm512_mask_storeu_ps(yr + o2, mo, _mm512_div_ps(t, q));
                }
            }
#endif
            for (; o2 < OW; o2++) {
                float *p = xr + 2 * o2;
                if (adj) {
                    float v = yr[o2] / 4.0f;
                    p[0] += v; p[1] += v; p[W] += v; p[W + 1] += v;
                } else {
                    float s = 0.0f;
                    s += p[0]; s += p[1]; s += p[W]; s += p[W + 1];
                    yr[o2] = s / 4.0f;
                }
            }
        }
        return;
    }
    if (adj) memset(x, 0, sizeof(float) * (size_t)g->La);
    for (o2 = 0; o2 < OW; o2++) dl__pwin(g, 2, o2, &cl[o2], &ch[o2], &cp[o2]);
    for (o1 = 0; o1 < OH; o1++) {
        int64_t l1, h1, p1;
        dl__pwin(g, 1, o1, &l1, &h1, &p1);
        for (o2 = 0; o2 < OW; o2++) {
            int64_t oi = o1 * OW + o2, l2 = cl[o2], h2 = ch[o2], div;
            if (l1 >= h1 || l2 >= h2) {
                if (!adj) y[oi] = 0.0f;
                continue;
            }
            div = (g->count_include_pad || g->adaptive) ? p1 * cp[o2] : (h1 - l1) * (h2 - l2);
            if (adj) {
                float v = y[oi] / (float)div;
                for (j1 = l1; j1 < h1; j1++)
                    for (j2 = l2; j2 < h2; j2++) x[j1 * W + j2] += v;
            } else {
                float s = 0.0f;
                for (j1 = l1; j1 < h1; j1++)
                    for (j2 = l2; j2 < h2; j2++) s += x[j1 * W + j2];
                y[oi] = s / (float)div;
            }
        }
    }
}

static void dl__avgpool_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__avg_args *u = (const dl__avg_args *)arg;
    const dl__pgeom *g = u->g;
    int64_t q, o0, o1, o2;
    /* (depth padding would count in the divisor: the general loop) */
    if (g->ia[0] == 1 && g->ob[0] == 1 && g->p[0] == 0 && g->ob[2] <= DL__AVG_MAXW) {
        for (q = lo; q < hi; q++) dl__avgpool2d_plane(u->x + q * g->La, u->y + q * g->Lb, g, u->adj);
        return;
    }
    for (q = lo; q < hi; q++) {
        float *x = u->x + q * g->La, *y = u->y + q * g->Lb;
        if (u->adj) memset(x, 0, sizeof(float) * (size_t)g->La);
        for (o0 = 0; o0 < g->ob[0]; o0++)
            for (o1 = 0; o1 < g->ob[1]; o1++)
                for (o2 = 0; o2 < g->ob[2]; o2++) {
                    int64_t l[3], h[3], pc[3], j0, j1, j2, div;
                    int64_t oi = (o0 * g->ob[1] + o1) * g->ob[2] + o2;
                    dl__pwin(g, 0, o0, &l[0], &h[0], &pc[0]);
                    dl__pwin(g, 1, o1, &l[1], &h[1], &pc[1]);
                    dl__pwin(g, 2, o2, &l[2], &h[2], &pc[2]);
                    if (l[0] >= h[0] || l[1] >= h[1] || l[2] >= h[2]) {
                        if (!u->adj) y[oi] = 0.0f;
                        continue;
                    }
                    div = (g->count_include_pad || g->adaptive)
                        ? pc[0] * pc[1] * pc[2]
                        : (h[0] - l[0]) * (h[1] - l[1]) * (h[2] - l[2]);
                    if (u->adj) {
                        float v = y[oi] / (float)div;
                        for (j0 = l[0]; j0 < h[0]; j0++)
                            for (j1 = l[1]; j1 < h[1]; j1++)
                                for (j2 = l[2]; j2 < h[2]; j2++)
                                    x[(j0 * g->ia[1] + j1) * g->ia[2] + j2] += v;
                    } else {
                        float s = 0.0f;
                        for (j0 = l[0]; j0 < h[0]; j0++)
                            for (j1 = l[1]; j1 < h[1]; j1++)
                                for (j2 = l[2]; j2 < h[2]; j2++)
                                    s += x[(j0 * g->ia[1] + j1) * g->ia[2] + j2];
                        y[oi] = s / (float)div;
                    }
                }
    }
}

static void dl__cpu_avg_pool(dl__dev *d, float *y, const float *x, int64_t planes, const dl__pgeom *g)
{
    y = (float *)DL__RAW(d, y);
    x = (const float *)DL__RAW(d, x);
    dl__avg_args u;
    u.x = (float *)(uintptr_t)x; u.y = y; u.g = g; u.adj = false;   /* x only read */
    dl__parallel_for(d->ctx->pool, planes, (1 << 14) / (g->La + 1) + 1, dl__avgpool_task, &u);
}

static void dl__cpu_avg_pool_adj(dl__dev *d, float *dx, const float *gy, int64_t planes,
                                 const dl__pgeom *g)
{
    dx = (float *)DL__RAW(d, dx);
    gy = (const float *)DL__RAW(d, gy);
    dl__avg_args u;
    u.x = dx; u.y = (float *)(uintptr_t)gy; u.g = g; u.adj = true;  /* gy only read */
    dl__parallel_for(d->ctx->pool, planes, (1 << 14) / (g->La + 1) + 1, dl__avgpool_task, &u);
}


/* The optimizer kernels: each element on its own, so the loop is split
   across threads without changing a bit. The settings are copied to locals
   first: read through the args pointer, every store to p could change them
   (both are float), and the loop stayed scalar with its branches inside. */
typedef struct dl__opt_task {
    float *p, *buf, *m, *v, *vmax;
    const float *g;
    const dl__sgd_args *sgd;
    const dl__adam_args *adam;
} dl__opt_task;

/* d_p = g (-g with maximize) (+ wd*p); buf = d_p (first) or momentum*buf + (1-dampening)*d_p;
   d_p = nesterov ? d_p + momentum*buf : buf;  p += -lr * d_p */
static void dl__sgd_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__opt_task *u = (const dl__opt_task *)arg;
    float *p = u->p + lo, *buf = u->buf ? u->buf + lo : NULL;
    const float *g = u->g + lo;
    const float neg_lr = -u->sgd->lr, wd = u->sgd->wd, mom = u->sgd->momentum;
    const float omd = u->sgd->one_m_dampening;
    const bool nesterov = u->sgd->nesterov, maximize = u->sgd->maximize, first = u->sgd->first;
    int64_t i, n = hi - lo;
    if (!maximize && wd == 0.0f && mom == 0.0f) {    /* plain SGD */
        for (i = 0; i < n; i++) p[i] = p[i] + neg_lr * g[i];
        return;
    }
    for (i = 0; i < n; i++) {
        float d = maximize ? -g[i] : g[i];
        if (wd != 0.0f) d = d + wd * p[i];
        if (mom != 0.0f) {
            float b = first ? d : buf[i] * mom + omd * d;
            buf[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        p[i] = p[i] + neg_lr * d;
    }
}

static void dl__cpu_sgd(dl__dev *d, float *p, const float *g, float *buf, int64_t n,
                        const dl__sgd_args *a)
{
    dl__opt_task u;
    memset(&u, 0, sizeof u);
    u.p = (float *)DL__RAW(d, p);
    u.g = (const float *)DL__RAW(d, g);
    u.buf = buf ? (float *)DL__RAW(d, buf) : NULL;
    u.sgd = a;
    dl__parallel_for(d->ctx->pool, n, 1 << 15, dl__sgd_task, &u);
}

/* (AdamW: p *= 1-lr*wd)  g' = g (+ wd*p for Adam);  m = beta1*m + (1-beta1)*g';
   v = beta2*v + (1-beta2)*g'*g';  vmax = max(vmax, v) (amsgrad);
   p += -step_size * m / (sqrt(v or vmax)/sqrt(bc2) + eps),  step_size = lr/bc1 */
static void dl__adam_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__opt_task *u = (const dl__opt_task *)arg;
    const dl__adam_args *a = u->adam;
    float *p = u->p + lo, *m = u->m + lo, *v = u->v + lo, *vmax = u->vmax ? u->vmax + lo : NULL;
    const float *g = u->g + lo;
    const float decay = a->decay, wd = a->wd, b1 = a->beta1, omb1 = a->one_m_beta1;
    const float b2 = a->beta2, omb2 = a->one_m_beta2, bc2s = a->bc2_sqrt, eps = a->eps;
    const float nss = a->neg_step_size;
    const bool maximize = a->maximize, amsgrad = a->amsgrad;
    int64_t i, n = hi - lo;
    for (i = 0; i < n; i++) {
        float gi = maximize ? -g[i] : g[i], pi = p[i], denom, vv, mi;
        if (decay != 1.0f) pi = pi * decay;
        if (wd != 0.0f) gi = gi + wd * pi;
        mi = m[i] * b1 + omb1 * gi;
        m[i] = mi;
        vv = v[i] * b2 + omb2 * gi * gi;
        v[i] = vv;
        if (amsgrad) {
            if (!(vmax[i] >= vv)) vmax[i] = vv;     /* torch.maximum: NaN propagates */
            vv = vmax[i];
        }
        denom = sqrtf(vv) / bc2s + eps;
        p[i] = pi + nss * mi / denom;
    }
}

static void dl__cpu_adam(dl__dev *d, float *p, const float *g, float *m, float *v, float *vmax,
                         int64_t n, const dl__adam_args *a)
{
    dl__opt_task u;
    memset(&u, 0, sizeof u);
    u.p = (float *)DL__RAW(d, p);
    u.g = (const float *)DL__RAW(d, g);
    u.m = (float *)DL__RAW(d, m);
    u.v = (float *)DL__RAW(d, v);
    u.vmax = vmax ? (float *)DL__RAW(d, vmax) : NULL;
    u.adam = a;
    dl__parallel_for(d->ctx->pool, n, 1 << 14, dl__adam_task, &u);
}

static double dl__cpu_sumsq(dl__dev *d, const float *x, int64_t n)
{
    x = (const float *)DL__RAW(d, x);
    double s = 0;
    int64_t i;
    (void)d;
    for (i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

static void dl__cpu_scale(dl__dev *d, float *x, int64_t n, float s)
{
    x = (float *)DL__RAW(d, x);
    int64_t i;
    (void)d;
    for (i = 0; i < n; i++) x[i] = x[i] * s;
}


/* ---- fused normalization. Batch norm sees x as (N, C, L); layer norm as
   (rows, cols). Sums in double, each by one thread in a fixed order, so
   the results do not depend on the thread count. */

typedef struct dl__bn_args {
    float *y, *mean, *invstd, *var, *dx, *dw, *db;
    const float *x, *g, *w, *b, *cmean, *cinvstd, *r;   /* r: apply's residual (or NULL) */
    int64_t N, C, L;
    float eps;
    bool train;
    double *sums;                     /* backward: per channel sum(g), sum(g xhat) */
} dl__bn_args;

/* Channel sums in double over 32 interleaved partial sums (element l of a
   row goes to partial l % 32; dl__acc32_total adds them in a fixed tree):
   four vectors of independent chains instead of one, so the adds overlap
   (one chain of 8 was bound by the add latency: ~2 elements a cycle), and
   the same bits for any thread count. Two sums in one pass over the rows:
   d_ = expr into acc, expr2 (of l and d_) into acc2. */
#define DL__ACC32_ROWS2(acc, expr, acc2, expr2) do { \
        int64_t l_; \
        for (l_ = 0; l_ + 32 <= u->L; l_ += 32) { \
            int k_; \
            for (k_ = 0; k_ < 32; k_++) { \
                int64_t l = l_ + k_; double d_ = (expr); acc[k_] += d_; acc2[k_] += (expr2); \
            } \
        } \
        for (; l_ < u->L; l_++) { int64_t l = l_; double d_ = (expr); acc[l_ & 31] += d_; acc2[l_ & 31] += (expr2); } \
    } while (0)

static double dl__acc32_total(const double *a)
{
    double b[8];
    int k;
    for (k = 0; k < 8; k++) b[k] = (a[k] + a[k + 8]) + (a[k + 16] + a[k + 24]);
    return dl__acc8_total(b);
}

/* Rows shorter than 32 (L < 32: batch norm over (N, C) has L = 1): channels
   [c0, c0 + nc) at once, nc L <= DL__BN_SHORT, walking the rows of x in
   memory order instead of one channel's strided elements at a time. Element
   (n, c, l) goes to partial l of channel c as in DL__ACC32_ROWS2 and in the
   same order (n ascending), so the sums have the same bits. part and part2
   are nc L partials each, `pos` names position j of the block and its
   channel, c = c0 + j / L. */
#define DL__BN_SHORT 512
#define DL__BN_SHORT_ROWS(part, expr, part2, expr2) do { \
        int64_t n_, j, w_ = nc * u->L; \
        for (j = 0; j < w_; j++) part[j] = part2[j] = 0.0; \
        for (n_ = 0; n_ < u->N; n_++) { \
            const int64_t base = (n_ * u->C + c0) * u->L; \
            for (j = 0; j < w_; j++) { double d_ = (expr); part[j] += d_; part2[j] += (expr2); } \
        } \
    } while (0)

/* partials l < L of channel k of a short-row block, as DL__ACC32_ROWS2's 32 */
static double dl__bn_short_total(const double *part, int64_t k, int64_t L)
{
    double a[32];
    int64_t l;
    for (l = 0; l < 32; l++) a[l] = l < L ? part[k * L + l] : 0.0;
    return dl__acc32_total(a);
}

static void dl__bn_stats_fin(const dl__bn_args *u, int64_t c, double as_total, double aq_total, double K)
{
    double M = (double)(u->N * u->L);
    double s = as_total / M, q = aq_total / M - s * s, m;   /* s = mean(x) - K */
    if (q < 0.0) q = 0.0;                                   /* rounding; NaN stays */
    m = K + s;
    u->mean[c] = (float)m;
    u->var[c] = (float)q;
    u->invstd[c] = (float)(1.0 / sqrt(q + (double)u->eps));
}

static void dl__bn_stats_short(const dl__bn_args *u, int64_t lo, int64_t hi)
{
    double ps[DL__BN_SHORT], pq[DL__BN_SHORT], kk[DL__BN_SHORT];
    int64_t c0, nc, j, L = u->L, cb = DL__BN_SHORT / L;
    for (c0 = lo; c0 < hi; c0 += nc) {
        nc = hi - c0 < cb ? hi - c0 : cb;
        for (j = 0; j < nc * L; j++) kk[j] = (double)u->x[(c0 + j / L) * L];
        DL__BN_SHORT_ROWS(ps, (double)u->x[base + j] - kk[j], pq, d_ * d_);
        for (j = 0; j < nc; j++)
            dl__bn_stats_fin(u, c0 + j, dl__bn_short_total(ps, j, L), dl__bn_short_total(pq, j, L), kk[j * L]);
    }
}

#define DL__BN_CB 8

static void dl__bn_stats_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__bn_args *u = (const dl__bn_args *)arg;
    int64_t c0, n;
    if (u->L < 32) {
        dl__bn_stats_short(u, lo, hi);
        return;
    }
    /* blocks of DL__BN_CB channels, row by row: each channel's partials
       see its elements in the same order as one channel at a time would
       (the same bits), while memory is read in longer runs */
    for (c0 = lo; c0 < hi; c0 += DL__BN_CB) {
        double as[DL__BN_CB * 32], aq[DL__BN_CB * 32], K[DL__BN_CB];
        int64_t nc = hi - c0 < DL__BN_CB ? hi - c0 : DL__BN_CB, j;
        /* one pass: the sums of x - K and of its square, in double, with K
           the channel's first value (so that they do not cancel unless the
           data lie far from K compared with their spread) */
        for (j = 0; j < nc; j++) K[j] = (double)u->x[(c0 + j) * u->L];
        for (j = 0; j < nc * 32; j++) as[j] = aq[j] = 0.0;
        for (n = 0; n < u->N; n++)
            for (j = 0; j < nc; j++) {
                const float *x = u->x + (n * u->C + c0 + j) * u->L;
                double *ps = as + 32 * j, *pq = aq + 32 * j, Kj = K[j];
                DL__ACC32_ROWS2(ps, (double)x[l] - Kj, pq, d_ * d_);
            }
        for (j = 0; j < nc; j++)
            dl__bn_stats_fin(u, c0 + j, dl__acc32_total(as + 32 * j), dl__acc32_total(aq + 32 * j), K[j]);
    }
}

/* mean, invstd = 1/sqrt(var + eps), biased var of x (N, C, L) per channel */
static void dl__cpu_bn_stats(dl__dev *d, float *mean, float *invstd, float *var, const float *x,
                             int64_t N, int64_t C, int64_t L, float eps, const dl__bn_running *rs)
{
    dl__bn_args u;
    int64_t c;
    memset(&u, 0, sizeof u);
    u.mean = (float *)DL__RAW(d, mean);
    u.invstd = (float *)DL__RAW(d, invstd);
    u.var = (float *)DL__RAW(d, var);
    u.x = (const float *)DL__RAW(d, x);
    u.N = N; u.C = C; u.L = L; u.eps = eps;
    dl__parallel_for(d->ctx->pool, C, (1 << 15) / (N * L + 1) + 1, dl__bn_stats_task, &u);
    if (!rs) return;
    if (rs->nbt) *(int64_t *)DL__RAW(d, rs->nbt) += 1;
    if (rs->rm) {   /* AFFINE's a * x + b, then axpy's y += alpha * x: their bits */
        float *rm = (float *)DL__RAW(d, rs->rm), *rv = rs->rv ? (float *)DL__RAW(d, rs->rv) : NULL;
        for (c = 0; c < C; c++) {
            rm[c] = rs->keep * rm[c] + 0.0f;
            rm[c] += rs->mom * u.mean[c];
            if (!rv) continue;
            rv[c] = rs->keep * rv[c] + 0.0f;
            rv[c] += rs->vmom * u.var[c];
        }
    }
}

static void dl__bn_apply_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__bn_args *u = (const dl__bn_args *)arg;
    int64_t p, l;
    for (p = lo; p < hi; p++) {
        int64_t c = p % u->C;
        float sc = u->cinvstd[c] * (u->w ? u->w[c] : 1.0f);
        float sh = (u->b ? u->b[c] : 0.0f) - u->cmean[c] * sc;
        const float *x = u->x + p * u->L;
        float *y = u->y + p * u->L;
        for (l = 0; l < u->L; l++) y[l] = x[l] * sc + sh;
        if (u->r) {   /* + the residual, rounded as dl_add's (in cache) */
            const float *r = u->r + p * u->L;
            for (l = 0; l < u->L; l++) y[l] = y[l] + r[l];
        }
    }
}

/* y = (x - mean) invstd w + b per channel (w, b NULL: 1, 0), + r (or NULL),
   ReLU'd with relu */
static void dl__cpu_bn_apply(dl__dev *d, float *y, const float *x, const float *mean,
                             const float *invstd, const float *w, const float *b, const float *r,
                             int64_t N, int64_t C, int64_t L, bool relu)
{
    dl__bn_args u;
    memset(&u, 0, sizeof u);
    u.y = (float *)DL__RAW(d, y);
    u.x = (const float *)DL__RAW(d, x);
    u.cmean = (const float *)DL__RAW(d, mean);
    u.cinvstd = (const float *)DL__RAW(d, invstd);
    u.w = w ? (const float *)DL__RAW(d, w) : NULL;
    u.b = b ? (const float *)DL__RAW(d, b) : NULL;
    u.r = r ? (const float *)DL__RAW(d, r) : NULL;
    u.N = N; u.C = C; u.L = L;
    dl__parallel_for(d->ctx->pool, N * C, (1 << 15) / (L + 1) + 1, dl__bn_apply_task, &u);
    /* the ReLU as its own vectorized pass (in the rows' loop above it costs a
       branch an element where rows are short): the CPU saves the dispatch */
    if (relu) dl__cpu_unary(d, DL__U_RELU, y, y, N * C * L, 0.0f, 0.0f);
}

/* channel c's sum(g) and sum(g (x - mean)) into sums, db and dw */
static void dl__bn_sums_fin(const dl__bn_args *u, int64_t c, double sg, double sgx)
{
    double is = u->cinvstd[c];
    u->sums[2 * c] = sg;
    u->sums[2 * c + 1] = sgx * is;                   /* sum(g xhat) */
    if (u->db) u->db[c] = (float)sg;
    if (u->dw) u->dw[c] = (float)(sgx * is);
}

static void dl__bn_sums_short(const dl__bn_args *u, int64_t lo, int64_t hi)
{
    double pg[DL__BN_SHORT], pgx[DL__BN_SHORT], mm[DL__BN_SHORT];
    int64_t c0, nc, j, L = u->L, cb = DL__BN_SHORT / L;
    for (c0 = lo; c0 < hi; c0 += nc) {
        nc = hi - c0 < cb ? hi - c0 : cb;
        for (j = 0; j < nc * L; j++) mm[j] = u->cmean[c0 + j / L];
        DL__BN_SHORT_ROWS(pg, (double)u->g[base + j], pgx, d_ * ((double)u->x[base + j] - mm[j]));
        for (j = 0; j < nc; j++)
            dl__bn_sums_fin(u, c0 + j, dl__bn_short_total(pg, j, L), dl__bn_short_total(pgx, j, L));
    }
}

static void dl__bn_sums_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__bn_args *u = (const dl__bn_args *)arg;
    int64_t c0, n;
    if (u->L < 32) {
        dl__bn_sums_short(u, lo, hi);
        return;
    }
    for (c0 = lo; c0 < hi; c0 += DL__BN_CB) {    /* as in dl__bn_stats_task */
        double ag[DL__BN_CB * 32], agx[DL__BN_CB * 32];
        int64_t nc = hi - c0 < DL__BN_CB ? hi - c0 : DL__BN_CB, j;
        for (j = 0; j < nc * 32; j++) ag[j] = agx[j] = 0.0;
        for (n = 0; n < u->N; n++)
            for (j = 0; j < nc; j++) {
                const int64_t off = (n * u->C + c0 + j) * u->L;
                const float *x = u->x + off, *g = u->g + off;
                double *pg = ag + 32 * j, *pgx = agx + 32 * j, m = u->cmean[c0 + j];
                DL__ACC32_ROWS2(pg, (double)g[l], pgx, d_ * ((double)x[l] - m));
            }
        for (j = 0; j < nc; j++) dl__bn_sums_fin(u, c0 + j, dl__acc32_total(ag + 32 * j), dl__acc32_total(agx + 32 * j));
    }
}

static void dl__bn_dx_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__bn_args *u = (const dl__bn_args *)arg;
    int64_t p, l;
    double M = (double)(u->N * u->L);
    for (p = lo; p < hi; p++) {
        int64_t c = p % u->C;
        float is = u->cinvstd[c], wc = u->w ? u->w[c] : 1.0f, m = u->cmean[c];
        float k = is * wc;                            /* dx = k (g - a - xhat b) */
        float a = u->train ? (float)(u->sums[2 * c] / M) : 0.0f;
        float bb = u->train ? (float)(u->sums[2 * c + 1] / M) : 0.0f;
        const float *x = u->x + p * u->L, *g = u->g + p * u->L;
        float *dx = u->dx + p * u->L;
        for (l = 0; l < u->L; l++) dx[l] = k * (g[l] - a - (x[l] - m) * is * bb);
    }
}

/* dx = w invstd (g - mean(g) - xhat mean(g xhat)) (train) or w invstd g
   (eval); dw = sum(g xhat); db = sum(g); any output may be NULL; ry: g
   masked by a fused ReLU's output, into gm where given */
static void dl__cpu_bn_backward(dl__dev *d, float *dx, float *dw, float *db, const float *g,
                                const float *x, const float *mean, const float *invstd,
                                const float *w, int64_t N, int64_t C, int64_t L, bool train,
                                const float *ry, float *gm_out)
{
    dl__bn_args u;
    double stack[64], *sums = stack;
    float *gm = NULL;
    memset(&u, 0, sizeof u);
    if (C > 32) sums = (double *)DL_MALLOC(sizeof(double) * (size_t)(2 * C));
    if (ry && !dx && !gm_out) gm = (float *)DL_MALLOC(sizeof(float) * (size_t)(N * C * L + 1));
    if (!sums || (ry && !dx && !gm_out && !gm)) {
        if (sums != stack) DL_FREE(sums);
        dl__dev_fail(d, "bn_backward: out of host memory (%lld channels)", (long long)C);
        return;
    }
    u.dx = dx ? (float *)DL__RAW(d, dx) : NULL;
    u.dw = dw ? (float *)DL__RAW(d, dw) : NULL;
    u.db = db ? (float *)DL__RAW(d, db) : NULL;
    u.g = (const float *)DL__RAW(d, g);
    u.x = (const float *)DL__RAW(d, x);
    u.cmean = (const float *)DL__RAW(d, mean);
    u.cinvstd = (const float *)DL__RAW(d, invstd);
    u.w = w ? (const float *)DL__RAW(d, w) : NULL;
    u.N = N; u.C = C; u.L = L; u.train = train; u.sums = sums;
    if (ry) {   /* g masked as the ReLU's backward (DL__B_RELU_GRAD), in dx's memory (read there, then overwritten) */
        dl__bcast flat;
        dl__bin_args b;
        memset(&flat, 0, sizeof flat);
        flat.ndim = 1; flat.n = N * C * L; flat.shape[0] = flat.n; flat.sa[0] = flat.sb[0] = 1;
        b.op = DL__B_RELU_GRAD; b.y = gm_out ? (float *)DL__RAW(d, gm_out) : gm ? gm : u.dx;
        b.a = u.g; b.b = (const float *)DL__RAW(d, ry);
        b.bc = &flat; b.row = 0;
        dl__parallel_for(d->ctx->pool, flat.n, 1 << 15, dl__bin_flat_task, &b);
        u.g = b.y;
    }
    if (dw || db || (dx && train))
        dl__parallel_for(d->ctx->pool, C, (1 << 15) / (N * L + 1) + 1, dl__bn_sums_task, &u);
    if (dx) dl__parallel_for(d->ctx->pool, N * C, (1 << 15) / (L + 1) + 1, dl__bn_dx_task, &u);
    if (sums != stack) DL_FREE(sums);
    DL_FREE(gm);
}

typedef struct dl__ln_args {
    float *y, *mean, *invstd, *dx, *dw, *db;
    const float *x, *g, *w, *b, *cmean, *cinvstd;
    int64_t rows, cols;
    float eps;
} dl__ln_args;

static void dl__ln_fwd_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__ln_args *u = (const dl__ln_args *)arg;
    int64_t r, j, n = u->cols;
    for (r = lo; r < hi; r++) {
        const float *x = u->x + r * n;
        float *y = u->y + r * n, is, m;
        double s = 0, q = 0, md;
        for (j = 0; j < n; j++) s += x[j];
        md = n ? s / (double)n : 0.0;
        for (j = 0; j < n; j++) { double t = x[j] - md; q += t * t; }
        m = (float)md;
        is = (float)(1.0 / sqrt((n ? q / (double)n : 0.0) + (double)u->eps));
        u->mean[r] = m;
        u->invstd[r] = is;
        for (j = 0; j < n; j++) {
            float v = (x[j] - m) * is;
            if (u->w) v = v * u->w[j];
            if (u->b) v = v + u->b[j];
            y[j] = v;
        }
    }
}

/* per row of x (rows, cols): mean, invstd; y = xhat w + b (w, b: (cols) or NULL) */
static void dl__cpu_ln_forward(dl__dev *d, float *y, float *mean, float *invstd, const float *x,
                               const float *w, const float *b, int64_t rows, int64_t cols, float eps)
{
    dl__ln_args u;
    memset(&u, 0, sizeof u);
    u.y = (float *)DL__RAW(d, y);
    u.mean = (float *)DL__RAW(d, mean);
    u.invstd = (float *)DL__RAW(d, invstd);
    u.x = (const float *)DL__RAW(d, x);
    u.w = w ? (const float *)DL__RAW(d, w) : NULL;
    u.b = b ? (const float *)DL__RAW(d, b) : NULL;
    u.rows = rows; u.cols = cols; u.eps = eps;
    dl__parallel_for(d->ctx->pool, rows, (1 << 15) / (cols + 1) + 1, dl__ln_fwd_task, &u);
}

static void dl__ln_dx_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__ln_args *u = (const dl__ln_args *)arg;
    int64_t r, j, n = u->cols;
    for (r = lo; r < hi; r++) {
        const float *x = u->x + r * n, *g = u->g + r * n;
        float *dx = u->dx + r * n, m = u->cmean[r], is = u->cinvstd[r], a, bb;
        double sa = 0, sb = 0;
        for (j = 0; j < n; j++) {
            double gw = (double)g[j] * (u->w ? u->w[j] : 1.0f);
            sa += gw;
            sb += gw * (double)((x[j] - m) * is);
        }
        a = (float)(sa / (double)n);
        bb = (float)(sb / (double)n);
        for (j = 0; j < n; j++) {
            float gw = g[j] * (u->w ? u->w[j] : 1.0f);
            dx[j] = is * (gw - a - (x[j] - m) * is * bb);
        }
    }
}

static void dl__ln_dwb_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__ln_args *u = (const dl__ln_args *)arg;
    int64_t r, j;
    for (j = lo; j < hi; j++) {
        double sw = 0, sb = 0;
        for (r = 0; r < u->rows; r++) {
            float g = u->g[r * u->cols + j];
            sw += (double)g * (double)((u->x[r * u->cols + j] - u->cmean[r]) * u->cinvstd[r]);
            sb += g;
        }
        if (u->dw) u->dw[j] = (float)sw;
        if (u->db) u->db[j] = (float)sb;
    }
}

/* dx = invstd (gw - mean(gw) - xhat mean(gw xhat)), gw = g w; dw = sum over
   rows of g xhat; db = sum over rows of g; any output may be NULL */
static void dl__cpu_ln_backward(dl__dev *d, float *dx, float *dw, float *db, const float *g,
                                const float *x, const float *mean, const float *invstd,
                                const float *w, int64_t rows, int64_t cols)
{
    dl__ln_args u;
    memset(&u, 0, sizeof u);
    u.dx = dx ? (float *)DL__RAW(d, dx) : NULL;
    u.dw = dw ? (float *)DL__RAW(d, dw) : NULL;
    u.db = db ? (float *)DL__RAW(d, db) : NULL;
    u.g = (const float *)DL__RAW(d, g);
    u.x = (const float *)DL__RAW(d, x);
    u.cmean = (const float *)DL__RAW(d, mean);
    u.cinvstd = (const float *)DL__RAW(d, invstd);
    u.w = w ? (const float *)DL__RAW(d, w) : NULL;
    u.rows = rows; u.cols = cols;
    if (dx) dl__parallel_for(d->ctx->pool, rows, (1 << 15) / (cols + 1) + 1, dl__ln_dx_task, &u);
    if (dw || db) dl__parallel_for(d->ctx->pool, cols, (1 << 15) / (rows + 1) + 1, dl__ln_dwb_task, &u);
}

static const dl__backend dl__cpu_backend = {
    "cpu",
    dl__cpu_alloc, dl__cpu_free, dl__cpu_upload, dl__cpu_download, dl__cpu_copy, dl__cpu_peer,
    dl__cpu_sync,
    NULL, NULL, NULL,   /* prof_mark, prof_seconds, prof_release: the host clock */
    dl__cpu_rand, dl__cpu_arange, dl__cpu_fill, dl__cpu_add_i64,
    dl__cpu_unary, dl__cpu_binary, dl__cpu_reduce, dl__cpu_argmax, dl__cpu_onehot, dl__cpu_copy_nd,
    dl__cpu_axpy, dl__cpu_nonfinite, dl__cpu_gemm, dl__cpu_softmax,
    dl__cpu_class_mask, dl__cpu_dropout_mask, dl__cpu_bce_logits,
    dl__cpu_im2col, dl__cpu_col2im, dl__cpu_bias_add, dl__cpu_max_pool, dl__cpu_unpool,
    dl__cpu_gather, dl__cpu_load_batch, dl__cpu_avg_pool, dl__cpu_avg_pool_adj,
    dl__cpu_bn_stats, dl__cpu_bn_apply, dl__cpu_bn_backward, dl__cpu_ln_forward, dl__cpu_ln_backward,
    dl__cpu_sgd, dl__cpu_adam, dl__cpu_sumsq, dl__cpu_scale, dl__cpu_conv_s1, dl__cpu_conv_s1_wgrad,
#ifdef DL__WG
    dl__cpu_conv_wg, dl__cpu_conv_wg_wgrad,
#else
    NULL, NULL,
#endif
    dl__cpu_conv_i2c,
    NULL, NULL,   /* convT_i2c, conv_i2c_wgrad: the CPU's backward is conv_s1 / Winograd, else im2col */
    NULL, NULL, NULL, NULL,   /* cap_*: dl.h records the CPU's calls (capture and replay) */
    NULL, NULL, NULL,         /* mt_*: the vectorized per-tensor loops are the CPU's best */
    NULL,                     /* axpy_multi: likewise */
    NULL, NULL,               /* class_loss*: composites (a dispatch is cheap on the CPU) */
    NULL,                     /* chan_sum: the two reduce passes (their bits) */
    dl__cpu_eq_i64,
    NULL, NULL,               /* bias_act*: the add and the activation (vectorized passes) */
    NULL,                     /* conv_act: likewise */
    NULL, NULL,               /* bn_pool*: the CPU pools before its ReLU (dl__seq_fwd) */
    NULL                      /* bn_eval: three calls (C values) */
};

static const dl__backend *dl__cpu_be(void) { return &dl__cpu_backend; }

static DL__UNUSED void dl__dev_fail(dl__dev *d, const char *fmt, ...)
{
    va_list ap;
    if (d->failed) return;            /* keep the first cause */
    va_start(ap, fmt);
    vsnprintf(d->errmsg, sizeof d->errmsg, fmt, ap);
    va_end(ap);
    d->failed = true;
}

/* DL_OK, or the device's recorded failure as the context's error under op's name */
static dl_result dl__dev_check(dl__dev *d, const char *op)
{
    if (!d->failed) return DL_OK;
    d->failed = false;
    dl__err(d->ctx, DL_ERR_DEVICE, "%s: %s", op, d->errmsg);
    return DL_ERR_DEVICE;
}

/* element i of a float tensor, read to the host */
static float dl__host_value_at(dl_tensor *t, int64_t i)
{
    float v = NAN;
    DL__BE(t)->download(t->dev_, &v, (const float *)t->data + i, sizeof v);
    return v;
}

#ifdef DL_CUDA
#include "dl_cuda.cuh"     /* the second backend: dl__cuda_open/close/count and its struct */
#endif

/* t's data is host memory (cpu:0, non-strict virtual CPU devices): host code
   at a transfer point may read or write it in place */
static bool dl__host_ok(const dl_tensor *t)
{
    return t->device.type == DL_DEVICE_CPU && t->dev_->tag == 0;   /* (its table may be a capture's) */
}

// >>section capture and replay
/* A static graph of one step (DESIGN.md 6b; PyTorch's torch.cuda.graph and
   CUDAGraph.replay). dl_capture_begin(ctx) .. dl_capture_end(cap) records
   the backend work of the ops in between; dl_replay(cap) runs that work
   again on the same memory.

   Recording. A CPU device (cpu:0, cpu:i) gets the table dl__cap_backend
   in place of its own while the capture runs: each entry appends a record
   (which entry, its scalar arguments, a copy of the host struct it was
   given: a broadcast plan, a conv or pool geometry, strides) and calls the
   CPU entry, so the captured step runs while it is recorded. A replay walks
   the records and calls the CPU entries again: no op dispatch, no shape
   check, no tape, no allocation. A device whose backend captures its own
   work (dl__backend.cap_begin: CUDA's stream capture into a graph, one
   launch to replay) keeps its table.

   What changes from step to step is read at each replay, never baked in:
     - the RNG counter: a draw's record keeps its counter minus the counter
       at dl_capture_begin; a replay adds the counter at its start, then
       moves the counter on by the capture's draws, as the eager step does;
     - optimizer state: dl_optim_step registers a hook (dl__cap_hook) that a
       replay runs first: it recomputes the arguments (learning rate, step
       counts, bias corrections) into the optimizer's own array, which the
       update's records point at, and counts the step;
     - num_batches_tracked: an int64 += 1 on device memory, replayed.

   Memory. The capture has its own step memory: each device's step arena
   is set aside for the capture's while it records, and step headers and
   tape nodes come from the capture's header region. Its tensors carry its
   generation (DL__CAP_GEN | serial) in place of a step number: dl_step_end
   leaves them, dl_capture_free releases them (their headers then read as
   stale, as a released step's do). A record may point only into that
   memory or into persistent tensors: a step tensor made before the capture
   (dl_step_end would recycle it) or by another capture is refused at the
   op (dl__cap_input), and every persistent tensor the capture touches is
   listed (dl__cap_use) so that dl_free or dl_module_to on it makes a later
   replay an error instead of a write into freed memory.

   Refusals: what a replay could not repeat fails its op with a message
   that names it, and fails the capture (dl_capture_end returns the first
   error): host reads (dl_item, dl_read, dl_data, dl_to to the host; the
   download, nonfinite and sumsq entries below them), host writes
   (dl_write, dl_from_array, the loader: a replay would copy the same bytes
   again), persistent allocations (a gradient or optimizer state made
   lazily: warm up with an eager step first), collectives, a tensor from
   before the capture. Any other error inside the capture fails it too. */

#define DL__CAP_MAGIC 0x444c4350u
#define DL__CAP_FREED 0x444c4346u     /* a dl_capture_free()d capture's husk */
#ifdef DL__HVM
#define DL__CAP_HREGION ((size_t)1 << 30)   /* address space for one capture's headers */
#endif
enum { DL__CAP_RECORDING = 1, DL__CAP_READY, DL__CAP_FAILED, DL__CAP_INVALID };

/* the entry a record calls again */
enum {
    DL__RK_COPY, DL__RK_PEER, DL__RK_RAND, DL__RK_ARANGE, DL__RK_FILL, DL__RK_ADD_I64, DL__RK_UNARY,
    DL__RK_BINARY, DL__RK_REDUCE, DL__RK_ARGMAX, DL__RK_ONEHOT, DL__RK_COPY_ND, DL__RK_AXPY, DL__RK_GEMM,
    DL__RK_SOFTMAX, DL__RK_CLASS_MASK, DL__RK_DROPOUT, DL__RK_BCE, DL__RK_IM2COL, DL__RK_COL2IM,
    DL__RK_BIAS_ADD, DL__RK_MAX_POOL, DL__RK_UNPOOL, DL__RK_GATHER, DL__RK_AVG_POOL, DL__RK_AVG_POOL_ADJ,
    DL__RK_BN_STATS, DL__RK_BN_APPLY, DL__RK_BN_BACKWARD, DL__RK_LN_FORWARD, DL__RK_LN_BACKWARD,
    DL__RK_SGD, DL__RK_ADAM, DL__RK_SCALE, DL__RK_CONV_S1, DL__RK_CONV_S1_WGRAD, DL__RK_CONV_WG,
    DL__RK_CONV_WG_WGRAD, DL__RK_CONV_I2C, DL__RK_EQ_I64
};

/* One recorded CPU backend call: the entry's arguments in its order. */
typedef struct dl__rec {
    int kind, k;                      /* the entry; a small argument (op, dist, ndim, flag) */
    dl__dev *d, *d2;                  /* its device (peer: d2, the source) */
    void *p[10];                      /* data pointers */
    int64_t n[10];                    /* sizes, strides, counts */
    float f[3];
    double g[2];
    uint64_t u;                       /* rand, dropout: the counter (minus the capture's first) */
    bool b[3];                        /* rand, dropout b[2]: the context's generator */
    const void *arg;                  /* sgd, adam: the optimizer's argument struct (it refreshes it) */
    size_t blob;                      /* else: the host struct copied to cap->blob + blob */
} dl__rec;

/* A function a replay runs first (optimizer steps); data is DL_FREE'd with the capture. */
typedef struct dl__caphook {
    void (*fn)(dl_capture *cap, void *owner, void *data);
    void *owner, *data;
} dl__caphook;

typedef struct dl__capdev {
    dl__dev *d;
    dl__arena arena;                  /* the capture's step memory on d */
    dl__arena saved;                  /* while recording: d's own */
    const dl__backend *be;            /* while recording: d's own table */
    void *impl;                       /* a device that captures itself (CUDA): its state */
} dl__capdev;

struct dl_capture {
    uint32_t magic;
    int state;
    dl_ctx *ctx;
    uint64_t gen;                     /* DL__CAP_GEN | serial: its tensors' step_ */
    dl_capture *next;                 /* in ctx->caps, or (freed) ctx->dead */
    dl_result err;                    /* the first failure (FAILED), or why it is INVALID */
    char msg[768];
    bool msg_op;                      /* msg is an op's own message (it names the op) */
    int ndev;
    dl__capdev *dev;
    dl__rec *rec;
    int64_t nrec, caprec;
    unsigned char *blob;
    size_t nblob, capblob;
    dl__caphook *hook;
    int nhook, caphook;
    dl_tensor **uses;                 /* persistent tensors it touches (NULL: forgotten) */
    int64_t nuse, capuse;
    dl_tensor **bumps;                /* the version bumps of its in-place writes, in order */
    int64_t nbump, capbump;
    uint64_t rng0, draws;             /* the RNG counter at dl_capture_begin; counters it takes */
    uint64_t seed, rng;               /* during a replay: the generator's seed, its counter at the start */
#ifdef DL__HVM
    dl__hregion *hreg;                /* headers and nodes made inside it */
#endif
    dl__arena harena;                 /* the same without address space to reserve */
};

static uint64_t dl__cap_gen(dl_ctx *ctx) { return ctx->cap->gen; }

/* while c records: the bytes of d's own step arena, set aside (in d->held) */
static size_t dl__cap_saved(dl_capture *c, dl__dev *d)
{
    int i;
    for (i = 0; i < c->ndev; i++) if (c->dev[i].d == d) return c->dev[i].saved.reserved;
    return 0;
}

static bool dl__cap_gen_live(dl_ctx *ctx, uint64_t gen)
{
    dl_capture *c;
    if (!(gen & DL__CAP_GEN)) return false;
    for (c = ctx->caps; c; c = c->next) if (c->gen == gen) return true;
    return false;
}

/* Keeps the first failure; an op's message (it names the op) replaces a
   device entry's refusal that came just before it. */
static void dl__cap_fail(dl_capture *c, dl_result code, const char *msg, bool from_op)
{
    if (c->err != DL_OK && (c->msg_op || !from_op)) return;
    c->err = code;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    c->msg_op = from_op;
}

static void dl__cap_note_err(dl_ctx *ctx) { dl__cap_fail(ctx->cap, ctx->err, ctx->msg, true); }

/* A backend entry that a replay could not repeat: the device's failure (the
   op that called it reports it under its name) and the capture's. */
static DL__UNUSED void dl__cap_refuse(dl__dev *d, const char *what)
{
    char b[32];
    dl__dev_fail(d, "%s on %s inside a capture (dl_capture_begin): a replay could not repeat it",
                 what, dl__dev_str(d->id, b, sizeof b));
    dl__cap_fail(d->ctx->cap, DL_ERR_UNSUPPORTED, d->errmsg, false);
}

/* true (with the error) inside a capture: op is `what`, which a replay
   cannot repeat; hint says what to do instead */
static bool dl__cap_refused(dl_ctx *ctx, const char *op, const char *what, const char *hint)
{
    if (!ctx || !ctx->cap) return false;
    dl__err(ctx, DL_ERR_UNSUPPORTED, "%s: %s inside a capture (dl_capture_begin .. dl_capture_end) "
            "cannot be replayed; %s", op, what, hint);
    return true;
}
#define DL__CAP_READ_HINT "read it after dl_capture_end() or dl_replay()"
#define DL__CAP_WRITE_HINT "write static inputs between replays (dl_copy_, dl_write), outside the capture"

static bool dl__cap_grow(dl_ctx *ctx, void **p, int64_t *cap, int64_t need, size_t esize)
{
    int64_t c = *cap ? *cap : 64;
    void *q;
    if (need <= *cap) return true;
    while (c < need) c *= 2;
    q = DL_REALLOC(*p, esize * (size_t)c);
    ctx->alloc_calls++;
    if (!q) {
        dl__err(ctx, DL_ERR_OOM, "dl_capture: out of host memory for the capture's records");
        return false;
    }
    *p = q;
    *cap = c;
    return true;
}

/* A persistent tensor the capture touches (no-op outside a capture). */
static void dl__cap_use(dl_tensor *t)
{
    dl_capture *c;
    int64_t i;
    if (!t || !t->ctx_->cap || t->step_ != 0) return;
    c = t->ctx_->cap;
    for (i = 0; i < c->nuse; i++) if (c->uses[i] == t) return;
    if (!dl__cap_grow(t->ctx_, (void **)&c->uses, &c->capuse, c->nuse + 1, sizeof(dl_tensor *))) return;
    c->uses[c->nuse++] = t;
}

/* An in-place write inside the capture moved t's version (dl__bump_version):
   each replay moves it again, as the eager step would. */
static void dl__cap_bump(dl_tensor *t)
{
    dl_capture *c = t->ctx_->cap;
    if (!dl__cap_grow(t->ctx_, (void **)&c->bumps, &c->capbump, c->nbump + 1, sizeof(dl_tensor *))) return;
    c->bumps[c->nbump++] = t;
}

/* dl__live's part inside a capture: persistent tensors are listed, its own
   pass, a step tensor from before it or another capture's are refused. */
static bool dl__cap_input(const char *op, const char *arg, dl_tensor *t)
{
    dl_ctx *ctx = t->ctx_;
    if (t->step_ == 0) { dl__cap_use(t); return true; }
    if (t->step_ == ctx->cap->gen) return true;
    if (t->step_ == ctx->step)
        dl__err(ctx, DL_ERR_ARG, "%s: %s %s is a step tensor made before dl_capture_begin(): "
                "dl_step_end() recycles its memory, so a replay could not use it; make it "
                "persistent (dl_keep) before the capture, or inside it", op, arg, dl__sh(t));
    else
        dl__err(ctx, DL_ERR_ARG, "%s: %s %s was made by another capture; a capture may use "
                "persistent tensors and its own only (dl_keep it)", op, arg, dl__sh(t));
    return false;
}

static bool dl__cap_persistent(dl_ctx *ctx, const char *op)
{
    dl__err(ctx, DL_ERR_UNSUPPORTED, "%s: a persistent allocation inside a capture "
            "(dl_capture_begin .. dl_capture_end): a replay cannot allocate. Warm up first: one "
            "eager step before dl_capture_begin() makes the parameters' gradients and the "
            "optimizer's state, as torch.cuda.graph's warm-up does; make static inputs "
            "(dl_keep) before it too", op);
    return false;
}

/* the capture can no longer replay: why (DL_ERR_STALE), or its failure when recording */
static void dl__cap_invalidate(dl_capture *c, const char *msg)
{
    if (c->state == DL__CAP_RECORDING) { dl__cap_fail(c, DL_ERR_STALE, msg, true); return; }
    if (c->state == DL__CAP_INVALID) return;
    c->state = DL__CAP_INVALID;
    c->err = DL_ERR_STALE;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
}

/* t's storage goes away (how: "freed" ...): every capture that uses it */
static void dl__cap_forget(dl_tensor *t, const char *how)
{
    dl_capture *c;
    int64_t i;
    for (c = t->ctx_->caps; c; c = c->next)
        for (i = 0; i < c->nuse; i++)
            if (c->uses[i] == t) {
                int64_t j;
                char m[256];
                for (j = 0; j < c->nbump; j++) if (c->bumps[j] == t) c->bumps[j] = NULL;
                snprintf(m, sizeof m, "the capture uses %s %s, which was %s after dl_capture_begin(); "
                         "capture again", t->name[0] ? t->name : "a tensor", dl__sh(t), how);
                c->uses[i] = NULL;
                dl__cap_invalidate(c, m);
            }
}

/* owner (an optimizer with a hook) goes away (what: its name) */
static void dl__cap_owner_gone(dl_ctx *ctx, void *owner, const char *what)
{
    dl_capture *c;
    int i;
    for (c = ctx->caps; c; c = c->next)
        for (i = 0; i < c->nhook; i++)
            if (c->hook[i].owner == owner) {
                char m[256];
                snprintf(m, sizeof m, "the capture steps %s, which was freed after dl_capture_begin(); "
                         "capture again", what);
                c->hook[i].owner = NULL;
                dl__cap_invalidate(c, m);
            }
}

/* Registers fn(cap, owner, data) to run at the start of every replay of
   the capture running. One per owner: false (with an error naming op)
   when owner has one already, since what it refreshes changes once a step. */
static bool dl__cap_hook(dl_ctx *ctx, const char *op, void (*fn)(dl_capture *, void *, void *),
                         void *owner, void *data)
{
    dl_capture *c = ctx->cap;
    int i;
    int64_t cap = c->caphook;
    for (i = 0; i < c->nhook; i++)
        if (c->hook[i].owner == owner) {
            dl__err(ctx, DL_ERR_UNSUPPORTED, "%s: a second step inside one capture: a replay "
                    "refreshes its state once; capture one step", op);
            return false;
        }
    if (!dl__cap_grow(ctx, (void **)&c->hook, &cap, c->nhook + 1, sizeof(dl__caphook))) return false;
    c->caphook = (int)cap;
    c->hook[c->nhook].fn = fn;
    c->hook[c->nhook].owner = owner;
    c->hook[c->nhook].data = data;
    c->nhook++;
    return true;
}

static void *dl__cap_halloc(dl_ctx *ctx, size_t need)
{
    dl_capture *c = ctx->cap;
#ifdef DL__HVM
    if (c->hreg) return dl__hregion_take(ctx, c->hreg, need);
#endif
    return dl__arena_alloc(ctx, &c->harena, need, false);
}

/* ---- recording the CPU's calls */

static dl__rec *dl__rec_add(dl__dev *d, int kind)
{
    dl_capture *c = d->ctx->cap;
    dl__rec *r;
    if (c->err != DL_OK) return NULL;   /* failed: nothing will replay */
    if (!dl__cap_grow(d->ctx, (void **)&c->rec, &c->caprec, c->nrec + 1, sizeof(dl__rec))) return NULL;
    r = &c->rec[c->nrec++];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->d = d;
    return r;
}

/* a copy of a host struct (bytes) for r; false on OOM */
static bool dl__rec_blob(dl__dev *d, dl__rec *r, const void *src, size_t bytes)
{
    dl_capture *c = d->ctx->cap;
    int64_t cap = (int64_t)c->capblob;
    size_t at = (c->nblob + 15) & ~(size_t)15;
    if (!dl__cap_grow(d->ctx, (void **)&c->blob, &cap, (int64_t)(at + bytes), 1)) { c->nrec--; return false; }
    c->capblob = (size_t)cap;
    memcpy(c->blob + at, src, bytes);
    c->nblob = at + bytes;
    r->blob = at;
    return true;
}

/* a draw of the context's generator: the counter relative to the capture's start */
static void dl__rec_draw(dl__dev *d, dl__rec *r, uint64_t seed, uint64_t offset)
{
    dl_capture *c = d->ctx->cap;
    r->b[2] = seed == d->ctx->seed && offset >= c->rng0;
    r->u = r->b[2] ? offset - c->rng0 : offset;
    r->n[9] = (int64_t)seed;   /* (another generator's: baked in) */
}

#define DL__REC(d, kind) dl__rec *r = dl__rec_add(d, kind); if (r)
#define DL__CPU dl__cpu_backend

static void dl__rw_upload(dl__dev *d, void *dst, const void *src, size_t n)
{
    (void)dst; (void)src; (void)n;
    dl__cap_refuse(d, "a copy from the host (upload)");
}
static void dl__rw_download(dl__dev *d, void *dst, const void *src, size_t n)
{
    (void)src;
    dl__cap_refuse(d, "a read to the host (download)");
    memset(dst, 0, n);
}
static int64_t dl__rw_nonfinite(dl__dev *d, const float *x, int64_t n)
{
    (void)x; (void)n;
    dl__cap_refuse(d, "a read to the host (nonfinite: anomaly mode)");
    return -1;
}
static double dl__rw_sumsq(dl__dev *d, const float *x, int64_t n)
{
    (void)x; (void)n;
    dl__cap_refuse(d, "a read to the host (sumsq)");
    return 0;
}
static void dl__rw_sync(dl__dev *d) { (void)d; }   /* a recording waits for nothing */
static void dl__rw_copy(dl__dev *d, void *dst, const void *src, size_t n)
{
    DL__REC(d, DL__RK_COPY) { r->p[0] = dst; r->p[1] = (void *)src; r->n[0] = (int64_t)n; }
    DL__CPU.copy(d, dst, src, n);
}
static void dl__rw_peer(dl__dev *dd, void *dst, dl__dev *sd, const void *src, size_t n)
{
    DL__REC(dd, DL__RK_PEER) { r->d2 = sd; r->p[0] = dst; r->p[1] = (void *)src; r->n[0] = (int64_t)n; }
    DL__CPU.peer(dd, dst, sd, src, n);
}
static void dl__rw_rand(dl__dev *d, int dist, float *y, int64_t n, uint64_t seed, uint64_t offset, float a,
                        float b)
{
    DL__REC(d, DL__RK_RAND) {
        r->k = dist; r->p[0] = y; r->n[0] = n; r->f[0] = a; r->f[1] = b;
        dl__rec_draw(d, r, seed, offset);
    }
    DL__CPU.rand(d, dist, y, n, seed, offset, a, b);
}
static void dl__rw_arange(dl__dev *d, float *y, int64_t n, double start, double step)
{
    DL__REC(d, DL__RK_ARANGE) { r->p[0] = y; r->n[0] = n; r->g[0] = start; r->g[1] = step; }
    DL__CPU.arange(d, y, n, start, step);
}
static void dl__rw_fill(dl__dev *d, float *y, int64_t n, float v)
{
    DL__REC(d, DL__RK_FILL) { r->p[0] = y; r->n[0] = n; r->f[0] = v; }
    DL__CPU.fill(d, y, n, v);
}
static void dl__rw_add_i64(dl__dev *d, int64_t *p, int64_t v)
{
    DL__REC(d, DL__RK_ADD_I64) { r->p[0] = p; r->n[0] = v; }
    DL__CPU.add_i64(d, p, v);
}
static void dl__rw_eq_i64(dl__dev *d, float *y, const int64_t *a, const int64_t *b, int64_t n)
{
    DL__REC(d, DL__RK_EQ_I64) { r->p[0] = y; r->p[1] = (void *)a; r->p[2] = (void *)b; r->n[0] = n; }
    DL__CPU.eq_i64(d, y, a, b, n);
}
static void dl__rw_unary(dl__dev *d, int op, float *y, const float *x, int64_t n, float a, float b)
{
    DL__REC(d, DL__RK_UNARY) { r->k = op; r->p[0] = y; r->p[1] = (void *)x; r->n[0] = n; r->f[0] = a; r->f[1] = b; }
    DL__CPU.unary(d, op, y, x, n, a, b);
}
static void dl__rw_binary(dl__dev *d, int op, float *y, const float *a, const float *b, const dl__bcast *bc)
{
    DL__REC(d, DL__RK_BINARY) if (dl__rec_blob(d, r, bc, sizeof *bc)) {
        r->k = op; r->p[0] = y; r->p[1] = (void *)a; r->p[2] = (void *)b;
    }
    DL__CPU.binary(d, op, y, a, b, bc);
}
static void dl__rw_reduce(dl__dev *d, int op, float *y, const float *x, int64_t outer, int64_t rr, int64_t inner)
{
    DL__REC(d, DL__RK_REDUCE) { r->k = op; r->p[0] = y; r->p[1] = (void *)x; r->n[0] = outer; r->n[1] = rr; r->n[2] = inner; }
    DL__CPU.reduce(d, op, y, x, outer, rr, inner);
}
static void dl__rw_argmax(dl__dev *d, int64_t *idx, const float *x, int64_t outer, int64_t rr, int64_t inner)
{
    DL__REC(d, DL__RK_ARGMAX) { r->p[0] = idx; r->p[1] = (void *)x; r->n[0] = outer; r->n[1] = rr; r->n[2] = inner; }
    DL__CPU.argmax(d, idx, x, outer, rr, inner);
}
static void dl__rw_onehot(dl__dev *d, float *y, const int64_t *idx, int64_t outer, int64_t rr, int64_t inner)
{
    DL__REC(d, DL__RK_ONEHOT) { r->p[0] = y; r->p[1] = (void *)idx; r->n[0] = outer; r->n[1] = rr; r->n[2] = inner; }
    DL__CPU.onehot(d, y, idx, outer, rr, inner);
}
static void dl__rw_copy_nd(dl__dev *d, size_t esize, int ndim, const int64_t *shape, void *dst,
                           const int64_t *dst_strides, const void *src, const int64_t *src_strides)
{
    DL__REC(d, DL__RK_COPY_ND) {
        int64_t a[3 * DL_MAX_DIMS];
        int k = ndim < 0 ? 0 : ndim > DL_MAX_DIMS ? DL_MAX_DIMS : ndim;
        memcpy(a, shape, sizeof(int64_t) * (size_t)k);
        memcpy(a + k, dst_strides, sizeof(int64_t) * (size_t)k);
        memcpy(a + 2 * k, src_strides, sizeof(int64_t) * (size_t)k);
        if (dl__rec_blob(d, r, a, sizeof(int64_t) * (size_t)(3 * k))) {
            r->k = k; r->n[0] = (int64_t)esize; r->p[0] = dst; r->p[1] = (void *)src;
        }
    }
    DL__CPU.copy_nd(d, esize, ndim, shape, dst, dst_strides, src, src_strides);
}
static void dl__rw_axpy(dl__dev *d, float *y, const float *x, int64_t n, float alpha)
{
    DL__REC(d, DL__RK_AXPY) { r->p[0] = y; r->p[1] = (void *)x; r->n[0] = n; r->f[0] = alpha; }
    DL__CPU.axpy(d, y, x, n, alpha);
}
static void dl__rw_gemm(dl__dev *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb, int64_t sB,
                        float beta, float *C, int64_t ldc, int64_t sC, int64_t batch)
{
    DL__REC(d, DL__RK_GEMM) {
        r->b[0] = ta; r->b[1] = tb; r->f[0] = alpha; r->f[1] = beta;
        r->p[0] = (void *)A; r->p[1] = (void *)B; r->p[2] = C;
        r->n[0] = M; r->n[1] = N; r->n[2] = K; r->n[3] = lda; r->n[4] = sA; r->n[5] = ldb; r->n[6] = sB;
        r->n[7] = ldc; r->n[8] = sC; r->n[9] = batch;
    }
    DL__CPU.gemm(d, ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch);
}
static void dl__rw_softmax(dl__dev *d, bool log, float *y, const float *x, int64_t outer, int64_t n, int64_t inner)
{
    DL__REC(d, DL__RK_SOFTMAX) { r->b[0] = log; r->p[0] = y; r->p[1] = (void *)x; r->n[0] = outer; r->n[1] = n; r->n[2] = inner; }
    DL__CPU.softmax(d, log, y, x, outer, n, inner);
}
static int64_t dl__rw_class_mask(dl__dev *d, float *onehot, float *valid, const void *target, bool i64,
                                 int64_t outer, int64_t C, int64_t inner, int64_t ignore_index, int64_t *bad)
{
    DL__REC(d, DL__RK_CLASS_MASK) {
        r->p[0] = onehot; r->p[1] = valid; r->p[2] = (void *)target; r->b[0] = i64;
        r->n[0] = outer; r->n[1] = C; r->n[2] = inner; r->n[3] = ignore_index;
    }
    return DL__CPU.class_mask(d, onehot, valid, target, i64, outer, C, inner, ignore_index, bad);
}
static void dl__rw_dropout_mask(dl__dev *d, float *mask, int64_t n, float p, float scale, uint64_t seed,
                                uint64_t offset)
{
    DL__REC(d, DL__RK_DROPOUT) {
        r->p[0] = mask; r->n[0] = n; r->f[0] = p; r->f[1] = scale;
        dl__rec_draw(d, r, seed, offset);
    }
    DL__CPU.dropout_mask(d, mask, n, p, scale, seed, offset);
}
static void dl__rw_bce_logits(dl__dev *d, float *out, const float *x, const float *y, int64_t n)
{
    DL__REC(d, DL__RK_BCE) { r->p[0] = out; r->p[1] = (void *)x; r->p[2] = (void *)y; r->n[0] = n; }
    DL__CPU.bce_logits(d, out, x, y, n);
}
static void dl__rw_im2col(dl__dev *d, float *col, const float *x, int64_t n, const dl__cgeom *g)
{
    DL__REC(d, DL__RK_IM2COL) if (dl__rec_blob(d, r, g, sizeof *g)) { r->p[0] = col; r->p[1] = (void *)x; r->n[0] = n; }
    DL__CPU.im2col(d, col, x, n, g);
}
static void dl__rw_col2im(dl__dev *d, float *x, const float *col, int64_t n, const dl__cgeom *g)
{
    DL__REC(d, DL__RK_COL2IM) if (dl__rec_blob(d, r, g, sizeof *g)) { r->p[0] = x; r->p[1] = (void *)col; r->n[0] = n; }
    DL__CPU.col2im(d, x, col, n, g);
}
static void dl__rw_bias_add(dl__dev *d, float *y, const float *b, int64_t n, int64_t C, int64_t L)
{
    DL__REC(d, DL__RK_BIAS_ADD) { r->p[0] = y; r->p[1] = (void *)b; r->n[0] = n; r->n[1] = C; r->n[2] = L; }
    DL__CPU.bias_add(d, y, b, n, C, L);
}
static void dl__rw_max_pool(dl__dev *d, float *y, int64_t *idx, const float *x, int64_t planes, const dl__pgeom *g)
{
    DL__REC(d, DL__RK_MAX_POOL) if (dl__rec_blob(d, r, g, sizeof *g)) {
        r->p[0] = y; r->p[1] = idx; r->p[2] = (void *)x; r->n[0] = planes;
    }
    DL__CPU.max_pool(d, y, idx, x, planes, g);
}
static void dl__rw_unpool(dl__dev *d, float *dx, const float *g, const int64_t *idx, int64_t planes, int64_t Lin,
                          int64_t Lout)
{
    DL__REC(d, DL__RK_UNPOOL) {
        r->p[0] = dx; r->p[1] = (void *)g; r->p[2] = (void *)idx; r->n[0] = planes; r->n[1] = Lin; r->n[2] = Lout;
    }
    DL__CPU.unpool(d, dx, g, idx, planes, Lin, Lout);
}
static void dl__rw_gather(dl__dev *d, float *y, const float *x, const int64_t *idx, int64_t planes, int64_t Lin,
                          int64_t Lout)
{
    DL__REC(d, DL__RK_GATHER) {
        r->p[0] = y; r->p[1] = (void *)x; r->p[2] = (void *)idx; r->n[0] = planes; r->n[1] = Lin; r->n[2] = Lout;
    }
    DL__CPU.gather(d, y, x, idx, planes, Lin, Lout);
}
static void dl__rw_load_batch(dl__dev *d, float *x, int64_t *y, const uint8_t *data, const int64_t *labels,
                              const int64_t *plan, int64_t n, const dl__batchgeom *g)
{
    (void)x; (void)y; (void)data; (void)labels; (void)plan; (void)n; (void)g;
    dl__cap_refuse(d, "loading a batch (dl_loader_next)");   /* (refused above it already) */
}
static void dl__rw_avg_pool(dl__dev *d, float *y, const float *x, int64_t planes, const dl__pgeom *g)
{
    DL__REC(d, DL__RK_AVG_POOL) if (dl__rec_blob(d, r, g, sizeof *g)) { r->p[0] = y; r->p[1] = (void *)x; r->n[0] = planes; }
    DL__CPU.avg_pool(d, y, x, planes, g);
}
static void dl__rw_avg_pool_adj(dl__dev *d, float *dx, const float *gy, int64_t planes, const dl__pgeom *g)
{
    DL__REC(d, DL__RK_AVG_POOL_ADJ) if (dl__rec_blob(d, r, g, sizeof *g)) { r->p[0] = dx; r->p[1] = (void *)gy; r->n[0] = planes; }
    DL__CPU.avg_pool_adj(d, dx, gy, planes, g);
}
static void dl__rw_bn_stats(dl__dev *d, float *mean, float *invstd, float *var, const float *x, int64_t N,
                            int64_t C, int64_t L, float eps, const dl__bn_running *rs)
{
    DL__REC(d, DL__RK_BN_STATS) {
        r->p[0] = mean; r->p[1] = invstd; r->p[2] = var; r->p[3] = (void *)x;
        r->n[0] = N; r->n[1] = C; r->n[2] = L; r->f[0] = eps;
        r->b[0] = rs != NULL;
        if (rs) {
            r->p[4] = rs->rm; r->p[5] = rs->rv; r->p[6] = rs->nbt;
            r->f[1] = rs->keep; r->f[2] = rs->mom; r->g[0] = (double)rs->vmom;
        }
    }
    DL__CPU.bn_stats(d, mean, invstd, var, x, N, C, L, eps, rs);
}
static void dl__rw_bn_apply(dl__dev *d, float *y, const float *x, const float *mean, const float *invstd,
                            const float *w, const float *b, const float *res, int64_t N, int64_t C, int64_t L,
                            bool relu)
{
    DL__REC(d, DL__RK_BN_APPLY) {
        r->p[0] = y; r->p[1] = (void *)x; r->p[2] = (void *)mean; r->p[3] = (void *)invstd;
        r->p[4] = (void *)w; r->p[5] = (void *)b; r->p[6] = (void *)res;
        r->n[0] = N; r->n[1] = C; r->n[2] = L; r->b[0] = relu;
    }
    DL__CPU.bn_apply(d, y, x, mean, invstd, w, b, res, N, C, L, relu);
}
static void dl__rw_bn_backward(dl__dev *d, float *dx, float *dw, float *db, const float *g, const float *x,
                               const float *mean, const float *invstd, const float *w, int64_t N, int64_t C,
                               int64_t L, bool train, const float *ry, float *gm)
{
    DL__REC(d, DL__RK_BN_BACKWARD) {
        r->p[0] = dx; r->p[1] = dw; r->p[2] = db; r->p[3] = (void *)g; r->p[4] = (void *)x;
        r->p[5] = (void *)mean; r->p[6] = (void *)invstd; r->p[7] = (void *)w; r->p[8] = (void *)ry;
        r->p[9] = gm; r->n[0] = N; r->n[1] = C; r->n[2] = L; r->b[0] = train;
    }
    DL__CPU.bn_backward(d, dx, dw, db, g, x, mean, invstd, w, N, C, L, train, ry, gm);
}
static void dl__rw_ln_forward(dl__dev *d, float *y, float *mean, float *invstd, const float *x, const float *w,
                              const float *b, int64_t rows, int64_t cols, float eps)
{
    DL__REC(d, DL__RK_LN_FORWARD) {
        r->p[0] = y; r->p[1] = mean; r->p[2] = invstd; r->p[3] = (void *)x; r->p[4] = (void *)w;
        r->p[5] = (void *)b; r->n[0] = rows; r->n[1] = cols; r->f[0] = eps;
    }
    DL__CPU.ln_forward(d, y, mean, invstd, x, w, b, rows, cols, eps);
}
static void dl__rw_ln_backward(dl__dev *d, float *dx, float *dw, float *db, const float *g, const float *x,
                               const float *mean, const float *invstd, const float *w, int64_t rows, int64_t cols)
{
    DL__REC(d, DL__RK_LN_BACKWARD) {
        r->p[0] = dx; r->p[1] = dw; r->p[2] = db; r->p[3] = (void *)g; r->p[4] = (void *)x;
        r->p[5] = (void *)mean; r->p[6] = (void *)invstd; r->p[7] = (void *)w; r->n[0] = rows; r->n[1] = cols;
    }
    DL__CPU.ln_backward(d, dx, dw, db, g, x, mean, invstd, w, rows, cols);
}
/* the optimizers' argument structs are the optimizer's own array, which its
   replay hook rewrites: the records point at it (dl_optim_step) */
static void dl__rw_sgd(dl__dev *d, float *p, const float *g, float *buf, int64_t n, const dl__sgd_args *a)
{
    DL__REC(d, DL__RK_SGD) { r->p[0] = p; r->p[1] = (void *)g; r->p[2] = buf; r->n[0] = n; r->arg = a; }
    DL__CPU.sgd(d, p, g, buf, n, a);
}
static void dl__rw_adam(dl__dev *d, float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                        const dl__adam_args *a)
{
    DL__REC(d, DL__RK_ADAM) {
        r->p[0] = p; r->p[1] = (void *)g; r->p[2] = m; r->p[3] = v; r->p[4] = vmax; r->n[0] = n; r->arg = a;
    }
    DL__CPU.adam(d, p, g, m, v, vmax, n, a);
}
static void dl__rw_scale(dl__dev *d, float *x, int64_t n, float s)
{
    DL__REC(d, DL__RK_SCALE) { r->p[0] = x; r->n[0] = n; r->f[0] = s; }
    DL__CPU.scale(d, x, n, s);
}
static void dl__rw_conv_s1(dl__dev *d, float *y, const float *x, const float *w, const float *bias, float *scratch,
                           int64_t n, const dl__cgeom *g, bool flip)
{
    DL__REC(d, DL__RK_CONV_S1) if (dl__rec_blob(d, r, g, sizeof *g)) {
        r->p[0] = y; r->p[1] = (void *)x; r->p[2] = (void *)w; r->p[3] = (void *)bias; r->p[4] = scratch;
        r->n[0] = n; r->b[0] = flip;
    }
    DL__CPU.conv_s1(d, y, x, w, bias, scratch, n, g, flip);
}
/* the entries that may decline: recorded when they did the work (a
   decline records nothing: the caller's other path is recorded instead) */
static bool dl__rw_conv_s1_wgrad(dl__dev *d, float *dw, const float *x, const float *gy, float *scratch, int64_t n,
                                 const dl__cgeom *g, float beta)
{
    if (!DL__CPU.conv_s1_wgrad(d, dw, x, gy, scratch, n, g, beta)) return false;
    {
        DL__REC(d, DL__RK_CONV_S1_WGRAD) if (dl__rec_blob(d, r, g, sizeof *g)) {
            r->p[0] = dw; r->p[1] = (void *)x; r->p[2] = (void *)gy; r->p[3] = scratch; r->n[0] = n; r->f[0] = beta;
        }
    }
    return true;
}
#ifdef DL__WG
static bool dl__rw_conv_wg(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                           const dl__cgeom *g, bool flip)
{
    if (!DL__CPU.conv_wg(d, y, x, w, bias, n, g, flip)) return false;
    {
        DL__REC(d, DL__RK_CONV_WG) if (dl__rec_blob(d, r, g, sizeof *g)) {
            r->p[0] = y; r->p[1] = (void *)x; r->p[2] = (void *)w; r->p[3] = (void *)bias; r->n[0] = n; r->b[0] = flip;
        }
    }
    return true;
}
static bool dl__rw_conv_wg_wgrad(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n, const dl__cgeom *g)
{
    if (!DL__CPU.conv_wg_wgrad(d, dw, x, gy, n, g)) return false;
    {
        DL__REC(d, DL__RK_CONV_WG_WGRAD) if (dl__rec_blob(d, r, g, sizeof *g)) {
            r->p[0] = dw; r->p[1] = (void *)x; r->p[2] = (void *)gy; r->n[0] = n;
        }
    }
    return true;
}
#endif
static bool dl__rw_conv_i2c(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                            const dl__cgeom *g)
{
    if (!DL__CPU.conv_i2c(d, y, x, w, bias, n, g)) return false;
    {
        DL__REC(d, DL__RK_CONV_I2C) if (dl__rec_blob(d, r, g, sizeof *g)) {
            r->p[0] = y; r->p[1] = (void *)x; r->p[2] = (void *)w; r->p[3] = (void *)bias; r->n[0] = n;
        }
    }
    return true;
}

/* what a CPU device's table is while a capture records */
static const dl__backend dl__cap_backend = {
    "cpu (recording)",
    dl__cpu_alloc, dl__cpu_free, dl__rw_upload, dl__rw_download, dl__rw_copy, dl__rw_peer, dl__rw_sync,
    NULL, NULL, NULL,   /* prof_*: the host clock */
    dl__rw_rand, dl__rw_arange, dl__rw_fill, dl__rw_add_i64,
    dl__rw_unary, dl__rw_binary, dl__rw_reduce, dl__rw_argmax, dl__rw_onehot, dl__rw_copy_nd,
    dl__rw_axpy, dl__rw_nonfinite, dl__rw_gemm, dl__rw_softmax,
    dl__rw_class_mask, dl__rw_dropout_mask, dl__rw_bce_logits,
    dl__rw_im2col, dl__rw_col2im, dl__rw_bias_add, dl__rw_max_pool, dl__rw_unpool,
    dl__rw_gather, dl__rw_load_batch, dl__rw_avg_pool, dl__rw_avg_pool_adj,
    dl__rw_bn_stats, dl__rw_bn_apply, dl__rw_bn_backward, dl__rw_ln_forward, dl__rw_ln_backward,
    dl__rw_sgd, dl__rw_adam, dl__rw_sumsq, dl__rw_scale, dl__rw_conv_s1, dl__rw_conv_s1_wgrad,
#ifdef DL__WG
    dl__rw_conv_wg, dl__rw_conv_wg_wgrad,
#else
    NULL, NULL,
#endif
    dl__rw_conv_i2c,
    NULL, NULL,   /* convT_i2c, conv_i2c_wgrad: the CPU has neither */
    NULL, NULL, NULL, NULL,
    NULL, NULL, NULL,
    NULL,
    NULL, NULL,
    NULL,
    dl__rw_eq_i64,
    NULL, NULL,
    NULL,
    NULL, NULL,
    NULL
};

/* One record again (a replay). false, with the context's error, when its
   work cannot be done as recorded: a check the CPU keeps at replay
   (cross entropy's targets), a path that declines the data it now gets. */
static bool dl__rec_run(dl_capture *c, const dl__rec *r)
{
    dl__dev *d = r->d;
    const void *a = r->arg ? r->arg : c->blob + r->blob;
    void *const *p = r->p;
    const int64_t *n = r->n;
    uint64_t seed = r->b[2] ? c->seed : (uint64_t)n[9], off = r->b[2] ? c->rng + r->u : r->u;
    const char *declined = NULL;
    switch (r->kind) {
    case DL__RK_COPY: DL__CPU.copy(d, p[0], p[1], (size_t)n[0]); break;
    case DL__RK_PEER: DL__CPU.peer(d, p[0], r->d2, p[1], (size_t)n[0]); break;
    case DL__RK_RAND: DL__CPU.rand(d, r->k, (float *)p[0], n[0], seed, off, r->f[0], r->f[1]); break;
    case DL__RK_ARANGE: DL__CPU.arange(d, (float *)p[0], n[0], r->g[0], r->g[1]); break;
    case DL__RK_FILL: DL__CPU.fill(d, (float *)p[0], n[0], r->f[0]); break;
    case DL__RK_ADD_I64: DL__CPU.add_i64(d, (int64_t *)p[0], n[0]); break;
    case DL__RK_EQ_I64: DL__CPU.eq_i64(d, (float *)p[0], (const int64_t *)p[1], (const int64_t *)p[2], n[0]); break;
    case DL__RK_UNARY: DL__CPU.unary(d, r->k, (float *)p[0], (const float *)p[1], n[0], r->f[0], r->f[1]); break;
    case DL__RK_BINARY:
        DL__CPU.binary(d, r->k, (float *)p[0], (const float *)p[1], (const float *)p[2], (const dl__bcast *)a);
        break;
    case DL__RK_REDUCE: DL__CPU.reduce(d, r->k, (float *)p[0], (const float *)p[1], n[0], n[1], n[2]); break;
    case DL__RK_ARGMAX: DL__CPU.argmax(d, (int64_t *)p[0], (const float *)p[1], n[0], n[1], n[2]); break;
    case DL__RK_ONEHOT: DL__CPU.onehot(d, (float *)p[0], (const int64_t *)p[1], n[0], n[1], n[2]); break;
    case DL__RK_COPY_ND: {
        const int64_t *s = (const int64_t *)a;
        DL__CPU.copy_nd(d, (size_t)n[0], r->k, s, p[0], s + r->k, p[1], s + 2 * r->k);
        break;
    }
    case DL__RK_AXPY: DL__CPU.axpy(d, (float *)p[0], (const float *)p[1], n[0], r->f[0]); break;
    case DL__RK_GEMM:
        DL__CPU.gemm(d, r->b[0], r->b[1], n[0], n[1], n[2], r->f[0], (const float *)p[0], n[3], n[4],
                     (const float *)p[1], n[5], n[6], r->f[1], (float *)p[2], n[7], n[8], n[9]);
        break;
    case DL__RK_SOFTMAX: DL__CPU.softmax(d, r->b[0], (float *)p[0], (const float *)p[1], n[0], n[1], n[2]); break;
    case DL__RK_CLASS_MASK: {
        int64_t bad = 0, at = DL__CPU.class_mask(d, (float *)p[0], (float *)p[1], p[2], r->b[0], n[0], n[1], n[2],
                                                 n[3], &bad);
        if (at >= 0) {
            dl__err(c->ctx, DL_ERR_ARG, "dl_replay: a class-index target holds %lld at flat index %lld: "
                    "class indices must be in [0, %lld) or equal ignore_index %lld (the loss's check, "
                    "which replays on CPU devices keep)", (long long)bad, (long long)at, (long long)n[1],
                    (long long)n[3]);
            return false;
        }
        break;
    }
    case DL__RK_DROPOUT: DL__CPU.dropout_mask(d, (float *)p[0], n[0], r->f[0], r->f[1], seed, off); break;
    case DL__RK_BCE: DL__CPU.bce_logits(d, (float *)p[0], (const float *)p[1], (const float *)p[2], n[0]); break;
    case DL__RK_IM2COL: DL__CPU.im2col(d, (float *)p[0], (const float *)p[1], n[0], (const dl__cgeom *)a); break;
    case DL__RK_COL2IM: DL__CPU.col2im(d, (float *)p[0], (const float *)p[1], n[0], (const dl__cgeom *)a); break;
    case DL__RK_BIAS_ADD: DL__CPU.bias_add(d, (float *)p[0], (const float *)p[1], n[0], n[1], n[2]); break;
    case DL__RK_MAX_POOL:
        DL__CPU.max_pool(d, (float *)p[0], (int64_t *)p[1], (const float *)p[2], n[0], (const dl__pgeom *)a);
        break;
    case DL__RK_UNPOOL:
        DL__CPU.unpool(d, (float *)p[0], (const float *)p[1], (const int64_t *)p[2], n[0], n[1], n[2]);
        break;
    case DL__RK_GATHER:
        DL__CPU.gather(d, (float *)p[0], (const float *)p[1], (const int64_t *)p[2], n[0], n[1], n[2]);
        break;
    case DL__RK_AVG_POOL: DL__CPU.avg_pool(d, (float *)p[0], (const float *)p[1], n[0], (const dl__pgeom *)a); break;
    case DL__RK_AVG_POOL_ADJ:
        DL__CPU.avg_pool_adj(d, (float *)p[0], (const float *)p[1], n[0], (const dl__pgeom *)a);
        break;
    case DL__RK_BN_STATS: {
        dl__bn_running rs;
        rs.rm = (float *)p[4]; rs.rv = (float *)p[5]; rs.nbt = (int64_t *)p[6];
        rs.keep = r->f[1]; rs.mom = r->f[2]; rs.vmom = (float)r->g[0];
        DL__CPU.bn_stats(d, (float *)p[0], (float *)p[1], (float *)p[2], (const float *)p[3], n[0], n[1], n[2],
                         r->f[0], r->b[0] ? &rs : NULL);
        break;
    }
    case DL__RK_BN_APPLY:
        DL__CPU.bn_apply(d, (float *)p[0], (const float *)p[1], (const float *)p[2], (const float *)p[3],
                         (const float *)p[4], (const float *)p[5], (const float *)p[6], n[0], n[1], n[2], r->b[0]);
        break;
    case DL__RK_BN_BACKWARD:
        DL__CPU.bn_backward(d, (float *)p[0], (float *)p[1], (float *)p[2], (const float *)p[3], (const float *)p[4],
                            (const float *)p[5], (const float *)p[6], (const float *)p[7], n[0], n[1], n[2], r->b[0],
                            (const float *)p[8], (float *)p[9]);
        break;
    case DL__RK_LN_FORWARD:
        DL__CPU.ln_forward(d, (float *)p[0], (float *)p[1], (float *)p[2], (const float *)p[3], (const float *)p[4],
                           (const float *)p[5], n[0], n[1], r->f[0]);
        break;
    case DL__RK_LN_BACKWARD:
        DL__CPU.ln_backward(d, (float *)p[0], (float *)p[1], (float *)p[2], (const float *)p[3], (const float *)p[4],
                            (const float *)p[5], (const float *)p[6], (const float *)p[7], n[0], n[1]);
        break;
    case DL__RK_SGD:
        DL__CPU.sgd(d, (float *)p[0], (const float *)p[1], (float *)p[2], n[0], (const dl__sgd_args *)a);
        break;
    case DL__RK_ADAM:
        DL__CPU.adam(d, (float *)p[0], (const float *)p[1], (float *)p[2], (float *)p[3], (float *)p[4], n[0],
                     (const dl__adam_args *)a);
        break;
    case DL__RK_SCALE: DL__CPU.scale(d, (float *)p[0], n[0], r->f[0]); break;
    case DL__RK_CONV_S1:
        DL__CPU.conv_s1(d, (float *)p[0], (const float *)p[1], (const float *)p[2], (const float *)p[3],
                        (float *)p[4], n[0], (const dl__cgeom *)a, r->b[0]);
        break;
    case DL__RK_CONV_S1_WGRAD:
        if (!DL__CPU.conv_s1_wgrad(d, (float *)p[0], (const float *)p[1], (const float *)p[2], (float *)p[3], n[0],
                                   (const dl__cgeom *)a, r->f[0]))
            declined = "stride-1 weight gradient";
        break;
#ifdef DL__WG
    case DL__RK_CONV_WG:
        if (!DL__CPU.conv_wg(d, (float *)p[0], (const float *)p[1], (const float *)p[2], (const float *)p[3], n[0],
                             (const dl__cgeom *)a, r->b[0]))
            declined = "Winograd";
        break;
    case DL__RK_CONV_WG_WGRAD:
        if (!DL__CPU.conv_wg_wgrad(d, (float *)p[0], (const float *)p[1], (const float *)p[2], n[0],
                                   (const dl__cgeom *)a))
            declined = "Winograd weight gradient";
        break;
#endif
    case DL__RK_CONV_I2C:
        if (!DL__CPU.conv_i2c(d, (float *)p[0], (const float *)p[1], (const float *)p[2], (const float *)p[3], n[0],
                              (const dl__cgeom *)a))
            declined = "per-sample im2col";
        break;
    default: break;
    }
    if (declined) {
        dl__err(c->ctx, DL_ERR_NAN, "dl_replay: a convolution's %s path, which the capture recorded, declined "
                "the data at replay (it declines inf or NaN in its operands, where the eager step would "
                "take another path); capture again", declined);
        return false;
    }
    return dl__dev_check(d, "dl_replay") == DL_OK;
}

/* ---- the API */

static bool dl__cap_ok(dl_capture *c, const char *op)
{
    if (!c) { dl__err(NULL, DL_ERR_ARG, "%s: cap is NULL", op); return false; }
    if (c->magic == DL__CAP_FREED) {
        dl__err(c->ctx, DL_ERR_STALE, "%s: the capture was freed by dl_capture_free()", op);
        return false;
    }
    if (c->magic != DL__CAP_MAGIC) { dl__err(NULL, DL_ERR_ARG, "%s: cap is not a capture", op); return false; }
    return true;
}

/* Stops recording: every device gets its own table and step arena back;
   the capture keeps its arenas (counted in the device's held memory). */
static void dl__cap_stop(dl_capture *c)
{
    dl_ctx *ctx = c->ctx;
    int i;
    ctx->cap = NULL;
    c->draws = ctx->rng_offset - c->rng0;
    for (i = 0; i < c->ndev; i++) {
        dl__capdev *cd = &c->dev[i];
        dl__dev *d = cd->d;
        cd->arena = d->data;
        d->data = cd->saved;
        d->held = d->held - cd->saved.reserved + cd->arena.reserved;
        d->be = cd->be;
        if (cd->impl && !d->be->cap_end(d, cd->impl)) {
            dl__cap_fail(c, DL_ERR_DEVICE, d->errmsg, false);
            d->failed = false;
        }
    }
    c->state = c->err != DL_OK ? DL__CAP_FAILED : DL__CAP_READY;
}

dl_capture *dl_capture_begin(dl_ctx *ctx)
{
    dl_capture *c;
    int i, k = 0;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_capture_begin: ctx is NULL"); return NULL; }
    if (ctx->cap) {
        dl__err(ctx, DL_ERR_ARG, "dl_capture_begin: a capture is already recording (captures do not "
                "nest): end it with dl_capture_end() first");
        return NULL;
    }
    if (ctx->anomaly) {
        dl__err(ctx, DL_ERR_UNSUPPORTED, "dl_capture_begin: anomaly mode (dl_set_anomaly) reads every "
                "op's output back to the host, which a replay cannot; turn it off to capture");
        return NULL;
    }
    if (ctx->ready_fn) {
        dl__err(ctx, DL_ERR_UNSUPPORTED, "dl_capture_begin: a gradient hook (dl_ddp) is installed: "
                "collectives cannot be captured");
        return NULL;
    }
    for (i = 0; i < DL__MAX_CUDA; i++)
        if (ctx->cuda[i] && !ctx->cuda[i]->be->cap_begin) {
            dl__err(ctx, DL_ERR_UNSUPPORTED, "dl_capture_begin: cuda:%d's backend cannot capture", i);
            return NULL;
        }
    c = (dl_capture *)dl__malloc(ctx, sizeof(dl_capture));
    if (!c) goto oom;
    memset(c, 0, sizeof *c);
    c->ndev = ctx->ncpu;
    for (i = 0; i < DL__MAX_CUDA; i++) if (ctx->cuda[i]) c->ndev++;
    c->dev = (dl__capdev *)dl__malloc(ctx, sizeof(dl__capdev) * (size_t)c->ndev);
    if (!c->dev) { DL_FREE(c); goto oom; }
    memset(c->dev, 0, sizeof(dl__capdev) * (size_t)c->ndev);
    c->magic = DL__CAP_MAGIC;
    c->ctx = ctx;
    c->gen = DL__CAP_GEN | ++ctx->capserial;
    c->state = DL__CAP_RECORDING;
    c->rng0 = ctx->rng_offset;
    c->harena.min_chunk = (size_t)64 << 10;
#ifdef DL__HVM
    if (ctx->hreg) c->hreg = dl__hregion_new(ctx, 0, DL__CAP_HREGION);   /* NULL: the arena */
#endif
    for (i = 0; i < ctx->ncpu; i++) c->dev[k++].d = ctx->cpu[i];
    for (i = 0; i < DL__MAX_CUDA; i++) if (ctx->cuda[i]) c->dev[k++].d = ctx->cuda[i];
    for (i = 0; i < c->ndev; i++) {
        dl__capdev *cd = &c->dev[i];
        dl__dev *d = cd->d;
        cd->be = d->be;
        if (d->be->cap_begin && !(cd->impl = d->be->cap_begin(d, c->rng0))) {
            dl_result rc = dl__dev_check(d, "dl_capture_begin");
            c->ndev = i;   /* the devices set up so far go back */
            ctx->cap = c;
            c->next = ctx->caps;
            ctx->caps = c;
            dl__cap_stop(c);
            dl_capture_free(c);
            if (rc == DL_OK) dl__err(ctx, DL_ERR_DEVICE, "dl_capture_begin: %s cannot start a capture",
                                     dl_device_name(d->id));
            return NULL;
        }
        /* the capture's step memory: one chunk the size of the step so far, typically */
        memset(&cd->arena, 0, sizeof cd->arena);
        cd->arena.dev = d;
        cd->arena.min_chunk = d->data.reserved > d->data.min_chunk ? d->data.reserved : d->data.min_chunk;
        cd->saved = d->data;
        d->held += cd->saved.reserved;
        d->data = cd->arena;
        if (!cd->impl) d->be = &dl__cap_backend;
    }
    ctx->cap = c;
    c->next = ctx->caps;
    ctx->caps = c;
    return c;
oom:
    dl__err(ctx, DL_ERR_OOM, "dl_capture_begin: out of host memory");
    return NULL;
}

dl_result dl_capture_end(dl_capture *c)
{
    dl_ctx *ctx;
    int i;
    if (!dl__cap_ok(c, "dl_capture_end")) return DL_ERR_ARG;
    ctx = c->ctx;
    if (c->state != DL__CAP_RECORDING) {
        dl__err(ctx, DL_ERR_ARG, "dl_capture_end: the capture is not recording (it ended already)");
        return DL_ERR_ARG;
    }
    dl__cap_stop(c);
    /* the step has run on the devices dl.h records; the others run it now */
    for (i = 0; i < c->ndev && c->state == DL__CAP_READY; i++) {
        dl__dev *d = c->dev[i].d;
        if (c->dev[i].impl && !d->be->cap_launch(d, c->dev[i].impl, ctx->seed, c->rng0)) {
            dl__cap_fail(c, DL_ERR_DEVICE, d->errmsg, false);
            d->failed = false;
            c->state = DL__CAP_FAILED;
        }
    }
    if (c->state == DL__CAP_READY) return DL_OK;
    /* the failure was reported when it happened; the context shows it again */
    ctx->err = c->err;
    snprintf(ctx->msg, sizeof ctx->msg, "%s", c->msg);
    return c->err;
}

dl_result dl_replay(dl_capture *c)
{
    dl_ctx *ctx;
    int64_t i;
    int k;
    if (!dl__cap_ok(c, "dl_replay")) return c && c->magic == DL__CAP_FREED ? DL_ERR_STALE : DL_ERR_ARG;
    ctx = c->ctx;
    if (ctx->cap) {
        dl__err(ctx, DL_ERR_UNSUPPORTED, "dl_replay: inside a capture (a capture cannot replay another)");
        return DL_ERR_UNSUPPORTED;
    }
    if (c->state != DL__CAP_READY) {
        if (c->state == DL__CAP_RECORDING)
            dl__err(ctx, DL_ERR_ARG, "dl_replay: the capture is still recording: call dl_capture_end() first");
        else
            dl__err(ctx, c->err, "dl_replay: %s%s", c->state == DL__CAP_FAILED ? "the capture failed: " : "",
                    c->msg);
        return ctx->err;
    }
    c->seed = ctx->seed;
    c->rng = ctx->rng_offset;
    ctx->rng_offset += c->draws;
    for (k = 0; k < c->nhook; k++) c->hook[k].fn(c, c->hook[k].owner, c->hook[k].data);
    for (i = 0; i < c->nbump; i++) if (c->bumps[i]) (*dl__ver(c->bumps[i]))++;   /* its in-place writes */
    for (k = 0; k < c->ndev; k++) {
        dl__dev *d = c->dev[k].d;
        if (c->dev[k].impl && !d->be->cap_launch(d, c->dev[k].impl, c->seed, c->rng))
            return dl__dev_check(d, "dl_replay");
    }
    for (i = 0; i < c->nrec; i++)
        if (!dl__rec_run(c, &c->rec[i])) return ctx->err;
    return DL_OK;
}

/* Everything the capture holds goes back; the struct stays as a husk (in
   ctx->dead) so that using it later is an error, not a crash. */
static void dl__cap_release(dl_capture *c)
{
    dl_ctx *ctx = c->ctx;
    dl_capture **pp;
    int i;
    if (c->state == DL__CAP_RECORDING) dl__cap_stop(c);
    for (i = 0; i < c->ndev; i++) {
        dl__capdev *cd = &c->dev[i];
        if (cd->impl) cd->d->be->cap_free(cd->d, cd->impl);
        cd->d->held -= cd->arena.reserved < cd->d->held ? cd->arena.reserved : cd->d->held;
        dl__arena_free(&cd->arena);
    }
    for (i = 0; i < c->nhook; i++) DL_FREE(c->hook[i].data);
    DL_FREE(c->dev);
    DL_FREE(c->rec);
    DL_FREE(c->blob);
    DL_FREE(c->hook);
    DL_FREE(c->uses);
    DL_FREE(c->bumps);
#ifdef DL__HVM
    if (c->hreg) {   /* its headers read as zeros from now on; the addresses stay reserved */
        dl__hregion_release(ctx, c->hreg, c->hreg->rw_hi);
        c->hreg->next = ctx->capreg;
        ctx->capreg = c->hreg;
    }
#endif
    if (c->harena.head) {   /* its headers stay readable (and stale) until dl_ctx_free */
        dl__chunk *ch = c->harena.head;
        while (ch->next) ch = ch->next;
        ch->next = ctx->capgrave.head;
        ctx->capgrave.head = c->harena.head;
    }
    for (pp = &ctx->caps; *pp; pp = &(*pp)->next)
        if (*pp == c) { *pp = c->next; break; }
    {
        uint32_t magic = DL__CAP_FREED;
        dl_capture *dead = ctx->dead;
        memset(c, 0, sizeof *c);
        c->magic = magic;
        c->ctx = ctx;
        c->next = dead;
        ctx->dead = c;
    }
}

void dl_capture_free(dl_capture *c)
{
    if (c && c->magic == DL__CAP_MAGIC) dl__cap_release(c);
}

static void dl__caps_free(dl_ctx *ctx)
{
    while (ctx->cap) dl__cap_release(ctx->cap);
    while (ctx->caps) dl__cap_release(ctx->caps);
    while (ctx->dead) { dl_capture *c = ctx->dead; ctx->dead = c->next; DL_FREE(c); }
#ifdef DL__HVM
    while (ctx->capreg) {
        dl__hregion *r = ctx->capreg;
        ctx->capreg = r->next;
        munmap(r->base, r->size);
        DL_FREE(r);
    }
#endif
    dl__arena_free(&ctx->capgrave);
}

// >>section autograd: recording
/* When grad mode is on and an input requires grad, an op appends a node to
   the context's tape: the op (name + backward rule), its inputs, attributes
   and output. Nodes are numbered in creation order, which is a topological
   order, so backward is a single walk down the tape. */

static bool dl__grad_on(const dl_ctx *ctx) { return ctx->no_grad == 0 && !ctx->backward_nograd; }

/* 1: recorded (*pn set), 0: not needed, -1: out of memory (error recorded). */
static int dl__record(dl_tensor *out, const dl__op *op, int n, dl_tensor *const *in, dl__node **pn)
{
    dl_ctx *ctx = out->ctx_;
    dl__node *node;
    int i;
    bool need = false;
    *pn = NULL;
    if (!dl__grad_on(ctx)) return 0;
    for (i = 0; i < n; i++) if (in[i] && in[i]->requires_grad) need = true;
    if (!need) return 0;
    node = (dl__node *)dl__halloc(ctx, sizeof(dl__node) + sizeof(dl_tensor *) * (size_t)n);
    if (!node) goto oom;
    memset(node, 0, sizeof *node);
    node->op = op;
    node->out = out;
    node->nin = n;
    node->in = (dl_tensor **)(node + 1);
    for (i = 0; i < n; i++) {
        node->in[i] = in[i];
        if (i < 7 && in[i] && ((op->reads | op->cross) >> i & 1)) node->ver[i] = *dl__ver(in[i]);
    }
    if (op->reads & DL__RD_OUT) node->ver[7] = *dl__ver(out);
    if (ctx->ntape == ctx->captape) {
        int64_t cap = ctx->captape ? ctx->captape * 2 : 256;
        dl__node **t = (dl__node **)DL_REALLOC(ctx->tape, sizeof(dl__node *) * (size_t)cap);
        ctx->alloc_calls++;
        if (!t) goto oom;
        ctx->tape = t;
        ctx->captape = cap;
    }
    node->id = ctx->ntape;
    if (ctx->prof) node->pname = dl__prof_top(ctx);
    ctx->tape[ctx->ntape++] = node;
    out->node_ = node;
    out->requires_grad = true;
    *pn = node;
    return 1;
oom:
    dl__err(ctx, DL_ERR_OOM, "%s: out of memory while recording the tape", op->name);
    return -1;
}

/* Last step of every op: a failed backend call, the anomaly check, and the
   end of the op's profiler span (dl__check: all but that, for the node an
   op's helper records inside the op). */
static dl_tensor *dl__check(dl_tensor *out, const char *op)
{
    dl_ctx *ctx;
    int64_t i;
    if (!out) return NULL;
    ctx = out->ctx_;
    if (out->dev_->failed) {   /* a backend call failed: its detail, under the op's name */
        out->dev_->failed = false;
        dl__err(ctx, DL_ERR_DEVICE, "%s: %s", op, out->dev_->errmsg);
        return NULL;
    }
    if (ctx->anomaly && out->dtype == DL_DTYPE_F32) {
        if (dl__cap_refused(ctx, op, "anomaly mode's check of the output (a read to the host)",
                            "turn anomaly mode off while capturing")) return NULL;
        i = DL__BE(out)->nonfinite(out->dev_, (const float *)out->data, out->numel);
        if (i >= 0) {
            float v = dl__host_value_at(out, i);
            dl__err(ctx, DL_ERR_NAN, "anomaly: %s produced %s at element %lld of its output %s%s",
                    op, v != v ? "NaN" : "Inf", (long long)i, dl__sh(out),
                    ctx->in_backward_of ? "" : " (forward)");
            return NULL;
        }
    }
    return out;
}

static dl_tensor *dl__done(dl_tensor *out, const char *op)
{
    if (!dl__check(out, op)) return NULL;
    if (out->ctx_->prof) dl__prof_end(out->ctx_, op, false);
    return out;
}

/* The end of an op whose result another op made (a composite: dl_mean is
   dl_sum then dl_div_scalar), or that returns an input as it is: closes
   the op's profiler span (y NULL: the op failed, the span is dropped). */
static dl_tensor *dl__end(dl_ctx *ctx, dl_tensor *y, const char *op)
{
    if (ctx->prof) {
        if (y) dl__prof_end(ctx, op, false);
        else dl__prof_drop(ctx, op);
    }
    return y;
}

/* dl__end for an op that returns a dl_result (dl_write, dl_fill_, dl_read ...) */
static dl_result dl__end_rc(dl_ctx *ctx, dl_result rc, const char *op)
{
    if (ctx->prof) {
        if (rc == DL_OK) dl__prof_end(ctx, op, false);
        else dl__prof_drop(ctx, op);
    }
    return rc;
}

static bool dl__need(const dl__node *n, int i) { return n->in[i] && n->in[i]->requires_grad; }
static int64_t dl__prod(const int64_t *s, int n) { int64_t p = 1; int i; for (i = 0; i < n; i++) p *= s[i]; return p; }
static void dl__strides(const int64_t *shape, int n, int64_t *st)
{
    int64_t s = 1;
    int i;
    for (i = n - 1; i >= 0; i--) { st[i] = s; s *= shape[i]; }
}
static dl_shape dl__shape_of(const dl_tensor *t) { return dl_shape_make(t->ndim, t->shape); }
static dl_shape dl__dims1(int64_t d) { return dl_shape_make(1, &d); }
static dl_tensor *dl__sum_like(dl_tensor *g, const dl_tensor *x)
{
    return dl_sum_to(g, dl__shape_of(x));
}

// >>section tensors: creation and reading
/* defined with the shape ops below */
static void dl__strides(const int64_t *shape, int n, int64_t *st);
static dl_shape dl__shape_of(const dl_tensor *t);
static dl_tensor *dl__view(const char *name, const dl__op *op, dl_tensor *t, int ndim,
                           const int64_t *shape);
/* (dl__make checks the dim count and every size) */
static dl_tensor *dl__create(dl_ctx *ctx, const char *name, dl_shape shape)
{
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "%s: ctx is NULL", name); return NULL; }
    return dl__new(ctx->defdev, name, shape.ndim, shape.d);
}

dl_tensor *dl_empty(dl_ctx *ctx, dl_shape shape) { return dl__create(ctx, "dl_empty", shape); }

/* a float tensor on d filled with v */
static dl_tensor *dl__filled(dl__dev *d, const char *name, dl_shape shape, float v)
{
    dl_tensor *t = dl__new(d, name, shape.ndim, shape.d);
    if (t) DL__BE(t)->fill(t->dev_, (float *)t->data, t->numel, v);
    return t;
}
#define DL__DEFDEV(ctx, name) \
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "%s: ctx is NULL", name); return NULL; }
dl_tensor *dl_full(dl_ctx *ctx, dl_shape shape, float v) { DL__DEFDEV(ctx, "dl_full") return dl__filled(ctx->defdev, "dl_full", shape, v); }
dl_tensor *dl_zeros(dl_ctx *ctx, dl_shape shape) { DL__DEFDEV(ctx, "dl_zeros") return dl__filled(ctx->defdev, "dl_zeros", shape, 0.0f); }
dl_tensor *dl_ones(dl_ctx *ctx, dl_shape shape) { DL__DEFDEV(ctx, "dl_ones") return dl__filled(ctx->defdev, "dl_ones", shape, 1.0f); }

/* on t's device (not the default one): ops and backward rules use these */
dl_tensor *dl_zeros_like(dl_tensor *t)
{
    if (!t || !dl__live("dl_zeros_like", "t", t)) return NULL;
    return dl__end(t->ctx_, dl__filled(t->dev_, "dl_zeros_like", dl__shape_of(t), 0.0f), "dl_zeros_like");
}
dl_tensor *dl_ones_like(dl_tensor *t)
{
    if (!t || !dl__live("dl_ones_like", "t", t)) return NULL;
    return dl__end(t->ctx_, dl__filled(t->dev_, "dl_ones_like", dl__shape_of(t), 1.0f), "dl_ones_like");
}

dl_tensor *dl_arange(dl_ctx *ctx, double start, double end, double step)
{
    double n;
    int64_t cnt;
    dl_tensor *t;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_arange: ctx is NULL"); return NULL; }
    if (step == 0.0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
        dl__err(ctx, DL_ERR_ARG, "dl_arange: step must be non-zero and the bounds and step finite (start %g, "
                "end %g, step %g)", (double)start, (double)end, (double)step);
        return NULL;
    }
    if (step > 0 ? end < start : end > start) {   /* as PyTorch: an error, not an empty tensor */
        dl__err(ctx, DL_ERR_ARG, "dl_arange: upper bound and lower bound inconsistent with step sign (start %g, "
                "end %g, step %g)", (double)start, (double)end, (double)step);
        return NULL;
    }
    n = ceil((end - start) / step);
    if (n > 1e15) {
        dl__err(ctx, DL_ERR_OOM, "dl_arange: %g elements is too many", n);
        return NULL;
    }
    cnt = (int64_t)n;
    t = dl__new(ctx->defdev, "dl_arange", 1, &cnt);
    if (!t) return NULL;
    DL__BE(t)->arange(t->dev_, (float *)t->data, cnt, start, step);
    return t;
}

/* a counter-based fill of t (uniform [a, b) or normal (a, b)) */
static void dl__fill_rand(dl_tensor *t, int dist, float a, float b)
{
    dl_ctx *ctx = t->ctx_;
    DL__BE(t)->rand(t->dev_, dist, (float *)t->data, t->numel, ctx->seed, dl__rng_take(ctx, t->numel), a, b);
}

dl_tensor *dl_rand(dl_ctx *ctx, dl_shape shape)
{
    dl_tensor *t = dl__create(ctx, "dl_rand", shape);
    if (t) dl__fill_rand(t, DL__RAND_UNIFORM, 0.0f, 1.0f);
    return t;
}

dl_tensor *dl_randn(dl_ctx *ctx, dl_shape shape)
{
    dl_tensor *t = dl__create(ctx, "dl_randn", shape);
    if (t) dl__fill_rand(t, DL__RAND_NORMAL, 0.0f, 1.0f);
    return t;
}

static dl_tensor *dl__from(dl_ctx *ctx, const char *name, dl_dtype dt, dl_shape shape, const void *v)
{
    dl_tensor *t;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "%s: ctx is NULL", name); return NULL; }
    if (!v) { dl__err(ctx, DL_ERR_ARG, "%s: values is NULL", name); return NULL; }
    if (dl__cap_refused(ctx, name, "a copy from the host", "make constants before dl_capture_begin() "
                        "(dl_keep); " DL__CAP_WRITE_HINT)) return NULL;
    t = dl__make(ctx->defdev, name, dt, shape.ndim, shape.d, false, NULL);
    if (t) DL__BE(t)->upload(t->dev_, t->data, v, (size_t)t->numel * dl__esize(dt));
    return t;
}
dl_tensor *dl_from_array(dl_ctx *ctx, dl_shape s, const float *v) { return dl__from(ctx, "dl_from_array", DL_DTYPE_F32, s, v); }
dl_tensor *dl_from_int64(dl_ctx *ctx, dl_shape s, const int64_t *v) { return dl__from(ctx, "dl_from_int64", DL_DTYPE_I64, s, v); }
dl_tensor *dl_from_int32(dl_ctx *ctx, dl_shape s, const int32_t *v) { return dl__from(ctx, "dl_from_int32", DL_DTYPE_I32, s, v); }

/* y = copy(x);  dx = g */
static dl_result dl__copy_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { (void)n; gin[0] = g; return DL_OK; }
static const dl__op dl__op_copy = {"dl_copy", dl__copy_bwd, 0, 0};

static dl_tensor *dl__clone(const char *name, dl_tensor *t, bool persistent)
{
    int64_t st[DL_MAX_DIMS];
    dl_tensor *y = dl__make(t->dev_, name, t->dtype, t->ndim, t->shape, persistent, NULL);
    if (!y) return NULL;
    dl__strides(t->shape, t->ndim, st);
    if (t->numel) DL__BE(t)->copy_nd(t->dev_, dl__esize(t->dtype), t->ndim, t->shape, y->data, st, t->data, st);
    return y;
}

dl_tensor *dl_copy(dl_tensor *t)
{
    dl_tensor *y;
    dl__node *n;
    if (!t || !dl__live("dl_copy", "t", t)) return NULL;
    y = dl__clone("dl_copy", t, false);
    if (!y || dl__record(y, &dl__op_copy, 1, &t, &n) < 0) return NULL;
    return dl__done(y, "dl_copy");
}

dl_tensor *dl_keep(dl_tensor *t)
{
    dl_tensor *y;
    if (!t || !dl__live("dl_keep", "t", t)) return NULL;
    y = dl__clone("dl_keep", t, true);
    if (!y) return NULL;
    memcpy(y->name, t->name, sizeof y->name);
    y->requires_grad = t->requires_grad && !t->node_;   /* a leaf's flag is kept */
    return dl__end(t->ctx_, y, "dl_keep");
}

dl_tensor *dl_param(dl_tensor *t)
{
    dl_tensor *y = dl_keep(t);
    if (y && !dl_requires_grad(y, true)) { dl_free(y); return NULL; }
    return y;
}

/* A tensor that may be written in place: live, not in a graph, and not a
   leaf that requires grad while grad mode is on. */
static bool dl__writable(const char *op, dl_tensor *t)
{
    if (!dl__live(op, "t", t)) return false;
    if (t->node_) {
        dl__err(t->ctx_, DL_ERR_GRAPH, "%s: t %s is the output of %s in the recorded graph; writing "
                "into it would change what its backward uses (write into a dl_detach()ed copy)",
                op, dl__sh(t), t->node_->op->name);
        return false;
    }
    if (t->requires_grad && dl__grad_on(t->ctx_)) {
        dl__err(t->ctx_, DL_ERR_GRAPH, "%s: t %s is a leaf that requires grad; write into it inside "
                "dl_no_grad_begin()/dl_no_grad_end() (as torch.no_grad())", op, dl__sh(t));
        return false;
    }
    if (t->vbase_ && t->vbase_->requires_grad && !t->vbase_->node_ && !t->detached_ && dl__grad_on(t->ctx_)) {
        dl__err(t->ctx_, DL_ERR_GRAPH, "%s: t %s is a view, made under no_grad, of a leaf %s that requires "
                "grad; write into it inside dl_no_grad_begin()/dl_no_grad_end() too (or into a "
                "dl_detach() of the leaf)", op, dl__sh(t), dl__sh(t->vbase_));
        return false;
    }
    return true;
}

dl_result dl_write(dl_tensor *t, const float *src, int64_t n)
{
    if (!t) return DL_ERR_ARG;
    if (!dl__writable("dl_write", t)) return t->magic_ == DL__MAGIC ? t->ctx_->err : DL_ERR_ARG;
    if (dl__cap_refused(t->ctx_, "dl_write", "a copy from the host", DL__CAP_WRITE_HINT)) return DL_ERR_UNSUPPORTED;
    if (!dl__f32("dl_write", "t", t)) return DL_ERR_DTYPE;
    if (!src || n != t->numel) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_write: t %s has %lld elements but src holds %lld%s",
                dl__sh(t), (long long)t->numel, (long long)n, src ? "" : " (src is NULL)");
        return DL_ERR_ARG;
    }
    DL__BE(t)->upload(t->dev_, t->data, src, sizeof(float) * (size_t)n);
    dl__bump_version(t);
    return dl__end_rc(t->ctx_, dl__dev_check(t->dev_, "dl_write"), "dl_write");
}

dl_result dl_fill_(dl_tensor *t, float v)
{
    if (!t) return DL_ERR_ARG;
    if (!dl__writable("dl_fill_", t)) return t->magic_ == DL__MAGIC ? t->ctx_->err : DL_ERR_ARG;
    if (!dl__f32("dl_fill_", "t", t)) return DL_ERR_DTYPE;
    DL__BE(t)->fill(t->dev_, (float *)t->data, t->numel, v);
    dl__bump_version(t);
    return dl__end_rc(t->ctx_, DL_OK, "dl_fill_");
}

dl_result dl_copy_(dl_tensor *dst, dl_tensor *src)
{
    static const char *op = "dl_copy_";
    int64_t ds[DL_MAX_DIMS], ss[DL_MAX_DIMS], st[DL_MAX_DIMS];
    int d;
    if (!dst || !src) return DL_ERR_ARG;
    if (!dl__writable(op, dst)) return dst->magic_ == DL__MAGIC ? dst->ctx_->err : DL_ERR_ARG;
    if (!dl__live(op, "src", src) || !dl__pair(op, dst, src)) return dst->ctx_->err;
    if (src->requires_grad && src != dst && dl__grad_on(dst->ctx_)) {
        /* torch's copy_ would record it; here the copy is not on the tape,
           and a gradient through dst would be lost without a word */
        dl__err(dst->ctx_, DL_ERR_GRAPH, "%s: src %s requires grad, and an in-place copy is not "
                "differentiable here: use y = dl_copy(src) (differentiable), or copy dl_detach(src) "
                "or inside dl_no_grad_begin() for a plain copy", op, dl__sh(src));
        return DL_ERR_GRAPH;
    }
    if (src->dtype != dst->dtype) {
        dl__err(dst->ctx_, DL_ERR_DTYPE, "%s: dst %s is %s but src %s is %s", op, dl__sh(dst),
                dl__dtype_str(dst->dtype), dl__sh(src), dl__dtype_str(src->dtype));
        return DL_ERR_DTYPE;
    }
    if (src->ndim > dst->ndim) goto bad;
    dl__strides(src->shape, src->ndim, st);
    for (d = 0; d < dst->ndim; d++) {
        int is = d - (dst->ndim - src->ndim);
        int64_t sd = is >= 0 ? src->shape[is] : 1;
        if (sd != dst->shape[d] && sd != 1) goto bad;
        ss[d] = (is >= 0 && sd != 1) ? st[is] : 0;
    }
    dl__bump_version(dst);      /* torch bumps it for a self-copy too */
    if (src == dst || dst->numel == 0) return dl__end_rc(dst->ctx_, DL_OK, op);
    dl__strides(dst->shape, dst->ndim, ds);
    DL__BE(dst)->copy_nd(dst->dev_, dl__esize(dst->dtype), dst->ndim, dst->shape, dst->data, ds,
                        src->data, ss);
    return dl__end_rc(dst->ctx_, DL_OK, op);
bad:
    dl__err(dst->ctx_, DL_ERR_SHAPE, "%s: src %s does not broadcast to dst %s (sizes must match or be "
            "1, aligned from the right)", op, dl__sh(src), dl__sh(dst));
    return DL_ERR_SHAPE;
}

void dl_free(dl_tensor *t)
{
    if (!t) return;
    if (t->magic_ != DL__MAGIC) { (void)dl__valid("dl_free", "t", t); return; }   /* reports a double free in DL_DEBUG */
    if (t->step_ != 0) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_free: t %s is a step tensor; dl_step_end() releases it", dl__sh(t));
        return;
    }
    if (t->grad && t->grad->step_ == 0) dl__persist_release(t->grad);
    dl__persist_release(t);
}

/* Copies src's data into dst (same dtype and numel) across devices: one
   backend's peer copy, a direct upload or download when one side is host
   memory, else through a host buffer. */
static bool dl__copy_across(dl_tensor *dst, dl_tensor *src)
{
    size_t bytes = (size_t)src->numel * dl__esize(src->dtype);
    dl__dev *dd = dst->dev_, *sd = src->dev_;
    if (!bytes) return true;
    if (dd->be == sd->be) dd->be->peer(dd, dst->data, sd, src->data, bytes);
    else if (dl__host_ok(dst)) sd->be->download(sd, dst->data, src->data, bytes);
    else if (dl__host_ok(src)) dd->be->upload(dd, dst->data, src->data, bytes);
    else {
        void *h = DL_MALLOC(bytes);
        if (!h) {
            dl__err(src->ctx_, DL_ERR_OOM, "dl_to: no host memory for a %zu-byte staging buffer", bytes);
            return false;
        }
        sd->be->download(sd, h, src->data, bytes);
        dd->be->upload(dd, dst->data, h, bytes);
        DL_FREE(h);
    }
    return dl__dev_check(dd, "dl_to") == DL_OK && dl__dev_check(sd, "dl_to") == DL_OK;
}

/* y = to(x, dev);  dx = to(g, x's device) */
static dl_result dl__to_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl_to(g, n->in[0]->device);
    return DL_OK;
}
static const dl__op dl__op_to = {"dl_to", dl__to_bwd, 0, 0};

dl_tensor *dl_to(dl_tensor *t, dl_device dev)
{
    dl__dev *d;
    dl_tensor *y;
    dl__node *n;
    if (!t || !dl__live("dl_to", "t", t)) return NULL;
    d = dl__device(t->ctx_, dev, "dl_to");
    if (!d) return NULL;
    if (d == t->dev_) return dl__end(t->ctx_, t, "dl_to");
    if ((d->id.type != DL_DEVICE_CPU || t->device.type != DL_DEVICE_CPU) &&
        dl__cap_refused(t->ctx_, "dl_to", "a copy between the host and a GPU, or between GPUs",
                        "a capture records the work of each GPU on its own; copy outside it"))
        return dl__end(t->ctx_, NULL, "dl_to");
    y = dl__make(d, "dl_to", t->dtype, t->ndim, t->shape, false, NULL);
    if (!y || !dl__copy_across(y, t)) return NULL;
    if (dl__record(y, &dl__op_to, 1, &t, &n) < 0) return NULL;
    return dl__done(y, "dl_to");
}

/* Moves a persistent tensor's storage to d in place (the header, its
   name and every pointer to it stay valid); its grad goes along. */
static bool dl__move(dl_tensor *t, dl__dev *d)
{
    dl__dev *od = t->dev_;
    size_t bytes = (size_t)t->numel * dl__esize(t->dtype);
    void *p;
    dl_tensor tmp;
    dl__dfree *old;
    if (od == d) return true;
    if (!t->owns_ || t->step_ != 0) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_module_to: %s %s does not own its storage", t->name, dl__sh(t));
        return false;
    }
    if (t->ctx_->cap && !dl__cap_persistent(t->ctx_, "dl_module_to")) return false;
    old = (dl__dfree *)DL_MALLOC(sizeof *old);
    if (!old || !dl__dev_limit_ok(d, bytes + sizeof(dl_tensor)) || !(p = dl__dev_alloc(d, bytes))) {
        DL_FREE(old);
        dl__err(t->ctx_, DL_ERR_OOM, "dl_module_to: cannot allocate %zu bytes on %s for %s %s", bytes,
                dl_device_name(d->id), t->name[0] ? t->name : "a gradient", dl__sh(t));
        return false;
    }
    tmp = *t;
    tmp.data = p;
    tmp.dev_ = d;
    tmp.device = d->id;
    if (!dl__copy_across(&tmp, t)) { d->be->free(d, p); DL_FREE(old); return false; }
    if (t->ctx_->caps) dl__cap_forget(t, "moved to another device by dl_module_to");
    old->t = t;
    old->d = od;                     /* views and this step's tape may still read the old storage */
    old->p = t->data;
    old->next = t->ctx_->dfree;
    t->ctx_->dfree = old;
    dl__bump_version(t);             /* a backward that reads t refuses (it moved under the graph) */
    od->persistent_bytes -= bytes + sizeof(dl_tensor) < od->persistent_bytes ? bytes + sizeof(dl_tensor) : od->persistent_bytes;
    d->persistent_bytes += bytes + sizeof(dl_tensor);
    dl__track_peak(d);
    t->data = p;
    t->dev_ = d;
    t->device = d->id;
    if (t->grad && t->grad->step_ == 0 && !dl__move(t->grad, d)) return false;
    return true;
}

/* Undoes the dl__moves since the deferred-free list was `mark`: each
   tensor back on its old storage (untouched since), the new freed now. */
static void dl__move_undo(dl_ctx *ctx, dl__dfree *mark)
{
    while (ctx->dfree && ctx->dfree != mark) {
        dl__dfree *f = ctx->dfree;
        dl_tensor *t = f->t;
        size_t bytes = (size_t)t->numel * dl__esize(t->dtype) + sizeof(dl_tensor);
        ctx->dfree = f->next;
        t->dev_->be->free(t->dev_, t->data);
        t->dev_->persistent_bytes -= bytes < t->dev_->persistent_bytes ? bytes : t->dev_->persistent_bytes;
        f->d->persistent_bytes += bytes;
        t->data = f->p;
        t->dev_ = f->d;
        t->device = f->d->id;
        DL_FREE(f);
    }
}

dl_tensor *dl_set_name(dl_tensor *t, const char *name)
{
    if (!t || t->magic_ != DL__MAGIC) return t;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
    return t;
}

/* Host code reads and writes device data only through the backend: these
   are the transfer points (dl_read, dl_item, dl_write, dl_print; dl_to,
   checkpoints and the loader elsewhere). A tensor whose data is host memory
   (cpu:0, and non-strict virtual CPU devices) may also be read in place. */

float dl_item(dl_tensor *t)
{
    float v;
    if (!t || !dl__live("dl_item", "t", t) || !dl__f32("dl_item", "t", t)) return NAN;
    if (dl__cap_refused(t->ctx_, "dl_item", "a read to the host", DL__CAP_READ_HINT)) return NAN;
    if (t->numel != 1) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "dl_item: t %s has %lld elements; dl_item needs exactly 1",
                dl__sh(t), (long long)t->numel);
        return NAN;
    }
    DL__BE(t)->download(t->dev_, &v, t->data, sizeof v);
    return dl__end_rc(t->ctx_, dl__dev_check(t->dev_, "dl_item"), "dl_item") == DL_OK ? v : NAN;
}

/* the first float of a tensor, read to the host (a device tensor waits for its stream) */
static float dl__host_value(dl_tensor *t) { return dl__host_value_at(t, 0); }

dl_result dl_read(dl_tensor *t, float *dst, int64_t n)
{
    if (!t) return DL_ERR_ARG;
    if (!dl__live("dl_read", "t", t)) return t->magic_ == DL__MAGIC ? t->ctx_->err : DL_ERR_ARG;
    if (dl__cap_refused(t->ctx_, "dl_read", "a read to the host", DL__CAP_READ_HINT)) return DL_ERR_UNSUPPORTED;
    if (!dl__f32("dl_read", "t", t)) return DL_ERR_DTYPE;
    if (!dst || n != t->numel) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_read: t %s has %lld elements but dst holds %lld%s",
                dl__sh(t), (long long)t->numel, (long long)n, dst ? "" : " (dst is NULL)");
        return DL_ERR_ARG;
    }
    DL__BE(t)->download(t->dev_, dst, t->data, sizeof(float) * (size_t)n);
    return dl__end_rc(t->ctx_, dl__dev_check(t->dev_, "dl_read"), "dl_read");
}

dl_result dl_read_int64(dl_tensor *t, int64_t *dst, int64_t n)
{
    int64_t i;
    if (!t) return DL_ERR_ARG;
    if (!dl__live("dl_read_int64", "t", t)) return t->magic_ == DL__MAGIC ? t->ctx_->err : DL_ERR_ARG;
    if (dl__cap_refused(t->ctx_, "dl_read_int64", "a read to the host", DL__CAP_READ_HINT))
        return DL_ERR_UNSUPPORTED;
    if (!dst || n != t->numel) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_read_int64: t %s has %lld elements but dst holds %lld",
                dl__sh(t), (long long)t->numel, (long long)n);
        return DL_ERR_ARG;
    }
    if (t->dtype == DL_DTYPE_I64) {
        DL__BE(t)->download(t->dev_, dst, t->data, sizeof(int64_t) * (size_t)n);
        return dl__end_rc(t->ctx_, dl__dev_check(t->dev_, "dl_read_int64"), "dl_read_int64");
    }
    /* 4-byte values: into the second half of dst, then widened in place, front to back */
    if (n) DL__BE(t)->download(t->dev_, (char *)(dst + n) - 4 * n, t->data, 4 * (size_t)n);
    for (i = 0; i < n; i++) {
        char *src = (char *)(dst + n) - 4 * n + 4 * i;
        if (t->dtype == DL_DTYPE_I32) { int32_t v; memcpy(&v, src, 4); dst[i] = v; }
        else { float v; memcpy(&v, src, 4); dst[i] = (int64_t)v; }
    }
    return dl__end_rc(t->ctx_, dl__dev_check(t->dev_, "dl_read_int64"), "dl_read_int64");
}

float *dl_data(dl_tensor *t)
{
    char b[32];
    if (!t || !dl__valid("dl_data", "t", t) || !dl__f32("dl_data", "t", t)) return NULL;
    if (dl__cap_refused(t->ctx_, "dl_data", "host access to tensor data", DL__CAP_READ_HINT)) return NULL;
    if (!dl__host_ok(t)) {
        dl__err(t->ctx_, DL_ERR_DEVICE, "dl_data: t %s is on %s, whose memory the host cannot "
                "address; read it with dl_read() or copy it with dl_to(t, dl_cpu())", dl__sh(t),
                dl__dev_str(t->device, b, sizeof b));
        return NULL;
    }
    return (float *)t->data;
}

int64_t dl_size(const dl_tensor *t, int dim)
{
    if (!t || t->magic_ != DL__MAGIC) return -1;
    if (!dl__dim("dl_size", t, &dim, t->ndim)) return -1;
    return t->shape[dim];
}

bool dl_same_shape(const dl_tensor *a, const dl_tensor *b)
{
    if (!a || !b || a->ndim != b->ndim) return false;
    return a->ndim == 0 || memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

void dl_print(dl_tensor *t)
{
    int64_t i, n;
    unsigned char buf[64 * 8];
    if (!t || !dl__valid("dl_print", "t", t) ||
        dl__cap_refused(t->ctx_, "dl_print", "a read to the host", DL__CAP_READ_HINT)) {
        printf("tensor(NULL)\n");
        return;
    }
    n = t->numel < 64 ? t->numel : 64;
    DL__BE(t)->download(t->dev_, buf, t->data, (size_t)n * dl__esize(t->dtype));
    printf("tensor%s %s%s [", dl__sh(t), dl__dtype_str(t->dtype), t->requires_grad ? " requires_grad" : "");
    for (i = 0; i < n; i++) {
        if (t->dtype == DL_DTYPE_F32) { float v; memcpy(&v, buf + 4 * i, 4); printf(i ? ", %.6g" : "%.6g", (double)v); }
        else if (t->dtype == DL_DTYPE_I64) { int64_t v; memcpy(&v, buf + 8 * i, 8); printf(i ? ", %lld" : "%lld", (long long)v); }
        else { int32_t v; memcpy(&v, buf + 4 * i, 4); printf(i ? ", %d" : "%d", (int)v); }
    }
    printf("%s]\n", t->numel > 64 ? ", ..." : "");
}

// >>section autograd: backward
/* dl_backward seeds the output's node with a gradient and walks the tape
   from that node down to 0. A node with an accumulated gradient runs its
   backward rule; the results go to the input's producing node (accumulated
   with dl_add) or, for leaves, into ->grad. Without create_graph the rules run
   with grad mode off; with it, they record onto the tape like any forward. */

dl_tensor *dl_requires_grad(dl_tensor *t, bool on)
{
    if (!t || !dl__valid("dl_requires_grad", "t", t)) return NULL;
    if (t->node_) {
        dl__err(t->ctx_, DL_ERR_GRAPH, "dl_requires_grad: t %s is the output of %s, not a leaf; "
                "use dl_detach() to make a leaf", dl__sh(t), t->node_->op->name);
        return NULL;
    }
    if (on && t->dtype != DL_DTYPE_F32) {
        dl__err(t->ctx_, DL_ERR_DTYPE, "dl_requires_grad: t %s has dtype %s; only float32 tensors "
                "can require grad", dl__sh(t), dl__dtype_str(t->dtype));
        return NULL;
    }
    t->requires_grad = on;
    return t;
}

void dl_no_grad_begin(dl_ctx *ctx) { if (ctx) ctx->no_grad++; }
void dl_no_grad_end(dl_ctx *ctx) { if (ctx && ctx->no_grad > 0) ctx->no_grad--; }
bool dl_is_grad_enabled(const dl_ctx *ctx) { return ctx && dl__grad_on(ctx); }

dl_tensor *dl_detach(dl_tensor *t)
{
    dl_tensor *y;
    if (!t || !dl__live("dl_detach", "t", t)) return NULL;
    y = dl__view("dl_detach", NULL, t, t->ndim, t->shape);
    if (y) y->detached_ = true;
    return dl__end(t->ctx_, y, "dl_detach");
}

/* Multi-tensor updates (dl__backend.mt_apply). dl__mt_off: every update a
   call per tensor (a test's switch: both ways give the same bits). */
static bool dl__mt_off;

/* d's cache slot in s (NULL: d has no mt_apply, or s holds DL__MT_DEVS devices) */
static void **dl__mt_slot(dl__mtset *s, dl__dev *d)
{
    int i;
    if (!d->be->mt_apply || dl__mt_off) return NULL;
    for (i = 0; i < DL__MT_DEVS; i++) {
        if (s->dev[i] == d) return &s->cache[i];
        if (!s->dev[i]) { s->dev[i] = d; return &s->cache[i]; }
    }
    return NULL;
}

static void dl__mt_free(dl__mtset *s)
{
    int i;
    for (i = 0; i < DL__MT_DEVS && s->dev[i]; i++) s->dev[i]->be->mt_free(s->dev[i], s->cache[i]);
    DL_FREE(s->ents);
    memset(s, 0, sizeof *s);
}

/* room for n entries in s->ents (grown once: a steady loop does not allocate) */
static bool dl__mt_room(dl_ctx *ctx, dl__mtset *s, int n)
{
    dl__mtent *e;
    if (n <= s->cap) return true;
    e = (dl__mtent *)dl__malloc(ctx, sizeof(dl__mtent) * (size_t)n);
    if (!e) return false;
    DL_FREE(s->ents);
    s->ents = e;
    s->cap = n;
    return true;
}

/* s ready for the list ts[0..n) (an optimizer's parameters): its scratch,
   and on each device whose backend has mt_apply a cache with room for the
   device's tensors and argbytes of arguments, so that no step allocates.
   false (with the device's error under op's name) on failure. */
static bool dl__mt_reserve(dl_ctx *ctx, const char *op, dl__mtset *s, int n, dl_tensor *const *ts, size_t argbytes)
{
    int i, j, k;
    if (!dl__mt_room(ctx, s, n)) { dl__err(ctx, DL_ERR_OOM, "%s: out of memory", op); return false; }
    for (i = 0; i < n; i++) {
        dl__dev *d = ts[i]->dev_;
        void **slot = dl__mt_slot(s, d);
        if (!slot || *slot) continue;
        for (k = 0, j = 0; j < n; j++) k += ts[j]->dev_ == d;
        d->be->mt_apply(d, slot, 0, k, NULL, NULL, argbytes);
        if (dl__dev_check(d, op) != DL_OK) return false;
    }
    return true;
}

/* How a tensor of a list on device d goes, its list walked in order with
   done[ndone] the devices launched so far: DL__MT_LAUNCH (the first on d:
   launch d's update of the whole list now, through *slot), DL__MT_DONE
   (d's launch has it), DL__MT_EACH (no multi-tensor update on d: a call of
   its own). */
enum { DL__MT_LAUNCH, DL__MT_DONE, DL__MT_EACH };
static int dl__mt_route(dl_ctx *ctx, dl__mtset *s, int n, dl__dev *d, dl__dev **done, int *ndone, void ***slot)
{
    int j;
    for (j = 0; j < *ndone; j++) if (done[j] == d) return DL__MT_DONE;
    *slot = dl__mt_slot(s, d);
    if (!*slot || !dl__mt_room(ctx, s, n)) return DL__MT_EACH;
    done[(*ndone)++] = d;
    return DL__MT_LAUNCH;
}

/* One device's multi-tensor update (kind) of those of ts[0..n) on it that
   want it (with a gradient; p: the tensor itself for ZERO's gradients, or
   the parameter): one launch. */
static void dl__mt_run(dl__mtset *s, void **slot, dl__dev *d, int kind, int n, dl_tensor *const *ts,
                       dl_tensor **const *state, const void *args, size_t argbytes)
{
    int i, k = 0;
    for (i = 0; i < n; i++) {
        dl_tensor *t = ts[i];
        dl__mtent *e;
        if (!t || !t->grad || t->dev_ != d) continue;
        e = &s->ents[k++];
        memset(e, 0, sizeof *e);
        e->p = (float *)(kind == DL__MT_ZERO ? t->grad->data : t->data);
        e->g = (const float *)t->grad->data;
        e->s0 = state && state[0] ? (float *)state[0][i]->data : NULL;
        e->s1 = state && state[1] ? (float *)state[1][i]->data : NULL;
        e->s2 = state && state[2] ? (float *)state[2][i]->data : NULL;
        e->n = t->numel;
        e->arg = i;
    }
    if (k) d->be->mt_apply(d, slot, kind, k, s->ents, args, argbytes);
}

/* every ts[i]->grad = 0 (those with one): a launch per device whose backend
   has mt_apply (the first call builds its list), a fill per tensor
   elsewhere (the CPU's) */
static void dl__zero_grads(dl_ctx *ctx, dl__mtset *s, int n, dl_tensor *const *ts)
{
    dl__dev *done[DL__MT_DEVS];
    void **slot = NULL;
    int i, ndone = 0, how;
    for (i = 0; i < n; i++) {
        dl_tensor *t = ts[i];
        if (!t || t->magic_ != DL__MAGIC || !t->grad) continue;
        dl__cap_use(t->grad);
        how = dl__mt_route(ctx, s, n, t->dev_, done, &ndone, &slot);
        if (how == DL__MT_EACH) { dl_zero_grad(t); continue; }
        if (how == DL__MT_LAUNCH) dl__mt_run(s, slot, t->dev_, DL__MT_ZERO, n, ts, NULL, NULL, 0);
        dl__bump_version(t->grad);   /* as dl_zero_grad does */
    }
}

void dl_zero_grad(dl_tensor *t)
{
    if (!t || t->magic_ != DL__MAGIC || !t->grad) return;
    if (t->ctx_->cap) dl__cap_use(t->grad);
    DL__BE(t->grad)->fill(t->grad->dev_, (float *)t->grad->data, t->grad->numel, 0.0f);
    dl__bump_version(t->grad);
}

void dl_sgd_update(dl_tensor *p, float lr)
{
    if (!p || !dl__live("dl_sgd_update", "p", p)) return;
    if (p->grad) {
        dl__cap_use(p->grad);
        DL__BE(p)->axpy(p->dev_, (float *)p->data, (const float *)p->grad->data, p->numel, -lr);
        dl__bump_version(p);
        dl_zero_grad(p);
    }
    dl__end(p->ctx_, p, "dl_sgd_update");
}

/* Gradients made inside a backward (without create_graph) are given back
   to their device's step arena as soon as no gradient slot holds them, so a
   step's peak memory holds the live gradients, not all of them. gref_ counts
   the slots (a node's gacc, a dl_grad result); a tensor that another shares
   (a view) or that is no temporary of the backward is never given back. */
static void dl__grad_release(dl_tensor *t)
{
    if (!t || !t->bwd_tmp_ || !t->sdata_ || t->viewed_ || --t->gref_ > 0) return;
    if (t->ctx_->cap ? t->step_ != dl__cap_gen(t->ctx_) : t->step_ != t->ctx_->step)
        return;   /* a capture's tensor outside it (or the reverse): not this arena's block */
    t->sdata_ = false;     /* the block may now hold another tensor */
    dl__arena_give(&t->dev_->data, t->data, (size_t)t->numel * dl__esize(t->dtype));
}

/* Accumulate g into leaf x's gradient. Persistent leaves keep a persistent
   ->grad updated in place; step leaves a step one (with history under
   create_graph, so it can be differentiated again). */
static bool dl__acc_leaf(dl_tensor *x, dl_tensor *g, bool create_graph)
{
    if (create_graph && x->step_ != 0) {
        /* a new tensor either way: g may be another leaf's gradient too (dl_sum_to
           passes its argument through), and every leaf owns its grad */
        x->grad = x->grad ? dl_add(x->grad, g) : dl_copy(g);
        return x->grad != NULL;
    }
    if (!x->grad) {
        x->grad = dl__make(x->dev_, "dl_backward", DL_DTYPE_F32, x->ndim, x->shape, x->step_ == 0, NULL);
        if (!x->grad) return false;
        DL__BE(x)->fill(x->dev_, (float *)x->grad->data, x->numel, 0.0f);
    }
    if (x->ctx_->cap) dl__cap_use(x->grad);
    DL__BE(x)->axpy(x->dev_, (float *)x->grad->data, (const float *)g->data, x->numel, 1.0f);
    dl__bump_version(x->grad);
    return true;
}

/* A backward's leaf gradients on a device whose backend has axpy_multi
   (CUDA's): queued, then added by one launch per DL__AXM of them (at the
   end of the backward, or sooner: another device, a full queue, a leaf met
   twice), instead of a launch each; the same sums. A queued gradient is held
   (gref_) until its launch, so its memory is not handed on before. Not
   used with create_graph, a ready hook (it reads ->grad as each completes),
   a custom function's gradients, a leaf's first gradient (->grad made) or
   dl__mt_off (a test's switch). */
typedef struct dl__accq {
    dl__dev *d;
    int n;
    float *y[DL__AXM];
    const float *x[DL__AXM];
    int64_t len[DL__AXM];
    dl_tensor *g[DL__AXM];
} dl__accq;

static void dl__accq_flush(dl_ctx *ctx, dl__accq *q)
{
    int k;
    if (!q->n) return;
    if (ctx->prof) dl__prof_begin(ctx, q->d, "accumulate grad", false);
    q->d->be->axpy_multi(q->d, q->n, q->y, q->x, q->len);
    if (ctx->prof) dl__prof_end(ctx, "accumulate grad", false);
    for (k = 0; k < q->n; k++) dl__grad_release(q->g[k]);
    q->n = 0;
}

/* true: x->grad += g is queued (else the caller adds it now) */
static bool dl__accq_put(dl__accq *q, dl_tensor *x, dl_tensor *g)
{
    int k;
    if (!x->grad || !x->dev_->be->axpy_multi || dl__mt_off || x->ctx_->ready_fn) return false;
    if (q->n && (q->d != x->dev_ || q->n == DL__AXM)) dl__accq_flush(x->ctx_, q);
    for (k = 0; k < q->n; k++)
        if (q->y[k] == (float *)x->grad->data) { dl__accq_flush(x->ctx_, q); break; }
    if (x->ctx_->cap) dl__cap_use(x->grad);
    q->d = x->dev_;
    q->y[q->n] = (float *)x->grad->data;
    q->x[q->n] = (const float *)g->data;
    q->len[q->n] = x->numel;
    q->g[q->n] = g;
    q->n++;
    g->gref_++;
    dl__bump_version(x->grad);
    return true;
}

/* With a ready hook: how many gradients each leaf will receive from the
   nodes this backward runs (those reachable from the top; the stamp of
   ctx->visit marks them), so that the hook fires at the last one. */
static void dl__ready_count(dl_ctx *ctx, int64_t top)
{
    int64_t i;
    int j, pass;
    ctx->visit++;
    ctx->tape[top]->visit = ctx->visit;
    for (pass = 0; pass < 2; pass++)       /* 0: clear the leaves' counts, 1: count */
        for (i = top; i >= 0; i--) {
            dl__node *n = ctx->tape[i];
            if (n->visit != ctx->visit || n->released) continue;
            for (j = 0; j < n->nin; j++) {
                dl_tensor *x = n->in[j];
                if (!x || !x->requires_grad) continue;
                if (x->node_) x->node_->visit = ctx->visit;
                else x->pend_ = pass ? x->pend_ + 1 : 0;
            }
        }
}

/* A custom function's gradient gj for input j of node n, checked as PyTorch
   checks a Function's results: on the input's device (else DL_ERR_DEVICE
   naming both), an int32/int64 gradient cast to float32 by value (PyTorch
   casts to the input's dtype). NULL + error when refused. */
static dl_tensor *dl__fn_grad(const char *name, dl__node *n, int j, dl_tensor *gj)
{
    dl_tensor *x = n->in[j], *y;
    int64_t *v, i;
    float *f;
    if (gj->dev_ != x->dev_) {
        dl__err(x->ctx_, DL_ERR_DEVICE, "%s: the gradient for input %d %s is on %s but the input is on "
                "%s (a backward must return each gradient on its input's device; move it with dl_to())",
                name, j, dl__sh(gj), dl_device_name(gj->device), dl_device_name(x->device));
        return NULL;
    }
    if (gj->dtype == DL_DTYPE_F32) return gj;
    y = dl__make(x->dev_, name, DL_DTYPE_F32, gj->ndim, gj->shape, false, NULL);
    v = (int64_t *)DL_MALLOC(sizeof(int64_t) * (size_t)(gj->numel + 1));
    if (!y || !v) {
        DL_FREE(v);
        if (y) dl__err(x->ctx_, DL_ERR_OOM, "%s: out of memory casting the %s gradient for input %d to float32",
                       name, dl__dtype_str(gj->dtype), j);
        return NULL;
    }
    if (dl_read_int64(gj, v, gj->numel) != DL_OK) { DL_FREE(v); return NULL; }
    f = (float *)v;                       /* narrowed in place, front to back */
    for (i = 0; i < gj->numel; i++) f[i] = (float)v[i];
    DL__BE(y)->upload(y->dev_, y->data, f, sizeof(float) * (size_t)gj->numel);
    DL_FREE(v);
    return dl__dev_check(y->dev_, name) == DL_OK ? y : NULL;
}

/* Node n's backward is about to read what it saved: the inputs (and
   output) its rule reads, a custom function's dl_fn_save tensors. Each must
   be at the version it had at record, as PyTorch checks a saved variable. */
static dl_result dl__saved_ok(const char *name, dl__node *n)
{
    int i, j, m = n->fn ? n->nsaved : 8;
    for (i = 0; i < m; i++) {
        dl_tensor *t;
        char what[40], nm[40];
        if (n->fn) {
            t = n->saved[i];
            snprintf(what, sizeof what, "saved tensor %d", i);
        } else if (i == 7) {
            t = n->op->reads & DL__RD_OUT ? n->out : NULL;
            snprintf(what, sizeof what, "the output");
        } else {
            bool rd = i < n->nin && (n->op->reads >> i & 1);
            if (!rd && i < n->nin && (n->op->cross >> i & 1))
                for (j = 0; j < n->nin; j++) if (j != i && dl__need(n, j)) rd = true;
            t = rd ? n->in[i] : NULL;
            snprintf(what, sizeof what, "input %d", i);
        }
        if (!t || t->magic_ != DL__MAGIC || *dl__ver(t) == n->ver[i]) continue;
        nm[0] = 0;
        if (t->name[0]) snprintf(nm, sizeof nm, " '%.31s'", t->name);
        dl__err(t->ctx_, DL_ERR_GRAPH, "%s: one of the variables needed for gradient computation has "
                "been modified by an inplace operation: [%s %s%s, %s] is at version %u; expected "
                "version %u instead (%s of the op; it was written after the forward, by dl_write, "
                "dl_fill_, dl_copy_, an optimizer step, dl_load ...: write into a dl_copy() of it, "
                "or run the backward first)", name, dl__dtype_str(t->dtype), dl__sh(t), nm,
                dl_device_name(t->device), (unsigned)*dl__ver(t), (unsigned)n->ver[i], what);
        return DL_ERR_GRAPH;
    }
    return DL_OK;
}

static dl_result dl__cls_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin);

static dl_result dl__run_backward(const char *name, dl_tensor *out, const dl_backward_desc *desc,
                                  int nt, dl_tensor *const *targets, dl_tensor **results)
{
    dl_ctx *ctx;
    dl_tensor *seed = NULL;
    bool retain, create, unfilled = false;
    int64_t i, top;
    int j;
    dl_result rc = DL_OK;
    bool saved_bng;
    const char *pname;
    dl__accq q;
    q.n = 0;
    q.d = NULL;
    if (!out) return DL_ERR_ARG;
    if (!dl__valid(name, "out", out)) return out->magic_ == DL__MAGIC ? out->ctx_->err : DL_ERR_ARG;
    ctx = out->ctx_;
    create = desc && desc->create_graph;
    retain = create || (desc && desc->retain_graph);
    if (!out->requires_grad) {
        dl__err(ctx, DL_ERR_GRAPH, "%s: out %s does not require grad: no input was marked with "
                "dl_requires_grad(), or it was computed under dl_no_grad_begin()", name, dl__sh(out));
        return DL_ERR_GRAPH;
    }
    if (desc && desc->grad) {
        seed = desc->grad;
        if (!dl__valid(name, "grad", seed)) return ctx->err;
        if (seed->ctx_ != ctx) {
            dl__err(ctx, DL_ERR_ARG, "%s: grad %s belongs to another context than out %s", name,
                    dl__sh(seed), dl__sh(out));
            return DL_ERR_ARG;
        }
        if (seed->dtype != DL_DTYPE_F32) {
            dl__err(ctx, DL_ERR_DTYPE, "%s: grad %s is %s; gradients are float32, as out %s is", name,
                    dl__sh(seed), dl__dtype_str(seed->dtype), dl__sh(out));
            return DL_ERR_DTYPE;
        }
        if (seed->dev_ != out->dev_) {
            dl__err(ctx, DL_ERR_DEVICE, "%s: grad %s is on %s but out %s is on %s", name, dl__sh(seed),
                    dl_device_name(seed->device), dl__sh(out), dl_device_name(out->device));
            return DL_ERR_DEVICE;
        }
        if (!dl_same_shape(seed, out)) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: grad %s must have the shape of out %s", name,
                    dl__sh(seed), dl__sh(out));
            return DL_ERR_SHAPE;
        }
    } else {
        if (out->numel != 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: out %s has %lld elements; a gradient can be implied "
                    "only for one element: pass dl_backward_desc.grad", name, dl__sh(out),
                    (long long)out->numel);
            return DL_ERR_SHAPE;
        }
        /* the implied ones of a fused class loss (CUDA's) are read by its
           backward as 1, and by nothing else: it makes a new dx, and no
           dl_grad target can be handed them. Left unfilled, they spare a
           step a launch (a graph node) */
        unfilled = !create && nt == 0 && out->node_ && out->node_->op->backward == dl__cls_bwd &&
                   DL__BE(out)->class_loss_bwd;
        seed = unfilled ? dl__like(name, out) : dl_ones_like(out);
        if (!seed) return ctx->err;
    }
    for (j = 0; j < nt; j++) results[j] = NULL;
    if (!out->node_) {   /* a leaf: its gradient is the seed */
        for (j = 0; j < nt; j++) if (targets[j] == out) results[j] = seed;
        if (nt == 0 && !dl__acc_leaf(out, seed, create)) return ctx->err;
        return DL_OK;
    }
    if (out->node_->released) goto freed;
    if (out->node_->id >= ctx->ntape || ctx->tape[out->node_->id] != out->node_) {
        /* a capture's tensor outlives dl_step_end; the tape it was recorded on does not */
        dl__err(ctx, DL_ERR_GRAPH, "%s: out %s was made inside a capture, and its part of the tape went "
                "at dl_step_end(); differentiate it inside the capture (a replay repeats that backward)",
                name, dl__sh(out));
        return DL_ERR_GRAPH;
    }
    saved_bng = ctx->backward_nograd;
    ctx->backward_nograd = !create;
    top = out->node_->id;
    if (ctx->ready_fn && nt == 0) dl__ready_count(ctx, top);
    out->node_->gacc = seed;
    seed->gref_ = 1;
    if (desc && desc->grad) seed->gref_ += 1 << 20;   /* the caller's tensor */
    ctx->seed_one = unfilled ? seed : NULL;
    for (i = top; i >= 0; i--) {
        dl__node *n = ctx->tape[i];
        dl_tensor *gin[64], **gp = gin, *g = n->gacc;
        uint64_t nerr = ctx->nerr;
        if (!g) continue;
        n->gacc = NULL;
        for (j = 0; j < nt; j++) if (targets[j] == n->out) { results[j] = g; g->gref_ += 1 << 20; }
        if (n->released) { dl__accq_flush(ctx, &q); ctx->backward_nograd = saved_bng; out = n->out; goto freed_n; }
        if (n->nin > 64) {
            gp = (dl_tensor **)dl__halloc(ctx, sizeof(dl_tensor *) * (size_t)n->nin);
            if (!gp) { dl__err(ctx, DL_ERR_OOM, "%s: out of memory", name); rc = DL_ERR_OOM; break; }
        }
        for (j = 0; j < n->nin; j++) gp[j] = NULL;
        ctx->in_backward_of = n->fn && n->fn->name ? n->fn->name : n->op->name;
        pname = n->fn && n->fn->name ? n->fn->name : n->pname ? n->pname : n->op->name;
        if (ctx->prof) dl__prof_begin(ctx, n->out->dev_, pname, true);   /* "dl_conv2d backward" */
        rc = (n->fn ? n->nsaved : n->op->reads | n->op->cross) ? dl__saved_ok(name, n) : DL_OK;
        if (rc == DL_OK) rc = n->fn ? n->fn->backward((dl_fn_ctx *)n, g, gp, n->user) : n->op->backward(n, g, gp);
        if (!retain) n->released = true;
        if (rc != DL_OK && ctx->nerr == nerr)   /* failed, and said nothing: say which */
            dl__err(ctx, rc, "%s: the backward returned %s without setting an error message", name,
                    dl_result_string(rc));
        for (j = 0; j < n->nin && rc == DL_OK; j++) {
            dl_tensor *x = n->in[j], *gj = gp[j];
            if (!x || !x->requires_grad) continue;
            if (!gj) {
                /* a custom function may give no gradient, unless an op in it failed */
                if (n->fn && ctx->nerr == nerr) continue;
                rc = ctx->err != DL_OK ? ctx->err : DL_ERR_GRAPH;
                if (ctx->err == DL_OK)
                    dl__err(ctx, DL_ERR_GRAPH, "%s: the backward rule gave no gradient for input %d", name, j);
                break;
            }
            if (gj->magic_ != DL__MAGIC || !dl_same_shape(gj, x)) {
                dl__err(ctx, DL_ERR_SHAPE, "%s: the gradient for input %d has shape %s but the "
                        "input has shape %s", name, j, dl__sh(gj), dl__sh(x));
                rc = DL_ERR_SHAPE;
                break;
            }
            if (n->fn && !(gj = dl__fn_grad(name, n, j, gj))) { rc = ctx->err; break; }
            if (ctx->anomaly && !dl__check(gj, n->op->name)) { rc = DL_ERR_NAN; break; }
            if (gj->dev_ != x->dev_) {   /* x moved since the forward (dl_module_to) */
                dl__err(ctx, DL_ERR_DEVICE, "%s: the gradient for input %d %s of %s is on %s but the input is "
                        "now on %s: it moved after the forward (dl_module_to between steps, not inside one)",
                        name, j, dl__sh(x), pname, dl_device_name(gj->device), dl_device_name(x->device));
                rc = DL_ERR_DEVICE;
                break;
            }
            if (x->node_ && (x->node_->id >= ctx->ntape || ctx->tape[x->node_->id] != x->node_)) {
                /* as for out above: a capture's tensor, used in a later step */
                dl__err(ctx, DL_ERR_GRAPH, "%s: input %d %s of %s was made inside a capture, and its part "
                        "of the tape went at dl_step_end(); its gradient cannot flow back: use it inside "
                        "the capture, or dl_detach() it", name, j, dl__sh(x), pname);
                rc = DL_ERR_GRAPH;
                break;
            }
            if (x->node_) {
                if (x->node_->gacc) {
                    dl_tensor *old = x->node_->gacc;
                    x->node_->gacc = dl_add(old, gj);
                    if (x->node_->gacc) x->node_->gacc->gref_++;
                    if (!n->fn) { dl__grad_release(old); gj->gref_++; dl__grad_release(gj); }
                } else {
                    x->node_->gacc = gj;
                    gj->gref_++;
                }
                if (!x->node_->gacc) { rc = ctx->err; break; }
            } else if (nt) {
                int k;
                for (k = 0; k < nt; k++)
                    if (targets[k] == x) {
                        results[k] = results[k] ? dl_add(results[k], gj) : gj;
                        if (!results[k]) rc = ctx->err;
                        else results[k]->gref_ += 1 << 20;   /* the caller's now */
                        gj->gref_ += 1 << 20;
                    }
            } else if (!create && !n->fn && dl__accq_put(&q, x, gj)) {
                continue;   /* added at the queue's launch, then given back */
            } else if (!dl__acc_leaf(x, gj, create)) {
                rc = ctx->err;
            } else {
                if (!n->fn) {
                    gj->gref_++;
                    dl__grad_release(gj);   /* added into the leaf's own grad: no longer needed */
                }
                if (ctx->ready_fn && x->pend_ > 0 && --x->pend_ == 0) rc = ctx->ready_fn(ctx->ready_user, x);
            }
        }
        if (ctx->prof) {
            if (rc == DL_OK) dl__prof_end(ctx, pname, true);
            else dl__prof_fail(ctx);
        }
        ctx->in_backward_of = NULL;
        if (rc != DL_OK) break;
        if (!n->fn) dl__grad_release(g);   /* this node's gradient: every use is done */
    }
    dl__accq_flush(ctx, &q);
    ctx->in_backward_of = NULL;
    ctx->backward_nograd = saved_bng;
    ctx->seed_one = NULL;
    if (rc != DL_OK) for (; i >= 0; i--) ctx->tape[i]->gacc = NULL;
    return rc;
freed_n:
    ctx->seed_one = NULL;
    for (; i >= 0; i--) ctx->tape[i]->gacc = NULL;
freed:
    dl__err(ctx, DL_ERR_GRAPH, "%s: the graph through %s was already freed by an earlier "
            "backward; pass retain_graph = true to the first one to backward twice", name,
            out->node_->op->name);
    return DL_ERR_GRAPH;
}

dl_result dl_backward(dl_tensor *loss) { return dl__run_backward("dl_backward", loss, NULL, 0, NULL, NULL); }
dl_result dl_backward_ex(dl_tensor *out, const dl_backward_desc *d)
{
    return dl__run_backward("dl_backward", out, d, 0, NULL, NULL);
}

dl_result dl_grad(dl_tensor *out, int n, dl_tensor *const *inputs, dl_tensor **grads,
                  const dl_backward_desc *d)
{
    int i;
    if (!out) return DL_ERR_ARG;
    if (n <= 0 || !inputs || !grads) {
        if (out->magic_ == DL__MAGIC)
            dl__err(out->ctx_, DL_ERR_ARG, "dl_grad: need at least one input and an output array");
        return DL_ERR_ARG;
    }
    for (i = 0; i < n; i++) {
        if (!inputs[i] || !dl__valid("dl_grad", "an input", inputs[i])) return DL_ERR_ARG;
        if (!inputs[i]->requires_grad) {
            dl__err(out->ctx_, DL_ERR_GRAPH, "dl_grad: input %d %s does not require grad", i,
                    dl__sh(inputs[i]));
            return DL_ERR_GRAPH;
        }
    }
    return dl__run_backward("dl_grad", out, d, n, inputs, grads);
}

// >>section autograd: custom functions
dl_tensor *dl_function_apply(const dl_function *fn, int n, dl_tensor *const *inputs, void *user)
{
    dl_ctx *ctx;
    dl_tensor *y;
    dl__node *node;
    dl_fn_ctx tmp;
    int i;
    uint64_t nerr;
    const char *nm;   /* its name everywhere: messages, and the profiler's span */
    if (!fn || !inputs || n <= 0) {
        dl__err(NULL, DL_ERR_ARG, "dl_function_apply: %s%s%d inputs (it needs a function and at "
                "least one input)", fn ? "" : "fn is NULL, ", inputs ? "" : "inputs is NULL, ", n);
        return NULL;
    }
    nm = fn->name ? fn->name : "dl_function_apply";
    for (i = 0; i < n; i++) if (!inputs[i]) return NULL;
    for (i = 0; i < n; i++) if (!dl__live(nm, "an input", inputs[i])) return NULL;
    ctx = inputs[0]->ctx_;
    if (!fn->forward || !fn->backward) {
        dl__err(ctx, DL_ERR_ARG, "dl_function_apply: %s needs both forward and backward",
                fn->name ? fn->name : "function");
        return dl__end(ctx, NULL, nm);
    }
    memset(&tmp, 0, sizeof tmp);
    tmp.node.in = (dl_tensor **)inputs;
    tmp.node.nin = n;
    nerr = ctx->nerr;
    dl_no_grad_begin(ctx);
    y = fn->forward(&tmp, n, inputs, user);
    dl_no_grad_end(ctx);
    if (y && ctx->nerr != nerr) {   /* an error inside (a 9th dl_fn_save ...): the result is not to be trusted */
        char why[sizeof ctx->msg];
        memcpy(why, ctx->msg, sizeof why);
        dl__err(ctx, ctx->err, "%s: its forward returned a tensor after an error: %s", nm, why);
        return dl__end(ctx, NULL, nm);
    }
    if (!y) return dl__end(ctx, NULL, nm);
    if (!dl__live(nm, "the forward's result", y)) return dl__end(ctx, NULL, nm);
    if (y->ctx_ != ctx) {   /* its node would go on the other context's tape, out of this backward's reach */
        dl__err(ctx, DL_ERR_ARG, "%s: its forward returned a tensor %s of another context than its inputs'",
                nm, dl__sh(y));
        return dl__end(ctx, NULL, nm);
    }
    /* The output gets a header of its own: recording on an input (a
       pass-through, or an in-place-style forward that returns its argument),
       on a persistent tensor or on another op's output would overwrite that
       tensor's place in the graph. */
    for (i = 0; i < n; i++) if (y == inputs[i]) break;
    if (i < n || y->node_ || y->step_ == 0 || y->requires_grad) y = dl__view(nm, NULL, y, y->ndim, y->shape);
    if (!y) return dl__end(ctx, NULL, nm);
    {
        static const dl__op custom = {"custom function", NULL, 0, 0};
        if (dl__record(y, &custom, n, inputs, &node) < 0) return dl__end(ctx, NULL, nm);
    }
    if (node) {
        node->fn = fn;
        node->user = user;
        node->nsaved = tmp.node.nsaved;
        memcpy(node->saved, tmp.node.saved, sizeof node->saved);
        memcpy(node->ver, tmp.node.ver, sizeof node->ver);
    }
    return dl__done(y, nm);
}

void dl_fn_save(dl_fn_ctx *fc, dl_tensor *t)
{
    if (!fc) return;
    if (fc->node.nsaved >= DL__NSAVED) {
        if (t && t->magic_ == DL__MAGIC) dl__err(t->ctx_, DL_ERR_ARG, "dl_fn_save: at most %d tensors", DL__NSAVED);
        return;
    }
    if (t && t->magic_ == DL__MAGIC) fc->node.ver[fc->node.nsaved] = *dl__ver(t);
    fc->node.saved[fc->node.nsaved++] = t;
}
dl_tensor *dl_fn_saved(dl_fn_ctx *fc, int i) { return fc && i >= 0 && i < fc->node.nsaved ? fc->node.saved[i] : NULL; }
bool dl_fn_needs_grad(dl_fn_ctx *fc, int i) { return fc && i >= 0 && i < fc->node.nin && fc->node.in[i]->requires_grad; }

// >>section ops: elementwise
/* Each op: checks, output, kernel call, tape node. The backward rule below it
   is written with dl.h ops (math in the comment), so under create_graph the
   backward is itself recorded and can be differentiated again. */

static dl_tensor *dl__unary(const char *name, const dl__op *op, int kop, dl_tensor *a, float fa,
                            float fb)
{
    dl_tensor *y;
    dl__node *n;
    if (!a) return NULL;
    if (!dl__live(name, "a", a) || !dl__f32(name, "a", a)) return NULL;
    y = dl__like(name, a);
    if (!y) return NULL;
    DL__BE(a)->unary(a->dev_, kop, (float *)y->data, (const float *)a->data, a->numel, fa, fb);
    if (op) {
        if (dl__record(y, op, 1, &a, &n) < 0) return NULL;
        if (n) { n->f[0] = fa; n->f[1] = fb; }
    }
    return dl__done(y, name);
}

/* A 0/1 (or slope) mask: not differentiable, never recorded. */
static dl_tensor *dl__mask(dl_tensor *x, int kop, float a, float b)
{
    return x ? dl__unary("mask", NULL, kop, x, a, b) : NULL;
}

#define DL__X (n->in[0])
#define DL__Y (n->out)

/* y = -x;  dx = -g */
static dl_result dl__neg_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { (void)n; gin[0] = dl_neg(g); return DL_OK; }
/* y = exp(x);  dx = g * y */
static dl_result dl__exp_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, DL__Y); return DL_OK; }
/* y = log(x);  dx = g / x */
static dl_result dl__log_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_div(g, DL__X); return DL_OK; }
/* y = sqrt(x);  dx = g / (2 y) */
static dl_result dl__sqrt_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_div(g, dl_mul_scalar(DL__Y, 2.0f)); return DL_OK; }
/* y = |x|;  dx = g * sign(x) */
static dl_result dl__abs_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, dl__mask(DL__X, DL__U_SIGN, 0, 0)); return DL_OK; }
/* y = erf(x);  dx = g * 2/sqrt(pi) * exp(-x^2) */
static dl_result dl__erf_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *x = DL__X;
    gin[0] = dl_mul(g, dl_mul_scalar(dl_exp(dl_neg(dl_mul(x, x))), 1.1283791670955126f));
    return DL_OK;
}
/* y = clamp(x, lo, hi);  dx = g where lo < x < hi, else 0 (at a bound and
   at NaN: 0, as PyTorch 2.15) */
static dl_result dl__clamp_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, dl__mask(DL__X, DL__U_INSIDE, n->f[0], n->f[1])); return DL_OK; }
/* The backward of ReLU, sigmoid or tanh (act: DL__U_RELU, SIGMOID, TANH)
   from t: the ReLU's input or output (the same mask), the others' output;
   one pass, or with dl.h ops (differentiable) under create_graph.
     relu     y = max(x, 0);       dx = g * !(x <= 0) (NaN passes g, as PyTorch's threshold_backward)
     sigmoid  y = 1/(1+exp(-x));   dx = g * y * (1 - y)
     tanh     y = tanh(x);         dx = g * (1 - y^2) */
static dl_tensor *dl__bmask(dl_tensor *a, dl_tensor *b, int kop);
static dl_tensor *dl__act_grad(dl_tensor *g, dl_tensor *t, int act)
{
    if (dl__grad_on(g->ctx_)) {
        if (act == DL__U_RELU) return dl_mul(g, dl__mask(t, DL__U_NLE, 0, 0));
        if (act == DL__U_SIGMOID) return dl_mul(g, dl_mul(t, dl_rsub_scalar(t, 1.0f)));
        return dl_mul(g, dl_rsub_scalar(dl_mul(t, t), 1.0f));
    }
    return dl__bmask(g, t, act == DL__U_RELU ? DL__B_RELU_GRAD : act == DL__U_SIGMOID ? DL__B_SIGMOID_GRAD
                                                                                     : DL__B_TANH_GRAD);
}
static dl_result dl__relu_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__act_grad(g, DL__X, DL__U_RELU);
    return DL_OK;
}
/* y = x > 0 ? x : s x;  dx = g * (x > 0 ? 1 : s) */
static dl_result dl__leaky_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, dl__mask(DL__X, DL__U_LEAKY_MASK, n->f[0], 0)); return DL_OK; }
static dl_result dl__sigmoid_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__act_grad(g, DL__Y, DL__U_SIGMOID);
    return DL_OK;
}
static dl_result dl__tanh_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__act_grad(g, DL__Y, DL__U_TANH);
    return DL_OK;
}
/* y = x Phi(x);  dx = g * (Phi(x) + x phi(x)), Phi(x) = (1 + erf(x/sqrt2))/2,
   phi(x) = exp(-x^2/2)/sqrt(2 pi) */
static dl_result dl__gelu_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *x = DL__X;
    dl_tensor *cdf = dl_add_scalar(dl_mul_scalar(dl_erf(dl_mul_scalar(x, 0.70710678118654752f)), 0.5f), 0.5f);
    dl_tensor *pdf = dl_mul_scalar(dl_exp(dl_mul_scalar(dl_mul(x, x), -0.5f)), 0.3989422804014327f);
    gin[0] = dl_mul(g, dl_add(cdf, dl_mul(x, pdf)));
    return DL_OK;
}
/* y = x^p;  dx = g * p * x^(p-1)   (p = 0: dx = 0) */
static dl_result dl__pow_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    float p = n->f[0];
    if (p == 0.0f) gin[0] = dl_mul_scalar(g, 0.0f);
    else if (p == 1.0f) gin[0] = g;
    else gin[0] = dl_mul(g, dl_mul_scalar(dl_pow(DL__X, p - 1.0f), p));
    return DL_OK;
}
/* y = a x + b;  dx = a g */
static dl_result dl__affine_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = n->f[0] == 1.0f ? g : dl_mul_scalar(g, n->f[0]); return DL_OK; }
/* y = x / s;  dx = g / s */
static dl_result dl__divs_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_div_scalar(g, n->f[0]); return DL_OK; }

static const dl__op dl__op_neg = {"dl_neg", dl__neg_bwd, 0, 0};
static const dl__op dl__op_exp = {"dl_exp", dl__exp_bwd, DL__RD_OUT, 0};
static const dl__op dl__op_log = {"dl_log", dl__log_bwd, 1, 0};
static const dl__op dl__op_sqrt = {"dl_sqrt", dl__sqrt_bwd, DL__RD_OUT, 0};
static const dl__op dl__op_abs = {"dl_abs", dl__abs_bwd, 1, 0};
static const dl__op dl__op_erf = {"dl_erf", dl__erf_bwd, 1, 0};
static const dl__op dl__op_clamp = {"dl_clamp", dl__clamp_bwd, 1, 0};
static const dl__op dl__op_relu = {"dl_relu", dl__relu_bwd, 1, 0};
static const dl__op dl__op_leaky = {"dl_leaky_relu", dl__leaky_bwd, 1, 0};
static const dl__op dl__op_sigmoid = {"dl_sigmoid", dl__sigmoid_bwd, DL__RD_OUT, 0};
static const dl__op dl__op_tanh = {"dl_tanh", dl__tanh_bwd, DL__RD_OUT, 0};
static const dl__op dl__op_gelu = {"dl_gelu", dl__gelu_bwd, 1, 0};
/* y = x s(x), s = sigmoid;  dx = g * s * (1 + x (1 - s)) */
static dl_result dl__silu_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *s = dl_sigmoid(DL__X);
    gin[0] = dl_mul(g, dl_mul(s, dl_add_scalar(dl_mul(DL__X, dl_rsub_scalar(s, 1.0f)), 1.0f)));
    return DL_OK;
}
static const dl__op dl__op_silu = {"dl_silu", dl__silu_bwd, 1, 0};
static const dl__op dl__op_pow = {"dl_pow", dl__pow_bwd, 1, 0};
static const dl__op dl__op_affine = {"dl_scalar_affine", dl__affine_bwd, 0, 0};
static const dl__op dl__op_divs = {"dl_div_scalar", dl__divs_bwd, 0, 0};

dl_tensor *dl_neg(dl_tensor *a) { return dl__unary("dl_neg", &dl__op_neg, DL__U_NEG, a, 0, 0); }
dl_tensor *dl_exp(dl_tensor *a) { return dl__unary("dl_exp", &dl__op_exp, DL__U_EXP, a, 0, 0); }
dl_tensor *dl_log(dl_tensor *a) { return dl__unary("dl_log", &dl__op_log, DL__U_LOG, a, 0, 0); }
dl_tensor *dl_sqrt(dl_tensor *a) { return dl__unary("dl_sqrt", &dl__op_sqrt, DL__U_SQRT, a, 0, 0); }
dl_tensor *dl_abs(dl_tensor *a) { return dl__unary("dl_abs", &dl__op_abs, DL__U_ABS, a, 0, 0); }
dl_tensor *dl_erf(dl_tensor *a) { return dl__unary("dl_erf", &dl__op_erf, DL__U_ERF, a, 0, 0); }
dl_tensor *dl_relu(dl_tensor *a) { return dl__unary("dl_relu", &dl__op_relu, DL__U_RELU, a, 0, 0); }
dl_tensor *dl_sigmoid(dl_tensor *a) { return dl__unary("dl_sigmoid", &dl__op_sigmoid, DL__U_SIGMOID, a, 0, 0); }
dl_tensor *dl_tanh(dl_tensor *a) { return dl__unary("dl_tanh", &dl__op_tanh, DL__U_TANH, a, 0, 0); }
dl_tensor *dl_gelu(dl_tensor *a) { return dl__unary("dl_gelu", &dl__op_gelu, DL__U_GELU, a, 0, 0); }
dl_tensor *dl_silu(dl_tensor *a) { return dl__unary("dl_silu", &dl__op_silu, DL__U_SILU, a, 0, 0); }
dl_tensor *dl_leaky_relu(dl_tensor *a, float s) { return dl__unary("dl_leaky_relu", &dl__op_leaky, DL__U_LEAKY, a, s, 0); }
dl_tensor *dl_pow(dl_tensor *a, float p) { return dl__unary("dl_pow", &dl__op_pow, DL__U_POW, a, p, 0); }
dl_tensor *dl_add_scalar(dl_tensor *a, float s) { return dl__unary("dl_add_scalar", &dl__op_affine, DL__U_AFFINE, a, 1.0f, s); }
dl_tensor *dl_sub_scalar(dl_tensor *a, float s) { return dl__unary("dl_sub_scalar", &dl__op_affine, DL__U_AFFINE, a, 1.0f, -s); }
dl_tensor *dl_mul_scalar(dl_tensor *a, float s) { return dl__unary("dl_mul_scalar", &dl__op_affine, DL__U_AFFINE, a, s, 0.0f); }
dl_tensor *dl_rsub_scalar(dl_tensor *a, float s) { return dl__unary("dl_rsub_scalar", &dl__op_affine, DL__U_AFFINE, a, -1.0f, s); }
dl_tensor *dl_div_scalar(dl_tensor *a, float s) { return dl__unary("dl_div_scalar", &dl__op_divs, DL__U_DIVS, a, s, 0); }

dl_tensor *dl_clamp(dl_tensor *a, float lo, float hi)
{
    if (a && a->magic_ == DL__MAGIC && !(lo <= hi)) {
        dl__err(a->ctx_, DL_ERR_ARG, "dl_clamp: lo=%g must be <= hi=%g", (double)lo, (double)hi);
        return NULL;
    }
    return dl__unary("dl_clamp", &dl__op_clamp, DL__U_CLAMP, a, lo, hi);
}

/* Broadcast plan: align shapes on the right; sizes must match or be 1. */
static bool dl__broadcast(const char *name, const dl_tensor *a, const dl_tensor *b, dl__bcast *bc)
{
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim, d;
    int64_t sa[DL_MAX_DIMS], sb[DL_MAX_DIMS];
    dl__strides(a->shape, a->ndim, sa);
    dl__strides(b->shape, b->ndim, sb);
    bc->ndim = nd;
    bc->n = 1;
    for (d = 0; d < nd; d++) {
        int ia = d - (nd - a->ndim), ib = d - (nd - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            dl__err(a->ctx_, DL_ERR_SHAPE, "%s: a %s and b %s do not broadcast: dim %d of the "
                    "result pairs size %lld with size %lld (sizes must match or one be 1)",
                    name, dl__sh(a), dl__sh(b), d, (long long)da, (long long)db);
            return false;
        }
        bc->shape[d] = da == 1 ? db : da;
        bc->sa[d] = (da == 1) ? 0 : sa[ia];
        bc->sb[d] = (db == 1) ? 0 : sb[ib];
        bc->n *= bc->shape[d];
    }
    return true;
}

static dl_tensor *dl__binary(const char *name, const dl__op *op, int kop, dl_tensor *a, dl_tensor *b)
{
    dl__bcast bc;
    dl_tensor *y, *in[2];
    dl__node *n;
    if (!a || !b) return NULL;
    if (!dl__live(name, "a", a) || !dl__live(name, "b", b)) return NULL;
    if (!dl__pair(name, a, b) || !dl__f32(name, "a", a) || !dl__f32(name, "b", b)) return NULL;
    if (!dl__broadcast(name, a, b, &bc)) return NULL;
    y = dl__new(a->dev_, name, bc.ndim, bc.shape);
    if (!y) return NULL;
    DL__BE(a)->binary(a->dev_, kop, (float *)y->data, (const float *)a->data,
                     (const float *)b->data, &bc);
    in[0] = a;
    in[1] = b;
    if (op && dl__record(y, op, 2, in, &n) < 0) return NULL;
    return dl__done(y, name);
}

static dl_tensor *dl__bmask(dl_tensor *a, dl_tensor *b, int kop)
{
    return dl__binary("mask", NULL, kop, a, b);
}

#define DL__A (n->in[0])
#define DL__B (n->in[1])
/* y = a + b;  da = sum_to(g), db = sum_to(g) */
static dl_result dl__add_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(g, DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(g, DL__B);
    return DL_OK;
}
/* y = a - b;  da = g, db = -g */
static dl_result dl__sub_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(g, DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(dl_neg(g), DL__B);
    return DL_OK;
}
/* y = a * b;  da = g b, db = g a */
static dl_result dl__mul_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(dl_mul(g, DL__B), DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(dl_mul(g, DL__A), DL__B);
    return DL_OK;
}
/* y = a / b;  da = g / b, db = -g y / b */
static dl_result dl__div_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(dl_div(g, DL__B), DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(dl_neg(dl_div(dl_mul(g, DL__Y), DL__B)), DL__B);
    return DL_OK;
}
/* y = max(a, b);  da = g [a > b] + g/2 [a == b] (as PyTorch), db likewise */
static dl_result dl__maximum_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(dl_mul(g, dl__bmask(DL__A, DL__B, DL__B_GT_HALF)), DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(dl_mul(g, dl__bmask(DL__B, DL__A, DL__B_GT_HALF)), DL__B);
    return DL_OK;
}
static dl_result dl__minimum_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(dl_mul(g, dl__bmask(DL__A, DL__B, DL__B_LT_HALF)), DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(dl_mul(g, dl__bmask(DL__B, DL__A, DL__B_LT_HALF)), DL__B);
    return DL_OK;
}

static const dl__op dl__op_add = {"dl_add", dl__add_bwd, 0, 0};
static const dl__op dl__op_sub = {"dl_sub", dl__sub_bwd, 0, 0};
static const dl__op dl__op_mul = {"dl_mul", dl__mul_bwd, 0, 3};
static const dl__op dl__op_div = {"dl_div", dl__div_bwd, 2 | DL__RD_OUT, 0};
static const dl__op dl__op_maximum = {"dl_maximum", dl__maximum_bwd, 3, 0};
static const dl__op dl__op_minimum = {"dl_minimum", dl__minimum_bwd, 3, 0};

dl_tensor *dl_add(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_add", &dl__op_add, DL__B_ADD, a, b); }
dl_tensor *dl_sub(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_sub", &dl__op_sub, DL__B_SUB, a, b); }
dl_tensor *dl_mul(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_mul", &dl__op_mul, DL__B_MUL, a, b); }
dl_tensor *dl_div(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_div", &dl__op_div, DL__B_DIV, a, b); }
dl_tensor *dl_maximum(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_maximum", &dl__op_maximum, DL__B_MAX, a, b); }
dl_tensor *dl_minimum(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_minimum", &dl__op_minimum, DL__B_MIN, a, b); }

/* torch.eq as float32 1/0: float32 pairs by the binary entry (no tape),
   int64 pairs by eq_i64 after spreading a broadcast operand to the
   result's shape (copy_nd with the broadcast's zero strides) */
dl_tensor *dl_eq(dl_tensor *a, dl_tensor *b)
{
    static const char *op = "dl_eq";
    dl__bcast bc;
    dl_tensor *y, *ab[2];
    int k;
    if (!a || !b) return NULL;
    if (!dl__live(op, "a", a) || !dl__live(op, "b", b) || !dl__pair(op, a, b)) return NULL;
    if (a->dtype != b->dtype || (a->dtype != DL_DTYPE_F32 && a->dtype != DL_DTYPE_I64)) {
        dl__err(a->ctx_, DL_ERR_DTYPE, "dl_eq: a %s is %s and b %s is %s (both must be float32 or both "
                "int64)", dl__sh(a), dl__dtype_str(a->dtype), dl__sh(b), dl__dtype_str(b->dtype));
        return NULL;
    }
    if (a->dtype == DL_DTYPE_F32) return dl__binary(op, NULL, DL__B_EQ, a, b);
    if (!dl__broadcast(op, a, b, &bc)) return NULL;
    y = dl__new(a->dev_, op, bc.ndim, bc.shape);
    if (!y) return NULL;
    ab[0] = a;
    ab[1] = b;
    for (k = 0; k < 2 && bc.n > 0; k++) {
        int64_t st[DL_MAX_DIMS];
        dl_tensor *t = ab[k];
        if (t->numel == bc.n) continue;   /* already the result's shape (broadcast dims of 1 only) */
        ab[k] = dl__make(a->dev_, op, DL_DTYPE_I64, bc.ndim, bc.shape, false, NULL);
        if (!ab[k]) return NULL;
        dl__strides(bc.shape, bc.ndim, st);
        DL__BE(a)->copy_nd(a->dev_, 8, bc.ndim, bc.shape, ab[k]->data, st, t->data, k ? bc.sb : bc.sa);
    }
    if (bc.n > 0)
        DL__BE(a)->eq_i64(a->dev_, (float *)y->data, (const int64_t *)ab[0]->data, (const int64_t *)ab[1]->data, bc.n);
    return dl__done(y, op);
}

// >>section ops: shape
/* reshape and friends make a new header over the same storage (a view);
   everything that reorders elements copies through the copy_nd kernel, so
   every kernel sees contiguous row-major data. */

static dl_tensor *dl__view(const char *name, const dl__op *op, dl_tensor *t, int ndim,
                           const int64_t *shape)
{
    dl_tensor *y;
    dl__node *n;
    y = dl__make(t->dev_, name, t->dtype, ndim, shape, false, t->data);
    if (!y) return NULL;
    t->viewed_ = true;
    y->vbase_ = t->vbase_ ? t->vbase_ : t;
    y->detached_ = t->detached_;
    if (op && dl__record(y, op, 1, &t, &n) < 0) return NULL;
    return y;
}

/* view;  dx = reshape(g, x.shape) */
static dl_result dl__reshape_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl_reshape(g, dl__shape_of(DL__X));
    return DL_OK;
}
static const dl__op dl__op_reshape = {"dl_reshape", dl__reshape_bwd, 0, 0};

dl_tensor *dl_reshape(dl_tensor *t, dl_shape shape)
{
    int i, neg = -1;
    int64_t known = 1;
    int64_t out[DL_MAX_DIMS];
    if (!t) return NULL;
    if (!dl__live("dl_reshape", "t", t)) return NULL;
    if (shape.ndim < 0 || shape.ndim > DL_MAX_DIMS) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "dl_reshape: %d dims requested; at most %d", shape.ndim, DL_MAX_DIMS);
        return NULL;
    }
    for (i = 0; i < shape.ndim; i++) {
        out[i] = shape.d[i];
        if (shape.d[i] == -1) {
            if (neg >= 0) {
                dl__err(t->ctx_, DL_ERR_SHAPE, "dl_reshape: shape %s has more than one -1",
                        dl__shp(t->ctx_, &shape));
                return NULL;
            }
            neg = i;
        } else if (shape.d[i] < 0) {
            dl__err(t->ctx_, DL_ERR_SHAPE, "dl_reshape: shape %s has a negative size other than -1",
                    dl__shp(t->ctx_, &shape));
            return NULL;
        } else {
            if (shape.d[i] && known > INT64_MAX / shape.d[i]) known = INT64_MAX;
            else known *= shape.d[i];
        }
    }
    if (neg >= 0) {
        if (known == 0 || t->numel % known != 0) {
            dl__err(t->ctx_, DL_ERR_SHAPE, "dl_reshape: cannot reshape %s (%lld elements) to %s: "
                    "the -1 has no whole-number size", dl__sh(t), (long long)t->numel,
                    dl__shp(t->ctx_, &shape));
            return NULL;
        }
        out[neg] = t->numel / known;
        known = t->numel;
    }
    if (known != t->numel) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "dl_reshape: cannot reshape %s (%lld elements) to %s "
                "(%lld elements): the element counts must be equal", dl__sh(t),
                (long long)t->numel, dl__shp(t->ctx_, &shape), (long long)known);
        return NULL;
    }
    return dl__end(t->ctx_, dl__view("dl_reshape", &dl__op_reshape, t, shape.ndim, out), "dl_reshape");
}

dl_tensor *dl_flatten(dl_tensor *t, int start, int end)
{
    int64_t out[DL_MAX_DIMS];
    int i, k = 0;
    if (!t) return NULL;
    if (!dl__live("dl_flatten", "t", t)) return NULL;
    if (t->ndim == 0) return dl__end(t->ctx_, dl_reshape(t, dl__dims1(1)), "dl_flatten");
    if (!dl__dim("dl_flatten", t, &start, t->ndim) || !dl__dim("dl_flatten", t, &end, t->ndim)) return NULL;
    if (start > end) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_flatten: start_dim %d comes after end_dim %d", start, end);
        return NULL;
    }
    for (i = 0; i < start; i++) out[k++] = t->shape[i];
    out[k++] = dl__prod(t->shape + start, end - start + 1);
    for (i = end + 1; i < t->ndim; i++) out[k++] = t->shape[i];
    return dl__end(t->ctx_, dl_reshape(t, dl_shape_make(k, out)), "dl_flatten");
}

dl_tensor *dl_squeeze(dl_tensor *t, int dim)
{
    int64_t out[DL_MAX_DIMS];
    int i, k = 0;
    if (!t) return NULL;
    if (!dl__live("dl_squeeze", "t", t)) return NULL;
    if (!dl__dim("dl_squeeze", t, &dim, t->ndim ? t->ndim : 1)) return NULL;   /* 0-d: dim 0 or -1, as torch */
    for (i = 0; i < t->ndim; i++)
        if (i != dim || t->shape[i] != 1) out[k++] = t->shape[i];   /* size != 1: no-op, as PyTorch */
    return dl__end(t->ctx_, dl_reshape(t, dl_shape_make(k, out)), "dl_squeeze");
}

dl_tensor *dl_unsqueeze(dl_tensor *t, int dim)
{
    int64_t out[DL_MAX_DIMS];
    int i, k = 0;
    if (!t) return NULL;
    if (!dl__live("dl_unsqueeze", "t", t)) return NULL;
    if (t->ndim >= DL_MAX_DIMS) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "dl_unsqueeze: t %s already has DL_MAX_DIMS=%d dims", dl__sh(t), DL_MAX_DIMS);
        return NULL;
    }
    if (!dl__dim("dl_unsqueeze", t, &dim, t->ndim + 1)) return NULL;
    for (i = 0; i <= t->ndim; i++) {
        if (i == dim) out[k++] = 1;
        if (i < t->ndim) out[k++] = t->shape[i];
    }
    return dl__end(t->ctx_, dl_reshape(t, dl_shape_make(k, out)), "dl_unsqueeze");
}

/* A copy of t with its elements read through src_strides (elements) and an offset. */
static dl_tensor *dl__gather_copy(const char *name, dl_tensor *t, int ndim, const int64_t *shape,
                                  const int64_t *src_strides, int64_t offset)
{
    int64_t ds[DL_MAX_DIMS];
    dl_tensor *y = dl__make(t->dev_, name, t->dtype, ndim, shape, false, NULL);
    if (!y) return NULL;
    dl__strides(shape, ndim, ds);
    if (y->numel)
        DL__BE(t)->copy_nd(t->dev_, dl__esize(t->dtype), ndim, shape, y->data, ds,
                          (const char *)t->data + offset * (int64_t)dl__esize(t->dtype), src_strides);
    return y;
}

/* y = permute(x, p);  dx = permute(g, inverse(p)) */
static dl_result dl__permute_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_shape inv;
    int i;
    inv.ndim = n->ni;
    for (i = 0; i < n->ni; i++) inv.d[n->i[i]] = i;
    gin[0] = dl_permute(g, inv);
    return DL_OK;
}
static const dl__op dl__op_permute = {"dl_permute", dl__permute_bwd, 0, 0};

dl_tensor *dl_permute(dl_tensor *t, dl_shape perm)
{
    int64_t st[DL_MAX_DIMS], ss[DL_MAX_DIMS], shape[DL_MAX_DIMS];
    bool seen[DL_MAX_DIMS];
    int i;
    dl_tensor *y;
    dl__node *n;
    if (!t) return NULL;
    if (!dl__live("dl_permute", "t", t)) return NULL;
    if (perm.ndim != t->ndim) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_permute: t %s has %d dims but perm %s has %d", dl__sh(t),
                t->ndim, dl__shp(t->ctx_, &perm), perm.ndim);
        return NULL;
    }
    memset(seen, 0, sizeof seen);
    dl__strides(t->shape, t->ndim, st);
    for (i = 0; i < t->ndim; i++) {
        int d = (int)perm.d[i];
        if (perm.d[i] < -t->ndim || perm.d[i] >= t->ndim || seen[d < 0 ? d + t->ndim : d]) {
            dl__err(t->ctx_, DL_ERR_ARG, "dl_permute: perm %s is not a permutation of the %d dims of t %s",
                    dl__shp(t->ctx_, &perm), t->ndim, dl__sh(t));
            return NULL;
        }
        if (d < 0) d += t->ndim;
        seen[d] = true;
        perm.d[i] = d;
        shape[i] = t->shape[d];
        ss[i] = st[d];
    }
    y = dl__gather_copy("dl_permute", t, t->ndim, shape, ss, 0);
    if (!y) return NULL;
    if (dl__record(y, &dl__op_permute, 1, &t, &n) < 0) return NULL;
    if (n) { n->ni = t->ndim; for (i = 0; i < t->ndim; i++) n->i[i] = perm.d[i]; }
    return dl__done(y, "dl_permute");
}

dl_tensor *dl_transpose(dl_tensor *t, int d0, int d1)
{
    dl_shape p;
    int i;
    if (!t) return NULL;
    if (!dl__live("dl_transpose", "t", t)) return NULL;
    if (!dl__dim("dl_transpose", t, &d0, t->ndim ? t->ndim : 1) ||   /* 0-d: dims 0 or -1, as torch */
        !dl__dim("dl_transpose", t, &d1, t->ndim ? t->ndim : 1)) return NULL;
    if (t->ndim == 0) return dl__end(t->ctx_, dl_reshape(t, dl_shape_make(0, NULL)), "dl_transpose");
    p.ndim = t->ndim;
    for (i = 0; i < t->ndim; i++) p.d[i] = i;
    p.d[d0] = d1;
    p.d[d1] = d0;
    return dl__end(t->ctx_, dl_permute(t, p), "dl_transpose");
}

/* Place g into zeros of the full shape at [start, start+len) along dim:
   the backward of narrow, itself differentiable (its backward is narrow). */
static dl_tensor *dl__unnarrow(dl_tensor *g, int dim, int64_t start, int64_t full);
/* y = narrow(x, dim, start, len);  dx = unnarrow(g) */
static dl_result dl__narrow_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__unnarrow(g, (int)n->i[0], n->i[1], DL__X->shape[n->i[0]]);
    return DL_OK;
}
/* y = unnarrow(g);  dg = narrow(gy) */
static dl_result dl__unnarrow_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl_narrow(g, (int)n->i[0], n->i[1], DL__X->shape[n->i[0]]);
    return DL_OK;
}
static const dl__op dl__op_narrow = {"dl_narrow", dl__narrow_bwd, 0, 0};
static const dl__op dl__op_unnarrow = {"dl_narrow_backward", dl__unnarrow_bwd, 0, 0};

dl_tensor *dl_narrow(dl_tensor *t, int dim, int64_t start, int64_t len)
{
    int64_t st[DL_MAX_DIMS], shape[DL_MAX_DIMS], start0 = start;   /* (the message names what was passed) */
    dl_tensor *y;
    dl__node *n;
    if (!t) return NULL;
    if (!dl__live("dl_narrow", "t", t)) return NULL;
    if (!dl__dim("dl_narrow", t, &dim, t->ndim)) return NULL;
    if (start < 0) start += t->shape[dim];
    if (start < 0 || len < 0 || start > t->shape[dim] || len > t->shape[dim] - start) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_narrow: start %lld, length %lld do not fit in dim %d of "
                "size %lld of t %s", (long long)start0, (long long)len, dim,
                (long long)t->shape[dim], dl__sh(t));
        return NULL;
    }
    dl__strides(t->shape, t->ndim, st);
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    shape[dim] = len;
    y = dl__gather_copy("dl_narrow", t, t->ndim, shape, st, start * st[dim]);
    if (!y) return NULL;
    if (dl__record(y, &dl__op_narrow, 1, &t, &n) < 0) return NULL;
    if (n) { n->i[0] = dim; n->i[1] = start; }
    return dl__done(y, "dl_narrow");
}

static dl_tensor *dl__unnarrow(dl_tensor *g, int dim, int64_t start, int64_t full)
{
    int64_t shape[DL_MAX_DIMS], ds[DL_MAX_DIMS], ss[DL_MAX_DIMS];
    dl_tensor *y;
    dl__node *n;
    if (!g) return NULL;
    if (g->ctx_->prof) dl__prof_begin(g->ctx_, g->dev_, "dl_narrow_backward", false);
    memcpy(shape, g->shape, sizeof(int64_t) * (size_t)g->ndim);
    shape[dim] = full;
    y = dl__new(g->dev_, "dl_narrow_backward", g->ndim, shape);
    if (!y) return NULL;
    DL__BE(g)->fill(g->dev_, (float *)y->data, y->numel, 0.0f);
    dl__strides(shape, g->ndim, ds);
    dl__strides(g->shape, g->ndim, ss);
    if (g->numel)
        DL__BE(g)->copy_nd(g->dev_, 4, g->ndim, g->shape, (float *)y->data + start * ds[dim], ds,
                          g->data, ss);
    if (dl__record(y, &dl__op_unnarrow, 1, &g, &n) < 0) return NULL;
    if (n) { n->i[0] = dim; n->i[1] = start; }
    return dl__done(y, "dl_narrow_backward");
}

/* y = cat(x_i, dim);  dx_i = narrow(g, dim, offset_i, size_i) */
static dl_result dl__cat_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int i, dim = (int)n->i[0];
    int64_t off = 0;
    for (i = 0; i < n->nin; i++) {
        if (dl__need(n, i)) gin[i] = dl_narrow(g, dim, off, n->in[i]->shape[dim]);
        off += n->in[i]->shape[dim];
    }
    return DL_OK;
}
static const dl__op dl__op_cat = {"dl_cat", dl__cat_bwd, 0, 0};

dl_tensor *dl_cat(int n, dl_tensor *const *ts, int dim)
{
    int i, d;
    int64_t shape[DL_MAX_DIMS], ds[DL_MAX_DIMS], ss[DL_MAX_DIMS], off = 0;
    dl_tensor *t0, *y;
    dl__node *node;
    if (!ts || n <= 0) {
        dl__err(NULL, DL_ERR_ARG, "dl_cat: %d tensors%s; it needs at least one", n, ts ? "" : " (ts is NULL)");
        return NULL;
    }
    for (i = 0; i < n; i++) if (!ts[i]) return NULL;
    t0 = ts[0];
    for (i = 0; i < n; i++) if (!dl__live("dl_cat", "an input", ts[i])) return NULL;
    if (!dl__dim("dl_cat", t0, &dim, t0->ndim)) return NULL;
    memcpy(shape, t0->shape, sizeof(int64_t) * (size_t)t0->ndim);
    shape[dim] = 0;
    for (i = 0; i < n; i++) {
        const dl_tensor *t = ts[i];
        if (!dl__pair("dl_cat", t0, t)) return NULL;
        if (t->dtype != t0->dtype) {
            dl__err(t0->ctx_, DL_ERR_DTYPE, "dl_cat: input %d %s has dtype %s but input 0 %s has "
                    "%s; all inputs must share a dtype", i, dl__sh(t), dl__dtype_str(t->dtype),
                    dl__sh(t0), dl__dtype_str(t0->dtype));
            return NULL;
        }
        if (t->ndim != t0->ndim) goto bad;
        for (d = 0; d < t0->ndim; d++) if (d != dim && t->shape[d] != t0->shape[d]) goto bad;
        shape[dim] += t->shape[dim];
        continue;
    bad:
        dl__err(t0->ctx_, DL_ERR_SHAPE, "dl_cat: input %d %s %s does not fit input 0 %s %s: "
                "all dims but dim %d must match", i, dl__sh(t),
                dl__dtype_str(t->dtype), dl__sh(t0), dl__dtype_str(t0->dtype), dim);
        return NULL;
    }
    y = dl__make(t0->dev_, "dl_cat", t0->dtype, t0->ndim, shape, false, NULL);
    if (!y) return NULL;
    dl__strides(shape, t0->ndim, ds);
    for (i = 0; i < n; i++) {
        dl__strides(ts[i]->shape, t0->ndim, ss);
        if (ts[i]->numel)
            DL__BE(t0)->copy_nd(t0->dev_, dl__esize(t0->dtype), t0->ndim, ts[i]->shape,
                               (char *)y->data + off * ds[dim] * (int64_t)dl__esize(t0->dtype), ds,
                               ts[i]->data, ss);
        off += ts[i]->shape[dim];
    }
    if (dl__record(y, &dl__op_cat, n, ts, &node) < 0) return NULL;
    if (node) node->i[0] = dim;
    return dl__done(y, "dl_cat");
}

dl_tensor *dl_stack(int n, dl_tensor *const *ts, int dim)
{
    dl_tensor **u;
    dl_ctx *ctx;
    int i;
    if (!ts || n <= 0) {
        dl__err(NULL, DL_ERR_ARG, "dl_stack: %d tensors%s; it needs at least one", n, ts ? "" : " (ts is NULL)");
        return NULL;
    }
    for (i = 0; i < n; i++) if (!ts[i]) return NULL;
    if (!dl__live("dl_stack", "input 0", ts[0])) return NULL;
    ctx = ts[0]->ctx_;
    for (i = 1; i < n; i++)
        if (!dl__live("dl_stack", "an input", ts[i])) return NULL;
        else if (!dl_same_shape(ts[i], ts[0])) {
            dl__err(ctx, DL_ERR_SHAPE, "dl_stack: input %d %s and input 0 %s: all inputs must have "
                    "the same shape", i, dl__sh(ts[i]), dl__sh(ts[0]));
            return NULL;
        }
    u = (dl_tensor **)dl__halloc(ctx, sizeof(dl_tensor *) * (size_t)n);
    if (!u) { dl__err(ctx, DL_ERR_OOM, "dl_stack: out of memory"); return NULL; }
    if (dim < -(ts[0]->ndim + 1) || dim > ts[0]->ndim) {
        dl__err(ctx, DL_ERR_ARG, "dl_stack: dim %d is out of range for inputs %s (valid: %d..%d, the new "
                "dim counted)", dim, dl__sh(ts[0]), -(ts[0]->ndim + 1), ts[0]->ndim);
        return NULL;
    }
    if (dim < 0) dim += ts[0]->ndim + 1;   /* insert position counts the new dim */
    for (i = 0; i < n; i++) if (!(u[i] = dl_unsqueeze(ts[i], dim))) return NULL;
    return dl__end(ctx, dl_cat(n, u, dim), "dl_stack");
}

/* y = expand(x);  dx = sum_to(g, x.shape) */
static dl_result dl__expand_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__sum_like(g, DL__X);
    return DL_OK;
}
static const dl__op dl__op_expand = {"dl_expand", dl__expand_bwd, 0, 0};

dl_tensor *dl_expand(dl_tensor *t, dl_shape shape)
{
    int64_t st[DL_MAX_DIMS], ss[DL_MAX_DIMS], out[DL_MAX_DIMS];
    int d, nd = shape.ndim;
    dl_tensor *y;
    dl__node *n;
    if (!t) return NULL;
    if (!dl__live("dl_expand", "t", t)) return NULL;
    if (nd < t->ndim || nd > DL_MAX_DIMS) goto bad;
    dl__strides(t->shape, t->ndim, st);
    for (d = 0; d < nd; d++) {
        int it = d - (nd - t->ndim);
        int64_t dt = it >= 0 ? t->shape[it] : 1, want = shape.d[d];
        if (want == -1 && it >= 0) want = dt;
        if (want < 0 || (dt != want && dt != 1)) goto bad;
        out[d] = want;
        ss[d] = (it >= 0 && dt != 1) ? st[it] : 0;
    }
    y = dl__gather_copy("dl_expand", t, nd, out, ss, 0);
    if (!y) return NULL;
    if (dl__record(y, &dl__op_expand, 1, &t, &n) < 0) return NULL;
    return dl__done(y, "dl_expand");
bad:
    dl__err(t->ctx_, DL_ERR_SHAPE, "dl_expand: t %s cannot be broadcast to %s (sizes must match "
            "or be 1, aligned from the right)", dl__sh(t), dl__shp(t->ctx_, &shape));
    return NULL;
}

dl_tensor *dl_sum_to(dl_tensor *t, dl_shape shape)
{
    dl_shape dims;
    int d, lead;
    if (!t) return NULL;
    if (!dl__live("dl_sum_to", "t", t)) return NULL;
    lead = t->ndim - shape.ndim;
    if (lead < 0) goto bad;
    dims.ndim = 0;
    for (d = 0; d < t->ndim; d++) {
        if (d < lead) { dims.d[dims.ndim++] = d; continue; }
        if (shape.d[d - lead] == t->shape[d]) continue;
        if (shape.d[d - lead] != 1) goto bad;
        dims.d[dims.ndim++] = d;
    }
    if (dims.ndim == 0) return dl__end(t->ctx_, t->ndim == shape.ndim ? t : dl_reshape(t, shape), "dl_sum_to");
    return dl__end(t->ctx_, dl_reshape(dl_sum(t, dims, true), shape), "dl_sum_to");
bad:
    dl__err(t->ctx_, DL_ERR_SHAPE, "dl_sum_to: t %s cannot be summed to %s (the target must "
            "broadcast to t's shape)", dl__sh(t), dl__shp(t->ctx_, &shape));
    return NULL;
}

// >>section ops: reductions
/* Reductions run one kernel pass per run of adjacent reduced dims, as
   (outer, reduced, inner) blocks. The result is computed with keepdim and
   viewed without the size-1 dims when keepdim is false. */

static bool dl__red_mask(const char *name, const dl_tensor *t, dl_shape dims, bool *mask)
{
    int i;
    memset(mask, 0, sizeof(bool) * DL_MAX_DIMS);
    if (dims.ndim == 0) { for (i = 0; i < t->ndim; i++) mask[i] = true; return true; }
    if (dims.ndim < 0 || dims.ndim > DL_MAX_DIMS) {
        dl__err(t->ctx_, DL_ERR_ARG, "%s: %d dims given", name, dims.ndim);
        return false;
    }
    for (i = 0; i < dims.ndim; i++) {
        int nd = t->ndim > 0 ? t->ndim : 1;   /* a 0-d tensor takes dim 0 or -1, as PyTorch */
        int d = (int)dims.d[i];
        if (dims.d[i] < -nd || dims.d[i] >= nd) {
            dl__err(t->ctx_, DL_ERR_ARG, "%s: dim %lld is out of range for a tensor of shape %s "
                    "(valid: %d..%d)", name, (long long)dims.d[i], dl__sh(t), -nd, nd - 1);
            return false;
        }
        if (d < 0) d += nd;
        if (mask[d]) {
            dl__err(t->ctx_, DL_ERR_ARG, "%s: dim %d appears twice in dims", name, d);
            return false;
        }
        mask[d] = true;
    }
    if (t->ndim == 0) mask[0] = false;        /* nothing to reduce */
    return true;
}

/* true when the masked dims of x are 0..a-1 and b.. (0 < a < b < ndim)
   with N (the first run's size) and L (the last's) above 1: the backend's
   chan_sum takes such a sum in one call. nCL: N, C, L. */
static bool dl__chan_sum_ok(const dl_tensor *x, const bool *mask, int64_t *nCL)
{
    int a = 0, b, e, nd = x->ndim;
    int64_t N, L;
    while (a < nd && mask[a]) a++;
    for (b = a; b < nd && !mask[b]; b++) {}
    for (e = b; e < nd && mask[e]; e++) {}
    if (x->numel <= 0 || a == 0 || b == a || b == nd || e != nd) return false;
    N = dl__prod(x->shape, a);
    L = dl__prod(x->shape + b, nd - b);
    nCL[0] = N;
    nCL[1] = dl__prod(x->shape + a, b - a);
    nCL[2] = L;
    return N > 1 && L > 1;
}

/* Reduce x over the masked dims into a new keepdim-shaped tensor (no tape). */
static dl_tensor *dl__reduce_raw(const char *name, int rop, dl_tensor *x, const bool *mask)
{
    int64_t shape[DL_MAX_DIMS], nCL[3];
    dl_tensor *cur = x;
    int d;
    for (d = 0; d < x->ndim; d++) shape[d] = x->shape[d];
    if (rop == DL__R_SUM && DL__BE(x)->chan_sum && dl__chan_sum_ok(x, mask, nCL)) {
        for (d = 0; d < x->ndim; d++) if (mask[d]) shape[d] = 1;
        cur = dl__new(x->dev_, name, x->ndim, shape);
        if (cur)
            DL__BE(x)->chan_sum(x->dev_, (float *)cur->data, (const float *)x->data, nCL[0], nCL[1], nCL[2], NULL,
                                NULL, -1, 0);
        return cur;
    }
    d = x->ndim - 1;
    while (d >= 0) {
        int hi, lo;
        int64_t outer, r, inner;
        dl_tensor *y;
        if (!mask[d]) { d--; continue; }
        hi = d;
        while (d >= 0 && mask[d]) d--;
        lo = d + 1;
        outer = dl__prod(shape, lo);
        r = dl__prod(shape + lo, hi - lo + 1);
        inner = dl__prod(shape + hi + 1, x->ndim - hi - 1);
        {
            int k;
            for (k = lo; k <= hi; k++) shape[k] = 1;
        }
        y = dl__new(x->dev_, name, x->ndim, shape);
        if (!y) return NULL;
        DL__BE(x)->reduce(x->dev_, rop, (float *)y->data, (const float *)cur->data, outer, r, inner);
        cur = y;
    }
    if (cur == x) {   /* nothing to reduce: a copy */
        cur = dl__like(name, x);
        if (!cur) return NULL;
        if (x->numel) {
            int64_t st[DL_MAX_DIMS];
            dl__strides(x->shape, x->ndim, st);
            DL__BE(x)->copy_nd(x->dev_, 4, x->ndim, x->shape, cur->data, st, x->data, st);
        }
    }
    return cur;
}

/* keepdim-shaped tensor -> the shape without reduced dims (a plain view) */
static dl_tensor *dl__drop_dims(const char *name, dl_tensor *y, const bool *mask, bool keepdim)
{
    int64_t shape[DL_MAX_DIMS];
    int i, k = 0;
    if (!y || keepdim) return y;
    for (i = 0; i < y->ndim; i++) if (!mask[i]) shape[k++] = y->shape[i];
    return dl__view(name, NULL, y, k, shape);
}

static void dl__keep_shape(const dl__node *n, int64_t *shape)
{
    int i;
    const dl_tensor *x = n->in[0];
    for (i = 0; i < x->ndim; i++) shape[i] = (n->i[0] >> i) & 1 ? 1 : x->shape[i];
}

/* y = sum(x, dims);  dx = expand(reshape(g, keepdim shape), x.shape) */
static dl_result dl__sum_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int64_t ks[DL_MAX_DIMS];
    dl__keep_shape(n, ks);
    gin[0] = dl_expand(dl_reshape(g, dl_shape_make(DL__X->ndim, ks)), dl__shape_of(DL__X));
    return DL_OK;
}
static const dl__op dl__op_sum = {"dl_sum", dl__sum_bwd, 0, 0};

static int64_t dl__mask_bits(const bool *mask, int nd)
{
    int64_t b = 0;
    int i;
    for (i = 0; i < nd; i++) if (mask[i]) b |= (int64_t)1 << i;
    return b;
}

dl_tensor *dl_sum(dl_tensor *t, dl_shape dims, bool keepdim)
{
    bool mask[DL_MAX_DIMS];
    dl_tensor *y;
    dl__node *n;
    if (!t) return NULL;
    if (!dl__live("dl_sum", "t", t) || !dl__f32("dl_sum", "t", t)) return NULL;
    if (!dl__red_mask("dl_sum", t, dims, mask)) return NULL;
    y = dl__drop_dims("dl_sum", dl__reduce_raw("dl_sum", DL__R_SUM, t, mask), mask, keepdim);
    if (!y) return NULL;
    if (dl__record(y, &dl__op_sum, 1, &t, &n) < 0) return NULL;
    if (n) n->i[0] = dl__mask_bits(mask, t->ndim);
    return dl__done(y, "dl_sum");
}

dl_tensor *dl_mean(dl_tensor *t, dl_shape dims, bool keepdim)
{
    bool mask[DL_MAX_DIMS];
    int64_t cnt = 1;
    int i;
    if (!t) return NULL;
    if (!dl__live("dl_mean", "t", t) || !dl__f32("dl_mean", "t", t)) return NULL;
    if (!dl__red_mask("dl_mean", t, dims, mask)) return NULL;
    for (i = 0; i < t->ndim; i++) if (mask[i]) cnt *= t->shape[i];
    return dl__end(t->ctx_, dl_div_scalar(dl_sum(t, dims, keepdim), (float)cnt), "dl_mean");
}

/* y = amax(x, dims);  dx = [x == y] * g / count([x == y])  (ties share the
   gradient evenly, as torch.amax, over one dim or several) */
static dl_result dl__max_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int64_t ks[DL_MAX_DIMS];
    bool mask[DL_MAX_DIMS];
    int i;
    dl_tensor *eq, *cnt, *x = DL__X;
    dl__keep_shape(n, ks);
    for (i = 0; i < x->ndim; i++) mask[i] = (n->i[0] >> i) & 1;
    eq = dl__bmask(x, dl_reshape(DL__Y, dl_shape_make(x->ndim, ks)), DL__B_EQ);
    cnt = eq ? dl__reduce_raw("dl_max", DL__R_SUM, eq, mask) : NULL;
    gin[0] = dl_mul(eq, dl_div(dl_reshape(g, dl_shape_make(x->ndim, ks)), cnt));
    return DL_OK;
}
static const dl__op dl__op_max = {"dl_max", dl__max_bwd, 1 | DL__RD_OUT, 0};

/* false with an error when a dim to reduce has size 0 (max of nothing) */
static bool dl__max_nonempty(const char *name, const dl_tensor *t, const bool *mask)
{
    int i;
    for (i = 0; i < t->ndim; i++)
        if (mask[i] && t->shape[i] == 0) {
            dl__err(t->ctx_, DL_ERR_SHAPE, "%s: cannot reduce dim %d of size 0 of t %s (max of nothing)",
                    name, i, dl__sh(t));
            return false;
        }
    return true;
}

/* dl_max, or with min dl_min as -max(-t) */
static dl_tensor *dl__max(const char *name, dl_tensor *t, dl_shape dims, bool keepdim, bool min)
{
    bool mask[DL_MAX_DIMS];
    dl_tensor *y;
    dl__node *n;
    if (!t) return NULL;
    if (!dl__live(name, "t", t) || !dl__f32(name, "t", t)) return NULL;
    if (!dl__red_mask(name, t, dims, mask) || !dl__max_nonempty(name, t, mask)) return NULL;
    if (min && !(t = dl_neg(t))) return NULL;
    /* the node keeps y, whose data are the keepdim-shaped values, for the tie mask */
    y = dl__drop_dims("dl_max", dl__reduce_raw("dl_max", DL__R_MAX, t, mask), mask, keepdim);
    if (!y) return NULL;
    if (dl__record(y, &dl__op_max, 1, &t, &n) < 0) return NULL;
    if (n) n->i[0] = dl__mask_bits(mask, t->ndim);
    y = dl__check(y, name);
    return dl__end(t->ctx_, min ? dl_neg(y) : y, name);   /* (the negation inside dl_min's span) */
}
dl_tensor *dl_max(dl_tensor *t, dl_shape dims, bool keepdim) { return dl__max("dl_max", t, dims, keepdim, false); }
dl_tensor *dl_min(dl_tensor *t, dl_shape dims, bool keepdim) { return dl__max("dl_min", t, dims, keepdim, true); }

/* y, idx = max(x, dim);  dx = onehot(idx) * g  (the whole gradient to the
   index torch.max(x, dim) returns: the first largest) */
static dl_result dl__max_dim_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int64_t ks[DL_MAX_DIMS];
    dl_tensor *x = DL__X, *mask;
    int dim = (int)n->i[1];
    dl__keep_shape(n, ks);
    mask = dl__new(x->dev_, "dl_max_dim", x->ndim, x->shape);
    if (!mask) return DL_ERR_OOM;
    if (x->numel)   /* a 0-d x: one element, index 0 */
        DL__BE(x)->onehot(x->dev_, (float *)mask->data, (const int64_t *)n->saved[0]->data,
                          dl__prod(x->shape, dim), x->ndim ? x->shape[dim] : 1,
                          dl__prod(x->shape + dim + 1, x->ndim - dim - 1));
    gin[0] = dl_mul(mask, dl_reshape(g, dl_shape_make(x->ndim, ks)));
    return DL_OK;
}
static const dl__op dl__op_max_dim = {"dl_max_dim", dl__max_dim_bwd, 0, 0};   /* reads x's shape only, and its own indices */

/* dl_max_dim, or with min dl_min_dim as -max(-t) (the same indices) */
static dl_tensor *dl__max_dim(const char *name, dl_tensor *t, int dim, bool keepdim, dl_tensor **indices, bool min)
{
    bool mask[DL_MAX_DIMS];
    dl_tensor *y, *idx;
    dl__node *n;
    if (indices) *indices = NULL;
    if (!t) return NULL;
    if (!dl__live(name, "t", t) || !dl__f32(name, "t", t)) return NULL;
    if (!dl__red_mask(name, t, DL_DIMS(dim), mask) || !dl__max_nonempty(name, t, mask)) return NULL;
    if (min && !(t = dl_neg(t))) return NULL;
    dim = t->ndim == 0 ? 0 : dim < 0 ? dim + t->ndim : dim;
    y = dl__reduce_raw("dl_max_dim", DL__R_MAX, t, mask);
    idx = y ? dl__make(t->dev_, "dl_max_dim", DL_DTYPE_I64, y->ndim, y->shape, false, NULL) : NULL;
    if (!idx) return NULL;
    if (t->numel)   /* a 0-d t: one element, index 0 */
        DL__BE(t)->argmax(t->dev_, (int64_t *)idx->data, (const float *)t->data, dl__prod(t->shape, dim),
                          t->ndim ? t->shape[dim] : 1, dl__prod(t->shape + dim + 1, t->ndim - dim - 1));
    y = dl__drop_dims("dl_max_dim", y, mask, keepdim);
    if (!y || dl__record(y, &dl__op_max_dim, 1, &t, &n) < 0) return NULL;
    if (n) {
        n->i[0] = dl__mask_bits(mask, t->ndim);
        n->i[1] = dim;
        n->saved[0] = idx;
        n->nsaved = 1;
    }
    /* the caller's indices are a copy where the backward keeps idx: a
       write into them must not move the gradient (PyTorch's version check) */
    if (indices) *indices = dl__drop_dims("dl_max_dim", n ? dl__clone(name, idx, false) : idx, mask, keepdim);
    y = dl__check(y, name);
    return dl__end(t->ctx_, min ? dl_neg(y) : y, name);
}
dl_tensor *dl_max_dim(dl_tensor *t, int dim, bool keepdim, dl_tensor **indices)
{
    return dl__max_dim("dl_max_dim", t, dim, keepdim, indices, false);
}
dl_tensor *dl_min_dim(dl_tensor *t, int dim, bool keepdim, dl_tensor **indices)
{
    return dl__max_dim("dl_min_dim", t, dim, keepdim, indices, true);
}

dl_tensor *dl_var(dl_tensor *t, dl_shape dims, int correction, bool keepdim)
{
    bool mask[DL_MAX_DIMS];
    int64_t cnt = 1;
    int i;
    dl_tensor *d;
    if (!t) return NULL;
    if (!dl__live("dl_var", "t", t) || !dl__f32("dl_var", "t", t)) return NULL;
    if (!dl__red_mask("dl_var", t, dims, mask)) return NULL;
    for (i = 0; i < t->ndim; i++) if (mask[i]) cnt *= t->shape[i];
    d = dl_sub(t, dl_mean(t, dims, true));
    return dl__end(t->ctx_, dl_div_scalar(dl_sum(dl_mul(d, d), dims, keepdim),
                                          (float)(cnt - correction > 0 ? cnt - correction : 0)), "dl_var");
}

dl_tensor *dl_argmax(dl_tensor *t, int dim, bool keepdim)
{
    dl_tensor *y;
    int64_t shape[DL_MAX_DIMS];
    int i, k = 0;
    if (!t) return NULL;
    if (!dl__live("dl_argmax", "t", t) || !dl__f32("dl_argmax", "t", t)) return NULL;
    if (!dl__dim("dl_argmax", t, &dim, t->ndim ? t->ndim : 1)) return NULL;   /* 0-d: dim 0 or -1 */
    if (t->ndim == 0) {   /* the one element: index 0, shape () */
        y = dl__make(t->dev_, "dl_argmax", DL_DTYPE_I64, 0, shape, false, NULL);
        if (y) DL__BE(t)->argmax(t->dev_, (int64_t *)y->data, (const float *)t->data, 1, 1, 1);
        return dl__done(y, "dl_argmax");
    }
    if (t->shape[dim] == 0) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "dl_argmax: dim %d of t %s has size 0", dim, dl__sh(t));
        return NULL;
    }
    for (i = 0; i < t->ndim; i++)
        if (i != dim) shape[k++] = t->shape[i];
        else if (keepdim) shape[k++] = 1;
    y = dl__make(t->dev_, "dl_argmax", DL_DTYPE_I64, k, shape, false, NULL);
    if (!y) return NULL;
    DL__BE(t)->argmax(t->dev_, (int64_t *)y->data, (const float *)t->data, dl__prod(t->shape, dim),
                     t->shape[dim], dl__prod(t->shape + dim + 1, t->ndim - dim - 1));
    return dl__done(y, "dl_argmax");
}

// >>section ops: matmul and softmax
/* dl__mm computes op(a) @ op(b) over broadcast batch dims, where op
   transposes the last two dims when asked. Keeping the transposes as flags
   lets each backward product be a single GEMM with no copies:
     C = op(A) op(B):  dA = g op(B)^T  (or op(B) g^T when A is transposed)
                       dB = op(A)^T g  (or g^T op(A) when B is transposed). */

static dl_tensor *dl__expand_raw(dl_tensor *t, int nd, const int64_t *shape)
{
    int64_t st[DL_MAX_DIMS], ss[DL_MAX_DIMS];
    int d;
    dl__strides(t->shape, t->ndim, st);
    for (d = 0; d < nd; d++) {
        int it = d - (nd - t->ndim);
        ss[d] = (it >= 0 && t->shape[it] != 1) ? st[it] : 0;
    }
    return dl__gather_copy("dl_matmul", t, nd, shape, ss, 0);
}

static dl_tensor *dl__mm(dl_tensor *a, dl_tensor *b, bool ta, bool tb);

static dl_result dl__mm_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *a = DL__A, *b = DL__B;
    bool ta = n->i[0] != 0, tb = n->i[1] != 0;
    if (dl__need(n, 0))
        gin[0] = dl__sum_like(ta ? dl__mm(b, g, tb, true) : dl__mm(g, b, false, !tb), a);
    if (dl__need(n, 1))
        gin[1] = dl__sum_like(tb ? dl__mm(g, a, true, ta) : dl__mm(a, g, !ta, false), b);
    return DL_OK;
}
static const dl__op dl__op_mm = {"dl_matmul", dl__mm_bwd, 0, 3};

static dl_tensor *dl__mm(dl_tensor *a, dl_tensor *b, bool ta, bool tb)
{
    int na, nb, nd, d;
    int64_t M, K, K2, N, bshape[DL_MAX_DIMS], batch, batchA, batchB;
    dl_tensor *y, *in[2];
    dl__node *n;
    const dl__backend *k;
    if (!a || !b) return NULL;
    if (a->ctx_->prof) dl__prof_begin(a->ctx_, a->dev_, "dl_matmul", false);   /* (dl_linear, backward rules) */
    na = a->ndim; nb = b->ndim;
    M = ta ? a->shape[na - 1] : a->shape[na - 2];
    K = ta ? a->shape[na - 2] : a->shape[na - 1];
    K2 = tb ? b->shape[nb - 1] : b->shape[nb - 2];
    N = tb ? b->shape[nb - 2] : b->shape[nb - 1];
    if (K != K2) {
        dl__err(a->ctx_, DL_ERR_SHAPE, "dl_matmul: a %s x b %s: a.shape[%d]=%lld must equal "
                "b.shape[%d]=%lld", dl__sh(a), dl__sh(b), ta ? na - 2 : na - 1, (long long)K,
                tb ? nb - 1 : nb - 2, (long long)K2);
        return NULL;
    }
    nd = (na > nb ? na : nb) - 2;
    for (d = 0; d < nd; d++) {
        int ia = d - (nd - (na - 2)), ib = d - (nd - (nb - 2));
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            dl__err(a->ctx_, DL_ERR_SHAPE, "dl_matmul: a %s x b %s: batch dims do not broadcast "
                    "(%lld vs %lld at batch dim %d)", dl__sh(a), dl__sh(b), (long long)da,
                    (long long)db, d);
            return NULL;
        }
        bshape[d] = da == 1 ? db : da;
    }
    bshape[nd] = M;
    bshape[nd + 1] = N;
    y = dl__new(a->dev_, "dl_matmul", nd + 2, bshape);
    if (!y) return NULL;
    batch = dl__prod(bshape, nd);
    batchA = dl__prod(a->shape, na - 2);
    batchB = dl__prod(b->shape, nb - 2);
    k = DL__BE(a);
    if (y->numel == 0) {
    } else if (K == 0) {
        k->fill(a->dev_, (float *)y->data, y->numel, 0.0f);
    } else if (batchB == 1 && !ta && batchA == batch) {
        /* fold a's batch into its rows: one GEMM */
        k->gemm(a->dev_, false, tb, batch * M, N, K, 1.0f, (const float *)a->data, K, 0,
                (const float *)b->data, tb ? K : N, 0, 0.0f, (float *)y->data, N, 0, 1);
    } else {
        int64_t sa[DL_MAX_DIMS], sb[DL_MAX_DIMS];
        dl_tensor *A = a, *B = b;
        memcpy(sa, bshape, sizeof(int64_t) * (size_t)nd);
        memcpy(sb, bshape, sizeof(int64_t) * (size_t)nd);
        sa[nd] = a->shape[na - 2]; sa[nd + 1] = a->shape[na - 1];
        sb[nd] = b->shape[nb - 2]; sb[nd + 1] = b->shape[nb - 1];
        if (batchA != batch && !(A = dl__expand_raw(a, nd + 2, sa))) return NULL;
        if (batchB != batch && !(B = dl__expand_raw(b, nd + 2, sb))) return NULL;
        k->gemm(a->dev_, ta, tb, M, N, K, 1.0f, (const float *)A->data, ta ? M : K, M * K,
                (const float *)B->data, tb ? K : N, K * N, 0.0f, (float *)y->data, N, M * N, batch);
    }
    in[0] = a;
    in[1] = b;
    if (dl__record(y, &dl__op_mm, 2, in, &n) < 0) return NULL;
    if (n) { n->i[0] = ta; n->i[1] = tb; }
    return dl__done(y, "dl_matmul");
}

dl_tensor *dl_matmul(dl_tensor *a, dl_tensor *b)
{
    bool va, vb;
    dl_tensor *y;
    if (!a || !b) return NULL;
    if (!dl__live("dl_matmul", "a", a) || !dl__live("dl_matmul", "b", b)) return NULL;
    if (!dl__pair("dl_matmul", a, b) || !dl__f32("dl_matmul", "a", a) || !dl__f32("dl_matmul", "b", b)) return NULL;
    if (a->ndim == 0 || b->ndim == 0) {
        dl__err(a->ctx_, DL_ERR_SHAPE, "dl_matmul: a %s x b %s: both operands need at least 1 dim",
                dl__sh(a), dl__sh(b));
        return NULL;
    }
    va = a->ndim == 1;
    vb = b->ndim == 1;
    if (va) a = dl_unsqueeze(a, 0);
    if (vb) b = dl_unsqueeze(b, 1);
    y = dl__mm(a, b, false, false);
    if (va) y = dl_squeeze(y, -2);
    if (vb) y = dl_squeeze(y, -1);
    return y;
}

/* x (*,in)  w (out,in)  b (out)  ->  y (*,out) = x w^T + b */
dl_tensor *dl_linear(dl_tensor *x, dl_tensor *w, dl_tensor *b)
{
    static const char *op = "dl_linear";
    dl_tensor *y;
    if (!x || !w) return NULL;
    if (!dl__live(op, "x", x) || !dl__live(op, "w", w) || (b && !dl__live(op, "b", b))) return NULL;
    if (!dl__pair(op, x, w) || (b && !dl__pair(op, x, b))) return NULL;
    if (!dl__f32(op, "x", x) || !dl__f32(op, "w", w) || (b && !dl__f32(op, "b", b))) return NULL;
    if (w->ndim != 2) {
        dl__err(x->ctx_, DL_ERR_SHAPE, "%s: w %s must be (out_features, in_features)", op, dl__sh(w));
        return NULL;
    }
    if (x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1]) {
        dl__err(x->ctx_, DL_ERR_SHAPE, "%s: x %s: its last dim must equal in_features = w.shape[1] "
                "= %lld (w %s)", op, dl__sh(x), (long long)w->shape[1], dl__sh(w));
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) {
        dl__err(x->ctx_, DL_ERR_SHAPE, "%s: b %s must be (out_features) = (%lld)", op, dl__sh(b),
                (long long)w->shape[0]);
        return NULL;
    }
    /* x w^T as one GEMM with w transposed in place: no copy of w per call */
    y = x->ndim >= 2 ? dl__mm(x, w, false, true) : dl_matmul(x, dl_transpose(w, 0, 1));
    return dl__end(x->ctx_, b ? dl_add(y, b) : y, op);
}

/* y = act(x + b), x (..., cols), b (cols), act DL__U_RELU, SIGMOID or TANH:
   a Linear's bias and its activation as one node, one pass each way where
   the backend fuses them (dl__backend.bias_act: CUDA), with the values and
   bits of dl_add then the activation (dl__act_grad from the output).
   Node: in = (x, b), i[0] = act; named after the activation. */
static dl_result dl__bias_act_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin);
static const dl__op dl__op_bact_relu = {"dl_relu", dl__bias_act_bwd, DL__RD_OUT, 0};
static const dl__op dl__op_bact_sigmoid = {"dl_sigmoid", dl__bias_act_bwd, DL__RD_OUT, 0};
static const dl__op dl__op_bact_tanh = {"dl_tanh", dl__bias_act_bwd, DL__RD_OUT, 0};
static dl_result dl__bias_act_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int act = (int)n->i[0];
    dl_tensor *y = n->out, *b = n->in[1], *gx;
    int64_t cols = b->numel, rows = cols ? y->numel / cols : 0;
    if (!dl__grad_on(g->ctx_) && dl__need(n, 1) &&
        DL__BE(y)->bias_act_bwd(y->dev_, NULL, NULL, NULL, NULL, rows, cols, act)) {
        dl_tensor *db = dl__like(n->op->name, b);   /* the mask and the bias's sum in one pass */
        if (!(gx = dl__like(n->op->name, y)) || !db) return DL_ERR_OOM;
        DL__BE(y)->bias_act_bwd(y->dev_, (float *)gx->data, (float *)db->data, (const float *)g->data,
                                (const float *)y->data, rows, cols, act);
        gin[0] = dl__need(n, 0) ? gx : NULL;
        gin[1] = db;
        return dl__dev_check(y->dev_, n->op->name);
    }
    if (!(gx = dl__act_grad(g, y, act))) return g->ctx_->err;
    if (dl__need(n, 0)) gin[0] = gx;
    if (dl__need(n, 1)) gin[1] = dl__sum_like(gx, b);
    return DL_OK;
}

/* x, b: checked by the caller (dl__linear_act_ok) */
static dl_tensor *dl__bias_act(dl_tensor *x, dl_tensor *b, int act)
{
    const dl__op *dop = act == DL__U_RELU ? &dl__op_bact_relu : act == DL__U_SIGMOID ? &dl__op_bact_sigmoid
                                                                                     : &dl__op_bact_tanh;
    dl_tensor *y, *in[2];
    dl__node *n;
    if (!x || !dl__live(dop->name, "x", x)) return NULL;
    if (!(y = dl__like(dop->name, x))) return NULL;
    DL__BE(x)->bias_act(x->dev_, (float *)y->data, (const float *)x->data, (const float *)b->data,
                        b->numel ? x->numel / b->numel : 0, b->numel, act);
    in[0] = x;
    in[1] = b;
    if (dl__record(y, dop, 2, in, &n) < 0) return NULL;
    if (n) n->i[0] = act;
    return dl__done(y, dop->name);
}

/* y = softmax(x);      dx = y * (g - sum(g * y, dim))
   y = log_softmax(x);  dx = g - exp(y) * sum(g, dim) */
static dl_result dl__softmax_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int dim = (int)n->i[0];
    gin[0] = dl_mul(DL__Y, dl_sub(g, dl_sum(dl_mul(g, DL__Y), dl__dims1(dim), true)));
    return DL_OK;
}
static dl_result dl__log_softmax_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int dim = (int)n->i[0];
    gin[0] = dl_sub(g, dl_mul(dl_exp(DL__Y), dl_sum(g, dl__dims1(dim), true)));
    return DL_OK;
}
static const dl__op dl__op_softmax = {"dl_softmax", dl__softmax_bwd, DL__RD_OUT, 0};
static const dl__op dl__op_log_softmax = {"dl_log_softmax", dl__log_softmax_bwd, DL__RD_OUT, 0};

static dl_tensor *dl__softmax(const char *name, const dl__op *op, bool log, dl_tensor *t, int dim)
{
    dl_tensor *y;
    dl__node *n;
    bool scalar;
    if (!t) return NULL;
    if (!dl__live(name, "t", t) || !dl__f32(name, "t", t)) return NULL;
    if (!dl__dim(name, t, &dim, t->ndim ? t->ndim : 1)) return NULL;   /* 0-d: dim 0 or -1 */
    scalar = t->ndim == 0;
    if (scalar) t = dl_reshape(t, dl__dims1(1));   /* as PyTorch: a scalar is one class ... */
    y = t ? dl__like(name, t) : NULL;
    if (!y) return NULL;
    if (y->numel)
        DL__BE(t)->softmax(t->dev_, log, (float *)y->data, (const float *)t->data,
                          dl__prod(t->shape, dim), t->shape[dim],
                          dl__prod(t->shape + dim + 1, t->ndim - dim - 1));
    if (dl__record(y, op, 1, &t, &n) < 0) return NULL;
    if (n) n->i[0] = dim;
    y = dl__check(y, name);
    return dl__end(t->ctx_, scalar ? dl_reshape(y, dl_shape_make(0, NULL)) : y, name);   /* ... and the result is 0-d */
}

dl_tensor *dl_softmax(dl_tensor *t, int dim) { return dl__softmax("dl_softmax", &dl__op_softmax, false, t, dim); }
dl_tensor *dl_log_softmax(dl_tensor *t, int dim) { return dl__softmax("dl_log_softmax", &dl__op_log_softmax, true, t, dim); }

// >>section ops: normalization, dropout, losses
/* Everything here but binary_cross_entropy_with_logits is a composite of
   differentiable dl.h ops, so gradients (and gradients of gradients) come
   from their rules. The non-differentiable pieces (class one-hot masks from
   integer targets, dropout masks) come from a small kernel table of their
   own, dispatched per device like dl__K, so a GPU backend can supply them.
   Batch and layer norm are fused ops; so are cross entropy and nll_loss on
   a backend with class_loss (CUDA's: 13 launches a step fewer), each with
   a backward written in dl.h ops for create_graph. */

/* ---------------------------------------------------------------- helpers */

/* An optional per-channel / per-feature tensor: live, same context and
   device as x, float32, shape exactly `want`. */
static bool dl__nn_param(const char *op, const char *arg, const dl_tensor *t, const dl_tensor *x,
                         const dl_shape *want, const char *rule)
{
    dl_shape s;
    if (!dl__live(op, arg, t) || !dl__pair(op, x, t) || !dl__f32(op, arg, t)) return false;
    s = dl__shape_of(t);
    if (s.ndim != want->ndim ||
        (s.ndim && memcmp(s.d, want->d, sizeof(int64_t) * (size_t)s.ndim) != 0)) {
        dl__err(x->ctx_, DL_ERR_SHAPE, "%s: %s %s must have shape %s (%s of x %s)", op, arg,
                dl__sh(t), dl__shp(x->ctx_, want), rule, dl__sh(x));
        return false;
    }
    return true;
}

/* t (C) viewed as (1,C,1,...) to broadcast against an nd-dim x */
static dl_tensor *dl__nn_chan(dl_tensor *t, int nd)
{
    int64_t s[DL_MAX_DIMS];
    int i;
    if (!t) return NULL;
    for (i = 0; i < nd; i++) s[i] = 1;
    s[1] = t->shape[0];
    return dl_reshape(t, dl_shape_make(nd, s));
}

/* ---------------------------------------------------------- normalization */

/* Batch and layer norm are single ops with fused kernels (the statistics in
   one pass, the normalization in another; the backward in two). Under
   create_graph their backward rule is written with dl.h ops instead, from x
   itself (the statistics recomputed), so gradients of any order stay
   available. Node: in = (x, w, b), saved = (mean, invstd); i[0]: training
   (batch norm) or normalized dims (layer norm); f[0]: eps. */

/* keepdim-shaped mean and invstd of x over dims, as differentiable ops */
static void dl__norm_stats_graph(dl_tensor *x, dl_shape dims, float eps, dl_tensor **mean,
                                 dl_tensor **invstd)
{
    dl_tensor *d;
    *mean = dl_mean(x, dims, true);
    d = dl_sub(x, *mean);
    *invstd = dl_pow(dl_add_scalar(dl_mean(dl_mul(d, d), dims, true), eps), -0.5f);
}

/* x (N,C,...): batch norm's dims 0, 2, 3, ... */
static dl_shape dl__bn_dims(const dl_tensor *x)
{
    dl_shape dims = dl_shape_make(x->ndim - 1, NULL);
    int i;
    dims.d[0] = 0;
    for (i = 2; i < x->ndim; i++) dims.d[i - 1] = i;
    return dims;
}

/* dx = invstd (gw - mean(gw) - xhat mean(gw xhat)) (training; eval: gw invstd),
   gw = g w; dw = sum(g xhat), db = sum(g); with dl.h ops (create_graph) */
static dl_result dl__bn_bwd_graph(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *x = n->in[0], *w = n->in[1], *mean, *invstd, *xhat, *gw;
    dl_shape dims = dl__bn_dims(x);
    bool train = n->i[0] != 0;
    if (train) dl__norm_stats_graph(x, dims, n->f[0], &mean, &invstd);
    else {
        mean = dl__nn_chan(n->saved[0], x->ndim);
        invstd = dl__nn_chan(n->saved[1], x->ndim);
    }
    xhat = dl_mul(dl_sub(x, mean), invstd);
    gw = w ? dl_mul(g, dl__nn_chan(w, x->ndim)) : g;
    if (dl__need(n, 0)) {
        if (train)
            gin[0] = dl_mul(invstd, dl_sub(dl_sub(gw, dl_mean(gw, dims, true)),
                                           dl_mul(xhat, dl_mean(dl_mul(gw, xhat), dims, true))));
        else gin[0] = dl_mul(gw, invstd);
    }
    if (dl__need(n, 1)) gin[1] = dl_sum(dl_mul(g, xhat), dims, false);
    if (dl__need(n, 2)) gin[2] = dl_sum(g, dims, false);
    return DL_OK;
}

static dl_result dl__bn_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin);
static dl_tensor *dl__unpool(dl_tensor *g, dl_tensor *idx, int ndim, const int64_t *xshape);
static const dl__op dl__op_bn = {"dl_batch_norm", dl__bn_bwd, 3, 0};
static const dl__op dl__op_bn_relu = {"dl_batch_norm", dl__bn_bwd, 3 | DL__RD_OUT, 0};   /* + ReLU: reads its output */
/* relu(batch_norm(x) + r): in[3] = r, whose gradient is the ReLU's masked g */
static const dl__op dl__op_bn_add_relu = {"dl_batch_norm", dl__bn_bwd, 3 | DL__RD_OUT, 0};
/* max_pool2d(relu(batch_norm(x)), 2x2, stride 2): out the pooled output, saved[2] the pool's indices */
static const dl__op dl__op_bn_relu_pool = {"dl_batch_norm", dl__bn_bwd, 3 | DL__RD_OUT, 0};
static dl_result dl__bn_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *x = n->in[0], *w = n->in[1];
    int64_t N = x->shape[0], C = x->shape[1], L = (N * C) != 0 ? x->numel / (N * C) : 0;
    dl_tensor *dx = NULL, *dw = NULL, *db = NULL, *gm = NULL;
    bool add = n->op == &dl__op_bn_add_relu, pool = n->op == &dl__op_bn_relu_pool;
    bool relu = add || pool || n->op == &dl__op_bn_relu;
    if (dl__grad_on(x->ctx_)) {   /* the ReLU's backward as dl__relu_bwd's, from its output */
        if (relu && !(g = dl__act_grad(g, n->out, DL__U_RELU))) return x->ctx_->err;
        /* (pooled: masked where the pool took it, then unpooled: the same values) */
        if (pool && !(g = dl__unpool(g, n->saved[2], x->ndim, x->shape))) return x->ctx_->err;
        if (add && dl__need(n, 3)) gin[3] = g;
        return dl__bn_bwd_graph(n, g, gin);
    }
    if (add && dl__need(n, 3)) {   /* the residual's gradient: g masked, in the backward's pass */
        if (!dl__need(n, 0) && !dl__need(n, 1) && !dl__need(n, 2)) {
            gin[3] = dl__act_grad(g, n->out, DL__U_RELU);
            return gin[3] ? DL_OK : x->ctx_->err;
        }
        if (!(gm = dl__like("dl_batch_norm", x))) return DL_ERR_OOM;
    }
    if (dl__need(n, 0) && !(dx = dl__like("dl_batch_norm", x))) return DL_ERR_OOM;
    if (dl__need(n, 1) && !(dw = dl__like("dl_batch_norm", w))) return DL_ERR_OOM;
    if (dl__need(n, 2) && !(db = dl__like("dl_batch_norm", n->in[2]))) return DL_ERR_OOM;
    if (pool)
        DL__BE(x)->bn_pool_bwd(x->dev_, dx ? (float *)dx->data : NULL, dw ? (float *)dw->data : NULL,
                               db ? (float *)db->data : NULL, (const float *)g->data, (const float *)x->data,
                               (const float *)n->saved[0]->data, (const float *)n->saved[1]->data,
                               w ? (const float *)w->data : NULL, N, C, x->shape[2], x->shape[3], n->i[0] != 0,
                               (const float *)n->out->data, (const int64_t *)n->saved[2]->data);
    else
        DL__BE(x)->bn_backward(x->dev_, dx ? (float *)dx->data : NULL, dw ? (float *)dw->data : NULL,
                               db ? (float *)db->data : NULL, (const float *)g->data,
                               (const float *)x->data, (const float *)n->saved[0]->data,
                               (const float *)n->saved[1]->data, w ? (const float *)w->data : NULL,
                               N, C, L, n->i[0] != 0, relu ? (const float *)n->out->data : NULL,
                               gm ? (float *)gm->data : NULL);
    gin[0] = dx ? dl__check(dx, "dl_batch_norm") : NULL;
    gin[1] = dw;
    gin[2] = db;
    if (add) gin[3] = gm;
    return dl__dev_check(x->dev_, "dl_batch_norm");
}

/* layer norm over the last k dims */
static dl_result dl__ln_bwd_graph(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *x = n->in[0], *w = n->in[1], *mean, *invstd, *xhat, *gw;
    int k = (int)n->i[0], i;
    dl_shape dims = dl_shape_make(k, NULL), wshape;
    for (i = 0; i < k; i++) dims.d[i] = x->ndim - k + i;
    wshape = dl_shape_make(k, x->shape + x->ndim - k);
    dl__norm_stats_graph(x, dims, n->f[0], &mean, &invstd);
    xhat = dl_mul(dl_sub(x, mean), invstd);
    gw = w ? dl_mul(g, w) : g;
    if (dl__need(n, 0))
        gin[0] = dl_mul(invstd, dl_sub(dl_sub(gw, dl_mean(gw, dims, true)),
                                       dl_mul(xhat, dl_mean(dl_mul(gw, xhat), dims, true))));
    if (dl__need(n, 1)) gin[1] = dl_sum_to(dl_mul(g, xhat), wshape);
    if (dl__need(n, 2)) gin[2] = dl_sum_to(g, wshape);
    return DL_OK;
}

static dl_result dl__ln_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *x = n->in[0], *w = n->in[1], *dx = NULL, *dw = NULL, *db = NULL;
    int64_t cols = dl__prod(x->shape + x->ndim - n->i[0], (int)n->i[0]);
    int64_t rows = cols ? x->numel / cols : 0;
    if (dl__grad_on(x->ctx_)) return dl__ln_bwd_graph(n, g, gin);
    if (dl__need(n, 0) && !(dx = dl__like("dl_layer_norm", x))) return DL_ERR_OOM;
    if (dl__need(n, 1) && !(dw = dl__like("dl_layer_norm", w))) return DL_ERR_OOM;
    if (dl__need(n, 2) && !(db = dl__like("dl_layer_norm", n->in[2]))) return DL_ERR_OOM;
    DL__BE(x)->ln_backward(x->dev_, dx ? (float *)dx->data : NULL, dw ? (float *)dw->data : NULL,
                           db ? (float *)db->data : NULL, (const float *)g->data,
                           (const float *)x->data, (const float *)n->saved[0]->data,
                           (const float *)n->saved[1]->data, w ? (const float *)w->data : NULL,
                           rows, cols);
    gin[0] = dx;
    gin[1] = dw;
    gin[2] = db;
    return dl__dev_check(x->dev_, "dl_layer_norm");
}
static const dl__op dl__op_ln = {"dl_layer_norm", dl__ln_bwd, 3, 0};

/* records the normalization node (idx: a fused max pool's indices, or NULL) */
static dl_tensor *dl__norm_record(const char *op, const dl__op *dop, dl_tensor *y, dl_tensor *x,
                                  dl_tensor *w, dl_tensor *b, dl_tensor *r, dl_tensor *mean,
                                  dl_tensor *invstd, dl_tensor *idx, int64_t attr, float eps)
{
    dl_tensor *in[4];
    dl__node *n;
    in[0] = x; in[1] = w; in[2] = b; in[3] = r;
    if (dl__record(y, dop, r ? 4 : 3, in, &n) < 0) return NULL;
    if (n) {
        n->saved[0] = mean;
        n->saved[1] = invstd;
        n->saved[2] = idx;
        n->nsaved = idx ? 3 : 2;
        n->i[0] = attr;
        n->f[0] = eps;
    }
    (void)op;
    return y;
}

/* dl_batch_norm; nbt: the module's num_batches_tracked, += 1 in training
   (in bn_stats's pass where it shares x's device: no launch of its own);
   relu: relu(batch_norm(...)) as one op (a Sequential's BatchNorm then
   ReLU: dl__seq_fwd), the ReLU with the apply and its mask with the
   backward, the values and bits of the two ops; r (with relu; checked by
   the caller: x's shape, device and dtype): relu(batch_norm(...) + r) as
   one op, a residual block's tail (dl_module_forward_add_relu); pool (with
   relu, no r; checked by the caller, dl__seq_fwd: x (N, C, H, W), H and W
   even, the backend has bn_pool): then a 2x2, stride-2 max pool as one op
   too (a Sequential's BatchNorm2d, ReLU, MaxPool2d(2, 2) on a GPU) */
static dl_tensor *dl__batch_norm(dl_tensor *x, dl_tensor *running_mean, dl_tensor *running_var,
                                 dl_tensor *weight, dl_tensor *bias, bool training, float momentum,
                                 float eps, dl_tensor *nbt, bool relu, dl_tensor *r, bool pool)
{
    static const char *op = "dl_batch_norm";
    dl_ctx *ctx;
    dl_shape cs;
    dl_tensor *y, *mean = NULL, *invstd = NULL, *var = NULL;
    int64_t C, cnt;
    if (!x) return NULL;
    if (!dl__live(op, "x", x) || !dl__f32(op, "x", x)) return NULL;
    ctx = x->ctx_;
    if (x->ndim < 2) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: x %s needs at least 2 dims, (N,C) or (N,C,d1,...)", op,
                dl__sh(x));
        return NULL;
    }
    C = x->shape[1];
    cs = dl__dims1(C);
    if ((running_mean == NULL) != (running_var == NULL)) {
        dl__err(ctx, DL_ERR_ARG, "%s: give both running_mean and running_var, or neither "
                "(running_%s is NULL)", op, running_mean ? "var" : "mean");
        return NULL;
    }
    if (!training && !running_mean) {
        dl__err(ctx, DL_ERR_ARG, "%s: eval mode (training false) normalizes with running_mean and "
                "running_var, which are NULL", op);
        return NULL;
    }
    if (running_mean && (!dl__nn_param(op, "running_mean", running_mean, x, &cs, "one value per channel, dim 1") ||
                         !dl__nn_param(op, "running_var", running_var, x, &cs, "one value per channel, dim 1")))
        return NULL;
    if (weight && !dl__nn_param(op, "weight", weight, x, &cs, "one value per channel, dim 1")) return NULL;
    if (bias && !dl__nn_param(op, "bias", bias, x, &cs, "one value per channel, dim 1")) return NULL;
    if (!(eps >= 0.0f)) {
        dl__err(ctx, DL_ERR_ARG, "%s: eps=%g must be >= 0", op, (double)eps);
        return NULL;
    }
    cnt = C ? x->numel / C : 0;
    if (training) {
        if (running_mean && (running_mean->requires_grad || running_var->requires_grad)) {
            dl__err(ctx, DL_ERR_ARG, "%s: running_mean/running_var are updated in place in "
                    "training mode and must not require grad", op);
            return NULL;
        }
        if (cnt <= 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: training needs more than 1 value per channel; x %s "
                    "has %lld (use eval mode, or a larger batch)", op, dl__sh(x), (long long)cnt);
            return NULL;
        }
    }
    if (!training && (running_mean->requires_grad || running_var->requires_grad)) {
        /* gradients into the running statistics themselves: the composite form */
        y = dl_div(dl_sub(x, dl__nn_chan(running_mean, x->ndim)),
                   dl_sqrt(dl_add_scalar(dl__nn_chan(running_var, x->ndim), eps)));
        if (weight) y = dl_mul(y, dl__nn_chan(weight, x->ndim));
        if (bias) y = dl_add(y, dl__nn_chan(bias, x->ndim));
        if (r) y = dl_add(y, r);
        if (pool) {
            dl_pool_desc pd = dl_pool_desc_make(2, 2, 0, false, true);
            return dl__end(ctx, dl_max_pool2d(dl_relu(y), &pd), op);
        }
        return dl__end(ctx, relu ? dl_relu(y) : y, op);
    }
    {
        int64_t N = x->shape[0], L = (N * C) != 0 ? x->numel / (N * C) : 0;
        dl__dev *d = x->dev_;
        dl_tensor *idx = NULL;
        int64_t ps[4];
        mean = dl__new(d, op, 1, &C);
        invstd = dl__new(d, op, 1, &C);
        if (pool) {   /* (N, C, H/2, W/2), and the indices where a backward may need them */
            ps[0] = N; ps[1] = C; ps[2] = x->shape[2] / 2; ps[3] = x->shape[3] / 2;
            y = dl__new(d, op, 4, ps);
            if (y && dl__grad_on(ctx) && (x->requires_grad || (weight && weight->requires_grad) ||
                                          (bias && bias->requires_grad)) &&
                !(idx = dl__make(d, op, DL_DTYPE_I64, 4, ps, false, NULL)))
                return NULL;
        } else y = dl__like(op, x);
        if (!mean || !invstd || !y) return NULL;
        if (training) {
            /* the running statistics r = (1-m) r + m stat in the same pass,
               in place, no history; var unbiased: * n/(n-1) */
            dl__bn_running rs;
            var = dl__new(d, op, 1, &C);
            if (!var) return NULL;
            rs.rm = running_mean ? (float *)running_mean->data : NULL;
            rs.rv = running_var ? (float *)running_var->data : NULL;
            rs.nbt = nbt && nbt->dev_ == d ? (int64_t *)nbt->data : NULL;
            rs.keep = 1.0f - momentum;
            rs.mom = momentum;
            rs.vmom = (float)((double)momentum * (double)cnt / (double)(cnt - 1));
            if (nbt && !rs.nbt) DL__BE(nbt)->add_i64(nbt->dev_, (int64_t *)nbt->data, 1);
            d->be->bn_stats(d, (float *)mean->data, (float *)invstd->data, (float *)var->data,
                            (const float *)x->data, N, C, L, eps, rs.rm || rs.nbt ? &rs : NULL);
        } else if (d->be->bn_eval) {   /* (as below, one launch) */
            d->be->bn_eval(d, (float *)mean->data, (float *)invstd->data, (const float *)running_mean->data,
                           (const float *)running_var->data, C, eps);
        } else {   /* the running statistics, copied: a later training step changes them */
            d->be->copy(d, mean->data, running_mean->data, sizeof(float) * (size_t)C);
            d->be->unary(d, DL__U_AFFINE, (float *)invstd->data, (const float *)running_var->data, C, 1.0f, eps);
            d->be->unary(d, DL__U_POW, (float *)invstd->data, (const float *)invstd->data, C, -0.5f, 0.0f);
        }
        if (pool)
            d->be->bn_pool(d, (float *)y->data, idx ? (int64_t *)idx->data : NULL, (const float *)x->data,
                           (const float *)mean->data, (const float *)invstd->data,
                           weight ? (const float *)weight->data : NULL, bias ? (const float *)bias->data : NULL,
                           N, C, x->shape[2], x->shape[3]);
        else
            d->be->bn_apply(d, (float *)y->data, (const float *)x->data, (const float *)mean->data,
                            (const float *)invstd->data, weight ? (const float *)weight->data : NULL,
                            bias ? (const float *)bias->data : NULL, r ? (const float *)r->data : NULL,
                            N, C, L, relu);
        y = dl__norm_record(op, pool ? &dl__op_bn_relu_pool : r ? &dl__op_bn_add_relu : relu ? &dl__op_bn_relu
                            : &dl__op_bn, y, x, weight, bias, r, mean, invstd, idx, training, eps);
    }
    if (!y) return NULL;
    if (training && running_mean && C) {
        dl__bump_version(running_mean);
        if (running_var) dl__bump_version(running_var);
    }
    return dl__done(y, op);
}

dl_tensor *dl_batch_norm(dl_tensor *x, dl_tensor *running_mean, dl_tensor *running_var,
                         dl_tensor *weight, dl_tensor *bias, bool training, float momentum,
                         float eps)
{
    return dl__batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps, NULL, false, NULL,
                          false);
}

dl_tensor *dl_layer_norm(dl_tensor *x, dl_shape normalized_shape, dl_tensor *weight,
                         dl_tensor *bias, float eps)
{
    static const char *op = "dl_layer_norm";
    dl_ctx *ctx;
    dl_tensor *y;
    int i, k = normalized_shape.ndim;
    if (!x) return NULL;
    if (!dl__live(op, "x", x) || !dl__f32(op, "x", x)) return NULL;
    ctx = x->ctx_;
    if (k < 1 || k > x->ndim) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: normalized_shape %s must have 1..%d dims (the last dims "
                "of x %s)", op, dl__shp(ctx, &normalized_shape), x->ndim, dl__sh(x));
        return NULL;
    }
    for (i = 0; i < k; i++)
        if (normalized_shape.d[i] != x->shape[x->ndim - k + i]) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: normalized_shape %s must equal the last %d dims of "
                    "x %s", op, dl__shp(ctx, &normalized_shape), k, dl__sh(x));
            return NULL;
        }
    if (weight && !dl__nn_param(op, "weight", weight, x, &normalized_shape, "normalized_shape, the last dims")) return NULL;
    if (bias && !dl__nn_param(op, "bias", bias, x, &normalized_shape, "normalized_shape, the last dims")) return NULL;
    if (!(eps >= 0.0f)) {
        dl__err(ctx, DL_ERR_ARG, "%s: eps=%g must be >= 0", op, (double)eps);
        return NULL;
    }
    {
        int64_t cols = dl__prod(x->shape + x->ndim - k, k), rows = cols ? x->numel / cols : 0;
        dl__dev *d = x->dev_;
        dl_tensor *mean = dl__new(d, op, 1, &rows), *invstd = dl__new(d, op, 1, &rows);
        y = dl__like(op, x);
        if (!mean || !invstd || !y) return NULL;
        d->be->ln_forward(d, (float *)y->data, (float *)mean->data, (float *)invstd->data,
                          (const float *)x->data, weight ? (const float *)weight->data : NULL,
                          bias ? (const float *)bias->data : NULL, rows, cols, eps);
        return dl__done(dl__norm_record(op, &dl__op_ln, y, x, weight, bias, NULL, mean, invstd, NULL, k, eps), op);
    }
}

dl_tensor *dl_dropout(dl_tensor *x, float p, bool training)
{
    static const char *op = "dl_dropout";
    dl_tensor *mask;
    if (!x) return NULL;
    if (!dl__live(op, "x", x) || !dl__f32(op, "x", x)) return NULL;
    if (!(p >= 0.0f && p <= 1.0f)) {
        dl__err(x->ctx_, DL_ERR_ARG, "%s: p=%g must be in [0, 1] (the probability of zeroing)",
                op, (double)p);
        return NULL;
    }
    if (!training || p == 0.0f) return dl__end(x->ctx_, x, op);
    mask = dl__like(op, x);
    if (!mask) return NULL;
    if (p == 1.0f) DL__BE(x)->fill(x->dev_, (float *)mask->data, x->numel, 0.0f);
    else
        DL__BE(x)->dropout_mask(x->dev_, (float *)mask->data, x->numel, p,
                                 (float)(1.0 / (1.0 - (double)p)), x->ctx_->seed,
                                 dl__rng_take(x->ctx_, x->numel));
    return dl__end(x->ctx_, dl_mul(x, mask), op);
}

/* ----------------------------------------------------------------- losses */

enum {   /* which dl_loss_desc fields a loss reads */
    DL__LF_IGNORE = 1, DL__LF_SMOOTH = 2, DL__LF_WEIGHT = 4, DL__LF_POSW = 8, DL__LF_BETA = 16,
    DL__LF_DELTA = 32, DL__LF_LOGT = 64, DL__LF_BATCHMEAN = 128
};

/* The desc's fields against what the loss reads: a field set for another
   loss is an error naming it, never silently ignored. */
static bool dl__loss_desc_ok(const char *op, dl_ctx *ctx, const dl_loss_desc *d, int uses)
{
    const char *bad = NULL;
    int r = (int)d->reduction;
    if (r != DL_REDUCTION_MEAN && r != DL_REDUCTION_SUM && r != DL_REDUCTION_NONE &&
        !(r == DL_REDUCTION_BATCHMEAN && (uses & DL__LF_BATCHMEAN))) {
        dl__err(ctx, DL_ERR_ARG, "%s: reduction %d is not one of DL_REDUCTION_MEAN (0), "
                "DL_REDUCTION_SUM (1), DL_REDUCTION_NONE (2)%s", op, r,
                (uses & DL__LF_BATCHMEAN) ? ", DL_REDUCTION_BATCHMEAN (3)" : "");
        return false;
    }
    if (!(uses & DL__LF_IGNORE) && (d->has_ignore_index || d->ignore_index)) bad = "ignore_index";
    else if (!(uses & DL__LF_SMOOTH) && d->label_smoothing != 0.0f) bad = "label_smoothing";
    else if (!(uses & DL__LF_WEIGHT) && d->weight) bad = "weight";
    else if (!(uses & DL__LF_POSW) && d->pos_weight) bad = "pos_weight";
    else if (!(uses & DL__LF_BETA) && (d->beta != 0.0f || signbit(d->beta))) bad = "beta";
    else if (!(uses & DL__LF_DELTA) && d->delta != 0.0f) bad = "delta";
    else if (!(uses & DL__LF_LOGT) && d->log_target) bad = "log_target";
    if (bad) {
        dl__err(ctx, DL_ERR_ARG, "%s: dl_loss_desc.%s is set but this loss does not use it", op, bad);
        return false;
    }
    if ((uses & DL__LF_IGNORE) && !d->has_ignore_index && d->ignore_index != 0) {
        dl__err(ctx, DL_ERR_ARG, "%s: ignore_index=%lld is set but has_ignore_index is false; set "
                ".has_ignore_index = true to use it (without it the default -100 applies)", op,
                (long long)d->ignore_index);
        return false;
    }
    return true;
}

static dl_tensor *dl__nn_reduce(dl_tensor *t, dl_reduction r)
{
    if (r == DL_REDUCTION_NONE) return t;
    if (r == DL_REDUCTION_SUM) return dl_sum(t, DL_ALL, false);
    if (r == DL_REDUCTION_BATCHMEAN)
        return t ? dl_div_scalar(dl_sum(t, DL_ALL, false), (float)(t->ndim ? t->shape[0] : 1)) : NULL;
    return dl_mean(t, DL_ALL, false);
}

/* A bad class-index target's error (bad_i: its flat index, bad_v: its value) */
static void dl__cls_bad(const char *op, dl_tensor *x, dl_tensor *target, int64_t bad_i, int64_t bad_v,
                        int64_t ignore)
{
    int64_t C = x->shape[1];
    dl__err(x->ctx_, DL_ERR_ARG, "%s: target %s holds %lld at flat index %lld: class indices must "
            "be in [0, %lld) (C = %lld, dim 1 of the input %s) or equal ignore_index %lld", op,
            dl__sh(target), (long long)bad_v, (long long)bad_i, (long long)C, (long long)C,
            dl__sh(x), (long long)ignore);
}

/* onehot (x's shape) and valid (target's) of the targets, no history; false
   (error recorded) on a bad target where check */
static bool dl__cls_masks(const char *op, dl_tensor *x, dl_tensor *target, int64_t ignore, bool check,
                          dl_tensor **onehot, dl_tensor **valid)
{
    int64_t bad_i, bad_v = 0;
    *onehot = dl__like(op, x);
    *valid = dl__make(x->dev_, op, DL_DTYPE_F32, target->ndim, target->shape, false, NULL);
    if (!*onehot || !*valid) return false;
    bad_i = DL__BE(x)->class_mask(x->dev_, (float *)(*onehot)->data, (float *)(*valid)->data, target->data,
                                  target->dtype == DL_DTYPE_I64, x->shape[0], x->shape[1],
                                  dl__prod(x->shape + 2, x->ndim - 2), ignore, &bad_v);
    if (check && bad_i >= 0) {
        dl__cls_bad(op, x, target, bad_i, bad_v, ignore);
        return false;
    }
    return true;
}

/* The class losses' mean: y = num / den, den the targets' summed weights,
   and in the backward den where != 0 (weights may be negative), else 1.
   With every target ignored PyTorch's mean is 0/0, NaN, and its gradient
   0: scaled by 1/0 = inf, the zero weights would make the gradient NaN
   throughout. (Where targets count but all their weights are 0, PyTorch's
   gradient is NaN on their rows, and so is the fused CUDA backward's;
   this composite's is 0.) */
static dl_tensor *dl__cls_safe(dl_tensor *den)
{
    return dl_add(den, dl_rsub_scalar(dl__mask(dl_abs(den), DL__U_GT, 0.0f, 0.0f), 1.0f));
}
/* as dl_div's: dnum = g / den, dden = -(g y) / den, den made safe */
static dl_result dl__cls_mean_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *den = dl__cls_safe(n->in[1]);
    if (dl__need(n, 0)) gin[0] = dl_div(g, den);
    if (dl__need(n, 1)) gin[1] = dl_neg(dl_div(dl_mul(g, n->out), den));
    return DL_OK;
}
static const dl__op dl__op_cls_mean = {"dl_div", dl__cls_mean_bwd, 2 | DL__RD_OUT, 0};
static dl_tensor *dl__cls_mean(dl_tensor *num, dl_tensor *den)
{
    dl_tensor *y, *in[2];
    dl__node *n;
    if (!num || !den) return NULL;
    dl_no_grad_begin(num->ctx_);
    y = dl_div(num, den);
    dl_no_grad_end(num->ctx_);
    in[0] = num;
    in[1] = den;
    if (!y || dl__record(y, &dl__op_cls_mean, 2, in, &n) < 0) return NULL;
    return y;
}

/* The fused class-index loss (dl__backend.class_loss: CUDA's). Node: in =
   (x, target, weight), x the logits (cross entropy, i[1] = 1) or the
   log-probabilities (nll_loss); saved = (lp: x's log_softmax, or x; den:
   the mean's denominator and the weights' sum); i[0] reduction, i[2]
   ignore_index, i[3] x's version; f[0] label smoothing. dl__cls_off: the
   composites everywhere (a test's switch). */
static bool dl__cls_off;

static void dl__cls_args(dl__clsargs *a, dl_tensor *x, dl_tensor *lp, dl_tensor *target, dl_tensor *w,
                         int red, int64_t ignore, float e, bool logits)
{
    a->x = NULL;
    a->lpw = NULL;
    a->lp = (const float *)lp->data;
    a->t = target->data;
    a->w = w ? (const float *)w->data : NULL;
    a->outer = x->shape[0];
    a->C = x->shape[1];
    a->inner = dl__prod(x->shape + 2, x->ndim - 2);
    a->ignore = ignore;
    a->red = red;
    a->e = e;
    a->e1 = 1.0f - e;
    a->eC = e / (float)a->C;
    a->i64 = target->dtype == DL_DTYPE_I64;
    a->logits = logits;
}

/* under create_graph, with dl.h ops: dlp = -(e1 ow + eC valid w) s, s the
   scaled g; dx = dlp - exp(lp) sum_c dlp with lp recomputed from the logits */
static dl_result dl__cls_bwd_graph(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    const char *op = n->op->name;
    dl_tensor *x = n->in[0], *t = n->in[1], *w = n->in[2], *onehot, *valid, *m, *s, *dlp;
    int red = (int)n->i[0];
    float e = n->f[0];
    if (n->i[1] && *dl__ver(x) != (uint32_t)n->i[3]) {
        dl__err(x->ctx_, DL_ERR_GRAPH, "%s: the logits %s were modified by an inplace operation after "
                "the forward (version %u, expected %u); a second-order backward recomputes their "
                "log_softmax: write into a dl_copy() of them", op, dl__sh(x), (unsigned)*dl__ver(x),
                (unsigned)n->i[3]);
        return DL_ERR_GRAPH;
    }
    if (!dl__cls_masks(op, x, t, n->i[2], false, &onehot, &valid)) return x->ctx_->err;
    if (w) w = dl__nn_chan(w, x->ndim);
    m = w ? dl_mul(onehot, w) : onehot;
    s = red == DL_REDUCTION_MEAN ? dl_div(g, dl__cls_safe(dl_sum(m, DL_ALL, false)))
        : red == DL_REDUCTION_NONE ? dl_unsqueeze(g, 1) : g;
    if (e != 0.0f) {
        dl_tensor *v = dl_unsqueeze(valid, 1);
        m = dl_add(dl_mul_scalar(m, 1.0f - e), dl_mul_scalar(w ? dl_mul(v, w) : v, e / (float)x->shape[1]));
    }
    dlp = dl_neg(dl_mul(m, s));
    if (n->i[1])
        dlp = dl_sub(dlp, dl_mul(dl_exp(dl_log_softmax(x, 1)), dl_sum(dlp, dl__dims1(1), true)));
    gin[0] = dlp;
    return dlp ? DL_OK : x->ctx_->err;
}

static dl_result dl__cls_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *x = n->in[0], *dx;
    dl__clsargs a;
    if (!dl__need(n, 0)) return DL_OK;
    if (dl__grad_on(x->ctx_)) return dl__cls_bwd_graph(n, g, gin);
    if (!(dx = dl__like(n->op->name, x))) return DL_ERR_OOM;
    dl__cls_args(&a, x, n->saved[0], n->in[1], n->in[2], (int)n->i[0], n->i[2], n->f[0], n->i[1] != 0);
    if (dx->numel)   /* g NULL: the backward's unfilled seed, ones */
        DL__BE(x)->class_loss_bwd(x->dev_, (float *)dx->data,
                                  g == x->ctx_->seed_one ? NULL : (const float *)g->data,
                                  (const float *)n->saved[1]->data, &a);
    gin[0] = dl__check(dx, n->op->name);
    return dl__dev_check(x->dev_, n->op->name);
}
/* reads: the target and the weight (the logits: only through lp, saved) */
static const dl__op dl__op_ce = {"dl_cross_entropy", dl__cls_bwd, 6, 0};
static const dl__op dl__op_nll = {"dl_nll_loss", dl__cls_bwd, 6, 0};

static dl_tensor *dl__cls_fused(const char *op, dl_tensor *x, dl_tensor *target, dl_tensor *w,
                                const dl_loss_desc *d, int64_t ignore, bool logits)
{
    dl_tensor *lp = x, *loss, *den, *in[3];
    int64_t two = 2, bad_i, bad_v = 0;
    dl__clsargs a;
    dl__node *n;
    if (logits && !(lp = dl__like(op, x))) return NULL;   /* class_loss writes it */
    loss = d->reduction == DL_REDUCTION_NONE
               ? dl__make(x->dev_, op, DL_DTYPE_F32, target->ndim, target->shape, false, NULL)
               : dl__make(x->dev_, op, DL_DTYPE_F32, 0, NULL, false, NULL);
    den = dl__make(x->dev_, op, DL_DTYPE_F32, 1, &two, false, NULL);
    if (!loss || !den) return NULL;
    dl__cls_args(&a, x, lp, target, w, (int)d->reduction, ignore, d->label_smoothing, logits);
    if (logits) {
        a.x = (const float *)x->data;
        a.lpw = (float *)lp->data;
    }
    bad_i = DL__BE(x)->class_loss(x->dev_, (float *)loss->data, (float *)den->data, &a, &bad_v);
    if (bad_i >= 0) {
        dl__cls_bad(op, x, target, bad_i, bad_v, ignore);
        return NULL;
    }
    in[0] = x;
    in[1] = target;
    in[2] = w;
    if (dl__record(loss, logits ? &dl__op_ce : &dl__op_nll, 3, in, &n) < 0) return NULL;
    if (n) {
        n->saved[0] = lp;
        n->saved[1] = den;
        n->nsaved = 2;
        n->i[0] = (int64_t)d->reduction;
        n->i[1] = logits;
        n->i[2] = ignore;
        n->i[3] = (int64_t)*dl__ver(x);
        n->f[0] = d->label_smoothing;
    }
    return dl__check(loss, op);
}

/* nll of log-probabilities lp (N,C,*) (or (C)) with optional label smoothing
   (x: lp, or with logits the logits, whose log_softmax over dim 1 is lp):
   onehot/valid masks from the targets (no history), then
     nll_i    = -sum_c onehot w_c lp          (w_c = 1 without weights)
     smooth_i = -valid_i sum_c w_c lp
     mean: sum(.) / sum(onehot w)             sum: sum(.)    none: per sample
     loss = (1-e) nll + e/C smooth.
   Where the backend has class_loss (and the weight needs no gradient), that
   in one fused op (dl__cls_fused) instead of these ops. */
static dl_tensor *dl__nn_class_loss(const char *op, dl_tensor *x, dl_tensor *target,
                                    const dl_loss_desc *d, bool smoothing_allowed, bool logits)
{
    dl_ctx *ctx = x->ctx_;
    dl_tensor *onehot, *valid, *w = NULL, *ow, *nll, *den = NULL, *loss, *lp;
    int64_t ignore;
    float e = d->label_smoothing;
    int i;
    bool scalar = false;
    if (!dl__live(op, "target", target) || !dl__pair(op, x, target)) return NULL;
    if (!dl__loss_desc_ok(op, ctx, d, DL__LF_IGNORE | DL__LF_WEIGHT | (smoothing_allowed ? DL__LF_SMOOTH : 0)))
        return NULL;
    ignore = d->has_ignore_index ? d->ignore_index : -100;
    if (target->dtype != DL_DTYPE_I64 && target->dtype != DL_DTYPE_I32) {
        dl__err(ctx, DL_ERR_DTYPE, "%s: target %s has dtype %s; class-index targets must be int64 "
                "or int32 (probability targets are not supported)", op, dl__sh(target),
                dl__dtype_str(target->dtype));
        return NULL;
    }
    if (!(e >= 0.0f && e <= 1.0f)) {
        dl__err(ctx, DL_ERR_ARG, "%s: label_smoothing=%g must be in [0, 1]", op, (double)e);
        return NULL;
    }
    if (x->ndim == 1 && target->ndim == 0) {   /* one sample: (C) and a 0-d target */
        scalar = true;
        x = dl_unsqueeze(x, 0);
        target = dl_unsqueeze(target, 0);
        if (!x || !target) return NULL;
    }
    if (x->ndim < 2) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: input %s must be (N,C) or (N,C,d1,...) (or (C) with a "
                "0-d target)", op, dl__sh(x));
        return NULL;
    }
    {
        bool ok = target->ndim == x->ndim - 1 && target->shape[0] == x->shape[0];
        for (i = 1; ok && i < target->ndim; i++) ok = target->shape[i] == x->shape[i + 1];
        if (!ok) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: target %s must be the input %s without its class dim 1 "
                    "((N,C,d1,...) -> (N,d1,...))", op, dl__sh(target), dl__sh(x));
            return NULL;
        }
    }
    if (d->weight) {
        dl_shape cs = dl__dims1(x->shape[1]);
        if (!dl__nn_param(op, "weight", d->weight, x, &cs, "one weight per class, dim 1")) return NULL;
    }
    if (DL__BE(x)->class_loss && !dl__cls_off && !(d->weight && d->weight->requires_grad)) {
        loss = dl__cls_fused(op, x, target, d->weight, d, ignore, logits);
    } else {
        lp = logits ? dl_log_softmax(x, 1) : x;
        if (!lp) return NULL;
        if (d->weight && !(w = dl__nn_chan(d->weight, lp->ndim))) return NULL;
        if (!dl__cls_masks(op, lp, target, ignore, true, &onehot, &valid)) return NULL;
        ow = w ? dl_mul(onehot, w) : onehot;
        nll = dl_neg(dl_sum(dl_mul(ow, lp), dl__dims1(1), false));
        if (d->reduction == DL_REDUCTION_MEAN) den = dl_sum(ow, DL_ALL, false);
        if (d->reduction == DL_REDUCTION_MEAN) loss = dl__cls_mean(dl_sum(nll, DL_ALL, false), den);
        else loss = dl__nn_reduce(nll, d->reduction);
        if (e > 0.0f) {
            dl_tensor *sm = dl_mul(dl_neg(dl_sum(w ? dl_mul(lp, w) : lp, dl__dims1(1), false)), valid);
            if (d->reduction == DL_REDUCTION_MEAN) sm = dl__cls_mean(dl_sum(sm, DL_ALL, false), den);
            else sm = dl__nn_reduce(sm, d->reduction);
            loss = dl_add(dl_mul_scalar(loss, 1.0f - e), dl_mul_scalar(sm, e / (float)lp->shape[1]));
        }
    }
    if (scalar && loss && d->reduction == DL_REDUCTION_NONE) loss = dl_squeeze(loss, 0);
    return loss;
}

static const dl_loss_desc dl__loss_defaults = {DL_REDUCTION_MEAN, false, 0, 0.0f, NULL, NULL, 0.0f, 0.0f, false};  /* all zero: PyTorch's defaults */

dl_tensor *dl_nll_loss(dl_tensor *log_probs, dl_tensor *target, const dl_loss_desc *d)
{
    if (!log_probs || !target) return NULL;
    if (!dl__live("dl_nll_loss", "log_probs", log_probs) || !dl__f32("dl_nll_loss", "log_probs", log_probs))
        return NULL;
    return dl__end(log_probs->ctx_, dl__nn_class_loss("dl_nll_loss", log_probs, target, d ? d : &dl__loss_defaults,
                                                      false, false), "dl_nll_loss");
}

dl_tensor *dl_cross_entropy(dl_tensor *logits, dl_tensor *target, const dl_loss_desc *d)
{
    static const char *op = "dl_cross_entropy";
    if (!logits || !target) return NULL;
    if (!dl__live(op, "logits", logits) || !dl__f32(op, "logits", logits)) return NULL;
    if (!dl__live(op, "target", target)) return NULL;
    if (logits->ndim == 0) {
        dl__err(logits->ctx_, DL_ERR_SHAPE, "%s: logits %s must be (N,C) or (N,C,d1,...)", op,
                dl__sh(logits));
        return NULL;
    }
    return dl__end(logits->ctx_, dl__nn_class_loss(op, logits, target, d ? d : &dl__loss_defaults, true, true), op);
}

/* input and target: same shape, float32, same context and device; the desc
   fields this loss may use */
static bool dl__nn_same(const char *op, dl_tensor *a, dl_tensor *b, const dl_loss_desc *d, int uses)
{
    if (!dl__live(op, "input", a) || !dl__live(op, "target", b)) return false;
    if (!dl__pair(op, a, b) || !dl__f32(op, "input", a) || !dl__f32(op, "target", b)) return false;
    if (!dl__loss_desc_ok(op, a->ctx_, d, uses)) return false;
    if (!dl_same_shape(a, b)) {
        dl__err(a->ctx_, DL_ERR_SHAPE, "%s: input %s and target %s must have the same shape (dl.h "
                "does not broadcast loss operands)", op, dl__sh(a), dl__sh(b));
        return false;
    }
    return true;
}

/* weight (or pos_weight) must broadcast to x's shape without changing it */
static bool dl__nn_bcast_to(const char *op, const char *arg, dl_tensor *w, dl_tensor *x)
{
    dl__bcast bc;
    if (!dl__live(op, arg, w) || !dl__pair(op, x, w) || !dl__f32(op, arg, w)) return false;
    if (!dl__broadcast(op, x, w, &bc)) return false;
    if (bc.ndim != x->ndim) {
        dl__err(x->ctx_, DL_ERR_SHAPE, "%s: %s %s has more dims than the input %s", op, arg,
                dl__sh(w), dl__sh(x));
        return false;
    }
    return true;
}

dl_tensor *dl_mse_loss(dl_tensor *a, dl_tensor *b, const dl_loss_desc *d)
{
    dl_tensor *t;
    if (!d) d = &dl__loss_defaults;
    if (!a || !b || !dl__nn_same("dl_mse_loss", a, b, d, 0)) return NULL;
    t = dl_sub(a, b);
    return dl__end(a->ctx_, dl__nn_reduce(dl_mul(t, t), d->reduction), "dl_mse_loss");
}

dl_tensor *dl_l1_loss(dl_tensor *a, dl_tensor *b, const dl_loss_desc *d)
{
    if (!d) d = &dl__loss_defaults;
    if (!a || !b || !dl__nn_same("dl_l1_loss", a, b, d, 0)) return NULL;
    return dl__end(a->ctx_, dl__nn_reduce(dl_abs(dl_sub(a, b)), d->reduction), "dl_l1_loss");
}

/* t = a - b, m = [|t| < c] (no history):  m q(t) + (1-m) (s |t| - o),
   q(t) = k t^2.  smooth L1: k = 0.5/beta, s = 1, o = beta/2;
   Huber: k = 0.5, s = delta, o = delta^2/2. */
static dl_tensor *dl__nn_piecewise(dl_tensor *a, dl_tensor *b, float c, float k, float s, float o)
{
    dl_tensor *t = dl_sub(a, b), *at = dl_abs(t);
    dl_tensor *m = dl__mask(dl_rsub_scalar(at, c), DL__U_GT, 0.0f, 0.0f);
    dl_tensor *lin = dl_sub_scalar(dl_mul_scalar(at, s), o), *tc;
    if (c <= 0.0f) return lin;
    /* the quadratic branch on t clamped to [-c, c]: the same where it is
       taken, and finite where it is not (an overflowing t*t times a zero
       mask would make the loss NaN where PyTorch's is finite or inf) */
    tc = dl_clamp(t, -c, c);
    return dl_add(dl_mul(m, dl_mul_scalar(dl_mul(tc, tc), k)), dl_mul(dl_rsub_scalar(m, 1.0f), lin));
}

dl_tensor *dl_smooth_l1_loss(dl_tensor *a, dl_tensor *b, const dl_loss_desc *d)
{
    static const char *op = "dl_smooth_l1_loss";
    float beta;
    if (!d) d = &dl__loss_defaults;
    if (!a || !b || !dl__nn_same(op, a, b, d, DL__LF_BETA)) return NULL;
    beta = (d->beta == 0.0f && !signbit(d->beta)) ? 1.0f : d->beta;
    if (!(beta >= 0.0f) || !isfinite(beta)) {
        dl__err(a->ctx_, DL_ERR_ARG, "%s: beta=%g must be a finite number >= 0", op, (double)beta);
        return NULL;
    }
    if (beta == 0.0f) return dl__end(a->ctx_, dl__nn_reduce(dl_abs(dl_sub(a, b)), d->reduction), op);
    return dl__end(a->ctx_, dl__nn_reduce(dl__nn_piecewise(a, b, beta, 0.5f / beta, 1.0f, 0.5f * beta), d->reduction),
                   op);
}

dl_tensor *dl_huber_loss(dl_tensor *a, dl_tensor *b, const dl_loss_desc *d)
{
    static const char *op = "dl_huber_loss";
    float delta;
    if (!d) d = &dl__loss_defaults;
    if (!a || !b || !dl__nn_same(op, a, b, d, DL__LF_DELTA)) return NULL;
    delta = d->delta == 0.0f ? 1.0f : d->delta;
    if (!(delta > 0.0f) || !isfinite(delta)) {
        dl__err(a->ctx_, DL_ERR_ARG, "%s: delta=%g must be a finite number > 0", op, (double)delta);
        return NULL;
    }
    return dl__end(a->ctx_, dl__nn_reduce(dl__nn_piecewise(a, b, delta, 0.5f, delta, 0.5f * delta * delta),
                                          d->reduction), op);
}

/* -(y clamp(log p) + (1-y) clamp(log(1-p))), logs clamped to >= -100; backward as
   PyTorch: dp = g (p - y) / max(p (1-p), 1e-12), dy = -g logit(p) = -g log(p / (1-p)),
   unclamped (+-inf at p = 0 or 1, as there) */
static dl_tensor *dl__bce_prob_terms(dl_tensor *p, dl_tensor *y)
{
    return dl_neg(dl_add(dl_mul(y, dl_clamp(dl_log(p), -100.0f, INFINITY)),
                         dl_mul(dl_rsub_scalar(y, 1.0f), dl_clamp(dl_log(dl_rsub_scalar(p, 1.0f)), -100.0f, INFINITY))));
}
static dl_result dl__nn_bcep_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *p = n->in[0], *y = n->in[1];
    if (dl__need(n, 0))
        gin[0] = dl_div(dl_mul(g, dl_sub(p, y)), dl_clamp(dl_mul(p, dl_rsub_scalar(p, 1.0f)), 1e-12f, INFINITY));
    if (dl__need(n, 1))
        gin[1] = dl_neg(dl_mul(g, dl_log(dl_div(p, dl_rsub_scalar(p, 1.0f)))));
    return DL_OK;
}
static const dl__op dl__op_nn_bcep = {"dl_binary_cross_entropy", dl__nn_bcep_bwd, 3, 0};
static dl_tensor *dl__bce_prob_raw(dl_tensor *p, dl_tensor *y)
{
    dl_tensor *l, *in[2];
    dl__node *n;
    dl_no_grad_begin(p->ctx_);
    l = dl__bce_prob_terms(p, y);
    dl_no_grad_end(p->ctx_);
    if (!l) return NULL;
    in[0] = p;
    in[1] = y;
    if (dl__record(l, &dl__op_nn_bcep, 2, in, &n) < 0) return NULL;
    return dl__check(l, "dl_binary_cross_entropy");
}

dl_tensor *dl_binary_cross_entropy(dl_tensor *p, dl_tensor *y, const dl_loss_desc *d)
{
    static const char *op = "dl_binary_cross_entropy";
    dl_tensor *l;
    if (!d) d = &dl__loss_defaults;
    if (!p || !y || !dl__nn_same(op, p, y, d, DL__LF_WEIGHT)) return NULL;
    if (d->weight && !dl__nn_bcast_to(op, "weight", d->weight, p)) return NULL;
    if (p->numel) {   /* PyTorch: "all elements of input (target) should be between 0 and 1" */
        bool mask[DL_MAX_DIMS];
        dl_tensor *ip = dl__mask(p, DL__U_INRANGE, 0.0f, 1.0f), *iy = dl__mask(y, DL__U_INRANGE, 0.0f, 1.0f);
        dl_tensor *ok;
        float v;
        int i;
        for (i = 0; i < DL_MAX_DIMS; i++) mask[i] = true;
        /* one host read for both (a device syncs once): 1 + 2 when every value is in range */
        ok = ip && iy ? dl_add(dl__reduce_raw(op, DL__R_MIN, ip, mask),
                               dl_mul_scalar(dl__reduce_raw(op, DL__R_MIN, iy, mask), 2.0f)) : NULL;
        if (!ok) return NULL;
        v = dl__host_value(ok);
        if (v != 3.0f) {
            bool pin = v == 1.0f;   /* p in range: then y is not */
            dl__err(p->ctx_, DL_ERR_ARG, "%s: %s %s has values outside [0, 1] (%s)", op, pin ? "target" : "input",
                    dl__sh(pin ? y : p), pin ? "BCE's targets are probabilities, as PyTorch's"
                    : "probabilities expected; use dl_binary_cross_entropy_with_logits for logits");
            return NULL;
        }
    }
    l = dl__bce_prob_raw(p, y);
    if (d->weight) l = dl_mul(l, d->weight);
    return dl__end(p->ctx_, dl__nn_reduce(l, d->reduction), op);
}

/* l = max(x,0) - x y + log(1 + exp(-|x|));  dx = g (sigmoid(x) - y), dy = -g x */
static dl_result dl__nn_bce_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl_mul(g, dl_sub(dl_sigmoid(n->in[0]), n->in[1]));
    if (dl__need(n, 1)) gin[1] = dl_neg(dl_mul(g, n->in[0]));
    return DL_OK;
}
static const dl__op dl__op_nn_bce = {"dl_binary_cross_entropy_with_logits", dl__nn_bce_bwd, 1, 2};

static dl_tensor *dl__bce_logits_raw(dl_tensor *x, dl_tensor *y)
{
    static const char *op = "dl_binary_cross_entropy_with_logits";
    dl_tensor *l, *in[2];
    dl__node *n;
    if (!x || !y) return NULL;
    l = dl__like(op, x);
    if (!l) return NULL;
    DL__BE(x)->bce_logits(x->dev_, (float *)l->data, (const float *)x->data,
                           (const float *)y->data, x->numel);
    in[0] = x;
    in[1] = y;
    if (dl__record(l, &dl__op_nn_bce, 2, in, &n) < 0) return NULL;
    return dl__check(l, op);
}
/* s = softplus(-x) = bce_logits(x, 1) (the fused stable kernel below);
   l = (1-y) x + (1 + (pw-1) y) s */

dl_tensor *dl_binary_cross_entropy_with_logits(dl_tensor *x, dl_tensor *y, const dl_loss_desc *d)
{
    static const char *op = "dl_binary_cross_entropy_with_logits";
    dl_tensor *l;
    if (!d) d = &dl__loss_defaults;
    if (!x || !y || !dl__nn_same(op, x, y, d, DL__LF_WEIGHT | DL__LF_POSW)) return NULL;
    if (d->weight && !dl__nn_bcast_to(op, "weight", d->weight, x)) return NULL;
    if (d->pos_weight && !dl__nn_bcast_to(op, "pos_weight", d->pos_weight, x)) return NULL;
    if (!d->pos_weight) l = dl__bce_logits_raw(x, y);
    else {
        dl_tensor *s = dl__bce_logits_raw(x, dl_ones_like(x));
        l = dl_add(dl_mul(dl_rsub_scalar(y, 1.0f), x),
                   dl_mul(dl_add_scalar(dl_mul(dl_sub_scalar(d->pos_weight, 1.0f), y), 1.0f), s));
    }
    if (d->weight) l = dl_mul(l, d->weight);
    return dl__end(x->ctx_, dl__nn_reduce(l, d->reduction), op);
}

/* target (log target - input), 0 where target = 0 (PyTorch's xlogy);
   log_target: exp(t) (t - input) */
dl_tensor *dl_kl_div(dl_tensor *input, dl_tensor *target, const dl_loss_desc *d)
{
    static const char *op = "dl_kl_div";
    dl_tensor *l;
    if (!d) d = &dl__loss_defaults;
    if (!input || !target || !dl__nn_same(op, input, target, d, DL__LF_LOGT | DL__LF_BATCHMEAN))
        return NULL;
    if (d->log_target) l = dl_mul(dl_exp(target), dl_sub(target, input));
    else {
        /* log(t + [t == 0]) is log t where t > 0 and 0 where t == 0 */
        dl_tensor *z = dl__mask(target, DL__U_INRANGE, 0.0f, 0.0f);
        l = dl_mul(target, dl_sub(dl_log(dl_add(target, z)), input));
    }
    return dl__end(input->ctx_, dl__nn_reduce(l, d->reduction), op);
}


/* Convolution, transposed convolution and pooling.

   Everything here is N-d (1, 2 or 3 spatial dims, missing dims padded with
   size 1); the 1d/2d/3d functions are thin wrappers.

   Convolution is im2col + GEMM, group by group. Three internal ops cover
   every product, with "a" the conv input side (N,Ca,ia...), "b" the conv
   output side (N,Cb,ib...) and w (Cb, Ca/G, k...):
       conv      b = conv(a, w)            im2col(a), w_g (Cbg,CagK) @ col_g
       convT     a = conv_transpose(b, w)  col_g = w_g^T @ b_g, col2im -> a
       convW     w = weight_grad(a, b)     sum_n b_g[n] @ col_g[n]^T
   They are each other's adjoints, so each backward is written with the
   other two (and create_graph gives gradients of any order):
       conv:   da = convT(g, w), dw = convW(a, g), dbias = sum(g, N and space)
       convT:  db = conv(g, w),  dw = convW(g, b), dbias = sum(g)
       convW:  da = convT(b, g), db = conv(a, g)
   Max pooling saves the arg-max of each window (int64, within the plane) and
   scatters the gradient there ("unpool"), whose backward gathers. Average
   pooling (fixed or adaptive windows) is linear: its backward is its
   adjoint, an op whose backward is the pooling again.

   Kernels (im2col, col2im, bias, pools, conv_s1) are backend entries. The
   im2col matrix holds a chunk of samples side by side, col (Ca*K, n, Lb),
   so each group is one large GEMM (the output comes back (Cb, n, Lb) and is
   permuted to (n, Cb, Lb)). A stride-1 conv without groups whose padded
   grid adds at most DL__S1_MAX_GROW of columns skips im2col: the backend's
   conv_s1 pads the input once and multiplies shifted views of it (see
   dl__s1_make), the same sums in the same order, so the same bits; convT
   with stride 1 (the input gradient of such a conv) is the conv of its
   input with the weights transposed and flipped, through the same path,
   instead of col2im. The CPU's conv_s1 takes, for 1-d and 2-d convs with
   few output channels, a row variant (dl__s1r_make): per sample, the input
   copied once per kernel column into rows cut to the output's width, so
   the GEMM has exactly the output's columns and writes y in place (LeNet's
   5x5 convs: half the multiply-adds of the grid); an input gradient with
   a quarter more input positions than output ones goes the other way,
   w^T gy then col2im, a sample at a time (dl__s1s_task). Before conv_s1,
   a backend may take a 3x3 stride-1 conv by Winograd's F(2x2, 3x3) or
   F(4x4, 3x3) (conv_wg, conv_wg_wgrad; the CPU's with AVX-512 and channels
   in multiples of 16: see dl__wg_ok): other sums, within rounding, and a
   decline for inf or NaN operands. Other convs without groups whose
   sample's im2col matrix is small (at most DL__I2C_MAX_PER floats, at
   least 128 output positions: the ResNet's stride-2 convs on 28x28) may go
   through the backend's conv_i2c: im2col a sample at a time in a thread's
   buffer (2-d planes by rows: dl__i2c_rows), the GEMM straight into y, the
   same bits as whole-batch im2col. Scratch is step memory given back
   before the op returns; chunks keep it under 8 MiB (the Winograd entries
   use the pool's GEMM buffer: about 1 MiB a thread at 128 channels,
   growing with them, plus 8 partial weight gradients of 36 Ci Co floats
   each). */

// >>section ops: convolution and pooling

/* ------------------------------------------------------------ helpers */

/* Scratch of n floats in step memory on t's device, given back by
   dl__arena_rewind(&t->dev_->data, mark) before the op returns. */
static float *dl__conv_scratch(const char *op, dl_tensor *t, int64_t n)
{
    dl_ctx *ctx = t->ctx_;
    float *p;
    if (n < 0 || (uint64_t)n > (uint64_t)(((size_t)-1) / 16)) p = NULL;
    else p = (float *)dl__arena_alloc(ctx, &t->dev_->data, sizeof(float) * (size_t)(n ? n : 1), true);
    if (!p) {
        dl__err(ctx, DL_ERR_OOM, "%s: cannot allocate %lld floats of convolution scratch%s", op,
                (long long)n, ctx->memory_limit ? " (memory_limit reached?)" : "");
        return NULL;
    }
    dl__track_peak(t->dev_);
    return p;
}

/* a * b for sizes >= 0; false when it would pass INT64_MAX / 16 (no wrap) */
static bool dl__mul_ok(int64_t a, int64_t b, int64_t *r)
{
    if (a < 0 || b < 0 || (a && b > (INT64_MAX / 16) / a)) return false;
    *r = a * b;
    return true;
}

/* The im2col scratch of one convolution: floats per sample,
   (Ca*K + Cb) * Lb, and samples per chunk so that the scratch stays under
   8 MiB (measured best: the GEMMs are large and the data stays in the
   last-level cache). false + DL_ERR_OOM when the sizes overflow. */
static bool dl__conv_plan(const char *op, dl_ctx *ctx, const dl__cgeom *g, int64_t *nb,
                          int64_t *floats)
{
    int64_t caK, per;
    if (!dl__mul_ok(g->Ca, g->K, &caK) || caK > INT64_MAX / 16 - g->Cb ||
        !dl__mul_ok(caK + g->Cb, g->Lb, &per)) {
        dl__err(ctx, DL_ERR_OOM, "%s: the im2col scratch for one sample, (C %lld * kernel %lld + "
                "%lld) * %lld positions, does not fit in memory (size overflow)", op,
                (long long)g->Ca, (long long)g->K, (long long)g->Cb, (long long)g->Lb);
        return false;
    }
    *nb = per > 0 ? ((int64_t)1 << 21) / per : g->N;
    if (*nb < 1) *nb = 1;
    if (*nb > g->N) *nb = g->N;
    *floats = *nb * per;   /* <= max(2^21, per): no overflow */
    return true;
}

/* Attributes packed into node->i[] (21 bits each, checked by the public
   functions): conv i[0] = groups, i[1+d] = stride | pad << 21 | dilation << 42;
   pooling i[0] = flags, i[1+d] = kernel | stride << 21 | pad << 42. */
#define DL__PACK_MAX (((int64_t)1 << 21) - 1)
static int64_t dl__pack3(int64_t a, int64_t b, int64_t c) { return a | (b << 21) | (c << 42); }
static int64_t dl__unpack(int64_t v, int k) { return (v >> (21 * k)) & DL__PACK_MAX; }

typedef struct dl__cparam { int nsp; int64_t G, s[3], p[3], d[3]; } dl__cparam;

static void dl__cparam_save(dl__node *n, const dl__cparam *cp)
{
    int i;
    n->i[0] = cp->G;
    for (i = 0; i < 3; i++) n->i[1 + i] = dl__pack3(cp->s[i], cp->p[i], cp->d[i]);
    n->ni = 4;
}

static void dl__cparam_load(const dl__node *n, int nsp, dl__cparam *cp)
{
    int i;
    cp->nsp = nsp;
    cp->G = n->i[0];
    for (i = 0; i < 3; i++) {
        cp->s[i] = dl__unpack(n->i[1 + i], 0);
        cp->p[i] = dl__unpack(n->i[1 + i], 1);
        cp->d[i] = dl__unpack(n->i[1 + i], 2);
    }
}

/* geometry from a-side, b-side and kernel spatial sizes */
static void dl__cgeom_make(dl__cgeom *g, const dl__cparam *cp, int64_t N, int64_t Ca, int64_t Cb,
                           const int64_t *ia, const int64_t *ib, const int64_t *k)
{
    int i;
    g->nsp = cp->nsp;
    g->N = N; g->Ca = Ca; g->Cb = Cb; g->G = cp->G;
    g->La = g->Lb = g->K = 1;
    for (i = 0; i < 3; i++) {   /* the real dims last, so rows stay long */
        int j = i - (3 - cp->nsp);
        bool on = j >= 0;
        g->ia[i] = on ? ia[j] : 1;
        g->ib[i] = on ? ib[j] : 1;
        g->k[i] = on ? k[j] : 1;
        g->s[i] = on ? cp->s[j] : 1;
        g->p[i] = on ? cp->p[j] : 0;
        g->d[i] = on ? cp->d[j] : 1;
        g->La *= g->ia[i];
        g->Lb *= g->ib[i];
        g->K *= g->k[i];
    }
}

/* (cnt, C, L) <-> (C, cnt, L): to_batch_major copies src (C, cnt, L) into
   dst (cnt, C, L); otherwise src (cnt, C, L) into dst (C, cnt, L) */
static void dl__conv_permute(const dl_tensor *t, float *dst, const float *src, int64_t cnt,
                             int64_t C, int64_t L, bool to_batch_major)
{
    int64_t shape[3], ds[3], ss[3];
    if (to_batch_major) {
        shape[0] = cnt; shape[1] = C; shape[2] = L;
        ds[0] = C * L; ds[1] = L; ds[2] = 1;
        ss[0] = L; ss[1] = cnt * L; ss[2] = 1;
    } else {
        shape[0] = C; shape[1] = cnt; shape[2] = L;
        ds[0] = cnt * L; ds[1] = L; ds[2] = 1;
        ss[0] = L; ss[1] = C * L; ss[2] = 1;
    }
    if (cnt > 0 && C > 0 && L > 0) DL__BE(t)->copy_nd(t->dev_, 4, 3, shape, dst, ds, src, ss);
}

static dl_tensor *dl__conv_run(dl_tensor *a, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                               const int64_t *ib, int act);
static dl_tensor *dl__convT_run(dl_tensor *b, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                                const int64_t *ia);
static dl_tensor *dl__convW_run(dl_tensor *a, dl_tensor *b, const dl__cparam *cp, const int64_t *k);

/* dbias = sum of g over N and the spatial dims */
static dl_tensor *dl__bias_grad(dl_tensor *g)
{
    dl_shape dims;
    int i;
    if (!g) return NULL;
    dims.ndim = g->ndim - 1;
    dims.d[0] = 0;
    for (i = 2; i < g->ndim; i++) dims.d[i - 1] = i;
    return dl_sum(g, dims, false);
}

/* b = conv(a, w) + bias;  da = convT(g, w), dw = convW(a, g), dbias = sum(g) */
static dl_result dl__conv_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__cparam cp;
    dl_tensor *a = n->in[0], *w = n->in[1];
    dl__cparam_load(n, w->ndim - 2, &cp);
    if (dl__need(n, 0)) gin[0] = dl__convT_run(g, w, NULL, &cp, a->shape + 2);
    if (dl__need(n, 1)) gin[1] = dl__convW_run(a, g, &cp, w->shape + 2);
    if (dl__need(n, 2)) gin[2] = dl__bias_grad(g);
    return DL_OK;
}
/* a = convT(b, w) + bias;  db = conv(g, w), dw = convW(g, b), dbias = sum(g) */
static dl_result dl__convT_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__cparam cp;
    dl_tensor *b = n->in[0], *w = n->in[1];
    dl__cparam_load(n, w->ndim - 2, &cp);
    if (dl__need(n, 0)) gin[0] = dl__conv_run(g, w, NULL, &cp, b->shape + 2, -1);
    if (dl__need(n, 1)) gin[1] = dl__convW_run(g, b, &cp, w->shape + 2);
    if (dl__need(n, 2)) gin[2] = dl__bias_grad(g);
    return DL_OK;
}
/* w = convW(a, b);  da = convT(b, g), db = conv(a, g) */
static dl_result dl__convW_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__cparam cp;
    dl_tensor *a = n->in[0], *b = n->in[1];
    dl__cparam_load(n, n->out->ndim - 2, &cp);
    if (dl__need(n, 0)) gin[0] = dl__convT_run(b, g, NULL, &cp, a->shape + 2);
    if (dl__need(n, 1)) gin[1] = dl__conv_run(a, g, NULL, &cp, b->shape + 2, -1);
    return DL_OK;
}
/* b = act(conv(a, w) + bias) as one node (dl__backend.conv_act: a GPU's
   direct sums), i[4] = act: the values and bits of dl_conv then the
   activation. Backward: gm = the activation's backward from b
   (dl__act_grad), in the same pass as the bias's sum where the backend's
   chan_sum takes that sum, then dl__conv_bwd's rules with gm for g.
   With i[5] = 1 (dl__op_conv_act_pool) the node's output is b's 2x2,
   stride-2 average pool, b is saved[0], and g reaches the activation's
   backward through the pool's adjoint (in chan_sum's pass, or
   dl__avgpool_adj): the three ops' bits; under create_graph b is
   computed again by ops, so that its history carries second order. */
typedef struct dl__pparam { int nsp; int64_t k[3], s[3], p[3]; bool adaptive, cip; } dl__pparam;
static const dl__pparam dl__pool2 = {2, {2, 2, 1}, {2, 2, 1}, {0, 0, 0}, false, true};
static dl_tensor *dl__avgpool_adj(dl_tensor *g, const dl__pparam *pp, const int64_t *ia);

static dl_result dl__conv_act_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__cparam cp;
    bool pool = n->ni > 5 && n->i[5];
    dl_tensor *a = n->in[0], *w = n->in[1], *bias = n->in[2], *y = pool ? n->saved[0] : n->out, *gm, *db;
    int act = (int)n->i[4], k;
    int64_t nCL[3];
    bool mask[DL_MAX_DIMS];
    dl__cparam_load(n, w->ndim - 2, &cp);
    for (k = 0; k < y->ndim; k++) mask[k] = k != 1;
    if (dl__need(n, 2) && !dl__grad_on(g->ctx_) && DL__BE(y)->chan_sum && dl__chan_sum_ok(y, mask, nCL)) {
        if (!(gm = dl__like(n->op->name, y)) || !(db = dl__like(n->op->name, bias))) return DL_ERR_OOM;
        DL__BE(y)->chan_sum(y->dev_, (float *)db->data, (const float *)g->data, nCL[0], nCL[1], nCL[2],
                            (const float *)y->data, (float *)gm->data, act, pool ? y->shape[3] : 0);
        if (dl__dev_check(y->dev_, n->op->name) != DL_OK) return g->ctx_->err;
        gin[2] = db;
    } else {
        if (pool && dl__grad_on(g->ctx_) && !(y = dl__conv_run(a, w, bias, &cp, y->shape + 2, act)))
            return g->ctx_->err;   /* create_graph: b again, with its history (saved[0] has none) */
        if (pool && !(g = dl__avgpool_adj(g, &dl__pool2, y->shape + 2))) return y->ctx_->err;
        if (!(gm = dl__act_grad(g, y, act))) return g->ctx_->err;
        if (dl__need(n, 2)) gin[2] = dl__bias_grad(gm);
    }
    if (dl__need(n, 0)) gin[0] = dl__convT_run(gm, w, NULL, &cp, a->shape + 2);
    if (dl__need(n, 1)) gin[1] = dl__convW_run(a, gm, &cp, w->shape + 2);
    return DL_OK;
}
static const dl__op dl__op_conv = {"dl_conv", dl__conv_bwd, 0, 3};
static const dl__op dl__op_conv_act = {"dl_conv", dl__conv_act_bwd, DL__RD_OUT, 3};
static const dl__op dl__op_conv_act_pool = {"dl_conv", dl__conv_act_bwd, 0, 3};   /* reads saved[0] */
static const dl__op dl__op_convT = {"dl_conv_transpose", dl__convT_bwd, 0, 3};
static const dl__op dl__op_convW = {"dl_conv_weight_grad", dl__convW_bwd, 0, 3};

/* Through the backend's Winograd entries (conv_wg, all n samples at once)
   when they take the conv, else its padded-grid entries, chunk by chunk
   of samples (scratch under 8 MiB, as im2col's). mode 0: y = conv(x, w) + bias; 1
   (convT): g is the conv of x with w transposed and flipped; 2: y = the
   weight gradient of conv(x, .) for the output gradient w (im2col instead
   when the entry declines: see conv_s1_wgrad). 1 done, 0 when the path
   does not apply (no entry, dl__s1_make says no, declined), -1 on error. */
static int dl__conv_s1_try(const char *op, dl_tensor *x, dl_tensor *y, dl_tensor *w, dl_tensor *bias,
                           const dl__cgeom *g, int mode)
{
    const dl__backend *k = DL__BE(x);
    dl__s1geom q;
    dl__mark m;
    int64_t nb, per, n0;
    float *scratch;
    if (g->N > 0 && (mode == 2 ? k->conv_wg_wgrad != NULL : k->conv_wg != NULL) &&
        (mode == 2 ? k->conv_wg_wgrad(x->dev_, (float *)y->data, (const float *)x->data, (const float *)w->data,
                                      g->N, g)
                   : k->conv_wg(x->dev_, (float *)y->data, (const float *)x->data, (const float *)w->data,
                                bias ? (const float *)bias->data : NULL, g->N, g, mode == 1)))
        return 1;
    if (!(mode == 2 ? k->conv_s1_wgrad != NULL : k->conv_s1 != NULL) || !dl__s1_make(g, &q) || g->N <= 0) return 0;
    per = (g->Ca + g->Cb) * q.Pa;
    nb = ((int64_t)1 << 21) / per;
    if (nb < 1) nb = 1;
    if (nb > g->N) nb = g->N;
    m = dl__arena_mark(&x->dev_->data);
    scratch = dl__conv_scratch(op, x, dl__s1_floats(g, &q, nb, mode == 1));
    if (!scratch) return -1;
    for (n0 = 0; n0 < g->N; n0 += nb) {
        int64_t cnt = g->N - n0 < nb ? g->N - n0 : nb;
        const float *xs = (const float *)x->data + n0 * g->Ca * g->La;
        if (mode == 2) {
            if (!k->conv_s1_wgrad(x->dev_, (float *)y->data, xs, (const float *)w->data + n0 * g->Cb * g->Lb,
                                  scratch, cnt, g, n0 == 0 ? 0.0f : 1.0f)) {
                dl__arena_rewind(&x->dev_->data, m);   /* im2col redoes all of y */
                return 0;
            }
        } else
            k->conv_s1(x->dev_, (float *)y->data + n0 * g->Cb * g->Lb, xs, (const float *)w->data,
                       bias ? (const float *)bias->data : NULL, scratch, cnt, g, mode == 1);
    }
    dl__arena_rewind(&x->dev_->data, m);
    return 1;
}

/* a (N,Ca,ia...), w (Cb, Ca/G, k...), bias (Cb) or NULL -> (N, Cb, ib...).
   Shapes were checked by the caller. */
static dl_tensor *dl__conv_run(dl_tensor *a, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                               const int64_t *ib, int act)
{
    const char *name = "dl_conv";
    int64_t shape[DL_MAX_DIMS], nb, n0, CagK, Cbg;
    dl__cgeom g;
    dl_tensor *y, *in[3];
    dl__node *node;
    dl_ctx *ctx;
    int i, nsp = cp->nsp, done;
    bool fused;
    if (!a || !w) return NULL;
    ctx = a->ctx_;
    dl__cgeom_make(&g, cp, a->shape[0], a->shape[1], w->shape[0], a->shape + 2, ib, w->shape + 2);
    shape[0] = g.N;
    shape[1] = g.Cb;
    for (i = 0; i < nsp; i++) shape[2 + i] = ib[i];
    y = dl__new(a->dev_, name, nsp + 2, shape);
    if (!y) return NULL;
    Cbg = g.Cb / g.G;
    CagK = g.Ca / g.G * g.K;
    /* act >= 0: the activation after it, in the same launch where the backend fuses them */
    fused = act >= 0 && y->numel && DL__BE(a)->conv_act &&
            DL__BE(a)->conv_act(a->dev_, (float *)y->data, (const float *)a->data, (const float *)w->data,
                                bias ? (const float *)bias->data : NULL, g.N, &g, act, NULL);
    done = fused ? 1 : y->numel ? dl__conv_s1_try(name, a, y, w, bias, &g, 0) : 0;
    if (done < 0) return NULL;
    if (y->numel && !done && DL__BE(a)->conv_i2c)
        done = DL__BE(a)->conv_i2c(a->dev_, (float *)y->data, (const float *)a->data, (const float *)w->data,
                                   bias ? (const float *)bias->data : NULL, g.N, &g);
    if (y->numel && !done) {
        /* per chunk of cnt samples: col (CaK, cnt, Lb) = im2col(a);
           yt_g (Cbg, cnt*Lb) = w_g (Cbg, CagK) @ col_g; y = permute(yt) */
        const dl__backend *k = DL__BE(a);
        dl__mark m = dl__arena_mark(&a->dev_->data);
        float *col, *yt;
        int64_t nfl;
        if (!dl__conv_plan(name, ctx, &g, &nb, &nfl)) return NULL;
        col = dl__conv_scratch(name, a, nfl);
        if (!col) return NULL;
        yt = col + nb * g.Ca * g.K * g.Lb;
        for (n0 = 0; n0 < g.N; n0 += nb) {
            int64_t cnt = g.N - n0 < nb ? g.N - n0 : nb, L = cnt * g.Lb;
            DL__BE(a)->im2col(a->dev_, col, (const float *)a->data + n0 * g.Ca * g.La, cnt, &g);
            k->gemm(a->dev_, false, false, Cbg, L, CagK, 1.0f, (const float *)w->data, CagK, Cbg * CagK,
                    col, L, CagK * L, 0.0f, yt, L, Cbg * L, g.G);
            dl__conv_permute(a, (float *)y->data + n0 * g.Cb * g.Lb, yt, cnt, g.Cb, g.Lb, true);
        }
        dl__arena_rewind(&a->dev_->data, m);
        if (bias) DL__BE(a)->bias_add(a->dev_, (float *)y->data, (const float *)bias->data, g.N, g.Cb, g.Lb);
    }
    in[0] = a; in[1] = w; in[2] = bias;
    if (dl__record(y, fused ? &dl__op_conv_act : &dl__op_conv, 3, in, &node) < 0) return NULL;
    if (node) dl__cparam_save(node, cp);
    if (node && fused) node->i[node->ni++] = act;
    y = dl__done(y, name);
    if (!y || act < 0 || fused) return y;
    return act == DL__U_RELU ? dl_relu(y) : act == DL__U_SIGMOID ? dl_sigmoid(y) : dl_tanh(y);
}

/* act(conv(a, w) + bias) (2-d, act >= 0) and its 2x2, stride-2 average
   pool as one node (dl__op_conv_act_pool) where the backend's conv_act
   takes both (a GPU's direct sums: d2l's LeNet), *pool left true; else
   the conv and activation only (dl__conv_run), *pool set false. */
static dl_tensor *dl__conv_pool_run(dl_tensor *a, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                                    const int64_t *ib, int act, bool *pool)
{
    int64_t shape[4];
    dl__cgeom g;
    dl_tensor *y, *yp, *in[3];
    dl__node *node;
    bool ok = cp->nsp == 2 && act >= 0 && ib[0] % 2 == 0 && ib[1] % 2 == 0 && DL__BE(a)->conv_act;
    if (ok) {
        dl__cgeom_make(&g, cp, a->shape[0], a->shape[1], w->shape[0], a->shape + 2, ib, w->shape + 2);
        ok = DL__BE(a)->conv_act(a->dev_, NULL, NULL, NULL, NULL, g.N, &g, act, NULL);   /* (the answer only) */
    }
    if (!ok) {
        *pool = false;
        return dl__conv_run(a, w, bias, cp, ib, act);
    }
    shape[0] = g.N;
    shape[1] = g.Cb;
    shape[2] = ib[0];
    shape[3] = ib[1];
    if (!(y = dl__new(a->dev_, "dl_conv", 4, shape))) return NULL;
    shape[2] /= 2;
    shape[3] /= 2;
    if (!(yp = dl__new(a->dev_, "dl_conv", 4, shape))) return NULL;
    if (!DL__BE(a)->conv_act(a->dev_, (float *)y->data, (const float *)a->data, (const float *)w->data,
                             bias ? (const float *)bias->data : NULL, g.N, &g, act, (float *)yp->data)) {
        *pool = false;   /* (it said it would) */
        return dl__conv_run(a, w, bias, cp, ib, act);
    }
    in[0] = a; in[1] = w; in[2] = bias;
    if (dl__record(yp, &dl__op_conv_act_pool, 3, in, &node) < 0) return NULL;
    if (node) {
        dl__cparam_save(node, cp);
        node->i[node->ni++] = act;
        node->i[node->ni++] = 1;
        node->saved[0] = y;
        node->nsaved = 1;
    }
    return dl__done(yp, "dl_conv");
}

/* b (N,Cb,ib...), w (Cb, Ca/G, k...), bias (Ca) or NULL -> (N, Ca, ia...) */
static dl_tensor *dl__convT_run(dl_tensor *b, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                                const int64_t *ia)
{
    const char *name = "dl_conv_transpose";
    int64_t shape[DL_MAX_DIMS], nb, n0, CagK, Cbg;
    dl__cgeom g, gt;
    dl_tensor *y, *in[3];
    dl__node *node;
    dl_ctx *ctx;
    int i, nsp = cp->nsp, done = 0;
    if (!b || !w) return NULL;
    ctx = b->ctx_;
    dl__cgeom_make(&g, cp, b->shape[0], w->shape[1] * cp->G, b->shape[1], ia, b->shape + 2,
                   w->shape + 2);
    shape[0] = g.N;
    shape[1] = g.Ca;
    for (i = 0; i < nsp; i++) shape[2 + i] = ia[i];
    y = dl__new(b->dev_, name, nsp + 2, shape);
    if (!y) return NULL;
    Cbg = g.Cb / g.G;
    CagK = g.Ca / g.G * g.K;
    /* stride 1: the conv of b with w transposed and flipped, padded by
       d(k-1) - p (when that is >= 0) */
    dl__cgeom_flip(&g, &gt);
    done = y->numel ? dl__conv_s1_try(name, b, y, w, bias, &gt, 1) : 0;
    if (done < 0) return NULL;
    if (y->numel && !done && DL__BE(b)->convT_i2c)
        done = DL__BE(b)->convT_i2c(b->dev_, (float *)y->data, (const float *)b->data, (const float *)w->data,
                                    bias ? (const float *)bias->data : NULL, g.N, &g);
    if (y->numel && !done) {
        /* per chunk: bt (Cb, cnt, Lb) = permute(b); col_g (CagK, cnt*Lb) = w_g^T @ bt_g;
           y = col2im(col) */
        const dl__backend *k = DL__BE(b);
        dl__mark m = dl__arena_mark(&b->dev_->data);
        float *col, *bt;
        int64_t nfl;
        if (!dl__conv_plan(name, ctx, &g, &nb, &nfl)) return NULL;
        col = dl__conv_scratch(name, b, nfl);
        if (!col) return NULL;
        bt = col + nb * g.Ca * g.K * g.Lb;
        for (n0 = 0; n0 < g.N; n0 += nb) {
            int64_t cnt = g.N - n0 < nb ? g.N - n0 : nb, L = cnt * g.Lb;
            dl__conv_permute(b, bt, (const float *)b->data + n0 * g.Cb * g.Lb, cnt, g.Cb, g.Lb, false);
            k->gemm(b->dev_, true, false, CagK, L, Cbg, 1.0f, (const float *)w->data, CagK, Cbg * CagK,
                    bt, L, Cbg * L, 0.0f, col, L, CagK * L, g.G);
            DL__BE(b)->col2im(b->dev_, (float *)y->data + n0 * g.Ca * g.La, col, cnt, &g);
        }
        dl__arena_rewind(&b->dev_->data, m);
        if (bias) DL__BE(b)->bias_add(b->dev_, (float *)y->data, (const float *)bias->data, g.N, g.Ca, g.La);
    }
    in[0] = b; in[1] = w; in[2] = bias;
    if (dl__record(y, &dl__op_convT, 3, in, &node) < 0) return NULL;
    if (node) dl__cparam_save(node, cp);
    return dl__done(y, name);
}

/* a (N,Ca,ia...), b (N,Cb,ib...) -> (Cb, Ca/G, k...) = sum_n b_g[n] col_g[n]^T */
static dl_tensor *dl__convW_run(dl_tensor *a, dl_tensor *b, const dl__cparam *cp, const int64_t *k)
{
    const char *name = "dl_conv_weight_grad";
    int64_t shape[DL_MAX_DIMS], nb, n0, CagK, Cbg;
    dl__cgeom g;
    dl_tensor *y, *in[2];
    dl__node *node;
    dl_ctx *ctx;
    int i, nsp = cp->nsp, done;
    if (!a || !b) return NULL;
    ctx = a->ctx_;
    dl__cgeom_make(&g, cp, a->shape[0], a->shape[1], b->shape[1], a->shape + 2, b->shape + 2, k);
    shape[0] = g.Cb;
    shape[1] = g.Ca / g.G;
    for (i = 0; i < nsp; i++) shape[2 + i] = k[i];
    y = dl__new(a->dev_, name, nsp + 2, shape);
    if (!y) return NULL;
    Cbg = g.Cb / g.G;
    CagK = g.Ca / g.G * g.K;
    done = y->numel ? dl__conv_s1_try(name, a, y, b, NULL, &g, 2) : 0;
    if (done < 0) return NULL;
    if (y->numel && !done && g.N > 0 && DL__BE(a)->conv_i2c_wgrad)
        done = DL__BE(a)->conv_i2c_wgrad(a->dev_, (float *)y->data, (const float *)a->data, (const float *)b->data,
                                         g.N, &g);
    if (y->numel && !done) {
        /* per chunk: col = im2col(a), bt = permute(b);
           w_g (Cbg, CagK) += bt_g (Cbg, cnt*Lb) @ col_g^T */
        const dl__backend *kt = DL__BE(a);
        dl__mark m = dl__arena_mark(&a->dev_->data);
        float *col, *bt;
        if (g.N == 0) kt->fill(a->dev_, (float *)y->data, y->numel, 0.0f);
        int64_t nfl;
        if (!dl__conv_plan(name, ctx, &g, &nb, &nfl)) return NULL;
        col = g.N ? dl__conv_scratch(name, a, nfl) : NULL;
        if (g.N && !col) return NULL;
        bt = col ? col + nb * g.Ca * g.K * g.Lb : NULL;
        for (n0 = 0; n0 < g.N; n0 += nb) {
            int64_t cnt = g.N - n0 < nb ? g.N - n0 : nb, L = cnt * g.Lb;
            DL__BE(a)->im2col(a->dev_, col, (const float *)a->data + n0 * g.Ca * g.La, cnt, &g);
            dl__conv_permute(b, bt, (const float *)b->data + n0 * g.Cb * g.Lb, cnt, g.Cb, g.Lb, false);
            kt->gemm(a->dev_, false, true, Cbg, CagK, L, 1.0f, bt, L, Cbg * L, col, L, CagK * L,
                     n0 == 0 ? 0.0f : 1.0f, (float *)y->data, CagK, Cbg * CagK, g.G);
        }
        dl__arena_rewind(&a->dev_->data, m);
    }
    in[0] = a; in[1] = b;
    if (dl__record(y, &dl__op_convW, 2, in, &node) < 0) return NULL;
    if (node) dl__cparam_save(node, cp);
    return dl__done(y, name);
}

/* ------------------------------------------------------------ conv: public */

dl_conv_desc dl_conv_desc_make(int64_t stride, int64_t padding, int64_t dilation, int64_t groups)
{
    dl_conv_desc d;
    int i;
    memset(&d, 0, sizeof d);
    for (i = 0; i < DL_MAX_SPATIAL; i++) {
        d.stride[i] = stride;
        d.padding[i] = padding;
        d.dilation[i] = dilation;
    }
    d.groups = groups;
    return d;
}

static bool dl__same_dev(const char *op, const char *an, const dl_tensor *a, const char *bn,
                         const dl_tensor *b)
{
    char da[32], db[32];
    if (a->ctx_ != b->ctx_) {
        dl__err(a->ctx_, DL_ERR_ARG, "%s: %s and %s belong to different contexts", op, an, bn);
        return false;
    }
    if (a->device.type != b->device.type || a->device.index != b->device.index) {
        dl__err(a->ctx_, DL_ERR_DEVICE, "%s: %s %s is on %s but %s %s is on %s; move one with dl_to()",
                op, an, dl__sh(a), dl__dev_str(a->device, da, sizeof da), bn, dl__sh(b),
                dl__dev_str(b->device, db, sizeof db));
        return false;
    }
    return true;
}

static const char *dl__sp_names(int nsp)
{
    return nsp == 1 ? "L" : nsp == 2 ? "H,W" : "D,H,W";
}

/* floor(a / b) for b > 0 */
static int64_t dl__floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* act >= 0 (DL__U_RELU, SIGMOID, TANH; not transposed): that activation of
   the result, fused where the backend can (dl__conv_run) */
static dl_tensor *dl__conv_api(const char *name, int nsp, bool transposed, dl_tensor *x,
                               dl_tensor *w, dl_tensor *b, const dl_conv_desc *d, int act, bool *pool)
{
    dl_ctx *ctx;
    dl__cparam cp;
    int64_t out[3], C, OC, G;
    bool unbatched;
    int i;
    dl_tensor *y;
    if (!x || !w) return NULL;
    if (!dl__live(name, "x", x) || !dl__live(name, "w", w)) return NULL;
    if (b && !dl__live(name, "b", b)) return NULL;
    ctx = x->ctx_;
    if (!dl__same_dev(name, "x", x, "w", w) || (b && !dl__same_dev(name, "x", x, "b", b))) return NULL;
    if (!dl__f32(name, "x", x) || !dl__f32(name, "w", w) || (b && !dl__f32(name, "b", b))) return NULL;
    if (x->ndim != nsp + 2 && x->ndim != nsp + 1) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: x %s must have %d dims (N,C,%s) or %d unbatched (C,%s)",
                name, dl__sh(x), nsp + 2, dl__sp_names(nsp), nsp + 1, dl__sp_names(nsp));
        return NULL;
    }
    unbatched = x->ndim == nsp + 1;
    if (w->ndim != nsp + 2) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: w %s must have %d dims (%s, %s)", name, dl__sh(w), nsp + 2,
                transposed ? "C_in, OC/groups" : "OC, C/groups", nsp == 1 ? "k" : nsp == 2 ? "kH, kW" : "kD, kH, kW");
        return NULL;
    }
    G = d && d->groups ? d->groups : 1;
    if (G < 1) {
        dl__err(ctx, DL_ERR_ARG, "%s: groups=%lld must be >= 1 (0 means 1)", name, (long long)G);
        return NULL;
    }
    memset(&cp, 0, sizeof cp);
    cp.nsp = nsp;
    cp.G = G;
    if (d && d->padding_same && transposed) {
        dl__err(ctx, DL_ERR_ARG, "%s: padding_same applies to dl_conv*d only (PyTorch has no "
                "padding='same' for transposed convolution)", name);
        return NULL;
    }
    for (i = 0; i < nsp; i++) {
        int64_t s = d ? d->stride[i] : 0, p = d ? d->padding[i] : 0, dil = d ? d->dilation[i] : 0;
        int64_t op = d ? d->output_padding[i] : 0;
        if (s < 0 || dil < 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s[%d]=%lld must be >= 1 (0 means 1)", name,
                    s < 0 ? "stride" : "dilation", i, (long long)(s < 0 ? s : dil));
            return NULL;
        }
        if (s == 0) s = 1;
        if (dil == 0) dil = 1;
        if (p < 0 || op < 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s[%d]=%lld must be >= 0", name,
                    p < 0 ? "padding" : "output_padding", i, (long long)(p < 0 ? p : op));
            return NULL;
        }
        if (s > DL__PACK_MAX || dil > DL__PACK_MAX || p > DL__PACK_MAX) {
            dl__err(ctx, DL_ERR_ARG, "%s: stride %lld, padding %lld, dilation %lld in dim %d: "
                    "each must be at most %lld", name, (long long)s, (long long)p, (long long)dil,
                    i, (long long)DL__PACK_MAX);
            return NULL;
        }
        if (!transposed && op != 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: output_padding[%d]=%lld applies to transposed "
                    "convolution only", name, i, (long long)op);
            return NULL;
        }
        if (transposed && op >= s && op >= dil) {
            dl__err(ctx, DL_ERR_ARG, "%s: output_padding[%d]=%lld must be smaller than either "
                    "stride (%lld) or dilation (%lld)", name, i, (long long)op, (long long)s,
                    (long long)dil);
            return NULL;
        }
        if (d && d->padding_same && s != 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: padding_same needs stride 1 in every dim (as PyTorch's "
                    "padding='same'), but stride[%d]=%lld", name, i, (long long)s);
            return NULL;
        }
        cp.s[i] = s;
        cp.p[i] = p;
        cp.d[i] = dil;
    }
    C = x->shape[unbatched ? 0 : 1];
    if (!transposed) {
        OC = w->shape[0];
        if (C % G != 0) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels, not divisible by groups=%lld",
                    name, dl__sh(x), (long long)C, (long long)G);
            return NULL;
        }
        if (OC % G != 0) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: w %s has %lld output channels (dim 0), not divisible by "
                    "groups=%lld", name, dl__sh(w), (long long)OC, (long long)G);
            return NULL;
        }
        if (w->shape[1] * G != C) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels but w %s expects "
                    "w.shape[1]*groups = %lld*%lld = %lld (w is (OC, C/groups, %s))", name,
                    dl__sh(x), (long long)C, dl__sh(w), (long long)w->shape[1], (long long)G,
                    (long long)(w->shape[1] * G), nsp == 1 ? "k" : nsp == 2 ? "kH, kW" : "kD, kH, kW");
            return NULL;
        }
    } else {
        OC = w->shape[1] * G;
        if (w->shape[0] != C) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels but w %s expects w.shape[0] = "
                    "%lld (w is (C_in, OC/groups, %s))", name, dl__sh(x), (long long)C, dl__sh(w),
                    (long long)w->shape[0], nsp == 1 ? "k" : nsp == 2 ? "kH, kW" : "kD, kH, kW");
            return NULL;
        }
        if (C % G != 0) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels, not divisible by groups=%lld",
                    name, dl__sh(x), (long long)C, (long long)G);
            return NULL;
        }
    }
    if (b && (b->ndim != 1 || b->shape[0] != OC)) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: b %s must be (OC) = (%lld), one value per output channel",
                name, dl__sh(b), (long long)OC);
        return NULL;
    }
    for (i = 0; i < nsp; i++) {
        int64_t in = x->shape[(unbatched ? 1 : 2) + i], k = w->shape[2 + i];
        int64_t ek = cp.d[i] * (k - 1) + 1;
        if (k < 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: w %s has kernel size 0 in spatial dim %d", name,
                    dl__sh(w), i);
            return NULL;
        }
        if (d && d->padding_same) {
            int64_t total = cp.d[i] * (k - 1);
            cp.p[i] = total / 2;     /* the odd extra unit goes on the right, as PyTorch */
            out[i] = in;
            if (cp.p[i] > DL__PACK_MAX) {
                dl__err(ctx, DL_ERR_ARG, "%s: padding %lld in dim %d is larger than %lld", name,
                        (long long)cp.p[i], i, (long long)DL__PACK_MAX);
                return NULL;
            }
        } else if (!transposed) {
            int64_t num = in + 2 * cp.p[i] - ek;
            out[i] = num < 0 ? 0 : num / cp.s[i] + 1;
            if (out[i] < 1) {
                dl__err(ctx, DL_ERR_SHAPE, "%s: x %s, w %s: spatial dim %d: the input padded to "
                        "%lld (in %lld + 2*padding %lld) is smaller than the dilated kernel %lld "
                        "(dilation %lld*(k %lld-1)+1): output size would be < 1", name, dl__sh(x),
                        dl__sh(w), i, (long long)(in + 2 * cp.p[i]), (long long)in,
                        (long long)cp.p[i], (long long)ek, (long long)cp.d[i], (long long)k);
                return NULL;
            }
        } else {
            out[i] = (in - 1) * cp.s[i] - 2 * cp.p[i] + ek + (d ? d->output_padding[i] : 0);
            if (out[i] < 1) {
                dl__err(ctx, DL_ERR_SHAPE, "%s: x %s, w %s: spatial dim %d: output size (in-1)*stride "
                        "- 2*padding + dilation*(k-1) + output_padding + 1 = %lld is < 1", name,
                        dl__sh(x), dl__sh(w), i, (long long)out[i]);
                return NULL;
            }
        }
    }
    if (unbatched) x = dl_unsqueeze(x, 0);
    if (transposed) y = dl__convT_run(x, w, b, &cp, out);
    else y = pool ? dl__conv_pool_run(x, w, b, &cp, out, act, pool) : dl__conv_run(x, w, b, &cp, out, act);
    return dl__end(ctx, unbatched ? dl_squeeze(y, 0) : y, name);
}

dl_tensor *dl_conv1d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv1d", 1, false, x, w, b, d, -1, NULL); }
dl_tensor *dl_conv2d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv2d", 2, false, x, w, b, d, -1, NULL); }
dl_tensor *dl_conv3d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv3d", 3, false, x, w, b, d, -1, NULL); }
dl_tensor *dl_conv_transpose1d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv_transpose1d", 1, true, x, w, b, d, -1, NULL); }
dl_tensor *dl_conv_transpose2d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv_transpose2d", 2, true, x, w, b, d, -1, NULL); }
dl_tensor *dl_conv_transpose3d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv_transpose3d", 3, true, x, w, b, d, -1, NULL); }

/* ------------------------------------------------------------ pooling */

/* (dl__pparam: above, with the convolution's fused pool) */
static void dl__pparam_save(dl__node *n, const dl__pparam *pp)
{
    int i;
    n->i[0] = (pp->adaptive ? 1 : 0) | (pp->cip ? 2 : 0);
    for (i = 0; i < 3; i++) n->i[1 + i] = dl__pack3(pp->k[i], pp->s[i], pp->p[i]);
    n->ni = 4;
}

static void dl__pparam_load(const dl__node *n, int nsp, dl__pparam *pp)
{
    int i;
    pp->nsp = nsp;
    pp->adaptive = (n->i[0] & 1) != 0;
    pp->cip = (n->i[0] & 2) != 0;
    for (i = 0; i < 3; i++) {
        pp->k[i] = dl__unpack(n->i[1 + i], 0);
        pp->s[i] = dl__unpack(n->i[1 + i], 1);
        pp->p[i] = dl__unpack(n->i[1 + i], 2);
    }
}

static void dl__pgeom_make(dl__pgeom *g, int nsp, const int64_t *ia, const int64_t *ob,
                           const int64_t *k, const int64_t *s, const int64_t *p, const int64_t *d)
{
    int i;
    g->La = g->Lb = 1;
    for (i = 0; i < 3; i++) {   /* the real dims last */
        int j = i - (3 - nsp);
        bool on = j >= 0;
        g->ia[i] = on ? ia[j] : 1;
        g->ob[i] = on ? ob[j] : 1;
        g->k[i] = on && k ? k[j] : 1;
        g->s[i] = on && s ? s[j] : 1;
        g->p[i] = on && p ? p[j] : 0;
        g->d[i] = on && d ? d[j] : 1;
        g->La *= g->ia[i];
        g->Lb *= g->ob[i];
    }
    g->adaptive = false;
    g->count_include_pad = false;
}

/* --- max pooling: y = x[idx];  dx = unpool(g, idx);  unpool's backward: gather */
static dl_tensor *dl__unpool(dl_tensor *g, dl_tensor *idx, int ndim, const int64_t *xshape);
static dl_tensor *dl__pool_gather(dl_tensor *x, dl_tensor *idx);

static dl_result dl__maxpool_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__unpool(g, n->saved[0], n->in[0]->ndim, n->in[0]->shape);
    return DL_OK;
}
static dl_result dl__unpool_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__pool_gather(g, n->saved[0]);
    return DL_OK;
}
static dl_result dl__gather_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__unpool(g, n->saved[0], n->in[0]->ndim, n->in[0]->shape);
    return DL_OK;
}
static const dl__op dl__op_maxpool = {"dl_max_pool", dl__maxpool_bwd, 0, 0};
static const dl__op dl__op_unpool = {"dl_max_pool_backward", dl__unpool_bwd, 0, 0};
static const dl__op dl__op_pgather = {"dl_max_pool_gather", dl__gather_bwd, 0, 0};

/* g (N,C,ob...) scattered to (N,C,ia...) at idx (N,C,ob...) */
static dl_tensor *dl__unpool(dl_tensor *g, dl_tensor *idx, int ndim, const int64_t *xshape)
{
    dl_tensor *y;
    dl__node *n;
    int64_t planes;
    if (!g || !idx) return NULL;
    y = dl__new(g->dev_, "dl_max_pool_backward", ndim, xshape);
    if (!y) return NULL;
    planes = xshape[0] * xshape[1];
    if (y->numel)
        DL__BE(g)->unpool(g->dev_, (float *)y->data, (const float *)g->data,
                          (const int64_t *)idx->data, planes, y->numel / planes,
                          planes ? g->numel / planes : 0);
    if (dl__record(y, &dl__op_unpool, 1, &g, &n) < 0) return NULL;
    if (n) { n->saved[0] = idx; n->nsaved = 1; }
    return dl__done(y, "dl_max_pool_backward");
}

/* x (N,C,ia...) read at idx (N,C,ob...) */
static dl_tensor *dl__pool_gather(dl_tensor *x, dl_tensor *idx)
{
    dl_tensor *y;
    dl__node *n;
    int64_t planes;
    if (!x || !idx) return NULL;
    y = dl__new(x->dev_, "dl_max_pool_gather", idx->ndim, idx->shape);
    if (!y) return NULL;
    planes = x->shape[0] * x->shape[1];
    if (y->numel)
        DL__BE(x)->gather(x->dev_, (float *)y->data, (const float *)x->data,
                          (const int64_t *)idx->data, planes, x->numel / planes, y->numel / planes);
    if (dl__record(y, &dl__op_pgather, 1, &x, &n) < 0) return NULL;
    if (n) { n->saved[0] = idx; n->nsaved = 1; }
    return dl__done(y, "dl_max_pool_gather");
}

/* --- average pooling: y = A x (linear);  dx = A^T g;  A^T's backward is A */
static dl_tensor *dl__avgpool_run(dl_tensor *x, const dl__pparam *pp, const int64_t *ob);
static dl_tensor *dl__avgpool_adj(dl_tensor *g, const dl__pparam *pp, const int64_t *ia);

static dl_result dl__avgpool_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__pparam pp;
    dl__pparam_load(n, n->in[0]->ndim - 2, &pp);
    gin[0] = dl__avgpool_adj(g, &pp, n->in[0]->shape + 2);
    return DL_OK;
}
static dl_result dl__avgpool_adj_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__pparam pp;
    dl__pparam_load(n, n->in[0]->ndim - 2, &pp);
    gin[0] = dl__avgpool_run(g, &pp, n->in[0]->shape + 2);
    return DL_OK;
}
static const dl__op dl__op_avgpool = {"dl_avg_pool", dl__avgpool_bwd, 0, 0};
static const dl__op dl__op_avgpool_adj = {"dl_avg_pool_backward", dl__avgpool_adj_bwd, 0, 0};

static void dl__pgeom_from(dl__pgeom *g, const dl__pparam *pp, const int64_t *ia, const int64_t *ob)
{
    dl__pgeom_make(g, pp->nsp, ia, ob, pp->k, pp->s, pp->p, NULL);
    g->adaptive = pp->adaptive;
    g->count_include_pad = pp->cip;
}

static dl_tensor *dl__avgpool_run(dl_tensor *x, const dl__pparam *pp, const int64_t *ob)
{
    const char *name = pp->adaptive ? "dl_adaptive_avg_pool" : "dl_avg_pool";
    int64_t shape[DL_MAX_DIMS];
    dl__pgeom g;
    dl_tensor *y;
    dl__node *n;
    int i;
    if (!x) return NULL;
    shape[0] = x->shape[0];
    shape[1] = x->shape[1];
    for (i = 0; i < pp->nsp; i++) shape[2 + i] = ob[i];
    y = dl__new(x->dev_, name, pp->nsp + 2, shape);
    if (!y) return NULL;
    dl__pgeom_from(&g, pp, x->shape + 2, ob);
    if (y->numel)
        DL__BE(x)->avg_pool(x->dev_, (float *)y->data, (const float *)x->data,
                            shape[0] * shape[1], &g);
    if (dl__record(y, &dl__op_avgpool, 1, &x, &n) < 0) return NULL;
    if (n) dl__pparam_save(n, pp);
    return dl__done(y, name);
}

static dl_tensor *dl__avgpool_adj(dl_tensor *g, const dl__pparam *pp, const int64_t *ia)
{
    const char *name = "dl_avg_pool_backward";
    int64_t shape[DL_MAX_DIMS];
    dl__pgeom pg;
    dl_tensor *y;
    dl__node *n;
    int i;
    if (!g) return NULL;
    shape[0] = g->shape[0];
    shape[1] = g->shape[1];
    for (i = 0; i < pp->nsp; i++) shape[2 + i] = ia[i];
    y = dl__new(g->dev_, name, pp->nsp + 2, shape);
    if (!y) return NULL;
    dl__pgeom_from(&pg, pp, ia, g->shape + 2);
    if (y->numel)
        DL__BE(g)->avg_pool_adj(g->dev_, (float *)y->data, (const float *)g->data,
                                shape[0] * shape[1], &pg);
    if (dl__record(y, &dl__op_avgpool_adj, 1, &g, &n) < 0) return NULL;
    if (n) dl__pparam_save(n, pp);
    return dl__done(y, name);
}

dl_pool_desc dl_pool_desc_make(int64_t kernel, int64_t stride, int64_t padding, bool ceil_mode,
                               bool count_include_pad)
{
    dl_pool_desc d;
    int i;
    memset(&d, 0, sizeof d);
    for (i = 0; i < DL_MAX_SPATIAL; i++) {
        d.kernel[i] = kernel;
        d.stride[i] = stride;
        d.padding[i] = padding;
        d.dilation[i] = 1;
    }
    d.ceil_mode = ceil_mode;
    d.no_count_include_pad = !count_include_pad;
    return d;
}

/* x must be (N,C,spatial...) or (C,spatial...); false + error otherwise */
static bool dl__pool_input(const char *name, int nsp, dl_tensor *x)
{
    if (!dl__live(name, "x", x) || !dl__f32(name, "x", x)) return false;
    if (x->ndim != nsp + 2 && x->ndim != nsp + 1) {
        dl__err(x->ctx_, DL_ERR_SHAPE, "%s: x %s must have %d dims (N,C,%s) or %d unbatched (C,%s)",
                name, dl__sh(x), nsp + 2, dl__sp_names(nsp), nsp + 1, dl__sp_names(nsp));
        return false;
    }
    return true;
}

static dl_tensor *dl__pool_api(const char *name, int nsp, bool is_max, dl_tensor *x,
                               const dl_pool_desc *d)
{
    dl_ctx *ctx;
    int64_t k[3], s[3], p[3], dil[3], ob[3];
    bool unbatched;
    int i;
    dl_tensor *y;
    if (!x) return NULL;
    if (!dl__pool_input(name, nsp, x)) return NULL;
    ctx = x->ctx_;
    if (!d) {
        dl__err(ctx, DL_ERR_ARG, "%s: desc is NULL; the kernel size is required "
                "(dl_pool_desc_make(kernel, stride, padding, ceil_mode, count_include_pad))", name);
        return NULL;
    }
    unbatched = x->ndim == nsp + 1;
    for (i = 0; i < nsp; i++) {
        int64_t in = x->shape[(unbatched ? 1 : 2) + i], num;
        k[i] = d->kernel[i];
        s[i] = d->stride[i] ? d->stride[i] : k[i];
        p[i] = d->padding[i];
        dil[i] = d->dilation[i] ? d->dilation[i] : 1;
        if (k[i] < 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: kernel[%d]=%lld must be >= 1", name, i, (long long)k[i]);
            return NULL;
        }
        if (s[i] < 1 || dil[i] < 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s[%d]=%lld must be >= 1 (0 means %s)", name,
                    s[i] < 1 ? "stride" : "dilation", i, (long long)(s[i] < 1 ? s[i] : dil[i]),
                    s[i] < 1 ? "the kernel size" : "1");
            return NULL;
        }
        if (p[i] < 0 || p[i] > k[i] / 2) {
            dl__err(ctx, DL_ERR_ARG, "%s: padding[%d]=%lld must be between 0 and half the "
                    "kernel size (kernel[%d]=%lld)", name, i, (long long)p[i], i, (long long)k[i]);
            return NULL;
        }
        if (!is_max && dil[i] != 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: dilation[%d]=%lld: dilation applies to max pooling only",
                    name, i, (long long)dil[i]);
            return NULL;
        }
        if (!is_max && nsp == 3 && in < k[i]) {   /* PyTorch's avg_pool3d checks it, padding aside */
            dl__err(ctx, DL_ERR_SHAPE, "%s: input %s is smaller than the kernel in spatial dim %d (%lld < "
                    "kernel[%d]=%lld), as PyTorch's avg_pool3d refuses", name, dl__sh(x), i, (long long)in, i,
                    (long long)k[i]);
            return NULL;
        }
        if (k[i] > DL__PACK_MAX || s[i] > DL__PACK_MAX || dil[i] > DL__PACK_MAX) {
            dl__err(ctx, DL_ERR_ARG, "%s: kernel %lld, stride %lld, dilation %lld in dim %d: each "
                    "must be at most %lld", name, (long long)k[i], (long long)s[i],
                    (long long)dil[i], i, (long long)DL__PACK_MAX);
            return NULL;
        }
        /* PyTorch's pooling_output_shape */
        num = in + 2 * p[i] - dil[i] * (k[i] - 1) - 1 + (d->ceil_mode ? s[i] - 1 : 0);
        ob[i] = dl__floordiv(num, s[i]) + 1;
        if (d->ceil_mode && (ob[i] - 1) * s[i] >= in + p[i]) ob[i]--;
        if (ob[i] < 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s: spatial dim %d of size %lld with padding %lld is "
                    "smaller than the %swindow %lld: output size %lld < 1", name, dl__sh(x), i,
                    (long long)in, (long long)p[i], is_max && dil[i] > 1 ? "dilated " : "",
                    (long long)(dil[i] * (k[i] - 1) + 1), (long long)ob[i]);
            return NULL;
        }
    }
    if (unbatched) x = dl_unsqueeze(x, 0);
    if (!x) return NULL;
    if (is_max) {
        dl__pgeom g;
        dl_tensor *idx = NULL, *in1 = x;
        dl__node *n;
        int64_t shape[DL_MAX_DIMS];
        bool rec = dl__grad_on(ctx) && x->requires_grad;
        shape[0] = x->shape[0];
        shape[1] = x->shape[1];
        for (i = 0; i < nsp; i++) shape[2 + i] = ob[i];
        y = dl__new(x->dev_, name, nsp + 2, shape);
        if (!y) return NULL;
        if (rec) {
            idx = dl__make(x->dev_, name, DL_DTYPE_I64, nsp + 2, shape, false, NULL);
            if (!idx) return NULL;
        }
        dl__pgeom_make(&g, nsp, x->shape + 2, ob, k, s, p, dil);
        if (y->numel)
            DL__BE(x)->max_pool(x->dev_, (float *)y->data, idx ? (int64_t *)idx->data : NULL,
                                (const float *)x->data, shape[0] * shape[1], &g);
        if (dl__record(y, &dl__op_maxpool, 1, &in1, &n) < 0) return NULL;
        if (n) { n->saved[0] = idx; n->nsaved = 1; }
        y = dl__check(y, name);
    } else {
        dl__pparam pp;
        memset(&pp, 0, sizeof pp);
        pp.nsp = nsp;
        pp.cip = !d->no_count_include_pad;
        for (i = 0; i < nsp; i++) { pp.k[i] = k[i]; pp.s[i] = s[i]; pp.p[i] = p[i]; }
        y = dl__avgpool_run(x, &pp, ob);
    }
    return dl__end(ctx, unbatched ? dl_squeeze(y, 0) : y, name);
}

dl_tensor *dl_max_pool1d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_max_pool1d", 1, true, x, d); }
dl_tensor *dl_max_pool2d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_max_pool2d", 2, true, x, d); }
dl_tensor *dl_max_pool3d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_max_pool3d", 3, true, x, d); }
dl_tensor *dl_avg_pool1d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_avg_pool1d", 1, false, x, d); }
dl_tensor *dl_avg_pool2d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_avg_pool2d", 2, false, x, d); }
dl_tensor *dl_avg_pool3d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_avg_pool3d", 3, false, x, d); }

static dl_tensor *dl__adaptive_api(const char *name, int nsp, dl_tensor *x, dl_shape os)
{
    dl__pparam pp;
    bool unbatched;
    int i;
    dl_tensor *y;
    dl_ctx *ctx;
    if (!x) return NULL;
    if (!dl__pool_input(name, nsp, x)) return NULL;
    ctx = x->ctx_;
    if (os.ndim != nsp) {
        dl__err(x->ctx_, DL_ERR_ARG, "%s: output_size %s has %d entries; it needs one per spatial "
                "dim (%d)", name, dl__shp(x->ctx_, &os), os.ndim, nsp);
        return NULL;
    }
    unbatched = x->ndim == nsp + 1;
    for (i = 0; i < nsp; i++) {
        int64_t in = x->shape[(unbatched ? 1 : 2) + i];
        if (os.d[i] < 0) {
            dl__err(x->ctx_, DL_ERR_ARG, "%s: output_size %s has a negative entry", name,
                    dl__shp(x->ctx_, &os));
            return NULL;
        }
        if (in < 1 && os.d[i] > 0) {
            dl__err(x->ctx_, DL_ERR_SHAPE, "%s: x %s has size 0 in spatial dim %d: nothing to "
                    "average", name, dl__sh(x), i);
            return NULL;
        }
    }
    memset(&pp, 0, sizeof pp);
    pp.nsp = nsp;
    pp.adaptive = true;
    for (i = 0; i < 3; i++) { pp.k[i] = 1; pp.s[i] = 1; }
    if (unbatched) x = dl_unsqueeze(x, 0);
    y = dl__avgpool_run(x, &pp, os.d);
    return dl__end(ctx, unbatched ? dl_squeeze(y, 0) : y, name);
}

dl_tensor *dl_adaptive_avg_pool1d(dl_tensor *x, dl_shape s) { return dl__adaptive_api("dl_adaptive_avg_pool1d", 1, x, s); }
dl_tensor *dl_adaptive_avg_pool2d(dl_tensor *x, dl_shape s) { return dl__adaptive_api("dl_adaptive_avg_pool2d", 2, x, s); }
dl_tensor *dl_adaptive_avg_pool3d(dl_tensor *x, dl_shape s) { return dl__adaptive_api("dl_adaptive_avg_pool3d", 3, x, s); }



// >>section nn: modules
/* A module holds its own parameters and buffers (in registration order) and
   its children. state_dict order is: own parameters, own buffers, then each
   child's entries under "<child>.", as torch.nn.Module._save_to_state_dict. */

#define DL__MOD_MAGIC 0x444c4d44u
#define DL__NAME_MAX 64
/* the module tree's walks stop at this depth with an error (a chain of
   modules deeper than any model: their recursion stays bounded) */
#define DL__MOD_DEPTH 256

typedef struct dl__mtensor { char name[DL__NAME_MAX]; dl_tensor *t; bool param; } dl__mtensor;
typedef struct dl__mchild { char name[DL__NAME_MAX]; dl_module *m; } dl__mchild;

typedef struct dl__ncache { dl_named_tensor *v; int cap; char *names; size_t ncap; } dl__ncache;

struct dl_module {
    uint32_t magic;
    uint32_t visit;                   /* dl__mod_contains's walk mark */
    dl_ctx *ctx;
    char type[32];
    dl_module_fn forward;
    void *state;
    bool training;
    int nt, capt;
    dl__mtensor *ts;
    int nc, capc;
    dl__mchild *cs;
    dl_tensor **scratch;              /* de-duplicated parameter list (clip_grad_norm) */
    int nscratch;
    dl_tensor **groups;               /* dl_module_decay_groups' arrays */
    int ngroups_cap;
    dl__ncache sd, np;
    char *path;                       /* scratch for names while walking */
    size_t pathcap;
    dl__mtset *zset;                  /* dl_module_zero_grad's multi-tensor state (made at first use) */
};

static void dl__module_destroy(void *p)
{
    dl_module *m = (dl_module *)p;
    m->magic = 0;
    DL_FREE(m->ts);
    DL_FREE(m->cs);
    DL_FREE(m->scratch);
    DL_FREE(m->groups);
    DL_FREE(m->sd.v);
    DL_FREE(m->sd.names);
    DL_FREE(m->np.v);
    DL_FREE(m->np.names);
    DL_FREE(m->path);
    DL_FREE(m->state);
    if (m->zset) dl__mt_free(m->zset);
    DL_FREE(m->zset);
    DL_FREE(m);
}

static bool dl__mod_ok(const dl_module *m) { return m && m->magic == DL__MOD_MAGIC; }

dl_module *dl_module_new(dl_ctx *ctx, const char *type, dl_module_fn forward, size_t state_bytes)
{
    dl_module *m;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_module_new: ctx is NULL"); return NULL; }
    m = (dl_module *)dl__malloc(ctx, sizeof(dl_module));
    if (!m) { dl__err(ctx, DL_ERR_OOM, "dl_module_new: out of memory"); return NULL; }
    memset(m, 0, sizeof *m);
    if (state_bytes) {
        m->state = dl__malloc(ctx, state_bytes);
        if (!m->state) {
            DL_FREE(m);
            dl__err(ctx, DL_ERR_OOM, "dl_module_new: cannot allocate %zu bytes of state for %s",
                    state_bytes, type ? type : "a module");
            return NULL;
        }
        memset(m->state, 0, state_bytes);
    }
    m->magic = DL__MOD_MAGIC;
    m->ctx = ctx;
    snprintf(m->type, sizeof m->type, "%s", type ? type : "Module");
    m->forward = forward;
    m->training = true;
    if (!dl__own(ctx, dl__module_destroy, m)) { dl__module_destroy(m); return NULL; }
    return m;
}

void *dl_module_state(dl_module *m) { return dl__mod_ok(m) ? m->state : NULL; }
const char *dl_module_type(const dl_module *m) { return dl__mod_ok(m) ? m->type : ""; }
dl_ctx *dl_module_ctx(const dl_module *m) { return dl__mod_ok(m) ? m->ctx : NULL; }

/* A local name: 1..63 chars, no '.', not used in m yet. */
static bool dl__mod_name_ok(dl_module *m, const char *fn, const char *name)
{
    int i;
    if (!name || !name[0] || strlen(name) >= DL__NAME_MAX || strchr(name, '.')) {
        dl__err(m->ctx, DL_ERR_ARG, "%s: %s: name \"%s\" must be 1..%d characters without '.'",
                fn, m->type, name ? name : "(null)", DL__NAME_MAX - 1);
        return false;
    }
    for (i = 0; i < m->nt; i++)
        if (strcmp(m->ts[i].name, name) == 0) goto dup;
    for (i = 0; i < m->nc; i++)
        if (strcmp(m->cs[i].name, name) == 0) goto dup;
    return true;
dup:
    dl__err(m->ctx, DL_ERR_ARG, "%s: %s already has a parameter, buffer or child named \"%s\"",
            fn, m->type, name);
    return false;
}

static bool dl__grow(dl_ctx *ctx, void **arr, int *cap, int need, size_t esize)
{
    int nc;
    void *p;
    if (need <= *cap) return true;
    nc = *cap ? *cap * 2 : 4;
    while (nc < need) nc *= 2;
    p = DL_REALLOC(*arr, esize * (size_t)nc);
    ctx->alloc_calls++;
    if (!p) { dl__err(ctx, DL_ERR_OOM, "dl_module: out of memory"); return false; }
    *arr = p;
    *cap = nc;
    return true;
}

static dl_tensor *dl__mod_register(dl_module *m, const char *fn, const char *name, dl_tensor *init,
                                   bool param)
{
    dl_tensor *t;
    void *arr;
    if (!dl__mod_ok(m) || !init) return NULL;
    if (!dl__valid(fn, "init", init)) return NULL;
    if (init->ctx_ != m->ctx) {
        dl__err(m->ctx, DL_ERR_ARG, "%s: init for \"%s\" belongs to another context", fn,
                name ? name : "");
        return NULL;
    }
    if (param && init->dtype != DL_DTYPE_F32) {
        dl__err(m->ctx, DL_ERR_DTYPE, "%s: %s.%s: init %s has dtype %s; parameters must be float32",
                fn, m->type, name ? name : "", dl__sh(init), dl__dtype_str(init->dtype));
        return NULL;
    }
    if (!dl__mod_name_ok(m, fn, name)) return NULL;
    arr = m->ts;
    if (!dl__grow(m->ctx, &arr, &m->capt, m->nt + 1, sizeof(dl__mtensor))) return NULL;
    m->ts = (dl__mtensor *)arr;
    t = dl_keep(init);
    if (!t) return NULL;
    dl_set_name(t, name);
    t->requires_grad = param;
    snprintf(m->ts[m->nt].name, DL__NAME_MAX, "%s", name);
    m->ts[m->nt].t = t;
    m->ts[m->nt].param = param;
    m->nt++;
    return t;
}

dl_tensor *dl_module_param(dl_module *m, const char *name, dl_tensor *init)
{
    return dl__mod_register(m, "dl_module_param", name, init, true);
}

dl_tensor *dl_module_buffer(dl_module *m, const char *name, dl_tensor *init)
{
    return dl__mod_register(m, "dl_module_buffer", name, init, false);
}

/* whether x is root or under it; each module once a walk (mark), so that a
   child shared at every level is not walked 2^depth times */
static bool dl__mod_contains(dl_module *root, const dl_module *x, int depth, uint32_t mark)
{
    int i;
    if (root == x) return true;
    if (depth > DL__MOD_DEPTH) return true;     /* treat absurd depth as a cycle */
    if (root->visit == mark) return false;
    root->visit = mark;
    for (i = 0; i < root->nc; i++)
        if (dl__mod_contains(root->cs[i].m, x, depth + 1, mark)) return true;
    return false;
}

dl_module *dl_module_add(dl_module *parent, const char *name, dl_module *child)
{
    void *arr;
    if (!dl__mod_ok(parent) || !child) return NULL;
    if (!dl__mod_ok(child)) {
        dl__err(parent->ctx, DL_ERR_ARG, "dl_module_add: child \"%s\" is not a module", name ? name : "");
        return NULL;
    }
    if (child->ctx != parent->ctx) {
        dl__err(parent->ctx, DL_ERR_ARG, "dl_module_add: child \"%s\" belongs to another context",
                name ? name : "");
        return NULL;
    }
    if (++parent->ctx->mod_mark == 0) parent->ctx->mod_mark = 1;   /* (0: never walked) */
    if (dl__mod_contains(child, parent, 0, parent->ctx->mod_mark)) {
        dl__err(parent->ctx, DL_ERR_ARG, "dl_module_add: adding %s as \"%s\" of %s would make a "
                "cycle (a module cannot contain itself)", child->type, name ? name : "", parent->type);
        return NULL;
    }
    if (!dl__mod_name_ok(parent, "dl_module_add", name)) return NULL;
    arr = parent->cs;
    if (!dl__grow(parent->ctx, &arr, &parent->capc, parent->nc + 1, sizeof(dl__mchild))) return NULL;
    parent->cs = (dl__mchild *)arr;
    /* under DL__NAME_MAX (dl__mod_name_ok); not snprintf, which g++ -O3 flags
       as truncating a caller's longer buffer */
    memcpy(parent->cs[parent->nc].name, name, strlen(name) + 1);
    parent->cs[parent->nc].m = child;
    parent->nc++;
    return child;
}

dl_tensor *dl_module_forward(dl_module *m, dl_tensor *x)
{
    if (!dl__mod_ok(m) || !x) return NULL;
    if (!m->forward) {
        dl__err(m->ctx, DL_ERR_ARG, "dl_module_forward: module %s has no forward function", m->type);
        return NULL;
    }
    if (!dl__valid(m->type, "x", x)) return NULL;
    return m->forward(m, x);
}

static dl_tensor *dl__bnm_fwd(dl_module *m, dl_tensor *x);
static dl_tensor *dl__bnm_run(dl_module *m, dl_tensor *x, bool relu, dl_tensor *r, bool pool);

static bool dl__linear_act_ok(dl_module *m, dl_tensor *x);
static dl_tensor *dl__linear_act(dl_module *m, dl_tensor *x, int act);
static dl_tensor *dl__convm_fwd(dl_module *m, dl_tensor *x);
static bool dl__conv_act_ok(dl_module *m, dl_tensor *x);
static dl_tensor *dl__convm_act(dl_module *m, dl_tensor *x, int act, bool *pool);

dl_tensor *dl_module_forward_relu(dl_module *m, dl_tensor *x)
{
    if (dl__mod_ok(m) && x && m->forward == dl__bnm_fwd && dl__valid(m->type, "x", x))
        return dl__bnm_run(m, x, true, NULL, false);
    if (dl__mod_ok(m) && dl__linear_act_ok(m, x)) return dl__linear_act(m, x, DL__U_RELU);
    if (dl__mod_ok(m) && dl__conv_act_ok(m, x)) return dl__convm_act(m, x, DL__U_RELU, NULL);
    return dl_relu(dl_module_forward(m, x));
}

dl_tensor *dl_module_forward_add_relu(dl_module *m, dl_tensor *x, dl_tensor *r)
{
    if (!r) return NULL;   /* as a NULL x: an earlier op failed and said why */
    if (dl__mod_ok(m) && x && m->forward == dl__bnm_fwd && dl__valid(m->type, "x", x) &&
        dl__valid(m->type, "r", r) && x->dtype == DL_DTYPE_F32 && r->dtype == DL_DTYPE_F32 &&
        r->ctx_ == x->ctx_ && r->dev_ == x->dev_ && r->ndim == x->ndim &&
        memcmp(r->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim) == 0)
        return dl__bnm_run(m, x, true, r, false);   /* one op; else as written, with its ops' errors */
    return dl_relu(dl_add(dl_module_forward(m, x), r));
}

static void dl__mod_deep(dl_module *m, const char *fn)
{
    dl__err(m->ctx, DL_ERR_ARG, "%s: %s: the module tree is more than %d modules deep", fn, m->type,
            DL__MOD_DEPTH);
}

static bool dl__mod_train(dl_module *m, bool on, int depth)
{
    int i;
    if (depth > DL__MOD_DEPTH) return false;
    m->training = on;
    for (i = 0; i < m->nc; i++) if (!dl__mod_train(m->cs[i].m, on, depth + 1)) return false;
    return true;
}

void dl_module_train(dl_module *m, bool on)
{
    if (dl__mod_ok(m) && !dl__mod_train(m, on, 0)) dl__mod_deep(m, "dl_module_train");
}

dl_result dl_module_to(dl_module *m, dl_device dev)
{
    const dl_named_tensor *p;
    dl__dev *d;
    int n, i;
    if (!dl__mod_ok(m)) return DL_ERR_ARG;
    d = dl__device(m->ctx, dev, "dl_module_to");
    if (!d) return m->ctx->err;
    n = dl_module_state_dict(m, &p);
    if (n < 0) return m->ctx->err;
    for (i = 0; i < n; i++)   /* all live before any moves (DL_DEBUG names a dl_free()d one) */
        if (!dl__valid("dl_module_to", "tensor", p[i].t)) {
            if (m->ctx->err == DL_OK)
                dl__err(m->ctx, DL_ERR_ARG, "dl_module_to: %s is not a live tensor", p[i].name);
            return m->ctx->err;
        }
    {   /* all or nothing: a failure (out of memory halfway) moves back what had moved */
        dl__dfree *mark = m->ctx->dfree;
        for (i = 0; i < n; i++)
            if (!dl__move(p[i].t, d)) {
                dl__move_undo(m->ctx, mark);
                return m->ctx->err;
            }
    }
    return DL_OK;
}
bool dl_module_training(const dl_module *m) { return dl__mod_ok(m) && m->training; }

dl_module *dl_module_child(dl_module *m, const char *name)
{
    int i;
    if (!dl__mod_ok(m) || !name) return NULL;
    for (i = 0; i < m->nc; i++)
        if (strcmp(m->cs[i].name, name) == 0) return m->cs[i].m;
    return NULL;
}

dl_tensor *dl_module_get(dl_module *m, const char *path)
{
    const char *p, *dot;
    dl_module *cur = m;
    char part[DL__NAME_MAX];
    int i;
    if (!dl__mod_ok(m)) return NULL;
    if (!path) { dl__err(m->ctx, DL_ERR_ARG, "dl_module_get: path is NULL"); return NULL; }
    p = path;
    for (;;) {
        size_t len;
        dot = strchr(p, '.');
        len = dot ? (size_t)(dot - p) : strlen(p);
        if (len == 0 || len >= DL__NAME_MAX) break;
        memcpy(part, p, len);
        part[len] = 0;
        if (!dot) {
            for (i = 0; i < cur->nt; i++)
                if (strcmp(cur->ts[i].name, part) == 0) return cur->ts[i].t;
            break;
        }
        for (i = 0; i < cur->nc; i++)
            if (strcmp(cur->cs[i].name, part) == 0) break;
        if (i == cur->nc) break;
        cur = cur->cs[i].m;
        p = dot + 1;
    }
    dl__err(m->ctx, DL_ERR_ARG, "dl_module_get: %s has no parameter or buffer \"%s\" (\"%.*s\" "
            "not found in %s; see dl_module_state_dict for the names)", m->type, path,
            (int)(dot ? (size_t)(dot - p) : strlen(p)), p, cur->type);
    return NULL;
}

typedef struct dl__nwalk {
    bool params_only, fill, deep;
    int count;
    size_t bytes, maxpath;            /* name bytes with the NULs; longest prefix */
    dl_named_tensor *out;
    char *names, *path;
} dl__nwalk;

/* Pass 1 (fill false) counts entries and name bytes; pass 2 writes them. */
static void dl__nwalk_mod(const dl_module *m, size_t plen, dl__nwalk *w, int depth)
{
    int pass, i;
    if (depth > DL__MOD_DEPTH) { w->deep = true; return; }
    if (plen > w->maxpath) w->maxpath = plen;
    for (pass = 0; pass < 2; pass++) {
        if (pass == 1 && w->params_only) break;
        for (i = 0; i < m->nt; i++) {
            size_t nl = strlen(m->ts[i].name);
            if (m->ts[i].param != (pass == 0)) continue;
            if (w->fill) {
                char *d = w->names + w->bytes;
                if (plen) memcpy(d, w->path, plen);
                memcpy(d + plen, m->ts[i].name, nl + 1);
                w->out[w->count].name = d;
                w->out[w->count].t = m->ts[i].t;
                w->out[w->count].is_buffer = !m->ts[i].param;
            }
            w->bytes += plen + nl + 1;
            w->count++;
        }
    }
    for (i = 0; i < m->nc; i++) {
        size_t cl = strlen(m->cs[i].name);
        if (w->fill) {
            memcpy(w->path + plen, m->cs[i].name, cl);
            w->path[plen + cl] = '.';
        }
        dl__nwalk_mod(m->cs[i].m, plen + cl + 1, w, depth + 1);
    }
}

static bool dl__grow_bytes(dl_ctx *ctx, char **p, size_t *cap, size_t need)
{
    char *q;
    if (need <= *cap) return true;
    q = (char *)DL_REALLOC(*p, need);
    ctx->alloc_calls++;
    if (!q) return false;
    *p = q;
    *cap = need;
    return true;
}

static int dl__named(dl_module *m, bool params_only, dl__ncache *c, const dl_named_tensor **out)
{
    dl__nwalk w;
    void *arr;
    int i, j, k;
    *out = NULL;
    memset(&w, 0, sizeof w);
    w.params_only = params_only;
    dl__nwalk_mod(m, 0, &w, 0);
    if (w.deep) { dl__mod_deep(m, params_only ? "named_parameters" : "state_dict"); return -1; }
    arr = c->v;
    if (!dl__grow(m->ctx, &arr, &c->cap, w.count + 1, sizeof(dl_named_tensor))) return -1;
    c->v = (dl_named_tensor *)arr;
    if (!dl__grow_bytes(m->ctx, &c->names, &c->ncap, w.bytes + 1) ||
        !dl__grow_bytes(m->ctx, &m->path, &m->pathcap, w.maxpath + 1)) {
        dl__err(m->ctx, DL_ERR_OOM, "%s: out of memory listing names", m->type);
        return -1;
    }
    w.fill = true;
    w.count = 0;
    w.bytes = 0;
    w.out = c->v;
    w.names = c->names;
    w.path = m->path;
    dl__nwalk_mod(m, 0, &w, 0);
    k = w.count;
    if (params_only) {      /* named_parameters(): a shared parameter once, first name */
        for (i = k = 0; i < w.count; i++) {
            for (j = 0; j < k; j++) if (c->v[j].t == c->v[i].t) break;
            if (j == k) c->v[k++] = c->v[i];
        }
    }
    *out = c->v;
    return k;
}

int dl_module_state_dict(dl_module *m, const dl_named_tensor **out)
{
    if (!out) return -1;
    *out = NULL;
    if (!dl__mod_ok(m)) return -1;
    return dl__named(m, false, &m->sd, out);
}

int dl_module_named_parameters(dl_module *m, const dl_named_tensor **out)
{
    if (!out) return -1;
    *out = NULL;
    if (!dl__mod_ok(m)) return -1;
    return dl__named(m, true, &m->np, out);
}

/* The de-duplicated parameters in state_dict order, in m->scratch (grown
   only when the count grows, so a steady loop does not allocate). -1: OOM. */
static int dl__mod_params(dl_module *m)
{
    const dl_named_tensor *p;
    int n = dl_module_named_parameters(m, &p), i;
    if (n < 0) return -1;
    if (n > m->nscratch) {
        dl_tensor **s = (dl_tensor **)dl__malloc(m->ctx, sizeof(dl_tensor *) * (size_t)n);
        if (!s) { dl__err(m->ctx, DL_ERR_OOM, "%s: out of memory listing parameters", m->type); return -1; }
        DL_FREE(m->scratch);
        m->scratch = s;
        m->nscratch = n;
    }
    for (i = 0; i < n; i++) m->scratch[i] = p[i].t;
    return n;
}

int64_t dl_module_num_params(dl_module *m)
{
    int n, i;
    int64_t s = 0;
    if (!dl__mod_ok(m)) return 0;
    n = dl__mod_params(m);
    for (i = 0; i < n; i++) s += m->scratch[i]->numel;
    return s;
}

void dl_module_zero_grad(dl_module *m)
{
    int n, i;
    if (!dl__mod_ok(m)) return;
    n = dl__mod_params(m);
    if (!m->zset && n > 0 && (m->zset = (dl__mtset *)dl__malloc(m->ctx, sizeof(dl__mtset))) != NULL)
        memset(m->zset, 0, sizeof(dl__mtset));
    if (m->zset) { dl__zero_grads(m->ctx, m->zset, n, m->scratch); return; }
    for (i = 0; i < n; i++) dl_zero_grad(m->scratch[i]);
}

// >>section nn: init
static bool dl__init_ok(const char *fn, dl_tensor *t)
{
    return t && dl__valid(fn, "t", t) && dl__f32(fn, "t", t);
}

static int64_t dl__receptive(const dl_tensor *w)
{
    int64_t r = 1;
    int i;
    for (i = 2; i < w->ndim; i++) r *= w->shape[i];
    return r;
}

int64_t dl_fan_in(const dl_tensor *w)
{
    if (!w || w->magic_ != DL__MAGIC || w->ndim < 2) return -1;
    return w->shape[1] * dl__receptive(w);
}

int64_t dl_fan_out(const dl_tensor *w)
{
    if (!w || w->magic_ != DL__MAGIC || w->ndim < 2) return -1;
    return w->shape[0] * dl__receptive(w);
}

static void dl__fill_uniform(dl_tensor *t, double lo, double hi)
{
    dl__fill_rand(t, DL__RAND_UNIFORM, (float)lo, (float)hi);
    dl__bump_version(t);
}

static void dl__fill_normal(dl_tensor *t, double mean, double std)
{
    dl__fill_rand(t, DL__RAND_NORMAL, (float)mean, (float)std);
    dl__bump_version(t);
}

void dl_init_uniform(dl_tensor *t, float lo, float hi)
{
    if (dl__init_ok("dl_init_uniform", t)) dl__fill_uniform(t, lo, hi);
}

void dl_init_normal(dl_tensor *t, float mean, float std)
{
    if (dl__init_ok("dl_init_normal", t)) dl__fill_normal(t, mean, std);
}

void dl_init_constant(dl_tensor *t, float v)
{
    if (!dl__init_ok("dl_init_constant", t)) return;
    DL__BE(t)->fill(t->dev_, (float *)t->data, t->numel, v);
    dl__bump_version(t);
}

/* fan_in and fan_out, or false with an error for tensors with < 2 dims */
static bool dl__fans(const char *fn, dl_tensor *t, double *fin, double *fout)
{
    if (!dl__init_ok(fn, t)) return false;
    if (t->ndim < 2) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "%s: t %s has fewer than 2 dims, so fan_in and fan_out "
                "are undefined (fan_in = shape[1]*prod(shape[2:]))", fn, dl__sh(t));
        return false;
    }
    *fin = (double)dl_fan_in(t);
    *fout = (double)dl_fan_out(t);
    return t->numel > 0;      /* zero-element tensors: nothing to do, as PyTorch */
}

void dl_init_kaiming_uniform(dl_tensor *t, float a)
{
    double fin, fout, gain, bound;
    if (!dl__fans("dl_init_kaiming_uniform", t, &fin, &fout)) return;
    gain = sqrt(2.0 / (1.0 + (double)a * (double)a));
    bound = sqrt(3.0) * gain / sqrt(fin);
    dl__fill_uniform(t, -bound, bound);
}

void dl_init_kaiming_normal(dl_tensor *t, float a)
{
    double fin, fout, gain;
    if (!dl__fans("dl_init_kaiming_normal", t, &fin, &fout)) return;
    gain = sqrt(2.0 / (1.0 + (double)a * (double)a));
    dl__fill_normal(t, 0.0, gain / sqrt(fin));
}

void dl_init_xavier_uniform(dl_tensor *t, float gain)
{
    double fin, fout, bound;
    if (!dl__fans("dl_init_xavier_uniform", t, &fin, &fout)) return;
    bound = (double)gain * sqrt(6.0 / (fin + fout));
    dl__fill_uniform(t, -bound, bound);
}

void dl_init_xavier_normal(dl_tensor *t, float gain)
{
    double fin, fout;
    if (!dl__fans("dl_init_xavier_normal", t, &fin, &fout)) return;
    dl__fill_normal(t, 0.0, (double)gain * sqrt(2.0 / (fin + fout)));
}

// >>section nn: built-in modules
typedef struct dl__linear { int64_t in, out; dl_tensor *w, *b; } dl__linear;

static dl_tensor *dl__linear_fwd(dl_module *m, dl_tensor *x)
{
    dl__linear *s = (dl__linear *)m->state;
    if (x->ndim < 1 || x->shape[x->ndim - 1] != s->in) {   /* the module's name in the message */
        dl__err(m->ctx, DL_ERR_SHAPE, "Linear(%lld, %lld): x %s: the last dim must equal "
                "in_features=%lld (weight %s)", (long long)s->in, (long long)s->out, dl__sh(x),
                (long long)s->in, dl__sh(s->w));
        return NULL;
    }
    return dl_linear(x, s->w, s->b);
}

/* a Linear with a bias whose bias and activation x's backend fuses
   (dl__bias_act): x float32 (..., in) on the parameters' device; else
   the module's forward then the activation, with their errors */
static bool dl__linear_act_ok(dl_module *m, dl_tensor *x)
{
    dl__linear *s;
    if (!x || m->forward != dl__linear_fwd || !dl__valid(m->type, "x", x)) return false;
    s = (dl__linear *)m->state;
    return s->b && DL__BE(x)->bias_act && x->dtype == DL_DTYPE_F32 && x->ndim >= 2 &&
           x->shape[x->ndim - 1] == s->in && s->w->dev_ == x->dev_ && s->b->dev_ == x->dev_ &&
           s->w->dtype == DL_DTYPE_F32 && s->b->dtype == DL_DTYPE_F32;
}

/* act(x w^T + b): the GEMM (dl_linear without its bias), then the bias and
   the activation in one op */
static dl_tensor *dl__linear_act(dl_module *m, dl_tensor *x, int act)
{
    dl__linear *s = (dl__linear *)m->state;
    return dl__bias_act(dl_linear(x, s->w, NULL), s->b, act);
}

dl_module *dl_nn_linear(dl_ctx *ctx, int64_t in, int64_t out, bool bias)
{
    dl_module *m;
    dl__linear *s;
    double bound;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_nn_linear: ctx is NULL"); return NULL; }
    if (in <= 0 || out <= 0) {
        dl__err(ctx, DL_ERR_ARG, "dl_nn_linear: in_features=%lld and out_features=%lld must be "
                "positive", (long long)in, (long long)out);
        return NULL;
    }
    m = dl_module_new(ctx, "Linear", dl__linear_fwd, sizeof(dl__linear));
    if (!m) return NULL;
    s = (dl__linear *)m->state;
    s->in = in;
    s->out = out;
    s->w = dl_module_param(m, "weight", dl_empty(ctx, DL_SHAPE(out, in)));
    if (!s->w) return NULL;
    dl_init_kaiming_uniform(s->w, 2.2360679774997896f);   /* a = sqrt(5): U(+-1/sqrt(in)) */
    if (bias) {
        s->b = dl_module_param(m, "bias", dl_empty(ctx, DL_SHAPE(out)));
        if (!s->b) return NULL;
        bound = 1.0 / sqrt((double)in);
        dl__fill_uniform(s->b, -bound, bound);
    }
    return m;
}

static dl_tensor *dl__relu_fwd(dl_module *m, dl_tensor *x);
static dl_tensor *dl__sigmoid_fwd(dl_module *m, dl_tensor *x);
static dl_tensor *dl__tanh_fwd(dl_module *m, dl_tensor *x);

/* the unary op of an activation module that dl__bias_act fuses, or -1 */
static int dl__act_of(const dl_module *a)
{
    return a->forward == dl__relu_fwd ? DL__U_RELU : a->forward == dl__sigmoid_fwd ? DL__U_SIGMOID
           : a->forward == dl__tanh_fwd ? DL__U_TANH : -1;
}
static dl_tensor *dl__poolm_fwd(dl_module *m, dl_tensor *x);
static bool dl__is_max_pool(const dl_module *m);
static bool dl__is_pool2(const dl_module *m, int kind);

/* BatchNorm then ReLU runs as one op (dl__batch_norm's relu): the ReLU in
   the normalization's pass, its mask in the backward's, the same bits as
   the two ops with two passes over the data fewer (on a GPU two launches).
   ReLU then max pool runs as max pool then ReLU: max_S relu(x) =
   relu(max_S x) for any window S, the pool takes the same element (the
   first largest, the last NaN: relu keeps NaN and the order of positive
   values, and a window with no positive value gets gradient 0 either way),
   and the ReLU reads and writes a quarter of the data (2x2 pools), forward
   and backward. BatchNorm, ReLU, MaxPool: on a GPU the first (launches
   cost more than the quarter's passes; the pool then takes the first
   largest of the ReLU'd window, the same element where one is positive,
   and a window with none passes 0 through the ReLU's mask), and where the
   pool is 2x2 with stride 2 and the height and width are even, all three
   as one op (bn_pool: the pool in the apply's launch, which writes only
   the pooled output; the unpool and the mask in the backward's two
   passes); on the CPU the second (a quarter of the data beats the mask's
   two reads of the whole in the backward). Linear then ReLU, Sigmoid or
   Tanh, where the backend fuses them (a GPU): the bias and the activation
   as one op (dl__bias_act), one pass forward and, with the bias's
   gradient, one backward, in place of two each. A convolution then one of those, where
   the backend's direct sums take the conv (a GPU, few channels: LeNet's):
   the activation in the conv's launch, its backward in the bias sum's
   first pass (dl__conv_act_bwd); with a 2x2, stride-2 average pool after
   the activation (d2l's LeNet) and an even output, the pool in that
   launch too, and its adjoint in that first pass. */
static dl_tensor *dl__seq_fwd(dl_module *m, dl_tensor *x)
{
    int i;
    for (i = 0; i < m->nc && x; i++) {
        dl_module *c = m->cs[i].m;
        if (c->forward == dl__bnm_fwd && i + 2 < m->nc && m->cs[i + 1].m->forward == dl__relu_fwd &&
            dl__is_pool2(m->cs[i + 2].m, 0) && dl__valid(c->type, "x", x) && DL__BE(x)->bn_pool &&
            x->dtype == DL_DTYPE_F32 && x->ndim == 4 && x->shape[2] > 0 && x->shape[3] > 0 &&
            x->shape[2] % 2 == 0 && x->shape[3] % 2 == 0) {   /* (an empty side: the pool's error) */
            x = dl__bnm_run(c, x, true, NULL, true);
            i += 2;
        } else if (c->forward == dl__bnm_fwd && i + 1 < m->nc && m->cs[i + 1].m->forward == dl__relu_fwd &&
                   dl__valid(c->type, "x", x) &&
                   !(x->device.type == DL_DEVICE_CPU && i + 2 < m->nc && dl__is_max_pool(m->cs[i + 2].m))) {
            x = dl__bnm_run(c, x, true, NULL, false);
            i++;
        } else if (i + 1 < m->nc && dl__act_of(m->cs[i + 1].m) >= 0 && dl__linear_act_ok(c, x)) {
            x = dl__linear_act(c, x, dl__act_of(m->cs[i + 1].m));
            i++;
        } else if (i + 2 < m->nc && dl__act_of(m->cs[i + 1].m) >= 0 && dl__is_pool2(m->cs[i + 2].m, 1) &&
                   dl__conv_act_ok(c, x)) {
            bool pooled = true;
            x = dl__convm_act(c, x, dl__act_of(m->cs[i + 1].m), &pooled);
            if (x && !pooled) x = dl_module_forward(m->cs[i + 2].m, x);
            i += 2;
        } else if (i + 1 < m->nc && dl__act_of(m->cs[i + 1].m) >= 0 && dl__conv_act_ok(c, x)) {
            x = dl__convm_act(c, x, dl__act_of(m->cs[i + 1].m), NULL);
            i++;
        } else if (c->forward == dl__relu_fwd && i + 1 < m->nc && dl__is_max_pool(m->cs[i + 1].m)) {
            x = dl_module_forward(m->cs[++i].m, x);
            if (x) x = dl_module_forward(c, x);
        } else {
            x = dl_module_forward(c, x);
        }
    }
    return x;
}

dl_module *dl_nn_sequential(dl_ctx *ctx, int n, dl_module *const *mods)
{
    dl_module *m;
    int i;
    char name[24];
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_nn_sequential: ctx is NULL"); return NULL; }
    if (n < 0 || (n > 0 && !mods)) {
        dl__err(ctx, DL_ERR_ARG, "dl_nn_sequential: n=%d modules%s", n, mods ? "" : " but mods is NULL");
        return NULL;
    }
    for (i = 0; i < n; i++) if (!mods[i]) return NULL;   /* a constructor failed: reported */
    m = dl_module_new(ctx, "Sequential", dl__seq_fwd, 0);
    if (!m) return NULL;
    for (i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%d", i);
        if (!dl_module_add(m, name, mods[i])) return NULL;
    }
    return m;
}

static dl_tensor *dl__relu_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_relu(x); }
static dl_tensor *dl__sigmoid_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_sigmoid(x); }
static dl_tensor *dl__tanh_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_tanh(x); }
static dl_tensor *dl__gelu_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_gelu(x); }
static dl_tensor *dl__silu_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_silu(x); }
static dl_tensor *dl__flatten_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_flatten(x, 1, -1); }
dl_module *dl_nn_relu(dl_ctx *ctx) { return dl_module_new(ctx, "ReLU", dl__relu_fwd, 0); }
dl_module *dl_nn_sigmoid(dl_ctx *ctx) { return dl_module_new(ctx, "Sigmoid", dl__sigmoid_fwd, 0); }
dl_module *dl_nn_tanh(dl_ctx *ctx) { return dl_module_new(ctx, "Tanh", dl__tanh_fwd, 0); }
dl_module *dl_nn_gelu(dl_ctx *ctx) { return dl_module_new(ctx, "GELU", dl__gelu_fwd, 0); }
dl_module *dl_nn_silu(dl_ctx *ctx) { return dl_module_new(ctx, "SiLU", dl__silu_fwd, 0); }
dl_module *dl_nn_flatten(dl_ctx *ctx) { return dl_module_new(ctx, "Flatten", dl__flatten_fwd, 0); }

// >>section nn: layer modules
/* Each layer keeps its settings and parameter pointers in the module's state
   block and calls the functional op; batch norm branches on the train flag. */

typedef struct dl__convm {
    int spatial;
    bool transposed;
    dl_conv_desc d;
    dl_tensor *w, *b;
} dl__convm;

/* a convolution module (not transposed) whose activation x's backend may
   fuse (dl__backend.conv_act); then dl__convm_act runs both, fused or
   not, with the module's and the activation's values and errors */
static bool dl__conv_act_ok(dl_module *m, dl_tensor *x)
{
    if (!x || m->forward != dl__convm_fwd || !dl__valid(m->type, "x", x)) return false;
    return !((dl__convm *)dl_module_state(m))->transposed && DL__BE(x)->conv_act;
}
static dl_tensor *dl__convm_act(dl_module *m, dl_tensor *x, int act, bool *pool)
{
    static const char *names[3] = {"dl_conv1d", "dl_conv2d", "dl_conv3d"};
    dl__convm *s = (dl__convm *)dl_module_state(m);
    return dl__conv_api(names[s->spatial - 1], s->spatial, false, x, s->w, s->b, &s->d, act, pool);
}

static dl_tensor *dl__convm_fwd(dl_module *m, dl_tensor *x)
{
    dl__convm *s = (dl__convm *)dl_module_state(m);
    if (!s->transposed) {
        if (s->spatial == 1) return dl_conv1d(x, s->w, s->b, &s->d);
        if (s->spatial == 2) return dl_conv2d(x, s->w, s->b, &s->d);
        return dl_conv3d(x, s->w, s->b, &s->d);
    }
    if (s->spatial == 1) return dl_conv_transpose1d(x, s->w, s->b, &s->d);
    if (s->spatial == 2) return dl_conv_transpose2d(x, s->w, s->b, &s->d);
    return dl_conv_transpose3d(x, s->w, s->b, &s->d);
}

dl_module *dl_nn_conv(dl_ctx *ctx, int spatial, int64_t in, int64_t out, const int64_t *kernel,
                      const dl_conv_desc *d, bool bias, bool transposed)
{
    static const char *names[2][3] = {{"Conv1d", "Conv2d", "Conv3d"},
                                      {"ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"}};
    int64_t shape[2 + DL_MAX_SPATIAL], groups;
    dl_module *m;
    dl__convm *s;
    double bound;
    int i;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_nn_conv: ctx is NULL"); return NULL; }
    if (spatial < 1 || spatial > 3 || !kernel) {
        dl__err(ctx, DL_ERR_ARG, "dl_nn_conv: spatial dims %d must be 1..3 and kernel given", spatial);
        return NULL;
    }
    groups = d && d->groups > 0 ? d->groups : 1;
    if (in <= 0 || out <= 0 || in % groups || out % groups) {
        dl__err(ctx, DL_ERR_ARG, "%s: in_channels=%lld and out_channels=%lld must be positive and "
                "divisible by groups=%lld", names[transposed][spatial - 1], (long long)in,
                (long long)out, (long long)groups);
        return NULL;
    }
    for (i = 0; i < spatial; i++)
        if (kernel[i] <= 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: kernel size %lld must be positive", names[transposed][spatial - 1],
                    (long long)kernel[i]);
            return NULL;
        }
    m = dl_module_new(ctx, names[transposed][spatial - 1], dl__convm_fwd, sizeof(dl__convm));
    if (!m) return NULL;
    s = (dl__convm *)dl_module_state(m);
    s->spatial = spatial;
    s->transposed = transposed;
    if (d) s->d = *d;
    else s->d = dl_conv_desc_make(1, 0, 1, 1);
    /* conv: w (out, in/groups, k...);  transposed: w (in, out/groups, k...) */
    shape[0] = transposed ? in : out;
    shape[1] = transposed ? out / groups : in / groups;
    for (i = 0; i < spatial; i++) shape[2 + i] = kernel[i];
    s->w = dl_module_param(m, "weight", dl_empty(ctx, dl_shape_make(2 + spatial, shape)));
    if (!s->w) return NULL;
    dl_init_kaiming_uniform(s->w, 2.2360679774997896f);   /* a = sqrt(5), as PyTorch */
    if (bias) {
        s->b = dl_module_param(m, "bias", dl_empty(ctx, dl_shape_make(1, &out)));
        if (!s->b) return NULL;
        bound = 1.0 / sqrt((double)dl_fan_in(s->w));
        dl_init_uniform(s->b, (float)-bound, (float)bound);
    }
    return m;
}

static dl_module *dl__conv_k(dl_ctx *ctx, int sp, int64_t in, int64_t out, int64_t k, const dl_conv_desc *d,
                             bool bias, bool tr)
{
    int64_t ks[DL_MAX_SPATIAL];
    ks[0] = ks[1] = ks[2] = k;
    return dl_nn_conv(ctx, sp, in, out, ks, d, bias, tr);
}
dl_module *dl_nn_conv1d(dl_ctx *c, int64_t i, int64_t o, int64_t k, const dl_conv_desc *d, bool b) { return dl__conv_k(c, 1, i, o, k, d, b, false); }
dl_module *dl_nn_conv2d(dl_ctx *c, int64_t i, int64_t o, int64_t k, const dl_conv_desc *d, bool b) { return dl__conv_k(c, 2, i, o, k, d, b, false); }
dl_module *dl_nn_conv3d(dl_ctx *c, int64_t i, int64_t o, int64_t k, const dl_conv_desc *d, bool b) { return dl__conv_k(c, 3, i, o, k, d, b, false); }
dl_module *dl_nn_conv_transpose1d(dl_ctx *c, int64_t i, int64_t o, int64_t k, const dl_conv_desc *d, bool b) { return dl__conv_k(c, 1, i, o, k, d, b, true); }
dl_module *dl_nn_conv_transpose2d(dl_ctx *c, int64_t i, int64_t o, int64_t k, const dl_conv_desc *d, bool b) { return dl__conv_k(c, 2, i, o, k, d, b, true); }
dl_module *dl_nn_conv_transpose3d(dl_ctx *c, int64_t i, int64_t o, int64_t k, const dl_conv_desc *d, bool b) { return dl__conv_k(c, 3, i, o, k, d, b, true); }

typedef struct dl__poolm { int kind, spatial; dl_pool_desc d; dl_shape out; } dl__poolm;

static dl_tensor *dl__poolm_fwd(dl_module *m, dl_tensor *x)
{
    dl__poolm *s = (dl__poolm *)dl_module_state(m);
    switch (s->kind * 3 + s->spatial - 1) {
    case 0: return dl_max_pool1d(x, &s->d);
    case 1: return dl_max_pool2d(x, &s->d);
    case 2: return dl_max_pool3d(x, &s->d);
    case 3: return dl_avg_pool1d(x, &s->d);
    case 4: return dl_avg_pool2d(x, &s->d);
    case 5: return dl_avg_pool3d(x, &s->d);
    case 6: return dl_adaptive_avg_pool1d(x, s->out);
    case 7: return dl_adaptive_avg_pool2d(x, s->out);
    default: return dl_adaptive_avg_pool3d(x, s->out);
    }
}

static bool dl__is_max_pool(const dl_module *m)
{
    return m->forward == dl__poolm_fwd && ((const dl__poolm *)m->state)->kind == 0;
}

/* a MaxPool2d (kind 0) or AvgPool2d (1) of kernel 2, stride 2, no
   padding (nor dilation), floor mode (dl__pool2) */
static bool dl__is_pool2(const dl_module *m, int kind)
{
    const dl__poolm *s = (const dl__poolm *)m->state;
    int i;
    if (m->forward != dl__poolm_fwd || s->kind != kind || s->spatial != 2 || s->d.ceil_mode) return false;
    for (i = 0; i < 2; i++)
        if (s->d.kernel[i] != 2 || (s->d.stride[i] != 0 && s->d.stride[i] != 2) || s->d.padding[i] != 0 ||
            (s->d.dilation[i] != 0 && s->d.dilation[i] != 1))
            return false;
    return true;
}

static dl_module *dl__poolm_new(dl_ctx *ctx, int kind, int spatial, const dl_pool_desc *d, dl_shape out)
{
    static const char *names[3] = {"MaxPool", "AvgPool", "AdaptiveAvgPool"};
    char type[32];
    dl_module *m;
    dl__poolm *s;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_nn_%s_pool: ctx is NULL", kind == 0 ? "max" : kind == 1 ? "avg" : "adaptive_avg"); return NULL; }
    if (kind < 2 && !d) {
        dl__err(ctx, DL_ERR_ARG, "dl_nn_%s: a dl_pool_desc is required (dl_pool_desc_make(kernel, stride, "
                "padding, ceil_mode, count_include_pad))", kind ? "avg_pool" : "max_pool");
        return NULL;
    }
    snprintf(type, sizeof type, "%s%dd", names[kind], spatial);
    m = dl_module_new(ctx, type, dl__poolm_fwd, sizeof(dl__poolm));
    if (!m) return NULL;
    s = (dl__poolm *)dl_module_state(m);
    s->kind = kind;
    s->spatial = spatial;
    if (d) s->d = *d;
    s->out = out;
    return m;
}
dl_module *dl_nn_max_pool1d(dl_ctx *c, const dl_pool_desc *d) { return dl__poolm_new(c, 0, 1, d, dl_dims_all()); }
dl_module *dl_nn_max_pool2d(dl_ctx *c, const dl_pool_desc *d) { return dl__poolm_new(c, 0, 2, d, dl_dims_all()); }
dl_module *dl_nn_max_pool3d(dl_ctx *c, const dl_pool_desc *d) { return dl__poolm_new(c, 0, 3, d, dl_dims_all()); }
dl_module *dl_nn_avg_pool1d(dl_ctx *c, const dl_pool_desc *d) { return dl__poolm_new(c, 1, 1, d, dl_dims_all()); }
dl_module *dl_nn_avg_pool2d(dl_ctx *c, const dl_pool_desc *d) { return dl__poolm_new(c, 1, 2, d, dl_dims_all()); }
dl_module *dl_nn_avg_pool3d(dl_ctx *c, const dl_pool_desc *d) { return dl__poolm_new(c, 1, 3, d, dl_dims_all()); }
dl_module *dl_nn_adaptive_avg_pool1d(dl_ctx *c, dl_shape o) { return dl__poolm_new(c, 2, 1, NULL, o); }
dl_module *dl_nn_adaptive_avg_pool2d(dl_ctx *c, dl_shape o) { return dl__poolm_new(c, 2, 2, NULL, o); }
dl_module *dl_nn_adaptive_avg_pool3d(dl_ctx *c, dl_shape o) { return dl__poolm_new(c, 2, 3, NULL, o); }

typedef struct dl__bnm {
    int spatial;              /* -1: BatchNorm1d (2-D or 3-D input) */
    float momentum, eps;
    dl_tensor *w, *b, *rm, *rv, *nbt;
} dl__bnm;

static dl_tensor *dl__bnm_run(dl_module *m, dl_tensor *x, bool relu, dl_tensor *r, bool pool)
{
    dl__bnm *s = (dl__bnm *)dl_module_state(m);
    bool ok = s->spatial < 0 ? (x->ndim == 2 || x->ndim == 3) : x->ndim == s->spatial + 2;
    bool train = dl_module_training(m);
    if (!ok) {
        dl__err(m->ctx, DL_ERR_SHAPE, "%s: x %s must be %s", dl_module_type(m), dl__sh(x),
                s->spatial < 0 ? "(N,C) or (N,C,L)" : s->spatial == 2 ? "(N,C,H,W)" : "(N,C,D,H,W)");
        return NULL;
    }
    if (train) dl__cap_use(s->nbt);   /* num_batches_tracked += 1 (a replay repeats it) */
    return dl__batch_norm(x, s->rm, s->rv, s->w, s->b, train, s->momentum, s->eps, train ? s->nbt : NULL, relu, r,
                          pool);
}
static dl_tensor *dl__bnm_fwd(dl_module *m, dl_tensor *x) { return dl__bnm_run(m, x, false, NULL, false); }

static dl_module *dl__bnm_new(dl_ctx *ctx, const char *type, int spatial, int64_t c)
{
    dl_module *m;
    dl__bnm *s;
    int64_t zero = 0;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_nn_batch_norm: ctx is NULL"); return NULL; }
    if (c <= 0) {
        dl__err(ctx, DL_ERR_ARG, "dl_nn_batch_norm: num_features=%lld must be positive", (long long)c);
        return NULL;
    }
    m = dl_module_new(ctx, type, dl__bnm_fwd, sizeof(dl__bnm));
    if (!m) return NULL;
    s = (dl__bnm *)dl_module_state(m);
    s->spatial = spatial;
    s->momentum = 0.1f;
    s->eps = 1e-5f;
    s->w = dl_module_param(m, "weight", dl_ones(ctx, dl_shape_make(1, &c)));
    s->b = dl_module_param(m, "bias", dl_zeros(ctx, dl_shape_make(1, &c)));
    s->rm = dl_module_buffer(m, "running_mean", dl_zeros(ctx, dl_shape_make(1, &c)));
    s->rv = dl_module_buffer(m, "running_var", dl_ones(ctx, dl_shape_make(1, &c)));
    s->nbt = dl_module_buffer(m, "num_batches_tracked", dl_from_int64(ctx, dl_shape_make(0, NULL), &zero));
    return s->w && s->b && s->rm && s->rv && s->nbt ? m : NULL;
}
dl_module *dl_nn_batch_norm1d(dl_ctx *c, int64_t ch) { return dl__bnm_new(c, "BatchNorm1d", -1, ch); }
dl_module *dl_nn_batch_norm2d(dl_ctx *c, int64_t ch) { return dl__bnm_new(c, "BatchNorm2d", 2, ch); }
dl_module *dl_nn_batch_norm3d(dl_ctx *c, int64_t ch) { return dl__bnm_new(c, "BatchNorm3d", 3, ch); }

typedef struct dl__lnm { dl_shape shape; dl_tensor *w, *b; } dl__lnm;
static dl_tensor *dl__lnm_fwd(dl_module *m, dl_tensor *x)
{
    dl__lnm *s = (dl__lnm *)dl_module_state(m);
    return dl_layer_norm(x, s->shape, s->w, s->b, 1e-5f);
}
dl_module *dl_nn_layer_norm(dl_ctx *ctx, dl_shape shape)
{
    dl_module *m;
    dl__lnm *s;
    int i;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_nn_layer_norm: ctx is NULL"); return NULL; }
    if (shape.ndim < 1 || shape.ndim > DL_MAX_DIMS) goto bad;
    for (i = 0; i < shape.ndim; i++) if (shape.d[i] <= 0) goto bad;
    m = dl_module_new(ctx, "LayerNorm", dl__lnm_fwd, sizeof(dl__lnm));
    if (!m) return NULL;
    s = (dl__lnm *)dl_module_state(m);
    s->shape = shape;
    s->w = dl_module_param(m, "weight", dl_ones(ctx, shape));
    s->b = dl_module_param(m, "bias", dl_zeros(ctx, shape));
    return s->w && s->b ? m : NULL;
bad:
    dl__err(ctx, DL_ERR_ARG, "dl_nn_layer_norm: normalized_shape %s must have 1..%d positive sizes",
            dl__shp(ctx, &shape), DL_MAX_DIMS);
    return NULL;
}

typedef struct dl__dropm { float p; } dl__dropm;
static dl_tensor *dl__dropm_fwd(dl_module *m, dl_tensor *x)
{
    return dl_dropout(x, ((dl__dropm *)dl_module_state(m))->p, dl_module_training(m));
}
dl_module *dl_nn_dropout(dl_ctx *ctx, float p)
{
    dl_module *m;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_nn_dropout: ctx is NULL"); return NULL; }
    if (!(p >= 0.0f && p <= 1.0f)) {
        dl__err(ctx, DL_ERR_ARG, "dl_nn_dropout: p=%g must be in [0, 1]", (double)p);
        return NULL;
    }
    m = dl_module_new(ctx, "Dropout", dl__dropm_fwd, sizeof(dl__dropm));
    if (m) ((dl__dropm *)dl_module_state(m))->p = p;
    return m;
}

// >>section optim
/* Optimizer kernels work on raw float arrays, one element at a time, in the
   order of PyTorch's single-tensor code so that results match it to the last
   bit where the inputs do. A CUDA build supplies the same table. */

enum { DL__OPT_SGD = 0, DL__OPT_ADAM, DL__OPT_ADAMW };
static const char *const dl__opt_names[] = {"sgd", "adam", "adamw"};
#define DL__OPT_MAGIC 0x444c4f50u

struct dl_optim {
    uint32_t magic;
    dl_ctx *ctx;
    int kind;
    dl_sgd_desc sgd;                  /* resolved: no zero-means-default left */
    dl_adam_desc adam;
    int64_t steps;
    int n;
    dl_tensor **p;                    /* parameters (de-duplicated) */
    int *pg;                          /* group of each parameter */
    dl_tensor **s[3];                 /* momentum_buffer | exp_avg, exp_avg_sq, max_exp_avg_sq */
    int64_t *pstep;                   /* per-parameter step count (PyTorch state['step']) */
    int ng;
    float *glr, *glr0, *gwd;          /* per group: lr, initial lr, weight decay */
    /* per parameter, the arguments of its last update (dl__sgd_args or
       dl__adam_args): the kernels read them from here, and so does a
       captured step, whose replay hook rewrites them */
    void *args;
    size_t argbytes;                  /* of all n */
    dl__mtset mtu, mtz;               /* multi-tensor update and zero_grad (CUDA) */
};

static const char *const dl__sgd_state[] = {"momentum_buffer"};
static const char *const dl__adam_state[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

/* number of state tensors per parameter, and their names */
static int dl__opt_nstate(const dl_optim *o, const char *const **names)
{
    if (o->kind == DL__OPT_SGD) { *names = dl__sgd_state; return o->sgd.momentum != 0.0f ? 1 : 0; }
    *names = dl__adam_state;
    return o->adam.amsgrad ? 3 : 2;
}

static void dl__optim_destroy(void *p)
{
    dl_optim *o = (dl_optim *)p;
    int k, i;
    if (o->ctx->caps) dl__cap_owner_gone(o->ctx, o, "an optimizer (dl_optim_free)");
    o->magic = 0;
    dl__mt_free(&o->mtu);
    dl__mt_free(&o->mtz);
    for (k = 0; k < 3; k++) {
        if (!o->s[k]) continue;
        for (i = 0; i < o->n; i++) dl_free(o->s[k][i]);
        DL_FREE(o->s[k]);
    }
    DL_FREE(o->p);
    DL_FREE(o->pg);
    DL_FREE(o->pstep);
    DL_FREE(o->args);
    DL_FREE(o->glr);
    DL_FREE(o->glr0);
    DL_FREE(o->gwd);
    DL_FREE(o);
}

static bool dl__optim_ok(const dl_optim *o) { return o && o->magic == DL__OPT_MAGIC; }

/* zero means default; DL_ZERO (-0.0f) means an actual zero */
static float dl__dflt(float v, float def) { return v == 0.0f && !signbit(v) ? def : v; }

static bool dl__lr_ok(dl_ctx *ctx, const char *fn, const char *what, float lr)
{
    if (lr >= 0.0f && isfinite(lr)) return true;
    dl__err(ctx, DL_ERR_ARG, "%s: %s=%g must be a finite number >= 0", fn, what, (double)lr);
    return false;
}

/* Resolves the desc (zero: PyTorch's defaults) and checks every value,
   naming the first bad one. */
static bool dl__optim_desc(dl_ctx *ctx, const char *fn, int kind, const dl_sgd_desc *sd,
                           const dl_adam_desc *ad, dl_sgd_desc *so, dl_adam_desc *ao)
{
    memset(so, 0, sizeof *so);
    memset(ao, 0, sizeof *ao);
    if (kind == DL__OPT_SGD) {
        if (sd) *so = *sd;
        so->lr = dl__dflt(so->lr, 1e-3f);
        if (!dl__lr_ok(ctx, fn, "lr", so->lr)) return false;
        if (!(so->momentum >= 0.0f) || !isfinite(so->momentum)) {
            dl__err(ctx, DL_ERR_ARG, "%s: momentum=%g must be a finite number >= 0", fn, (double)so->momentum);
            return false;
        }
        if (!(so->weight_decay >= 0.0f) || !isfinite(so->weight_decay)) {
            dl__err(ctx, DL_ERR_ARG, "%s: weight_decay=%g must be a finite number >= 0", fn,
                    (double)so->weight_decay);
            return false;
        }
        if (!isfinite(so->dampening)) {
            dl__err(ctx, DL_ERR_ARG, "%s: dampening=%g must be finite", fn, (double)so->dampening);
            return false;
        }
        if (so->nesterov && (so->momentum <= 0.0f || so->dampening != 0.0f)) {
            dl__err(ctx, DL_ERR_ARG, "%s: nesterov needs momentum > 0 and dampening 0 (momentum %g, "
                    "dampening %g)", fn, (double)so->momentum, (double)so->dampening);
            return false;
        }
        so->momentum += 0.0f;     /* -0.0f -> 0 */
        so->weight_decay += 0.0f;
        return true;
    }
    if (ad) *ao = *ad;
    ao->lr = dl__dflt(ao->lr, 1e-3f);
    ao->beta1 = dl__dflt(ao->beta1, 0.9f) + 0.0f;
    ao->beta2 = dl__dflt(ao->beta2, 0.999f) + 0.0f;
    ao->eps = dl__dflt(ao->eps, 1e-8f) + 0.0f;
    ao->weight_decay = dl__dflt(ao->weight_decay, kind == DL__OPT_ADAMW ? 0.01f : 0.0f) + 0.0f;
    if (!dl__lr_ok(ctx, fn, "lr", ao->lr)) return false;
    if (!(ao->beta1 >= 0.0f && ao->beta1 < 1.0f) || !(ao->beta2 >= 0.0f && ao->beta2 < 1.0f)) {
        dl__err(ctx, DL_ERR_ARG, "%s: betas (%g, %g) must each be in [0, 1)", fn, (double)ao->beta1,
                (double)ao->beta2);
        return false;
    }
    if (!(ao->eps >= 0.0f) || !isfinite(ao->eps)) {
        dl__err(ctx, DL_ERR_ARG, "%s: eps=%g must be a finite number >= 0", fn, (double)ao->eps);
        return false;
    }
    if (!(ao->weight_decay >= 0.0f) || !isfinite(ao->weight_decay)) {
        dl__err(ctx, DL_ERR_ARG, "%s: weight_decay=%g must be a finite number >= 0", fn,
                (double)ao->weight_decay);
        return false;
    }
    return true;
}

static dl_optim *dl__optim_make(dl_ctx *ctx, const char *fn, int kind, int ngroups,
                                const dl_param_group *groups, const dl_sgd_desc *sd,
                                const dl_adam_desc *ad)
{
    dl_optim *o;
    dl_sgd_desc so;
    dl_adam_desc ao;
    int i, j, k, g, ns, total = 0;
    const char *const *snames;
    if (!dl__optim_desc(ctx, fn, kind, sd, ad, &so, &ao)) return NULL;
    if (ngroups <= 0 || !groups) {
        dl__err(ctx, DL_ERR_ARG, "%s: got no parameter groups (ngroups %d%s)", fn, ngroups,
                groups ? "" : ", groups NULL");
        return NULL;
    }
    for (g = 0; g < ngroups; g++) {
        const dl_param_group *pg = &groups[g];
        if (pg->n <= 0 || !pg->params) {
            dl__err(ctx, DL_ERR_ARG, "%s: group %d: got an empty parameter list", fn, g);
            return NULL;
        }
        if (pg->lr != 0.0f && !dl__lr_ok(ctx, fn, "a group's lr", pg->lr)) return NULL;
        if (!(pg->weight_decay >= 0.0f) || !isfinite(pg->weight_decay)) {
            dl__err(ctx, DL_ERR_ARG, "%s: group %d: weight_decay=%g must be a finite number >= 0 "
                    "(DL_ZERO: none)", fn, g, (double)pg->weight_decay);
            return NULL;
        }
        if (total > INT32_MAX - pg->n) {
            dl__err(ctx, DL_ERR_ARG, "%s: too many parameters", fn);
            return NULL;
        }
        total += pg->n;
        for (i = 0; i < pg->n; i++) {
            dl_tensor *t = pg->params[i];
            if (!t) { dl__err(ctx, DL_ERR_ARG, "%s: group %d: params[%d] is NULL", fn, g, i); return NULL; }
            if (!dl__valid(fn, "a parameter", t)) return NULL;
            if (t->ctx_ != ctx) { dl__err(ctx, DL_ERR_ARG, "%s: params[%d] belongs to another context", fn, i); return NULL; }
            if (t->step_ != 0) {
                dl__err(ctx, DL_ERR_ARG, "%s: params[%d] %s is a step tensor; optimizer parameters must "
                        "be persistent (dl_param, dl_keep, dl_module_param)", fn, i, dl__sh(t));
                return NULL;
            }
            if (!dl__f32(fn, "a parameter", t)) return NULL;
            if (t->node_) {
                dl__err(ctx, DL_ERR_ARG, "%s: params[%d] %s is not a leaf", fn, i, dl__sh(t));
                return NULL;
            }
        }
    }
    o = (dl_optim *)dl__malloc(ctx, sizeof(dl_optim));
    if (!o) goto oom;
    memset(o, 0, sizeof *o);
    o->ctx = ctx;
    o->kind = kind;
    o->sgd = so;
    o->adam = ao;
    o->ng = ngroups;
    o->p = (dl_tensor **)dl__malloc(ctx, sizeof(dl_tensor *) * (size_t)total);
    o->pg = (int *)dl__malloc(ctx, sizeof(int) * (size_t)total);
    o->pstep = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)total);
    o->glr = (float *)dl__malloc(ctx, sizeof(float) * (size_t)ngroups);
    o->glr0 = (float *)dl__malloc(ctx, sizeof(float) * (size_t)ngroups);
    o->gwd = (float *)dl__malloc(ctx, sizeof(float) * (size_t)ngroups);
    o->argbytes = (kind == DL__OPT_SGD ? sizeof(dl__sgd_args) : sizeof(dl__adam_args)) * (size_t)total;
    o->args = dl__malloc(ctx, o->argbytes);
    if (!o->p || !o->pg || !o->pstep || !o->glr || !o->glr0 || !o->gwd || !o->args) goto oom_o;
    memset(o->args, 0, o->argbytes);
    for (g = 0; g < ngroups; g++) {
        const dl_param_group *pg = &groups[g];
        float base_lr = kind == DL__OPT_SGD ? so.lr : ao.lr;
        float base_wd = kind == DL__OPT_SGD ? so.weight_decay : ao.weight_decay;
        o->glr[g] = o->glr0[g] = dl__dflt(pg->lr, base_lr) + 0.0f;
        o->gwd[g] = dl__dflt(pg->weight_decay, base_wd) + 0.0f;
        for (i = 0; i < pg->n; i++) {   /* de-duplicate within a group, keeping the first */
            for (j = 0; j < o->n; j++) if (o->p[j] == pg->params[i]) break;
            if (j == o->n) { o->pstep[o->n] = 0; o->pg[o->n] = g; o->p[o->n++] = pg->params[i]; }
            else if (o->pg[j] != g) {   /* which lr would it take? (torch: a ValueError) */
                dl__err(ctx, DL_ERR_ARG, "%s: parameter %d %s of group %d is also in group %d; a parameter "
                        "may be in one group only", fn, i, dl__sh(pg->params[i]), g, o->pg[j]);
                dl__optim_destroy(o);
                return NULL;
            }
        }
    }
    ns = dl__opt_nstate(o, &snames);
    for (k = 0; k < ns; k++) {
        o->s[k] = (dl_tensor **)dl__malloc(ctx, sizeof(dl_tensor *) * (size_t)o->n);
        if (!o->s[k]) goto oom_o;
        memset(o->s[k], 0, sizeof(dl_tensor *) * (size_t)o->n);
        for (i = 0; i < o->n; i++) {
            dl_tensor *t = o->p[i];
            o->s[k][i] = dl__make(t->dev_, fn, DL_DTYPE_F32, t->ndim, t->shape, true, NULL);
            if (!o->s[k][i]) { dl__optim_destroy(o); return NULL; }
            dl_set_name(o->s[k][i], snames[k]);
            DL__BE(t)->fill(t->dev_, (float *)o->s[k][i]->data, t->numel, 0.0f);
        }
    }
    /* the multi-tensor lists' room (CUDA): the steps then never allocate */
    if (!dl__mt_reserve(ctx, fn, &o->mtu, o->n, o->p, o->argbytes) ||
        !dl__mt_reserve(ctx, fn, &o->mtz, o->n, o->p, 0)) {
        dl__optim_destroy(o);
        return NULL;
    }
    o->magic = DL__OPT_MAGIC;
    if (!dl__own(ctx, dl__optim_destroy, o)) { dl__optim_destroy(o); return NULL; }
    return o;
oom_o:
    dl__optim_destroy(o);
oom:
    dl__err(ctx, DL_ERR_OOM, "%s: out of memory", fn);
    return NULL;
}

static dl_optim *dl__optim_list(dl_ctx *ctx, const char *fn, int kind, int n, dl_tensor *const *params,
                                const dl_sgd_desc *sd, const dl_adam_desc *ad)
{
    dl_param_group g;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "%s: ctx is NULL", fn); return NULL; }
    if (n <= 0 || !params) {
        dl__err(ctx, DL_ERR_ARG, "%s: got an empty parameter list", fn);
        return NULL;
    }
    memset(&g, 0, sizeof g);
    g.params = params;
    g.n = n;
    return dl__optim_make(ctx, fn, kind, 1, &g, sd, ad);
}

static dl_optim *dl__optim_mod(dl_module *m, const char *fn, int kind, const dl_sgd_desc *sd,
                               const dl_adam_desc *ad)
{
    int n;
    if (!dl__mod_ok(m)) return NULL;
    n = dl__mod_params(m);
    if (n < 0) return NULL;
    if (n == 0) {
        dl__err(m->ctx, DL_ERR_ARG, "%s: module %s has no parameters", fn, m->type);
        return NULL;
    }
    return dl__optim_list(m->ctx, fn, kind, n, m->scratch, sd, ad);
}

dl_optim *dl_sgd(dl_module *m, const dl_sgd_desc *d) { return dl__optim_mod(m, "dl_sgd", DL__OPT_SGD, d, NULL); }
dl_optim *dl_adam(dl_module *m, const dl_adam_desc *d) { return dl__optim_mod(m, "dl_adam", DL__OPT_ADAM, NULL, d); }
dl_optim *dl_adamw(dl_module *m, const dl_adam_desc *d) { return dl__optim_mod(m, "dl_adamw", DL__OPT_ADAMW, NULL, d); }
dl_optim *dl_sgd_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_sgd_desc *d)
{
    return dl__optim_list(ctx, "dl_sgd_params", DL__OPT_SGD, n, params, d, NULL);
}
dl_optim *dl_adam_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_adam_desc *d)
{
    return dl__optim_list(ctx, "dl_adam_params", DL__OPT_ADAM, n, params, NULL, d);
}
dl_optim *dl_adamw_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_adam_desc *d)
{
    return dl__optim_list(ctx, "dl_adamw_params", DL__OPT_ADAMW, n, params, NULL, d);
}
dl_optim *dl_sgd_groups(dl_ctx *ctx, int ng, const dl_param_group *g, const dl_sgd_desc *d)
{
    return ctx ? dl__optim_make(ctx, "dl_sgd_groups", DL__OPT_SGD, ng, g, d, NULL) : NULL;
}
dl_optim *dl_adam_groups(dl_ctx *ctx, int ng, const dl_param_group *g, const dl_adam_desc *d)
{
    return ctx ? dl__optim_make(ctx, "dl_adam_groups", DL__OPT_ADAM, ng, g, NULL, d) : NULL;
}
dl_optim *dl_adamw_groups(dl_ctx *ctx, int ng, const dl_param_group *g, const dl_adam_desc *d)
{
    return ctx ? dl__optim_make(ctx, "dl_adamw_groups", DL__OPT_ADAMW, ng, g, NULL, d) : NULL;
}

int dl_module_decay_groups(dl_module *m, dl_param_group out[2])
{
    int n, i, a = 0, b = 0;
    if (!out) return 0;
    memset(out, 0, sizeof(dl_param_group) * 2);
    if (!dl__mod_ok(m)) return 0;
    n = dl__mod_params(m);
    if (n <= 0) return 0;
    if (n > m->ngroups_cap) {
        dl_tensor **g = (dl_tensor **)dl__malloc(m->ctx, sizeof(dl_tensor *) * (size_t)n);
        if (!g) { dl__err(m->ctx, DL_ERR_OOM, "dl_module_decay_groups: out of memory"); return 0; }
        DL_FREE(m->groups);
        m->groups = g;
        m->ngroups_cap = n;
    }
    for (i = 0; i < n; i++) if (m->scratch[i]->ndim >= 2) m->groups[a++] = m->scratch[i];
    for (i = 0; i < n; i++) if (m->scratch[i]->ndim < 2) m->groups[a + b++] = m->scratch[i];
    out[0].params = m->groups;
    out[0].n = a;
    out[1].params = m->groups + a;
    out[1].n = b;
    out[1].weight_decay = DL_ZERO;
    return 2;
}

/* The arguments of this step's update of every parameter with a gradient
   (mask: of those that had one when a capture recorded the step), into
   o->args, from the live state: learning rates (a scheduler's), step
   counts, bias corrections in double as Python computes them. Then the
   step is counted: each updated parameter's (and its version) and the
   optimizer's. */
static void dl__optim_args(dl_optim *o, const unsigned char *mask)
{
    int i;
    for (i = 0; i < o->n; i++) {
        float lr = o->glr[o->pg[i]], wd = o->gwd[o->pg[i]];
        if (mask ? !mask[i] : !o->p[i]->grad) continue;
        if (o->kind == DL__OPT_SGD) {
            dl__sgd_args *a = (dl__sgd_args *)o->args + i;
            a->lr = lr;
            a->momentum = o->sgd.momentum;
            a->one_m_dampening = (float)(1.0 - (double)o->sgd.dampening);
            a->wd = wd;
            a->nesterov = o->sgd.nesterov;
            a->maximize = o->sgd.maximize;
            a->first = o->pstep[i] == 0;
        } else {
            dl__adam_args *a = (dl__adam_args *)o->args + i;
            double step = (double)(o->pstep[i] + 1);
            double b1 = o->adam.beta1, b2 = o->adam.beta2;
            double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
            bool decoupled = o->kind == DL__OPT_ADAMW;
            a->wd = decoupled ? 0.0f : wd;
            a->decay = decoupled ? (float)(1.0 - (double)lr * (double)wd) : 1.0f;
            a->beta1 = o->adam.beta1;
            a->one_m_beta1 = (float)(1.0 - b1);
            a->beta2 = o->adam.beta2;
            a->one_m_beta2 = (float)(1.0 - b2);
            a->bc2_sqrt = (float)sqrt(bc2);
            a->eps = o->adam.eps;
            a->neg_step_size = (float)(-((double)lr / bc1));
            a->amsgrad = o->adam.amsgrad;
            a->maximize = o->adam.maximize;
        }
        if (!mask) dl__bump_version(o->p[i]);   /* (a replay repeats the capture's bumps) */
        o->pstep[i]++;
    }
    o->steps++;
}

/* The updates of the parameters with a gradient, with o->args: a launch
   per device whose backend has multi-tensor updates (CUDA), else a call per
   parameter (the CPU's vectorized loops); the same arithmetic either way. */
static void dl__optim_apply(dl_optim *o)
{
    dl__dev *done[DL__MT_DEVS];
    void **slot = NULL;
    int i, ndone = 0, how;
    for (i = 0; i < o->n; i++) {
        dl_tensor *p = o->p[i];
        if (!p->grad) continue;      /* no gradient: skipped, as PyTorch */
        how = dl__mt_route(o->ctx, &o->mtu, o->n, p->dev_, done, &ndone, &slot);
        if (how == DL__MT_LAUNCH)
            dl__mt_run(&o->mtu, slot, p->dev_, o->kind == DL__OPT_SGD ? DL__MT_SGD : DL__MT_ADAM, o->n, o->p,
                       o->s, o->args, o->argbytes);
        else if (how == DL__MT_EACH && o->kind == DL__OPT_SGD)
            DL__BE(p)->sgd(p->dev_, (float *)p->data, (const float *)p->grad->data,
                           o->s[0] ? (float *)o->s[0][i]->data : NULL, p->numel, (dl__sgd_args *)o->args + i);
        else if (how == DL__MT_EACH)
            DL__BE(p)->adam(p->dev_, (float *)p->data, (const float *)p->grad->data, (float *)o->s[0][i]->data,
                            (float *)o->s[1][i]->data, o->adam.amsgrad ? (float *)o->s[2][i]->data : NULL,
                            p->numel, (dl__adam_args *)o->args + i);
    }
}

/* What a captured step's replay needs of its optimizer: which parameters
   it updated, and the multi-tensor caches (per device) its launches used. */
typedef struct dl__optim_cap {
    dl__mtset mt;                     /* (dev and cache only) */
    unsigned char mask[1];            /* n of them */
} dl__optim_cap;

/* A replay of a captured step: this step's arguments (the CPU's records
   point at o->args; a graph copies them from the caches it ran with) and
   its count, as dl_optim_step would have made them. */
static void dl__optim_replay(dl_capture *cap, void *owner, void *data)
{
    dl_optim *o = (dl_optim *)owner;
    dl__optim_cap *oc = (dl__optim_cap *)data;
    int i;
    (void)cap;
    if (!o) return;
    dl__optim_args(o, oc->mask);
    for (i = 0; i < DL__MT_DEVS && oc->mt.dev[i]; i++)
        if (oc->mt.cache[i]) oc->mt.dev[i]->be->mt_args(oc->mt.dev[i], oc->mt.cache[i], o->args, o->argbytes);
}

/* dl_optim_step inside a capture: every tensor it touches is the capture's
   to know, and a replay must redo its host part (the hook). NULL: failed. */
static dl__optim_cap *dl__optim_capture(dl_optim *o)
{
    dl__optim_cap *oc = (dl__optim_cap *)dl__malloc(o->ctx, sizeof(dl__optim_cap) + (size_t)o->n);
    int i, k;
    if (!oc) { dl__err(o->ctx, DL_ERR_OOM, "dl_optim_step: out of memory"); return NULL; }
    memset(oc, 0, sizeof *oc);
    for (i = 0; i < o->n; i++) {
        oc->mask[i] = o->p[i]->grad != NULL;
        if (!oc->mask[i]) continue;
        dl__cap_use(o->p[i]->grad);
        for (k = 0; k < 3; k++) if (o->s[k]) dl__cap_use(o->s[k][i]);
    }
    if (!dl__cap_hook(o->ctx, "dl_optim_step", dl__optim_replay, o, oc)) { DL_FREE(oc); return NULL; }
    return oc;
}

static dl_result dl__optim_step_run(dl_optim *o)
{
    int i;
    dl_ctx *ctx;
    dl__optim_cap *oc = NULL;
    if (!dl__optim_ok(o)) return DL_ERR_ARG;
    ctx = o->ctx;
    /* check everything first: a step is all or nothing */
    for (i = 0; i < o->n; i++) {
        dl_tensor *p = o->p[i];
        if (!dl__valid("dl_optim_step", "a parameter", p)) return DL_ERR_ARG;
        if (p->grad && (p->grad->magic_ != DL__MAGIC || !dl_same_shape(p->grad, p) ||
                        p->grad->dtype != DL_DTYPE_F32)) {
            dl__err(ctx, DL_ERR_SHAPE, "dl_optim_step: parameter %d %s has a gradient of another "
                    "shape or dtype", i, dl__sh(p));
            return DL_ERR_SHAPE;
        }
        if (p->grad && p->grad->dev_ != p->dev_) {
            dl__err(ctx, DL_ERR_DEVICE, "dl_optim_step: parameter %d %s is on %s but its gradient is "
                    "on %s; move the parameter with dl_module_to() (which moves its grad too)", i,
                    dl__sh(p), dl_device_name(p->device), dl_device_name(p->grad->device));
            return DL_ERR_DEVICE;
        }
    }
    /* optimizer state lives on its parameter's device: follow a moved parameter */
    for (i = 0; i < o->n; i++) {
        int k;
        for (k = 0; k < 3; k++)
            if (o->s[k] && o->s[k][i]->dev_ != o->p[i]->dev_ && !dl__move(o->s[k][i], o->p[i]->dev_))
                return ctx->err;
    }
    if (ctx->cap && !(oc = dl__optim_capture(o))) return ctx->err;
    dl__optim_args(o, NULL);
    dl__optim_apply(o);
    if (oc) {   /* the caches its launches ran with */
        memcpy(oc->mt.dev, o->mtu.dev, sizeof oc->mt.dev);
        memcpy(oc->mt.cache, o->mtu.cache, sizeof oc->mt.cache);
    }
    return DL_OK;
}

static void dl__optim_zero_grad_run(dl_optim *o)
{
    if (dl__optim_ok(o)) dl__zero_grads(o->ctx, &o->mtz, o->n, o->p);
}

/* the two as profiler spans on the first parameter's device (PyTorch's
   "Optimizer.step#SGD.step" and "Optimizer.zero_grad#SGD.zero_grad") */
dl_result dl_optim_step(dl_optim *o)
{
    dl_result rc;
    bool prof = dl__optim_ok(o) && o->ctx->prof && o->n > 0 && o->p[0]->magic_ == DL__MAGIC;
    if (prof) dl__prof_begin(o->ctx, o->p[0]->dev_, "dl_optim_step", false);
    rc = dl__optim_step_run(o);
    if (prof) dl__end_rc(o->ctx, rc, "dl_optim_step");
    return rc;
}

void dl_optim_zero_grad(dl_optim *o)
{
    bool prof = dl__optim_ok(o) && o->ctx->prof && o->n > 0 && o->p[0]->magic_ == DL__MAGIC;
    if (prof) dl__prof_begin(o->ctx, o->p[0]->dev_, "dl_optim_zero_grad", false);
    dl__optim_zero_grad_run(o);
    if (prof) dl__end_rc(o->ctx, DL_OK, "dl_optim_zero_grad");
}

dl_result dl_optim_set_lr(dl_optim *o, float lr)
{
    int g;
    double f;
    if (!dl__optim_ok(o)) return DL_ERR_ARG;
    if (!dl__lr_ok(o->ctx, "dl_optim_set_lr", "lr", lr)) return DL_ERR_ARG;
    f = o->glr0[0] > 0.0f ? (double)lr / (double)o->glr0[0] : 1.0;
    o->glr[0] = lr;
    for (g = 1; g < o->ng; g++) o->glr[g] = o->glr0[0] > 0.0f ? (float)((double)o->glr0[g] * f) : lr;
    return DL_OK;
}

dl_result dl_optim_set_group_lr(dl_optim *o, int group, float lr)
{
    if (!dl__optim_ok(o)) return DL_ERR_ARG;
    if (group < 0 || group >= o->ng) {
        dl__err(o->ctx, DL_ERR_ARG, "dl_optim_set_group_lr: group %d does not exist (0..%d)", group, o->ng - 1);
        return DL_ERR_ARG;
    }
    if (!dl__lr_ok(o->ctx, "dl_optim_set_group_lr", "lr", lr)) return DL_ERR_ARG;
    o->glr[group] = lr;
    return DL_OK;
}

float dl_optim_lr(const dl_optim *o) { return dl__optim_ok(o) ? o->glr[0] : 0.0f; }
float dl_optim_group_lr(const dl_optim *o, int g) { return dl__optim_ok(o) && g >= 0 && g < o->ng ? o->glr[g] : 0.0f; }
int dl_optim_num_groups(const dl_optim *o) { return dl__optim_ok(o) ? o->ng : 0; }
int64_t dl_optim_steps(const dl_optim *o) { return dl__optim_ok(o) ? o->steps : 0; }
void dl_optim_free(dl_optim *o) { if (dl__optim_ok(o)) dl__disown(o->ctx, o); }

// >>section optim: schedules and clipping
float dl_lr_step(float base, int64_t epoch, int64_t step_size, float gamma)
{
    if (step_size <= 0) return NAN;
    if (epoch < 0) return base;
    return (float)((double)base * pow((double)gamma, (double)(epoch / step_size)));
}

float dl_lr_cosine(float base, int64_t t, int64_t t_max, float eta_min)
{
    const double pi = 3.14159265358979323846;
    if (t_max <= 0) return NAN;
    return (float)((double)eta_min + ((double)base - (double)eta_min) *
                   (1.0 + cos(pi * (double)t / (double)t_max)) / 2.0);
}

float dl_lr_warmup(float base, int64_t t, int64_t warmup)
{
    if (warmup <= 1 || t + 1 >= warmup) return base;
    if (t < 0) t = 0;
    return (float)((double)base * (double)(t + 1) / (double)warmup);
}

float dl_clip_grad_norm(dl_module *m, float max_norm)
{
    int n, i;
    double total = 0;
    if (!dl__mod_ok(m)) return 0.0f;
    if (dl__cap_refused(m->ctx, "dl_clip_grad_norm", "a read to the host (the norm it returns)",
                        "clip outside the captured step")) return 0.0f;
    n = dl__mod_params(m);
    for (i = 0; i < n; i++) {
        dl_tensor *p = m->scratch[i];
        double norm;
        if (!p->grad) continue;
        norm = sqrt(DL__BE(p)->sumsq(p->dev_, (const float *)p->grad->data, p->numel));
        /* torch: norm of the per-tensor float32 norms */
        norm = (double)(float)norm;
        total += norm * norm;
    }
    {
        /* as torch (float32 tensors): coef = max_norm / (total + 1e-6), clamped to 1 */
        float tot = (float)sqrt(total), c = max_norm / (tot + 1e-6f);
        if (!(c >= 1.0f))   /* a NaN norm (or max_norm) makes every gradient NaN, as torch's clamp does */
            for (i = 0; i < n; i++) {
                dl_tensor *p = m->scratch[i];
                if (p->grad) {
                    DL__BE(p)->scale(p->dev_, (float *)p->grad->data, p->numel, c);
                    dl__bump_version(p->grad);
                }
            }
        total = tot;
    }
    return (float)total;
}

// >>section data
/* IDX files are read whole, checked (magic, type, dims, exact size) and only
   then converted, so a 100-byte file can never make the reader allocate
   gigabytes. The loader prepares batch k+1 on worker threads while the
   caller trains on batch k: two host buffers alternate. Every sample's
   augmentation draws from a generator seeded by (seed, epoch, position), and
   each epoch's order from (seed, epoch), so the batches are the same with
   any number of workers. */

#ifdef DL_ZLIB
#include <zlib.h>
#endif

static uint32_t dl__be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Parse an IDX image of `size` bytes in memory into a persistent tensor. */
static dl_result dl__idx_parse(dl_ctx *ctx, const char *path, const unsigned char *buf, size_t size,
                               dl_dtype as, dl_tensor **out)
{
    int nd, i, esz;
    int type;
    int64_t dims[DL_MAX_DIMS], numel = 1;
    dl_tensor *t;
    const unsigned char *p;
    *out = NULL;
    if (size < 4 || buf[0] != 0 || buf[1] != 0) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s' is not an IDX file (bad magic; %zu bytes)", path, size);
        return DL_ERR_FORMAT;
    }
    type = buf[2];
    nd = buf[3];
    switch (type) {
    case 0x08: case 0x09: esz = 1; break;
    case 0x0B: esz = 2; break;
    case 0x0C: case 0x0D: esz = 4; break;
    case 0x0E: esz = 8; break;
    default:
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s' has unknown IDX type code 0x%02x", path, type);
        return DL_ERR_FORMAT;
    }
    if (nd < 1 || nd > DL_MAX_DIMS) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s' declares %d dims (1..%d supported)", path, nd, DL_MAX_DIMS);
        return DL_ERR_FORMAT;
    }
    if (size < 4 + 4 * (size_t)nd) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s' is truncated inside its header (%zu bytes)", path, size);
        return DL_ERR_FORMAT;
    }
    for (i = 0; i < nd; i++) {
        dims[i] = (int64_t)dl__be32(buf + 4 + 4 * i);
        if (dims[i] && numel > (INT64_MAX / 16) / dims[i]) {
            dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s': dims overflow", path);
            return DL_ERR_FORMAT;
        }
        numel *= dims[i];
    }
    if ((uint64_t)numel > (uint64_t)((size - 4 - 4 * (size_t)nd) / (size_t)esz) ||
        4 + 4 * (size_t)nd + (size_t)numel * (size_t)esz != size) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s': its dims need %lld bytes of data but the file "
                "has %zu (truncated, or a count mismatch)", path, (long long)numel * esz,
                size - 4 - 4 * (size_t)nd);
        return DL_ERR_FORMAT;
    }
    if (as != DL_DTYPE_F32 && as != DL_DTYPE_I64) {
        dl__err(ctx, DL_ERR_DTYPE, "dl_idx_load: can load as float32 or int64, not %s", dl__dtype_str(as));
        return DL_ERR_DTYPE;
    }
    t = dl__make(ctx->cpu[0], "dl_idx_load", as, nd, dims, true, NULL);
    if (!t) return ctx->err;
    p = buf + 4 + 4 * nd;
    {
        int64_t k;
        for (k = 0; k < numel; k++) {
            double v;
            const unsigned char *q = p + k * esz;
            switch (type) {
            case 0x08: v = q[0]; break;
            case 0x09: v = (signed char)q[0]; break;
            case 0x0B: v = (int16_t)(((unsigned)q[0] << 8) | q[1]); break;
            case 0x0C: v = (int32_t)dl__be32(q); break;
            case 0x0D: { uint32_t u = dl__be32(q); float f; memcpy(&f, &u, 4); v = f; break; }
            default: {
                uint64_t u = ((uint64_t)dl__be32(q) << 32) | dl__be32(q + 4);
                double d;
                memcpy(&d, &u, 8);
                v = d;
            }
            }
            if (as == DL_DTYPE_F32) {
                /* float64 files may hold values beyond float's range: saturate */
                ((float *)t->data)[k] = v > FLT_MAX ? INFINITY : v < -FLT_MAX ? -INFINITY : (float)v;
            } else if (v >= -9.2e18 && v <= 9.2e18 && v == floor(v)) {   /* no silent truncation */
                ((int64_t *)t->data)[k] = (int64_t)v;
            } else {
                dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s': element %lld (%g) is not an integer "
                        "that fits int64; load it as float32", path, (long long)k, v);
                dl_free(t);
                return DL_ERR_FORMAT;
            }
        }
    }
    *out = t;
    return DL_OK;
}

#ifdef DL_ZLIB
/* Inflates a gzip image in memory. The IDX header is read from the first
   decompressed bytes and the output is capped at exactly the size it
   implies, so a small file of zeros cannot make the reader allocate
   gigabytes ("decompression bomb"). */
static dl_result dl__idx_gunzip(dl_ctx *ctx, const char *path, const unsigned char *gz, size_t gzlen,
                                unsigned char **out, size_t *outlen)
{
    z_stream z;
    unsigned char head[4 + 4 * 255], *buf = NULL;
    size_t need = 4, have = 0, total = 0;
    int zr = Z_OK, i;
    dl_result rc = DL_ERR_FORMAT;
    *out = NULL;
    *outlen = 0;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
        dl__err(ctx, DL_ERR_OOM, "dl_idx_load: '%s': cannot start zlib", path);
        return DL_ERR_OOM;
    }
    z.next_in = (unsigned char *)(uintptr_t)gz;
    z.avail_in = (uInt)(gzlen > 0xffffffffu ? 0xffffffffu : gzlen);
    /* the header: 4 bytes, then 4 per dim */
    while (have < need) {
        z.next_out = head + have;
        z.avail_out = (uInt)(need - have);
        zr = inflate(&z, Z_NO_FLUSH);
        have = need - z.avail_out;
        if (zr != Z_OK) break;
        if (have == 4 && need == 4) need = 4 + 4 * (size_t)head[3];
    }
    if (have == 4 && need == 4 && head[3] == 0) need = 4;
    if (have < need || (have >= 4 && (head[0] != 0 || head[1] != 0))) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s': the decompressed data does not start with an "
                "IDX header (%s)", path, have < need ? (zr == Z_STREAM_END ? "it ends first" :
                "corrupt gzip data") : "bad magic");
        goto done;
    }
    {
        int esz = head[2] == 0x08 || head[2] == 0x09 ? 1 : head[2] == 0x0B ? 2 :
                  head[2] == 0x0C || head[2] == 0x0D ? 4 : head[2] == 0x0E ? 8 : 0;
        uint64_t n = 1;
        if (!esz) {
            dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s' has unknown IDX type code 0x%02x", path, head[2]);
            goto done;
        }
        for (i = 0; i < head[3]; i++) {
            uint64_t d = dl__be32(head + 4 + 4 * i);
            if (d && n > ((uint64_t)1 << 40) / d) {
                dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s': its dims claim more than 2^40 elements", path);
                goto done;
            }
            n *= d;
        }
        total = need + (size_t)(n * (uint64_t)esz);
    }
    buf = (unsigned char *)dl__malloc(ctx, total + 1);
    if (!buf) {
        rc = DL_ERR_OOM;
        dl__err(ctx, DL_ERR_OOM, "dl_idx_load: '%s': cannot allocate the %zu bytes its header "
                "declares", path, total);
        goto done;
    }
    memcpy(buf, head, need);
    have = need;
    /* one byte more than declared: finding it means the file holds more data than its header says */
    while (zr == Z_OK && have < total + 1) {
        size_t room = total + 1 - have;
        z.next_out = buf + have;
        z.avail_out = (uInt)(room > 0x40000000u ? 0x40000000u : room);
        zr = inflate(&z, Z_NO_FLUSH);
        have += (room > 0x40000000u ? 0x40000000u : room) - z.avail_out;
        if (zr == Z_BUF_ERROR && z.avail_in == 0) break;
    }
    if (zr != Z_STREAM_END && zr != Z_OK && zr != Z_BUF_ERROR) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s': corrupt gzip data (%s)", path, z.msg ? z.msg : "inflate failed");
        goto done;
    }
    if (have != total) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s': its header declares %zu bytes but the "
                "decompressed file has %s%zu (truncated, or a count mismatch)", path, total,
                have > total ? "more than " : "", have > total ? total : have);
        goto done;
    }
    *out = buf;
    *outlen = total;
    buf = NULL;
    rc = DL_OK;
done:
    DL_FREE(buf);
    inflateEnd(&z);
    return rc;
}
#endif

dl_result dl_idx_load(dl_ctx *ctx, const char *path, dl_dtype as, dl_tensor **out)
{
    unsigned char *buf = NULL;
    size_t size = 0;
    dl_result rc;
    if (!ctx) return DL_ERR_ARG;
    if (!path || !out) { dl__err(ctx, DL_ERR_ARG, "dl_idx_load: path and out must not be NULL"); return DL_ERR_ARG; }
    *out = NULL;
    rc = dl__read_file(ctx, "dl_idx_load", path, &buf, &size);
    if (rc != DL_OK) return rc;
    if (size >= 2 && buf[0] == 0x1f && buf[1] == 0x8b) {
#ifdef DL_ZLIB
        unsigned char *raw;
        size_t rawlen;
        rc = dl__idx_gunzip(ctx, path, buf, size, &raw, &rawlen);
        DL_FREE(buf);
        if (rc != DL_OK) return rc;
        buf = raw;
        size = rawlen;
#else
        DL_FREE(buf);
        dl__err(ctx, DL_ERR_UNSUPPORTED, "dl_idx_load: '%s' is gzip-compressed: gunzip it, or build "
                "with -DDL_ZLIB and link -lz", path);
        return DL_ERR_UNSUPPORTED;
#endif
    }
    rc = dl__idx_parse(ctx, path, buf, size, as, out);
    DL_FREE(buf);
    return rc;
}

/* The samples are read on the host: x in place when its memory is host
   memory, else a host copy made once; the labels as an int64 copy. */
typedef struct dl__tds {
    dl_dataset ds;
    dl_tensor *x, *y;
    const float *xh;     /* x's values on the host */
    float *xcopy;        /* owned copy (x on a device) or NULL */
    int64_t *yh;         /* labels */
    dl_transform_desc t;
    bool has_t, train;
    int64_t sn;          /* floats per sample */
} dl__tds;

/* the transform's normalization (scale, mean, 1/std) */
static void dl__tds_norm(const dl__tds *d, float *scale, float *mean, float *inv_std)
{
    *scale = 1.0f; *mean = 0.0f; *inv_std = 1.0f;
    if (!d->has_t) return;
    if (d->t.scale != 0.0f) *scale = d->t.scale;
    *mean = d->t.mean;
    if (d->t.std != 0.0f) *inv_std = 1.0f / d->t.std;
}

/* whether a sample is augmented, and if so its draws from rng: flip, then
   the crop's offsets dy, dx in 0..2p (p = crop_padding). The host's
   dl__tds_get and the device loader's plan both draw here. */
static bool dl__tds_aug(const dl__tds *d, uint64_t rng[4], bool *flip, int64_t *dy, int64_t *dx)
{
    int64_t p = d->t.crop_padding;
    *flip = false;
    *dy = *dx = 0;
    if (!(d->has_t && d->train && d->ds.sample_shape.ndim >= 2 && (d->t.hflip || p > 0))) return false;
    *flip = d->t.hflip && dl__rng_uniform(rng) < 0.5f;
    if (p > 0) {
        *dy = (int64_t)(dl__rng_uniform(rng) * (float)(2 * p + 1));
        *dx = (int64_t)(dl__rng_uniform(rng) * (float)(2 * p + 1));
        if (*dy > 2 * p) *dy = 2 * p;
        if (*dx > 2 * p) *dx = 2 * p;
    }
    return true;
}

static dl_result dl__tds_get(const dl_dataset *ds, int64_t i, float *x, int64_t *y, uint64_t rng[4])
{
    const dl__tds *d = (const dl__tds *)ds->user;
    const float *src = d->xh + i * d->sn;
    float scale, mean, inv_std;
    int64_t k, dy, dx;
    bool flip;
    *y = d->yh[i];
    dl__tds_norm(d, &scale, &mean, &inv_std);
    if (dl__tds_aug(d, rng, &flip, &dy, &dx)) {
        const dl_shape *s = &d->ds.sample_shape;
        int64_t H = s->d[s->ndim - 2], W = s->d[s->ndim - 1], C = (H > 0 && W > 0) ? d->sn / (H * W) : 0;
        int64_t p = d->t.crop_padding, c, r, q;
        for (c = 0; c < C; c++)
            for (r = 0; r < H; r++)
                for (q = 0; q < W; q++) {
                    int64_t sr = r + dy - p, sq = (flip ? W - 1 - q : q) + dx - p;
                    float v = (sr >= 0 && sr < H && sq >= 0 && sq < W) ? src[(c * H + sr) * W + sq] : 0.0f;
                    x[(c * H + r) * W + q] = dl__px_norm(v, scale, mean, inv_std);
                }
        return DL_OK;
    }
    for (k = 0; k < d->sn; k++) x[k] = dl__px_norm(src[k], scale, mean, inv_std);
    return DL_OK;
}

static void dl__tds_free(void *p)
{
    dl__tds *d = (dl__tds *)p;
    DL_FREE(d->xcopy);
    DL_FREE(d->yh);
    DL_FREE(d);
}

dl_dataset *dl_tensor_dataset(dl_ctx *ctx, dl_tensor *x, dl_tensor *y, const dl_transform_desc *t, bool train)
{
    dl__tds *d;
    if (!ctx || !x || !y) return NULL;
    if (!dl__valid("dl_tensor_dataset", "x", x) || !dl__valid("dl_tensor_dataset", "y", y)) return NULL;
    if (!dl__f32("dl_tensor_dataset", "x", x)) return NULL;
    if (x->ndim < 1 || y->ndim != 1) {
        dl__err(ctx, DL_ERR_SHAPE, "dl_tensor_dataset: x %s and y %s: need x (N, ...) and y (N)",
                dl__sh(x), dl__sh(y));
        return NULL;
    }
    if (x->shape[0] != y->shape[0]) {
        dl__err(ctx, DL_ERR_SHAPE, "dl_tensor_dataset: x has %lld samples %s but y has %lld labels "
                "%s: the counts must match", (long long)x->shape[0], dl__sh(x),
                (long long)y->shape[0], dl__sh(y));
        return NULL;
    }
    if (x->step_ != 0 || y->step_ != 0) {
        dl__err(ctx, DL_ERR_ARG, "dl_tensor_dataset: x and y must be persistent (dl_keep them)");
        return NULL;
    }
    if (t && (t->crop_padding < 0 || t->crop_padding > 1024)) {
        dl__err(ctx, DL_ERR_ARG, "dl_tensor_dataset: crop_padding %lld out of range 0..1024", (long long)t->crop_padding);
        return NULL;
    }
    d = (dl__tds *)dl__malloc(ctx, sizeof *d);
    if (!d) { dl__err(ctx, DL_ERR_OOM, "dl_tensor_dataset: out of memory"); return NULL; }
    memset(d, 0, sizeof *d);
    d->x = x;
    d->y = y;
    d->train = train;
    if (t) { d->t = *t; d->has_t = true; }
    d->sn = dl__prod(x->shape + 1, x->ndim - 1);
    d->ds.length = x->shape[0];
    d->ds.sample_shape = dl_shape_make(x->ndim - 1, x->shape + 1);
    d->ds.get = dl__tds_get;
    d->ds.user = d;
    d->yh = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)(y->numel + 1));
    if (!dl__host_ok(x)) d->xcopy = (float *)dl__malloc(ctx, sizeof(float) * (size_t)(x->numel + 1));
    if (!d->yh || (!dl__host_ok(x) && !d->xcopy)) {
        dl__tds_free(d);
        dl__err(ctx, DL_ERR_OOM, "dl_tensor_dataset: out of memory for the labels or a host copy of x");
        return NULL;
    }
    if (dl_read_int64(y, d->yh, y->numel) != DL_OK) { dl__tds_free(d); return NULL; }
    if (d->xcopy) {
        if (dl_read(x, d->xcopy, x->numel) != DL_OK) { dl__tds_free(d); return NULL; }
        d->xh = d->xcopy;
    } else d->xh = (const float *)x->data;
    if (!dl__own(ctx, dl__tds_free, d)) { dl__tds_free(d); return NULL; }
    return &d->ds;
}

struct dl_loader {
    dl_ctx *ctx;
    dl__dev *dev;                     /* where batches go */
    const dl_dataset *ds;
    dl_loader_desc d;
    int64_t n, nb, sn, epoch, batch;
    int64_t *perm;
    float *xbuf[2];
    int64_t *ybuf[2];
    /* the job in flight: fill batch job_batch of epoch job_epoch into slot job_slot */
    int64_t job_batch, job_epoch;
    int job_slot;
    bool in_flight;
    dl_result job_rc;                 /* first failure of the job (under mu with workers) */
    int64_t job_bad_index, job_bad_pos;
    int nw;
    /* device_data: the dataset on dev as bytes (ddata) with its labels, and
       the epoch's plan (per position: sample index, crop and flip), drawn on
       the host (hplan) and uploaded once an epoch (dplan) */
    bool on_dev;
    uint8_t *ddata;
    int64_t *dlabels, *dplan, *hplan;
    size_t dbytes[3];
    dl__batchgeom geom;
#ifndef DL_NO_THREADS
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    uint64_t gen;
    int pending, started;
    bool stop;
#endif
};

static int64_t dl__batch_count(const dl_loader *l, int64_t b)
{
    int64_t lo = b * l->d.batch_size, hi = lo + l->d.batch_size;
    return (hi > l->n ? l->n : hi) - lo;
}

/* the generator of the sample at position pos of an epoch: its augmentation's draws */
static void dl__loader_rng(const dl_loader *l, int64_t epoch, int64_t pos, uint64_t rng[4])
{
    dl__seed_state(l->d.seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)epoch << 40) ^ (uint64_t)pos, rng);
}

/* Fill the share of worker w (of nw) of the current job. The first failure
   (by position in the batch) is merged into job_rc / job_bad_index under the
   loader's lock by the caller, so reports do not depend on thread timing. */
static void dl__loader_fill(dl_loader *l, int w, int nw, dl_result *rc_out, int64_t *pos_out)
{
    int64_t lo = l->job_batch * l->d.batch_size, cnt = dl__batch_count(l, l->job_batch), j;
    *rc_out = DL_OK;
    *pos_out = -1;
    for (j = w; j < cnt; j += nw) {
        int64_t pos = lo + j, idx = l->perm[pos];
        uint64_t rng[4];
        dl_result rc;
        dl__loader_rng(l, l->job_epoch, pos, rng);
        rc = l->ds->get(l->ds, idx, l->xbuf[l->job_slot] + j * l->sn, l->ybuf[l->job_slot] + j, rng);
        if (rc != DL_OK) { *rc_out = rc; *pos_out = j; return; }
    }
}

/* keep the failure at the smallest batch position (call with the lock held) */
static void dl__loader_merge(dl_loader *l, dl_result rc, int64_t j)
{
    if (rc == DL_OK) return;
    if (l->job_rc == DL_OK || j < l->job_bad_pos) {
        l->job_rc = rc;
        l->job_bad_pos = j;
        l->job_bad_index = l->perm[l->job_batch * l->d.batch_size + j];
    }
}

#ifndef DL_NO_THREADS
typedef struct dl__lw { dl_loader *l; int w; } dl__lw;
static void *dl__loader_worker(void *arg)
{
    dl_loader *l = ((dl__lw *)arg)->l;
    int w = ((dl__lw *)arg)->w;
    uint64_t seen = 0;
    dl_result rc;
    int64_t pos;
    DL_FREE(arg);
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && l->gen == seen) pthread_cond_wait(&l->cv_work, &l->mu);
        if (l->stop) break;
        seen = l->gen;
        pthread_mutex_unlock(&l->mu);
        dl__loader_fill(l, w, l->nw, &rc, &pos);
        pthread_mutex_lock(&l->mu);
        dl__loader_merge(l, rc, pos);
        if (--l->pending == 0) pthread_cond_signal(&l->cv_done);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}
#endif

static void dl__loader_launch(dl_loader *l, int64_t batch, int slot)
{
    l->job_batch = batch;
    l->job_epoch = l->epoch;
    l->job_slot = slot;
    l->job_rc = DL_OK;
    l->in_flight = true;
#ifndef DL_NO_THREADS
    if (l->nw > 0) {
        pthread_mutex_lock(&l->mu);
        l->pending = l->nw;
        l->gen++;
        pthread_cond_broadcast(&l->cv_work);
        pthread_mutex_unlock(&l->mu);
    }
#endif
}

static void dl__loader_wait(dl_loader *l)
{
    if (!l->in_flight) return;
#ifndef DL_NO_THREADS
    if (l->nw > 0) {
        pthread_mutex_lock(&l->mu);
        while (l->pending > 0) pthread_cond_wait(&l->cv_done, &l->mu);
        pthread_mutex_unlock(&l->mu);
        l->in_flight = false;
        return;
    }
#endif
    {
        dl_result rc;
        int64_t pos;
        dl__loader_fill(l, 0, 1, &rc, &pos);
        dl__loader_merge(l, rc, pos);
    }
    l->in_flight = false;
}

static void dl__loader_free(void *p)
{
    dl_loader *l = (dl_loader *)p;
#ifndef DL_NO_THREADS
    int i;
    if (l->started) {
        dl__loader_wait(l);
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->cv_work);
        pthread_mutex_unlock(&l->mu);
        for (i = 0; i < l->started; i++) pthread_join(l->th[i], NULL);
    }
    if (l->nw > 0 || l->th) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv_work);
        pthread_cond_destroy(&l->cv_done);
    }
    DL_FREE(l->th);
#endif
    {   /* device_data's buffers */
        void *p[3];
        int i;
        p[0] = l->ddata; p[1] = l->dlabels; p[2] = l->dplan;
        for (i = 0; i < 3; i++)
            if (p[i]) {
                l->dev->be->free(l->dev, p[i]);
                l->dev->persistent_bytes -= l->dbytes[i] < l->dev->persistent_bytes ? l->dbytes[i] : l->dev->persistent_bytes;
            }
    }
    DL_FREE(l->hplan);
    DL_FREE(l->perm);
    DL_FREE(l->xbuf[0]);
    DL_FREE(l->xbuf[1]);
    DL_FREE(l->ybuf[0]);
    DL_FREE(l->ybuf[1]);
    DL_FREE(l);
}

/* device_data: the dataset's x as bytes and its labels on l->dev, and a
   host buffer for the epochs' plans. Every check first (a dl_tensor_dataset,
   whole numbers 0..255), then the memory. */
static void *dl__loader_dalloc(dl_loader *l, int k, size_t bytes)
{
    dl__dev *d = l->dev;
    void *p;
    if (!dl__dev_limit_ok(d, bytes) || !(p = dl__dev_alloc(d, bytes ? bytes : 1))) return NULL;
    l->dbytes[k] = bytes;
    d->persistent_bytes += bytes;
    dl__track_peak(d);
    return p;
}

static dl_result dl__loader_to_device(dl_loader *l)
{
    dl_ctx *ctx = l->ctx;
    const dl__tds *d = l->ds->get == dl__tds_get ? (const dl__tds *)l->ds->user : NULL;
    const dl_shape *s = &l->ds->sample_shape;
    uint8_t *bytes;
    int64_t i, n = l->n * l->sn;
    bool flip;
    int64_t dy, dx;
    uint64_t rng[4] = {0, 0, 0, 0};
    if (!d) {
        dl__err(ctx, DL_ERR_ARG, "dl_loader_new: device_data needs a dataset made by dl_tensor_dataset "
                "(this one has a get function of its own, which runs on the host)");
        return DL_ERR_ARG;
    }
    for (i = 0; i < n; i++)
        if (!(d->xh[i] >= 0.0f && d->xh[i] <= 255.0f && d->xh[i] == (float)(int)d->xh[i])) {
            dl__err(ctx, DL_ERR_ARG, "dl_loader_new: device_data keeps x on %s as bytes, but x holds %g at "
                    "flat index %lld (sample %lld): the values must be whole numbers from 0 to 255 (raw "
                    "pixels; normalize them with dl_transform_desc's scale, mean and std)",
                    dl_device_name(l->dev->id), (double)d->xh[i], (long long)i, (long long)(i / l->sn));
            return DL_ERR_ARG;
        }
    l->on_dev = true;
    l->geom.sn = l->sn;
    l->geom.C = 1;
    l->geom.H = 1;
    l->geom.W = l->sn;
    if (s->ndim >= 2 && s->d[s->ndim - 2] > 0 && s->d[s->ndim - 1] > 0) {
        l->geom.H = s->d[s->ndim - 2];
        l->geom.W = s->d[s->ndim - 1];
        l->geom.C = l->sn / (l->geom.H * l->geom.W);
    }
    l->geom.pad = dl__tds_aug(d, rng, &flip, &dy, &dx) ? d->t.crop_padding : 0;   /* (draws thrown away) */
    dl__tds_norm(d, &l->geom.scale, &l->geom.mean, &l->geom.inv_std);
    bytes = (uint8_t *)dl__malloc(ctx, (size_t)n + 1);
    l->hplan = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)(2 * l->n + 1));
    l->ddata = (uint8_t *)dl__loader_dalloc(l, 0, (size_t)n);
    l->dlabels = (int64_t *)dl__loader_dalloc(l, 1, sizeof(int64_t) * (size_t)l->n);
    l->dplan = (int64_t *)dl__loader_dalloc(l, 2, sizeof(int64_t) * (size_t)(2 * l->n));
    if (!bytes || !l->hplan || !l->ddata || !l->dlabels || !l->dplan) {
        DL_FREE(bytes);
        dl__err(ctx, DL_ERR_OOM, "dl_loader_new: device_data: no memory for the dataset (%lld bytes of "
                "samples, %lld of labels) on %s%s", (long long)n, (long long)(8 * l->n), dl_device_name(l->dev->id),
                ctx->memory_limit ? " (memory_limit reached?)" : "");
        return DL_ERR_OOM;
    }
    for (i = 0; i < n; i++) bytes[i] = (uint8_t)d->xh[i];
    l->dev->be->upload(l->dev, l->ddata, bytes, (size_t)n);
    l->dev->be->upload(l->dev, l->dlabels, d->yh, sizeof(int64_t) * (size_t)l->n);
    DL_FREE(bytes);
    return dl__dev_check(l->dev, "dl_loader_new");
}

dl_loader *dl_loader_new(dl_ctx *ctx, const dl_dataset *ds, const dl_loader_desc *desc)
{
    dl_loader *l;
    int64_t bs, bcap;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_loader_new: ctx is NULL"); return NULL; }
    if (!ds) return NULL;   /* the dataset's constructor failed and said why */
    if (!ds->get || ds->length < 0) {
        dl__err(ctx, DL_ERR_ARG, "dl_loader_new: the dataset has %s (length %lld)",
                ds->get ? "a negative length" : "no get function", (long long)ds->length);
        return NULL;
    }
    bs = desc && desc->batch_size > 0 ? desc->batch_size : 1;
    if (desc && (desc->batch_size < 0 || desc->num_workers < 0 || desc->num_workers > 64)) {
        dl__err(ctx, DL_ERR_ARG, "dl_loader_new: batch_size %lld must be >= 0 and num_workers %d in 0..64",
                (long long)desc->batch_size, desc->num_workers);
        return NULL;
    }
    {   /* a user's dataset: its sample shape is read below, so check it first */
        const dl_shape *s = &ds->sample_shape;
        int k;
        int64_t sn = 1;
        if (s->ndim < 0 || s->ndim > DL_MAX_DIMS - 1) {
            dl__err(ctx, DL_ERR_ARG, "dl_loader_new: the dataset's sample_shape has ndim %d; it must be in "
                    "0..%d (a batch adds a dim, at most DL_MAX_DIMS=%d)", s->ndim, DL_MAX_DIMS - 1, DL_MAX_DIMS);
            return NULL;
        }
        for (k = 0; k < s->ndim; k++) {
            if (s->d[k] < 0 || (s->d[k] > 0 && sn > INT64_MAX / 8 / s->d[k])) {
                dl__err(ctx, DL_ERR_ARG, "dl_loader_new: the dataset's sample_shape dim %d is %lld; each dim "
                        "must be >= 0 and a sample under 2^60 elements", k, (long long)s->d[k]);
                return NULL;
            }
            sn *= s->d[k];
        }
    }
    l = (dl_loader *)dl__malloc(ctx, sizeof *l);
    if (!l) { dl__err(ctx, DL_ERR_OOM, "dl_loader_new: out of memory"); return NULL; }
    memset(l, 0, sizeof *l);
    l->ctx = ctx;
    l->ds = ds;
    l->dev = dl__device(ctx, desc ? desc->device : dl__devdef(), "dl_loader_new");
    if (!l->dev) { DL_FREE(l); return NULL; }
    if (desc) l->d = *desc;
    l->d.batch_size = bs;
    if (!l->d.seed) l->d.seed = 1;
    l->n = ds->length;
    l->nb = l->n / bs + (!l->d.drop_last && l->n % bs != 0);
    l->sn = dl__prod(ds->sample_shape.d, ds->sample_shape.ndim);
    l->batch = -1;
    /* no batch holds more than the dataset (DataLoader(ds, batch_size=10**12)
       yields one batch of len(ds)): the buffers hold bcap samples */
    bcap = bs < l->n ? bs : l->n > 0 ? l->n : 1;
    if ((uint64_t)bcap > (uint64_t)(INT64_MAX / 8) / (uint64_t)(l->sn > 0 ? l->sn : 1)) goto oom;
    l->perm = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)(l->n + 1));
    if (!l->perm) goto oom;
    if (l->d.device_data) {                     /* the dataset goes to the device; no host batches */
        dl_result rc = dl__loader_to_device(l);
        if (rc != DL_OK) { dl__loader_free(l); return NULL; }
    } else {
        l->xbuf[0] = (float *)dl__malloc(ctx, sizeof(float) * (size_t)(bcap * l->sn + 1));
        l->xbuf[1] = (float *)dl__malloc(ctx, sizeof(float) * (size_t)(bcap * l->sn + 1));
        l->ybuf[0] = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)bcap);
        l->ybuf[1] = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)bcap);
        if (!l->xbuf[0] || !l->xbuf[1] || !l->ybuf[0] || !l->ybuf[1]) goto oom;
    }
#ifndef DL_NO_THREADS
    l->nw = l->on_dev ? 0 : l->d.num_workers;
    if (l->nw > 0) {
        int i;
        pthread_mutex_init(&l->mu, NULL);
        pthread_cond_init(&l->cv_work, NULL);
        pthread_cond_init(&l->cv_done, NULL);
        l->th = (pthread_t *)dl__malloc(ctx, sizeof(pthread_t) * (size_t)l->nw);
        if (!l->th) goto oom;
        for (i = 0; i < l->nw; i++) {
            dl__lw *a = (dl__lw *)dl__malloc(ctx, sizeof *a);
            if (!a) goto oom;
            a->l = l;
            a->w = i;
            if (pthread_create(&l->th[i], NULL, dl__loader_worker, a) != 0) { DL_FREE(a); break; }
            l->started++;
        }
        l->nw = l->started;   /* fewer threads if the system refused some */
    }
#endif
    if (!dl__own(ctx, dl__loader_free, l)) { dl__loader_free(l); return NULL; }
    return l;
oom:
    dl__loader_free(l);
    dl__err(ctx, DL_ERR_OOM, "dl_loader_new: out of memory for batches of %lld samples", (long long)bs);
    return NULL;
}

static void dl__loader_order(dl_loader *l)
{
    int64_t i;
    for (i = 0; i < l->n; i++) l->perm[i] = i;
    if (l->d.shuffle) {
        uint64_t s[4];
        dl__seed_state(l->d.seed * 0x2545f4914f6cdd1dull + (uint64_t)l->epoch, s);
        for (i = l->n - 1; i > 0; i--) {
            int64_t j = (int64_t)(dl__rng_next(s) % (uint64_t)(i + 1)), t = l->perm[i];
            l->perm[i] = l->perm[j];
            l->perm[j] = t;
        }
    }
}

/* device_data: the epoch's plan (the order, each position's crop and flip,
   drawn as the host loader draws them), uploaded in one copy */
static dl_result dl__loader_plan(dl_loader *l)
{
    const dl__tds *d = (const dl__tds *)l->ds->user;
    int64_t pos;
    for (pos = 0; pos < l->n; pos++) {
        uint64_t rng[4];
        bool flip;
        int64_t dy, dx, aug = 0;
        dl__loader_rng(l, l->epoch, pos, rng);
        if (dl__tds_aug(d, rng, &flip, &dy, &dx)) aug = (int64_t)flip | (dy << 1) | (dx << 32);
        l->hplan[2 * pos] = l->perm[pos];
        l->hplan[2 * pos + 1] = aug;
    }
    l->dev->be->upload(l->dev, l->dplan, l->hplan, sizeof(int64_t) * (size_t)(2 * l->n));
    return dl__dev_check(l->dev, "dl_loader_next");
}

int dl_loader_next(dl_loader *l, dl_tensor **x, dl_tensor **y)
{
    int64_t shape[DL_MAX_DIMS + 1], cnt;
    int slot;
    if (x) *x = NULL;
    if (y) *y = NULL;
    if (!l) return -1;
    if (!x || !y) {
        dl__err(l->ctx, DL_ERR_ARG, "dl_loader_next: x and y must not be NULL");
        return -1;
    }
    if (dl__cap_refused(l->ctx, "dl_loader_next", "loading a batch", "a replay would train on this "
                        "batch each time: load it outside and dl_copy_ it into the capture's static inputs"))
        return -1;
    if (l->batch < 0) {   /* a new epoch */
        l->epoch++;
        dl__loader_order(l);
        l->batch = 0;
        if (l->on_dev && l->nb > 0 && dl__loader_plan(l) != DL_OK) { l->batch = -1; return -1; }
        if (!l->on_dev && l->nb > 0) dl__loader_launch(l, 0, 0);
    }
    if (l->batch >= l->nb) { l->batch = -1; return 0; }
    if (l->on_dev) {      /* gather, crop, flip and normalize on the device */
        cnt = dl__batch_count(l, l->batch);
        shape[0] = cnt;
        memcpy(shape + 1, l->ds->sample_shape.d, sizeof(int64_t) * (size_t)l->ds->sample_shape.ndim);
        *x = dl__make(l->dev, "dl_loader_next", DL_DTYPE_F32, l->ds->sample_shape.ndim + 1, shape, false, NULL);
        *y = dl__make(l->dev, "dl_loader_next", DL_DTYPE_I64, 1, &cnt, false, NULL);
        if (!*x || !*y) { *x = *y = NULL; return -1; }
        if (cnt) l->dev->be->load_batch(l->dev, (float *)(*x)->data, (int64_t *)(*y)->data, l->ddata, l->dlabels,
                                        l->dplan + 2 * l->batch * l->d.batch_size, cnt, &l->geom);
        if (dl__dev_check(l->dev, "dl_loader_next") != DL_OK) { *x = *y = NULL; return -1; }
        l->batch++;
        return 1;
    }
    dl__loader_wait(l);
    slot = (int)(l->batch & 1);
    if (l->job_rc != DL_OK) {
        dl__err(l->ctx, l->job_rc, "dl_loader_next: the dataset's get failed for sample %lld (%s)",
                    (long long)l->job_bad_index, dl_result_string(l->job_rc));
        l->batch = -1;
        return -1;
    }
    cnt = dl__batch_count(l, l->batch);
    if (l->batch + 1 < l->nb) dl__loader_launch(l, l->batch + 1, 1 - slot);
    shape[0] = cnt;
    memcpy(shape + 1, l->ds->sample_shape.d, sizeof(int64_t) * (size_t)l->ds->sample_shape.ndim);
    *x = dl__make(l->dev, "dl_loader_next", DL_DTYPE_F32, l->ds->sample_shape.ndim + 1, shape, false, NULL);
    *y = dl__make(l->dev, "dl_loader_next", DL_DTYPE_I64, 1, &cnt, false, NULL);
    if (!*x || !*y) { *x = *y = NULL; return -1; }
    DL__BE(*x)->upload(l->dev, (*x)->data, l->xbuf[slot], sizeof(float) * (size_t)(cnt * l->sn));
    DL__BE(*y)->upload(l->dev, (*y)->data, l->ybuf[slot], sizeof(int64_t) * (size_t)cnt);
    l->batch++;
    return 1;
}

int64_t dl_loader_num_batches(const dl_loader *l) { return l ? l->nb : 0; }
int64_t dl_loader_epoch(const dl_loader *l) { return l ? l->epoch : 0; }

void dl_loader_set_epoch(dl_loader *l, int64_t epochs)
{
    if (!l) return;
    if (epochs < 0 || epochs == INT64_MAX) {   /* the next batch starts epoch epochs + 1 */
        dl__err(l->ctx, DL_ERR_ARG, "dl_loader_set_epoch: epochs %lld must be in 0..2^63-2; the loader "
                "is unchanged", (long long)epochs);
        return;
    }
    dl__loader_wait(l);
    l->epoch = epochs;
    l->batch = -1;
}

// >>section io: safetensors
/* A checkpoint is a safetensors file (the format is described with dl_save's
   declaration). The loader reads the
   whole file, parses the JSON header with the small strict parser below
   (depth-limited; every length and offset checked against the buffer), checks
   every tensor the module and optimizer expect, and only then copies data in:
   a failed load changes nothing. */

#define DL__ST_MAX_HEADER 100000000u   /* safetensors' own limit */
#define DL__JSON_DEPTH 32

enum { DL__J_NULL, DL__J_BOOL, DL__J_NUM, DL__J_STR, DL__J_ARR, DL__J_OBJ };

typedef struct dl__jv {
    int type;
    int first, next;                  /* children (arrays, objects); sibling; -1 none */
    const char *key;                  /* object members: decoded key */
    size_t klen;
    const char *s;                    /* strings: decoded, NUL-terminated */
    size_t slen;
    bool is_int;                      /* numbers: an integer that fits int64 */
    int64_t ival;
} dl__jv;

typedef struct dl__json {
    const unsigned char *p, *start, *end;
    char *sb;                         /* decoded strings */
    size_t sbn, sbcap;
    dl__jv *v;
    int nv, cap;
    const char *err;                  /* what went wrong */
    size_t errpos;
} dl__json;

static int dl__jfail(dl__json *j, const char *what)
{
    if (!j->err) { j->err = what; j->errpos = (size_t)(j->p - j->start); }
    return -1;
}

static void dl__jws(dl__json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int dl__jnew(dl__json *j, int type)
{
    dl__jv *v;
    if (j->nv == j->cap) {
        int nc = j->cap ? j->cap * 2 : 64;
        dl__jv *nvp;
        if (nc > 1 << 26) return dl__jfail(j, "too many JSON values");
        nvp = (dl__jv *)DL_REALLOC(j->v, sizeof(dl__jv) * (size_t)nc);
        if (!nvp) return dl__jfail(j, "out of memory");
        j->v = nvp;
        j->cap = nc;
    }
    v = &j->v[j->nv];
    memset(v, 0, sizeof *v);
    v->type = type;
    v->first = v->next = -1;
    return j->nv++;
}

static int dl__jhex(const unsigned char *p)
{
    int i, r = 0;
    for (i = 0; i < 4; i++) {
        int c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        r = r * 16 + d;
    }
    return r;
}

/* A string at j->p (the opening quote); decoded into j->sb. */
static bool dl__jstr(dl__json *j, const char **out, size_t *len)
{
    char *d = j->sb + j->sbn, *d0 = d;
    j->p++;
    for (;;) {
        unsigned c;
        if (j->p >= j->end) { dl__jfail(j, "unterminated string"); return false; }
        c = *j->p;
        if (c == '"') { j->p++; break; }
        if (c < 0x20) { dl__jfail(j, "control character in a string"); return false; }
        if (c != '\\') { *d++ = (char)c; j->p++; continue; }
        if (j->end - j->p < 2) { dl__jfail(j, "unterminated escape"); return false; }
        c = j->p[1];
        j->p += 2;
        switch (c) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '/': *d++ = '/'; break;
        case 'b': *d++ = '\b'; break;
        case 'f': *d++ = '\f'; break;
        case 'n': *d++ = '\n'; break;
        case 'r': *d++ = '\r'; break;
        case 't': *d++ = '\t'; break;
        case 'u': {
            long cp;
            int h;
            if (j->end - j->p < 4 || (h = dl__jhex(j->p)) < 0) { dl__jfail(j, "bad \\u escape"); return false; }
            j->p += 4;
            cp = h;
            if (cp >= 0xDC00 && cp <= 0xDFFF) { dl__jfail(j, "lone low surrogate in \\u escape"); return false; }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                int lo;
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' ||
                    (lo = dl__jhex(j->p + 2)) < 0xDC00 || lo > 0xDFFF) {
                    dl__jfail(j, "unpaired high surrogate in \\u escape");
                    return false;
                }
                j->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) { dl__jfail(j, "\\u0000 in a string"); return false; }
            if (cp < 0x80) *d++ = (char)cp;
            else if (cp < 0x800) { *d++ = (char)(0xC0 | (cp >> 6)); *d++ = (char)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                *d++ = (char)(0xE0 | (cp >> 12)); *d++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *d++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *d++ = (char)(0xF0 | (cp >> 18)); *d++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *d++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *d++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: dl__jfail(j, "bad escape in a string"); return false;
        }
    }
    /* decoded text is never longer than its encoding (quotes make room for the NUL) */
    *d++ = 0;
    *out = d0;
    *len = (size_t)(d - d0) - 1;
    j->sbn += (size_t)(d - d0);
    return true;
}

static int dl__jvalue(dl__json *j, int depth);

static int dl__jnumber(dl__json *j)
{
    const unsigned char *q = j->p;
    bool neg = false, isint = true, ovf = false;
    uint64_t u = 0;
    int k;
    if (q < j->end && *q == '-') { neg = true; q++; }
    if (q >= j->end || *q < '0' || *q > '9') return dl__jfail(j, "bad number");
    if (*q == '0') q++;
    else
        while (q < j->end && *q >= '0' && *q <= '9') {
            unsigned dgt = (unsigned)(*q - '0');
            if (u > (UINT64_MAX - dgt) / 10) ovf = true;
            else u = u * 10 + dgt;
            q++;
        }
    if (q < j->end && *q == '.') {
        isint = false;
        q++;
        if (q >= j->end || *q < '0' || *q > '9') return dl__jfail(j, "bad number (digits after '.')");
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        isint = false;
        q++;
        if (q < j->end && (*q == '+' || *q == '-')) q++;
        if (q >= j->end || *q < '0' || *q > '9') return dl__jfail(j, "bad number (exponent)");
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    k = dl__jnew(j, DL__J_NUM);
    if (k < 0) return -1;
    j->p = q;
    if (isint && !ovf && u <= (uint64_t)INT64_MAX) {
        j->v[k].is_int = true;
        j->v[k].ival = neg ? -(int64_t)u : (int64_t)u;
    }
    return k;
}

static int dl__jlit(dl__json *j, const char *lit, int type)
{
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0) return dl__jfail(j, "unexpected character");
    j->p += n;
    return dl__jnew(j, type);
}

static int dl__jcontainer(dl__json *j, int depth, bool obj)
{
    int k = dl__jnew(j, obj ? DL__J_OBJ : DL__J_ARR), last = -1;
    if (k < 0) return -1;
    j->p++;
    dl__jws(j);
    if (j->p < j->end && *j->p == (obj ? '}' : ']')) { j->p++; return k; }
    for (;;) {
        const char *key = NULL;
        size_t klen = 0;
        int c;
        dl__jws(j);
        if (obj) {
            if (j->p >= j->end || *j->p != '"') return dl__jfail(j, "expected a string key");
            if (!dl__jstr(j, &key, &klen)) return -1;
            dl__jws(j);
            if (j->p >= j->end || *j->p != ':') return dl__jfail(j, "expected ':'");
            j->p++;
        }
        c = dl__jvalue(j, depth + 1);
        if (c < 0) return -1;
        j->v[c].key = key;
        j->v[c].klen = klen;
        if (last < 0) j->v[k].first = c;
        else j->v[last].next = c;
        last = c;
        dl__jws(j);
        if (j->p >= j->end) return dl__jfail(j, obj ? "unterminated object" : "unterminated array");
        if (*j->p == ',') { j->p++; continue; }
        if (*j->p == (obj ? '}' : ']')) { j->p++; return k; }
        return dl__jfail(j, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int dl__jvalue(dl__json *j, int depth)
{
    dl__jws(j);
    if (depth > DL__JSON_DEPTH) return dl__jfail(j, "JSON nested too deeply");
    if (j->p >= j->end) return dl__jfail(j, "unexpected end of header");
    switch (*j->p) {
    case '{': return dl__jcontainer(j, depth, true);
    case '[': return dl__jcontainer(j, depth, false);
    case '"': {
        const char *s;
        size_t n;
        int k;
        if (!dl__jstr(j, &s, &n)) return -1;
        k = dl__jnew(j, DL__J_STR);
        if (k < 0) return -1;
        j->v[k].s = s;
        j->v[k].slen = n;
        return k;
    }
    case 't': return dl__jlit(j, "true", DL__J_BOOL);
    case 'f': return dl__jlit(j, "false", DL__J_BOOL);
    case 'n': return dl__jlit(j, "null", DL__J_NULL);
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) return dl__jnumber(j);
        return dl__jfail(j, "unexpected character (expected a value)");
    }
}

/* ---- checkpoint entries */

typedef struct dl__st_entry {
    const char *name;                 /* decoded (points into the parser's buffer) */
    dl_dtype dtype;
    bool dtype_known;
    const char *dtype_str;
    int ndim;
    int64_t shape[DL_MAX_DIMS];
    uint64_t begin, end;
    bool used;
} dl__st_entry;

static bool dl__st_dtype(const char *s, dl_dtype *dt)
{
    if (strcmp(s, "F32") == 0) { *dt = DL_DTYPE_F32; return true; }
    if (strcmp(s, "I64") == 0) { *dt = DL_DTYPE_I64; return true; }
    if (strcmp(s, "I32") == 0) { *dt = DL_DTYPE_I32; return true; }
    return false;
}

static const char *dl__st_dtype_name(dl_dtype dt)
{
    return dt == DL_DTYPE_F32 ? "F32" : dt == DL_DTYPE_I64 ? "I64" : "I32";
}

static bool dl__little_endian(void)
{
    uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* what the loader expects: a module tensor, or an optimizer int64 scalar / state tensor */
typedef struct dl__st_want {
    const char *name;                 /* any length (in the block after the array) */
    dl_tensor *t;                     /* tensor to fill, or NULL for an int64 scalar */
    int64_t *scalar;                  /* where an I64 scalar goes */
    dl__st_entry *found;
} dl__st_want;

/* optimizer parameter i's name: its state_dict name in m, else "param<i>" (in buf) */
static const char *dl__opt_pname(dl_optim *o, int i, int nmod, const dl_named_tensor *sd,
                                 char *buf, size_t n)
{
    int j;
    for (j = 0; j < nmod; j++)
        if (sd[j].t == o->p[i]) return sd[j].name;
    snprintf(buf, n, "param%d", i);
    return buf;
}

/* Whether name is optimizer state as dl_save writes it: "optim.step",
   "optim.<P>.step" or "optim.<P>.<state>" (momentum_buffer, exp_avg,
   exp_avg_sq, max_exp_avg_sq), P a state_dict name in ws[0 .. nw) or
   param<i>. dl_load_module skips exactly these (and only in a file whose
   __metadata__ says it holds optimizer state), so a model with a child
   named "optim" still loads strictly. */
static bool dl__st_optim_key(const char *name, const dl__st_want *ws, int nw)
{
    static const char *const states[] = {"step", "momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    const char *p = name + 6, *dot;
    size_t pl;
    int i;
    if (strncmp(name, "optim.", 6) != 0) return false;
    if (strcmp(p, "step") == 0) return true;
    if (!(dot = strrchr(p, '.')) || dot == p) return false;
    for (i = 0; i < 5 && strcmp(dot + 1, states[i]) != 0; i++) {}
    if (i == 5) return false;
    pl = (size_t)(dot - p);
    for (i = 0; i < nw; i++)
        if (strlen(ws[i].name) == pl && strncmp(ws[i].name, p, pl) == 0) return true;
    if (pl <= 5 || strncmp(p, "param", 5) != 0) return false;
    for (i = 5; i < (int)pl; i++) if (p[i] < '0' || p[i] > '9') return false;
    return true;
}

/* "<a><b><c><d>" into the names block at *at (sized for it); the name */
static const char *dl__st_name(char **at, const char *a, const char *b, const char *c, const char *d)
{
    char *s = *at;
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c), ld = strlen(d);
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc);
    memcpy(s + la + lb + lc, d, ld + 1);
    *at = s + la + lb + lc + ld + 1;
    return s;
}

/* The list of names (and targets) that a checkpoint of m (+o) holds; NULL
   with an error (op, label name the call in it). */
static dl__st_want *dl__st_wants(const char *op, const char *label, dl_module *m, dl_optim *o, int *count,
                                 int64_t *steps_slot)
{
    dl_ctx *ctx = m->ctx;
    /* the state_dict in a cache of its own: the caller's dl_module_state_dict
       array stays as it was */
    dl__ncache c;
    const dl_named_tensor *sd = NULL;
    int nmod, n, i, k, ns = 0, w = 0;
    const char *const *sn = NULL;
    dl__st_want *ws;
    char pbuf[32], *at;
    const char *pn;
    size_t bytes = 0;
    memset(&c, 0, sizeof c);
    nmod = dl__named(m, false, &c, &sd);
    if (o) ns = dl__opt_nstate(o, &sn);
    n = nmod + (o ? 1 + o->n * (1 + ns) : 0);
    /* one block: the array, then every name (no length limit: a module path
       is as long as the tree is deep) */
    for (i = 0; i < nmod; i++) bytes += strlen(sd[i].name) + 1;
    if (o) {
        bytes += sizeof "optim.step";
        for (i = 0; i < o->n; i++) {
            size_t pl = strlen(dl__opt_pname(o, i, nmod, sd, pbuf, sizeof pbuf));
            bytes += pl + sizeof "optim..step";
            for (k = 0; k < ns; k++) bytes += pl + strlen(sn[k]) + sizeof "optim..";
        }
    }
    ws = nmod < 0 ? NULL : (dl__st_want *)dl__malloc(ctx, sizeof(dl__st_want) * (size_t)(n + 1) + bytes);
    if (!ws) {
        char why[sizeof ctx->msg];
        snprintf(why, sizeof why, "%s", nmod >= 0 ? "out of memory" : ctx->msg);
        dl__err(ctx, nmod >= 0 ? DL_ERR_OOM : ctx->err, "%s: %s: %s", op, label, why);
        DL_FREE(c.v); DL_FREE(c.names);
        return NULL;
    }
    memset(ws, 0, sizeof(dl__st_want) * (size_t)(n + 1));
    at = (char *)(ws + n + 1);
    for (i = 0; i < nmod; i++) {
        ws[w].name = dl__st_name(&at, sd[i].name, "", "", "");
        ws[w++].t = sd[i].t;
    }
    if (o) {
        ws[w].name = dl__st_name(&at, "optim.step", "", "", "");
        ws[w++].scalar = steps_slot;
        for (i = 0; i < o->n; i++) {
            pn = dl__opt_pname(o, i, nmod, sd, pbuf, sizeof pbuf);
            ws[w].name = dl__st_name(&at, "optim.", pn, ".step", "");
            ws[w++].scalar = &o->pstep[i];
            for (k = 0; k < ns; k++) {
                ws[w].name = dl__st_name(&at, "optim.", pn, ".", sn[k]);
                ws[w++].t = o->s[k][i];
            }
        }
    }
    DL_FREE(c.v);
    DL_FREE(c.names);
    *count = w;
    return ws;
}

/* ---- writing */

static void dl__sb_json(dl__sb *b, const char *s)   /* a JSON string literal */
{
    char e[8];
    dl__sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { e[0] = '\\'; e[1] = (char)c; dl__sb_put(b, e, 2); }
        else if (c < 0x20) { snprintf(e, sizeof e, "\\u%04x", c); dl__sb_put(b, e, 6); }
        else dl__sb_put(b, s, 1);
    }
    dl__sb_put(b, "\"", 1);
}

static void dl__sb_meta(dl__sb *b, const char *key, const char *val)
{
    dl__sb_str(b, ",");
    dl__sb_json(b, key);
    dl__sb_str(b, ":");
    dl__sb_json(b, val);
}

static void dl__sb_metaf(dl__sb *b, const char *key, double v)
{
    char t[40];
    snprintf(t, sizeof t, "%.9g", v);
    dl__sb_meta(b, key, t);
}

static void dl__put_le64(unsigned char *d, uint64_t v)
{
    int i;
    for (i = 0; i < 8; i++) d[i] = (unsigned char)(v >> (8 * i));
}

static void dl__write_le(dl__wfile *w, const void *data, size_t esize, int64_t numel)
{
    if (numel == 0) return;
    if (dl__little_endian()) { dl__wput(w, data, esize * (size_t)numel); return; }
    {
        const unsigned char *s = (const unsigned char *)data;
        unsigned char tmp[8];
        int64_t i;
        size_t k;
        for (i = 0; i < numel && w->ok; i++) {
            for (k = 0; k < esize; k++) tmp[k] = s[(size_t)i * esize + esize - 1 - k];
            dl__wput(w, tmp, esize);
        }
    }
}

static int dl__strp_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name given twice in names[0..n) (sorted in place, so that a
   huge header is not checked pair by pair), or NULL */
static const char *dl__dup_name(const char **names, size_t n)
{
    size_t i;
    if (n > 1) qsort((void *)names, n, sizeof *names, dl__strp_cmp);
    for (i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) return names[i];
    return NULL;
}

/* The checkpoint of m (+ o, + user metadata) written through dl__wopen. */
static dl_result dl__save(const char *op, const char *path, dl_module *m, dl_optim *o, int nmeta,
                          const dl_kv *meta)
{
    dl_ctx *ctx;
    dl__st_want *ws;
    int n, i, k;
    int64_t steps;
    uint64_t off = 0;
    dl__sb b;
    dl__wfile w;
    unsigned char len8[8];
    char num[64];
    if (!dl__mod_ok(m)) return DL_ERR_ARG;
    ctx = m->ctx;
    if (!path) { dl__err(ctx, DL_ERR_ARG, "%s: path is NULL", op); return DL_ERR_ARG; }
    if (o && !dl__optim_ok(o)) { dl__err(ctx, DL_ERR_ARG, "%s: %s: o is not an optimizer", op, path); return DL_ERR_ARG; }
    if (nmeta < 0 || (nmeta > 0 && !meta)) {
        dl__err(ctx, DL_ERR_ARG, "%s: %s: %d metadata entries but meta is %s", op, path, nmeta,
                meta ? "given" : "NULL");
        return DL_ERR_ARG;
    }
    for (i = 0; i < nmeta; i++) {
        if (!meta[i].key || !meta[i].value || !meta[i].key[0] || strcmp(meta[i].key, "format") == 0 ||
            strncmp(meta[i].key, "dl.", 3) == 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s: metadata entry %d: key \"%s\" (and its value) must be "
                    "non-empty strings, not \"format\" and not starting with \"dl.\"", op, path, i,
                    meta[i].key ? meta[i].key : "(null)");
            return DL_ERR_ARG;
        }
        if (dl__utf8_bad(meta[i].key) >= 0 || dl__utf8_bad(meta[i].value) >= 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s: metadata entry %d: the %s is not valid UTF-8 (safetensors "
                    "refuses such a header); nothing was written", op, path, i,
                    dl__utf8_bad(meta[i].key) >= 0 ? "key" : "value");
            return DL_ERR_ARG;
        }
    }
    steps = o ? o->steps : 0;
    ws = dl__st_wants(op, path, m, o, &n, &steps);
    if (!ws) return ctx->err;
    for (i = 0; i < n; i++)            /* the header is JSON: UTF-8 (safetensors' reader refuses the rest) */
        if (dl__utf8_bad(ws[i].name) >= 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s: the name '%s' is not valid UTF-8 (byte 0x%02x at offset %lld); "
                    "nothing was written", op, path, ws[i].name,
                    (unsigned)(unsigned char)ws[i].name[dl__utf8_bad(ws[i].name)], (long long)dl__utf8_bad(ws[i].name));
            DL_FREE(ws);
            return DL_ERR_ARG;
        }
    {   /* every key once: a name given twice could never be loaded (a child
           "optim" with a buffer "step" against the optimizer's "optim.step") */
        const char **names = (const char **)DL_MALLOC(sizeof(char *) * (size_t)(n + nmeta + 1));
        const char *dup;
        int nn = 0, inmeta = 0;
        if (!names) {
            DL_FREE(ws);
            dl__err(ctx, DL_ERR_OOM, "%s: %s: out of memory", op, path);
            return DL_ERR_OOM;
        }
        for (i = 0; i < n; i++) names[nn++] = ws[i].name;
        names[nn++] = "__metadata__";
        dup = dl__dup_name(names, (size_t)nn);
        if (!dup) {
            for (i = 0, nn = 0; i < nmeta; i++) names[nn++] = meta[i].key;
            dup = dl__dup_name(names, (size_t)nn);
            inmeta = 1;
        }
        if (dup) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s: the %s '%.100s' is given twice; each must be unique, so that "
                    "the file loads; nothing was written", op, path,
                    inmeta ? "metadata key" : "tensor name (module or optimizer state)", dup);
            DL_FREE(names);
            DL_FREE(ws);
            return DL_ERR_ARG;
        }
        DL_FREE(names);
    }
    /* header */
    memset(&b, 0, sizeof b);
    dl__sb_str(&b, "{");
    for (i = 0; i < n; i++) {
        dl_tensor *t = ws[i].t;
        uint64_t bytes = t ? (uint64_t)t->numel * dl__esize(t->dtype) : 8;
        if (i) dl__sb_str(&b, ",");
        dl__sb_json(&b, ws[i].name);
        dl__sb_str(&b, ":{\"dtype\":\"");
        dl__sb_str(&b, t ? dl__st_dtype_name(t->dtype) : "I64");
        dl__sb_str(&b, "\",\"shape\":[");
        for (k = 0; t && k < t->ndim; k++) {
            snprintf(num, sizeof num, k ? ",%lld" : "%lld", (long long)t->shape[k]);
            dl__sb_str(&b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + bytes));
        dl__sb_str(&b, num);
        off += bytes;
    }
    dl__sb_str(&b, n ? ",\"__metadata__\":{\"format\":\"pt\"" : "\"__metadata__\":{\"format\":\"pt\"");
    dl__sb_meta(&b, "dl.version", "0.1");
    if (o) {
        dl__sb_meta(&b, "dl.optim", dl__opt_names[o->kind]);
        dl__sb_metaf(&b, "dl.lr", o->glr[0]);
        if (o->ng > 1) {
            char key[32];
            dl__sb_metaf(&b, "dl.groups", o->ng);
            for (k = 1; k < o->ng; k++) {
                snprintf(key, sizeof key, "dl.lr.%d", k);
                dl__sb_metaf(&b, key, o->glr[k]);
            }
        }
        if (o->kind == DL__OPT_SGD) {
            dl__sb_metaf(&b, "dl.momentum", o->sgd.momentum);
            dl__sb_metaf(&b, "dl.dampening", o->sgd.dampening);
            dl__sb_metaf(&b, "dl.weight_decay", o->sgd.weight_decay);
            dl__sb_meta(&b, "dl.nesterov", o->sgd.nesterov ? "true" : "false");
        } else {
            dl__sb_metaf(&b, "dl.beta1", o->adam.beta1);
            dl__sb_metaf(&b, "dl.beta2", o->adam.beta2);
            dl__sb_metaf(&b, "dl.eps", o->adam.eps);
            dl__sb_metaf(&b, "dl.weight_decay", o->adam.weight_decay);
            dl__sb_meta(&b, "dl.amsgrad", o->adam.amsgrad ? "true" : "false");
        }
    }
    for (i = 0; i < nmeta; i++) dl__sb_meta(&b, meta[i].key, meta[i].value);
    dl__sb_str(&b, "}}");
    while (!b.oom && b.n % 8) dl__sb_str(&b, " ");   /* pad: data starts 8-aligned */
    if (b.oom) {
        DL_FREE(b.s); DL_FREE(ws);
        dl__err(ctx, DL_ERR_OOM, "%s: %s: out of memory", op, path);
        return DL_ERR_OOM;
    }
    if (!dl__wopen(ctx, op, path, &w)) { DL_FREE(b.s); DL_FREE(ws); return ctx->err; }
    dl__put_le64(len8, (uint64_t)b.n);
    dl__wput(&w, len8, 8);
    dl__wput(&w, b.s, b.n);
    for (i = 0; i < n && w.ok; i++) {
        dl_tensor *t = ws[i].t;
        if (!t) { dl__write_le(&w, ws[i].scalar, 8, 1); continue; }
        if (dl__host_ok(t)) { dl__write_le(&w, t->data, dl__esize(t->dtype), t->numel); continue; }
        {   /* a device tensor: through a host buffer */
            size_t bytes = (size_t)t->numel * dl__esize(t->dtype);
            void *h = DL_MALLOC(bytes + 1);
            if (!h) { w.ok = false; w.err = -1; break; }
            DL__BE(t)->download(t->dev_, h, t->data, bytes);
            dl__write_le(&w, h, dl__esize(t->dtype), t->numel);
            DL_FREE(h);
        }
    }
    DL_FREE(b.s);
    DL_FREE(ws);
    return dl__wclose(ctx, op, &w);
}

dl_result dl_save(const char *path, dl_module *m, dl_optim *o) { return dl__save("dl_save", path, m, o, 0, NULL); }
dl_result dl_save_meta(const char *path, dl_module *m, dl_optim *o, int nmeta, const dl_kv *meta)
{
    return dl__save("dl_save_meta", path, m, o, nmeta, meta);
}
dl_result dl_save_module(const char *path, dl_module *m) { return dl__save("dl_save_module", path, m, NULL, 0, NULL); }

/* ---- reading */

static int dl__st_cmp(const void *a, const void *b)
{
    const dl__st_entry *x = *(const dl__st_entry *const *)a, *y = *(const dl__st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int dl__st_cmp_name(const void *a, const void *b)
{
    return strcmp((*(const dl__st_entry *const *)a)->name, (*(const dl__st_entry *const *)b)->name);
}

static const dl__jv *dl__jmember(const dl__json *j, const dl__jv *obj, const char *key)
{
    int c;
    for (c = obj->first; c >= 0; c = j->v[c].next)
        if (strcmp(j->v[c].key, key) == 0) return &j->v[c];
    return NULL;
}

/* Parses and checks one tensor description. false + message in msg. */
static bool dl__st_describe(const dl__json *j, const dl__jv *d, dl__st_entry *e, uint64_t datalen,
                            char *msg, size_t msgn)
{
    const dl__jv *dt, *sh, *of, *x;
    int c, nk = 0;
    uint64_t numel = 1, bytes;
    if (d->type != DL__J_OBJ) { snprintf(msg, msgn, "its description is not a JSON object"); return false; }
    for (c = d->first; c >= 0; c = j->v[c].next) {
        const char *k = j->v[c].key;
        int c2;
        nk++;
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets")) {
            snprintf(msg, msgn, "unknown field \"%.40s\" (allowed: dtype, shape, data_offsets)", k);
            return false;
        }
        for (c2 = j->v[c].next; c2 >= 0; c2 = j->v[c2].next)
            if (strcmp(j->v[c2].key, k) == 0) { snprintf(msg, msgn, "field \"%s\" appears twice", k); return false; }
    }
    dt = dl__jmember(j, d, "dtype");
    sh = dl__jmember(j, d, "shape");
    of = dl__jmember(j, d, "data_offsets");
    if (!dt || !sh || !of) {
        snprintf(msg, msgn, "missing field \"%s\"", !dt ? "dtype" : !sh ? "shape" : "data_offsets");
        return false;
    }
    if (dt->type != DL__J_STR) { snprintf(msg, msgn, "dtype is not a string"); return false; }
    e->dtype_str = dt->s;
    e->dtype_known = dl__st_dtype(dt->s, &e->dtype);
    if (sh->type != DL__J_ARR) { snprintf(msg, msgn, "shape is not an array"); return false; }
    e->ndim = 0;
    for (c = sh->first; c >= 0; c = j->v[c].next) {
        x = &j->v[c];
        if (x->type != DL__J_NUM || !x->is_int || x->ival < 0) {
            snprintf(msg, msgn, "shape[%d] is not a non-negative integer", e->ndim);
            return false;
        }
        if (e->ndim == DL_MAX_DIMS) { snprintf(msg, msgn, "shape has more than DL_MAX_DIMS=%d dims", DL_MAX_DIMS); return false; }
        if (x->ival && numel > ((uint64_t)1 << 62) / (uint64_t)x->ival) {
            snprintf(msg, msgn, "shape has too many elements (overflow)");
            return false;
        }
        numel *= (uint64_t)x->ival;
        e->shape[e->ndim++] = x->ival;
    }
    if (of->type != DL__J_ARR || of->first < 0 || j->v[of->first].next < 0 ||
        j->v[j->v[of->first].next].next >= 0) {
        snprintf(msg, msgn, "data_offsets is not an array of two integers");
        return false;
    }
    {
        const dl__jv *b0 = &j->v[of->first], *b1 = &j->v[b0->next];
        if (b0->type != DL__J_NUM || b1->type != DL__J_NUM || !b0->is_int || !b1->is_int) {
            snprintf(msg, msgn, "data_offsets are not integers (or are out of range)");
            return false;
        }
        if (b0->ival < 0 || b1->ival < 0) {
            snprintf(msg, msgn, "data_offsets [%lld, %lld] are negative", (long long)b0->ival,
                     (long long)b1->ival);
            return false;
        }
        e->begin = (uint64_t)b0->ival;
        e->end = (uint64_t)b1->ival;
    }
    if (e->begin > e->end || e->end > datalen) {
        snprintf(msg, msgn, "data_offsets [%llu, %llu] are out of range: the data section has "
                 "%llu bytes (truncated file?)", (unsigned long long)e->begin,
                 (unsigned long long)e->end, (unsigned long long)datalen);
        return false;
    }
    if (e->dtype_known) {
        if (numel > datalen / dl__esize(e->dtype)) {   /* before numel * size, which could wrap */
            snprintf(msg, msgn, "%s with %llu elements needs more bytes than the data section's %llu",
                     e->dtype_str, (unsigned long long)numel, (unsigned long long)datalen);
            return false;
        }
        bytes = numel * dl__esize(e->dtype);
        if (e->end - e->begin != bytes) {
            snprintf(msg, msgn, "data_offsets [%llu, %llu] hold %llu bytes but %s with %llu "
                     "elements needs %llu", (unsigned long long)e->begin, (unsigned long long)e->end,
                     (unsigned long long)(e->end - e->begin), e->dtype_str,
                     (unsigned long long)numel, (unsigned long long)bytes);
            return false;
        }
    }
    return true;
}

static void dl__st_shape_str(int ndim, const int64_t *s, char *b, size_t n)
{
    int i;
    size_t k = 0;
    k += (size_t)snprintf(b, n, "(");
    for (i = 0; i < ndim && k < n - 24; i++)
        k += (size_t)snprintf(b + k, n - k, i ? ",%lld" : "%lld", (long long)s[i]);
    snprintf(b + k, n - k, ")");
}

static void dl__read_le(void *dst, const unsigned char *src, size_t esize, int64_t numel)
{
    if (numel == 0) return;
    if (dl__little_endian()) memcpy(dst, src, esize * (size_t)numel);
    else {
        unsigned char *d = (unsigned char *)dst;
        int64_t i;
        size_t k;
        for (i = 0; i < numel; i++)
            for (k = 0; k < esize; k++) d[(size_t)i * esize + k] = src[(size_t)i * esize + esize - 1 - k];
    }
}

/* Checks the 8-byte length and parses the JSON header of a safetensors
   image: *root is the header object, *data / *datalen the data section.
   The caller frees j->sb and j->v (also on failure). */
static dl_result dl__st_header(dl_ctx *ctx, const char *op, const unsigned char *buf, size_t len,
                               const char *label, dl__json *j, int *root, const unsigned char **data,
                               uint64_t *datalen)
{
    uint64_t hlen = 0;
    int i;
    memset(j, 0, sizeof *j);
    if (len < 8) {
        dl__err(ctx, DL_ERR_FORMAT, "%s: %s: the file has %zu bytes; a safetensors file starts "
                "with an 8-byte header length (truncated or empty file)", op, label, len);
        return DL_ERR_FORMAT;
    }
    for (i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > (uint64_t)(len - 8)) {
        dl__err(ctx, DL_ERR_FORMAT, "%s: %s: the header length %llu is larger than the rest "
                "of the file (%zu bytes): truncated or not a safetensors file", op, label,
                (unsigned long long)hlen, len - 8);
        return DL_ERR_FORMAT;
    }
    if (hlen > DL__ST_MAX_HEADER || hlen < 2) {
        dl__err(ctx, DL_ERR_FORMAT, "%s: %s: header length %llu is out of range (2..%u)", op, label,
                (unsigned long long)hlen, DL__ST_MAX_HEADER);
        return DL_ERR_FORMAT;
    }
    *datalen = (uint64_t)(len - 8) - hlen;
    *data = buf + 8 + hlen;
    j->start = j->p = buf + 8;
    j->end = buf + 8 + hlen;
    j->sbcap = (size_t)hlen + 1;
    j->sb = (char *)DL_MALLOC(j->sbcap);
    if (!j->sb) { dl__err(ctx, DL_ERR_OOM, "%s: %s: out of memory", op, label); return DL_ERR_OOM; }
    dl__jws(j);
    if (j->p >= j->end || *j->p != '{') *root = dl__jfail(j, "the header is not a JSON object");
    else *root = dl__jvalue(j, 0);
    if (*root >= 0) {
        dl__jws(j);
        if (j->p != j->end) *root = dl__jfail(j, "trailing characters after the JSON object");
    }
    if (*root < 0) {
        if (j->err && strcmp(j->err, "out of memory") == 0) {
            dl__err(ctx, DL_ERR_OOM, "%s: %s: out of memory parsing the header", op, label);
            return DL_ERR_OOM;
        }
        dl__err(ctx, DL_ERR_FORMAT, "%s: %s: malformed JSON header at byte %zu of %llu: %s", op,
                label, j->errpos, (unsigned long long)hlen, j->err ? j->err : "?");
        return DL_ERR_FORMAT;
    }
    {   /* one __metadata__, each of its keys once: where safetensors' reader
           keeps the last of two, no reader here picks one silently */
        const dl__jv *meta = NULL;
        const char **keys, *dup;
        size_t nk = 0;
        int c;
        for (c = j->v[*root].first; c >= 0; c = j->v[c].next) {
            if (strcmp(j->v[c].key, "__metadata__") != 0) continue;
            if (meta) {
                dl__err(ctx, DL_ERR_FORMAT, "%s: %s: '__metadata__' appears twice in the header", op, label);
                return DL_ERR_FORMAT;
            }
            meta = &j->v[c];
        }
        if (!meta || meta->type != DL__J_OBJ) return DL_OK;
        for (c = meta->first; c >= 0; c = j->v[c].next) nk++;
        keys = (const char **)DL_MALLOC(sizeof(char *) * (nk + 1));
        if (!keys) { dl__err(ctx, DL_ERR_OOM, "%s: %s: out of memory", op, label); return DL_ERR_OOM; }
        for (nk = 0, c = meta->first; c >= 0; c = j->v[c].next) keys[nk++] = j->v[c].key;
        dup = dl__dup_name(keys, nk);
        if (dup) dl__err(ctx, DL_ERR_FORMAT, "%s: %s: __metadata__ key '%.100s' appears twice in the header",
                         op, label, dup);
        DL_FREE(keys);
        if (dup) return DL_ERR_FORMAT;
    }
    return DL_OK;
}

/* Load a safetensors image held in memory (label names it in messages). */
static dl_result dl__load_buffer(const char *op, const unsigned char *buf, size_t len,
                                 const char *label, dl_module *m, dl_optim *o)
{
    dl_ctx *ctx;
    dl__json j;
    dl__st_entry *es = NULL, **sorted = NULL;
    dl__st_want *ws = NULL;
    int root, c, ne = 0, nw = 0, i, k;
    uint64_t datalen, pos;
    const unsigned char *data;
    const dl__jv *meta = NULL;
    int64_t steps = 0;
    float *glr = NULL;
    char msg[256], sa[160], sb2[160];
    dl_result rc = DL_ERR_FORMAT;
    if (!dl__mod_ok(m)) return DL_ERR_ARG;
    ctx = m->ctx;
    if (o && (!dl__optim_ok(o) || o->ctx != ctx)) {
        dl__err(ctx, DL_ERR_ARG, "%s: %s: o is not an optimizer of this context", op, label);
        return DL_ERR_ARG;
    }
    rc = dl__st_header(ctx, op, buf, len, label, &j, &root, &data, &datalen);
    if (rc != DL_OK) goto done;
    rc = DL_ERR_FORMAT;
    /* entries */
    for (c = j.v[root].first; c >= 0; c = j.v[c].next) ne++;
    es = (dl__st_entry *)DL_MALLOC(sizeof(dl__st_entry) * (size_t)(ne + 1));
    sorted = (dl__st_entry **)DL_MALLOC(sizeof(dl__st_entry *) * (size_t)(ne + 1));
    if (!es || !sorted) { rc = DL_ERR_OOM; dl__err(ctx, DL_ERR_OOM, "%s: %s: out of memory", op, label); goto done; }
    ne = 0;
    for (c = j.v[root].first; c >= 0; c = j.v[c].next) {
        const dl__jv *v = &j.v[c];
        if (strcmp(v->key, "__metadata__") == 0) {
            int c3;
            if (v->type != DL__J_OBJ) {
                dl__err(ctx, DL_ERR_FORMAT, "%s: %s: __metadata__ is not an object", op, label);
                goto done;
            }
            for (c3 = v->first; c3 >= 0; c3 = j.v[c3].next)
                if (j.v[c3].type != DL__J_STR) {
                    dl__err(ctx, DL_ERR_FORMAT, "%s: %s: __metadata__ value '%.100s' is not a "
                            "string (safetensors metadata maps strings to strings)", op, label, j.v[c3].key);
                    goto done;
                }
            meta = v;   /* (only one: dl__st_header) */
            continue;
        }
        memset(&es[ne], 0, sizeof es[ne]);
        es[ne].name = v->key;
        if (v->klen == 0 || strlen(v->key) != v->klen) {
            dl__err(ctx, DL_ERR_FORMAT, "%s: %s: a tensor has an empty name", op, label);
            goto done;
        }
        if (!dl__st_describe(&j, v, &es[ne], datalen, msg, sizeof msg)) {
            dl__err(ctx, DL_ERR_FORMAT, "%s: %s: tensor '%.100s': %s", op, label, v->key, msg);
            goto done;
        }
        sorted[ne] = &es[ne];
        ne++;
    }
    /* names: unique (sorted, so that a huge header is not checked pair by pair) */
    if (ne) qsort(sorted, (size_t)ne, sizeof *sorted, dl__st_cmp_name);
    for (i = 1; i < ne; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            dl__err(ctx, DL_ERR_FORMAT, "%s: %s: '%.100s' appears twice in the header", op, label,
                    sorted[i]->name);
            goto done;
        }
    /* offsets: sorted, they must tile the data section exactly (as safetensors requires) */
    if (ne) qsort(sorted, (size_t)ne, sizeof *sorted, dl__st_cmp);
    pos = 0;
    for (i = 0; i < ne; i++) {
        if (sorted[i]->begin < pos) {
            dl__err(ctx, DL_ERR_FORMAT, "%s: %s: tensor '%.100s' data_offsets [%llu, %llu] "
                    "overlap tensor '%.100s' (ends at %llu)", op, label, sorted[i]->name,
                    (unsigned long long)sorted[i]->begin, (unsigned long long)sorted[i]->end,
                    sorted[i - 1]->name, (unsigned long long)pos);
            goto done;
        }
        if (sorted[i]->begin > pos) {
            dl__err(ctx, DL_ERR_FORMAT, "%s: %s: tensor '%.100s' data_offsets [%llu, %llu] "
                    "leave a gap after byte %llu (offsets must be contiguous)", op, label,
                    sorted[i]->name, (unsigned long long)sorted[i]->begin,
                    (unsigned long long)sorted[i]->end, (unsigned long long)pos);
            goto done;
        }
        pos = sorted[i]->end;
    }
    if (pos != datalen) {
        dl__err(ctx, DL_ERR_FORMAT, "%s: %s: the tensors cover %llu bytes but the data section "
                "has %llu", op, label, (unsigned long long)pos, (unsigned long long)datalen);
        goto done;
    }
    /* what we expect */
    ws = dl__st_wants(op, label, m, o, &nw, &steps);
    if (!ws) { rc = ctx->err; goto done; }
    for (i = 0; i < nw; i++) {
        dl__st_want *w = &ws[i];
        dl__st_entry *e = NULL;
        for (k = 0; k < ne; k++) if (strcmp(es[k].name, w->name) == 0) { e = &es[k]; break; }
        if (!e) {
            if (w->t) dl__st_shape_str(w->t->ndim, w->t->shape, sa, sizeof sa);
            dl__err(ctx, DL_ERR_FORMAT, "%s: %s: tensor '%s' is missing from the file (%s%s)%s",
                    op, label, w->name, w->t ? "the model has " : "an int64 scalar", w->t ? sa : "",
                    strncmp(w->name, "optim.", 6) == 0 ? "; was it saved without this optimizer "
                    "(dl_save with o = NULL) or with other settings?" : "");
            goto done;
        }
        e->used = true;
        w->found = e;
        if (w->t) {
            if (!e->dtype_known || e->dtype != w->t->dtype) {
                dl__err(ctx, DL_ERR_FORMAT, "%s: %s: tensor '%s' has dtype %.20s in the file "
                        "but %s in the model", op, label, w->name, e->dtype_str,
                        dl__st_dtype_name(w->t->dtype));
                goto done;
            }
            if (e->ndim != w->t->ndim ||
                (e->ndim && memcmp(e->shape, w->t->shape, sizeof(int64_t) * (size_t)e->ndim) != 0)) {
                dl__st_shape_str(e->ndim, e->shape, sa, sizeof sa);
                dl__st_shape_str(w->t->ndim, w->t->shape, sb2, sizeof sb2);
                dl__err(ctx, DL_ERR_FORMAT, "%s: %s: tensor '%s' has shape %s in the file but "
                        "%s in the model", op, label, w->name, sa, sb2);
                goto done;
            }
        } else {
            int64_t v;
            if (!e->dtype_known || e->dtype != DL_DTYPE_I64 || e->ndim != 0) {
                dl__st_shape_str(e->ndim, e->shape, sa, sizeof sa);
                dl__err(ctx, DL_ERR_FORMAT, "%s: %s: tensor '%s' must be an I64 scalar (shape "
                        "()), not %.20s %s", op, label, w->name, e->dtype_str, sa);
                goto done;
            }
            dl__read_le(&v, data + e->begin, 8, 1);
            /* steps and num_batches_tracked: the next increments must not
               overflow, and Adam's bias corrections take the step as a double */
            if (v < 0 || v > ((int64_t)1 << 53)) {
                dl__err(ctx, DL_ERR_FORMAT, "%s: %s: tensor '%s' is a count %lld outside 0..2^53 (a step "
                        "count past 2^53 is not exact in float64, as PyTorch keeps it)",
                        op, label, w->name, (long long)v);
                goto done;
            }
        }
    }
    for (k = 0; k < ne; k++) {
        if (es[k].used) continue;
        if (!o && meta && dl__jmember(&j, meta, "dl.optim") && dl__st_optim_key(es[k].name, ws, nw))
            continue;   /* optimizer state not asked for */
        dl__err(ctx, DL_ERR_FORMAT, "%s: %s: the file has an extra tensor '%.100s' that the "
                "%s does not have", op, label, es[k].name,
                dl__st_optim_key(es[k].name, ws, nw) ? "optimizer" : "module");
        goto done;
    }
    if (o) {
        const dl__jv *kind = meta ? dl__jmember(&j, meta, "dl.optim") : NULL;
        glr = (float *)DL_MALLOC(sizeof(float) * (size_t)o->ng);
        if (!glr) { rc = DL_ERR_OOM; dl__err(ctx, DL_ERR_OOM, "%s: %s: out of memory", op, label); goto done; }
        const dl__jv *lrv = meta ? dl__jmember(&j, meta, "dl.lr") : NULL;
        char *endp = NULL;
        double d;
        if (!kind || strcmp(kind->s, dl__opt_names[o->kind]) != 0) {
            dl__err(ctx, DL_ERR_FORMAT, "%s: %s: the optimizer state is for '%.40s' but o is %s",
                    op, label, kind ? kind->s : "(no dl.optim in __metadata__)", dl__opt_names[o->kind]);
            goto done;
        }
        for (k = 0; k < o->ng; k++) {
            char key[32];
            const dl__jv *v;
            if (k) snprintf(key, sizeof key, "dl.lr.%d", k);
            v = k ? (meta ? dl__jmember(&j, meta, key) : NULL) : lrv;
            d = v ? strtod(v->s, &endp) : -1.0;
            if (!v || endp == v->s || *endp || !(d >= 0.0) || d > 1e30) {
                dl__err(ctx, DL_ERR_FORMAT, "%s: %s: __metadata__ %s is missing or not a non-negative "
                        "number (the optimizer has %d parameter group%s)", op, label,
                        k ? key : "dl.lr", o->ng, o->ng == 1 ? "" : "s");
                goto done;
            }
            glr[k] = (float)d;
        }
        {
            const dl__jv *ngv = meta ? dl__jmember(&j, meta, "dl.groups") : NULL;
            long ng = ngv ? strtol(ngv->s, &endp, 10) : 1;
            if (ngv && (endp == ngv->s || *endp)) {
                dl__err(ctx, DL_ERR_FORMAT, "%s: %s: __metadata__ dl.groups \"%.40s\" is not a whole number",
                        op, label, ngv->s);
                goto done;
            }
            if (ng != o->ng) {
                dl__err(ctx, DL_ERR_FORMAT, "%s: %s: the file's optimizer has %ld parameter groups but "
                        "o has %d", op, label, ng, o->ng);
                goto done;
            }
        }
    }
    /* everything checked: copy in (device tensors through one host buffer,
       allocated first so that nothing can fail halfway) */
    {
        size_t maxb = 0;
        void *h = NULL;
        for (i = 0; i < nw; i++)
            if (ws[i].t && !dl__host_ok(ws[i].t)) {
                size_t bytes = (size_t)ws[i].t->numel * dl__esize(ws[i].t->dtype);
                if (bytes > maxb) maxb = bytes;
            }
        if (maxb && !(h = DL_MALLOC(maxb))) {
            rc = DL_ERR_OOM;
            dl__err(ctx, DL_ERR_OOM, "%s: %s: out of memory", op, label);
            goto done;
        }
        for (i = 0; i < nw; i++) {
            dl__st_want *w = &ws[i];
            if (!w->t) { dl__read_le(w->scalar, data + w->found->begin, 8, 1); continue; }
            dl__bump_version(w->t);
            if (dl__host_ok(w->t)) {
                dl__read_le(w->t->data, data + w->found->begin, dl__esize(w->t->dtype), w->t->numel);
                continue;
            }
            dl__read_le(h, data + w->found->begin, dl__esize(w->t->dtype), w->t->numel);
            DL__BE(w->t)->upload(w->t->dev_, w->t->data, h, (size_t)w->t->numel * dl__esize(w->t->dtype));
        }
        DL_FREE(h);
    }
    if (o) { o->steps = steps; for (k = 0; k < o->ng; k++) o->glr[k] = glr[k]; }
    rc = DL_OK;
done:
    DL_FREE(j.sb);
    DL_FREE(j.v);
    DL_FREE(es);
    DL_FREE(sorted);
    DL_FREE(ws);
    DL_FREE(glr);
    return rc;
}

static dl_result dl__load(const char *op, const char *path, dl_module *m, dl_optim *o)
{
    unsigned char *buf;
    size_t len;
    dl_result rc;
    if (!dl__mod_ok(m)) return DL_ERR_ARG;
    rc = dl__read_file(m->ctx, op, path, &buf, &len);
    if (rc != DL_OK) return rc;
    rc = dl__load_buffer(op, buf, len, path, m, o);
    DL_FREE(buf);
    return rc;
}

dl_result dl_load(const char *path, dl_module *m, dl_optim *o) { return dl__load("dl_load", path, m, o); }
dl_result dl_load_module(const char *path, dl_module *m) { return dl__load("dl_load_module", path, m, NULL); }

dl_result dl_checkpoint_meta(dl_ctx *ctx, const char *path, const char *key, char *value, size_t cap)
{
    static const char *op = "dl_checkpoint_meta";
    unsigned char *buf;
    size_t len;
    dl__json j;
    int root, c;
    const unsigned char *data;
    uint64_t datalen;
    dl_result rc;
    if (!ctx) return DL_ERR_ARG;
    if (!key || !value || cap == 0) {
        dl__err(ctx, DL_ERR_ARG, "%s: key and value must not be NULL and cap > 0", op);
        return DL_ERR_ARG;
    }
    value[0] = 0;
    rc = dl__read_file(ctx, op, path, &buf, &len);
    if (rc != DL_OK) return rc;
    rc = dl__st_header(ctx, op, buf, len, path, &j, &root, &data, &datalen);
    if (rc == DL_OK) {
        const dl__jv *meta = NULL, *v = NULL;
        for (c = j.v[root].first; c >= 0; c = j.v[c].next)
            if (strcmp(j.v[c].key, "__metadata__") == 0 && j.v[c].type == DL__J_OBJ) meta = &j.v[c];
        if (meta) v = dl__jmember(&j, meta, key);
        if (!v || v->type != DL__J_STR) {
            dl__err(ctx, DL_ERR_FORMAT, "%s: %s has no metadata entry \"%s\"", op, path, key);
            rc = DL_ERR_FORMAT;
        } else if (v->slen + 1 > cap) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s: the value of \"%s\" has %zu bytes; value holds %zu",
                    op, path, key, v->slen + 1, cap);
            rc = DL_ERR_ARG;
        } else memcpy(value, v->s, v->slen + 1);
    }
    DL_FREE(j.sb);
    DL_FREE(j.v);
    DL_FREE(buf);
    return rc;
}


// >>section io: tensorboard
/* TensorBoard event files (see the declarations). A record is framed as
   TFRecord: uint64 length (little-endian), masked CRC-32C of those 8 bytes,
   the serialized Event, masked CRC-32C of the Event; the whole record goes to
   the file in one write() on an O_APPEND descriptor, and a failed write is
   undone with ftruncate, so the file only ever ends inside a record when the
   process died in the middle of that write. Protobuf messages are encoded by
   hand into a growable buffer; a nested message is written after its tag and
   its length is inserted in front of it when it ends. The PNG encoder writes
   stored (uncompressed) deflate blocks inside a zlib stream. */
#include <time.h>
#ifdef DL__UNIX
#include <sys/utsname.h>
#endif

#define DL__TB_MAGIC 0x44544231u

/* ---- bytes and the protobuf wire format. Scalar fields at their proto3
   default (0, empty string) are left out, as protobuf's serializers do. */
typedef struct dl__pb { unsigned char *p; size_t n, cap; bool oom; } dl__pb;

static bool dl__pb_grow(dl__pb *b, size_t extra)
{
    size_t cap;
    unsigned char *q;
    if (b->oom) return false;
    if (extra <= b->cap - b->n) return true;
    if (extra > ((size_t)-1) / 4 - b->n) { b->oom = true; return false; }
    cap = b->cap ? b->cap : 256;
    while (cap - b->n < extra) cap *= 2;
    q = (unsigned char *)DL_REALLOC(b->p, cap);
    if (!q) { b->oom = true; return false; }
    b->p = q;
    b->cap = cap;
    return true;
}

static void dl__pb_raw(dl__pb *b, const void *data, size_t n)
{
    if (!n || !dl__pb_grow(b, n)) return;
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static size_t dl__pb_put_varint(unsigned char *p, uint64_t v)
{
    size_t k = 0;
    while (v >= 0x80) { p[k++] = (unsigned char)(v | 0x80); v >>= 7; }
    p[k++] = (unsigned char)v;
    return k;
}

static void dl__pb_varint(dl__pb *b, uint64_t v)
{
    unsigned char t[10];
    dl__pb_raw(b, t, dl__pb_put_varint(t, v));
}

/* wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
static void dl__pb_tag(dl__pb *b, int field, int wire)
{
    dl__pb_varint(b, ((uint64_t)field << 3) | (uint64_t)wire);
}

static void dl__pb_le(dl__pb *b, uint64_t v, int bytes)
{
    unsigned char t[8];
    int i;
    for (i = 0; i < bytes; i++) t[i] = (unsigned char)(v >> (8 * i));
    dl__pb_raw(b, t, (size_t)bytes);
}

/* int32, int64, enum, bool fields (a negative value takes ten bytes) */
static void dl__pb_int(dl__pb *b, int field, int64_t v)
{
    if (!v) return;
    dl__pb_tag(b, field, 0);
    dl__pb_varint(b, (uint64_t)v);
}

static uint64_t dl__pb_dbits(double v) { uint64_t u; memcpy(&u, &v, sizeof u); return u; }

static void dl__pb_double(dl__pb *b, int field, double v)
{
    uint64_t u = dl__pb_dbits(v);
    if (!u) return;
    dl__pb_tag(b, field, 1);
    dl__pb_le(b, u, 8);
}

/* always written: the one float field, Summary.Value.simple_value, is a
   member of a oneof, where a 0 must be present to say which member is set */
static void dl__pb_float(dl__pb *b, int field, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    dl__pb_tag(b, field, 5);
    dl__pb_le(b, u, 4);
}

static void dl__pb_bytes(dl__pb *b, int field, const void *s, size_t n)
{
    if (!n) return;
    dl__pb_tag(b, field, 2);
    dl__pb_varint(b, (uint64_t)n);
    dl__pb_raw(b, s, n);
}

static void dl__pb_str(dl__pb *b, int field, const char *s) { dl__pb_bytes(b, field, s, strlen(s)); }

/* repeated double, packed */
static void dl__pb_doubles(dl__pb *b, int field, const double *v, size_t n)
{
    size_t i;
    if (!n) return;
    dl__pb_tag(b, field, 2);
    dl__pb_varint(b, (uint64_t)n * 8);
    for (i = 0; i < n; i++) dl__pb_le(b, dl__pb_dbits(v[i]), 8);
}

/* A nested message: dl__pb_begin writes the tag and returns where the
   content starts; dl__pb_end puts the content's length in front of it. */
static size_t dl__pb_begin(dl__pb *b, int field)
{
    dl__pb_tag(b, field, 2);
    return b->n;
}

static void dl__pb_end(dl__pb *b, size_t start)
{
    unsigned char t[10];
    size_t len, k;
    if (b->oom) return;
    len = b->n - start;
    k = dl__pb_put_varint(t, (uint64_t)len);
    if (!dl__pb_grow(b, k)) return;
    memmove(b->p + start + k, b->p + start, len);
    memcpy(b->p + start, t, k);
    b->n += k;
}

/* ---- checksums: CRC-32C (Castagnoli, TFRecord), CRC-32 (PNG), Adler-32
   (zlib); reflected CRCs four bits at a time. */
static const uint32_t dl__tb_crc32c_tab[16] = {
    0x00000000u, 0x105ec76fu, 0x20bd8edeu, 0x30e349b1u, 0x417b1dbcu, 0x5125dad3u, 0x61c69362u,
    0x7198540du, 0x82f63b78u, 0x92a8fc17u, 0xa24bb5a6u, 0xb21572c9u, 0xc38d26c4u, 0xd3d3e1abu,
    0xe330a81au, 0xf36e6f75u};
static const uint32_t dl__tb_crc32_tab[16] = {
    0x00000000u, 0x1db71064u, 0x3b6e20c8u, 0x26d930acu, 0x76dc4190u, 0x6b6b51f4u, 0x4db26158u,
    0x5005713cu, 0xedb88320u, 0xf00f9344u, 0xd6d6a3e8u, 0xcb61b38cu, 0x9b64c2b0u, 0x86d3d2d4u,
    0xa00ae278u, 0xbdbdf21cu};

static uint32_t dl__tb_crc_nibbles(const uint32_t *tab, uint32_t crc, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
    while (n--) {
        crc = tab[(crc ^ *p) & 15u] ^ (crc >> 4);
        crc = tab[(crc ^ (uint32_t)(*p >> 4)) & 15u] ^ (crc >> 4);
        p++;
    }
    return ~crc;
}

/* crc continues an earlier value (0 to start) */
static uint32_t dl__tb_crc32c(uint32_t crc, const void *p, size_t n)
{
    return dl__tb_crc_nibbles(dl__tb_crc32c_tab, crc, p, n);
}
static uint32_t dl__tb_crc32(uint32_t crc, const void *p, size_t n)
{
    return dl__tb_crc_nibbles(dl__tb_crc32_tab, crc, p, n);
}
/* TFRecord's masked CRC: rotate right 15, add a constant */
static uint32_t dl__tb_mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

static uint32_t dl__tb_adler32(uint32_t a, const unsigned char *p, size_t n)
{
    uint32_t s1 = a & 0xffffu, s2 = a >> 16;
    while (n > 0) {
        size_t k = n < 5552 ? n : 5552;   /* the most sums that cannot overflow */
        n -= k;
        while (k--) { s1 += *p++; s2 += s1; }
        s1 %= 65521u;
        s2 %= 65521u;
    }
    return (s2 << 16) | s1;
}

/* ---- PNG: 8-bit, color type 0 (gray), 2 (RGB), 6 (RGBA); raw holds the
   scanlines, each a filter byte 0 and the row's bytes. */
static void dl__pb_be32(dl__pb *b, uint32_t v)
{
    unsigned char t[4];
    t[0] = (unsigned char)(v >> 24); t[1] = (unsigned char)(v >> 16);
    t[2] = (unsigned char)(v >> 8); t[3] = (unsigned char)v;
    dl__pb_raw(b, t, 4);
}

static size_t dl__tb_png_chunk_begin(dl__pb *b, const char *type)
{
    size_t start = b->n;
    dl__pb_be32(b, 0);
    dl__pb_raw(b, type, 4);
    return start;
}

static void dl__tb_png_chunk_end(dl__pb *b, size_t start)
{
    uint32_t len;
    if (b->oom) return;
    len = (uint32_t)(b->n - start - 8);
    b->p[start] = (unsigned char)(len >> 24); b->p[start + 1] = (unsigned char)(len >> 16);
    b->p[start + 2] = (unsigned char)(len >> 8); b->p[start + 3] = (unsigned char)len;
    dl__pb_be32(b, dl__tb_crc32(0, b->p + start + 4, b->n - start - 4));
}

static void dl__tb_png(dl__pb *b, const unsigned char *raw, size_t n, uint32_t width, uint32_t height, int ctype)
{
    static const unsigned char sig[8] = {137, 80, 78, 71, 13, 10, 26, 10};
    unsigned char ihdr[5], zhdr[2], blk[5];
    size_t c, off = 0;
    dl__pb_raw(b, sig, 8);
    c = dl__tb_png_chunk_begin(b, "IHDR");
    dl__pb_be32(b, width);
    dl__pb_be32(b, height);
    ihdr[0] = 8;                      /* bit depth */
    ihdr[1] = (unsigned char)ctype;
    ihdr[2] = ihdr[3] = ihdr[4] = 0;  /* deflate, adaptive filtering, no interlace */
    dl__pb_raw(b, ihdr, 5);
    dl__tb_png_chunk_end(b, c);
    c = dl__tb_png_chunk_begin(b, "IDAT");
    zhdr[0] = 0x78;                   /* deflate, 32K window */
    zhdr[1] = 0x01;                   /* no dictionary, (0x78 * 256 + 0x01) % 31 == 0 */
    dl__pb_raw(b, zhdr, 2);
    do {                              /* stored blocks: BFINAL/BTYPE=00, LEN, NLEN, bytes */
        size_t k = n - off < 65535 ? n - off : 65535;
        blk[0] = (unsigned char)(off + k == n ? 1 : 0);
        blk[1] = (unsigned char)k; blk[2] = (unsigned char)(k >> 8);
        blk[3] = (unsigned char)~k; blk[4] = (unsigned char)(~k >> 8);
        dl__pb_raw(b, blk, 5);
        dl__pb_raw(b, raw + off, k);
        off += k;
    } while (off < n);
    dl__pb_be32(b, dl__tb_adler32(1, raw, n));
    dl__tb_png_chunk_end(b, c);
    c = dl__tb_png_chunk_begin(b, "IEND");
    dl__tb_png_chunk_end(b, c);
}

/* ---- the writer */
/* a scalar that dl_summary_scalar_tensor queued (slot: its float in the
   writer's qbuf, on the GPU), or a host value that came after one (slot -1) */
typedef struct dl__tbq {
    char *tag;
    int64_t step;
    double wall, v;
    int slot;
} dl__tbq;

struct dl_summary_writer {
    uint32_t magic;
    dl_ctx *ctx;
    char *path;
#ifdef DL__UNIX
    int fd;
#else
    FILE *f;
#endif
    uint64_t size;            /* bytes of whole records in the file */
    bool broken;              /* a partial record could not be removed */
    dl__pb buf;               /* the record being encoded */
    dl__tbq *q;               /* scalars not yet written, in call order */
    int qn, nslot;            /* how many; how many of them are qbuf's */
    dl_tensor *qbuf;          /* DL__TB_QCAP floats on the values' device */
};

#define DL__TB_QCAP 512       /* scalars queued at most (a read of the device per 512) */

static bool dl__tb_ok(const dl_summary_writer *w) { return w && w->magic == DL__TB_MAGIC; }

static double dl__tb_now(void)
{
#if defined(DL__UNIX) && defined(CLOCK_REALTIME)
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) == 0) return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
    return (double)time(NULL);
}

/* Writes one record's bytes; on failure cuts the file back to its last whole
   record (or marks the writer broken when that is impossible). */
static dl_result dl__tb_write(dl_summary_writer *w, const char *fn, const unsigned char *p, size_t n)
{
    if (w->broken) {
        dl__err(w->ctx, DL_ERR_IO, "%s: an earlier write to %s failed and its partial record could not "
                "be removed; open a new writer", fn, w->path);
        return DL_ERR_IO;
    }
#ifdef DL__UNIX
    {
        size_t done = 0;
        while (done < n) {
            size_t want = n - done > ((size_t)1 << 30) ? ((size_t)1 << 30) : n - done;
            ssize_t k = write(w->fd, p + done, want);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                int e = k < 0 ? errno : ENOSPC;
                if (done > 0) {
#ifdef DL__POSIX2008
                    if (ftruncate(w->fd, (off_t)w->size) != 0) w->broken = true;
#else
                    w->broken = true;
#endif
                }
                dl__err(w->ctx, DL_ERR_IO, "%s: writing %s failed: %s; %s", fn, w->path, dl__errno_str(e),
                        w->broken ? "the file now ends in a partial record (TensorBoard reads the records "
                        "before it)" : "the file keeps every record written before");
                return DL_ERR_IO;
            }
            done += (size_t)k;
        }
    }
#else
    if (fwrite(p, 1, n, w->f) != n || fflush(w->f) != 0) {
        w->broken = true;
        dl__err(w->ctx, DL_ERR_IO, "%s: writing %s failed (disk full?); the file may end in a partial "
                "record (TensorBoard reads the records before it)", fn, w->path);
        return DL_ERR_IO;
    }
#endif
    w->size += n;
    return DL_OK;
}

/* Starts an Event in w->buf: 12 bytes for the frame header, wall_time, step. */
static dl__pb *dl__tb_event_at(dl_summary_writer *w, int64_t step, double wall)
{
    static const unsigned char room[12] = {0};
    dl__pb *b = &w->buf;
    b->n = 0;
    b->oom = false;
    dl__pb_raw(b, room, 12);
    dl__pb_double(b, 1, wall);
    dl__pb_int(b, 2, step);
    return b;
}
static dl__pb *dl__tb_event(dl_summary_writer *w, int64_t step) { return dl__tb_event_at(w, step, dl__tb_now()); }

/* Frames the Event in w->buf and writes it. */
static dl_result dl__tb_emit(dl_summary_writer *w, const char *fn)
{
    dl__pb *b = &w->buf;
    uint64_t len;
    uint32_t c;
    int i;
    dl_result rc;
    if (!b->oom) {
        len = (uint64_t)(b->n - 12);
        for (i = 0; i < 8; i++) b->p[i] = (unsigned char)(len >> (8 * i));
        c = dl__tb_mask(dl__tb_crc32c(0, b->p, 8));
        for (i = 0; i < 4; i++) b->p[8 + i] = (unsigned char)(c >> (8 * i));
        dl__pb_le(b, dl__tb_mask(dl__tb_crc32c(0, b->p + 12, (size_t)len)), 4);
    }
    if (b->oom) {
        dl__err(w->ctx, DL_ERR_OOM, "%s: out of memory encoding a record for %s", fn, w->path);
        rc = DL_ERR_OOM;
    } else {
        rc = dl__tb_write(w, fn, b->p, b->n);
    }
    b->n = 0;
    if (b->cap > ((size_t)1 << 20)) {   /* do not hold on to an image's worth */
        DL_FREE(b->p);
        b->p = NULL;
        b->cap = 0;
    }
    return rc;
}

static dl_result dl__tb_sync(dl_summary_writer *w, const char *fn)
{
#ifdef DL__UNIX
    if (fsync(w->fd) != 0 && errno != EINVAL) {
        dl__err(w->ctx, DL_ERR_IO, "%s: syncing %s to disk failed: %s", fn, w->path, dl__errno_str(errno));
        return DL_ERR_IO;
    }
#else
    if (fflush(w->f) != 0) {
        dl__err(w->ctx, DL_ERR_IO, "%s: flushing %s failed", fn, w->path);
        return DL_ERR_IO;
    }
#endif
    return DL_OK;
}

/* Closes the file (first error recorded, by fn when fn is not NULL). */
static dl_result dl__tb_close_file(dl_summary_writer *w, const char *fn)
{
    dl_result rc = DL_OK;
#ifdef DL__UNIX
    if (w->fd < 0) return DL_OK;
    if (fn) rc = dl__tb_sync(w, fn);
    if (close(w->fd) != 0 && rc == DL_OK && fn) {
        dl__err(w->ctx, DL_ERR_IO, "%s: closing %s failed: %s", fn, w->path, dl__errno_str(errno));
        rc = DL_ERR_IO;
    }
    w->fd = -1;
#else
    if (!w->f) return DL_OK;
    if (fclose(w->f) != 0 && fn) {
        dl__err(w->ctx, DL_ERR_IO, "%s: closing %s failed", fn, w->path);
        rc = DL_ERR_IO;
    }
    w->f = NULL;
#endif
    return rc;
}

/* One scalar's record (Summary.Value.simple_value, float32) at wall time wall */
static dl_result dl__tb_scalar_rec(dl_summary_writer *w, const char *fn, const char *tag, int64_t step,
                                   double wall, double value)
{
    dl__pb *b = dl__tb_event_at(w, step, wall);
    size_t s = dl__pb_begin(b, 5), v;      /* Event.summary */
    v = dl__pb_begin(b, 1);                 /* Summary.value */
    dl__pb_str(b, 1, tag);
    dl__pb_float(b, 2, (float)value);       /* simple_value */
    dl__pb_end(b, v);
    dl__pb_end(b, s);
    return dl__tb_emit(w, fn);
}

/* Writes the queued scalars in call order: the GPU values by one read of
   qbuf (the one wait on the device), each record with the wall time of its
   call. The queue is empty after, whether or not that worked (a failed read
   or write is fn's error); inside a capture it is kept and fn refused. */
static dl_result dl__tb_drain(dl_summary_writer *w, const char *fn)
{
    float v[DL__TB_QCAP];
    dl_result rc = DL_OK;
    int i;
    if (!w->qn) return DL_OK;
    if (w->nslot) {
        if (dl__cap_refused(w->ctx, fn, "writing the queued scalars (a read to the host)", DL__CAP_READ_HINT))
            return DL_ERR_UNSUPPORTED;
        DL__BE(w->qbuf)->download(w->qbuf->dev_, v, w->qbuf->data, sizeof(float) * (size_t)w->nslot);
        rc = dl__dev_check(w->qbuf->dev_, fn);
    }
    for (i = 0; i < w->qn; i++) {
        dl__tbq *e = &w->q[i];
        if (rc == DL_OK)
            rc = dl__tb_scalar_rec(w, fn, e->tag, e->step, e->wall, e->slot >= 0 ? (double)v[e->slot] : e->v);
        DL_FREE(e->tag);
    }
    w->qn = w->nslot = 0;
    return rc;
}

/* appends a scalar to the queue (room checked by the caller) */
static dl_result dl__tb_queue(dl_summary_writer *w, const char *fn, const char *tag, int64_t step, double v,
                              int slot)
{
    dl__tbq *e;
    if (!w->q && !(w->q = (dl__tbq *)dl__malloc(w->ctx, sizeof(dl__tbq) * DL__TB_QCAP))) {
        dl__err(w->ctx, DL_ERR_OOM, "%s: out of memory queueing a scalar for %s", fn, w->path);
        return DL_ERR_OOM;
    }
    e = &w->q[w->qn];
    if (!(e->tag = dl__strdup(tag))) {
        dl__err(w->ctx, DL_ERR_OOM, "%s: out of memory queueing a scalar for %s", fn, w->path);
        return DL_ERR_OOM;
    }
    e->step = step;
    e->wall = dl__tb_now();
    e->v = v;
    e->slot = slot;
    w->qn++;
    if (slot >= 0) w->nslot++;
    return DL_OK;
}

/* a host value's record: now, or queued behind GPU values to keep the order */
static dl_result dl__tb_put(dl_summary_writer *w, const char *fn, const char *tag, int64_t step, double value)
{
    dl_result rc;
    if (w->qn && w->qn < DL__TB_QCAP) return dl__tb_queue(w, fn, tag, step, value, -1);
    if ((rc = dl__tb_drain(w, fn)) != DL_OK) return rc;
    return dl__tb_scalar_rec(w, fn, tag, step, dl__tb_now(), value);
}

static void dl__tb_destroy(void *p)
{
    dl_summary_writer *w = (dl_summary_writer *)p;
    if (w->ctx) (void)dl__tb_drain(w, "dl_ctx_free");   /* (dl_summary_close drained it first) */
    (void)dl__tb_close_file(w, NULL);
    w->magic = 0;
    DL_FREE(w->q);
    if (w->qbuf) dl_free(w->qbuf);
    DL_FREE(w->buf.p);
    DL_FREE(w->path);
    DL_FREE(w);
}

/* mkdir -p; the last component must end up a directory */
static bool dl__tb_mkdirs(dl_ctx *ctx, const char *fn, const char *dir)
{
#ifdef DL__UNIX
    struct stat st;
    char *p = dl__strdup(dir), *s;
    if (!p) { dl__err(ctx, DL_ERR_OOM, "%s: out of memory", fn); return false; }
    for (s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                int e = errno;
                if (!(stat(p, &st) == 0 && S_ISDIR(st.st_mode))) {
                    dl__err(ctx, DL_ERR_IO, "%s: cannot create the log directory %s: %s", fn, p, dl__errno_str(e));
                    DL_FREE(p);
                    return false;
                }
            }
            *s = c;
            if (!c) break;
        }
    }
    DL_FREE(p);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        dl__err(ctx, DL_ERR_IO, "%s: the log directory %s exists and is not a directory", fn, dir);
        return false;
    }
#else
    (void)ctx; (void)fn; (void)dir;
#endif
    return true;
}

dl_summary_writer *dl_summary_open(dl_ctx *ctx, const char *logdir)
{
    const char *fn = "dl_summary_open";
    dl_summary_writer *w;
    char host[128];
    size_t dlen, n, i;
    long long secs = (long long)time(NULL);
    long pid = 0;
    int attempt;
    dl__pb *b;
    if (!ctx) return NULL;
    if (!logdir || !logdir[0]) {
        dl__err(ctx, DL_ERR_ARG, "%s: logdir is %s", fn, logdir ? "empty" : "NULL");
        return NULL;
    }
    if (!dl__tb_mkdirs(ctx, fn, logdir)) return NULL;
    snprintf(host, sizeof host, "localhost");
#ifdef DL__UNIX
    {
        struct utsname u;
        if (uname(&u) == 0 && u.nodename[0]) snprintf(host, sizeof host, "%s", u.nodename);
    }
    pid = (long)getpid();
#endif
    for (i = 0; host[i]; i++) {       /* a file name component, whatever the host is called */
        char c = host[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
              c == '.' || c == '_')) host[i] = '_';
    }
    dlen = strlen(logdir);
    while (dlen > 1 && logdir[dlen - 1] == '/') dlen--;
    w = (dl_summary_writer *)dl__malloc(ctx, sizeof *w);
    n = dlen + strlen(host) + 96;
    if (w) memset(w, 0, sizeof *w);
    if (w) w->path = (char *)dl__malloc(ctx, n);
    if (!w || !w->path) {
        if (w) DL_FREE(w);
        dl__err(ctx, DL_ERR_OOM, "%s: out of memory", fn);
        return NULL;
    }
    w->magic = DL__TB_MAGIC;
    w->ctx = ctx;
    for (attempt = 0;; attempt++) {
        snprintf(w->path, n, "%.*s%sevents.out.tfevents.%010lld.%s.%ld.%d", (int)dlen, logdir,
                 logdir[dlen - 1] == '/' ? "" : "/", secs, host, pid, attempt);
#ifdef DL__UNIX
        {
            int flags = O_WRONLY | O_CREAT | O_EXCL | O_APPEND;
#ifdef O_CLOEXEC
            flags |= O_CLOEXEC;
#endif
            w->fd = open(w->path, flags, 0666);
            if (w->fd >= 0) break;
            if (errno == EEXIST && attempt < 1000) continue;
            dl__err(ctx, DL_ERR_IO, "%s: cannot create %s: %s", fn, w->path, dl__errno_str(errno));
        }
#else
        {
            FILE *probe = fopen(w->path, "rb");
            if (probe) { fclose(probe); if (attempt < 1000) continue; }
            w->f = probe ? NULL : fopen(w->path, "ab");
            if (w->f) break;
            dl__err(ctx, DL_ERR_IO, "%s: cannot create %s (does the directory exist, is it writable?)",
                    fn, w->path);
        }
#endif
        DL_FREE(w->path);
        DL_FREE(w);
        return NULL;
    }
    b = dl__tb_event(w, 0);
    dl__pb_str(b, 3, "brain.Event:2");
    if (dl__tb_emit(w, fn) != DL_OK || !dl__own(ctx, dl__tb_destroy, w)) {
        (void)dl__tb_close_file(w, NULL);
        remove(w->path);
        w->ctx = NULL;
        dl__tb_destroy(w);
        return NULL;
    }
    return w;
}

const char *dl_summary_path(const dl_summary_writer *w) { return dl__tb_ok(w) ? w->path : NULL; }

dl_result dl_summary_flush(dl_summary_writer *w)
{
    dl_result rc;
    if (!dl__tb_ok(w)) return DL_ERR_ARG;
    if ((rc = dl__tb_drain(w, "dl_summary_flush")) != DL_OK) return rc;
    return dl__tb_sync(w, "dl_summary_flush");
}

dl_result dl_summary_close(dl_summary_writer *w)
{
    dl_result rc, rc2;
    if (!w) return DL_OK;
    if (!dl__tb_ok(w)) return DL_ERR_ARG;
    rc = dl__tb_drain(w, "dl_summary_close");
    if (rc == DL_ERR_UNSUPPORTED) return rc;   /* inside a capture: the writer stays open */
    rc2 = dl__tb_close_file(w, "dl_summary_close");
    dl__disown(w->ctx, w);
    return rc != DL_OK ? rc : rc2;
}

static bool dl__tb_args(dl_summary_writer *w, const char *fn, const char *tag)
{
    int64_t bad;
    if (!dl__tb_ok(w)) return false;
    if (!tag || !tag[0]) {
        dl__err(w->ctx, DL_ERR_ARG, "%s: tag is %s (writing %s)", fn, tag ? "empty" : "NULL", w->path);
        return false;
    }
    /* Summary.Value.tag is a protobuf string: a reader drops a record whose
       string is not UTF-8 (TensorBoard showed nothing after it) */
    if ((bad = dl__utf8_bad(tag)) >= 0) {
        dl__err(w->ctx, DL_ERR_ARG, "%s: tag is not valid UTF-8 (byte 0x%02x at offset %lld); "
                "TensorBoard's reader would reject the record (writing %s)", fn,
                (unsigned)(unsigned char)tag[bad], (long long)bad, w->path);
        return false;
    }
    return true;
}

static bool dl__tb_tensor(dl_summary_writer *w, const char *fn, const char *arg, dl_tensor *t)
{
    if (!t || !dl__valid(fn, arg, t)) return false;
    if (t->ctx_ != w->ctx) {
        dl__err(w->ctx, DL_ERR_ARG, "%s: %s %s belongs to another context than the writer of %s", fn, arg,
                dl__sh(t), w->path);
        return false;
    }
    return true;
}

dl_result dl_summary_scalar(dl_summary_writer *w, const char *tag, int64_t step, double value)
{
    if (!dl__tb_args(w, "dl_summary_scalar", tag)) return DL_ERR_ARG;
    return dl__tb_put(w, "dl_summary_scalar", tag, step, value);
}

/* A GPU's value is copied on its device into qbuf, no wait; the record is
   written by dl__tb_drain. Host memory (cpu:N) is read now. */
dl_result dl_summary_scalar_tensor(dl_summary_writer *w, const char *tag, int64_t step, dl_tensor *t)
{
    const char *fn = "dl_summary_scalar_tensor";
    int64_t cap = DL__TB_QCAP;
    dl_result rc;
    float v;
    if (!dl__tb_args(w, fn, tag)) return DL_ERR_ARG;
    if (!dl__tb_tensor(w, fn, "t", t)) return w->ctx->err != DL_OK ? w->ctx->err : DL_ERR_ARG;
    if (t->dtype != DL_DTYPE_F32 || t->numel != 1) {
        rc = t->dtype != DL_DTYPE_F32 ? DL_ERR_DTYPE : DL_ERR_SHAPE;
        dl__err(w->ctx, rc, "%s: t %s %s: the value must be a tensor of one float32 element (tag \"%s\")",
                fn, dl__dtype_str(t->dtype), dl__sh(t), tag);
        return rc;
    }
    if (dl__cap_refused(w->ctx, fn, "a read to the host", DL__CAP_READ_HINT)) return DL_ERR_UNSUPPORTED;
    if (t->device.type != DL_DEVICE_CUDA) {
        DL__BE(t)->download(t->dev_, &v, t->data, sizeof v);
        if ((rc = dl__dev_check(t->dev_, fn)) != DL_OK) return rc;
        return dl__tb_put(w, fn, tag, step, (double)v);
    }
    if (w->qn == DL__TB_QCAP || (w->qbuf && w->qbuf->dev_ != t->dev_))
        if ((rc = dl__tb_drain(w, fn)) != DL_OK) return rc;
    if (w->qbuf && w->qbuf->dev_ != t->dev_) {   /* another device: a buffer there */
        dl_free(w->qbuf);
        w->qbuf = NULL;
    }
    if (!w->qbuf && !(w->qbuf = dl__make(t->dev_, fn, DL_DTYPE_F32, 1, &cap, true, NULL)))
        return w->ctx->err != DL_OK ? w->ctx->err : DL_ERR_OOM;
    DL__BE(t)->copy(t->dev_, (float *)w->qbuf->data + w->nslot, t->data, sizeof(float));
    if ((rc = dl__dev_check(t->dev_, fn)) != DL_OK) return rc;
    return dl__tb_queue(w, fn, tag, step, 0.0, w->nslot);
}

/* The tensor's values as doubles through dl_read / dl_read_int64 (NULL + error). */
static double *dl__tb_values(dl_summary_writer *w, const char *fn, dl_tensor *t)
{
    int64_t i, n = t->numel;
    double *v;
    dl_result rc;
    if (t->dtype != DL_DTYPE_F32 && t->dtype != DL_DTYPE_I32 && t->dtype != DL_DTYPE_I64) {
        dl__err(w->ctx, DL_ERR_DTYPE, "%s: t %s has an unsupported dtype", fn, dl__sh(t));
        return NULL;
    }
    if ((uint64_t)n > ((size_t)-1) / sizeof(double) - 1) {
        dl__err(w->ctx, DL_ERR_OOM, "%s: t %s is too large", fn, dl__sh(t));
        return NULL;
    }
    v = (double *)dl__malloc(w->ctx, sizeof(double) * (size_t)(n ? n : 1));
    if (!v) { dl__err(w->ctx, DL_ERR_OOM, "%s: out of memory reading t %s", fn, dl__sh(t)); return NULL; }
    /* read into the same buffer (4 or 8 bytes per value) and widen in place:
       floats from the end (v[i] covers f[2i] and f[2i+1], read already) */
    if (t->dtype == DL_DTYPE_F32) {
        float *f = (float *)v;
        rc = dl_read(t, f, n);
        for (i = n - 1; rc == DL_OK && i >= 0; i--) v[i] = (double)f[i];
    } else {
        int64_t *q = (int64_t *)v;
        rc = dl_read_int64(t, q, n);
        for (i = 0; rc == DL_OK && i < n; i++) v[i] = (double)q[i];
    }
    if (rc != DL_OK) { DL_FREE(v); return NULL; }
    return v;
}

/* TensorFlow's default histogram bucket limits (lim NULL: just the count) */
static int dl__tb_limits(double *lim)
{
    double v = 1e-12;
    int k = 0, np = 0, i;
    while (v < 1e20) { np++; v *= 1.1; }
    if (!lim) return 2 * np + 3;
    lim[k++] = -DBL_MAX;
    v = 1e-12;
    for (i = 0; i < np; i++) { lim[np - i] = -v; lim[np + 2 + i] = v; v *= 1.1; }
    lim[np + 1] = 0.0;
    lim[2 * np + 2] = DBL_MAX;
    return 2 * np + 3;
}

dl_result dl_summary_histogram(dl_summary_writer *w, const char *tag, int64_t step, dl_tensor *t)
{
    const char *fn = "dl_summary_histogram";
    double *v, *lim, *cnt, mn = 0, mx = 0, sum = 0, sq = 0;
    int nb = dl__tb_limits(NULL), i, ne = 0, first, last;
    int64_t j;
    dl__pb *b;
    size_t s, val, h;
    dl_result rc;
    if (!dl__tb_args(w, fn, tag)) return DL_ERR_ARG;
    if (!dl__tb_tensor(w, fn, "t", t)) return w->ctx->err != DL_OK ? w->ctx->err : DL_ERR_ARG;
    if ((rc = dl__tb_drain(w, fn)) != DL_OK) return rc;   /* the queued scalars come first */
    if (t->numel == 0) {
        dl__err(w->ctx, DL_ERR_ARG, "%s: t %s has no elements (tag \"%s\")", fn, dl__sh(t), tag);
        return DL_ERR_ARG;
    }
    v = dl__tb_values(w, fn, t);
    if (!v) return w->ctx->err;
    lim = (double *)dl__malloc(w->ctx, sizeof(double) * 2 * (size_t)nb);
    if (!lim) {
        DL_FREE(v);
        dl__err(w->ctx, DL_ERR_OOM, "%s: out of memory", fn);
        return DL_ERR_OOM;
    }
    cnt = lim + nb;
    dl__tb_limits(lim);
    for (i = 0; i < nb; i++) cnt[i] = 0;
    for (j = 0; j < t->numel; j++) {
        double x = v[j];
        int lo = 0, hi = nb;
        if (!(x - x == 0)) {
            dl__err(w->ctx, DL_ERR_NAN, "%s: t %s has %s at index %lld (tag \"%s\"); a histogram needs "
                    "finite values", fn, dl__sh(t), x != x ? "NaN" : "Inf", (long long)j, tag);
            DL_FREE(v);
            DL_FREE(lim);
            return DL_ERR_NAN;
        }
        while (lo < hi) {               /* upper_bound: the first limit > x */
            int mid = lo + (hi - lo) / 2;
            if (lim[mid] > x) hi = mid; else lo = mid + 1;
        }
        cnt[lo < nb ? lo : nb - 1] += 1.0;
        if (j == 0 || x < mn) mn = x;
        if (j == 0 || x > mx) mx = x;
        sum += x;
        sq += x * x;
    }
    DL_FREE(v);
    /* from the first to the last non-empty bucket, runs of empty buckets
       merged into one, in place (Histogram::EncodeToProto without its empty
       runs at the ends: readers take min and max as the outer edges) */
    for (first = 0; cnt[first] <= 0.0; first++) {}
    for (last = nb - 1; cnt[last] <= 0.0; last--) {}
    for (i = first; i <= last;) {
        double end = lim[i], c = cnt[i];
        i++;
        if (c <= 0.0)
            while (i <= last && cnt[i] <= 0.0) { end = lim[i]; i++; }
        lim[ne] = end;
        cnt[ne] = c;
        ne++;
    }
    b = dl__tb_event(w, step);
    s = dl__pb_begin(b, 5);
    val = dl__pb_begin(b, 1);
    dl__pb_str(b, 1, tag);
    h = dl__pb_begin(b, 5);                 /* Value.histo: HistogramProto */
    dl__pb_double(b, 1, mn);
    dl__pb_double(b, 2, mx);
    dl__pb_double(b, 3, (double)t->numel);
    dl__pb_double(b, 4, sum);
    dl__pb_double(b, 5, sq);
    dl__pb_doubles(b, 6, lim, (size_t)ne);
    dl__pb_doubles(b, 7, cnt, (size_t)ne);
    dl__pb_end(b, h);
    dl__pb_end(b, val);
    dl__pb_end(b, s);
    DL_FREE(lim);
    rc = dl__tb_emit(w, fn);
    return rc;
}

dl_result dl_summary_image(dl_summary_writer *w, const char *tag, int64_t step, dl_tensor *img)
{
    const char *fn = "dl_summary_image";
    int64_t N, C, H, W, cols, rows, width, height, k, y, x, c;
    size_t rowbytes, rawn;
    unsigned char *raw;
    double *v;
    dl__pb *b;
    size_t s, val, im, e;
    dl_result e0;
    if (!dl__tb_args(w, fn, tag)) return DL_ERR_ARG;
    if (!dl__tb_tensor(w, fn, "img", img)) return w->ctx->err != DL_OK ? w->ctx->err : DL_ERR_ARG;
    if ((e0 = dl__tb_drain(w, fn)) != DL_OK) return e0;   /* the queued scalars come first */
    if (img->ndim != 3 && img->ndim != 4) {
        dl__err(w->ctx, DL_ERR_SHAPE, "%s: img %s must be (C,H,W) or (N,C,H,W) (tag \"%s\")", fn,
                dl__sh(img), tag);
        return DL_ERR_SHAPE;
    }
    N = img->ndim == 4 ? img->shape[0] : 1;
    C = img->shape[img->ndim - 3];
    H = img->shape[img->ndim - 2];
    W = img->shape[img->ndim - 1];
    if (C != 1 && C != 3 && C != 4) {
        dl__err(w->ctx, DL_ERR_SHAPE, "%s: img %s has %lld channels; 1 (gray), 3 (RGB) or 4 (RGBA) "
                "expected (tag \"%s\")", fn, dl__sh(img), (long long)C, tag);
        return DL_ERR_SHAPE;
    }
    if (N < 1 || H < 1 || W < 1) {
        dl__err(w->ctx, DL_ERR_SHAPE, "%s: img %s is empty (tag \"%s\")", fn, dl__sh(img), tag);
        return DL_ERR_SHAPE;
    }
    cols = N < 8 ? N : 8;
    rows = (N + cols - 1) / cols;
    width = W * cols;                       /* no overflow: dims multiply to numel */
    height = H * rows;
    if (width > ((int64_t)1 << 30) || height > ((int64_t)1 << 30) || width * height * C > ((int64_t)1 << 30)) {
        dl__err(w->ctx, DL_ERR_ARG, "%s: img %s makes a %lldx%lld image, too large for one PNG here "
                "(at most 2^30 bytes; tag \"%s\")", fn, dl__sh(img), (long long)width, (long long)height, tag);
        return DL_ERR_ARG;
    }
    v = dl__tb_values(w, fn, img);
    if (!v) return w->ctx->err;
    rowbytes = 1 + (size_t)(width * C);
    rawn = rowbytes * (size_t)height;
    raw = (unsigned char *)dl__malloc(w->ctx, rawn);
    if (!raw) {
        DL_FREE(v);
        dl__err(w->ctx, DL_ERR_OOM, "%s: out of memory for a %lldx%lld image", fn, (long long)width,
                (long long)height);
        return DL_ERR_OOM;
    }
    memset(raw, 0, rawn);                   /* filter bytes 0, empty grid cells black */
    for (k = 0; k < N; k++) {
        int64_t oy = (k / cols) * H, ox = (k % cols) * W;
        for (c = 0; c < C; c++)
            for (y = 0; y < H; y++) {
                const double *src = v + ((k * C + c) * H + y) * W;
                unsigned char *dst = raw + (size_t)(oy + y) * rowbytes + 1 + (size_t)(ox * C + c);
                for (x = 0; x < W; x++) {
                    double d = src[x];
                    unsigned char u;
                    if (img->dtype == DL_DTYPE_F32) {
                        float f = (float)d * 255.0f;   /* PyTorch: (x*255).clip(0,255).astype(uint8) */
                        u = (unsigned char)(f >= 255.0f ? 255 : f > 0.0f ? (int)f : 0);
                    } else {
                        u = (unsigned char)(d >= 255.0 ? 255 : d > 0.0 ? (int)d : 0);
                    }
                    dst[(size_t)(x * C)] = u;
                }
            }
    }
    DL_FREE(v);
    b = dl__tb_event(w, step);
    s = dl__pb_begin(b, 5);
    val = dl__pb_begin(b, 1);
    dl__pb_str(b, 1, tag);
    im = dl__pb_begin(b, 4);                /* Value.image */
    dl__pb_int(b, 1, height);
    dl__pb_int(b, 2, width);
    dl__pb_int(b, 3, C);                    /* colorspace: 1 gray, 3 RGB, 4 RGBA */
    e = dl__pb_begin(b, 4);                 /* encoded_image_string */
    dl__tb_png(b, raw, rawn, (uint32_t)width, (uint32_t)height, C == 1 ? 0 : C == 3 ? 2 : 6);
    dl__pb_end(b, e);
    dl__pb_end(b, im);
    dl__pb_end(b, val);
    dl__pb_end(b, s);
    DL_FREE(raw);
    return dl__tb_emit(w, fn);
}

/* ---- the graph */
typedef struct dl__tbn {
    dl_tensor *t;             /* the leaf, or the op's output */
    dl__node *n;              /* the op (NULL: leaf) */
    const char *op;
    char base[49];            /* name before the _<k> (short: name has room for two) */
    bool bare;                /* a named leaf: its name alone if free */
    int64_t k;                /* among the nodes with this base, in order */
    int64_t order;
    char name[96];
} dl__tbn;

static uint64_t dl__tb_hash(const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    uint64_t h = 0xcbf29ce484222325ull;
    while (n--) { h ^= *p++; h *= 0x100000001b3ull; }
    return h ^ (h >> 29);
}

static int dl__tb_by_id(const void *a, const void *b)
{
    int64_t x = (*(dl__node *const *)a)->id, y = (*(dl__node *const *)b)->id;
    return x < y ? -1 : x > y;
}

static int dl__tb_by_base(const void *a, const void *b)
{
    const dl__tbn *x = *(const dl__tbn *const *)a, *y = *(const dl__tbn *const *)b;
    int c = strcmp(x->base, y->base);
    if (c) return c;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* slot of tensor t in the pointer table (its entry, or the empty slot for it) */
static size_t dl__tb_tslot(const int64_t *tab, size_t mask, const dl__tbn *nodes, const dl_tensor *t)
{
    size_t h = (size_t)dl__tb_hash(&t, sizeof t) & mask;
    while (tab[h] >= 0 && nodes[tab[h]].t != t) h = (h + 1) & mask;
    return h;
}

/* claims name s for node i in the name table: false if taken */
static bool dl__tb_claim(int64_t *tab, size_t mask, dl__tbn *nodes, int64_t i, const char *s)
{
    size_t h = (size_t)dl__tb_hash(s, strlen(s)) & mask;
    while (tab[h] >= 0) {
        if (!strcmp(nodes[tab[h]].name, s)) return false;
        h = (h + 1) & mask;
    }
    snprintf(nodes[i].name, sizeof nodes[i].name, "%s", s);
    tab[h] = i;
    return true;
}

/* s (at most max chars) with characters TensorFlow does not allow in node
   names replaced by '_' ('/' stays: TensorBoard groups by it) */
static void dl__tb_clean(char *dst, size_t cap, const char *s, size_t max)
{
    size_t i;
    for (i = 0; i < max && s[i] && i + 1 < cap; i++) {
        char c = s[i];
        dst[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                 c == '.' || c == '-' || c == '/' ? c : '_';
    }
    dst[i] = 0;
}

static void dl__tb_node_def(dl__pb *b, const dl__tbn *nd, const dl__tbn *nodes, const int64_t *ttab,
                            size_t mask)
{
    const dl_tensor *t = nd->t;
    size_t nf = dl__pb_begin(b, 1), a, v, l, s, d;  /* GraphDef.node */
    char dev[32];
    int j;
    dl__pb_str(b, 1, nd->name);
    dl__pb_str(b, 2, nd->op);
    for (j = 0; nd->n && j < nd->n->nin; j++) {
        const dl_tensor *x = nd->n->in[j];
        int64_t k = x ? ttab[dl__tb_tslot(ttab, mask, nodes, x)] : -1;
        if (k < 0 && x && x->node_) k = ttab[dl__tb_tslot(ttab, mask, nodes, x->node_->out)];
        if (k >= 0) dl__pb_str(b, 3, nodes[k].name);
    }
    if (t->device.type == DL_DEVICE_CPU) snprintf(dev, sizeof dev, "/device:CPU:0");
    else snprintf(dev, sizeof dev, "/device:CUDA:%d", t->device.index);
    dl__pb_str(b, 4, dev);
    /* attr map entries {key 1, value 2: AttrValue}, keys in sorted order */
    a = dl__pb_begin(b, 5);
    dl__pb_str(b, 1, "_output_shapes");
    v = dl__pb_begin(b, 2);
    l = dl__pb_begin(b, 1);                 /* AttrValue.list */
    s = dl__pb_begin(b, 7);                 /* ListValue.shape: TensorShapeProto */
    for (j = 0; j < t->ndim; j++) {
        d = dl__pb_begin(b, 2);             /* dim { size } */
        dl__pb_int(b, 1, t->shape[j]);
        dl__pb_end(b, d);
    }
    dl__pb_end(b, s);
    dl__pb_end(b, l);
    dl__pb_end(b, v);
    dl__pb_end(b, a);
    a = dl__pb_begin(b, 5);
    dl__pb_str(b, 1, "dtype");
    v = dl__pb_begin(b, 2);
    dl__pb_int(b, 6, t->dtype == DL_DTYPE_F32 ? 1 : t->dtype == DL_DTYPE_I32 ? 3 : 9);  /* DT_FLOAT/INT32/INT64 */
    dl__pb_end(b, v);
    dl__pb_end(b, a);
    if (t->requires_grad) {
        a = dl__pb_begin(b, 5);
        dl__pb_str(b, 1, "requires_grad");
        v = dl__pb_begin(b, 2);
        dl__pb_int(b, 5, 1);                /* AttrValue.b */
        dl__pb_end(b, v);
        dl__pb_end(b, a);
    }
    if (t->name[0]) {
        size_t len = 0;
        while (len < sizeof t->name && t->name[len]) len++;
        a = dl__pb_begin(b, 5);
        dl__pb_str(b, 1, "tensor_name");
        v = dl__pb_begin(b, 2);
        dl__pb_bytes(b, 2, t->name, len);   /* AttrValue.s */
        dl__pb_end(b, v);
        dl__pb_end(b, a);
    }
    dl__pb_end(b, nf);
}

dl_result dl_summary_graph(dl_summary_writer *w, dl_tensor *root)
{
    const char *fn = "dl_summary_graph";
    dl_ctx *ctx;
    dl__node **ops = NULL, **stack = NULL;
    int64_t nops = 0, capops, sp = 0, nin = 0, nn = 0, i, j;
    dl__tbn *nodes = NULL, **sorted = NULL;
    int64_t *ttab = NULL, *ntab = NULL;
    size_t cap = 1, mask;
    dl__pb *b;
    size_t g, ver;
    dl_result rc = DL_ERR_OOM;
    if (!dl__tb_ok(w)) return DL_ERR_ARG;
    if (!dl__tb_tensor(w, fn, "root", root)) return w->ctx->err != DL_OK ? w->ctx->err : DL_ERR_ARG;
    if ((rc = dl__tb_drain(w, fn)) != DL_OK) return rc;   /* the queued scalars come first */
    rc = DL_ERR_OOM;
    ctx = w->ctx;
    /* the ops behind root: the walk of dl_graph_dot (every node is on this
       step's tape, so ntape bounds them), then in tape order */
    capops = ctx->ntape + 1;
    ops = (dl__node **)DL_MALLOC(sizeof(dl__node *) * (size_t)capops);
    stack = (dl__node **)DL_MALLOC(sizeof(dl__node *) * (size_t)capops);
    if (!ops || !stack) goto oom;
    ctx->visit++;
    if (root->node_) { root->node_->visit = ctx->visit; stack[sp++] = root->node_; }
    while (sp > 0) {
        dl__node *n = stack[--sp];
        if (nops < capops) ops[nops++] = n;
        nin += n->nin;
        for (j = 0; j < n->nin; j++) {
            dl_tensor *x = n->in[j];
            if (x && x->node_ && x->node_->visit != ctx->visit) {
                x->node_->visit = ctx->visit;
                if (sp < capops) stack[sp++] = x->node_;
            }
        }
    }
    if (nops > 1) qsort(ops, (size_t)nops, sizeof *ops, dl__tb_by_id);
    /* nodes: the leaves in order of first use, then the ops */
    while (cap < 2 * (size_t)(nops + nin + 1)) cap *= 2;
    mask = cap - 1;
    nodes = (dl__tbn *)DL_MALLOC(sizeof(dl__tbn) * (size_t)(nops + nin + 1));
    sorted = (dl__tbn **)DL_MALLOC(sizeof(dl__tbn *) * (size_t)(nops + nin + 1));
    ttab = (int64_t *)DL_MALLOC(sizeof(int64_t) * cap);
    ntab = (int64_t *)DL_MALLOC(sizeof(int64_t) * cap);
    if (!nodes || !sorted || !ttab || !ntab) goto oom;
    for (i = 0; i < (int64_t)cap; i++) ttab[i] = ntab[i] = -1;
    for (i = -1; i < nops; i++) {
        int m = i < 0 ? 1 : ops[i]->nin;
        for (j = 0; j < m; j++) {
            dl_tensor *x = i < 0 ? root : ops[i]->in[j];
            size_t h;
            if (!x || x->node_ || (i < 0 && root->node_)) continue;
            h = dl__tb_tslot(ttab, mask, nodes, x);
            if (ttab[h] >= 0) continue;
            memset(&nodes[nn], 0, sizeof nodes[nn]);
            nodes[nn].t = x;
            nodes[nn].op = x->requires_grad ? "Parameter" : x->step_ == 0 ? "Buffer" : "Input";
            nodes[nn].bare = x->name[0] != 0;
            if (x->name[0]) dl__tb_clean(nodes[nn].base, sizeof nodes[nn].base, x->name, sizeof x->name);
            else dl__tb_clean(nodes[nn].base, sizeof nodes[nn].base, nodes[nn].op, 16);
            ttab[h] = nn++;
        }
    }
    for (i = 0; i < nops; i++) {
        dl__tbn *nd = &nodes[nn];
        const char *op = ops[i]->fn && ops[i]->fn->name && ops[i]->fn->name[0] ? ops[i]->fn->name : ops[i]->op->name;
        memset(nd, 0, sizeof *nd);
        nd->t = ops[i]->out;
        nd->n = ops[i];
        dl__tb_clean(nd->base, sizeof nd->base, op, sizeof nd->base);
        nd->op = nd->base;
        ttab[dl__tb_tslot(ttab, mask, nodes, nd->t)] = nn++;
    }
    /* names: a named leaf's own name when free; else <base>_<k>, k counting
       the nodes of that base in order; a clash (rare) adds _<j> */
    for (i = 0; i < nn; i++) { nodes[i].order = i; sorted[i] = &nodes[i]; }
    qsort(sorted, (size_t)nn, sizeof *sorted, dl__tb_by_base);
    for (i = 0; i < nn; i++)
        sorted[i]->k = i > 0 && !strcmp(sorted[i]->base, sorted[i - 1]->base) ? sorted[i - 1]->k + 1 : 0;
    for (i = 0; i < nn; i++)
        if (nodes[i].bare && dl__tb_claim(ntab, mask, nodes, i, nodes[i].base)) nodes[i].k = -1;
    for (i = 0; i < nn; i++) {
        char cand[96];
        int64_t extra;
        if (nodes[i].k < 0) continue;
        snprintf(cand, sizeof cand, "%s_%lld", nodes[i].base, (long long)nodes[i].k);
        for (extra = 1; !dl__tb_claim(ntab, mask, nodes, i, cand); extra++)
            snprintf(cand, sizeof cand, "%s_%lld_%lld", nodes[i].base, (long long)nodes[i].k, (long long)extra);
    }
    b = dl__tb_event(w, 0);
    g = dl__pb_begin(b, 4);                 /* Event.graph_def: GraphDef */
    for (i = 0; i < nn; i++) dl__tb_node_def(b, &nodes[i], nodes, ttab, mask);
    ver = dl__pb_begin(b, 4);               /* versions { producer } */
    dl__pb_int(b, 1, 22);
    dl__pb_end(b, ver);
    dl__pb_end(b, g);
    rc = dl__tb_emit(w, fn);
    goto done;
oom:
    dl__err(ctx, DL_ERR_OOM, "%s: out of memory walking the graph of root %s", fn, dl__sh(root));
done:
    DL_FREE(ops);
    DL_FREE(stack);
    DL_FREE(nodes);
    DL_FREE(sorted);
    DL_FREE(ttab);
    DL_FREE(ntab);
    return rc;
}


// >>section dist: allreduce, communicators, data parallelism
/* In one process, a ring over n devices: the buffer is cut into n segments
   (the first count % n one element longer). Reduce-scatter: in step k
   (k = 0..n-2) rank r sends segment (r - k) mod n to rank r+1, which adds
   it to its own copy, so after n-1 steps rank r holds the finished sum of
   segment r+1, each element summed once, in a fixed order. All-gather: in
   step k rank r sends segment (r + 1 - k) mod n to rank r+1, which
   overwrites its copy. Transfers go through the backends (peer copies, or
   download + upload between two backends) in chunks of DL__RING_CHUNK
   floats into a receive buffer on the destination, which the destination's
   axpy then adds: a chunk is still in cache when it is added. The backends
   queue these calls from this thread, syncing the source device after
   every transfer (the backend contract does not order a peer copy with the
   destination's queue). When every device is a CPU device, all buffers are
   host memory and the two phases fold into one pass on the thread pool
   (dl__direct_allreduce): the same sums in the same order, so the same
   bits, with 2n buffer passes of memory traffic instead of 5(n-1).
   Broadcast from CPU devices runs its copies on the pool. Across processes the same ring runs on a host copy
   of one replica over MPI (nonblocking calls, polled against a deadline),
   or NCCL does it; the local replicas get the result by broadcast. */

#ifdef DL_MPI
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1            /* the C API only, also when compiled as C++ */
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#endif
#ifdef DL_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif
#include <time.h>

#define DL__RING_MAX (DL__MAX_CPU + DL__MAX_CUDA)
#ifndef DL__RING_CHUNK
#define DL__RING_CHUNK ((int64_t)1 << 16)       /* floats per transfer: 256 KB */
#endif

typedef struct dl__ring {
    int n;
    dl__dev *dev[DL__RING_MAX];
    unsigned char *buf[DL__RING_MAX];  /* each rank's data (device pointers) */
    float *tmp[DL__RING_MAX];          /* each rank's receive buffer (reduce-scatter) */
    unsigned char *host[DL__RING_MAX]; /* staging between two backends (NULL: one backend) */
    int64_t count;                     /* elements */
    size_t esize;                      /* bytes per element (4 for reductions) */
    int phase, step, root;             /* phase 0 reduce-scatter, 1 all-gather, 2 scale, 3 broadcast */
    float scale;
    bool par;                          /* every device is a CPU device: ranks on the pool */
} dl__ring;

/* segment s of n over count elements: the first count % n one longer */
static void dl__seg(int64_t count, int n, int s, int64_t *off, int64_t *len)
{
    int64_t q = count / n, rem = count % n;
    *off = (int64_t)s * q + (s < rem ? s : rem);
    *len = q + (s < rem ? 1 : 0);
}

/* bytes from src on sd to dst on dd: a peer copy within one backend, else
   through host memory (host: a staging buffer of at least bytes) */
static void dl__xfer(dl__dev *dd, void *dst, dl__dev *sd, const void *src, size_t bytes, void *host)
{
    if (!bytes) return;
    if (dd->be == sd->be) dd->be->peer(dd, dst, sd, src, bytes);
    else {
        sd->be->download(sd, host, src, bytes);
        dd->be->upload(dd, dst, host, bytes);
    }
    if (dd != sd && dd->be != dl__cpu_be()) sd->be->sync(sd);
}

static void dl__ring_task(void *arg, int64_t lo, int64_t hi)
{
    dl__ring *R = (dl__ring *)arg;
    int64_t r;
    for (r = lo; r < hi; r++) {
        int n = R->n, to = (int)((r + 1) % n), s = 0;
        int64_t off, len, c, m;
        size_t es = R->esize;
        dl__dev *sd = R->dev[r], *dd = R->dev[to];
        if (R->phase == 0) s = (int)((r - R->step + n) % n);
        else if (R->phase == 1) s = (int)((r + 1 - R->step + n) % n);
        else if (R->phase == 2) s = to;
        dl__seg(R->count, R->n, s, &off, &len);
        if (R->phase == 3) {            /* broadcast: every rank copies the root's data */
            if (r == R->root) continue;
            sd = R->dev[R->root];
            dd = R->dev[r];
            for (c = 0; c < R->count; c += DL__RING_CHUNK) {
                m = R->count - c < DL__RING_CHUNK ? R->count - c : DL__RING_CHUNK;
                dl__xfer(dd, R->buf[r] + (size_t)c * es, sd, R->buf[R->root] + (size_t)c * es,
                         (size_t)m * es, R->host[r]);
            }
            continue;
        }
        if (R->phase == 2) {            /* mean: the owner scales its finished segment */
            if (len) sd->be->scale(sd, (float *)(void *)(R->buf[r] + (size_t)off * es), len, R->scale);
            continue;
        }
        for (c = 0; c < len; c += DL__RING_CHUNK) {
            unsigned char *src = R->buf[r] + (size_t)(off + c) * es;
            unsigned char *dst = R->buf[to] + (size_t)(off + c) * es;
            m = len - c < DL__RING_CHUNK ? len - c : DL__RING_CHUNK;
            if (R->phase == 1) dl__xfer(dd, dst, sd, src, (size_t)m * es, R->host[r]);
            else {
                dl__xfer(dd, R->tmp[to], sd, src, (size_t)m * es, R->host[r]);
                dd->be->axpy(dd, (float *)(void *)dst, R->tmp[to], m, 1.0f);
            }
        }
    }
}

static void dl__ring_phase(dl__ring *R, dl__pool *pool, int phase, int step)
{
    int i;
    R->phase = phase;
    R->step = step;
    if (R->par) dl__parallel_for(pool, R->n, 1, dl__ring_task, R);
    else {
        dl__ring_task(R, 0, R->n);
        for (i = 0; i < R->n; i++)
            if (R->dev[i]->be != dl__cpu_be()) R->dev[i]->be->sync(R->dev[i]);
    }
}

/* Receive and staging buffers (step memory of each device, host staging
   only between two backends); false with an error on OOM. */
static bool dl__ring_prepare(dl__ring *R, dl_ctx *ctx, const char *op, bool reduce)
{
    int i;
    int64_t ch = R->count < DL__RING_CHUNK ? R->count : DL__RING_CHUNK;
    size_t bytes = (size_t)(ch > 0 ? ch : 1) * R->esize;
    bool mixed = false;
    R->par = true;
    /* small segments: waking the pool costs more than the copies */
    if ((R->count / R->n) * (int64_t)R->esize < ((int64_t)256 << 10)) R->par = false;
    for (i = 0; i < R->n; i++) {
        if (R->dev[i]->be != dl__cpu_be()) R->par = false;
        if (R->dev[i]->be != R->dev[0]->be) mixed = true;
        R->tmp[i] = NULL;
        R->host[i] = NULL;
    }
    for (i = 0; i < R->n; i++) {
        if (reduce && R->n > 1) {
            R->tmp[i] = (float *)dl__arena_alloc(ctx, &R->dev[i]->data, bytes, true);
            if (!R->tmp[i]) goto oom;
        }
        if (mixed) {
            R->host[i] = (unsigned char *)dl__malloc(ctx, bytes);
            if (!R->host[i]) goto oom;
        }
    }
    return true;
oom:
    for (i = 0; i < R->n; i++) DL_FREE(R->host[i]);
    dl__err(ctx, DL_ERR_OOM, "%s: no memory for the %zu-byte transfer buffers (one per device)", op, bytes);
    return false;
}

static dl_result dl__ring_finish(dl__ring *R, const char *op)
{
    int i;
    dl_result rc = DL_OK;
    for (i = 0; i < R->n; i++) {
        DL_FREE(R->host[i]);
        R->host[i] = NULL;
        if (R->dev[i]->be != dl__cpu_be()) R->dev[i]->be->sync(R->dev[i]);
        if (dl__dev_check(R->dev[i], op) != DL_OK) rc = DL_ERR_DEVICE;
    }
    return rc;
}

/* Every device on the CPU backend: all buffers are host memory, so the
   ring's two phases fold into one pass. A task takes blocks of one
   segment, sums them into a block on its stack in the ring's order (x_s,
   then x_{s+1} + that, ...; times scale), and writes the result to every
   replica: the ring's bits, with n reads and n writes of the buffer against
   the ring's 3(n-1) and 2(n-1), and no barrier between steps. */
#define DL__DIRECT_BLOCK 2048

typedef struct dl__direct {
    const dl__ring *R;
    float *buf[DL__RING_MAX];
    int64_t nb;          /* blocks per segment */
    float scale;
} dl__direct;

/* Segment [off, off + len) of n host buffers: the sum in the ring's order
   from buf[q] (x_q, then x_{q+1} + that, ...; times scale), by blocks on
   the stack, written to every buffer. The fused CPU allreduce runs it per
   block of a segment; DL_COMM_THREADS ranks per segment of each other's
   buffers. */
static void dl__sum_segment(float *const *buf, int n, int q, int64_t off, int64_t len, float scale)
{
    float acc[DL__DIRECT_BLOCK];
    int64_t b, j;
    int i;
    for (b = 0; b < len; b += DL__DIRECT_BLOCK) {
        int64_t m = len - b < DL__DIRECT_BLOCK ? len - b : DL__DIRECT_BLOCK, o = off + b;
        memcpy(acc, buf[q] + o, sizeof(float) * (size_t)m);
        for (i = 1; i < n; i++) {
            const float *DL__RESTRICT x = buf[(q + i) % n] + o;
            float *DL__RESTRICT a = acc;
            for (j = 0; j < m; j++) a[j] = x[j] + a[j];
        }
        if (scale != 1.0f)
            for (j = 0; j < m; j++) acc[j] = acc[j] * scale;
        for (i = 0; i < n; i++) memcpy(buf[i] + o, acc, sizeof(float) * (size_t)m);
    }
}

static void dl__direct_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__direct *D = (const dl__direct *)arg;
    const dl__ring *R = D->R;
    int64_t u;
    for (u = lo; u < hi; u++) {
        int s = (int)(u / D->nb);
        int64_t off, len, b = (u % D->nb) * DL__DIRECT_BLOCK;
        dl__seg(R->count, R->n, s, &off, &len);
        if (b < len) dl__sum_segment(D->buf, R->n, s, off + b, len - b < DL__DIRECT_BLOCK ? len - b : DL__DIRECT_BLOCK,
                                     D->scale);
    }
}

static dl_result dl__direct_allreduce(dl__ring *R, dl_ctx *ctx, const char *op, float scale)
{
    dl__direct D;
    int i;
    int64_t q = R->count / R->n + 1;
    D.R = R;
    D.scale = scale;
    D.nb = (q + DL__DIRECT_BLOCK - 1) / DL__DIRECT_BLOCK;
    for (i = 0; i < R->n; i++) D.buf[i] = (float *)DL__RAW(R->dev[i], R->buf[i]);
    /* 32 blocks (256 KB per buffer) per task at least: below that, waking
       the pool costs more than the copies */
    dl__parallel_for(ctx->pool, D.nb * R->n, 32, dl__direct_task, &D);
    for (i = 0; i < R->n; i++)
        if (dl__dev_check(R->dev[i], op) != DL_OK) return DL_ERR_DEVICE;
    return DL_OK;
}

/* sum over the ring (then * scale, unless scale is 1), in place */
static dl_result dl__ring_allreduce(dl__ring *R, dl_ctx *ctx, const char *op, float scale)
{
    int k;
    R->esize = sizeof(float);
    for (k = 0; k < R->n && R->dev[k]->be == dl__cpu_be(); k++) {}
    if (k == R->n && R->n > 1) return dl__direct_allreduce(R, ctx, op, scale);
    if (!dl__ring_prepare(R, ctx, op, true)) return ctx->err;
    for (k = 0; k + 1 < R->n; k++) dl__ring_phase(R, ctx->pool, 0, k);
    R->scale = scale;
    if (scale != 1.0f) dl__ring_phase(R, ctx->pool, 2, 0);
    for (k = 0; k + 1 < R->n; k++) dl__ring_phase(R, ctx->pool, 1, k);
    return dl__ring_finish(R, op);
}

static dl_result dl__ring_broadcast(dl__ring *R, dl_ctx *ctx, const char *op, int root)
{
    if (!dl__ring_prepare(R, ctx, op, false)) return ctx->err;
    R->root = root;
    if (R->n > 1) dl__ring_phase(R, ctx->pool, 3, 0);
    return dl__ring_finish(R, op);
}

static bool dl__dist_same_shape(const dl_tensor *a, const dl_tensor *b)
{
    int i;
    if (a->ndim != b->ndim) return false;
    for (i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

/* The rules for a list of replicas, checked before any data moves: n in
   1..DL__RING_MAX, no NULL, live, one context, one shape and dtype (float32
   when f32), each on its own device. Fills R (count in elements). */
static dl_result dl__replicas(const char *op, dl_tensor *const *t, int n, bool f32, dl__ring *R)
{
    dl_ctx *ctx = NULL;
    int i, j;
    char d1[32], d2[32];
    for (i = 0; t && i < n && i < DL__RING_MAX && !ctx; i++)
        if (t[i] && t[i]->magic_ == DL__MAGIC) ctx = t[i]->ctx_;
    if (!t) { dl__err(ctx, DL_ERR_ARG, "%s: the tensor list is NULL", op); return DL_ERR_ARG; }
    if (dl__cap_refused(ctx, op, "a collective", "run collectives outside the captured step")) return DL_ERR_UNSUPPORTED;
    if (n < 1 || n > DL__RING_MAX) {
        dl__err(ctx, DL_ERR_ARG, "%s: n=%d tensors; it must be 1..%d (one tensor per device)", op, n,
                DL__RING_MAX);
        return DL_ERR_ARG;
    }
    for (i = 0; i < n; i++) {
        if (!t[i]) {
            dl__err(ctx, DL_ERR_ARG, "%s: t[%d] is NULL; every replica must be a tensor (did the op "
                    "that made it fail?)", op, i);
            return DL_ERR_ARG;
        }
        if (!dl__valid(op, "a replica", t[i])) return ctx ? ctx->err : DL_ERR_STALE;
        if (f32 && !dl__f32(op, "a replica", t[i])) return DL_ERR_DTYPE;
        if (t[i]->ctx_ != ctx) {
            dl__err(ctx, DL_ERR_ARG, "%s: t[%d] belongs to another context than t[0]; replicas "
                    "must share one context (one per process)", op, i);
            return DL_ERR_ARG;
        }
    }
    for (i = 1; i < n; i++) {
        if (t[i]->dtype != t[0]->dtype || !dl__dist_same_shape(t[i], t[0])) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: t[0] %s %s on %s and t[%d] %s %s on %s differ; every "
                    "replica must have the same shape and dtype", op, dl__sh(t[0]),
                    dl__dtype_str(t[0]->dtype), dl__dev_str(t[0]->device, d1, sizeof d1), i,
                    dl__sh(t[i]), dl__dtype_str(t[i]->dtype), dl__dev_str(t[i]->device, d2, sizeof d2));
            return DL_ERR_SHAPE;
        }
        for (j = 0; j < i; j++)
            if (t[j]->dev_ == t[i]->dev_) {
                dl__err(ctx, DL_ERR_DEVICE, "%s: t[%d] and t[%d] are both on %s; one replica per "
                        "device", op, j, i, dl__dev_str(t[i]->device, d1, sizeof d1));
                return DL_ERR_DEVICE;
            }
    }
    R->n = n;
    R->count = t[0]->numel;
    R->esize = dl__esize(t[0]->dtype);
    for (i = 0; i < n; i++) {
        R->dev[i] = t[i]->dev_;
        R->buf[i] = (unsigned char *)t[i]->data;
    }
    return DL_OK;
}

static bool dl__reduce_op_ok(dl_ctx *ctx, const char *op, int rop)
{
    if (rop == DL_REDUCE_SUM || rop == DL_REDUCE_MEAN) return true;
    dl__err(ctx, DL_ERR_ARG, "%s: op=%d is not DL_REDUCE_SUM (0) or DL_REDUCE_MEAN (1)", op, rop);
    return false;
}

dl_result dl_allreduce(dl_tensor *const *t, int n, dl_reduce_op op)
{
    dl__ring R;
    dl_result rc = dl__replicas("dl_allreduce", t, n, true, &R);
    if (rc != DL_OK) return rc;
    if (!dl__reduce_op_ok(t[0]->ctx_, "dl_allreduce", (int)op)) return DL_ERR_ARG;
    return dl__bump_list(dl__ring_allreduce(&R, t[0]->ctx_, "dl_allreduce", op == DL_REDUCE_MEAN ? 1.0f / (float)n : 1.0f),
                         t, n, -1);
}

dl_result dl_broadcast(dl_tensor *const *t, int n, int root)
{
    dl__ring R;
    dl_result rc = dl__replicas("dl_broadcast", t, n, false, &R);
    if (rc != DL_OK) return rc;
    if (root < 0 || root >= n) {
        dl__err(t[0]->ctx_, DL_ERR_ARG, "dl_broadcast: root=%d; it must index the list (0..%d)", root, n - 1);
        return DL_ERR_ARG;
    }
    return dl__bump_list(dl__ring_broadcast(&R, t[0]->ctx_, "dl_broadcast", root), t, n, root);
}

/* ---- communicators */

#define DL__COMM_MAGIC 0xD1C0337u

/* ---- the group of DL_COMM_THREADS: ranks are threads, each with its own
   context. A collective is two meetings: every rank publishes its host
   buffer and count, meets the others, works on its own segment of every
   buffer (the sum over ranks in the ring's order, written to every rank's
   buffer; or the copy from the root), and meets them again; so no buffer
   is read once its owner has passed the second meeting. A rank that misses
   a meeting by `timeout` seconds breaks the group: every rank's call fails. */
#define DL__GROUP_MAGIC 0xD16C0A11u

/* A sum posted without waiting (dl_ddp's buckets during backward): each
   rank posts its buffer and goes on; the last to post reduces the whole
   buffer, in the ring's order segment by segment (the bits of
   dl__grp_collective), and marks it done; each rank waits for it before it
   reads its buffer again. Keyed by (step, bucket): ranks are at most one
   step apart (a rank finishes a step only when every rank has posted all of
   its buckets), so two slots per bucket, by the step's parity, suffice. */
#define DL__GRP_ASYNC 64                 /* buckets that can be in flight */
typedef struct dl__grp_slot {
    uint64_t key;                      /* step * 65536 + bucket + 1; 0: unused */
    int arrived;
    bool done, bad;                    /* bad: the ranks' counts differed */
    float *buf[DL_MAX_THREAD_RANKS];
    int64_t count[DL_MAX_THREAD_RANKS];
} dl__grp_slot;

struct dl_comm_group {
    uint32_t magic;
    int size;
#ifndef DL_NO_THREADS
    pthread_mutex_t mu;
    pthread_cond_t cv;
#endif
    bool joined[DL_MAX_THREAD_RANKS];
    int njoined;
    uint64_t gen;                      /* meetings completed */
    int arrived;                       /* ranks at the current meeting */
    bool broken;
    float *buf[DL_MAX_THREAD_RANKS];   /* each rank's host buffer for the current collective */
    int64_t count[DL_MAX_THREAD_RANKS];
    dl__grp_slot slot[2 * DL__GRP_ASYNC];  /* posted sums: (step parity, bucket) */
};

dl_comm_group *dl_comm_group_new(int size)
{
    dl_comm_group *g;
    if (size < 1 || size > DL_MAX_THREAD_RANKS) {
        dl__err(NULL, DL_ERR_ARG, "dl_comm_group_new: size=%d; it must be 1..%d", size, DL_MAX_THREAD_RANKS);
        return NULL;
    }
    g = (dl_comm_group *)DL_MALLOC(sizeof *g);
    if (!g) { dl__err(NULL, DL_ERR_OOM, "dl_comm_group_new: out of memory"); return NULL; }
    memset(g, 0, sizeof *g);
    g->size = size;
#ifndef DL_NO_THREADS
    if (pthread_mutex_init(&g->mu, NULL) != 0 || pthread_cond_init(&g->cv, NULL) != 0) {
        DL_FREE(g);
        dl__err(NULL, DL_ERR_OOM, "dl_comm_group_new: cannot create the group's mutex");
        return NULL;
    }
#endif
    g->magic = DL__GROUP_MAGIC;
    return g;
}

void dl_comm_group_free(dl_comm_group *g)
{
    if (!g) return;
    if (g->magic != DL__GROUP_MAGIC) {
        dl__err(NULL, DL_ERR_ARG, "dl_comm_group_free: not a group from dl_comm_group_new");
        return;
    }
    if (g->njoined) {
        dl__err(NULL, DL_ERR_ARG, "dl_comm_group_free: %d rank(s) still joined; dl_comm_free each "
                "rank's communicator first", g->njoined);
        return;
    }
#ifndef DL_NO_THREADS
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
#endif
    g->magic = 0;
    DL_FREE(g);
}


struct dl_comm {
    uint32_t magic;
    dl_ctx *ctx;
    dl_comm_backend backend;
    int rank, size;
    double timeout;                   /* seconds */
    bool broken;                      /* a peer timed out or failed: unusable */
    float *hbuf, *htmp;               /* MPI, THREADS: host copy of one replica, receive chunk */
    int64_t hcap;
    dl_comm_group *group;             /* THREADS */
    uint64_t astep;                   /* overlapped backwards so far, of every dl_ddp on it (the
                                         key of the posted sums: the same sequence on every rank) */
#ifdef DL_MPI
    MPI_Comm mpi;
    bool mpi_inited;                  /* dl_comm_init called MPI_Init */
#endif
#ifdef DL_NCCL
    ncclComm_t nccl;
    bool nccl_ok;
    int cuda;                         /* this process's GPU */
    cudaStream_t cstream;             /* dl_ddp's overlapped sums (made by dl_ddp_init) */
    cudaEvent_t cev;                  /* orders them against the device's stream */
    bool cstream_ok;
#endif
};

static void dl__comm_destroy(void *p)
{
    dl_comm *c = (dl_comm *)p;
#ifdef DL_NCCL
    if (c->nccl_ok) {
        if (c->broken) ncclCommAbort(c->nccl);
        else ncclCommDestroy(c->nccl);
    }
    if (c->cstream_ok) {
        cudaStreamDestroy(c->cstream);
        cudaEventDestroy(c->cev);
    }
#endif
    if (c->group) {                   /* THREADS: give the rank back */
        dl_comm_group *g = c->group;
#ifndef DL_NO_THREADS
        pthread_mutex_lock(&g->mu);
#endif
        g->joined[c->rank] = false;
        g->njoined--;
#ifndef DL_NO_THREADS
        pthread_mutex_unlock(&g->mu);
#endif
    }
#ifdef DL_MPI
    if (c->backend != DL_COMM_LOCAL && c->backend != DL_COMM_THREADS && !c->broken) {
        MPI_Comm_free(&c->mpi);
        if (c->mpi_inited) MPI_Finalize();
    }
#endif
    DL_FREE(c->hbuf);
    DL_FREE(c->htmp);
    c->magic = 0;
    DL_FREE(c);
}

/* the code dl__comm_ok's failure recorded (capture: unsupported, a broken
   communicator: device, anything else: arg) */
static dl_result dl__comm_rc(const dl_comm *c)
{
    return c && c->magic == DL__COMM_MAGIC && c->ctx->err != DL_OK ? c->ctx->err : DL_ERR_ARG;
}

static bool dl__comm_ok(dl_comm *c, const char *op)
{
    if (!c || c->magic != DL__COMM_MAGIC) {
        dl__err(NULL, DL_ERR_ARG, "%s: not a communicator from dl_comm_init", op);
        return false;
    }
    if (c->broken) {
        dl__err(c->ctx, DL_ERR_DEVICE, "%s: this communicator failed earlier (a peer died, hung or "
                "returned an error) and cannot be used again", op);
        return false;
    }
    return !dl__cap_refused(c->ctx, op, "a collective", "run collectives outside the captured step");
}

/* seconds: desc, else DL_COMM_TIMEOUT, else 300; -1 with an error when bad */
static double dl__comm_timeout(dl_ctx *ctx, double want)
{
    const char *e = getenv("DL_COMM_TIMEOUT");
    char *end = NULL;
    double v;
    if (want != 0) {
        if (!(want > 0) || want > 1e9) {
            dl__err(ctx, DL_ERR_ARG, "dl_comm_init: timeout=%g; it must be a number of seconds in "
                    "(0, 1e9], or 0 for DL_COMM_TIMEOUT / 300", want);
            return -1;
        }
        return want;
    }
    if (!e || !*e) return 300.0;
    v = strtod(e, &end);
    if (*end || !(v > 0) || v > 1e9) {
        dl__err(ctx, DL_ERR_ARG, "dl_comm_init: DL_COMM_TIMEOUT='%s'; it must be a number of "
                "seconds in (0, 1e9]", e);
        return -1;
    }
    return v;
}

#ifdef DL_MPI
static bool dl__mpi_start(dl_comm *c)
{
    int inited = 0, rc;
    char es[MPI_MAX_ERROR_STRING];
    int el = 0;
    if (MPI_Initialized(&inited) != MPI_SUCCESS) {
        dl__err(c->ctx, DL_ERR_DEVICE, "dl_comm_init: MPI_Initialized failed");
        return false;
    }
    if (!inited) {
        rc = MPI_Init(NULL, NULL);
        if (rc != MPI_SUCCESS) {
            MPI_Error_string(rc, es, &el);
            dl__err(c->ctx, DL_ERR_DEVICE, "dl_comm_init: MPI_Init failed: %s", es);
            return false;
        }
        c->mpi_inited = true;
    }
    if (MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi) != MPI_SUCCESS) {
        dl__err(c->ctx, DL_ERR_DEVICE, "dl_comm_init: MPI_Comm_dup(MPI_COMM_WORLD) failed");
        if (c->mpi_inited) MPI_Finalize();
        return false;
    }
    /* errors come back, no abort (every call on c->mpi is point to point:
       see dl__mpi_bcast) */
    if (MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
        MPI_Comm_rank(c->mpi, &c->rank) != MPI_SUCCESS || MPI_Comm_size(c->mpi, &c->size) != MPI_SUCCESS) {
        dl__err(c->ctx, DL_ERR_DEVICE, "dl_comm_init: MPI_Comm_set_errhandler/rank/size failed");
        MPI_Comm_free(&c->mpi);
        if (c->mpi_inited) MPI_Finalize();
        return false;
    }
    return true;
}

/* Wait for requests, polling against the deadline; false (communicator
   broken, with an error naming the peers) on timeout or an MPI error. */
static bool dl__mpi_wait(dl_comm *c, const char *op, int nrq, MPI_Request *rq, int left, int right)
{
    double t0 = MPI_Wtime();
    long spins = 0;
    MPI_Status st[32];                /* nrq <= 32 */
    for (;;) {
        int done = 0, rc = MPI_Testall(nrq, rq, &done, st), i;
        if (rc != MPI_SUCCESS) {
            char es[MPI_MAX_ERROR_STRING];
            int el = 0, cls = 0;
            for (i = 0; rc == MPI_ERR_IN_STATUS && i < nrq; i++)   /* the request's own error */
                if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING) rc = st[i].MPI_ERROR;
            MPI_Error_string(rc, es, &el);
            MPI_Error_class(rc, &cls);
            c->broken = true;
            dl__err(c->ctx, DL_ERR_DEVICE, "%s: rank %d of %d: MPI error talking to rank %d/%d: %s%s",
                    op, c->rank, c->size, left, right, es, cls == MPI_ERR_TRUNCATE ? " (a message longer "
                    "than this rank expects: the ranks passed different sizes); this communicator cannot "
                    "be used again" : "; this communicator cannot be used again");
            return false;
        }
        if (done) return true;
        if (MPI_Wtime() - t0 > c->timeout) {
            c->broken = true;
            dl__err(c->ctx, DL_ERR_DEVICE, "%s: rank %d of %d waited %.1f s for rank %d or %d "
                    "(timeout: dl_comm_desc.timeout or DL_COMM_TIMEOUT): a rank died or hangs; this "
                    "communicator cannot be used again", op, c->rank, c->size, c->timeout, left, right);
            return false;
        }
        if (++spins > 1000) {          /* past the first microseconds, yield the core */
            struct timespec ts;
            ts.tv_sec = 0;
            ts.tv_nsec = 20000;
            nanosleep(&ts, NULL);
        }
    }
}

/* The ring of the section comment over processes, on a host buffer h, in
   steps: dl__mpi_async_run advances it as far as the messages that have
   arrived allow, or (block) to the end, waiting with the timeout.
   dl__mpi_ring runs it to the end at once; dl_ddp's buckets run one each
   during backward (their own tags and receive buffers), moved along at
   every gradient that backward completes. */
typedef struct dl__mpi_async {
    float *h, *tmp;                   /* the bucket (host); one chunk of the left neighbour's segment */
    int64_t count;
    int tag, k;                       /* k: the ring step (0 .. 2(P-1)) */
    int64_t ci;                       /* its chunk */
    bool inflight;                    /* rq holds the receive and the send of (k, ci) */
    MPI_Request rq[2];
    int64_t ro;                       /* (k, ci)'s received offset, floats, and whether it is added */
    int mr;
    bool add;
    float scale;                      /* times this after the reduce-scatter */
} dl__mpi_async;

/* 1: done, 0: waiting for a message, -1: error (set) */
static int dl__mpi_async_run(dl_comm *c, const char *op, dl__mpi_async *a, bool block)
{
    int P = c->size, me = c->rank, right = (me + 1) % P, left = (me + P - 1) % P;
    int64_t maxseg = (a->count + P - 1) / P, nch = (maxseg + DL__RING_CHUNK - 1) / DL__RING_CHUNK;
    for (;;) {
        int64_t i;
        if (!a->inflight) {
            bool rs;
            int kk, ss, sr, ms;
            int64_t so, sl, rl, c0 = a->ci * DL__RING_CHUNK;
            float *dst;
            if (a->k >= 2 * (P - 1) || nch == 0) return 1;
            rs = a->k < P - 1;
            kk = rs ? a->k : a->k - (P - 1);
            ss = rs ? (me - kk + 2 * P) % P : (me + 1 - kk + 2 * P) % P;
            sr = (ss + P - 1) % P;
            dl__seg(a->count, P, ss, &so, &sl);
            dl__seg(a->count, P, sr, &a->ro, &rl);
            ms = (int)(sl - c0 < 0 ? 0 : (sl - c0 < DL__RING_CHUNK ? sl - c0 : DL__RING_CHUNK));
            a->mr = (int)(rl - c0 < 0 ? 0 : (rl - c0 < DL__RING_CHUNK ? rl - c0 : DL__RING_CHUNK));
            a->ro += c0;
            a->add = rs;
            dst = rs ? a->tmp : a->h + a->ro;
            if (MPI_Irecv(a->mr ? dst : a->tmp, a->mr, MPI_FLOAT, left, a->tag, c->mpi, &a->rq[0]) != MPI_SUCCESS ||
                MPI_Isend(ms ? a->h + so + c0 : a->tmp, ms, MPI_FLOAT, right, a->tag, c->mpi, &a->rq[1]) != MPI_SUCCESS) {
                c->broken = true;
                dl__err(c->ctx, DL_ERR_DEVICE, "%s: rank %d of %d: MPI_Irecv/MPI_Isend failed", op, c->rank, c->size);
                return -1;
            }
            a->inflight = true;
        }
        if (block) {
            if (!dl__mpi_wait(c, op, 2, a->rq, left, right)) return -1;
        } else {
            int done = 0;
            if (MPI_Testall(2, a->rq, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
                c->broken = true;
                dl__err(c->ctx, DL_ERR_DEVICE, "%s: rank %d of %d: MPI error talking to rank %d/%d", op, c->rank,
                        c->size, left, right);
                return -1;
            }
            if (!done) return 0;
        }
        a->inflight = false;
        if (a->add)
            for (i = 0; i < a->mr; i++) a->h[a->ro + i] = a->h[a->ro + i] + a->tmp[i];
        if (++a->ci == nch) {
            a->ci = 0;
            if (a->k == P - 2 && a->scale != 1.0f) {   /* own finished segment: me + 1 */
                int64_t o, l;
                dl__seg(a->count, P, (me + 1) % P, &o, &l);
                for (i = 0; i < l; i++) a->h[o + i] = a->h[o + i] * a->scale;
            }
            a->k++;
        }
    }
}

/* bytes at h from root to every process: a binomial tree of point-to-point
   messages in chunks of 64 MiB. Not MPI_Ibcast: Open MPI reports a failed
   nonblocking collective (a size mismatch: MPI_ERR_TRUNCATE) to
   MPI_COMM_WORLD's handler, which aborts the job; a point-to-point error
   comes back through c->mpi's MPI_ERRORS_RETURN. */
static bool dl__mpi_bcast(dl_comm *c, const char *op, unsigned char *h, size_t bytes, int root)
{
    int P = c->size, vr = (c->rank - root + P) % P, mask, ns, to[32];
    size_t o;
    MPI_Request rq[32];
    for (o = 0; o < bytes; o += (size_t)1 << 26) {
        int m = (int)(bytes - o < ((size_t)1 << 26) ? bytes - o : ((size_t)1 << 26)), from = -1;
        for (mask = 1; mask < P; mask <<= 1)
            if (vr & mask) { from = (vr - mask + root) % P; break; }
        if (from >= 0) {              /* from the parent, then on to the children */
            if (MPI_Irecv(h + o, m, MPI_BYTE, from, 5, c->mpi, &rq[0]) != MPI_SUCCESS) goto fail;
            if (!dl__mpi_wait(c, op, 1, rq, from, from)) return false;
        }
        for (ns = 0, mask >>= 1; mask > 0; mask >>= 1)
            if (vr + mask < P) {
                to[ns] = (vr + mask + root) % P;
                if (MPI_Isend(h + o, m, MPI_BYTE, to[ns], 5, c->mpi, &rq[ns]) != MPI_SUCCESS) goto fail;
                ns++;
            }
        if (ns && !dl__mpi_wait(c, op, ns, rq, to[0], to[ns - 1])) return false;
    }
    return true;
fail:
    c->broken = true;
    dl__err(c->ctx, DL_ERR_DEVICE, "%s: rank %d of %d: MPI_Isend/MPI_Irecv failed", op, c->rank, c->size);
    return false;
}

/* the whole ring at once (c->htmp: its receive chunk) */
static bool dl__mpi_ring(dl_comm *c, const char *op, float *h, int64_t count, float scale)
{
    dl__mpi_async a;
    int64_t i;
    memset(&a, 0, sizeof a);
    a.h = h;
    a.tmp = c->htmp;
    a.count = count;
    a.tag = 7;
    a.scale = scale;
    if (dl__mpi_async_run(c, op, &a, true) < 0) return false;
    if (c->size == 1 && scale != 1.0f)
        for (i = 0; i < count; i++) h[i] = h[i] * scale;
    return true;
}
#endif

/* host buffers for count floats (MPI) */
static DL__UNUSED bool dl__comm_host(dl_comm *c, const char *op, int64_t count)
{
    if (count <= c->hcap) return true;
    DL_FREE(c->hbuf);
    if (!c->htmp) c->htmp = (float *)dl__malloc(c->ctx, sizeof(float) * (size_t)DL__RING_CHUNK);
    c->hbuf = (float *)dl__malloc(c->ctx, sizeof(float) * (size_t)count);
    c->hcap = c->hbuf ? count : 0;
    if (c->hbuf && c->htmp) return true;
    dl__err(c->ctx, DL_ERR_OOM, "%s: no host memory for a %lld-float staging buffer", op, (long long)count);
    return false;
}

#ifndef DL_NO_THREADS
/* now + the communicator's timeout, for pthread_cond_timedwait */
static void dl__grp_deadline(const dl_comm *c, struct timespec *until)
{
#if defined(CLOCK_REALTIME)
    clock_gettime(CLOCK_REALTIME, until);
#else                                   /* a strict C99 unit that included headers first: whole seconds */
    until->tv_sec = time(NULL);
    until->tv_nsec = 0;
#endif
    until->tv_sec += (time_t)c->timeout;
    until->tv_nsec += (long)((c->timeout - (double)(int64_t)c->timeout) * 1e9);
    if (until->tv_nsec >= 1000000000L) { until->tv_sec++; until->tv_nsec -= 1000000000L; }
}

/* a rank missed `what` by the timeout: the group is broken; false with the error */
static bool dl__grp_timed_out(dl_comm *c, const char *op, const char *what)
{
    c->broken = true;
    dl__err(c->ctx, DL_ERR_DEVICE, "%s: rank %d of %d (threads) waited up to %.1f s for %s: a rank died, hangs, "
            "or failed (the group is broken)", op, c->rank, c->size, c->timeout, what);
    return false;
}
#else
static bool dl__grp_no_threads(dl_comm *c, const char *op)
{
    dl__err(c->ctx, DL_ERR_UNSUPPORTED, "%s: DL_COMM_THREADS needs threads (built with DL_NO_THREADS)", op);
    return false;
}
#endif

/* THREADS: meet the other ranks (every rank's call makes one); false with
   the error when the group is or becomes broken (a rank missed the meeting
   by c->timeout seconds, or failed) */
static bool dl__grp_meet(dl_comm *c, const char *op)
{
#ifndef DL_NO_THREADS
    dl_comm_group *g = c->group;
    struct timespec until;
    uint64_t gen;
    bool ok;
    dl__grp_deadline(c, &until);
    pthread_mutex_lock(&g->mu);
    gen = g->gen;
    if (!g->broken && ++g->arrived == g->size) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    }
    while (g->gen == gen && !g->broken)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT && g->gen == gen) {
            g->broken = true;
            pthread_cond_broadcast(&g->cv);
        }
    ok = g->gen != gen;
    pthread_mutex_unlock(&g->mu);
    return ok || dl__grp_timed_out(c, op, "the other ranks");
#else
    return dl__grp_no_threads(c, op);
#endif
}

/* THREADS: buf (count floats of host memory, the same count on every rank)
   = the sum over ranks * scale (op 0), or = root's buf (op 1; bytes in
   count) */
static bool dl__grp_collective(dl_comm *c, const char *op, float *buf, int64_t count, float scale, int bcast,
                               int root)
{
    dl_comm_group *g = c->group;
    int r = c->rank, n = c->size, j;
    g->buf[r] = buf;
    g->count[r] = count;
    if (!dl__grp_meet(c, op)) return false;
    for (j = 0; j < n; j++)
        if (g->count[j] != count) {
            /* every rank sees the same mismatch and fails the same way; the
               second meeting keeps the buffers alive until all have looked */
            dl__grp_meet(c, op);
            c->broken = true;
            dl__err(c->ctx, DL_ERR_SHAPE, "%s: rank %d passed %lld %s, rank %d %lld; every rank must pass the "
                    "same shapes", op, r, (long long)count, bcast ? "bytes" : "floats", j, (long long)g->count[j]);
            return false;
        }
    if (bcast) {
        if (r != root && count) memcpy(buf, g->buf[root], (size_t)count);
    } else {
        int64_t off, len;
        dl__seg(count, n, r, &off, &len);
        dl__sum_segment(g->buf, n, r, off, len, scale);   /* the ring's order: x_r, then x_{r+1} + that, ... */
    }
    return dl__grp_meet(c, op);
}

/* THREADS, without waiting: post buf (count floats of host memory) as this
   rank's part of sum number `bucket` of step `step` (see dl__grp_slot);
   the last rank to post reduces it for all. buf must stay untouched until
   dl__grp_wait. */
static bool dl__grp_post(dl_comm *c, const char *op, uint64_t step, int bucket, float *buf, int64_t count)
{
#ifndef DL_NO_THREADS
    dl_comm_group *g = c->group;
    dl__grp_slot *sl = &g->slot[(step & 1) * DL__GRP_ASYNC + (uint64_t)bucket];
    uint64_t key = step * 65536u + (uint64_t)bucket + 1u;
    int r = c->rank, n = c->size, j, q;
    bool last, bad = false, broken;
    pthread_mutex_lock(&g->mu);
    broken = g->broken;
    if (sl->key != key) {
        sl->key = key;
        sl->arrived = 0;
        sl->done = sl->bad = false;
    }
    sl->buf[r] = buf;
    sl->count[r] = count;
    last = ++sl->arrived == n;
    pthread_mutex_unlock(&g->mu);
    if (broken) {
        c->broken = true;
        dl__err(c->ctx, DL_ERR_DEVICE, "%s: the thread group is broken (a rank timed out or failed)", op);
        return false;
    }
    if (!last) return true;
    for (j = 0; j < n; j++) bad = bad || sl->count[j] != count;
    for (q = 0; q < n && !bad; q++) {             /* segment q: the ring's order from rank q */
        int64_t off, len;
        dl__seg(count, n, q, &off, &len);
        dl__sum_segment(sl->buf, n, q, off, len, 1.0f);
    }
    pthread_mutex_lock(&g->mu);
    sl->done = true;
    sl->bad = bad;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return true;
#else
    (void)step; (void)bucket; (void)buf; (void)count;
    return dl__grp_no_threads(c, op);
#endif
}

/* THREADS: wait until sum `bucket` of step `step` is done (every rank posted
   it and the last reduced it); false with the error on a timeout (the group
   is then broken) or when the ranks posted different counts */
static bool dl__grp_wait(dl_comm *c, const char *op, uint64_t step, int bucket)
{
#ifndef DL_NO_THREADS
    dl_comm_group *g = c->group;
    dl__grp_slot *sl = &g->slot[(step & 1) * DL__GRP_ASYNC + (uint64_t)bucket];
    uint64_t key = step * 65536u + (uint64_t)bucket + 1u;
    struct timespec until;
    bool ok, bad;
    int j = 0;
    dl__grp_deadline(c, &until);
    pthread_mutex_lock(&g->mu);
    while (!(sl->key == key && sl->done) && !g->broken)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT && !(sl->key == key && sl->done)) {
            g->broken = true;
            pthread_cond_broadcast(&g->cv);
        }
    ok = sl->key == key && sl->done;
    bad = ok && sl->bad;
    if (bad)
        while (j < c->size && sl->count[j] == sl->count[c->rank]) j++;
    pthread_mutex_unlock(&g->mu);
    if (bad) {
        c->broken = true;
        dl__err(c->ctx, DL_ERR_SHAPE, "%s: rank %d posted %lld floats for bucket %d, rank %d %lld; every rank "
                "must pass the same shapes", op, c->rank, (long long)sl->count[c->rank], bucket, j,
                (long long)(j < c->size ? sl->count[j] : 0));
        return false;
    }
    return ok || dl__grp_timed_out(c, op, "the other ranks' gradients");
#else
    (void)step; (void)bucket;
    return dl__grp_no_threads(c, op);
#endif
}

/* across processes: buf (count floats on d) = sum over processes * scale */
static dl_result dl__comm_cross(dl_comm *c, const char *op, dl__dev *d, float *buf, int64_t count, float scale)
{
    if (c->size == 1 || count == 0) {
        if (scale != 1.0f && count) d->be->scale(d, buf, count, scale);
        return dl__dev_check(d, op);
    }
#ifdef DL_NCCL
    if (c->backend == DL_COMM_NCCL) {
        ncclResult_t nr;
        d->be->sync(d);
        cudaSetDevice(c->cuda);
        nr = ncclAllReduce(buf, buf, (size_t)count, ncclFloat, ncclSum, c->nccl, 0);
        if (nr == ncclSuccess && cudaStreamSynchronize(0) != cudaSuccess) nr = ncclUnhandledCudaError;
        if (nr != ncclSuccess) {
            c->broken = true;
            dl__err(c->ctx, DL_ERR_DEVICE, "%s: ncclAllReduce failed: %s", op, ncclGetErrorString(nr));
            return DL_ERR_DEVICE;
        }
        if (scale != 1.0f) d->be->scale(d, buf, count, scale);
        return dl__dev_check(d, op);
    }
#endif
    if (c->backend == DL_COMM_THREADS) {
        if (d->be == dl__cpu_be())   /* host memory: the ranks read and write it in place */
            return dl__grp_collective(c, op, (float *)DL__RAW(d, buf), count, scale, 0, 0) ? DL_OK : c->ctx->err;
        if (!dl__comm_host(c, op, count)) return DL_ERR_OOM;
        d->be->download(d, c->hbuf, buf, sizeof(float) * (size_t)count);
        if (!dl__grp_collective(c, op, c->hbuf, count, scale, 0, 0)) return c->ctx->err;
        d->be->upload(d, buf, c->hbuf, sizeof(float) * (size_t)count);
        return dl__dev_check(d, op);
    }
#ifdef DL_MPI
    if (d->be == dl__cpu_be()) {   /* host memory: the ring runs on it in place */
        if (!c->htmp && !(c->htmp = (float *)dl__malloc(c->ctx, sizeof(float) * (size_t)DL__RING_CHUNK))) {
            dl__err(c->ctx, DL_ERR_OOM, "%s: no host memory for the ring's receive buffer", op);
            return DL_ERR_OOM;
        }
        return dl__mpi_ring(c, op, (float *)DL__RAW(d, buf), count, scale) ? DL_OK : DL_ERR_DEVICE;
    }
    if (!dl__comm_host(c, op, count)) return DL_ERR_OOM;
    d->be->download(d, c->hbuf, buf, sizeof(float) * (size_t)count);
    if (!dl__mpi_ring(c, op, c->hbuf, count, scale)) return DL_ERR_DEVICE;
    d->be->upload(d, buf, c->hbuf, sizeof(float) * (size_t)count);
    return dl__dev_check(d, op);
#else
    (void)buf;
    dl__err(c->ctx, DL_ERR_UNSUPPORTED, "%s: no cross-process backend in this build", op);
    return DL_ERR_UNSUPPORTED;
#endif
}

/* v[0..n) (host floats) summed over the processes in place, through a step
   tensor on d (NCCL sums device memory only): the small agreements of
   dl_ddp_init, the collectives' size check and dl_ddp's gradient flags */
static dl_result dl__comm_sum_floats(dl_comm *c, const char *op, dl__dev *d, float *v, int64_t n)
{
    dl_tensor *vt = dl__make(d, op, DL_DTYPE_F32, 1, &n, false, NULL);
    dl_result rc;
    if (!vt) return c->ctx->err != DL_OK ? c->ctx->err : DL_ERR_OOM;
    d->be->upload(d, vt->data, v, sizeof(float) * (size_t)n);
    rc = dl__comm_cross(c, op, d, (float *)vt->data, n, 1.0f);
    if (rc == DL_OK) d->be->download(d, v, vt->data, sizeof(float) * (size_t)n);
    return rc;
}

dl_comm *dl_comm_init(dl_ctx *ctx, const dl_comm_desc *desc)
{
    dl_comm *c;
    dl_comm_desc d;
    if (!ctx) { dl__err(NULL, DL_ERR_ARG, "dl_comm_init: ctx is NULL"); return NULL; }
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (d.backend != DL_COMM_LOCAL && d.backend != DL_COMM_MPI && d.backend != DL_COMM_NCCL &&
        d.backend != DL_COMM_THREADS) {
        dl__err(ctx, DL_ERR_ARG, "dl_comm_init: backend=%d is not DL_COMM_LOCAL (0), DL_COMM_MPI (1), "
                "DL_COMM_NCCL (2) or DL_COMM_THREADS (3)", (int)d.backend);
        return NULL;
    }
    if (d.backend == DL_COMM_THREADS) {
        if (!d.group || d.group->magic != DL__GROUP_MAGIC) {
            dl__err(ctx, DL_ERR_ARG, "dl_comm_init: DL_COMM_THREADS needs .group from dl_comm_group_new "
                    "(got %s)", d.group ? "a freed or foreign pointer" : "NULL");
            return NULL;
        }
        if (d.rank < 0 || d.rank >= d.group->size) {
            dl__err(ctx, DL_ERR_ARG, "dl_comm_init: rank=%d; the group has ranks 0..%d", d.rank,
                    d.group->size - 1);
            return NULL;
        }
#ifdef DL_NO_THREADS
        dl__err(ctx, DL_ERR_UNSUPPORTED, "dl_comm_init: DL_COMM_THREADS needs threads (built with DL_NO_THREADS)");
        return NULL;
#endif
    }
    {
        const char *need = NULL;          /* a backend this build lacks */
#ifndef DL_MPI
        if (d.backend == DL_COMM_MPI)
            need = "DL_COMM_MPI needs dl.h built with -DDL_MPI (compile with mpicc -DDL_MPI, launch with mpirun)";
#endif
#ifndef DL_NCCL
        if (d.backend == DL_COMM_NCCL)
            need = "DL_COMM_NCCL needs dl.h built with -DDL_NCCL and DL_CUDA (nvcc, link -lnccl -lcudart)";
#endif
        if (need) {
            dl__err(ctx, DL_ERR_UNSUPPORTED, "dl_comm_init: %s", need);
            return NULL;
        }
    }
    c = (dl_comm *)dl__malloc(ctx, sizeof(dl_comm));
    if (!c) { dl__err(ctx, DL_ERR_OOM, "dl_comm_init: out of memory"); return NULL; }
    memset(c, 0, sizeof *c);
    c->ctx = ctx;
    c->backend = d.backend;
    c->size = 1;
    c->timeout = dl__comm_timeout(ctx, d.timeout);
    if (c->timeout < 0) { DL_FREE(c); return NULL; }
    if (d.backend == DL_COMM_THREADS) {   /* take the rank */
        dl_comm_group *g = d.group;
        bool taken;
#ifndef DL_NO_THREADS
        pthread_mutex_lock(&g->mu);
#endif
        taken = g->joined[d.rank];
        if (!taken) {
            g->joined[d.rank] = true;
            g->njoined++;
        }
#ifndef DL_NO_THREADS
        pthread_mutex_unlock(&g->mu);
#endif
        if (taken) {
            DL_FREE(c);
            dl__err(ctx, DL_ERR_ARG, "dl_comm_init: rank %d of the group is already taken (each rank joins "
                    "once)", d.rank);
            return NULL;
        }
        c->group = g;
        c->rank = d.rank;
        c->size = g->size;
    }
#ifdef DL_MPI
    if (d.backend != DL_COMM_LOCAL && d.backend != DL_COMM_THREADS && !dl__mpi_start(c)) { DL_FREE(c); return NULL; }
#endif
#ifdef DL_NCCL
    if (d.backend == DL_COMM_NCCL) {
        ncclUniqueId id;
        ncclResult_t nr = ncclSuccess;
        int ngpu = 0;
        if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) {
            dl__err(ctx, DL_ERR_DEVICE, "dl_comm_init: DL_COMM_NCCL: no CUDA device (%s)",
                    cudaGetErrorString(cudaGetLastError()));
            c->broken = true;
            dl__comm_destroy(c);
            return NULL;
        }
        c->cuda = d.device.type == DL_DEVICE_CUDA ? d.device.index : c->rank % ngpu;
        if (c->rank == 0) nr = ncclGetUniqueId(&id);
#ifdef DL_MPI
        if (!dl__mpi_bcast(c, "dl_comm_init", (unsigned char *)&id, sizeof id, 0)) {
            dl__comm_destroy(c);
            return NULL;
        }
#endif
        cudaSetDevice(c->cuda);
        if (nr == ncclSuccess) nr = ncclCommInitRank(&c->nccl, c->size, id, c->rank);
        if (nr != ncclSuccess) {
            dl__err(ctx, DL_ERR_DEVICE, "dl_comm_init: NCCL rank %d of %d on cuda:%d: %s", c->rank,
                    c->size, c->cuda, ncclGetErrorString(nr));
            dl__comm_destroy(c);
            return NULL;
        }
        c->nccl_ok = true;
    }
#endif
    c->magic = DL__COMM_MAGIC;
    if (!dl__own(ctx, dl__comm_destroy, c)) { dl__comm_destroy(c); return NULL; }
    return c;
}

int dl_comm_rank(const dl_comm *c) { return c && c->magic == DL__COMM_MAGIC ? c->rank : 0; }
int dl_comm_size(const dl_comm *c) { return c && c->magic == DL__COMM_MAGIC ? c->size : 1; }

void dl_comm_free(dl_comm *c)
{
    if (c && c->magic == DL__COMM_MAGIC) dl__disown(c->ctx, c);
}

/* local ring, then across processes on replica 0, then back to the others */
static dl_result dl__comm_allreduce(dl_comm *c, const char *op, dl__ring *R, dl_ctx *ctx, float scale)
{
    dl_result rc;
    int size = c ? c->size : 1;
    rc = dl__ring_allreduce(R, ctx, op, size == 1 ? scale : 1.0f);
    if (rc != DL_OK || size == 1) return rc;
    rc = dl__comm_cross(c, op, R->dev[0], (float *)(void *)R->buf[0], R->count, scale);
    if (rc != DL_OK) return rc;
    return dl__ring_broadcast(R, ctx, op, 0);
}

/* the checks of the communicator calls: a live communicator (or NULL),
   then dl__replicas */
/* Every process passes the same number of elements of the same size and
   the same number of local replicas (one small sum of each one's numbers,
   which every process then reads the same way): else DL_ERR_SHAPE on all
   of them, before any data moves. A shorter message would otherwise
   complete on the receiving side with the rest of its buffer stale, and
   unlike replica counts scale a MEAN wrongly. */
static dl_result dl__comm_same_count(dl_comm *c, const char *op, const dl__ring *R, dl_ctx *ctx)
{
    int64_t P = c->size, k = 3 * P, r;
    uint64_t bytes = (uint64_t)R->count * R->esize;
    float *v;
    dl_result rc;
    if (P <= 1) return DL_OK;
    v = (float *)dl__malloc(ctx, sizeof(float) * (size_t)k);
    if (!v) return ctx->err != DL_OK ? ctx->err : DL_ERR_OOM;
    memset(v, 0, sizeof(float) * (size_t)k);
    v[3 * c->rank] = (float)(bytes >> 24);          /* 24 bits a float: exact */
    v[3 * c->rank + 1] = (float)(bytes & 0xFFFFFF);
    v[3 * c->rank + 2] = (float)R->n;
    rc = dl__comm_sum_floats(c, op, R->dev[0], v, k);
    if (rc == DL_OK) {
        for (r = 0; r < P; r++) {
            uint64_t b = (uint64_t)v[3 * r] << 24 | (uint64_t)v[3 * r + 1];
            if (b != bytes || (int)v[3 * r + 2] != R->n) {
                dl__err(ctx, DL_ERR_SHAPE, "%s: process %d passed %llu bytes in %d replica%s, process %lld %llu "
                        "bytes in %d; every process must pass the same shapes and number of tensors", op,
                        c->rank, (unsigned long long)bytes, R->n, R->n == 1 ? "" : "s", (long long)r,
                        (unsigned long long)b, (int)v[3 * r + 2]);
                rc = DL_ERR_SHAPE;
                break;
            }
        }
    }
    DL_FREE(v);
    return rc;
}

static dl_result dl__comm_replicas(dl_comm *c, const char *op, dl_tensor *const *t, int n, bool f32, dl__ring *R)
{
    dl_result rc;
    if (c && !dl__comm_ok(c, op)) return dl__comm_rc(c);
    rc = dl__replicas(op, t, n, f32, R);
    return rc == DL_OK && c ? dl__comm_same_count(c, op, R, t[0]->ctx_) : rc;
}

dl_result dl_comm_allreduce(dl_comm *c, dl_tensor *const *t, int n, dl_reduce_op op)
{
    dl__ring R;
    dl_result rc = dl__comm_replicas(c, "dl_comm_allreduce", t, n, true, &R);
    if (rc != DL_OK) return rc;
    if (!dl__reduce_op_ok(t[0]->ctx_, "dl_comm_allreduce", (int)op)) return DL_ERR_ARG;
    rc = dl__comm_allreduce(c, "dl_comm_allreduce", &R, t[0]->ctx_,
                            op == DL_REDUCE_MEAN ? 1.0f / ((float)n * (float)dl_comm_size(c)) : 1.0f);
    return dl__bump_list(rc, t, n, -1);
}

static dl_result dl__comm_bcast(dl_comm *c, const char *op, dl__ring *R, dl_ctx *ctx, int root)
{
    (void)root;
    if (c && c->size > 1 && c->backend == DL_COMM_THREADS) {
        size_t bytes = (size_t)R->count * R->esize;
        if (!dl__comm_host(c, op, (int64_t)((bytes + 3) / 4))) return DL_ERR_OOM;
        if (c->rank == root) R->dev[0]->be->download(R->dev[0], c->hbuf, R->buf[0], bytes);
        if (!dl__grp_collective(c, op, c->hbuf, (int64_t)bytes, 1.0f, 1, root)) return ctx->err;
        if (c->rank != root) R->dev[0]->be->upload(R->dev[0], R->buf[0], c->hbuf, bytes);
        if (dl__dev_check(R->dev[0], op) != DL_OK) return DL_ERR_DEVICE;
    } else if (c && c->size > 1) {
#ifdef DL_NCCL
        if (c->backend == DL_COMM_NCCL) {
            ncclResult_t nr;
            R->dev[0]->be->sync(R->dev[0]);
            cudaSetDevice(c->cuda);
            nr = ncclBroadcast(R->buf[0], R->buf[0], (size_t)R->count * R->esize, ncclChar, root, c->nccl, 0);
            if (nr == ncclSuccess && cudaStreamSynchronize(0) != cudaSuccess) nr = ncclUnhandledCudaError;
            if (nr != ncclSuccess) {
                c->broken = true;
                dl__err(ctx, DL_ERR_DEVICE, "%s: ncclBroadcast failed: %s", op, ncclGetErrorString(nr));
                return DL_ERR_DEVICE;
            }
        } else
#endif
        {
#ifdef DL_MPI
            size_t bytes = (size_t)R->count * R->esize;
            if (!dl__comm_host(c, op, (int64_t)((bytes + 3) / 4))) return DL_ERR_OOM;
            if (c->rank == root) R->dev[0]->be->download(R->dev[0], c->hbuf, R->buf[0], bytes);
            if (!dl__mpi_bcast(c, op, (unsigned char *)c->hbuf, bytes, root)) return DL_ERR_DEVICE;
            if (c->rank != root) R->dev[0]->be->upload(R->dev[0], R->buf[0], c->hbuf, bytes);
            if (dl__dev_check(R->dev[0], op) != DL_OK) return DL_ERR_DEVICE;
#endif
        }
    }
    return dl__ring_broadcast(R, ctx, op, 0);
}

dl_result dl_comm_broadcast(dl_comm *c, dl_tensor *const *t, int n, int root)
{
    dl__ring R;
    dl_result rc = dl__comm_replicas(c, "dl_comm_broadcast", t, n, false, &R);
    if (rc != DL_OK) return rc;
    if (root < 0 || root >= dl_comm_size(c)) {
        dl__err(t[0]->ctx_, DL_ERR_ARG, "dl_comm_broadcast: root=%d; it must be a process rank "
                "(0..%d)", root, dl_comm_size(c) - 1);
        return DL_ERR_ARG;
    }
    rc = dl__comm_bcast(c, "dl_comm_broadcast", &R, t[0]->ctx_, root);
    return dl__bump_list(rc, t, n, dl_comm_rank(c) == root ? 0 : -1);
}

dl_result dl_comm_barrier(dl_comm *c)
{
    if (!dl__comm_ok(c, "dl_comm_barrier")) return dl__comm_rc(c);
    if (dl_sync(c->ctx) != DL_OK) return c->ctx->err;
    if (c->backend == DL_COMM_THREADS && c->size > 1)
        return dl__grp_meet(c, "dl_comm_barrier") ? DL_OK : c->ctx->err;
#ifdef DL_MPI
    if (c->backend != DL_COMM_LOCAL && c->size > 1) {
        /* a one-float sum around the ring (not MPI_Ibarrier: see dl__mpi_bcast):
           no rank's last message can leave before every rank has come */
        float one = 1.0f;
        if (!dl__comm_host(c, "dl_comm_barrier", 1)) return DL_ERR_OOM;
        if (!dl__mpi_ring(c, "dl_comm_barrier", &one, 1, 1.0f)) return DL_ERR_DEVICE;
    }
#endif
    return DL_OK;
}

/* ---- data parallelism */

#define DL__DDP_MAGIC 0xDD9A11E1u

struct dl_ddp {
    uint32_t magic;
    dl_ctx *ctx;
    dl_comm *comm;
    int n, np;                        /* local replicas, parameters per replica */
    dl_module **m;
    dl_optim **o;
    dl_tensor **p;                    /* p[i * np + j]: replica i's parameter j */
    dl_tensor **flat;                 /* replica i's gradient bucket (persistent) */
    float *w;                         /* replica i's weight in the next gradient sum */
    float *sum;                       /* dl_ddp_check: 2 * np checksums */
    int64_t total, bucket;            /* parameter elements; bucket elements */
    /* overlap (one local replica per process or thread rank, MPI or
       THREADS): a bucket's sum starts from backward's ready hook as soon as
       its last gradient is complete, and is finished after backward */
    bool overlap;
    int nb;                           /* buckets */
    int64_t *pos;                     /* parameter j's first element in the flat order */
    int *bneed, *bleft;               /* per bucket: parameters overlapping it; still to come */
    bool *bposted, *bdone;
    float *hflat;                     /* host: every bucket (total floats) */
    uint64_t astep;                   /* this step's key of the posted sums: comm->astep's count */
    int early;                        /* buckets posted during the last backward */
#if defined(DL_NCCL) && defined(DL_CUDA)
    dl_tensor *dflat;                 /* NCCL: every bucket, on the replica's GPU */
#endif
#ifdef DL_MPI
    dl__mpi_async *am;                /* MPI: each bucket's ring */
    float *atmp;                      /* MPI: their receive buffers */
    int64_t atmpn;                    /* floats of each */
#endif
};

static void dl__ddp_destroy(void *v)
{
    dl_ddp *dp = (dl_ddp *)v;
    int i;
    for (i = 0; dp->flat && i < dp->n; i++) dl_free(dp->flat[i]);
    DL_FREE(dp->m);
    DL_FREE(dp->o);
    DL_FREE(dp->p);
    DL_FREE(dp->flat);
    DL_FREE(dp->w);
    DL_FREE(dp->sum);
    DL_FREE(dp->pos);
    DL_FREE(dp->bneed);
    DL_FREE(dp->bleft);
    DL_FREE(dp->bposted);
    DL_FREE(dp->bdone);
    DL_FREE(dp->hflat);
#if defined(DL_NCCL) && defined(DL_CUDA)
    dl_free(dp->dflat);
#endif
#ifdef DL_MPI
    DL_FREE(dp->am);
    DL_FREE(dp->atmp);
#endif
    dp->magic = 0;
    DL_FREE(dp);
}

/* the code dl__ddp_ok's failure recorded (a capture: unsupported) */
static dl_result dl__ddp_rc(const dl_ddp *dp)
{
    return dp && dp->magic == DL__DDP_MAGIC && dp->ctx->err != DL_OK ? dp->ctx->err : DL_ERR_ARG;
}

static bool dl__ddp_ok(dl_ddp *dp, const char *op)
{
    if (dp && dp->magic == DL__DDP_MAGIC) return !dl__cap_refused(dp->ctx, op, "a collective", "run collectives outside the captured step");
    dl__err(NULL, DL_ERR_ARG, "%s: not a dl_ddp from dl_ddp_init", op);
    return false;
}

/* replica i's device (that of its first parameter) */
static dl__dev *dl__ddp_dev(const dl_ddp *dp, int i) { return dp->p[(size_t)i * (size_t)dp->np]->dev_; }

/* n bytes at buf from root to every process through a step tensor on d (so
   that every backend's broadcast takes it: NCCL's needs device memory) */
static dl_result dl__comm_bytes(dl_comm *c, const char *op, dl__dev *d, int root, void *buf, int64_t n)
{
    int64_t words = (n + 3) / 4;
    dl_tensor *t = dl__make(d, op, DL_DTYPE_I32, 1, &words, false, NULL);
    dl__ring R;
    dl_result rc;
    if (!t) return c->ctx->err;
    if (c->rank == root && n) d->be->upload(d, t->data, buf, (size_t)n);
    memset(&R, 0, sizeof R);
    R.n = 1;
    R.count = words;
    R.esize = 4;
    R.dev[0] = d;
    R.buf[0] = (unsigned char *)t->data;
    rc = dl__comm_bcast(c, op, &R, c->ctx, root);
    if (rc == DL_OK && c->rank != root && n) d->be->download(d, buf, t->data, (size_t)n);
    return rc == DL_OK ? dl__dev_check(d, op) : rc;
}

/* entry k of a list of NUL-terminated entries (n bytes); NULL past its end */
static const char *dl__entry(const char *s, size_t n, int64_t k)
{
    size_t i = 0;
    int64_t e;
    for (e = 0; i < n; e++) {
        if (e == k) return s + i;
        i += strlen(s + i) + 1;
    }
    return NULL;
}

/* Every process must hold the same model, as PyTorch's DDP verifies at
   construction: replica 0's state_dict (name, dtype, shape, parameter or
   buffer of each entry, in order) against process 0's. Process 0's list
   goes to all (its length first: no process receives more than it
   expects); each finds its first difference; a sum over the processes
   tells every one which differ; the first of those sends its entry; then
   every process fails with the same message, before any broadcast or
   gradient sum could pair unlike tensors. */
static dl_result dl__ddp_same_model(dl_comm *c, dl_module *m, dl__dev *d)
{
    static const char *op = "dl_ddp_init";
    dl_ctx *ctx = c->ctx;
    const dl_named_tensor *sd;
    dl__sb mine;
    char *s0 = NULL, *theirs = NULL;
    const char *a, *b;
    uint64_t len0, lent;
    int64_t n = dl_module_state_dict(m, &sd), i, k, diff = 0, P = c->size;
    size_t ia = 0, ib = 0;
    int r, first = -1, ndiff = 0;
    float *v = NULL;
    dl_result rc;
    if (n < 0) return ctx->err;
    memset(&mine, 0, sizeof mine);
    dl__sb_put(&mine, "", 0);               /* allocated even when empty */
    for (i = 0; i < n; i++) {
        dl__sbf(&mine, "'%s' %s %s %s", sd[i].name, dl__dtype_str(sd[i].t->dtype), dl__sh(sd[i].t),
                sd[i].is_buffer ? "buffer" : "parameter");
        dl__sb_put(&mine, "", 1);           /* the entry's NUL */
    }
    if (mine.oom || !(v = (float *)dl__malloc(ctx, sizeof(float) * (size_t)P))) goto oom;
    len0 = mine.n;
    rc = dl__comm_bytes(c, op, d, 0, &len0, (int64_t)sizeof len0);
    if (rc != DL_OK) goto out;
    s0 = c->rank == 0 ? mine.s : (char *)dl__malloc(ctx, (size_t)len0 + 1);
    if (!s0) goto oom;
    rc = dl__comm_bytes(c, op, d, 0, s0, (int64_t)len0);
    if (rc != DL_OK) goto out;
    s0[len0] = 0;
    /* this process's first difference: entry k + 1 (0: none) */
    for (k = 0; ia < len0 || ib < mine.n; k++) {
        if (ia >= len0 || ib >= mine.n || strcmp(s0 + ia, mine.s + ib) != 0) { diff = k + 1; break; }
        ia += strlen(s0 + ia) + 1;
        ib += strlen(mine.s + ib) + 1;
    }
    memset(v, 0, sizeof(float) * (size_t)P);
    v[c->rank] = (float)diff;               /* exact below 2^24 entries */
    rc = dl__comm_sum_floats(c, op, d, v, P);
    if (rc != DL_OK) goto out;
    for (r = 0; r < P; r++)
        if (v[r] != 0.0f) { ndiff++; if (first < 0) first = r; }
    if (first < 0) { rc = DL_OK; goto out; }
    /* the first differing process's entry ("" when its list ends there), to everyone */
    k = (int64_t)v[first] - 1;
    b = c->rank == first ? dl__entry(mine.s, mine.n, k) : NULL;
    lent = b ? strlen(b) + 1 : 1;
    rc = dl__comm_bytes(c, op, d, first, &lent, (int64_t)sizeof lent);
    if (rc != DL_OK) goto out;
    if (!(theirs = (char *)dl__malloc(ctx, (size_t)lent))) goto oom;
    theirs[0] = 0;
    if (b) memcpy(theirs, b, (size_t)lent);
    rc = dl__comm_bytes(c, op, d, first, theirs, (int64_t)lent);
    if (rc != DL_OK) goto out;
    theirs[lent - 1] = 0;
    a = dl__entry(s0, (size_t)len0, k);
    {
        dl__sb msg;
        memset(&msg, 0, sizeof msg);
        dl__sbf(&msg, "%s: the ranks hold different models (%d of %d differ from rank 0; this is rank %d): "
                "rank %d's state_dict ", op, ndiff, (int)P, c->rank, first);
        if (theirs[0]) { dl__sbf(&msg, "entry %lld is ", (long long)k); dl__sb_str(&msg, theirs); }
        else dl__sbf(&msg, "has only %lld entries", (long long)k);
        if (a && theirs[0]) { dl__sb_str(&msg, " where rank 0's is "); dl__sb_str(&msg, a); }
        else if (a) { dl__sbf(&msg, " where rank 0's entry %lld is ", (long long)k); dl__sb_str(&msg, a); }
        else dl__sbf(&msg, " where rank 0's has only %lld entries", (long long)k);
        dl__sb_str(&msg, "; every rank must build the same model (the same names, dtypes and shapes, in order)");
        dl__err(ctx, DL_ERR_SHAPE, "%s", msg.oom ? "dl_ddp_init: the ranks hold different models" : msg.s);
        DL_FREE(msg.s);
    }
    rc = DL_ERR_SHAPE;
    goto out;
oom:
    rc = DL_ERR_OOM;
    dl__err(ctx, DL_ERR_OOM, "%s: out of memory comparing the ranks' models", op);
out:
    if (s0 != mine.s) DL_FREE(s0);
    DL_FREE(mine.s);
    DL_FREE(theirs);
    DL_FREE(v);
    return rc;
}


dl_ddp *dl_ddp_init(int n, dl_module *const *replicas, dl_optim *const *optims, const dl_ddp_desc *desc)
{
    dl_ctx *ctx;
    dl_ddp *dp;
    int i, j, np = -1, ns0;
    char b1[32], b2[32];
    if (!replicas || n < 1 || n > DL__RING_MAX || !dl__mod_ok(replicas[0])) {
        dl__err(replicas && n >= 1 && dl__mod_ok(replicas[0]) ? replicas[0]->ctx : NULL, DL_ERR_ARG,
                "dl_ddp_init: n=%d replicas%s; it needs 1..%d modules, one per device", n,
                !replicas ? " (the list is NULL)" : (n >= 1 && n <= DL__RING_MAX ? " (replicas[0] is not a module)" : ""),
                DL__RING_MAX);
        return NULL;
    }
    ctx = replicas[0]->ctx;
    if (desc && desc->comm && !dl__comm_ok(desc->comm, "dl_ddp_init")) return NULL;
    if (desc && desc->bucket_bytes < 0) {
        dl__err(ctx, DL_ERR_ARG, "dl_ddp_init: bucket_bytes=%lld; it must be >= 0 (0: 25 MB)",
                (long long)desc->bucket_bytes);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        const dl_named_tensor *a, *b;
        int k;
        if (!dl__mod_ok(replicas[i]) || replicas[i]->ctx != ctx) {
            dl__err(ctx, DL_ERR_ARG, "dl_ddp_init: replicas[%d] is %s", i,
                    !dl__mod_ok(replicas[i]) ? "not a module (NULL, or its constructor failed?)"
                                             : "in another context than replicas[0]");
            return NULL;
        }
        if (optims && (!optims[i] || optims[i]->ctx != ctx)) {
            dl__err(ctx, DL_ERR_ARG, "dl_ddp_init: optims[%d] is %s", i,
                    !optims[i] ? "NULL (pass optims NULL for none)" : "in another context");
            return NULL;
        }
        k = dl_module_named_parameters(replicas[i], &a);
        if (k < 0) return NULL;
        if (i == 0) np = k;
        if (k != np || k == 0) {
            dl__err(ctx, DL_ERR_SHAPE, "dl_ddp_init: replicas[%d] has %d parameters and replicas[0] %d; "
                    "replicas must be the same model (with parameters)", i, k, np);
            return NULL;
        }
        for (j = 0; j < k; j++) {
            if (a[j].t->dev_ != a[0].t->dev_) {
                dl__err(ctx, DL_ERR_DEVICE, "dl_ddp_init: replicas[%d] has %s on %s and %s on %s; "
                        "move each replica to one device (dl_module_to)", i, a[0].name,
                        dl__dev_str(a[0].t->device, b1, sizeof b1), a[j].name,
                        dl__dev_str(a[j].t->device, b2, sizeof b2));
                return NULL;
            }
        }
        if (i == 0) continue;
        k = dl_module_named_parameters(replicas[0], &b);
        k = dl_module_named_parameters(replicas[i], &a);
        for (j = 0; j < k; j++)
            if (strcmp(a[j].name, b[j].name) != 0 || !dl__dist_same_shape(a[j].t, b[j].t)) {
                dl__err(ctx, DL_ERR_SHAPE, "dl_ddp_init: replicas[0] has %s %s where replicas[%d] has "
                        "%s %s; replicas must be the same model", b[j].name, dl__sh(b[j].t), i,
                        a[j].name, dl__sh(a[j].t));
                return NULL;
            }
        if (a[0].t->dev_ == b[0].t->dev_) {
            dl__err(ctx, DL_ERR_DEVICE, "dl_ddp_init: replicas[0] and replicas[%d] are both on %s; "
                    "one replica per device", i, dl__dev_str(a[0].t->device, b1, sizeof b1));
            return NULL;
        }
        ns0 = dl_module_state_dict(replicas[0], &b);
        if (dl_module_state_dict(replicas[i], &a) != ns0) {
            dl__err(ctx, DL_ERR_SHAPE, "dl_ddp_init: replicas[%d] has %d state tensors and replicas[0] "
                    "%d; replicas must be the same model", i, dl_module_state_dict(replicas[i], &a), ns0);
            return NULL;
        }
    }
    {
        const dl_named_tensor *a;
        ns0 = dl_module_state_dict(replicas[0], &a);
        if (ns0 < 0) return NULL;
        dl_module_named_parameters(replicas[0], &a);
        if (desc && desc->comm && desc->comm->size > 1 &&
            dl__ddp_same_model(desc->comm, replicas[0], a[0].t->dev_) != DL_OK)
            return NULL;
    }
    dp = (dl_ddp *)dl__malloc(ctx, sizeof(dl_ddp));
    if (!dp) { dl__err(ctx, DL_ERR_OOM, "dl_ddp_init: out of memory"); return NULL; }
    memset(dp, 0, sizeof *dp);
    dp->ctx = ctx;
    dp->comm = desc ? desc->comm : NULL;
    dp->n = n;
    dp->np = np;
    dp->m = (dl_module **)dl__malloc(ctx, sizeof(dl_module *) * (size_t)n);
    dp->o = (dl_optim **)dl__malloc(ctx, sizeof(dl_optim *) * (size_t)n);
    dp->p = (dl_tensor **)dl__malloc(ctx, sizeof(dl_tensor *) * (size_t)n * (size_t)np);
    dp->flat = (dl_tensor **)dl__malloc(ctx, sizeof(dl_tensor *) * (size_t)n);
    dp->w = (float *)dl__malloc(ctx, sizeof(float) * (size_t)n);
    dp->sum = (float *)dl__malloc(ctx, sizeof(float) * 2 * (size_t)np);
    if (!dp->m || !dp->o || !dp->p || !dp->flat || !dp->w || !dp->sum) {
        dl__ddp_destroy(dp);
        dl__err(ctx, DL_ERR_OOM, "dl_ddp_init: out of memory");
        return NULL;
    }
    memset(dp->flat, 0, sizeof(dl_tensor *) * (size_t)n);
    for (i = 0; i < n; i++) {
        const dl_named_tensor *a;
        dp->m[i] = replicas[i];
        dp->o[i] = optims ? optims[i] : NULL;
        dl_module_named_parameters(replicas[i], &a);
        for (j = 0; j < np; j++) dp->p[(size_t)i * (size_t)np + (size_t)j] = a[j].t;
    }
    for (j = 0; j < np; j++) dp->total += dp->p[j]->numel;
    dp->bucket = (desc && desc->bucket_bytes ? desc->bucket_bytes : (int64_t)25 << 20) / (int64_t)sizeof(float);
    if (dp->bucket < 1) dp->bucket = 1;
    if (dp->bucket > dp->total) dp->bucket = dp->total;
    for (i = 0; i < n; i++) {
        dp->flat[i] = dl__make(dl__ddp_dev(dp, i), "dl_ddp_init", DL_DTYPE_F32, 1, &dp->bucket, true, NULL);
        if (!dp->flat[i]) { dl__ddp_destroy(dp); return NULL; }
        dl_set_name(dp->flat[i], "ddp.bucket");
    }
    dp->nb = (int)((dp->total + dp->bucket - 1) / dp->bucket);
    dp->overlap = n == 1 && dp->comm && (dp->comm->backend == DL_COMM_THREADS || dp->comm->backend == DL_COMM_MPI) &&
                  dp->comm->size > 1 && dp->nb <= DL__GRP_ASYNC;
#if defined(DL_NCCL) && defined(DL_CUDA)
    /* NCCL (one rank too, so that one GPU runs this path): the sums go on a
       stream of their own, after an event on the device's stream */
    if (n == 1 && dp->comm && dp->comm->backend == DL_COMM_NCCL && dl__ddp_dev(dp, 0)->id.type == DL_DEVICE_CUDA &&
        dl__ddp_dev(dp, 0)->impl && !((dl__cuimpl *)dl__ddp_dev(dp, 0)->impl)->emulate && dp->nb <= DL__GRP_ASYNC) {
        dl_comm *c = dp->comm;
        dp->overlap = true;
        cudaSetDevice(c->cuda);
        if (!c->cstream_ok) {
            if (cudaStreamCreateWithFlags(&c->cstream, cudaStreamNonBlocking) != cudaSuccess) dp->overlap = false;
            else if (cudaEventCreateWithFlags(&c->cev, cudaEventDisableTiming) != cudaSuccess) {
                cudaStreamDestroy(c->cstream);
                dp->overlap = false;
            } else {
                c->cstream_ok = true;
            }
        }
        if (dp->overlap) {
            dp->dflat = dl__make(dl__ddp_dev(dp, 0), "dl_ddp_init", DL_DTYPE_F32, 1, &dp->total, true, NULL);
            if (!dp->dflat) { dl__ddp_destroy(dp); return NULL; }
        } else {
            (void)cudaGetLastError();   /* no stream: the sums after backward */
        }
    }
#endif
    if (dp->overlap) {
        int64_t at = 0;
        dp->pos = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)np);
        dp->bneed = (int *)dl__malloc(ctx, sizeof(int) * (size_t)dp->nb);
        dp->bleft = (int *)dl__malloc(ctx, sizeof(int) * (size_t)dp->nb);
        dp->bposted = (bool *)dl__malloc(ctx, sizeof(bool) * (size_t)dp->nb);
        dp->bdone = (bool *)dl__malloc(ctx, sizeof(bool) * (size_t)dp->nb);
        dp->hflat = (float *)dl__malloc(ctx, sizeof(float) * (size_t)(dp->comm->backend == DL_COMM_NCCL ? 1 : dp->total));
#ifdef DL_MPI
        if (dp->comm->backend == DL_COMM_MPI) {
            int64_t seg = (dp->bucket + dp->comm->size - 1) / dp->comm->size;
            dp->atmpn = seg < DL__RING_CHUNK ? (seg > 0 ? seg : 1) : DL__RING_CHUNK;
            dp->am = (dl__mpi_async *)dl__malloc(ctx, sizeof(dl__mpi_async) * (size_t)dp->nb);
            dp->atmp = (float *)dl__malloc(ctx, sizeof(float) * (size_t)(dp->atmpn * dp->nb));
            if (!dp->am || !dp->atmp) {   /* (reported below as out of memory) */
                DL_FREE(dp->hflat);
                dp->hflat = NULL;
            }
        }
#endif
        if (!dp->pos || !dp->bneed || !dp->bleft || !dp->bposted || !dp->bdone || !dp->hflat) {
            dl__ddp_destroy(dp);
            dl__err(ctx, DL_ERR_OOM, "dl_ddp_init: out of memory");
            return NULL;
        }
        memset(dp->bneed, 0, sizeof(int) * (size_t)dp->nb);
        for (j = 0; j < np; j++) {
            int64_t b, m = dp->p[j]->numel;
            dp->pos[j] = at;
            for (b = at / dp->bucket; m > 0 && b <= (at + m - 1) / dp->bucket; b++) dp->bneed[b]++;
            at += m;
        }
    }
    if (!dl__own(ctx, dl__ddp_destroy, dp)) { dl__ddp_destroy(dp); return NULL; }
    dp->magic = DL__DDP_MAGIC;
    /* replica 0 of process 0 -> everyone: parameters and buffers */
    for (j = 0; j < ns0; j++) {
        dl_tensor *t[DL__RING_MAX];
        const dl_named_tensor *a;
        for (i = 0; i < n; i++) {
            dl_module_state_dict(replicas[i], &a);
            t[i] = a[j].t;
        }
        if (dl_comm_broadcast(dp->comm, t, n, 0) != DL_OK) { dl_ddp_free(dp); return NULL; }
    }
    return dp;
}

void dl_ddp_free(dl_ddp *dp)
{
    if (dp && dp->magic == DL__DDP_MAGIC) dl__disown(dp->ctx, dp);
}

dl_module *dl_ddp_module(dl_ddp *dp, int i)
{
    if (!dp || dp->magic != DL__DDP_MAGIC || i < 0 || i >= dp->n) return NULL;
    return dp->m[i];
}

/* gradients = sum over replicas of w[i] * gradient, bucket by bucket */
/* pack (replica i's gradients, elements [lo, hi) of the flat order, into f
   on its device, lo at f[0], zeros where a parameter has no gradient, then
   times w[i]) or unpack (f back into the gradients it has) */
static dl_result dl__ddp_move(dl_ddp *dp, int i, float *f, int64_t lo, int64_t hi, bool pack, const char *op)
{
    dl__dev *d = dl__ddp_dev(dp, i);
    int64_t pos;
    int j;
    for (j = 0, pos = 0; j < dp->np; j++) {
        dl_tensor *x = dp->p[(size_t)i * (size_t)dp->np + (size_t)j];
        int64_t a = pos > lo ? pos : lo, e = pos + x->numel < hi ? pos + x->numel : hi;
        if (a < e) {
            float *g = x->grad ? (float *)x->grad->data + (a - pos) : NULL;
            size_t bytes = sizeof(float) * (size_t)(e - a);
            if (!pack) { if (g) { d->be->copy(d, g, f + (a - lo), bytes); dl__bump_version(x->grad); } }
            else if (g) d->be->copy(d, f + (a - lo), g, bytes);
            else d->be->fill(d, f + (a - lo), e - a, 0.0f);
        }
        pos += x->numel;
    }
    if (pack && dp->w[i] != 1.0f) d->be->scale(d, f, hi - lo, dp->w[i]);
    return dl__dev_check(d, op);
}

/* A gradient on one replica of any process: on all of them (zeros where
   none came), so that every one writes the sum back (a parameter that some
   ranks' losses did not reach had kept its own gradient there, and the
   replicas drifted apart). Across processes one sum of np flags; a
   parameter no rank has a gradient for keeps none, as in PyTorch. */
static dl_result dl__ddp_grad_union(dl_ddp *dp, const char *op)
{
    int i, j, np = dp->np, n = dp->n;
    bool cross = dp->comm && dp->comm->size > 1 && np > 0;
    float *v = NULL;
    if (cross) {
        dl_result rc;
        v = (float *)dl__malloc(dp->ctx, sizeof(float) * (size_t)np);
        if (!v) return dp->ctx->err != DL_OK ? dp->ctx->err : DL_ERR_OOM;
        for (j = 0; j < np; j++) {
            v[j] = 0.0f;
            for (i = 0; i < n; i++) if (dp->p[(size_t)i * (size_t)np + (size_t)j]->grad) v[j] = 1.0f;
        }
        rc = dl__comm_sum_floats(dp->comm, op, dl__ddp_dev(dp, 0), v, np);
        if (rc != DL_OK) { DL_FREE(v); return rc; }
    }
    for (j = 0; j < np; j++) {
        bool any = cross && v[j] > 0.0f;
        for (i = 0; i < n; i++) any = any || dp->p[(size_t)i * (size_t)np + (size_t)j]->grad;
        for (i = 0; any && i < n; i++) {
            dl_tensor *x = dp->p[(size_t)i * (size_t)np + (size_t)j];
            if (x->grad) continue;
            x->grad = dl__make(x->dev_, op, DL_DTYPE_F32, x->ndim, x->shape, true, NULL);
            if (!x->grad) { DL_FREE(v); return dp->ctx->err; }
            DL__BE(x)->fill(x->dev_, (float *)x->grad->data, x->numel, 0.0f);
        }
    }
    DL_FREE(v);
    return DL_OK;
}

static dl_result dl__ddp_sum(dl_ddp *dp, const char *op)
{
    int i, n = dp->n;
    int64_t lo;
    dl_result rc0 = dl__ddp_grad_union(dp, op);
    if (rc0 != DL_OK) return rc0;
    for (lo = 0; lo < dp->total; lo += dp->bucket) {
        int64_t hi = lo + dp->bucket < dp->total ? lo + dp->bucket : dp->total;
        dl__ring R;
        dl_result rc;
        int pass;
        for (pass = 0; pass < 2; pass++) {   /* 0: pack and weight, 1: unpack */
            if (pass == 1) {
                R.n = n;
                R.count = hi - lo;
                for (i = 0; i < n; i++) {
                    R.dev[i] = dl__ddp_dev(dp, i);
                    R.buf[i] = (unsigned char *)dp->flat[i]->data;
                }
                rc = dl__comm_allreduce(dp->comm, op, &R, dp->ctx, 1.0f);
                if (rc != DL_OK) return rc;
            }
            for (i = 0; i < n; i++)
                if (dl__ddp_move(dp, i, (float *)dp->flat[i]->data, lo, hi, pass == 0, op) != DL_OK)
                    return DL_ERR_DEVICE;
        }
    }
    return DL_OK;
}

/* overlap: bucket b of replica 0's gradients, weighted, into hflat, and
   posted to the other thread ranks */
static dl_result dl__ddp_post(dl_ddp *dp, int b, const char *op)
{
    int64_t lo = (int64_t)b * dp->bucket, hi = lo + dp->bucket < dp->total ? lo + dp->bucket : dp->total, i;
    dl__dev *d = dl__ddp_dev(dp, 0);
    float *f, w = dp->w[0];
    int j;
#if defined(DL_NCCL) && defined(DL_CUDA)
    if (dp->comm->backend == DL_COMM_NCCL) {   /* pack on the device's stream, sum on the comm's */
        dl_comm *c = dp->comm;
        float *g = (float *)dp->dflat->data + lo;
        ncclResult_t nr;
        if (dl__ddp_move(dp, 0, g, lo, hi, true, op) != DL_OK) return DL_ERR_DEVICE;
        dp->bposted[b] = dp->bdone[b] = true;
        cudaSetDevice(c->cuda);
        if (cudaEventRecord(c->cev, ((dl__cuimpl *)d->impl)->stream) != cudaSuccess ||
            cudaStreamWaitEvent(c->cstream, c->cev, 0) != cudaSuccess)
            nr = ncclUnhandledCudaError;
        else
            nr = ncclAllReduce(g, g, (size_t)(hi - lo), ncclFloat, ncclSum, c->nccl, c->cstream);
        if (nr != ncclSuccess) {
            c->broken = true;
            dl__err(dp->ctx, DL_ERR_DEVICE, "%s: ncclAllReduce of bucket %d failed: %s (%s)", op, b,
                    ncclGetErrorString(nr), cudaGetErrorString(cudaGetLastError()));
            return DL_ERR_DEVICE;
        }
        return dl__dev_check(d, op);
    }
#endif
    f = dp->hflat + lo;
    for (j = 0; j < dp->np; j++) {
        dl_tensor *x = dp->p[j];
        int64_t a = dp->pos[j] > lo ? dp->pos[j] : lo, e = dp->pos[j] + x->numel < hi ? dp->pos[j] + x->numel : hi;
        if (a >= e) continue;
        if (x->grad)
            d->be->download(d, f + (a - lo), (const float *)x->grad->data + (a - dp->pos[j]),
                            sizeof(float) * (size_t)(e - a));
        else
            memset(f + (a - lo), 0, sizeof(float) * (size_t)(e - a));
    }
    if (dl__dev_check(d, op) != DL_OK) return DL_ERR_DEVICE;
    if (w != 1.0f)
        for (i = 0; i < hi - lo; i++) f[i] = f[i] * w;
    dp->bposted[b] = true;
#ifdef DL_MPI
    if (dp->comm->backend == DL_COMM_MPI) {
        dl__mpi_async *a = &dp->am[b];
        int r;
        memset(a, 0, sizeof *a);
        a->h = f;
        a->count = hi - lo;
        a->tag = 1000 + b;
        a->scale = 1.0f;
        a->tmp = dp->atmp + (int64_t)b * dp->atmpn;
        r = dl__mpi_async_run(dp->comm, op, a, false);
        dp->bdone[b] = r == 1;
        return r < 0 ? DL_ERR_DEVICE : DL_OK;
    }
#endif
    return dl__grp_post(dp->comm, op, dp->astep, b, f, hi - lo) ? DL_OK : dp->ctx->err;
}

/* overlap: finish bucket b's sum (block) or advance it as far as the
   messages allow (MPI; THREADS needs nothing until the wait) */
static dl_result dl__ddp_progress(dl_ddp *dp, int b, bool block, const char *op)
{
    if (dp->bdone[b]) return DL_OK;
#ifdef DL_MPI
    if (dp->comm->backend == DL_COMM_MPI) {
        int r = dl__mpi_async_run(dp->comm, op, &dp->am[b], block);
        dp->bdone[b] = r == 1;
        return r < 0 ? DL_ERR_DEVICE : DL_OK;
    }
#endif
    if (!block) return DL_OK;
    if (!dl__grp_wait(dp->comm, op, dp->astep, b)) return dp->ctx->err;
    dp->bdone[b] = true;
    return DL_OK;
}

/* backward's ready hook: parameter x's gradient is complete; post every
   bucket that was waiting for it last */
static dl_result dl__ddp_ready(void *user, dl_tensor *x)
{
    dl_ddp *dp = (dl_ddp *)user;
    int j;
    int64_t b;
    for (j = 0; j < dp->np && dp->p[j] != x; j++) {}
    if (j == dp->np || x->numel == 0) return DL_OK;   /* (backward calls it once per leaf) */
    for (b = 0; b < dp->nb; b++)          /* MPI: move the buckets in flight along */
        if (dp->bposted[b] && dl__ddp_progress(dp, (int)b, false, "dl_ddp_step") != DL_OK) return dp->ctx->err;
    for (b = dp->pos[j] / dp->bucket; b <= (dp->pos[j] + x->numel - 1) / dp->bucket; b++)
        if (--dp->bleft[b] == 0) {
            dl_result rc = dl__ddp_post(dp, (int)b, "dl_ddp_step");
            if (rc != DL_OK) return rc;
            dp->early++;
        }
    return DL_OK;
}

/* overlap: backward of replica 0 with the hook, then the buckets it did
   not post (parameters without a gradient), the waits, and the sums back
   into the gradients */
static dl_result dl__ddp_backward_overlap(dl_ddp *dp, dl_tensor *loss, const char *op)
{
    dl_ctx *ctx = dp->ctx;
    dl__dev *d = dl__ddp_dev(dp, 0);
    dl_result rc;
    int b, j;
    dp->astep = ++dp->comm->astep;   /* (two models on one communicator: keys never repeat) */
    dp->early = 0;
    for (b = 0; b < dp->nb; b++) {
        dp->bleft[b] = dp->bneed[b];
        dp->bposted[b] = dp->bdone[b] = false;
    }
    ctx->ready_fn = dl__ddp_ready;
    ctx->ready_user = dp;
    rc = dl_backward(loss);
    ctx->ready_fn = NULL;
    ctx->ready_user = NULL;
    if (rc != DL_OK) return rc;
    for (b = 0; b < dp->nb; b++)
        if (!dp->bposted[b] && (rc = dl__ddp_post(dp, b, op)) != DL_OK) return rc;
    for (b = 0; b < dp->nb; b++)
        if ((rc = dl__ddp_progress(dp, b, true, op)) != DL_OK) return rc;
    if ((rc = dl__ddp_grad_union(dp, op)) != DL_OK) return rc;   /* (the sums are done: a collective of its own) */
#if defined(DL_NCCL) && defined(DL_CUDA)
    if (dp->comm->backend == DL_COMM_NCCL) {   /* the device's stream waits for the sums, then unpacks */
        dl_comm *c = dp->comm;
        ncclResult_t ar = ncclSuccess;
        cudaSetDevice(c->cuda);
        if (cudaEventRecord(c->cev, c->cstream) != cudaSuccess ||
            cudaStreamWaitEvent(((dl__cuimpl *)d->impl)->stream, c->cev, 0) != cudaSuccess)
            ar = ncclUnhandledCudaError;
        if (ar == ncclSuccess) dl__ddp_move(dp, 0, (float *)dp->dflat->data, 0, dp->total, false, op);
        d->be->sync(d);
        if (ar == ncclSuccess && ncclCommGetAsyncError(c->nccl, &ar) == ncclSuccess && ar == ncclSuccess)
            return dl__dev_check(d, op);
        c->broken = true;
        dl__err(ctx, DL_ERR_DEVICE, "%s: the overlapped NCCL sums failed: %s", op, ncclGetErrorString(ar));
        return DL_ERR_DEVICE;
    }
#endif
    for (j = 0; j < dp->np; j++) {
        dl_tensor *x = dp->p[j];
        if (x->grad && x->numel) {
            d->be->upload(d, x->grad->data, dp->hflat + dp->pos[j], sizeof(float) * (size_t)x->numel);
            dl__bump_version(x->grad);
        }
    }
    return dl__dev_check(d, op);
}

dl_result dl_ddp_sync_grads(dl_ddp *dp)
{
    int i;
    if (!dl__ddp_ok(dp, "dl_ddp_sync_grads")) return dl__ddp_rc(dp);
    if (dp->comm && !dl__comm_ok(dp->comm, "dl_ddp_sync_grads")) return dl__comm_rc(dp->comm);
    for (i = 0; i < dp->n; i++) dp->w[i] = 1.0f / ((float)dp->n * (float)dl_comm_size(dp->comm));
    return dl__ddp_sum(dp, "dl_ddp_sync_grads");
}

/* across processes: replica 0's checksums against process 0's (a
   collective call: every process makes it) */
static dl_result dl__ddp_check_procs(dl_ddp *dp, float *sum)
{
    dl__dev *d = dl__ddp_dev(dp, 0);
    int64_t np = dp->np, j;
    dl_tensor *t = dl__make(d, "dl_ddp_check", DL_DTYPE_F32, 1, &np, false, NULL);
    dl__ring R;
    dl_result rc;
    if (!t) return dp->ctx->err;
    d->be->upload(d, t->data, sum, sizeof(float) * (size_t)np);
    R.n = 1;
    R.count = np;
    R.esize = sizeof(float);
    R.dev[0] = d;
    R.buf[0] = (unsigned char *)t->data;
    rc = dl__comm_bcast(dp->comm, "dl_ddp_check", &R, dp->ctx, 0);
    if (rc != DL_OK) return rc;
    d->be->download(d, sum + np, t->data, sizeof(float) * (size_t)np);
    for (j = 0; j < np; j++)
        if (sum[j] != sum[np + j] && !(sum[j] != sum[j] && sum[np + j] != sum[np + j])) {
            dl__err(dp->ctx, DL_ERR_DEVICE, "dl_ddp_check: process %d has drifted from process 0: "
                    "parameter %d has sum of squares %.9g there, %.9g in process 0", dp->comm->rank,
                    (int)j, (double)sum[j], (double)sum[np + j]);
            return DL_ERR_DEVICE;
        }
    return DL_OK;
}

dl_result dl_ddp_check(dl_ddp *dp)
{
    int i, j;
    float *sum;
    dl_result rc = DL_OK;
    if (!dl__ddp_ok(dp, "dl_ddp_check")) return dl__ddp_rc(dp);
    sum = dp->sum;
    for (j = 0; j < dp->np; j++) {
        dl_tensor *x0 = dp->p[j];
        sum[j] = (float)(x0->numel ? DL__BE(x0)->sumsq(x0->dev_, (const float *)x0->data, x0->numel) : 0);
    }
    if (dp->comm && dp->comm->size > 1) rc = dl__ddp_check_procs(dp, sum);   /* every process calls it */
    for (j = 0; j < dp->np && rc == DL_OK; j++)
        for (i = 1; i < dp->n && rc == DL_OK; i++) {
            dl_tensor *x = dp->p[(size_t)i * (size_t)dp->np + (size_t)j];
            float s = (float)(x->numel ? DL__BE(x)->sumsq(x->dev_, (const float *)x->data, x->numel) : 0);
            if (s != sum[j] && !(s != s && sum[j] != sum[j])) {
                char b1[32];
                dl__err(dp->ctx, DL_ERR_DEVICE, "dl_ddp_check: replica %d on %s has drifted from "
                        "replica 0: parameter %d %s has sum of squares %.9g, replica 0 %.9g", i,
                        dl__dev_str(x->device, b1, sizeof b1), j, dl__sh(x), (double)s, (double)sum[j]);
                rc = DL_ERR_DEVICE;
            }
        }
    return rc;
}

dl_result dl_ddp_step(dl_ddp *dp, dl_tensor *x, dl_tensor *y, dl_ddp_loss_fn fn, void *user, float *loss_out)
{
    dl_ctx *ctx;
    dl_tensor *loss[DL__RING_MAX];
    int64_t B, off = 0;
    int i, n;
    dl_result rc;
    double total = 0;
    if (loss_out) *loss_out = NAN;
    if (!dl__ddp_ok(dp, "dl_ddp_step")) return dl__ddp_rc(dp);
    ctx = dp->ctx;
    n = dp->n;
    if (dp->comm && !dl__comm_ok(dp->comm, "dl_ddp_step")) return dl__comm_rc(dp->comm);
    if (!x || !y) {
        dl__err(ctx, DL_ERR_ARG, "dl_ddp_step: %s is NULL (did the op that made it fail?)", !x ? "x" : "y");
        return DL_ERR_ARG;
    }
    if (!dl__valid("dl_ddp_step", "x", x) || !dl__valid("dl_ddp_step", "y", y)) return ctx->err;
    if (!fn) { dl__err(ctx, DL_ERR_ARG, "dl_ddp_step: the loss function is NULL"); return DL_ERR_ARG; }
    if (x->ctx_ != ctx || y->ctx_ != ctx) {
        dl__err(ctx, DL_ERR_ARG, "dl_ddp_step: x and y must belong to the replicas' context");
        return DL_ERR_ARG;
    }
    if (x->ndim < 1 || y->ndim < 1 || x->shape[0] != y->shape[0] || x->shape[0] < n) {
        dl__err(ctx, DL_ERR_SHAPE, "dl_ddp_step: x %s and y %s: both need the batch in dim 0, the "
                "same size, at least one row per replica (%d)", dl__sh(x), dl__sh(y), n);
        return DL_ERR_SHAPE;
    }
    if (!dp->o[0]) {
        dl__err(ctx, DL_ERR_ARG, "dl_ddp_step: dl_ddp_init got no optimizers (optims NULL); step "
                "them yourself after dl_ddp_sync_grads");
        return DL_ERR_ARG;
    }
    B = x->shape[0];
    for (i = 0; i < n; i++) {           /* scatter: replica i gets rows [off, off + b) */
        int64_t b = B / n + (i < B % n ? 1 : 0), sh[DL_MAX_DIMS];
        dl__dev *d = dl__ddp_dev(dp, i);
        dl_tensor *part[2], *src[2];
        int k;
        src[0] = x;
        src[1] = y;
        for (k = 0; k < 2; k++) {
            size_t row = (size_t)(src[k]->numel / B) * dl__esize(src[k]->dtype);
            void *h = NULL;
            memcpy(sh, src[k]->shape, sizeof(int64_t) * (size_t)src[k]->ndim);
            sh[0] = b;
            part[k] = dl__make(d, "dl_ddp_step", src[k]->dtype, src[k]->ndim, sh, false, NULL);
            if (!part[k]) return ctx->err;
            if (d->be != src[k]->dev_->be && !(h = dl__malloc(ctx, row * (size_t)b))) {
                dl__err(ctx, DL_ERR_OOM, "dl_ddp_step: no host memory to stage a batch part");
                return DL_ERR_OOM;
            }
            dl__xfer(d, part[k]->data, src[k]->dev_, (unsigned char *)src[k]->data + row * (size_t)off,
                     row * (size_t)b, h);
            DL_FREE(h);
        }
        off += b;
        dp->w[i] = (float)((double)b / (double)B / (double)dl_comm_size(dp->comm));
        dl_optim_zero_grad(dp->o[i]);
        loss[i] = fn(dp->m[i], part[0], part[1], user);
        if (!loss[i]) {
            if (ctx->err == DL_OK)
                dl__err(ctx, DL_ERR_ARG, "dl_ddp_step: the loss function returned NULL for replica %d", i);
            return ctx->err;
        }
        if (dp->overlap) break;
        rc = dl_backward(loss[i]);
        if (rc != DL_OK) return rc;
    }
    rc = dp->overlap ? dl__ddp_backward_overlap(dp, loss[0], "dl_ddp_step") : dl__ddp_sum(dp, "dl_ddp_step");
    if (rc != DL_OK) return rc;
    for (i = 0; i < n; i++) {
        rc = dl_optim_step(dp->o[i]);
        if (rc != DL_OK) return rc;
        total += (double)dp->w[i] * (double)dl_item(loss[i]);
    }
    if (dp->comm && dp->comm->size > 1) {   /* the loss of every process's part */
        dl__dev *d = dl__ddp_dev(dp, 0);
        int64_t one = 1;
        float v = (float)total;
        dl_tensor *t = dl__make(d, "dl_ddp_step", DL_DTYPE_F32, 1, &one, false, NULL);
        if (!t) return ctx->err;
        d->be->upload(d, t->data, &v, sizeof v);
        rc = dl__comm_cross(dp->comm, "dl_ddp_step", d, (float *)t->data, 1, 1.0f);
        if (rc != DL_OK) return rc;
        d->be->download(d, &v, t->data, sizeof v);
        total = v;
    }
    if (loss_out) *loss_out = (float)total;
#ifdef DL_DEBUG
    rc = dl_ddp_check(dp);
    if (rc != DL_OK) return rc;
#endif
    return DL_OK;
}

// >>section debug: gradcheck, graph, anomaly
void dl_set_anomaly(dl_ctx *ctx, bool on) { if (ctx) ctx->anomaly = on; }

/* sum(out * r) in double, on the host */
/* A later call's result o, checked against the first's (out): a tensor of
   its dtype, shape and device; else false + error naming the perturbed
   element (input k, element i) */
static bool dl__gc_same(dl_ctx *ctx, dl_tensor *o, dl_tensor *out, int k, int64_t i)
{
    const char *why = !o ? "NULL" : o->magic_ != DL__MAGIC ? "not a live tensor" : o->ctx_ != ctx ?
                      "a tensor of another context" : o->dtype != DL_DTYPE_F32 ? "not float32" :
                      !dl_same_shape(o, out) ? "of another shape" : o->dev_ != out->dev_ ? "on another device" : NULL;
    if (!why) return true;
    if (o || ctx->err == DL_OK)   /* (f's own error, where it failed with one, stays) */
        dl__err(ctx, DL_ERR_ARG, "dl_gradcheck: f with input %d's element %lld moved by eps returned %s "
                "(its first result: %s, float32)", k, (long long)i, why, dl__sh(out));
    return false;
}

static double dl__proj(dl_tensor *out, const float *r, float *buf)
{
    double s = 0;
    int64_t i;
    DL__BE(out)->download(out->dev_, buf, out->data, sizeof(float) * (size_t)out->numel);
    for (i = 0; i < out->numel; i++) s += (double)buf[i] * (double)r[i];
    return s;
}

dl_result dl_gradcheck(dl_ctx *ctx, dl_gradcheck_fn f, void *user, int n, dl_tensor *const *inputs,
                       const dl_gradcheck_desc *desc, dl_gradcheck_result *res)
{
    double eps = desc && desc->eps > 0 ? desc->eps : 1e-3;
    /* DL_ZERO (-0.0) asks for a real zero */
    double atol = desc && (desc->atol > 0 || (desc->atol == 0 && signbit(desc->atol))) ? desc->atol + 0.0 : 1e-3;
    double rtol = desc && (desc->rtol > 0 || (desc->rtol == 0 && signbit(desc->rtol))) ? desc->rtol + 0.0 : 1e-2;
    dl_tensor *out, *r, *L, *grads[DL_GRADCHECK_MAX_INPUTS];
    float *rh, *ob;
    dl_tensor *need[DL_GRADCHECK_MAX_INPUTS];
    int k, nn = 0, map[DL_GRADCHECK_MAX_INPUTS];
    dl_result rc = DL_OK;
    if (!ctx || !f || !res || !inputs) return DL_ERR_ARG;
    memset(res, 0, sizeof *res);
    if (n <= 0 || n > DL_GRADCHECK_MAX_INPUTS) {
        dl__err(ctx, DL_ERR_ARG, "dl_gradcheck: %d inputs; 1..%d supported", n, DL_GRADCHECK_MAX_INPUTS);
        return DL_ERR_ARG;
    }
    for (k = 0; k < n; k++) {
        if (!inputs[k] || !dl__valid("dl_gradcheck", "an input", inputs[k])) return DL_ERR_ARG;
        if (inputs[k]->ctx_ != ctx) {
            dl__err(ctx, DL_ERR_ARG, "dl_gradcheck: input %d %s belongs to another context than ctx", k,
                    dl__sh(inputs[k]));
            return DL_ERR_ARG;
        }
        if (inputs[k]->requires_grad) { map[nn] = k; need[nn++] = inputs[k]; }
    }
    res->n = n;
    out = f(user, inputs);
    if (!out) {
        if (ctx->err == DL_OK) dl__err(ctx, DL_ERR_ARG, "dl_gradcheck: f returned NULL without an error");
        return ctx->err;
    }
    if (!dl__valid("dl_gradcheck", "f's result", out)) return ctx->err != DL_OK ? ctx->err : DL_ERR_ARG;
    if (out->ctx_ != ctx) {
        dl__err(ctx, DL_ERR_ARG, "dl_gradcheck: f returned a tensor %s of another context", dl__sh(out));
        return DL_ERR_ARG;
    }
    if (!dl__f32("dl_gradcheck", "the output", out)) return DL_ERR_DTYPE;
    res->ok = true;
    /* fixed random projection: checks J^T r, every input element */
    {
        uint64_t seed = ctx->seed, off = ctx->rng_offset;
        dl_manual_seed(ctx, desc && desc->seed ? desc->seed : 1);
        r = dl_randn(ctx, dl__shape_of(out));
        if (r && r->dev_ != out->dev_) r = dl_to(r, out->device);
        ctx->seed = seed;
        ctx->rng_offset = off;
    }
    if (!r || !(L = nn ? dl_sum(dl_mul(out, r), DL_ALL, false) : r)) { res->ok = false; return ctx->err; }
    if (nn == 0) return DL_OK;
    if (!L->requires_grad) {
        for (k = 0; k < nn; k++) grads[k] = NULL;
    } else {
        rc = dl_grad(L, nn, need, grads, NULL);
        if (rc != DL_OK) { res->ok = false; return rc; }
    }
    /* the host copies the differences are taken with: r, the output, each input */
    rh = (float *)DL_MALLOC(sizeof(float) * (size_t)(2 * r->numel + 1));
    if (!rh) { dl__err(ctx, DL_ERR_OOM, "dl_gradcheck: out of memory"); return DL_ERR_OOM; }
    ob = rh + r->numel;
    DL__BE(r)->download(r->dev_, rh, r->data, sizeof(float) * (size_t)r->numel);
    for (k = 0; k < nn && rc == DL_OK; k++) {
        dl_tensor *x = need[k];
        float *xh = (float *)DL_MALLOC(sizeof(float) * (size_t)(2 * x->numel + 1)), *ga;
        int64_t i;
        int slot = map[k];
        if (!xh) { dl__err(ctx, DL_ERR_OOM, "dl_gradcheck: out of memory"); rc = DL_ERR_OOM; break; }
        ga = xh + x->numel;
        DL__BE(x)->download(x->dev_, xh, x->data, sizeof(float) * (size_t)x->numel);
        if (grads[k]) DL__BE(grads[k])->download(grads[k]->dev_, ga, grads[k]->data, sizeof(float) * (size_t)x->numel);
        for (i = 0; i < x->numel; i++) {
            float orig = xh[i], v;
            double lp, lm, num, an, err, rel;
            dl__mark m1 = dl__arena_mark(&x->dev_->data);
            dl__hmark m2 = dl__hmark_get(ctx);
            int64_t nt = ctx->ntape;
            float *xi = (float *)x->data + i;     /* a device address: only the backend writes it */
            dl_tensor *o;
            dl_no_grad_begin(ctx);
            v = (float)(orig + eps);
            DL__BE(x)->upload(x->dev_, xi, &v, sizeof v);
            o = f(user, inputs);
            if (!dl__gc_same(ctx, o, out, slot, i)) o = NULL;
            lp = o ? dl__proj(o, rh, ob) : NAN;
            v = (float)(orig - eps);
            DL__BE(x)->upload(x->dev_, xi, &v, sizeof v);
            if (o) {
                o = f(user, inputs);
                if (!dl__gc_same(ctx, o, out, slot, i)) o = NULL;
            }
            lm = o ? dl__proj(o, rh, ob) : NAN;
            DL__BE(x)->upload(x->dev_, xi, &orig, sizeof orig);
            dl_no_grad_end(ctx);
            dl__arena_rewind(&x->dev_->data, m1);
            dl__hrewind(ctx, m2);
            ctx->ntape = nt;
            if (!o) { rc = ctx->err != DL_OK ? ctx->err : DL_ERR_ARG; res->ok = false; break; }
            num = (lp - lm) / (2.0 * eps);
            an = grads[k] ? ga[i] : 0.0;
            err = fabs(an - num);
            rel = (fabs(an) > atol || fabs(num) > atol) ? err / (fabs(an) > fabs(num) ? fabs(an) : fabs(num)) : 0.0;
            if (err > res->max_abs_err[slot]) { res->max_abs_err[slot] = err; res->worst_index[slot] = i; }
            if (rel > res->max_rel_err[slot]) res->max_rel_err[slot] = rel;
            if (!(err <= atol + rtol * fabs(num))) res->ok = false;
        }
        DL_FREE(xh);
    }
    DL_FREE(rh);
    if (rc != DL_OK) res->ok = false;   /* an error is never a pass */
    return rc;
}

/* s (at most max bytes) inside a DOT "..." string: " and \ escaped, a line
   break as \n (a new label line), other control bytes and bytes that are not
   UTF-8 as '?', so that a name can neither end the string nor break the file */
static void dl__dot_str(dl__sb *f, const char *s, size_t max)
{
    size_t n = 0, i = 0, k;
    char e[2];
    while (n < max && s[n]) n++;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        k = 1;
        if (c == '"' || c == '\\') { e[0] = '\\'; e[1] = (char)c; dl__sb_put(f, e, 2); }
        else if (c == '\n') dl__sb_put(f, "\\n", 2);
        else if (c < 0x20 || c == 0x7f || (k = dl__utf8_char(s + i, n - i)) == 0) { dl__sb_put(f, "?", 1); k = 1; }
        else dl__sb_put(f, s + i, k);
        i += k;
    }
}

static void dl__dot_tensor(dl__sb *f, const dl_tensor *t, const char *style)
{
    char sh[128];
    int i, k = 0;
    k += snprintf(sh + k, sizeof sh - (size_t)k, "(");
    for (i = 0; i < t->ndim && k < 100; i++) k += snprintf(sh + k, sizeof sh - (size_t)k, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    snprintf(sh + k, sizeof sh - (size_t)k, ")");
    dl__sbf(f, "  t%p [shape=ellipse, %s, label=\"", (const void *)t, style);
    if (t->name[0]) {
        dl__dot_str(f, t->name, sizeof t->name);
        dl__sb_str(f, "\\n");
    }
    dl__sbf(f, "%s%s\"];\n", sh, t->requires_grad ? "\\nrequires_grad" : "");
}

dl_result dl_graph_dot(dl_tensor *root, const char *path)
{
    dl_ctx *ctx;
    dl__sb sb, *f = &sb;
    dl__wfile w;
    dl__node **stack;
    int64_t sp = 0, cap;
    if (!root) return DL_ERR_ARG;
    if (!dl__valid("dl_graph_dot", "root", root)) return DL_ERR_ARG;
    ctx = root->ctx_;
    if (!path) { dl__err(ctx, DL_ERR_ARG, "dl_graph_dot: path is NULL"); return DL_ERR_ARG; }
    memset(&sb, 0, sizeof sb);
    dl__sbf(f, "digraph dl {\n  rankdir=BT;\n  node [fontname=\"Helvetica\", fontsize=10];\n");
    dl__dot_tensor(f, root, "style=filled, fillcolor=\"#ffd9b3\"");
    cap = ctx->ntape + 1;
    stack = (dl__node **)DL_MALLOC(sizeof(dl__node *) * (size_t)cap);
    if (!stack) { dl__err(ctx, DL_ERR_OOM, "dl_graph_dot: out of memory"); return DL_ERR_OOM; }
    ctx->visit++;
    if (root->node_) { root->node_->visit = ctx->visit; stack[sp++] = root->node_; }
    while (sp > 0) {
        dl__node *n = stack[--sp];
        int j;
        dl__sbf(f, "  n%p [shape=box, style=filled, fillcolor=\"#cfe2f3\", label=\"", (const void *)n);
        dl__dot_str(f, n->fn && n->fn->name ? n->fn->name : n->op->name, (size_t)-1);
        dl__sb_str(f, "\"];\n");
        dl__sbf(f, "  n%p -> t%p;\n", (const void *)n, (const void *)n->out);
        for (j = 0; j < n->nin; j++) {
            dl_tensor *x = n->in[j];
            if (!x) continue;
            if (x->node_) {
                if (x->node_->visit != ctx->visit) {
                    x->node_->visit = ctx->visit;
                    if (sp < cap) stack[sp++] = x->node_;
                    dl__dot_tensor(f, x, "style=solid");
                }
            } else {
                dl__dot_tensor(f, x, x->requires_grad ? "style=filled, fillcolor=\"#d9ead3\"" : "style=dashed");
            }
            dl__sbf(f, "  t%p -> n%p;\n", (const void *)x, (const void *)n);
        }
    }
    dl__sbf(f, "}\n");
    DL_FREE(stack);
    if (sb.oom) { DL_FREE(sb.s); dl__err(ctx, DL_ERR_OOM, "dl_graph_dot: out of memory"); return DL_ERR_OOM; }
    if (!dl__wopen(ctx, "dl_graph_dot", path, &w)) { DL_FREE(sb.s); return ctx->err; }
    dl__wput(&w, sb.s, sb.n);
    DL_FREE(sb.s);
    return dl__wclose(ctx, "dl_graph_dot", &w);
}

// >>section debug: profiler
/* The profiler (dl_profile_*, DL_PROFILE=1) counts and times spans: one per
   op call and one per backward node, as torch.profiler's key_averages().
   A span opens at the op's first argument check (dl__live) and closes at
   its end (dl__done, or dl__end for an op whose result another op made).
   Spans nest: an op built from ops (dl_linear: dl_matmul, dl_add) is their
   parent, and the ops a backward rule calls are children of the node's span
   ("dl_linear backward" holds the dl_matmul calls of the rule). A span's
   total is its end minus its start; its self is the total less its
   children's totals on the same device. A second check of the same op's
   arguments (the same name on top of the stack) opens nothing. Each span
   takes two marks on its device: the host clock on CPU devices, CUDA events
   in the device's stream on GPUs (the backend's prof_mark). The marks stay
   pending and become times at dl_step_end once many are pending, and
   whenever the table is read (which waits for a GPU's events), so recording
   costs two marks, a hash lookup and no synchronization per op. A failed op
   (an error, or a NULL result) is dropped: not counted, its time is its
   parent's. Off, every hook is one test of ctx->prof. */

#define DL__PROF_FLUSH 4096              /* pending spans turned into times at dl_step_end */
#define DL__PROF_MAX_PENDING (1 << 20)   /* ... or as soon as no span is open */

typedef struct dl__prow {                /* a row of the table: an op (or node) on a device */
    char name[64];
    bool bwd;
    dl_device dev;
    uint32_t hash;
    int64_t calls;
    double self, total;
} dl__prow;

typedef struct dl__pspan {
    const char *name;                    /* the op's name string (while open) */
    dl__dev *dev;
    int row, parent;                     /* parent: the enclosing span's index, or -1 */
    int64_t t0, t1;                      /* marks */
    double child;                        /* the children's totals (while resolving) */
    int state;                           /* 0 open, 1 closed, 2 dropped */
} dl__pspan;

struct dl__prof {
    dl__prow *rows;
    int nrows, caprows;
    int *ht, htcap;                      /* rows by hash: index + 1, 0 empty */
    dl__pspan *span;                     /* pending spans, in opening order */
    int nspan, capspan;
    int *stack, depth, capstack;         /* the open spans */
    int64_t steps, dropped, lost;        /* dl_step_end calls; failed ops; spans without marks */
    bool dirty;                          /* recorded since the table was last printed */
};

static int64_t dl__prof_mark(dl__dev *d) { return d->be->prof_mark ? d->be->prof_mark(d) : dl__prof_now(); }

static uint32_t dl__prof_hash(const char *name, bool bwd, dl_device dev)
{
    uint32_t h = 2166136261u;
    size_t i;
    for (i = 0; name[i] && i < 63; i++) h = (h ^ (unsigned char)name[i]) * 16777619u;
    h = (h ^ (uint32_t)bwd) * 16777619u;
    h = (h ^ (uint32_t)dev.type) * 16777619u;
    return (h ^ (uint32_t)dev.index) * 16777619u;
}

/* the row of (name, bwd, device), added if new; -1 when out of memory */
static int dl__prof_row(dl__prof *p, const char *name, bool bwd, dl_device dev)
{
    uint32_t h = dl__prof_hash(name, bwd, dev);
    int k;
    dl__prow *r;
    if (2 * (p->nrows + 1) > p->htcap) {           /* grow the table: at most half full */
        int cap = p->htcap ? 2 * p->htcap : 64, i;
        int *ht = (int *)DL_MALLOC(sizeof(int) * (size_t)cap);
        if (!ht) return -1;
        memset(ht, 0, sizeof(int) * (size_t)cap);
        for (i = 0; i < p->nrows; i++) {
            k = (int)(p->rows[i].hash & (uint32_t)(cap - 1));
            while (ht[k]) k = (k + 1) & (cap - 1);
            ht[k] = i + 1;
        }
        DL_FREE(p->ht);
        p->ht = ht;
        p->htcap = cap;
    }
    for (k = (int)(h & (uint32_t)(p->htcap - 1)); p->ht[k]; k = (k + 1) & (p->htcap - 1)) {
        r = &p->rows[p->ht[k] - 1];
        if (r->hash == h && r->bwd == bwd && r->dev.type == dev.type && r->dev.index == dev.index &&
            strncmp(r->name, name, sizeof r->name - 1) == 0)
            return p->ht[k] - 1;
    }
    if (p->nrows == p->caprows) {
        int cap = p->caprows ? 2 * p->caprows : 64;
        dl__prow *nr = (dl__prow *)DL_REALLOC(p->rows, sizeof(dl__prow) * (size_t)cap);
        if (!nr) return -1;
        p->rows = nr;
        p->caprows = cap;
    }
    r = &p->rows[p->nrows];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->bwd = bwd;
    r->dev = dev;
    r->hash = h;
    p->ht[k] = p->nrows + 1;
    return p->nrows++;
}

static bool dl__prof_grow(void **a, int *cap, int need, size_t esize)
{
    int n;
    void *q;
    if (need <= *cap) return true;
    n = *cap ? 2 * *cap : 1024;
    while (n < need) n *= 2;
    q = DL_REALLOC(*a, esize * (size_t)n);
    if (!q) return false;
    *a = q;
    *cap = n;
    return true;
}

/* the open span on top, if it is name's (forward op) or name's backward */
static dl__pspan *dl__prof_is_top(dl__prof *p, const char *name, bool bwd)
{
    dl__pspan *s;
    if (p->depth == 0) return NULL;
    s = &p->span[p->stack[p->depth - 1]];
    if (p->rows[s->row].bwd != bwd || (s->name != name && strcmp(s->name, name) != 0)) return NULL;
    return s;
}

static const char *dl__prof_top(const dl_ctx *ctx)
{
    const dl__prof *p = ctx->prof;
    const dl__pspan *s;
    if (!p || p->depth == 0) return NULL;
    s = &p->span[p->stack[p->depth - 1]];
    return p->rows[s->row].bwd ? NULL : s->name;
}

static void dl__prof_begin(dl_ctx *ctx, dl__dev *d, const char *name, bool bwd)
{
    dl__prof *p = ctx->prof;
    dl__pspan *s;
    int row;
    if (!bwd && dl__prof_is_top(p, name, false)) return;   /* the same op checking its next argument */
    row = dl__prof_row(p, name, bwd, d->id);
    if (row < 0 || !dl__prof_grow((void **)&p->span, &p->capspan, p->nspan + 1, sizeof(dl__pspan)) ||
        !dl__prof_grow((void **)&p->stack, &p->capstack, p->depth + 1, sizeof(int))) {
        p->lost++;                       /* out of memory: this call goes uncounted */
        return;
    }
    s = &p->span[p->nspan];
    s->name = name;
    s->dev = d;
    s->row = row;
    s->parent = p->depth ? p->stack[p->depth - 1] : -1;
    s->child = 0.0;
    s->state = 0;
    p->stack[p->depth++] = p->nspan++;
    s->t0 = dl__prof_mark(d);            /* last: the bookkeeping above is not the op's time */
    if (s->t0 < 0) { s->state = 2; p->lost++; }
}

static void dl__prof_resolve(dl_ctx *ctx);

static void dl__prof_end(dl_ctx *ctx, const char *name, bool bwd)
{
    dl__prof *p = ctx->prof;
    dl__pspan *s = dl__prof_is_top(p, name, bwd);
    if (!s) return;                      /* no span of this op is open: an internal helper's end */
    s->t1 = dl__prof_mark(s->dev);
    if (s->state == 0) s->state = s->t1 < 0 ? 2 : 1;
    if (s->t1 < 0) p->lost++;
    p->depth--;
    p->dirty = true;
    if (p->depth == 0 && p->nspan >= DL__PROF_MAX_PENDING) dl__prof_resolve(ctx);
}

/* the op named failed without an error (a NULL result): its span goes */
static void dl__prof_drop(dl_ctx *ctx, const char *name)
{
    dl__prof *p = ctx->prof;
    dl__pspan *s = dl__prof_is_top(p, name, false);
    if (!s) return;
    s->state = 2;
    p->depth--;
    p->dropped++;
}

/* an error: every open span belongs to a failing op */
static void dl__prof_fail(dl_ctx *ctx)
{
    dl__prof *p = ctx->prof;
    while (p->depth > 0) {
        p->span[p->stack[--p->depth]].state = 2;
        p->dropped++;
    }
}

/* spans into times (the open ones, stale at the points that call this, are
   dropped first): children before their parents, so each parent knows its
   children's totals when its own self time is taken */
static void dl__prof_resolve(dl_ctx *ctx)
{
    dl__prof *p = ctx->prof_data;
    int i;
    if (!p) return;
    while (p->depth > 0) {
        p->span[p->stack[--p->depth]].state = 2;
        p->dropped++;
    }
    for (i = p->nspan - 1; i >= 0; i--) {
        dl__pspan *s = &p->span[i];
        dl__prow *r = &p->rows[s->row];
        double t, self;
        if (s->state != 1) continue;
        t = s->dev->be->prof_seconds ? s->dev->be->prof_seconds(s->dev, s->t0, s->t1)
                                     : 1e-9 * (double)(s->t1 - s->t0);
        if (t < 0) t = 0;
        self = t - s->child;
        r->calls++;
        r->total += t;
        r->self += self > 0 ? self : 0;
        if (s->parent >= 0 && p->span[s->parent].dev == s->dev) p->span[s->parent].child += t;
    }
    p->nspan = 0;
    for (i = 0; i < DL__MAX_CUDA; i++)
        if (ctx->cuda[i] && ctx->cuda[i]->be->prof_release) ctx->cuda[i]->be->prof_release(ctx->cuda[i]);
}

static void dl__prof_step(dl_ctx *ctx)
{
    dl__prof *p = ctx->prof;
    p->steps++;
    if (p->depth > 0 || p->nspan >= DL__PROF_FLUSH) dl__prof_resolve(ctx);
}

void dl_profile_enable(dl_ctx *ctx, bool on)
{
    if (!ctx) return;
    if (on) {
        if (!ctx->prof_data) {
            ctx->prof_data = (dl__prof *)dl__malloc(ctx, sizeof(dl__prof));
            if (!ctx->prof_data) { dl__warn(ctx, "dl_profile_enable: out of memory; not profiling"); return; }
            memset(ctx->prof_data, 0, sizeof(dl__prof));
        }
        ctx->prof = ctx->prof_data;
    } else if (ctx->prof) {
        dl__prof_resolve(ctx);
        ctx->prof = NULL;
    }
}

void dl_profile_reset(dl_ctx *ctx)
{
    dl__prof *p = ctx ? ctx->prof_data : NULL;
    if (!p) return;
    dl__prof_resolve(ctx);
    p->nrows = 0;
    if (p->ht) memset(p->ht, 0, sizeof(int) * (size_t)p->htcap);
    p->steps = p->dropped = p->lost = 0;
    p->dirty = false;
}

/* rows in the table's order: by device (CPU devices, then CUDA, by
   index), then by total time, largest first (ties: by name) */
static int dl__prof_cmp(const dl__prow *x, const dl__prow *y)
{
    int c;
    if (x->dev.type != y->dev.type) return x->dev.type < y->dev.type ? -1 : 1;
    if (x->dev.index != y->dev.index) return x->dev.index < y->dev.index ? -1 : 1;
    if (x->total != y->total) return x->total > y->total ? -1 : 1;
    c = strcmp(x->name, y->name);
    return c ? c : (int)x->bwd - (int)y->bwd;
}

/* the row indices in order (NULL with none, or out of memory) */
static int *dl__prof_order(dl_ctx *ctx, int *n)
{
    dl__prof *p = ctx->prof_data;
    int *ix, i;
    *n = 0;
    if (!p) return NULL;
    dl__prof_resolve(ctx);
    if (!p->nrows) return NULL;
    ix = (int *)DL_MALLOC(sizeof(int) * (size_t)p->nrows);
    if (!ix) return NULL;
    for (i = 0; i < p->nrows; i++) {     /* insertion sort: tens of rows, no global for qsort */
        int j = i, v = i;
        while (j > 0 && dl__prof_cmp(&p->rows[v], &p->rows[ix[j - 1]]) < 0) { ix[j] = ix[j - 1]; j--; }
        ix[j] = v;
    }
    *n = p->nrows;
    return ix;
}

static void dl__prof_name(const dl__prow *r, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", r->name, r->bwd ? " backward" : "");
}

int dl_profile_rows(dl_ctx *ctx, dl_profile_row *rows, int cap)
{
    int n, i, *ix;
    if (!ctx) return 0;
    ix = dl__prof_order(ctx, &n);
    for (i = 0; rows && i < n && i < cap; i++) {
        const dl__prow *r = &ctx->prof_data->rows[ix[i]];
        dl__prof_name(r, rows[i].name, sizeof rows[i].name);
        rows[i].device = r->dev;
        rows[i].calls = r->calls;
        rows[i].self_s = r->self;
        rows[i].total_s = r->total;
    }
    DL_FREE(ix);
    return n;
}

/* PyTorch's _format_time: 1.234ms, 56.000us, 2.500s */
static const char *dl__prof_time(double s, char *buf, size_t cap)
{
    double us = 1e6 * s;
    if (us >= 1e6) snprintf(buf, cap, "%.3fs", us / 1e6);
    else if (us >= 1e3) snprintf(buf, cap, "%.3fms", us / 1e3);
    else snprintf(buf, cap, "%.3fus", us);
    return buf;
}

/* One table per device, as PyTorch's key_averages().table(): names right-
   aligned, then Self %, Self, Total %, Total, average and calls; the
   percentages of the device's self time in all (the footer line). */
dl_result dl_profile_print(dl_ctx *ctx, void *stream)
{
    FILE *f = stream ? (FILE *)stream : stderr;
    dl__prof *p;
    int n, i, j, w = 4, *ix;
    char dash[128], name[80], t[6][32];
    if (!ctx) return DL_ERR_ARG;
    p = ctx->prof_data;
    ix = dl__prof_order(ctx, &n);
    if (!n) {
        DL_FREE(ix);
        if (p && p->nrows) { dl__err(ctx, DL_ERR_OOM, "dl_profile_print: out of memory"); return DL_ERR_OOM; }
        fprintf(f, "dl.h profile: nothing recorded (DL_PROFILE=1, dl_ctx_desc.profile or dl_profile_enable)\n");
        if (fflush(f) != 0 || ferror(f)) {
            dl__err(ctx, DL_ERR_IO, "dl_profile_print: writing failed (%s)", dl__errno_str(errno));
            return DL_ERR_IO;
        }
        return DL_OK;
    }
    for (i = 0; i < n; i++) {
        dl__prof_name(&p->rows[ix[i]], name, sizeof name);
        if ((int)strlen(name) > w) w = (int)strlen(name);
    }
    memset(dash, '-', sizeof dash);
    dash[w < 100 ? w : 100] = 0;
    for (i = 0; i < n; i = j) {
        dl_device dev = p->rows[ix[i]].dev;
        bool gpu = dev.type == DL_DEVICE_CUDA;
        const char *u = gpu ? "CUDA" : "CPU";
        double all = 0;
        int64_t calls = 0;
        char lab[32];
        for (j = i; j < n && p->rows[ix[j]].dev.type == dev.type && p->rows[ix[j]].dev.index == dev.index; j++) {
            all += p->rows[ix[j]].self;
            calls += p->rows[ix[j]].calls;
        }
        fprintf(f, "dl.h profile of %s (%s), %lld steps, %lld calls\n", dl__dev_str(dev, lab, sizeof lab),
                gpu ? "CUDA events: the time of the device's stream" : "host wall time",
                (long long)p->steps, (long long)calls);
        fprintf(f, "%s  ------------  ------------  ------------  ------------  ------------  ------------\n", dash);
        snprintf(t[0], sizeof t[0], "Self %s %%", u);
        snprintf(t[1], sizeof t[1], "Self %s", u);
        snprintf(t[2], sizeof t[2], "%s total %%", u);
        snprintf(t[3], sizeof t[3], "%s total", u);
        snprintf(t[4], sizeof t[4], "%s time avg", u);
        fprintf(f, "%*s  %12s  %12s  %12s  %12s  %12s  %12s\n", w, "Name", t[0], t[1], t[2], t[3], t[4], "# of Calls");
        fprintf(f, "%s  ------------  ------------  ------------  ------------  ------------  ------------\n", dash);
        for (; i < j; i++) {
            const dl__prow *r = &p->rows[ix[i]];
            char pc[2][32];
            dl__prof_name(r, name, sizeof name);
            snprintf(pc[0], sizeof pc[0], "%.2f%%", all > 0 ? 100.0 * r->self / all : 0.0);
            snprintf(pc[1], sizeof pc[1], "%.2f%%", all > 0 ? 100.0 * r->total / all : 0.0);
            fprintf(f, "%*s  %12s  %12s  %12s  %12s  %12s  %12lld\n", w, name, pc[0],
                    dl__prof_time(r->self, t[0], sizeof t[0]), pc[1], dl__prof_time(r->total, t[1], sizeof t[1]),
                    dl__prof_time(r->calls ? r->total / (double)r->calls : 0.0, t[2], sizeof t[2]),
                    (long long)r->calls);
        }
        fprintf(f, "%s  ------------  ------------  ------------  ------------  ------------  ------------\n", dash);
        fprintf(f, "Self %s time total: %s\n", u, dl__prof_time(all, t[0], sizeof t[0]));
        i = j;
    }
    if (p->dropped || p->lost)
        fprintf(f, "(not counted: %lld calls of ops that failed, %lld without a time mark)\n",
                (long long)p->dropped, (long long)p->lost);
    DL_FREE(ix);
    if (fflush(f) != 0 || ferror(f)) {
        dl__err(ctx, DL_ERR_IO, "dl_profile_print: writing the table failed (%s)", dl__errno_str(errno));
        return DL_ERR_IO;
    }
    p->dirty = false;
    return DL_OK;
}

/* dl_ctx_free: the table (to stderr) when something was recorded since
   it was last printed, then the profiler's memory */
static void dl__prof_free(dl_ctx *ctx)
{
    dl__prof *p = ctx->prof_data;
    if (!p) return;
    if (p->dirty) dl_profile_print(ctx, NULL);
    ctx->prof = ctx->prof_data = NULL;
    DL_FREE(p->rows);
    DL_FREE(p->ht);
    DL_FREE(p->span);
    DL_FREE(p->stack);
    DL_FREE(p);
}

#endif /* DL__IMPLEMENTED */
#endif /* DL_IMPLEMENTATION */

/*
   LICENSE: MIT No Attribution

   Copyright 2026 the dl.h authors

   Permission is hereby granted, free of charge, to any person obtaining a copy
   of this software and associated documentation files (the "Software"), to
   deal in the Software without restriction, including without limitation the
   rights to use, copy, modify, merge, publish, distribute, sublicense, and/or
   sell copies of the Software, and to permit persons to whom the Software is
   furnished to do so.

   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
   IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
   FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
   AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
   LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING
   FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS
   IN THE SOFTWARE.
*/
