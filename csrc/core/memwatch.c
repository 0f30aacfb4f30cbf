/* Watched memory (slime_mem_watch): ranges an allocator promises to
 * unwatch before it frees them, so registrations inside them may be kept.
 *
 * A process-wide sorted array of disjoint ranges, searched by bisection.
 * Who keeps registrations subscribes (memwatch_subscribe) and hears of
 * every range that ends, after it left the set: a subscriber that checks
 * "watched?" and stores its entry under its own lock, and takes that lock
 * again to drop entries on notice, can never keep an entry for memory
 * whose unwatch it missed.  The set's lock is never held while a
 * subscriber runs, so subscribers may query the set under their locks. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/memwatch.h"

typedef struct range {
    uintptr_t start, end;
} range_t;

#define MAX_SUBSCRIBERS 64

static pthread_mutex_t set_mu = PTHREAD_MUTEX_INITIALIZER;
static range_t *ranges;
static size_t n_ranges, cap_ranges;
static atomic_size_t n_watched; /* lets unwatch of never-watched memory skip the lock */

static pthread_mutex_t sub_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    memwatch_fn fn;
    void *arg;
} subs[MAX_SUBSCRIBERS];
static size_t n_subs;

/* Under set_mu: index of the first range whose end is past a. */
static size_t first_ending_after(uintptr_t a) {
    size_t lo = 0, hi = n_ranges;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ranges[mid].end <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

slime_status_t slime_mem_watch(void *addr, size_t len) {
    uintptr_t a = (uintptr_t)addr;
    if (!addr || !len || a + len < a)
        return slime_errorf(SLIME_ERR_INVAL, "slime_mem_watch: bad range %p + %zu", addr, len);
    pthread_mutex_lock(&set_mu);
    size_t i = first_ending_after(a);
    if (i < n_ranges && ranges[i].start < a + len) {
        range_t r = ranges[i];
        pthread_mutex_unlock(&set_mu);
        return slime_errorf(SLIME_ERR_INVAL, "slime_mem_watch: %p + %zu overlaps the watched %#lx + %lu", addr, len,
                            (unsigned long)r.start, (unsigned long)(r.end - r.start));
    }
    range_t *grown = array_room(ranges, n_ranges, &cap_ranges, sizeof *ranges, 64);
    if (!grown) {
        pthread_mutex_unlock(&set_mu);
        return slime_errorf(SLIME_ERR_NOMEM, "slime_mem_watch");
    }
    ranges = grown;
    memmove(&ranges[i + 1], &ranges[i], (n_ranges - i) * sizeof *ranges);
    ranges[i] = (range_t){a, a + len};
    n_ranges++;
    atomic_fetch_add(&n_watched, 1);
    pthread_mutex_unlock(&set_mu);
    return SLIME_OK;
}

slime_status_t slime_mem_unwatch(void *addr) {
    uintptr_t a = (uintptr_t)addr;
    range_t gone = {0, 0};
    if (atomic_load(&n_watched)) {
        pthread_mutex_lock(&set_mu);
        size_t i = first_ending_after(a);
        if (i < n_ranges && ranges[i].start == a) {
            gone = ranges[i];
            memmove(&ranges[i], &ranges[i + 1], (n_ranges - i - 1) * sizeof *ranges);
            n_ranges--;
            atomic_fetch_sub(&n_watched, 1);
        }
        pthread_mutex_unlock(&set_mu);
    }
    if (!gone.end) return slime_errorf(SLIME_ERR_INVAL, "slime_mem_unwatch: no watched range starts at %p", addr);
    pthread_mutex_lock(&sub_mu);
    for (size_t k = 0; k < n_subs; k++) subs[k].fn(subs[k].arg, gone.start, gone.end);
    pthread_mutex_unlock(&sub_mu);
    return SLIME_OK;
}

int slime_mem_watched(const void *addr, size_t len) {
    uintptr_t a = (uintptr_t)addr;
    if (!len || a + len < a || !atomic_load(&n_watched)) return 0;
    pthread_mutex_lock(&set_mu);
    size_t i = first_ending_after(a);
    int in = i < n_ranges && ranges[i].start <= a && a + len <= ranges[i].end;
    pthread_mutex_unlock(&set_mu);
    return in;
}

bool memwatch_subscribe(memwatch_fn fn, void *arg) {
    pthread_mutex_lock(&sub_mu);
    bool ok = n_subs < MAX_SUBSCRIBERS;
    if (ok) {
        subs[n_subs].fn = fn;
        subs[n_subs].arg = arg;
        n_subs++;
    }
    pthread_mutex_unlock(&sub_mu);
    return ok;
}

void memwatch_unsubscribe(memwatch_fn fn, void *arg) {
    pthread_mutex_lock(&sub_mu);
    for (size_t k = 0; k < n_subs; k++) {
        if (subs[k].fn != fn || subs[k].arg != arg) continue;
        subs[k] = subs[--n_subs];
        break;
    }
    pthread_mutex_unlock(&sub_mu);
}
