/* The peer map (transport/shm_peermap.c) against table entries a peer
 * controls: it maps a peer's block only when the block's memfd is sealed
 * against resizing and as large as the entry claims, and hands out a
 * pointer only for a range wholly inside the block, whatever the entry's
 * fields say.  Anything else is left to CMA (NULL), which the kernel
 * checks.  The "peer" is this process (pidfd_getfd of our own fds).
 *
 * Built from the files it tests (CMakeLists.txt: unit tests), not against
 * the library, whose internals are hidden. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transport/shm_peermap.h"

#include "../c/unit_check.h"

#define BLOCK (64u << 10)
#define BASE 0x7f0000000000ull /* the block's start in the "owner" */

static mr_shared_t *table;

/* An entry for the block in fd, claiming len bytes at BASE. */
static mr_entry_t entry_for(int fd, uint64_t len) {
    struct stat sb;
    CHECK(fstat(fd, &sb) == 0);
    return (mr_entry_t){.block_fd = fd, .block_ino = (uint64_t)sb.st_ino, .block_base = BASE, .block_len = len};
}

/* A sealed block is mapped, and is the very memory of the file. */
static void case_sealed_block(void) {
    int fd;
    CHECK(memfd_sealed("unit-block", BLOCK, &fd) == SLIME_OK);
    peermap_t *m = peermap_new(getpid(), table);
    CHECK(m);
    mr_entry_t e = entry_for(fd, BLOCK);
    uint8_t *p = peermap_lookup(m, &e, BASE + 100, 200);
    if (!p) { /* pidfd_getfd refused here: nothing maps, nothing to prove */
        printf("unit_peermap: pidfd_getfd is not permitted here; skipped\n");
        exit(77);
    }
    memcpy(p, "peer", 4);
    char back[4];
    CHECK(pread(fd, back, 4, 100) == 4 && memcmp(back, "peer", 4) == 0);
    /* the whole block, and its last byte */
    CHECK(peermap_lookup(m, &e, BASE, BLOCK) != NULL);
    CHECK(peermap_lookup(m, &e, BASE + BLOCK - 1, 1) != NULL);
    peermap_free(m);
    close(fd);
}

/* Ranges not wholly inside the block: before it, across its end, larger
 * than it, wrapping around 2^64. */
static void case_ranges_outside(void) {
    int fd;
    CHECK(memfd_sealed("unit-block", BLOCK, &fd) == SLIME_OK);
    peermap_t *m = peermap_new(getpid(), table);
    mr_entry_t e = entry_for(fd, BLOCK);
    CHECK(peermap_lookup(m, &e, BASE - 1, 2) == NULL);
    CHECK(peermap_lookup(m, &e, BASE + BLOCK - 100, 200) == NULL);
    CHECK(peermap_lookup(m, &e, BASE, BLOCK + 1) == NULL);
    CHECK(peermap_lookup(m, &e, UINT64_MAX - 10, 100) == NULL);
    peermap_free(m);
    close(fd);
}

/* A block the peer could shrink after we mapped it (a SIGBUS on our next
 * copy), or one smaller than the entry claims: never mapped. */
static void case_unsealed_or_short(void) {
    int fd = memfd_create("unit-unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    CHECK(fd >= 0 && ftruncate(fd, BLOCK) == 0);
    peermap_t *m = peermap_new(getpid(), table);
    mr_entry_t e = entry_for(fd, BLOCK);
    CHECK(peermap_lookup(m, &e, BASE, 8) == NULL);
    /* sealed against shrinking only: it may still grow, and the seal
     * check asks for both */
    CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
    CHECK(peermap_lookup(m, &e, BASE, 8) == NULL);
    close(fd);
    int sealed;
    CHECK(memfd_sealed("unit-block", BLOCK, &sealed) == SLIME_OK);
    e = entry_for(sealed, 4 * BLOCK); /* claims more than the file has */
    CHECK(peermap_lookup(m, &e, BASE + 2 * BLOCK, 8) == NULL);
    peermap_free(m);
    close(sealed);
}

int main(void) {
    table = calloc(1, sizeof *table);
    CHECK(table);
    case_sealed_block();
    case_ranges_outside();
    case_unsealed_or_short();
    free(table);
    printf("unit_peermap: all cases passed\n");
    return 0;
}
