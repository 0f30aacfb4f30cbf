/* Huge pages under registered regions (the host memory domain, core/md_host.c).
 *
 * collapse: registering ordinary memory for remote access backs its whole
 * 2 MiB pages with huge pages (seen in /proc/self/smaps) and changes no
 * byte of it; a region for local use only, any region while
 * DLSLIME_MR_HUGEPAGES=0, and memory marked MADV_NOHUGEPAGE are left on
 * small pages.  Where the kernel cannot collapse memory at all (a kernel
 * before 6.1, THP "never") only the bytes are checked, and where THP is
 * "always" (memory may be huge before anyone asks) the small-page checks
 * are skipped; the log says so.
 *
 * read_write: a peer reads and writes a region that starts and ends
 * inside huge pages, at offsets that cross their edges, byte for byte. */
#include "harness.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#define HUGE (2u << 20)
#define AREA (12u << 20)

/* An anonymous mapping of AREA bytes whose start is HUGE-aligned, with
 * every page touched: on small pages unless THP is "always". */
static uint8_t *area_new(void)
{
    uint8_t *raw = mmap(NULL, AREA + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    H_CHECK(raw != MAP_FAILED);
    uint8_t *a = (uint8_t *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    /* the mapping becomes exactly [a, a + AREA) */
    if (a > raw) H_CHECK(munmap(raw, (size_t)(a - raw)) == 0);
    if (a < raw + HUGE) H_CHECK(munmap(a + AREA, (size_t)(raw + HUGE - a)) == 0);
    h_fill(a, AREA, 5, 0);
    return a;
}

/* THP "always": pages may be huge from the first touch. */
static bool thp_always(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    if (f) {
        if (!fgets(line, sizeof line, f)) line[0] = 0;
        fclose(f);
    }
    bool always = strstr(line, "[always]") != NULL;
    if (always) h_log("THP is \"always\": the small-page checks are skipped");
    return always;
}

/* Kilobytes of [a, a + len) on huge pages: the AnonHugePages of the
 * mappings that lie inside the range. */
static size_t huge_kib(const uint8_t *a, size_t len)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    H_CHECK(f != NULL);
    char line[512];
    bool inside = false;
    size_t kib = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, v;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = lo >= (uintptr_t)a && hi <= (uintptr_t)a + len;
        else if (inside && sscanf(line, "AnonHugePages: %lu kB", &v) == 1)
            kib += v;
    }
    fclose(f);
    return kib;
}

/* Whether this kernel collapses memory on request at all. */
static bool kernel_collapses(void)
{
    uint8_t *a = area_new();
    bool ok = madvise(a, HUGE, MADV_COLLAPSE) == 0;
    if (!ok) h_log("MADV_COLLAPSE: %s: only the bytes are checked", strerror(errno));
    munmap(a, AREA);
    return ok;
}

static void case_collapse(h_rank_t *r)
{
    bool collapses = kernel_collapses(), small = !thp_always();
    /* remote access, starting 100 bytes into a huge page: 4 whole ones */
    uint8_t *a = area_new();
    if (small) H_CHECK_EQ(huge_kib(a, AREA), 0);
    slime_mr_t *mr = h_mr_reg(r->ctx, a + 100, AREA - 200, SLIME_ACCESS_REMOTE_READ);
    H_CHECK_PATTERN(a, AREA, 5, 0);
    /* the region's whole huge pages, and under THP "always" maybe the
     * edges' too (they were huge from the first touch) */
    size_t want = (AREA - 2 * HUGE) >> 10, got = huge_kib(a, AREA);
    if (collapses) H_CHECK(small ? got == want : got >= want);
    H_CHECK_OK(slime_mr_dereg(mr));
    H_CHECK_PATTERN(a, AREA, 5, 0);

    /* local use only: nothing to gain, memory left alone */
    uint8_t *b = area_new();
    mr = h_mr_reg(r->ctx, b, AREA, 0);
    if (small) H_CHECK_EQ(huge_kib(b, AREA), 0);
    H_CHECK_OK(slime_mr_dereg(mr));

    /* turned off */
    uint8_t *c = area_new();
    setenv("DLSLIME_MR_HUGEPAGES", "0", 1);
    mr = h_mr_reg(r->ctx, c, AREA, SLIME_ACCESS_ALL);
    unsetenv("DLSLIME_MR_HUGEPAGES");
    if (small) H_CHECK_EQ(huge_kib(c, AREA), 0);
    H_CHECK_PATTERN(c, AREA, 5, 0);
    H_CHECK_OK(slime_mr_dereg(mr));

    /* the owner said no huge pages */
    uint8_t *d = area_new();
    H_CHECK(madvise(d, AREA, MADV_NOHUGEPAGE) == 0);
    mr = h_mr_reg(r->ctx, d, AREA, SLIME_ACCESS_ALL);
    if (small) H_CHECK_EQ(huge_kib(d, AREA), 0);
    H_CHECK_OK(slime_mr_dereg(mr));
}

/* Rank 1 registers [a + 100, a + AREA - 100); rank 0 reads it all, then
 * writes a new pattern over a span that crosses three huge-page edges. */
static void case_read_write(h_rank_t *r)
{
    const size_t len = AREA - 200, woff = HUGE - 4097, wlen = 2 * HUGE + 8193;
    if (r->rank == 1) {
        uint8_t *a = area_new();
        h_fill(a + 100, len, 11, 0);
        slime_mr_t *mr = h_mr_reg(r->ctx, a + 100, len, SLIME_ACCESS_ALL);
        h_send_desc(r, 0, mr);
        (void)h_ctl_recv_u64(r, 0); /* rank 0 is done */
        H_CHECK_PATTERN(a + 100, woff, 11, 0);
        H_CHECK_PATTERN(a + 100 + woff, wlen, 12, 0);
        H_CHECK_PATTERN(a + 100 + woff + wlen, len - woff - wlen, 11, woff + wlen);
        H_CHECK_OK(slime_mr_dereg(mr));
        return;
    }
    slime_mr_desc_t d = h_recv_desc(r, 1);
    uint8_t *buf = h_alloc(len);
    slime_mr_t *mr = h_mr_reg(r->ctx, buf, len, 0);
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_read(r->ep[1], mr, 0, &d, 0, len, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(buf, len, 11, 0);
    h_fill(buf, wlen, 12, 0);
    H_CHECK_OK(slime_write(r->ep[1], mr, 0, &d, woff, wlen, &req));
    H_WAIT_FREE(req, SLIME_OK);
    h_ctl_send_u64(r, 1, 1);
    H_CHECK_OK(slime_mr_dereg(mr));
    free(buf);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"collapse", case_collapse, 1, false, 0},
        {"read_write", case_read_write, 2, false, 0},
    };
    return h_main("test_hugepages", cases, sizeof cases / sizeof cases[0], argc, argv);
}
