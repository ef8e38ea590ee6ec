/* tests/harness.h - the tiny test harness every test program uses.
   CHECK(cond, fmt, ...) counts a pass or prints the failure; SKIP(fmt, ...)
   counts a check that could not run and prints why; the program ends with
   TEST_END(), which prints "N passed, M failed" (", K skipped" when K > 0)
   and returns non-zero when anything failed. EXPECT_ERR checks that an op
   failed with a code and a message substring, then clears the error. */
#ifndef DL_TEST_HARNESS_H
#define DL_TEST_HARNESS_H
#include <stdio.h>
#include <string.h>
#include <math.h>

static int th_pass, th_fail, th_skip;

#define CHECK(cond, ...) do { \
    if (cond) th_pass++; \
    else { th_fail++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

#define SKIP(...) do { \
    th_skip++; printf("SKIP %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); \
} while (0)

/* an op returned NULL/err with code and a message containing substr */
#define EXPECT_ERR(ctx, code, substr) do { \
    dl_result th_c = dl_last_error(ctx); const char *th_m = dl_error_message(ctx); \
    CHECK(th_c == (code) && strstr(th_m, (substr)) != NULL, \
          "expected %s with \"%s\", got %s: \"%s\"", dl_result_string(code), (substr), \
          dl_result_string(th_c), th_m); \
    dl_clear_error(ctx); \
} while (0)

#if defined(__GNUC__)
__attribute__((unused))
#endif
static int th_close(const float *a, const float *b, long n, double rtol, double atol, long *where)
{
    long i;
    for (i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= atol + rtol * fabs((double)b[i]))) { if (where) *where = i; return 0; }
    }
    return 1;
}

#define TEST_END() do { \
    if (th_skip) printf("%d passed, %d failed, %d skipped\n", th_pass, th_fail, th_skip); \
    else printf("%d passed, %d failed\n", th_pass, th_fail); \
    return th_fail ? 1 : 0; \
} while (0)

#endif
