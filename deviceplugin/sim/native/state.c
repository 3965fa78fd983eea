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
 * a bad one is complained about and ignored. Other state shared the same way (compute.c) keeps
 * its own file beside this one and takes the same lock. The kernel module's capability files
 * (proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access) follow each change. */
#define _GNU_SOURCE
#include "sim.h"

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
/* The driver's minors: gpu<N>/gi<G>/access is 3 + 135 N + 9 G, its ci<C> one more plus C. */
#define CAP_MINOR(gpu, gi) (3u + 135u * (gpu) + 9u * (gi))

static char state_dir[PATH_MAX], state_path[PATH_MAX], lock_path[PATH_MAX], caps_root[PATH_MAX], proc_driver[PATH_MAX];
static struct stat applied; /* the state file last applied; st_ino 0: none */

void sim_state_paths(const char *events) {
    const char *slash = strrchr(events, '/');
    int dir = slash ? (int)(slash - events) : 1;
    const char *base = slash ? events : ".";
    if (snprintf(state_dir, sizeof state_dir, "%.*s", dir, base) >= (int)sizeof state_dir ||
        snprintf(state_path, sizeof state_path, "%.*s/" STATE_FILE, dir, base) >= (int)sizeof state_path ||
        snprintf(lock_path, sizeof lock_path, "%.*s/" LOCK_FILE, dir, base) >= (int)sizeof lock_path ||
        snprintf(proc_driver, sizeof proc_driver, "%.*s/../../proc/driver", dir, base) >= (int)sizeof proc_driver ||
        snprintf(caps_root, sizeof caps_root, "%s/nvidia/capabilities", proc_driver) >= (int)sizeof caps_root)
        state_dir[0] = state_path[0] = lock_path[0] = caps_root[0] = '\0';
}

static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

int sim_state_file(const char *name, char *out, size_t size) {
    return state_dir[0] && snprintf(out, size, "%s/%s", state_dir, name) < (int)size;
}

char *sim_state_read(const char *path, struct stat *seen, size_t *length) {
    struct stat now;
    if (stat(path, &now) != 0 || same_file(&now, seen)) return NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat opened;
    if (fd < 0) return NULL;
    *seen = now; /* complained about once, not on every call */
    if (fstat(fd, &opened) != 0 || !S_ISREG(opened.st_mode) || opened.st_size > MAX_STATE_BYTES) {
        sim_complain("the state file %s is not a regular file of at most 4 MiB; ignored", path);
        close(fd);
        return NULL;
    }
    *seen = opened;
    size_t size = (size_t)opened.st_size, got = 0;
    char *text = malloc(size + 1);
    ssize_t n = 1;
    while (text && got < size && (n = read(fd, text + got, size - got)) > 0) got += (size_t)n;
    close(fd);
    if (text) text[got] = '\0';
    *length = got;
    return text;
}

void sim_state_refresh(void) {
    size_t length;
    char *text = state_path[0] ? sim_state_read(state_path, &applied, &length) : NULL;
    char error[256];
    if (text && !sim_state_parse(sim_current, text, length, error, sizeof error))
        sim_complain("the MIG state %s is malformed: %s; ignored", state_path, error);
    free(text);
}

int sim_state_lock(void) {
    if (!lock_path[0]) return -1;
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) return -1;
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) { close(fd); return -1; }
    return fd;
}

void sim_state_unlock(int lock) {
    if (lock >= 0) close(lock); /* releases the flock */
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

static void write_mig(FILE *out, const sim_mig *m) {
    fputs("{\"uuid\": ", out);
    json_string(out, m->uuid);
    fputs(", \"name\": ", out);
    json_string(out, m->name);
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
        json_string(out, g->uuid);
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

/* The capability files of one GPU as its layout now says; the driver's table bounds them. */
static void sync_capabilities(const sim_gpu *gpu) {
    char path[PATH_MAX + 64], text[96];
    for (unsigned gi = 0; gi <= SIM_MAX_GPU_INSTANCE_ID; gi++) {
        const sim_mig *first = NULL;
        for (unsigned j = 0; j < gpu->mig_count && !first; j++)
            if (gpu->migs[j].gi_id == gi) first = &gpu->migs[j];
        for (unsigned ci = 0; ci <= SIM_MAX_COMPUTE_INSTANCE_ID + 1; ci++) {
            int leaf = ci <= SIM_MAX_COMPUTE_INSTANCE_ID, wanted = first != NULL;
            if (leaf) {
                wanted = 0;
                for (unsigned j = 0; j < gpu->mig_count; j++)
                    wanted |= gpu->migs[j].gi_id == gi && gpu->migs[j].ci_id == ci;
                snprintf(path, sizeof path, "%s/gpu%u/mig/gi%u/ci%u", caps_root, gpu->minor, gi, ci);
            } else {
                snprintf(path, sizeof path, "%s/gpu%u/mig/gi%u", caps_root, gpu->minor, gi);
            }
            size_t dir = strlen(path);
            snprintf(path + dir, sizeof path - dir, "/access");
            if (!wanted) {
                unlink(path);
                path[dir] = '\0';
                rmdir(path); /* only once empty */
                continue;
            }
            unsigned minor = CAP_MINOR(gpu->minor, gi) + (leaf ? 1 + ci : 0);
            snprintf(text, sizeof text, "DeviceFileMinor: %u\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor);
            for (char *c = path + strlen(proc_driver) + 1; (c = strchr(c, '/')); *c++ = '/') {
                *c = '\0';
                mkdir(path, 0755);
            }
            write_text(path, text);
        }
    }
}

nvmlReturn_t sim_state_replace(const char *path, const char *text, size_t length, struct stat *seen) {
    struct stat before;
    char scratch[PATH_MAX + 16];
    if (snprintf(scratch, sizeof scratch, "%s.%d", path, (int)getpid()) >= (int)sizeof scratch)
        return NVML_ERROR_MEMORY;
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
        sim_complain("cannot write the state file %s: %s", path, strerror(errno));
        unlink(scratch);
        return NVML_ERROR_UNKNOWN;
    }
    stat(path, seen); /* our own change is applied already */
    return NVML_SUCCESS;
}

nvmlReturn_t sim_state_commit(int lock) {
    struct stat proc;
    size_t length;
    if (lock < 0) return NVML_ERROR_UNKNOWN;
    char *text = render_state(&length);
    if (!text) return NVML_ERROR_MEMORY;
    nvmlReturn_t result = sim_state_replace(state_path, text, length, &applied);
    free(text);
    if (result != NVML_SUCCESS) return result;
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
