/* Shared allocations: memory that shm peers map and copy with plain
 * loads and stores.
 *
 * Why: a one-sided op into ordinary memory goes by process_vm_readv/
 * writev, which pins and maps the target's pages for every call and runs
 * at well under memcpy's speed.  Memory from slime_mem_alloc is a memfd
 * mapping; a region registered inside it records the memfd's number, its
 * inode and where the block starts in the owner's table entry, so a peer
 * that may use CMA on the owner (the same ptrace check) fetches the memfd
 * with pidfd_getfd once, maps it, and from then on copies with memcpy
 * (transport/shm_peermap.c).  Every access still pins and checks the
 * owner's table entry, exactly as a CMA access does.
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

#include "core/internal.h"

typedef struct shmem_block {
    uint8_t *addr;
    size_t len;
    int fd;
    uint64_t ino;
    int regs;                  /* live registrations inside it */
} shmem_block_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static shmem_block_t *g_blocks;
static size_t g_n, g_cap;
/* Every context's MR table, whose mem_frees each free bumps. */
static mr_shared_t **g_tables;
static size_t g_n_tables, g_cap_tables;

slime_status_t slime_mem_alloc(size_t len, void **out) {
    if (out) *out = NULL;
    if (!out || len == 0) return slime_errorf(SLIME_ERR_INVAL, "mem_alloc: %s", out ? "zero length" : "NULL output");
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (len > SIZE_MAX - page) return slime_errorf(SLIME_ERR_INVAL, "mem_alloc: %zu bytes is too large", len);
    size_t rounded = (len + page - 1) / page * page;
    int fd = memfd_create("dlslime-mem", MFD_CLOEXEC);
    if (fd < 0) return slime_errorf(SLIME_ERR_SYSTEM, "mem_alloc: memfd_create: %s", strerror(errno));
    struct stat sb;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)rounded) < 0 || fstat(fd, &sb) < 0 ||
        (p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        int e = errno;
        close(fd);
        return slime_errorf(e == ENOMEM ? SLIME_ERR_NOMEM : SLIME_ERR_SYSTEM, "mem_alloc of %zu bytes: %s",
                            len, strerror(e));
    }
    pthread_mutex_lock(&g_lock);
    shmem_block_t *b = array_room(g_blocks, g_n, &g_cap, sizeof *g_blocks, 16);
    if (!b) {
        pthread_mutex_unlock(&g_lock);
        munmap(p, rounded);
        close(fd);
        return slime_errorf(SLIME_ERR_NOMEM, "mem_alloc: registry");
    }
    g_blocks = b;
    g_blocks[g_n++] = (shmem_block_t){.addr = p, .len = rounded, .fd = fd, .ino = (uint64_t)sb.st_ino};
    pthread_mutex_unlock(&g_lock);
    *out = p;
    return SLIME_OK;
}

slime_status_t slime_mem_free(void *addr) {
    if (!addr) return SLIME_OK;
    pthread_mutex_lock(&g_lock);
    size_t i = 0;
    while (i < g_n && g_blocks[i].addr != addr) i++;
    if (i == g_n) {
        pthread_mutex_unlock(&g_lock);
        return slime_errorf(SLIME_ERR_INVAL, "mem_free: %p was not returned by slime_mem_alloc", addr);
    }
    if (g_blocks[i].regs > 0) {
        int regs = g_blocks[i].regs;
        pthread_mutex_unlock(&g_lock);
        return slime_errorf(SLIME_ERR_BUSY, "mem_free: %d registered regions still lie in the block; "
                            "deregister them first", regs);
    }
    shmem_block_t b = g_blocks[i];
    g_blocks[i] = g_blocks[--g_n];
    for (size_t t = 0; t < g_n_tables; t++) atomic_fetch_add(&g_tables[t]->mem_frees, 1);
    pthread_mutex_unlock(&g_lock);
    munmap(b.addr, b.len);
    close(b.fd);
    return SLIME_OK;
}

void shmem_reg(mr_entry_t *e, const void *addr, size_t len) {
    const uint8_t *a = addr;
    e->shm_fd = -1;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n; i++) {
        shmem_block_t *b = &g_blocks[i];
        if (a >= b->addr && len <= b->len && (size_t)(a - b->addr) <= b->len - len) {
            b->regs++;
            e->shm_fd = b->fd;
            e->shm_ino = b->ino;
            e->shm_base = (uint64_t)(uintptr_t)b->addr;
            e->shm_len = b->len;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
}

void shmem_dereg(mr_entry_t *e) {
    if (e->shm_fd < 0) return;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n; i++)
        if ((uint64_t)(uintptr_t)g_blocks[i].addr == e->shm_base) {
            g_blocks[i].regs--;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    e->shm_fd = -1;
}

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
