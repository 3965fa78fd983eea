/* Event lines (SPEC section 4) turned into NVML events, and the event sets that wait for them.
 *
 * Every exported call pumps the events file first (under sim_lock), so a `lost` line takes
 * effect on the next call. A wait blocks in poll() on an inotify watch of the file's folder,
 * one per event set, so an idle wait costs no CPU and an appended line wakes it at once; a
 * one-second poll backs the watch up. Only lines appended after the first nvmlInit are read,
 * each once: a file replaced (another inode: an editor, `sed -i`, logrotate) or truncated is
 * read again from its start, with a note. The file must be a regular file, opened without
 * blocking, and is read only up to the size it had when opened, so a pump never waits and never
 * runs on. A malformed line, or one longer than SIM_MAX_LINE bytes, is reported and skipped.
 *
 * Memory stays bounded whoever waits: a set queues at most MAX_QUEUED events (more are dropped,
 * and counted in one note), and a freed set's memory is released. Handles are ids, never
 * addresses, so a stale handle is refused even when a new set reuses the memory. */
#define _GNU_SOURCE
#include "sim.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BACKUP_POLL_MS 1000
#define XID_FALLEN_OFF_BUS 79
#define MAX_QUEUED 4096

typedef struct event {
    nvmlEventData_t data;
    struct event *next;
} event;

struct nvmlEventSet_st {
    uintptr_t id; /* the handle callers hold */
    unsigned long long masks[SIM_MAX_GPUS];
    event *head, *tail;
    unsigned queued;
    unsigned long long dropped;
    nvmlReturn_t wait_error;
    int watch; /* inotify descriptor, -1 without one */
    int waiters, freed;
    struct nvmlEventSet_st *next;
};

static struct nvmlEventSet_st *live_sets;
static uintptr_t last_id = 0x5e7000; /* ids are never reused */
static long long offset = -1;
static dev_t file_device;
static ino_t file_inode;
static char partial[SIM_MAX_LINE];
static size_t partial_length;
static int partial_overlong;
static nvmlReturn_t file_error; /* the events file could not be read at the last pump */

static nvmlReturn_t open_error(int code) {
    return code == ENOENT ? NVML_ERROR_NOT_FOUND
         : code == EACCES || code == EPERM ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
}

/* The events file opened without blocking; -1 with errno set (EINVAL: not a regular file). */
static int open_events(struct stat *st) {
    int fd = open(sim_events_path(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        int code = S_ISREG(st->st_mode) ? errno : EINVAL;
        close(fd);
        errno = code;
        return -1;
    }
    return fd;
}

static const char *reason(int code) { return code == EINVAL ? "not a regular file" : strerror(code); }

nvmlReturn_t sim_events_open(void) {
    struct stat st;
    int fd = open_events(&st);
    if (fd < 0) {
        int code = errno;
        sim_complain("cannot read the events file %s: %s (`deviceplugin sim-root` creates it empty)",
                     sim_events_path(), reason(code));
        return open_error(code);
    }
    close(fd);
    offset = (long long)st.st_size;
    file_device = st.st_dev;
    file_inode = st.st_ino;
    return NVML_SUCCESS;
}

static void deliver(sim_gpu *gpu, sim_mig *mig, unsigned long long type, unsigned long long data) {
    if (mig && !sim_mig_seen(mig)) return; /* a MIG device this process does not see */
    for (struct nvmlEventSet_st *set = live_sets; set; set = set->next) {
        if (!(set->masks[gpu->index] & type)) continue;
        event *e = set->queued < MAX_QUEUED ? calloc(1, sizeof *e) : NULL;
        if (!e) {
            if (set->dropped++ == 0)
                sim_complain("an event set holds %d events nobody waited for; dropping new ones", MAX_QUEUED);
            continue;
        }
        e->data.device = (nvmlDevice_t)gpu;
        e->data.eventType = type;
        e->data.eventData = data;
        e->data.gpuInstanceId = mig ? mig->gi_id : SIM_NO_INSTANCE;
        e->data.computeInstanceId = mig ? mig->ci_id : SIM_NO_INSTANCE;
        if (set->tail) set->tail->next = e; else set->head = e;
        set->tail = e;
        set->queued++;
    }
}

static int owner(const char *uuid, sim_gpu **gpu, sim_mig **mig) {
    for (unsigned i = 0; i < sim_current->gpu_count; i++) {
        sim_gpu *g = &sim_current->gpus[i];
        if (strcmp(g->uuid, uuid) == 0) { *gpu = g; *mig = NULL; return 1; }
        for (unsigned j = 0; j < g->mig_count; j++)
            if (strcmp(g->migs[j].uuid, uuid) == 0) { *gpu = g; *mig = &g->migs[j]; return 1; }
    }
    return 0;
}

static const char *apply(const char *text, size_t length) {
    sim_event_line line;
    const char *problem = sim_event_parse(text, length, &line);
    if (problem) return problem;
    sim_gpu *gpu = NULL;
    sim_mig *mig = NULL;
    if (line.uuid[0] && !owner(line.uuid, &gpu, &mig)) return "uuid names no GPU or MIG device of this node";
    if (line.wait_error != NVML_SUCCESS)
        for (struct nvmlEventSet_st *set = live_sets; set; set = set->next) set->wait_error = line.wait_error;
    if (gpu) {
        long long xid = line.xid;
        if (line.lost >= 0) gpu->lost = line.lost;
        if (line.retired_pages_pending >= 0) gpu->retired_pages_pending = line.retired_pages_pending;
        if (line.remapped_rows_pending >= 0) gpu->remapped_rows_pending = line.remapped_rows_pending;
        if (line.recovery_action >= 0) gpu->recovery_action = (unsigned)line.recovery_action;
        if (xid < 0 && line.lost == 1) xid = XID_FALLEN_OFF_BUS;
        if (xid >= 0) deliver(gpu, mig, nvmlEventTypeXidCriticalError, (unsigned long long)xid);
        if (line.ecc_type) deliver(gpu, mig, line.ecc_type, 0);
    }
    return NULL;
}

static void line_done(void) {
    if (partial_overlong) {
        sim_complain("skipped an event line longer than %d bytes: %.80s...", SIM_MAX_LINE, partial);
    } else if (!sim_event_blank(partial, partial_length)) {
        const char *problem = apply(partial, partial_length);
        if (problem)
            sim_complain("skipped an event line (%s): %.*s", problem,
                         (int)(partial_length > 200 ? 200 : partial_length), partial);
    }
    partial_length = 0;
    partial_overlong = 0;
}

static void start_over(const char *why) {
    sim_complain("the events file %s was %s; reading it from its start", sim_events_path(), why);
    offset = 0;
    partial_length = 0;
    partial_overlong = 0;
}

void sim_events_pump(void) {
    struct stat st;
    int fd = open_events(&st);
    if (fd < 0) {
        int code = errno;
        nvmlReturn_t result = open_error(code);
        if (result != file_error) sim_complain("cannot read the events file %s: %s", sim_events_path(), reason(code));
        file_error = result;
        return;
    }
    file_error = NVML_SUCCESS;
    if (st.st_ino != file_inode || st.st_dev != file_device) {
        start_over("replaced");
        file_device = st.st_dev;
        file_inode = st.st_ino;
    } else if ((long long)st.st_size < offset) {
        start_over("truncated");
    }
    char chunk[8192];
    while (offset < (long long)st.st_size) {
        size_t want = (size_t)((long long)st.st_size - offset < (long long)sizeof chunk ? (long long)st.st_size - offset
                                                                                        : (long long)sizeof chunk);
        ssize_t got = pread(fd, chunk, want, (off_t)offset);
        if (got <= 0) break;
        offset += got;
        for (ssize_t i = 0; i < got; i++) {
            if (chunk[i] == '\n') line_done();
            else if (partial_length < sizeof partial) partial[partial_length++] = chunk[i];
            else partial_overlong = 1;
        }
    }
    close(fd);
}

/* --- event sets ------------------------------------------------------------------------------- */

static struct nvmlEventSet_st *find_set(nvmlEventSet_t handle) {
    for (struct nvmlEventSet_st *set = live_sets; set; set = set->next)
        if (set->id == (uintptr_t)handle) return set;
    return NULL;
}

static void destroy(struct nvmlEventSet_st *set) {
    for (event *e = set->head, *next; e; e = next) { next = e->next; free(e); }
    if (set->watch >= 0) close(set->watch);
    free(set);
}

/* An inotify descriptor on the folder of the events file (of its target, when it is a link). */
static int watch_events_folder(void) {
    char folder[PATH_MAX];
    if (!realpath(sim_events_path(), folder)) snprintf(folder, sizeof folder, "%s", sim_events_path());
    char *slash = strrchr(folder, '/');
    if (slash) *slash = '\0'; else snprintf(folder, sizeof folder, ".");
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) return -1;
    if (inotify_add_watch(fd, folder[0] ? folder : "/", IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

nvmlReturn_t DECLDIR nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_enter();
    struct nvmlEventSet_st *created = result == NVML_SUCCESS ? calloc(1, sizeof *created) : NULL;
    if (result == NVML_SUCCESS && !created) result = NVML_ERROR_MEMORY;
    if (created) {
        created->id = ++last_id;
        created->watch = watch_events_folder();
        created->next = live_sets;
        live_sets = created;
        *set = (nvmlEventSet_t)created->id;
    }
    pthread_mutex_unlock(&sim_lock);
    return result;
}

nvmlReturn_t DECLDIR nvmlEventSetFree(nvmlEventSet_t handle) {
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_enter();
    struct nvmlEventSet_st *set = result == NVML_SUCCESS ? find_set(handle) : NULL;
    if (result == NVML_SUCCESS && !set) result = NVML_ERROR_INVALID_ARGUMENT;
    if (set) {
        for (struct nvmlEventSet_st **p = &live_sets; *p; p = &(*p)->next)
            if (*p == set) { *p = set->next; break; }
        set->freed = 1;
        if (set->waiters == 0) destroy(set);
    }
    pthread_mutex_unlock(&sim_lock);
    return result;
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    sim_gpu *gpu;
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_whole_gpu(device, "nvmlDeviceGetSupportedEventTypes", &gpu);
    if (result == NVML_SUCCESS) *types = gpu->supported_events;
    pthread_mutex_unlock(&sim_lock);
    return result;
}

nvmlReturn_t DECLDIR nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t handle) {
    sim_gpu *gpu;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_whole_gpu(device, "nvmlDeviceRegisterEvents", &gpu);
    struct nvmlEventSet_st *set = result == NVML_SUCCESS ? find_set(handle) : NULL;
    if (result == NVML_SUCCESS && !set) result = NVML_ERROR_INVALID_ARGUMENT;
    else if (set && (types & ~gpu->supported_events)) result = NVML_ERROR_NOT_SUPPORTED;
    else if (set) set->masks[gpu->index] |= types;
    pthread_mutex_unlock(&sim_lock);
    return result;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

nvmlReturn_t DECLDIR nvmlEventSetWait_v2(nvmlEventSet_t handle, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = now_ms() + timeoutms;
    pthread_mutex_lock(&sim_lock);
    struct nvmlEventSet_st *set = sim_init_count ? find_set(handle) : NULL;
    nvmlReturn_t result = !sim_init_count ? NVML_ERROR_UNINITIALIZED : set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    if (set) set->waiters++;
    while (set) {
        if (set->freed || !sim_init_count) { result = NVML_ERROR_UNINITIALIZED; break; }
        sim_events_pump();
        if (set->wait_error != NVML_SUCCESS) { result = set->wait_error; set->wait_error = NVML_SUCCESS; break; }
        if (set->head) {
            event *e = set->head;
            set->head = e->next;
            if (!set->head) set->tail = NULL;
            set->queued--;
            *data = e->data;
            free(e);
            result = NVML_SUCCESS;
            break;
        }
        if (file_error != NVML_SUCCESS) { result = file_error; break; }
        long long remaining = deadline - now_ms();
        if (remaining <= 0) { result = NVML_ERROR_TIMEOUT; break; }
        struct pollfd watched = {set->watch, POLLIN, 0};
        int wait_ms = (int)(remaining < BACKUP_POLL_MS ? remaining : BACKUP_POLL_MS);
        pthread_mutex_unlock(&sim_lock);
        if (watched.fd >= 0) {
            if (poll(&watched, 1, wait_ms) > 0) {
                char drain[4096];
                while (read(watched.fd, drain, sizeof drain) > 0) {}
            }
        } else {
            struct timespec pause = {0, 50 * 1000000L};
            nanosleep(&pause, NULL);
        }
        pthread_mutex_lock(&sim_lock);
    }
    if (set && --set->waiters == 0 && set->freed) destroy(set);
    pthread_mutex_unlock(&sim_lock);
    return result;
}

nvmlReturn_t DECLDIR nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
