/* The libFuzzer targets of fuzz_inputs.c without libFuzzer: each file named on the command line
 * goes once through LLVMFuzzerTestOneInput, as `fuzz_target FILE...` would replay it. Built
 * with gcc under AddressSanitizer and UBSan (tests/test_sim_fuzz.py), with the target's define
 * (-DFUZZ_NODE, ...), so every `make test` replays the corpus with no clang needed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Called first where the target defines it, as libFuzzer does. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

#include "fuzz_inputs.c"

static int replay(const char *path) {
    FILE *file = fopen(path, "rb");
    long size = -1;
    if (file && fseek(file, 0, SEEK_END) == 0) size = ftell(file);
    if (size < 0 || fseek(file, 0, SEEK_SET) != 0) {
        perror(path);
        if (file) fclose(file);
        return 1;
    }
    /* Exactly the input's size, as libFuzzer hands it over: a read past it is caught. */
    uint8_t *data = malloc(size ? (size_t)size : 1);
    size_t got = data ? fread(data, 1, (size_t)size, file) : 0;
    fclose(file);
    if (got != (size_t)size) {
        fprintf(stderr, "%s: cannot read it\n", path);
        free(data);
        return 1;
    }
    LLVMFuzzerTestOneInput(data, got);
    free(data);
    return 0;
}

int main(int argc, char **argv) {
    int failed = 0;
    int (*volatile initialize)(int *, char ***) = LLVMFuzzerInitialize; /* NULL if undefined */
    if (initialize) initialize(&argc, &argv);
    for (int i = 1; i < argc; i++) failed |= replay(argv[i]);
    if (!failed) printf("replayed %d inputs\n", argc - 1);
    return failed;
}
