/* tests/th_impl.c - dl.h's implementation for the test programs that
   share one (the Makefile's LINKED: they reach dl.h only through its API
   and the harness, and are compiled with DL_NO_IMPLEMENTATION), with the
   harness's three calls into the internals (th_prims.h) as external
   functions. Compiling dl.h into each of them took most of make test's
   time. */
#define DL_IMPLEMENTATION
#include "dl.h"
#ifdef __cplusplus
extern "C" {
#endif
#define TH_PRIM   /* (external: harness.h declares them where it links this) */
#include "th_prims.h"
#ifdef __cplusplus
}
#endif
