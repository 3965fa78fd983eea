/* memory-limit-hook: an OCI createContainer hook that caps the container's memory on one GPU.
 *
 *   memory-limit-hook LIBRARY RECORDS CLAIM_UID SHARE_ID GPU_UUID BYTES   (OCI state on stdin)
 *
 * runc runs a createContainer hook from its init process after the container's mounts are made
 * and before pivot_root: in the container's namespaces, but with the host's root still `/`. So
 * the host's loader, libc and LIBRARY (the driver root's libnvidia-ml.so.1, a host path) are
 * what this program loads, and the host's /proc is at /proc. The state's `pid` is runc init's
 * pid in the container's own pid namespace (1), which names another process in the host's /proc,
 * so it is not used: this process, runc init's child, is already in the container's cgroup and
 * reads /proc/self/cgroup (cgroup.c's rule) after leaving a private cgroup namespace for the
 * host's (that of the host's pid 1), where the path is the whole one.
 *
 * Before the limit is set, a record of it (RECORDS/<claim>_<share>_<hash>.json: claim, share,
 * gpu, nameSpace, limit) is written atomically, so the driver's Unprepare (after any restart)
 * clears exactly the limits set and none is left untracked; a failed set removes its record.
 * Exit 0 when the limit is set; else 1 with a message on stderr (runc then fails the create). */
#define _GNU_SOURCE
#include "cgroup.h"

#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *format, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("memory-limit-hook: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    return 1;
}

/* A claim UID or share ID: it names the record file. */
static int plain_name(const char *text) {
    if (!*text || strlen(text) > 64) return 0;
    for (const char *c = text; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-')) return 0;
    return 1;
}

/* Into the host's cgroup namespace when this process is in another one. Where the host's pid 1
 * cannot be looked at (a runtime that is itself confined), /proc/self/cgroup is taken as it is:
 * the usual private namespace shows the root there, which main() refuses. */
static int host_cgroup_namespace(void) {
    struct stat own, host;
    if (stat("/proc/self/ns/cgroup", &own) != 0) return 1; /* no cgroup namespaces at all */
    int fd = open("/proc/1/ns/cgroup", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 1;
    if (fstat(fd, &host) != 0) {
        close(fd);
        return 0;
    }
    int ok = (own.st_dev == host.st_dev && own.st_ino == host.st_ino) || setns(fd, CLONE_NEWCGROUP) == 0;
    close(fd);
    return ok;
}

static void json_string(FILE *out, const char *text) {
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(out, "\\%c", *c);
        else if (*c < 0x20) fprintf(out, "\\u%04x", *c);
        else fputc(*c, out);
    }
    fputc('"', out);
}

static int write_record(const char *path, const char *claim, const char *share, const char *gpu, const char *space,
                        unsigned long long bytes) {
    char scratch[PATH_MAX + 16];
    snprintf(scratch, sizeof scratch, "%s.tmp%d", path, (int)getpid());
    FILE *out = fopen(scratch, "we");
    if (!out) return 0;
    fputs("{\"claim\": ", out);
    json_string(out, claim);
    fputs(", \"share\": ", out);
    json_string(out, share);
    fputs(", \"gpu\": ", out);
    json_string(out, gpu);
    fputs(", \"nameSpace\": ", out);
    json_string(out, space);
    fprintf(out, ", \"limit\": %llu}\n", bytes);
    int ok = fflush(out) == 0 && fsync(fileno(out)) == 0;
    ok = fclose(out) == 0 && ok;
    if (!ok || rename(scratch, path) != 0) {
        unlink(scratch);
        return 0;
    }
    return 1;
}

typedef nvmlReturn_t (*init_fn)(void);
typedef nvmlReturn_t (*handle_fn)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*set_fn)(nvmlDevice_t, nvmlSetMemoryLimits_v1_t *);
typedef const char *(*error_fn)(nvmlReturn_t);

/* The limit set through LIBRARY; NULL, or what failed. */
static const char *set_limit(const char *library, const char *gpu, const char *space, unsigned long long bytes,
                             char *why, size_t size) {
    void *nvml = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!nvml) {
        snprintf(why, size, "cannot load %s: %s", library, dlerror());
        return why;
    }
    init_fn init = (init_fn)dlsym(nvml, "nvmlInit_v2");
    init_fn shutdown = (init_fn)dlsym(nvml, "nvmlShutdown");
    handle_fn by_uuid = (handle_fn)dlsym(nvml, "nvmlDeviceGetHandleByUUID");
    set_fn set = (set_fn)dlsym(nvml, "nvmlDeviceSetMemoryLimits_v1");
    error_fn text = (error_fn)dlsym(nvml, "nvmlErrorString");
    if (!init || !shutdown || !by_uuid || !set || !text) {
        snprintf(why, size, "%s lacks nvmlDeviceSetMemoryLimits_v1 (or NVML's basic calls)", library);
        return why;
    }
    nvmlDevice_t device;
    nvmlSetMemoryLimits_v1_t limits = {space, bytes, bytes};
    nvmlReturn_t result = init();
    const char *step = "nvmlInit_v2";
    if (result == NVML_SUCCESS) {
        step = "nvmlDeviceGetHandleByUUID";
        if ((result = by_uuid(gpu, &device)) == NVML_SUCCESS) {
            step = "nvmlDeviceSetMemoryLimits_v1";
            result = set(device, &limits);
        }
        shutdown();
    }
    if (result == NVML_SUCCESS) return NULL;
    snprintf(why, size, "%s (%s, %s): %s", step, gpu, space, text(result));
    return why;
}

int main(int argc, char **argv) {
    if (argc != 7)
        return fail("usage: %s LIBRARY RECORDS CLAIM_UID SHARE_ID GPU_UUID BYTES (OCI state on stdin)", argv[0]);
    const char *library = argv[1], *records = argv[2], *claim = argv[3], *share = argv[4], *gpu = argv[5];
    char *end, space[PATH_MAX], record[PATH_MAX], why[PATH_MAX + 256];
    errno = 0;
    unsigned long long bytes = strtoull(argv[6], &end, 10);
    if (errno || end == argv[6] || *end || argv[6][0] == '-' || bytes == 0)
        return fail("BYTES: want a positive whole number of bytes, got '%s'", argv[6]);
    if (!plain_name(claim)) return fail("CLAIM_UID: want a UID, got '%s'", claim);
    if (!plain_name(share)) return fail("SHARE_ID: want a UID, got '%s'", share);
    while (fread(why, 1, sizeof why, stdin) > 0) continue; /* the state: not needed (see above) */
    if (!host_cgroup_namespace()) return fail("cannot enter the host's cgroup namespace: %s", strerror(errno));
    if (!sim_own_cgroup(space, sizeof space)) return fail("/proc/self/cgroup names no memory or v2 cgroup");
    if (strcmp(space, "/sys/fs/cgroup") == 0 || strcmp(space, "/sys/fs/cgroup/memory") == 0)
        return fail("the container's cgroup is the root %s: refusing to limit every process", space);
    unsigned long long hash = 1469598103934665603ull;
    for (const char *c = space; *c; c++) hash = (hash ^ (unsigned char)*c) * 1099511628211ull;
    if (snprintf(record, sizeof record, "%s/%s_%s_%016llx.json", records, claim, share, hash) >= (int)sizeof record)
        return fail("RECORDS: path too long");
    if (!write_record(record, claim, share, gpu, space, bytes))
        return fail("cannot write the record %s: %s", record, strerror(errno));
    if (set_limit(library, gpu, space, bytes, why, sizeof why)) {
        unlink(record);
        return fail("%s", why);
    }
    return 0;
}
