/* status.c — loom_status_str and loom_last_error, the public face of core/error.c. */
#include "core/status.h"

const char *loom_status_str(loom_status status) {
    switch (status) {
#define LOOM__STATUS_CASE(name, value, desc)                                                       \
    case LOOM_##name:                                                                              \
        return desc;
        LOOM_STATUS_MAP(LOOM__STATUS_CASE)
#undef LOOM__STATUS_CASE
    }
    return "unknown status";
}

const char *loom_last_error(void) {
    return loom__error_message();
}
