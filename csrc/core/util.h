/* Small helpers shared by the core: intrusive lists, clocks, spinning. */
#ifndef SLIME_UTIL_H
#define SLIME_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct slime_list {
    struct slime_list *prev, *next;
} slime_list_t;

static inline void list_init(slime_list_t *h) { h->prev = h->next = h; }
static inline int list_empty(const slime_list_t *h) { return h->next == h; }
static inline void list_push_back(slime_list_t *h, slime_list_t *n) {
    n->prev = h->prev;
    n->next = h;
    h->prev->next = n;
    h->prev = n;
}
static inline void list_del(slime_list_t *n) {
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n; /* deleting twice is harmless */
}
static inline int list_linked(const slime_list_t *n) { return n->next != n; }

#define container_of(p, type, member) \
    ((type *)((char *)(p) - offsetof(type, member)))
#define list_first(h, type, member) \
    (list_empty(h) ? NULL : container_of((h)->next, type, member))
/* Iterate allowing deletion of the current node. */
#define list_for_each_safe(pos, tmp, h) \
    for (pos = (h)->next, tmp = pos->next; pos != (h); pos = tmp, tmp = pos->next)

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A field of memory another process may write at any time (shared
 * memory), read exactly once: what is checked is what is used. */
static inline uint64_t read_once_u64(const uint64_t *p) { return *(const volatile uint64_t *)p; }

/* A monotonic time (now_ns's clock) as pthread_cond_timedwait takes it. */
static inline struct timespec timespec_at_ns(uint64_t t) {
    struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull), .tv_nsec = (long)(t % 1000000000ull)};
    return ts;
}

/* A condition variable whose timed waits take now_ns's clock. */
static inline void cond_init_monotonic(pthread_cond_t *cond) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &ca);
    pthread_condattr_destroy(&ca);
}

/* now + ms, saturating: an "infinite" timeout never wraps into the past. */
static inline uint64_t deadline_after_ms(int64_t ms) {
    const int64_t cap = 100ll * 365 * 24 * 3600 * 1000; /* a century */
    if (ms < 0) ms = 0;
    if (ms > cap) ms = cap;
    return now_ns() + (uint64_t)ms * 1000000ull;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* Room for element n of a growing array of *cap elements of elem bytes:
 * arr itself while n < *cap, else the array doubled (first elements the
 * first time) with *cap updated; NULL when out of memory, arr intact. */
static inline void *array_room(void *arr, size_t n, size_t *cap, size_t elem, size_t first) {
    if (n < *cap) return arr;
    size_t c = *cap ? 2 * *cap : first;
    void *grown = realloc(arr, c * elem);
    if (grown) *cap = c;
    return grown;
}

/* Reads a size from the environment (decimal, optional K/M/G suffix);
 * unset, empty or 0 gives dflt. */
size_t env_size(const char *name, size_t dflt);

/* Whether a feature switch in the environment is turned off: set to a
 * value starting with '0'.  Unset means on. */
bool env_off(const char *name);

#endif
