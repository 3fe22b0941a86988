/* version.c — the linked library's version. */
#include "loom.h"

#define LOOM__STR2(x) #x
#define LOOM__STR(x)  LOOM__STR2(x)

const char *loom_version(void) {
    return LOOM__STR(LOOM_VERSION_MAJOR) "." LOOM__STR(LOOM_VERSION_MINOR) "." LOOM__STR(
        LOOM_VERSION_PATCH);
}

int loom_version_number(void) {
    return LOOM_VERSION_NUMBER;
}
