/* tests/count_alloc.h - a counting host allocator for the tests that check
   memory: cnt_live (blocks allocated and not yet freed: 0 after
   dl_ctx_free means no leak) and cnt_calls (allocator calls: flat in a
   steady loop). Include before dl.h, in the file that defines
   DL_IMPLEMENTATION. */
#ifndef DL_TEST_COUNT_ALLOC_H
#define DL_TEST_COUNT_ALLOC_H
#include <stdlib.h>
static long cnt_live, cnt_calls;
static void *cnt_malloc(size_t n) { void *p = malloc(n); if (p) { cnt_live++; cnt_calls++; } return p; }
static void *cnt_realloc(void *p, size_t n) { void *q = realloc(p, n); if (q && !p) cnt_live++; cnt_calls++; return q; }
static void cnt_free(void *p) { if (p) cnt_live--; free(p); }
#define DL_MALLOC(n) cnt_malloc(n)
#define DL_REALLOC(p, n) cnt_realloc(p, n)
#define DL_FREE(p) cnt_free(p)
#endif
