/* Watched memory, inside the library: who keeps registrations hears when
 * a watched range ends (memwatch.c says why that is race-free). */
#ifndef SLIME_MEMWATCH_H
#define SLIME_MEMWATCH_H

#include <stdbool.h>
#include <stdint.h>

/* Called after [start, end) left the watched set, with no lock of the
 * set held; from whichever thread called slime_mem_unwatch. */
typedef void (*memwatch_fn)(void *arg, uintptr_t start, uintptr_t end);

/* false when too many subscribe at once (then keep nothing). */
bool memwatch_subscribe(memwatch_fn fn, void *arg);
void memwatch_unsubscribe(memwatch_fn fn, void *arg);

#endif
