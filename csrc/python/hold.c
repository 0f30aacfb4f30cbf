/* hold.c - see hold.h. */
#include "slime_py.h"

slime_py_hold_t *slime_py_hold_new(size_t cap)
{
    if (cap == 0)
        cap = 1;
    slime_py_hold_t *hold = PyMem_Calloc(1, sizeof(*hold));
    if (!hold)
        goto fail;
    hold->cap = cap;
    hold->bufs = PyMem_Calloc(cap, sizeof(*hold->bufs));
    hold->mrs = PyMem_Calloc(cap, sizeof(*hold->mrs));
    hold->descs = PyMem_Calloc(cap, sizeof(*hold->descs));
    if (!hold->bufs || !hold->mrs || !hold->descs)
        goto fail;
    return hold;
fail:
    slime_py_hold_release(hold);
    PyErr_NoMemory();
    return NULL;
}

slime_py_buf_t *slime_py_hold_next_buf(slime_py_hold_t *hold)
{
    return &hold->bufs[hold->nbufs++];
}

void slime_py_hold_add_mr(slime_py_hold_t *hold, PyObject *mr)
{
    Py_INCREF(mr);
    ((SlimeMemoryRegionObject *)mr)->pending_uses++;
    hold->mrs[hold->nmrs++] = mr;
}

const slime_mr_desc_t *slime_py_hold_add_desc(slime_py_hold_t *hold,
                                              const slime_mr_desc_t *desc)
{
    slime_mr_desc_t *copy = &hold->descs[hold->ndescs++];
    *copy = *desc;
    return copy;
}

void slime_py_hold_release(slime_py_hold_t *hold)
{
    if (!hold)
        return;
    for (size_t i = 0; i < hold->nbufs; i++)
        slime_py_buf_release(&hold->bufs[i]);
    for (size_t i = 0; i < hold->nmrs; i++) {
        ((SlimeMemoryRegionObject *)hold->mrs[i])->pending_uses--;
        Py_DECREF(hold->mrs[i]);
    }
    PyMem_Free(hold->bufs);
    PyMem_Free(hold->mrs);
    PyMem_Free(hold->descs);
    PyMem_Free(hold);
}

void slime_py_hold_observe(slime_status_t *final, slime_py_hold_t **hold,
                           slime_status_t st)
{
    if (st == SLIME_INPROGRESS || *final != SLIME_INPROGRESS)
        return;
    *final = st;
    slime_py_hold_t *h = *hold;
    *hold = NULL;
    slime_py_hold_release(h);
}
