/* Which cgroup a process is in, as a sysfs path (see cgroup.h). NVIDIA's driver takes cgroup v2
 * paths only; the simulation also takes the v1 `memory` hierarchy's, so that it runs on this
 * machine's kubelet (cgroupfs on a hybrid layout), and says so in docs/dra/sharing.md. The memory
 * controller is what a GPU memory limit belongs with, so on a hybrid machine its v1 path wins
 * over the (controller-less) v2 one. Inside a private cgroup namespace the file shows paths
 * relative to that namespace; the hook leaves its container's namespace first, and checks the
 * path it gets (memory_limit_hook.c). */
#define _GNU_SOURCE
#include "cgroup.h"

#include <stdio.h>
#include <string.h>

#define SYSFS "/sys/fs/cgroup"
#define V1_MEMORY "/memory"

void sim_cgroup_normalise(char *path) {
    size_t length = strlen(path);
    while (length > 1 && path[length - 1] == '/') path[--length] = '\0';
}

/* Whether the comma-separated controller list `list` (of `length` bytes) holds `name`. */
static int has_controller(const char *list, size_t length, const char *name) {
    size_t want = strlen(name);
    for (const char *c = list, *end = list + length; c < end;) {
        const char *comma = memchr(c, ',', (size_t)(end - c));
        size_t part = (size_t)((comma ? comma : end) - c);
        if (part == want && memcmp(c, name, want) == 0) return 1;
        c += part + 1;
    }
    return 0;
}

int sim_cgroup_of(const char *file, const char *sysfs, char *mount, char *out, size_t size) {
    FILE *in = fopen(file, "re");
    char line[4096], v2[4096] = "";
    int found = 0;
    if (!in) return 0;
    while (!found && fgets(line, sizeof line, in)) {
        line[strcspn(line, "\n")] = '\0';
        char *first = strchr(line, ':'), *second = first ? strchr(first + 1, ':') : NULL;
        if (!second || second[1] != '/') continue;
        if (has_controller(first + 1, (size_t)(second - first - 1), "memory"))
            found = snprintf(mount, size, "%s" V1_MEMORY, sysfs) < (int)size &&
                    snprintf(out, size, "%s%s", mount, second + 1) < (int)size;
        else if (strncmp(line, "0::", 3) == 0)
            snprintf(v2, sizeof v2, "%s", second + 1);
    }
    fclose(in);
    if (!found && v2[0])
        found = snprintf(mount, size, "%s", sysfs) < (int)size && snprintf(out, size, "%s%s", sysfs, v2) < (int)size;
    if (found) sim_cgroup_normalise(out);
    return found;
}

int sim_own_cgroup(char *out, size_t size) {
    char mount[4096];
    return size <= sizeof mount && sim_cgroup_of("/proc/self/cgroup", SYSFS, mount, out, size);
}
