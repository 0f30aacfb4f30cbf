/* Shared allocations (slime_mem_alloc): one-sided ops on regions inside
 * them, byte for byte at odd offsets and large sizes; on shm the peer
 * maps the block (seen in its /proc/self/maps) and drops the mapping once
 * the owner frees a block; frees refused while regions are registered. */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK ((24u << 20) + 4096u)
#define SPAN ((9u << 20) + 77u)

/* Mappings of peers' blocks in this process (memfd "dlslime-mem"). */
static int mapped_blocks(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    H_CHECK(f != NULL);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, "memfd:dlslime-mem") != NULL;
    fclose(f);
    return n;
}

static bool on_shm(h_rank_t *r)
{
    return strcmp(slime_ep_transport(r->ep[r->rank ? 0 : 1]), "shm") == 0;
}

static void case_alloc_errors(h_rank_t *r)
{
    void *p = NULL;
    H_CHECK(slime_mem_alloc(0, &p) == SLIME_ERR_INVAL && p == NULL);
    H_CHECK(slime_mem_alloc(16, NULL) == SLIME_ERR_INVAL);
    H_CHECK_OK(slime_mem_free(NULL));
    int x;
    H_CHECK(slime_mem_free(&x) == SLIME_ERR_INVAL);
    H_CHECK_OK(slime_mem_alloc(100, &p));
    H_CHECK(((uint8_t *)p)[99] == 0);
    slime_mr_t *mr = h_mr_reg(r->ctx, (uint8_t *)p + 10, 50, SLIME_ACCESS_ALL);
    H_CHECK(slime_mem_free(p) == SLIME_ERR_BUSY);
    H_CHECK_OK(slime_mr_dereg(mr));
    H_CHECK_OK(slime_mem_free(p));
    H_CHECK(slime_mem_free(p) == SLIME_ERR_INVAL); /* already freed */
}

/* Rank 1 owns two blocks; rank 0 writes into one and reads the other at
 * odd offsets, then rank 1 frees the first and rank 0 reads again. */
static void case_read_write(h_rank_t *r)
{
    if (r->rank == 1) {
        uint8_t *a, *b;
        H_CHECK_OK(slime_mem_alloc(BLOCK, (void **)&a));
        H_CHECK_OK(slime_mem_alloc(BLOCK, (void **)&b));
        h_fill(b, BLOCK, 21, 0);
        slime_mr_t *ma = h_mr_reg(r->ctx, a + 5, BLOCK - 5, SLIME_ACCESS_ALL);
        slime_mr_t *mb = h_mr_reg(r->ctx, b, BLOCK, SLIME_ACCESS_ALL);
        h_send_desc(r, 0, ma);
        h_send_desc(r, 0, mb);
        (void)h_ctl_recv_u64(r, 0); /* rank 0 wrote into a, read b */
        H_CHECK_BYTES(a, 5 + 3, 0);
        H_CHECK_PATTERN(a + 8, SPAN, 7, 1);
        H_CHECK_BYTES(a + 8 + SPAN, BLOCK - 8 - SPAN, 0);
        H_CHECK_PATTERN(b, BLOCK, 21, 0);
        H_CHECK_OK(slime_mr_dereg(ma));
        H_CHECK_OK(slime_mem_free(a));
        h_ctl_send_u64(r, 0, 1);
        (void)h_ctl_recv_u64(r, 0); /* rank 0 read b again */
        H_CHECK_OK(slime_mr_dereg(mb));
        H_CHECK_OK(slime_mem_free(b));
        return;
    }
    slime_mr_desc_t da = h_recv_desc(r, 1), db = h_recv_desc(r, 1);
    uint8_t *buf = h_alloc(SPAN + 1);
    h_fill(buf, SPAN + 1, 7, 0);
    slime_mr_t *mr = h_mr_reg(r->ctx, buf, SPAN + 1, SLIME_ACCESS_ALL);
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_write(r->ep[1], mr, 1, &da, 3, SPAN, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_OK(slime_read(r->ep[1], mr, 0, &db, BLOCK - SPAN - 1 - 3, SPAN + 1, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(buf, SPAN + 1, 21, BLOCK - SPAN - 1 - 3);
    if (on_shm(r)) H_CHECK(mapped_blocks() == 2);
    h_ctl_send_u64(r, 1, 1);
    (void)h_ctl_recv_u64(r, 1); /* rank 1 freed a */
    /* a's region is gone: refused, nothing written */
    H_CHECK_OK(slime_write(r->ep[1], mr, 0, &da, 0, 4096, &req));
    H_WAIT_FREE(req, SLIME_ERR_ACCESS);
    H_CHECK_OK(slime_read(r->ep[1], mr, 0, &db, 0, SPAN, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(buf, SPAN, 21, 0);
    /* the free dropped every mapping of rank 1's blocks; b is mapped again */
    if (on_shm(r)) H_CHECK(mapped_blocks() == 1);
    h_ctl_send_u64(r, 1, 1);
    H_CHECK_OK(slime_mr_dereg(mr));
    free(buf);
}

/* Ops larger than 32 MiB on a mapped block (copied with streaming
 * stores, not memcpy): a write and a read at odd offsets on both sides,
 * byte for byte, the bytes around them untouched. */
#define BIG_BLOCK ((36u << 20) + 4096u)
#define BIG_SPAN ((33u << 20) + 77u)

static void case_large(h_rank_t *r)
{
    if (r->rank == 1) {
        uint8_t *a;
        H_CHECK_OK(slime_mem_alloc(BIG_BLOCK, (void **)&a));
        h_fill(a, BIG_BLOCK, 31, 0);
        slime_mr_t *ma = h_mr_reg(r->ctx, a + 3, BIG_BLOCK - 3, SLIME_ACCESS_ALL);
        h_send_desc(r, 0, ma);
        (void)h_ctl_recv_u64(r, 0); /* rank 0 read, then wrote at 1001 */
        H_CHECK_PATTERN(a, 3 + 1001, 31, 0);
        H_CHECK_PATTERN(a + 3 + 1001, BIG_SPAN, 32, 1);
        H_CHECK_PATTERN(a + 3 + 1001 + BIG_SPAN, BIG_BLOCK - 3 - 1001 - BIG_SPAN, 31, 3 + 1001 + BIG_SPAN);
        H_CHECK_OK(slime_mr_dereg(ma));
        H_CHECK_OK(slime_mem_free(a));
        return;
    }
    slime_mr_desc_t da = h_recv_desc(r, 1);
    uint8_t *buf = h_alloc(BIG_SPAN + 2);
    h_fill(buf, BIG_SPAN + 2, 33, 0);
    slime_mr_t *mr = h_mr_reg(r->ctx, buf, BIG_SPAN + 2, SLIME_ACCESS_ALL);
    slime_req_t *req = NULL;
    H_CHECK_OK(slime_read(r->ep[1], mr, 1, &da, 17, BIG_SPAN, &req));
    H_WAIT_FREE(req, SLIME_OK);
    H_CHECK_PATTERN(buf, 1, 33, 0);
    H_CHECK_PATTERN(buf + 1, BIG_SPAN, 31, 3 + 17);
    H_CHECK_PATTERN(buf + 1 + BIG_SPAN, 1, 33, 1 + BIG_SPAN);
    h_fill(buf, BIG_SPAN + 2, 32, 0);
    H_CHECK_OK(slime_write(r->ep[1], mr, 1, &da, 1001, BIG_SPAN, &req));
    H_WAIT_FREE(req, SLIME_OK);
    if (on_shm(r)) H_CHECK(mapped_blocks() == 1);
    h_ctl_send_u64(r, 1, 1);
    H_CHECK_OK(slime_mr_dereg(mr));
    free(buf);
}

int main(int argc, char **argv)
{
    static const h_case_t cases[] = {
        {"alloc_errors", case_alloc_errors, 1, false, 0},
        {"read_write", case_read_write, 2, false, 0},
        {"large", case_large, 2, false, 0},
    };
    return h_main("test_shmem", cases, sizeof cases / sizeof cases[0], argc, argv);
}
