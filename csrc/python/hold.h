/*
 * hold.h - what an in-flight operation needs kept alive: the buffers it
 * reads or writes (acquired Py_buffers), the MemoryRegion objects it uses
 * and private copies of the remote descriptors it names.
 *
 * A hold is released (with the GIL held) once the binding has seen its
 * request complete.  The hold of a request freed while still pending
 * goes to its Context's graveyard instead, because the C library may
 * still copy into that memory; the graveyard is released right after
 * slime_ctx_destroy, when nothing can touch the memory any more.  A
 * buried hold that keeps a MemoryRegion keeps, through it, the Context
 * itself alive: such a Context is freed by close() or at exit, not by
 * dropping the last reference.  That only happens for a send, read or
 * write dropped while in flight.
 */
#ifndef SLIME_PY_HOLD_H
#define SLIME_PY_HOLD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlslime/dlslime.h>

#include "buffer.h"

typedef struct slime_py_hold {
    struct slime_py_hold *next;    /* graveyard list */
    size_t cap;                    /* slots in each array below */
    size_t nbufs;
    size_t nmrs;
    size_t ndescs;
    slime_py_buf_t *bufs;
    PyObject **mrs;                /* SlimeMemoryRegionObject, owned refs */
    slime_mr_desc_t *descs;
} slime_py_hold_t;

/* A hold with room for cap entries of each kind; NULL with MemoryError. */
slime_py_hold_t *slime_py_hold_new(size_t cap);
/* The next buffer slot, to fill with slime_py_buf_get; the hold owns it
 * from then on (an unfilled slot is harmless: it releases as empty). */
slime_py_buf_t *slime_py_hold_next_buf(slime_py_hold_t *hold);
/* Keeps mr alive and counts the use in its pending_uses. */
void slime_py_hold_add_mr(slime_py_hold_t *hold, PyObject *mr);
/* A private copy of desc that lives as long as the hold. */
const slime_mr_desc_t *slime_py_hold_add_desc(slime_py_hold_t *hold,
                                              const slime_mr_desc_t *desc);
/* Releases everything and frees the hold; NULL is fine. GIL required. */
void slime_py_hold_release(slime_py_hold_t *hold);

/* A request object has seen status st: the first final one is recorded
 * in *final (SLIME_INPROGRESS until then) and the request's hold is
 * released.  GIL required. */
void slime_py_hold_observe(slime_status_t *final, slime_py_hold_t **hold,
                           slime_status_t st);

#endif /* SLIME_PY_HOLD_H */
