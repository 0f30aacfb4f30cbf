/* CHECK for the stand-alone unit programs (unit_*.c), which test one
 * piece of the core without the multi-process harness: a failed check
 * prints where and exits 1. */
#pragma once

#include <stdio.h>
#include <stdlib.h>

#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)
