/* The host domain: plain CPU memory, what no other memory domain claims.
 * Its copies are memcpy; its registration moves the region onto huge
 * pages, and keeps no handle.
 *
 * Why huge pages: a same-host peer copies an ordinary (heap) region with
 * process_vm_readv/writev, and the kernel pins the region's pages for
 * every call.  On 4 KiB pages the pinning costs more than the copy:
 * 16 MiB took 2.6 ms against memcpy's 0.9 ms here, while the same call
 * over 2 MiB pages ran at memcpy's speed.  An RDMA device pins and maps
 * fewer pages too.  So registration asks the kernel to move the region's
 * whole huge pages onto huge pages (MADV_COLLAPSE, Linux 6.1+): it copies
 * them once, here, instead of every op paying for small pages.
 *
 * A hint that changes no byte of the region, and only that: the
 * mapping's flags stay as they were (no MADV_HUGEPAGE, so pages faulted
 * in later are the allocator's business, and memory marked
 * MADV_NOHUGEPAGE is left alone, as the kernel refuses it).  Pages never
 * touched are not populated.  Memory the kernel will not collapse
 * (pinned, THP "never", an older kernel) stays as it was and works as
 * before; failures are ignored.  DLSLIME_MR_HUGEPAGES=0 turns it off. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/md.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

static size_t huge_page_size(void) {
    static _Atomic size_t cached;
    size_t sz = atomic_load(&cached);
    if (sz) return sz;
    sz = 2u << 20;
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r");
    if (f) {
        unsigned long long v;
        if (fscanf(f, "%llu", &v) == 1 && v >= 4096 && (v & (v - 1)) == 0) sz = (size_t)v;
        fclose(f);
    }
    atomic_store(&cached, sz);
    return sz;
}

static void use_huge_pages(void *addr, size_t len) {
    if (env_off("DLSLIME_MR_HUGEPAGES")) return;
    size_t huge = huge_page_size();
    uintptr_t start = ((uintptr_t)addr + huge - 1) & ~(uintptr_t)(huge - 1);
    uintptr_t end = ((uintptr_t)addr + len) & ~(uintptr_t)(huge - 1);
    if (end <= start) return; /* no whole huge page inside */
    (void)madvise((void *)start, end - start, MADV_COLLAPSE);
}

static bool host_detect(md_t *md, const void *addr, size_t len, int *device) {
    (void)md;
    (void)addr;
    (void)len;
    *device = -1;
    return true;
}

slime_status_t md_host_reg(md_t *md, void *addr, size_t len, unsigned access, unsigned flags, md_memh_t **memh) {
    (void)md;
    (void)flags;
    *memh = NULL;
    /* only regions peers reach: they will pin it for every op */
    if (access & (SLIME_ACCESS_REMOTE_READ | SLIME_ACCESS_REMOTE_WRITE)) use_huge_pages(addr, len);
    return SLIME_OK;
}

slime_status_t md_host_copy(md_t *md, void *dst, const void *src, size_t len) {
    (void)md;
    memcpy(dst, src, len);
    return SLIME_OK;
}

const md_ops_t slime_host_md = {
    .size = sizeof(md_ops_t),
    .name = "host",
    .detect = host_detect,
    .reg = md_host_reg,
    .copy_in = md_host_copy,
    .copy_out = md_host_copy,
};
