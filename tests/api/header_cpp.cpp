// header_cpp.cpp — loom.h must compile and link as C++ (extern "C" guards, no C-only syntax).
#include "loom.h"

#include <cstdio>
#include <cstring>

int main() {
    loom_model_params mp = loom_model_default_params();
    loom_session_params sp = loom_session_default_params();
    loom_generate_params gp = loom_generate_default_params();
    (void)mp;
    (void)sp;
    (void)gp;
    loom_model *m = nullptr;
    loom_status st = loom_model_load(nullptr, nullptr, &m);
    if (st != LOOM_ERR_INVALID_ARG || m != nullptr) {
        std::fprintf(stderr, "expected LOOM_ERR_INVALID_ARG, got %d\n", (int)st);
        return 1;
    }
    if (std::strcmp(loom_status_str(LOOM_OK), "success") != 0) return 1;
    if (loom_version_number() != LOOM_VERSION_NUMBER) return 1;
    std::printf("loom %s from C++: ok\n", loom_version());
    return 0;
}
