/* memory-limit-hook: an OCI createContainer hook that caps a pod's memory on one GPU.
 *
 *   memory-limit-hook LIBRARY RECORDS CLAIM_UID SHARE_ID GPU_UUID BYTES   (OCI state on stdin)
 *
 * runc runs a createContainer hook from its init process after the container's mounts are made
 * and before pivot_root: in the container's namespaces, but with the host's root still `/`. So
 * the host's loader, libc and LIBRARY (the driver root's libnvidia-ml.so.1, a host path) are
 * what this program loads, and the host's /proc is at /proc. The state's `pid` is runc init's
 * pid in the container's own pid namespace (1), which names another process in the host's /proc,
 * so it is not used (the state is read, within STATE_DEADLINE_S, and dropped): this process,
 * runc init's child, is already in the container's cgroup and reads /proc/self/cgroup (cgroup.c's
 * rule) in the host's cgroup namespace (that of the host's pid 1), where the path is the whole
 * one. Where it cannot be in the host's namespace nothing is capped: a path relative to a private
 * one names some other cgroup. The path is checked after resolution (no `.` or `..`, no link, a
 * directory strictly below its hierarchy's mount).
 *
 * The cap is on the container's parent, its pod's cgroup, so that every container of the pod
 * that uses the share (a sidecar, an init container) is capped as one: the hook runs once per
 * container, and the second finds the first's record. The pod's cap on a GPU is the sum of the
 * shares recorded for it (two claims' shares of one GPU in one pod). A share already capped in
 * another pod's cgroup that still exists is refused: two pods would get it twice.
 *
 * Before the limit is set, a record of it (RECORDS/<claim>_<share>_<hash of GPU and cgroup>.json:
 * claim, share, gpu, nameSpace, limit) is written atomically, under RECORDS/.lock (an flock
 * the driver's Unprepare takes too), so Unprepare (after any restart) sets back exactly the
 * limits set and none is left untracked; a failed set removes its record. Exit 0 when the limit is set; else 1 with a message
 * on stderr (runc then fails the create).
 *
 * For tests, DEVICEPLUGIN_HOOK_PROC and DEVICEPLUGIN_HOOK_CGROUPFS stand for /proc and
 * /sys/fs/cgroup (a runtime runs a hook with the spec's environment only). */
#define _GNU_SOURCE
#include "cgroup.h"

#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STATE_DEADLINE_S 5
#define INITIAL_USER_NS 0xEFFFFFFDu   /* the kernel's initial namespaces' inodes (proc_ns.h) */
#define INITIAL_CGROUP_NS 0xEFFFFFFBu
#define LOCK_FILE ".lock"
#define GPU_MAX 96

typedef struct {
    char claim[65], share[65], gpu[GPU_MAX], space[PATH_MAX];
    unsigned long long limit;
} limit_record;

/* A message on stderr; `fail` says it and gives the hook's failing exit status. */
static void note(const char *format, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("memory-limit-hook: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
}

#define fail(...) (note(__VA_ARGS__), 1)

/* A claim UID or share ID: it names the record file. */
static int plain_name(const char *text) {
    if (!*text || strlen(text) > 64) return 0;
    for (const char *c = text; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-')) return 0;
    return 1;
}

/* Text a record holds as it is: no quote, backslash or control character to escape. */
static int record_text(const char *text) {
    for (const unsigned char *c = (const unsigned char *)text; *c; c++)
        if (*c == '"' || *c == '\\' || *c < 0x20) return 0;
    return 1;
}

static const char *env_or(const char *name, const char *otherwise) {
    const char *value = getenv(name);
    return value && *value ? value : otherwise;
}

/* The OCI state on stdin read to its end: 1; 0 when it does not end within STATE_DEADLINE_S,
 * -1 (errno set) when it cannot be read. */
static int drain_state(void) {
    struct timespec now, end;
    char buffer[4096];
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += STATE_DEADLINE_S;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = (end.tv_sec - now.tv_sec) * 1000 + (end.tv_nsec - now.tv_nsec) / 1000000;
        if (left <= 0) return 0;
        struct pollfd in = {STDIN_FILENO, POLLIN, 0};
        int ready = poll(&in, 1, (int)left);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) return 0;
        ssize_t got = read(STDIN_FILENO, buffer, sizeof buffer);
        if (got == 0) return 1;
        if (got < 0 && errno != EINTR && errno != EAGAIN) return -1;
    }
}

/* Whether this process is in the host's namespace of `kind` ("user", "cgroup"): the kernel's
 * initial one, or that of the host's pid 1 (a node that is itself a container). When it is
 * not, *host is pid 1's namespace opened, or -1 when it cannot be. */
static int in_host_namespace(const char *proc, const char *kind, unsigned int initial, int *host) {
    char path[PATH_MAX];
    struct stat own, other;
    *host = -1;
    snprintf(path, sizeof path, "%s/self/ns/%s", proc, kind);
    if (stat(path, &own) != 0) return errno == ENOENT; /* a kernel without such namespaces */
    if (own.st_ino == initial) return 1;
    snprintf(path, sizeof path, "%s/1/ns/%s", proc, kind);
    *host = open(path, O_RDONLY | O_CLOEXEC);
    if (*host < 0 || fstat(*host, &other) != 0) return 0;
    if (own.st_dev != other.st_dev || own.st_ino != other.st_ino) return 0;
    close(*host);
    *host = -1;
    return 1;
}

/* Into the host's cgroup namespace, where /proc/self/cgroup names the whole path; NULL, or why
 * not. */
static const char *host_cgroup_namespace(const char *proc, char *why, size_t size) {
    int host;
    if (in_host_namespace(proc, "cgroup", INITIAL_CGROUP_NS, &host)) return NULL;
    if (host < 0) {
        snprintf(why, size, "cannot open the host's cgroup namespace (%s/1/ns/cgroup): %s", proc, strerror(errno));
    } else if (setns(host, CLONE_NEWCGROUP) != 0) {
        snprintf(why, size, "cannot enter the host's cgroup namespace (%s/1/ns/cgroup): %s", proc, strerror(errno));
    } else {
        close(host);
        return NULL;
    }
    if (host >= 0) close(host);
    strncat(why, "; the container's own view names its cgroup relative to a private namespace, so nothing is capped",
            size - strlen(why) - 1);
    return why;
}

/* The container's cgroup `path` (under `mount`, as /proc/self/cgroup gave it) checked and
 * resolved into `out` (the mount's resolved path into `real_mount`): plain names only (no `.`,
 * `..` or empty one), no link on the way, a directory strictly below the mount. NULL, or why not. */
static const char *checked_cgroup(const char *mount, const char *path, char *real_mount, char *out, char *why,
                                  size_t size) {
    const char *relative = path + strlen(mount);
    if (strcmp(relative, "/") == 0 || !*relative) {
        snprintf(why, size, "the container's cgroup is the root %s: refusing to limit every process", mount);
        return why;
    }
    for (const char *name = relative + 1, *next; *name; name = next + (*next == '/')) {
        next = name + strcspn(name, "/");
        size_t length = (size_t)(next - name);
        if (length == 0 || (length == 1 && name[0] == '.') || (length == 2 && memcmp(name, "..", 2) == 0)) {
            snprintf(why, size, "the cgroup path %s has an empty, '.' or '..' component: refusing it", path);
            return why;
        }
    }
    if (!record_text(path)) {
        snprintf(why, size, "the cgroup path %s has a character no cgroup name has: refusing it", path);
        return why;
    }
    struct stat info;
    if (!realpath(mount, real_mount) || !realpath(path, out) || stat(out, &info) != 0) {
        snprintf(why, size, "the cgroup %s cannot be resolved: %s", path, strerror(errno));
        return why;
    }
    size_t length = strlen(real_mount);
    if (strncmp(out, real_mount, length) != 0 || strcmp(out + length, relative) != 0 || !S_ISDIR(info.st_mode)) {
        snprintf(why, size, "the cgroup %s resolves to %s, not a directory below %s: refusing it", path, out, real_mount);
        return why;
    }
    return NULL;
}

/* A pod UID as a kubelet names its cgroup: a UUID with `dash` between its groups (or a static
 * pod's 32 hex digits). */
static int pod_uid(const char *text, size_t length, char dash) {
    if (length != 36 && length != 32) return 0;
    for (size_t i = 0; i < length; i++) {
        int between = length == 36 && (i == 8 || i == 13 || i == 18 || i == 23);
        if (between ? text[i] != dash : !isxdigit((unsigned char)text[i])) return 0;
    }
    return 1;
}

/* Whether the `length` bytes at `name` are `want`. */
static int named(const char *name, size_t length, const char *want) {
    return strlen(want) == length && memcmp(name, want, length) == 0;
}

/* The component of the cgroup path `relative` (from its leading '/') before the one at `name`,
 * its length into *length; NULL when `name` is the first. */
static const char *parent_name(const char *relative, const char *name, size_t *length) {
    if (name - 1 <= relative) return NULL;
    const char *start = name - 1;
    while (start > relative && start[-1] != '/') start--;
    *length = (size_t)(name - 1 - start);
    return start;
}

/* Whether the `length` bytes at `prefix` end with a kubelet's pods slice as a component of its
 * own: `kubepods`, `kubepods-burstable` or `kubepods-besteffort`, alone or after a cgroup root's
 * components (`kubelet-kubepods`). */
static int pods_slice(const char *prefix, size_t length) {
    static const char *const slices[] = {"kubepods", "kubepods-burstable", "kubepods-besteffort"};
    for (size_t i = 0; i < sizeof slices / sizeof *slices; i++) {
        size_t size = strlen(slices[i]);
        if (length >= size && memcmp(prefix + length - size, slices[i], size) == 0 &&
            (length == size || prefix[length - size - 1] == '-'))
            return 1;
    }
    return 0;
}

/* Whether `relative` (a cgroup path below its hierarchy's mount, from its '/') is a pod's cgroup
 * as a kubelet lays it out, under any cgroup root: cgroupfs `.../kubepods[/<qos>]/pod<uid>`, or
 * systemd `.../<slice>.slice/<slice>-pod<uid>.slice` where <slice> is `[<root>-]kubepods[-<qos>]`
 * (`_` for `-` in the UID), in its parent slice as systemd nests them. */
static int pod_cgroup(const char *relative) {
    const char *name = strrchr(relative, '/') + 1, *parent, *pod = NULL;
    size_t length = strlen(name), parent_length, grand_length;
    if (!(parent = parent_name(relative, name, &parent_length))) return 0;
    if (strncmp(name, "pod", 3) == 0 && pod_uid(name + 3, length - 3, '-')) {
        if (named(parent, parent_length, "kubepods")) return 1;
        const char *grand = parent_name(relative, parent, &grand_length);
        return (named(parent, parent_length, "burstable") || named(parent, parent_length, "besteffort")) &&
               grand && named(grand, grand_length, "kubepods");
    }
    if (length <= 6 || strcmp(name + length - 6, ".slice") != 0) return 0;
    for (const char *at = name; (at = strstr(at, "-pod")) && at < name + length - 6; at++) pod = at;
    if (!pod || !pod_uid(pod + 4, (size_t)(name + length - 6 - (pod + 4)), '_')) return 0;
    size_t prefix = (size_t)(pod - name);
    return pods_slice(name, prefix) && parent_length == prefix + 6 && memcmp(parent, name, prefix) == 0 &&
           memcmp(parent + prefix, ".slice", 6) == 0;
}

static int field(const char *text, const char *key, char *out, size_t size) {
    char pattern[32];
    snprintf(pattern, sizeof pattern, "\"%s\": \"", key);
    const char *start = strstr(text, pattern);
    if (!start) return 0;
    start += strlen(pattern);
    const char *end = strchr(start, '"');
    if (!end || memchr(start, '\\', (size_t)(end - start)) || (size_t)(end - start) >= size) return 0;
    memcpy(out, start, (size_t)(end - start));
    out[end - start] = '\0';
    return 1;
}

/* The record `name` (<claim>_<share>_<hash>.json) in the directory `dir`, as write_record wrote it. */
static int read_record(int dir, const char *name, limit_record *out) {
    char text[PATH_MAX + 512];
    const char *first = strchr(name, '_'), *second = first ? strchr(first + 1, '_') : NULL;
    out->claim[0] = out->share[0] = '\0';
    if (!second || (size_t)(first - name) >= sizeof out->claim || (size_t)(second - first - 1) >= sizeof out->share)
        return 0;
    snprintf(out->claim, sizeof out->claim, "%.*s", (int)(first - name), name);
    snprintf(out->share, sizeof out->share, "%.*s", (int)(second - first - 1), first + 1);
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t got = read(fd, text, sizeof text - 1);
    close(fd);
    if (got <= 0) return 0;
    text[got] = '\0';
    const char *limit = strstr(text, "\"limit\": ");
    return field(text, "gpu", out->gpu, sizeof out->gpu) && field(text, "nameSpace", out->space, sizeof out->space) &&
           limit && sscanf(limit, "\"limit\": %llu", &out->limit) == 1;
}

/* FNV-1a of `text`, from `hash`: a record's name for its GPU and cgroup. */
static unsigned long long fnv1a(unsigned long long hash, const char *text) {
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) hash = (hash ^ *c) * 1099511628211ull;
    return hash;
}

static int is_directory(const char *path) {
    struct stat info;
    return stat(path, &info) == 0 && S_ISDIR(info.st_mode);
}

/* What the records say of `want` (its claim, share, GPU and pod cgroup): *others gets the sum
 * of the other shares recorded for its GPU in its cgroup, *known whether `want` is recorded (an
 * earlier container of the pod). A record of its share in a cgroup that is gone is dropped (its
 * limit went with the cgroup); one in a cgroup below the pod's (an older hook capped containers)
 * is of the same pod. Another share's record that cannot be read (an older hook escaped its
 * strings) is skipped with a note, so that it fails no other pod's hook. NULL, or why it cannot
 * be capped. */
static const char *check_records(const char *records, const limit_record *want, unsigned long long *others,
                                 int *known, char *why, size_t size) {
    DIR *dir = opendir(records);
    *others = 0;
    *known = 0;
    if (!dir) {
        snprintf(why, size, "cannot read the records %s: %s", records, strerror(errno));
        return why;
    }
    const char *problem = NULL;
    for (struct dirent *entry; !problem && (entry = readdir(dir));) {
        size_t length = strlen(entry->d_name);
        limit_record held;
        if (entry->d_name[0] == '.' || length < 5 || strcmp(entry->d_name + length - 5, ".json") != 0) continue;
        if (!read_record(dirfd(dir), entry->d_name, &held)) {
            if (strcmp(held.claim, want->claim) != 0 || strcmp(held.share, want->share) != 0) {
                note("skipping the record %s/%s, which cannot be read (an older hook's, or damaged): "
                     "its share is not counted in this cap",
                     records, entry->d_name);
                continue;
            }
            snprintf(why, size, "cannot read the record %s/%s of this share: it may be capped in another pod",
                     records, entry->d_name);
            problem = why;
        } else if (strcmp(held.gpu, want->gpu) != 0) {
            continue;
        } else if (strcmp(held.claim, want->claim) == 0 && strcmp(held.share, want->share) == 0) {
            if (strcmp(held.space, want->space) == 0) {
                *known = 1;
                continue;
            }
            size_t pod = strlen(want->space);
            if (strncmp(held.space, want->space, pod) == 0 && held.space[pod] == '/')
                continue; /* an older hook's record of one of this pod's containers: the same pod */
            if (!is_directory(held.space)) {
                unlinkat(dirfd(dir), entry->d_name, 0);
                continue;
            }
            snprintf(why, size,
                     "claim %s's share %s of %s is capped in the pod cgroup %s already: a share is one cap for "
                     "the containers that use it, so another pod (%s) cannot use the claim while that one runs",
                     want->claim, want->share, want->gpu, held.space, want->space);
            problem = why;
        } else if (strcmp(held.space, want->space) == 0 && __builtin_add_overflow(*others, held.limit, others)) {
            snprintf(why, size, "the shares recorded for %s in %s overflow", want->gpu, want->space);
            problem = why;
        }
    }
    closedir(dir);
    return problem;
}

static void json_string(FILE *out, const char *text) {
    fputc('"', out);
    fputs(text, out); /* record_text: nothing to escape */
    fputc('"', out);
}

/* `path` written through a scratch file that is created, never followed or reused. */
static int write_record(const char *records, const char *path, const limit_record *entry) {
    char scratch[PATH_MAX + 32];
    snprintf(scratch, sizeof scratch, "%s/.%d.tmp", records, (int)getpid());
    unlink(scratch); /* one a crashed hook of this pid left; a link is removed, not followed */
    int fd = open(scratch, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *out = fd < 0 ? NULL : fdopen(fd, "w");
    if (!out) {
        if (fd >= 0) close(fd);
        return 0;
    }
    fputs("{\"claim\": ", out);
    json_string(out, entry->claim);
    fputs(", \"share\": ", out);
    json_string(out, entry->share);
    fputs(", \"gpu\": ", out);
    json_string(out, entry->gpu);
    fputs(", \"nameSpace\": ", out);
    json_string(out, entry->space);
    fprintf(out, ", \"limit\": %llu}\n", entry->limit);
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

/* The pod cgroup of the container this process is in, checked, into `pod`; NULL, or why not. */
static const char *pod_of_container(char *pod, char *why, size_t size) {
    const char *proc = env_or("DEVICEPLUGIN_HOOK_PROC", "/proc"), *sysfs = env_or("DEVICEPLUGIN_HOOK_CGROUPFS", "/sys/fs/cgroup");
    char file[PATH_MAX], mount[PATH_MAX], path[PATH_MAX], real_mount[PATH_MAX];
    int user;
    if (!in_host_namespace(proc, "user", INITIAL_USER_NS, &user)) {
        if (user >= 0) close(user);
        snprintf(why, size,
                 "the container runs in a user namespace of its own (a pod with hostUsers: false): its cgroup "
                 "cannot be capped from there; a memory share needs a pod in the host's user namespace");
        return why;
    }
    if (host_cgroup_namespace(proc, why, size)) return why;
    snprintf(file, sizeof file, "%s/self/cgroup", proc);
    if (!sim_cgroup_of(file, sysfs, mount, path, sizeof path)) {
        snprintf(why, size, "%s names no memory or v2 cgroup", file);
        return why;
    }
    if (checked_cgroup(mount, path, real_mount, pod, why, size)) return why;
    *strrchr(pod, '/') = '\0'; /* the container's parent */
    if (strlen(pod) <= strlen(real_mount) || !pod_cgroup(pod + strlen(real_mount))) {
        snprintf(why, size,
                 "the container's cgroup %s is not in a pod's cgroup (.../kubepods[/<qos>]/pod<uid>, or "
                 ".../[<root>-]kubepods[-<qos>].slice/[<root>-]kubepods[-<qos>]-pod<uid>.slice): a share caps "
                 "the containers of one pod as one, in their pod's cgroup",
                 path);
        return why;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 7)
        return fail("usage: %s LIBRARY RECORDS CLAIM_UID SHARE_ID GPU_UUID BYTES (OCI state on stdin)", argv[0]);
    const char *library = argv[1], *records = argv[2];
    char *end, record[PATH_MAX], lock[PATH_MAX], why[3 * PATH_MAX + 512];
    limit_record want = {0};
    errno = 0;
    want.limit = strtoull(argv[6], &end, 10);
    if (errno || end == argv[6] || *end || argv[6][0] == '-' || want.limit == 0)
        return fail("BYTES: want a positive whole number of bytes, got '%s'", argv[6]);
    if (!plain_name(argv[3])) return fail("CLAIM_UID: want a UID, got '%s'", argv[3]);
    if (!plain_name(argv[4])) return fail("SHARE_ID: want a UID, got '%s'", argv[4]);
    if (!record_text(argv[5]) || strlen(argv[5]) >= sizeof want.gpu)
        return fail("GPU_UUID: want a UUID, got '%s'", argv[5]);
    strcpy(want.claim, argv[3]);
    strcpy(want.share, argv[4]);
    strcpy(want.gpu, argv[5]);
    int state = drain_state();
    if (state < 0) return fail("stdin: cannot read the container's state: %s", strerror(errno));
    if (state == 0)
        return fail("stdin: the container's state did not end within %d s (a runtime writes it and closes it)",
                    STATE_DEADLINE_S);
    if (pod_of_container(want.space, why, sizeof why)) return fail("%s", why);
    unsigned long long hash = fnv1a(fnv1a(fnv1a(1469598103934665603ull, want.gpu), "\n"), want.space), others, total;
    if (snprintf(record, sizeof record, "%s/%s_%s_%016llx.json", records, want.claim, want.share, hash) >=
            (int)sizeof record ||
        snprintf(lock, sizeof lock, "%s/" LOCK_FILE, records) >= (int)sizeof lock)
        return fail("RECORDS: path too long");
    int held = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (held < 0 || flock(held, LOCK_EX) != 0) return fail("cannot lock %s: %s", lock, strerror(errno));
    int status = 0, known;
    if (check_records(records, &want, &others, &known, why, sizeof why)) {
        status = fail("%s", why);
    } else if (__builtin_add_overflow(others, want.limit, &total)) {
        status = fail("the shares recorded for %s in %s overflow", want.gpu, want.space);
    } else if (!write_record(records, record, &want)) {
        status = fail("cannot write the record %s: %s", record, strerror(errno));
    } else if (set_limit(library, want.gpu, want.space, total, why, sizeof why)) {
        if (!known) unlink(record); /* else an earlier container's cap stands, and its record */
        status = fail("%s", why);
    }
    close(held);
    return status;
}
