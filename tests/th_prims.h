/* tests/th_prims.h - the harness's three reaches into dl.h's internals: a
   tensor's element size, and its backend's download and upload (which skip
   the transfer points' graph checks, as direct stores would). TH_PRIM is
   their storage class. harness.h makes them static functions where dl.h's
   implementation is in the same file; tests/th_impl.c makes them external
   ones beside the implementation that the Makefile's LINKED tests share
   (those are compiled with DL_NO_IMPLEMENTATION and declare them). */
TH_PRIM size_t th__esize(const dl_tensor *t)
{
    return dl__esize(t->dtype);
}

/* n bytes of t's data from byte off to the host */
TH_PRIM void th__down(dl_tensor *t, void *dst, size_t off, size_t n)
{
    t->dev_->be->download(t->dev_, dst, (const char *)t->data + off, n);
}

/* n bytes from the host into t's data at byte off */
TH_PRIM void th__up(dl_tensor *t, size_t off, const void *src, size_t n)
{
    t->dev_->be->upload(t->dev_, (char *)t->data + off, src, n);
}
