/* The memory-domain table (core/md.h): every domain of this build.  It
 * lives beside the transports because it names theirs; adding a domain
 * touches its own file and one line here.
 *
 * Order matters to memory domains only: a region belongs to the first
 * that claims its range, so the host domain, which claims any, is the
 * last of them.  The verbs domain exists where the build has the verbs
 * transport (verbs_stub.c has none). */
#include "core/md.h"
#include "transport/verbs.h"

const md_ops_t *const slime_md_table[] = {
    &slime_block_md,
    &slime_host_md,
#ifdef SLIME_HAVE_VERBS
    &slime_verbs_md,
#endif
};
const size_t slime_md_table_len = sizeof slime_md_table / sizeof slime_md_table[0];

_Static_assert(sizeof slime_md_table / sizeof slime_md_table[0] <= SLIME_MD_MAX,
               "SLIME_MD_MAX (core/internal.h) holds every domain of the table");
