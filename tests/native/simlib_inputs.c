/* The simulated library's parsers on their own, for tests/test_sim_inputs.py:
 *
 *   simlib_inputs events < HEX_LINES   one verdict per line (ok, refused or blank) for each
 *                                      line of hex-encoded bytes: native/eventline.c's reading
 *   simlib_inputs node FILE            "ok", or "refused: why" and exit 3: native/node.c's
 *   simlib_inputs state NODE FILE      the same for the MIG state FILE laid over the node NODE
 *
 * Built with AddressSanitizer and UBSan, so a hostile input that corrupts memory fails too. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static int unhex(const char *text, size_t length, char *out) {
    for (size_t i = 0; i + 1 < length; i += 2) {
        unsigned byte;
        if (sscanf(text + i, "%2x", &byte) != 1) return -1;
        out[i / 2] = (char)byte;
    }
    return (int)(length / 2);
}

static int events(void) {
    char *line = NULL;
    size_t size = 0;
    ssize_t got;
    while ((got = getline(&line, &size, stdin)) > 0) {
        while (got && (line[got - 1] == '\n')) got--;
        char *bytes = malloc((size_t)got / 2 + 1);
        int length = bytes ? unhex(line, (size_t)got, bytes) : -1;
        if (length < 0) { free(bytes); free(line); return 2; }
        sim_event_line parsed;
        const char *problem = sim_event_blank(bytes, (size_t)length) ? NULL : sim_event_parse(bytes, (size_t)length, &parsed);
        puts(sim_event_blank(bytes, (size_t)length) ? "blank" : problem ? "refused" : "ok");
        free(bytes);
    }
    free(line);
    return 0;
}

/* The whole of `path` (at most 8 MiB), NUL-terminated; NULL when unreadable. */
static char *slurp(const char *path, size_t *length) {
    FILE *file = fopen(path, "rb");
    if (!file) { perror(path); return NULL; }
    char *text = malloc((8 << 20) + 1);
    *length = text ? fread(text, 1, 8 << 20, file) : 0;
    fclose(file);
    if (text) text[*length] = '\0';
    return text;
}

static int node(const char *path, const char *state_path) {
    size_t length;
    char *text = slurp(path, &length);
    if (!text) return 2;
    char error[256];
    sim_node *parsed = sim_node_parse(text, length, error, sizeof error);
    free(text);
    if (!parsed) { printf("refused: %s\n", error); return 3; }
    int ok = 1;
    if (state_path) {
        if (!(text = slurp(state_path, &length))) { sim_node_free(parsed); return 2; }
        ok = sim_state_parse(parsed, text, length, error, sizeof error);
        free(text);
    }
    sim_node_free(parsed);
    if (!ok) { printf("refused: %s\n", error); return 3; }
    puts("ok");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "events") == 0) return events();
    if (argc == 3 && strcmp(argv[1], "node") == 0) return node(argv[2], NULL);
    if (argc == 4 && strcmp(argv[1], "state") == 0) return node(argv[2], argv[3]);
    fprintf(stderr, "usage: simlib_inputs events | node FILE | state NODE FILE\n");
    return 2;
}
