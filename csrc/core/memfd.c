/* Memfds that cross a process boundary: the rings' segment, the MR table
 * and shared blocks.  A process that maps a peer's memfd faults (SIGBUS)
 * on its next access past the end if the peer shrinks the file, so every
 * memfd we hand out is sealed against resizing before anyone sees it,
 * and one a peer hands us is mapped only if it carries those seals (and
 * is as large as we will map).  F_SEAL_SEAL on ours: a peer that holds
 * the fd cannot add seals of its own (a write seal) either. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/internal.h"

#define RESIZE_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

slime_status_t memfd_sealed(const char *name, size_t len, int *fd_out) {
    *fd_out = -1;
    if (len > (size_t)INT64_MAX) return slime_errorf(SLIME_ERR_INVAL, "%s: %zu bytes is too large", name, len);
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)len) < 0 || fcntl(fd, F_ADD_SEALS, RESIZE_SEALS | F_SEAL_SEAL) < 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return slime_errorf(e == ENOMEM || e == EMFILE ? SLIME_ERR_NOMEM : SLIME_ERR_SYSTEM, "%s of %zu bytes: %s",
                            name, len, strerror(e));
    }
    *fd_out = fd;
    return SLIME_OK;
}

bool memfd_check(int fd, size_t *len, char *why, size_t whylen) {
    int seals = fcntl(fd, F_GET_SEALS);
    struct stat sb;
    if (seals < 0 || (seals & RESIZE_SEALS) != RESIZE_SEALS) {
        snprintf(why, whylen, "%s", seals < 0 ? "not a memfd" : "memfd not sealed against resizing");
        return false;
    }
    if (fstat(fd, &sb) < 0 || sb.st_size < 0) {
        snprintf(why, whylen, "memfd: %s", strerror(errno));
        return false;
    }
    *len = (size_t)sb.st_size;
    return true;
}

int pidfd_of(int pid) { return (int)syscall(SYS_pidfd_open, (pid_t)pid, 0); }

int pidfd_take_fd(int pidfd, int fd) { return (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0); }

int memfd_take_checked(int pidfd, int fd, uint64_t len, uint64_t ino, char *why, size_t whylen) {
    int got = pidfd_take_fd(pidfd, fd);
    if (got < 0) {
        int e = errno;
        snprintf(why, whylen, "fetching it: %s", strerror(e));
        errno = e;
        return -1;
    }
    size_t have = 0;
    struct stat sb;
    bool ok = memfd_check(got, &have, why, whylen);
    if (ok && (have < len || fstat(got, &sb) < 0 || (uint64_t)sb.st_ino != ino)) {
        snprintf(why, whylen, "not the memfd its descriptor names");
        ok = false;
    }
    if (ok) return got;
    close(got);
    errno = EINVAL; /* a peer's claim was wrong: not a reason to stop asking */
    return -1;
}
