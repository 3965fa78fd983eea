/* The MIG layout every process loading this library from one sim-root shares: GPU and compute
 * instances created or destroyed through NVML, and the MIG mode, live in
 * etc/deviceplugin-sim/mig-state.json beside the events file (absent: the rendering's layout).
 *
 * A change is made under an exclusive flock of mig-state.lock: the file is read again, the
 * change applied, and the whole layout written to a temporary file renamed over the state, so a
 * reader never sees half of one. Readers take no lock: each call compares the file's identity
 * and times with the last ones applied and reads it again when they differ; a writer makes the
 * new file's mtime later than the old one's, so a reused inode never hides a change. The file
 * is as untrusted as the node: it is parsed and checked as the node is (node.c, check.c), and
 * a bad one is complained about and ignored. The kernel module's capability files
 * (proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access) follow each change. */
#define _GNU_SOURCE
#include "sim.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_FILE "mig-state.json"
#define LOCK_FILE "mig-state.lock"
#define MAX_STATE_BYTES (4 << 20)

static char state_path[PATH_MAX], lock_path[PATH_MAX], caps_root[PATH_MAX], proc_driver[PATH_MAX];
static char state_dir[PATH_MAX];
static struct stat applied; /* the state file last applied; st_ino 0: none */

void sim_state_paths(const char *events) {
    const char *slash = strrchr(events, '/');
    int dir = slash ? (int)(slash - events) : 1;
    const char *base = slash ? events : ".";
    if (snprintf(state_dir, sizeof state_dir, "%.*s", dir, base) >= (int)sizeof state_dir ||
        !sim_state_file(state_path, sizeof state_path, STATE_FILE) ||
        !sim_state_file(lock_path, sizeof lock_path, LOCK_FILE) ||
        snprintf(proc_driver, sizeof proc_driver, "%s/../../proc/driver", state_dir) >= (int)sizeof proc_driver ||
        snprintf(caps_root, sizeof caps_root, "%s/nvidia/capabilities", proc_driver) >= (int)sizeof caps_root)
        state_dir[0] = state_path[0] = lock_path[0] = caps_root[0] = '\0';
}

int sim_state_file(char *out, size_t size, const char *name) {
    if (!state_dir[0] || snprintf(out, size, "%s/%s", state_dir, name) >= (int)size) return 0;
    return 1;
}

static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

char *sim_file_read_changed(const char *path, struct stat *seen, size_t *length, const char *what) {
    struct stat now;
    if (!path[0] || stat(path, &now) != 0 || same_file(&now, seen)) return NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat opened;
    if (fd < 0) return NULL;
    *seen = now; /* complained about once, not on every call */
    if (fstat(fd, &opened) != 0 || !S_ISREG(opened.st_mode) || opened.st_size > MAX_STATE_BYTES) {
        sim_complain("the %s %s is not a regular file of at most 4 MiB; ignored", what, path);
        close(fd);
        return NULL;
    }
    *seen = opened;
    size_t total = (size_t)opened.st_size, got = 0;
    char *text = malloc(total + 1);
    ssize_t n = 1;
    while (text && got < total && (n = read(fd, text + got, total - got)) > 0) got += (size_t)n;
    close(fd);
    if (text) text[got] = '\0';
    *length = got;
    return text;
}

void sim_state_refresh(void) {
    size_t length;
    char *text = sim_file_read_changed(state_path, &applied, &length, "MIG state");
    char error[256];
    if (text && !sim_state_parse(sim_current, text, length, error, sizeof error))
        sim_complain("the MIG state %s is malformed: %s; ignored", state_path, error);
    free(text);
}

int sim_file_lock(const char *path) {
    if (!path[0]) return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) return -1;
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) { close(fd); return -1; }
    return fd;
}

int sim_state_lock(void) { return sim_file_lock(lock_path); }

void sim_state_unlock(int lock) {
    if (lock >= 0) close(lock); /* releases the flock */
}

void sim_json_string(FILE *out, const char *text) {
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(out, "\\%c", *c);
        else if (*c < 0x20) fprintf(out, "\\u%04x", *c);
        else fputc(*c, out);
    }
    fputc('"', out);
}

static void write_mig(FILE *out, const sim_mig *m) {
    fputs("{\"uuid\": ", out);
    sim_json_string(out, m->uuid);
    fputs(", \"name\": ", out);
    sim_json_string(out, m->name);
    fprintf(out, ", \"gpuInstanceId\": %u, \"computeInstanceId\": %u, \"giEnum\": %u, \"giProfileId\": %u, "
                 "\"giSlices\": %u, \"ciSlices\": %u, \"sms\": %u, \"copyEngines\": %u, \"decoders\": %u, "
                 "\"jpegs\": %u, \"ofas\": %u, \"memoryMiB\": %llu, \"placement\": [%u, %u]}",
            m->gi_id, m->ci_id, m->gi_enum, m->gi_profile_id, m->gi_slices, m->ci_slices, m->sms,
            m->copy_engines, m->decoders, m->jpegs, m->ofas, m->memory_mib, m->placement.start, m->placement.size);
}

static char *render_state(size_t *length) {
    char *text = NULL;
    FILE *out = open_memstream(&text, length);
    if (!out) return NULL;
    fprintf(out, "{\"format\": 1, \"created\": %llu, \"gpus\": [", sim_current->created);
    for (unsigned i = 0; i < sim_current->gpu_count; i++) {
        const sim_gpu *g = &sim_current->gpus[i];
        fputs(i ? ",\n {\"uuid\": " : "\n {\"uuid\": ", out);
        sim_json_string(out, g->uuid);
        fprintf(out, ", \"migEnabled\": %s, \"migPending\": %s, \"migDevices\": [", g->mig_enabled ? "true" : "false",
                g->mig_pending ? "true" : "false");
        for (unsigned j = 0; j < g->mig_count; j++) {
            fputs(j ? ",\n  " : "\n  ", out);
            write_mig(out, &g->migs[j]);
        }
        fputs("]}", out);
    }
    fputs("]}\n", out);
    if (fclose(out) != 0) { free(text); return NULL; }
    return text;
}

static int write_all(int fd, const char *text, size_t length) {
    while (length) {
        ssize_t n = write(fd, text, length);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        text += n;
        length -= (size_t)n;
    }
    return 1;
}

static void write_text(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return;
    write_all(fd, text, strlen(text));
    close(fd);
}

/* Whether the layout holds GPU instance `gi` (`ci` < 0) or its compute instance `ci`. */
static int holds(const sim_gpu *gpu, unsigned gi, long ci) {
    for (unsigned j = 0; j < gpu->mig_count; j++)
        if (gpu->migs[j].gi_id == gi && (ci < 0 || gpu->migs[j].ci_id == (unsigned long)ci)) return 1;
    return 0;
}

/* The number in a directory entry named `<prefix><n>`, or -1. */
static long numbered(const struct dirent *entry, const char *prefix) {
    size_t length = strlen(prefix);
    char *end;
    if (strncmp(entry->d_name, prefix, length) != 0 || !entry->d_name[length]) return -1;
    unsigned long n = strtoul(entry->d_name + length, &end, 10);
    return *end || n > 0xFFFF ? -1 : (long)n;
}

/* Remove `path`/access and the directory `path` (only once empty); `path` is left as it was. */
static void remove_access(char *path) {
    size_t dir = strlen(path);
    snprintf(path + dir, PATH_MAX + 64 - dir, "/access");
    unlink(path);
    path[dir] = '\0';
    rmdir(path);
}

/* `path`/access holding the capability's minor, its directories made, unless it is there. */
static void ensure_access(char *path, unsigned minor) {
    char text[96];
    size_t dir = strlen(path);
    snprintf(path + dir, PATH_MAX + 64 - dir, "/access");
    if (access(path, F_OK) != 0) {
        for (char *c = path + strlen(proc_driver) + 1; (c = strchr(c, '/')); *c++ = '/') {
            *c = '\0';
            mkdir(path, 0755);
        }
        snprintf(text, sizeof text, "DeviceFileMinor: %u\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor);
        write_text(path, text);
    }
    path[dir] = '\0';
}

/* The capability files of one GPU as its layout now says. Only what is on disk is read and only
 * what changed is written (one directory read per GPU and per GPU instance there), so a change
 * costs in proportion to the instances, not to every id the driver's table allows. */
static void sync_capabilities(const sim_gpu *gpu) {
    char path[PATH_MAX + 64];
    int length = snprintf(path, sizeof path, "%s/gpu%u/mig", caps_root, gpu->minor);
    DIR *mig = opendir(path);
    for (struct dirent *entry; mig && (entry = readdir(mig));) {
        long gi = numbered(entry, "gi");
        if (gi < 0) continue;
        snprintf(path + length, sizeof path - length, "/gi%ld", gi);
        size_t gi_length = strlen(path);
        DIR *cis = opendir(path);
        for (struct dirent *leaf; cis && (leaf = readdir(cis));) {
            long ci = numbered(leaf, "ci");
            if (ci < 0 || holds(gpu, (unsigned)gi, ci)) continue;
            snprintf(path + gi_length, sizeof path - gi_length, "/ci%ld", ci);
            remove_access(path);
            path[gi_length] = '\0';
        }
        if (cis) closedir(cis);
        if (!holds(gpu, (unsigned)gi, -1)) remove_access(path);
        path[length] = '\0';
    }
    if (mig) closedir(mig);
    for (unsigned j = 0; j < gpu->mig_count; j++) {
        const sim_mig *m = &gpu->migs[j];
        unsigned minor = (unsigned)SIM_CAP_MINOR(gpu->minor, m->gi_id);
        snprintf(path + length, sizeof path - length, "/gi%u", m->gi_id);
        ensure_access(path, minor);
        if (!sim_is_device(m)) continue;
        size_t gi_length = strlen(path);
        snprintf(path + gi_length, sizeof path - gi_length, "/ci%u", m->ci_id);
        ensure_access(path, minor + 1 + m->ci_id);
    }
}

int sim_file_replace(const char *path, const char *text, size_t length, struct stat *seen) {
    struct stat before;
    char scratch[PATH_MAX + 16];
    if (snprintf(scratch, sizeof scratch, "%s.%d", path, (int)getpid()) >= (int)sizeof scratch) return 0;
    int fd = open(scratch, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    int ok = fd >= 0 && write_all(fd, text, length);
    if (ok && stat(path, &before) == 0) {
        struct stat now;
        /* Later than the file it replaces, whatever the clock's grain. */
        if (fstat(fd, &now) == 0 && (now.st_mtim.tv_sec < before.st_mtim.tv_sec ||
                                     (now.st_mtim.tv_sec == before.st_mtim.tv_sec &&
                                      now.st_mtim.tv_nsec <= before.st_mtim.tv_nsec))) {
            struct timespec times[2] = {before.st_mtim, before.st_mtim};
            if (++times[1].tv_nsec >= 1000000000L) { times[1].tv_sec++; times[1].tv_nsec = 0; }
            times[0] = times[1];
            ok = futimens(fd, times) == 0;
        }
    }
    if (fd >= 0) ok = close(fd) == 0 && ok;
    if (!ok || rename(scratch, path) != 0) {
        int saved = errno;
        unlink(scratch);
        errno = saved;
        return 0;
    }
    stat(path, seen); /* our own change is applied already */
    return 1;
}

nvmlReturn_t sim_state_commit(int lock) {
    struct stat proc;
    size_t length;
    if (lock < 0) return NVML_ERROR_UNKNOWN;
    char *text = render_state(&length);
    if (!text) return NVML_ERROR_MEMORY;
    int ok = sim_file_replace(state_path, text, length, &applied);
    free(text);
    if (!ok) {
        sim_complain("cannot write the MIG state %s: %s", state_path, strerror(errno));
        return NVML_ERROR_UNKNOWN;
    }
    if (stat(proc_driver, &proc) == 0 && S_ISDIR(proc.st_mode))
        for (unsigned i = 0; i < sim_current->gpu_count; i++) sync_capabilities(&sim_current->gpus[i]);
    return NVML_SUCCESS;
}

/* A version-4 UUID's shape, from the GPU's UUID, the instance's ids and the creation count. */
void sim_new_mig_uuid(const sim_gpu *gpu, const sim_mig *mig, char *out, size_t size) {
    unsigned long long a = 1469598103934665603ull, b;
    for (const char *c = gpu->uuid; *c; c++) a = (a ^ (unsigned char)*c) * 1099511628211ull;
    a = (a ^ sim_current->created) * 1099511628211ull;
    a = (a ^ (mig->gi_id << 8 | mig->ci_id)) * 1099511628211ull;
    b = (a ^ 0x9E3779B97F4A7C15ull) * 1099511628211ull;
    snprintf(out, size, "MIG-%08llx-%04llx-4%03llx-8%03llx-%012llx", a >> 32, (a >> 16) & 0xFFFF, a & 0xFFF,
             b >> 52, b & 0xFFFFFFFFFFFFull);
}
