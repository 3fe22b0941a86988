/* replay_main.c — runs a fuzz target's LLVMFuzzerTestOneInput over files, for builds without
 * libFuzzer: the ordinary test suite (under gcc, and under AddressSanitizer + UBSan) replays
 * every seed and every input a fuzzing run once found a bug with (tests/fuzz/regress/), so a
 * fixed crash stays fixed. Arguments: files or folders (every regular file in a folder, in
 * name order). Exit status 0 when every input ran (a target reports a finding by crashing). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        uint8_t *grown = realloc(buf, cap * 2);
        if (!grown) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = grown;
        cap *= 2;
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: out of memory reading %s\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int failed = 0, n_inputs = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) continue; /* an absent regress folder: nothing to replay */
        if (!S_ISDIR(sb.st_mode)) {
            failed |= run_file(argv[i]);
            n_inputs++;
            continue;
        }
        struct dirent **names;
        int n = scandir(argv[i], &names, NULL, by_name);
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
            if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
                failed |= run_file(path);
                n_inputs++;
            }
            free(names[k]);
        }
        if (n >= 0) free(names);
    }
    printf("replay: %d inputs\n", n_inputs);
    if (n_inputs == 0) {
        fprintf(stderr, "replay: no input found (the seed corpus is missing)\n");
        return 1;
    }
    return failed;
}
