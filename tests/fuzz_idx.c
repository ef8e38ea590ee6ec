/* tests/fuzz_idx.c - libFuzzer target for the IDX parser.
   make fuzz (clang -fsanitize=fuzzer,address,undefined). */
#define DL_IMPLEMENTATION
#include "dl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dl_ctx_desc d;
    dl_ctx *ctx;
    dl_tensor *t = NULL;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.memory_limit = (size_t)64 << 20;
    ctx = dl_ctx_init(&d);
    if (!ctx) return 0;
    if (dl__idx_parse(ctx, "fuzz", data, size, (size & 1) ? DL_DTYPE_F32 : DL_DTYPE_I64, &t) == DL_OK && t) {
        volatile float s = 0;
        if (t->numel > 0) {   /* the last value, read through the backend (no host dereference of t->data) */
            size_t e = t->dtype == DL_DTYPE_F32 ? 4 : 8;
            unsigned char v[8];
            float f;
            int64_t q;
            t->dev_->be->download(t->dev_, v, (const unsigned char *)t->data + (size_t)(t->numel - 1) * e, e);
            if (e == 4) { memcpy(&f, v, 4); s += f; }
            else { memcpy(&q, v, 8); s += (float)q; }
        }
        (void)s;
    }
    dl_ctx_free(ctx);
    return 0;
}
