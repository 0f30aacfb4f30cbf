/* Shared blocks: memory that same-host peers map and copy with plain
 * loads and stores, and the memory domain of regions inside it.
 *
 * Why: a one-sided op into ordinary memory goes by process_vm_readv/
 * writev, which pins and maps the target's pages for every call and runs
 * at well under memcpy's speed.  Memory from slime_mem_alloc is a memfd
 * mapping; the block domain claims a region registered inside it and
 * packs the memfd's number, its inode and where the block starts into the
 * owner's table entry, so a peer that may use CMA on the owner (the same
 * ptrace check) fetches the memfd with pidfd_getfd once, maps it, and
 * from then on copies with memcpy (the peer map of the same-host
 * transport).  Every access still pins and checks the owner's table
 * entry, exactly as a CMA access does.  A block is host memory too: it
 * registers and copies as the host domain does.
 *
 * The registry is process-wide: memory outlives contexts, and a block
 * may be registered with several.  A block with live registrations
 * cannot be freed (its memfd number must stay valid while peers may ask
 * for it); freeing bumps the free count in every context's MR table, so
 * peers drop the mappings that would keep freed pages alive. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/md.h"

typedef struct shmem_block {
    md_memh_t h;               /* a region's handle in the block domain */
    uint8_t *addr;
    size_t len;
    int fd;
    uint64_t ino;
    int regs;                  /* live registrations inside it */
} shmem_block_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static shmem_block_t **g_blocks; /* each apart: a region's handle points at it */
static size_t g_n, g_cap;
/* Every context's MR table, whose mem_frees each free bumps. */
static mr_shared_t **g_tables;
static size_t g_n_tables, g_cap_tables;

/* Under g_lock: the block holding all of [addr, +len), or NULL. */
static shmem_block_t *block_find(const void *addr, size_t len) {
    const uint8_t *a = addr;
    for (size_t i = 0; i < g_n; i++) {
        shmem_block_t *b = g_blocks[i];
        if (a >= b->addr && len <= b->len && (size_t)(a - b->addr) <= b->len - len) return b;
    }
    return NULL;
}

/* Maps a new memfd of len bytes (rounded up to pages) into *b. */
static slime_status_t block_map(size_t len, shmem_block_t *b) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (len > SIZE_MAX - page) return slime_errorf(SLIME_ERR_INVAL, "mem_alloc: %zu bytes is too large", len);
    size_t rounded = (len + page - 1) / page * page;
    int fd;
    slime_status_t st = memfd_sealed("dlslime-mem", rounded, &fd);
    if (st != SLIME_OK) return st;
    struct stat sb;
    void *p = MAP_FAILED;
    if (fstat(fd, &sb) < 0 ||
        (p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        int e = errno;
        close(fd);
        return slime_errorf(e == ENOMEM ? SLIME_ERR_NOMEM : SLIME_ERR_SYSTEM, "mem_alloc of %zu bytes: %s",
                            len, strerror(e));
    }
    *b = (shmem_block_t){.addr = p, .len = rounded, .fd = fd, .ino = (uint64_t)sb.st_ino};
    return SLIME_OK;
}

slime_status_t slime_mem_alloc(size_t len, void **out) {
    if (out) *out = NULL;
    if (!out || len == 0) return slime_errorf(SLIME_ERR_INVAL, "mem_alloc: %s", out ? "zero length" : "NULL output");
    shmem_block_t blk;
    slime_status_t st = block_map(len, &blk);
    if (st != SLIME_OK) return st;
    pthread_mutex_lock(&g_lock);
    shmem_block_t **grown = array_room(g_blocks, g_n, &g_cap, sizeof *g_blocks, 16);
    if (grown) g_blocks = grown;
    shmem_block_t *b = grown ? malloc(sizeof *b) : NULL;
    if (!b) {
        pthread_mutex_unlock(&g_lock);
        munmap(blk.addr, blk.len);
        close(blk.fd);
        return slime_errorf(SLIME_ERR_NOMEM, "mem_alloc: registry");
    }
    *b = blk;
    g_blocks[g_n++] = b;
    pthread_mutex_unlock(&g_lock);
    *out = blk.addr;
    return SLIME_OK;
}

slime_status_t slime_mem_free(void *addr) {
    if (!addr) return SLIME_OK;
    pthread_mutex_lock(&g_lock);
    size_t i = 0;
    while (i < g_n && g_blocks[i]->addr != addr) i++;
    if (i == g_n) {
        pthread_mutex_unlock(&g_lock);
        return slime_errorf(SLIME_ERR_INVAL, "mem_free: %p was not returned by slime_mem_alloc", addr);
    }
    shmem_block_t *b = g_blocks[i];
    if (b->regs > 0) {
        int regs = b->regs;
        pthread_mutex_unlock(&g_lock);
        return slime_errorf(SLIME_ERR_BUSY, "mem_free: %d registered regions still lie in the block; "
                            "deregister them first", regs);
    }
    g_blocks[i] = g_blocks[--g_n];
    for (size_t t = 0; t < g_n_tables; t++) atomic_fetch_add(&g_tables[t]->mem_frees, 1);
    pthread_mutex_unlock(&g_lock);
    munmap(b->addr, b->len);
    close(b->fd);
    free(b);
    return SLIME_OK;
}

/* ---- the block domain ---- */

static bool block_detect(md_t *md, const void *addr, size_t len, int *device) {
    (void)md;
    *device = -1;
    pthread_mutex_lock(&g_lock);
    bool in = block_find(addr, len) != NULL;
    pthread_mutex_unlock(&g_lock);
    return in;
}

/* The handle is the block: a block with registrations stays allocated. */
static slime_status_t block_reg(md_t *md, void *addr, size_t len, unsigned access, unsigned flags,
                                md_memh_t **memh) {
    slime_status_t st = md_host_reg(md, addr, len, access, flags, memh);
    if (st != SLIME_OK) return st;
    pthread_mutex_lock(&g_lock);
    shmem_block_t *b = block_find(addr, len);
    if (b) b->regs++;
    pthread_mutex_unlock(&g_lock);
    *memh = b ? &b->h : NULL;
    return SLIME_OK;
}

static void block_unreg(md_t *md, md_memh_t *memh) {
    (void)md;
    shmem_block_t *b = container_of(memh, shmem_block_t, h);
    pthread_mutex_lock(&g_lock);
    b->regs--;
    pthread_mutex_unlock(&g_lock);
}

static void block_pack(md_t *md, const slime_mr_t *mr, const md_memh_t *memh, mr_entry_t *e) {
    (void)md;
    (void)mr;
    e->block_fd = -1;
    if (!memh) return;
    const shmem_block_t *b = container_of(memh, shmem_block_t, h);
    e->block_fd = b->fd;
    e->block_ino = b->ino;
    e->block_base = (uint64_t)(uintptr_t)b->addr;
    e->block_len = b->len;
}

const md_ops_t slime_block_md = {
    .size = sizeof(md_ops_t),
    .name = "block",
    .detect = block_detect,
    .reg = block_reg,
    .unreg = block_unreg,
    .pack = block_pack,
    .copy_in = md_host_copy,
    .copy_out = md_host_copy,
};

slime_status_t shmem_table_add(mr_shared_t *t) {
    pthread_mutex_lock(&g_lock);
    mr_shared_t **grown = array_room(g_tables, g_n_tables, &g_cap_tables, sizeof *g_tables, 4);
    if (!grown) {
        pthread_mutex_unlock(&g_lock);
        return slime_errorf(SLIME_ERR_NOMEM, "ctx_create: shared allocation registry");
    }
    g_tables = grown;
    g_tables[g_n_tables++] = t;
    pthread_mutex_unlock(&g_lock);
    return SLIME_OK;
}

void shmem_table_remove(mr_shared_t *t) {
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n_tables; i++)
        if (g_tables[i] == t) {
            g_tables[i] = g_tables[--g_n_tables];
            break;
        }
    pthread_mutex_unlock(&g_lock);
}
