/* Rendezvous by CMA between tcp peers on one host.
 *
 * Why: a peer in another network namespace of this host (a container, a
 * sandbox) cannot use shm, whose handshake goes by an abstract unix
 * socket, and those live per network namespace; over tcp a large message
 * crosses the kernel's stack (a copy in, a copy out, per-segment work on
 * the veth).  Where the kernel lets us read the peer's memory
 * (process_vm_readv: same user, ptrace access), the receiver of a
 * rendezvous copies the message once, straight from the sender's buffer,
 * as the shm transport's one-sided ops do.
 *
 * The pid a peer names (its hello or welcome) is its word only: reading
 * whichever process that is would hand a remote peer the memory of a
 * local one.  So the kernel must vouch that the process owns the other
 * end of this very connection: its network namespace's tcp table has a
 * socket with our connection's addresses mirrored, and one of its fds is
 * that socket.  Peers in our own network namespace reach us by shm where
 * they can; one that uses tcp here was told to (DLSLIME_TRANSPORT=tcp),
 * and gets tcp.  DLSLIME_TCP_CMA: 0 never, 1 every peer proven local
 * (tests), else (default) those in another network namespace.
 *
 * The receiver's progress thread copies a fetch whole and answers no
 * ping meanwhile, while the sender, waiting on it, gives up on a peer
 * silent for DLSLIME_PEER_SILENCE_MS (1 s).  So rendezvous past
 * DLSLIME_TCP_CMA_MAX (default 256 MiB, 50-100 ms of copying) take the
 * socket. */
#include "transport/tcp_cma.h"
#include "transport/sockio.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether two /proc/.../ns/net name one network namespace. */
static bool same_netns(uint32_t pid) {
    char path[64];
    struct stat mine, theirs;
    snprintf(path, sizeof path, "/proc/%u/ns/net", pid);
    if (stat("/proc/self/ns/net", &mine) != 0 || stat(path, &theirs) != 0) return true; /* unknown: no */
    return mine.st_ino == theirs.st_ino && mine.st_dev == theirs.st_dev;
}

/* The inode of the socket in pid's network namespace whose local end is
 * at and remote end is to (IPv4 only, as the transport), or 0. */
static unsigned long mirrored_socket(uint32_t pid, const struct sockaddr_in *at, const struct sockaddr_in *to) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%u/net/tcp", pid);
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    unsigned long found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned la, lp, ra, rp;
        unsigned long inode;
        /* sl: local rem st tx:rx tr:when retrnsmt uid timeout inode; an
         * address is the network-order word printed as a host integer */
        if (sscanf(line, " %*u: %x:%x %x:%x %*x %*x:%*x %*x:%*x %*x %*u %*u %lu", &la, &lp, &ra, &rp, &inode) != 5)
            continue;
        if (la == at->sin_addr.s_addr && lp == ntohs(at->sin_port) && ra == to->sin_addr.s_addr &&
            rp == ntohs(to->sin_port))
            found = inode;
    }
    fclose(f);
    return found;
}

/* Whether one of pid's fds is the socket of that inode. */
static bool holds_socket(uint32_t pid, unsigned long inode) {
    char path[64], want[48], link[48];
    snprintf(path, sizeof path, "/proc/%u/fd", pid);
    int wn = snprintf(want, sizeof want, "socket:[%lu]", inode);
    DIR *d = opendir(path);
    if (!d) return false;
    bool held = false;
    struct dirent *e;
    while (!held && (e = readdir(d))) {
        ssize_t n = readlinkat(dirfd(d), e->d_name, link, sizeof link);
        held = n == wn && memcmp(link, want, (size_t)n) == 0;
    }
    closedir(d);
    return held;
}

/* The kernel's word that pid owns the other end of the tcp socket fd. */
static bool owns_peer_end(int fd, uint32_t pid) {
    struct sockaddr_in mine, theirs;
    if (!sock_inet_ends(fd, &mine, &theirs)) return false;
    unsigned long inode = mirrored_socket(pid, &theirs, &mine);
    return inode && holds_socket(pid, inode);
}

bool tcp_cma_usable(tcp_cma_t *cma, int fd, uint32_t pid, size_t len) {
    if (cma->state == TCP_CMA_UNKNOWN) {
        const char *mode = getenv("DLSLIME_TCP_CMA");
        bool wanted = !(mode && mode[0] == '0') && pid > 0 && (uint32_t)getpid() != pid;
        if (wanted && !(mode && mode[0] == '1')) wanted = !same_netns(pid);
        cma->state = wanted && owns_peer_end(fd, pid) ? TCP_CMA_ON : TCP_CMA_OFF;
        cma->max = env_size("DLSLIME_TCP_CMA_MAX", (size_t)256 << 20);
    }
    return cma->state == TCP_CMA_ON && len <= cma->max;
}
