/* Freed requests, kept by each thread for its next posts.
 *
 * Every message has a request: allocated when it is posted, freed when
 * its user frees it.  glibc's calloc skips glibc's own per-thread cache,
 * so a request cost about 250 instructions to allocate and 150 to free
 * (callgrind, p2p_bench sendrecv of 8 B): 800 of the 3000 or so that a
 * round trip takes in each process.  A thread keeps a few freed ones
 * and hands them out cleared instead.
 *
 * Under AddressSanitizer nothing is kept: a request used after its free
 * must still be reported. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

/* gcc says so by __SANITIZE_ADDRESS__, clang (the fuzz build) only by
 * __has_feature */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REQ_CACHE_UNDER_ASAN 1
#endif
#endif

#if defined(__SANITIZE_ADDRESS__) || defined(REQ_CACHE_UNDER_ASAN)

slime_req_t *req_cache_take(void) { return calloc(1, sizeof(slime_req_t)); }
void req_cache_give(slime_req_t *r) { free(r); }

#else

#define KEEP 8

static __thread struct {
    slime_req_t *kept[KEEP];
    unsigned n;
    bool registered; /* the exit key is set: its destructor frees them */
} cache;

static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static bool key_made;

static void drop_kept(void *unused) {
    (void)unused;
    while (cache.n) free(cache.kept[--cache.n]);
    /* a request freed by a later exit destructor sets the key again,
     * and the key's destructor then runs once more */
    cache.registered = false;
}

static void key_make(void) { key_made = pthread_key_create(&exit_key, drop_kept) == 0; }

/* Whether this thread's kept requests will be freed when it exits. */
static bool freed_at_exit(void) {
    if (cache.registered) return true;
    pthread_once(&key_once, key_make);
    /* any value but NULL makes the destructor run */
    cache.registered = key_made && pthread_setspecific(exit_key, &cache) == 0;
    return cache.registered;
}

slime_req_t *req_cache_take(void) {
    if (!cache.n) return calloc(1, sizeof(slime_req_t));
    slime_req_t *r = cache.kept[--cache.n];
    memset(r, 0, sizeof *r);
    return r;
}

void req_cache_give(slime_req_t *r) {
    if (cache.n < KEEP && freed_at_exit()) cache.kept[cache.n++] = r;
    else free(r);
}

/* The main thread's, at exit: no key destructor runs for it. */
__attribute__((destructor)) static void drop_main_thread_kept(void) { drop_kept(NULL); }

#endif
