/* What the rest of the library names of the verbs transport beyond its
 * ops table: its memory domain, listed in transport/domains.c.  The
 * transport proper (verbs_*.c) exists only where CMake found
 * <infiniband/verbs.h> (SLIME_HAVE_VERBS); elsewhere verbs_stub.c gives
 * a table that refuses a forced verbs, and there is no verbs domain. */
#ifndef SLIME_VERBS_H
#define SLIME_VERBS_H

#include "core/internal.h"

/* Its memory domain (verbs_md.c), in the table of transport/domains.c
 * where the build has the transport. */
extern const struct md_ops slime_verbs_md;

#endif
