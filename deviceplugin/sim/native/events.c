/* Event lines (SPEC section 4) turned into NVML events, and the event sets that wait for them.
 *
 * Every exported call pumps the events file first (under sim_lock), so a `lost` line takes
 * effect on the next call. A wait blocks in poll() on an inotify watch of the file's folder,
 * one per event set, so an idle wait costs no CPU and an appended line wakes it at once; a
 * one-second poll backs the watch up. Only lines appended after the first nvmlInit are read;
 * a truncated file is read again from its start. Malformed lines are reported and skipped. */
#define _GNU_SOURCE
#include "sim.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "json.h"

#define MAX_LINE 4096
#define BACKUP_POLL_MS 1000
#define XID_FALLEN_OFF_BUS 79

typedef struct event {
    nvmlEventData_t data;
    struct event *next;
} event;

struct nvmlEventSet_st {
    unsigned long long masks[SIM_MAX_GPUS];
    event *head, *tail;
    nvmlReturn_t wait_error;
    int watch; /* inotify descriptor, -1 without one */
    int waiters, freed;
    struct nvmlEventSet_st *next;
};

static struct nvmlEventSet_st *live_sets;
/* Freed sets keep their memory, so a new set never gets a freed one's address and a stale
 * handle is refused instead of reaching the new set. */
static struct nvmlEventSet_st *retired_sets;
static long long offset = -1;
static char partial[MAX_LINE];
static size_t partial_length;
static nvmlReturn_t file_error; /* the events file could not be read at the last pump */

static nvmlReturn_t open_error(int code) {
    return code == ENOENT ? NVML_ERROR_NOT_FOUND
         : code == EACCES || code == EPERM ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t sim_events_open(void) {
    const char *path = sim_events_path();
    struct stat st;
    FILE *probe = fopen(path, "rb");
    if (!probe || fstat(fileno(probe), &st) != 0) {
        int code = errno;
        if (probe) fclose(probe);
        sim_complain("cannot read the events file %s: %s (`deviceplugin sim-root` creates it empty)",
                     path, strerror(code));
        return open_error(code);
    }
    fclose(probe);
    offset = (long long)st.st_size;
    return NVML_SUCCESS;
}


static void deliver(sim_gpu *gpu, sim_mig *mig, unsigned long long type, unsigned long long data) {
    for (struct nvmlEventSet_st *set = live_sets; set; set = set->next) {
        if (!(set->masks[gpu->index] & type)) continue;
        event *e = calloc(1, sizeof *e);
        if (!e) continue;
        e->data.device = (nvmlDevice_t)gpu;
        e->data.eventType = type;
        e->data.eventData = data;
        e->data.gpuInstanceId = mig ? mig->gi_id : SIM_NO_INSTANCE;
        e->data.computeInstanceId = mig ? mig->ci_id : SIM_NO_INSTANCE;
        if (set->tail) set->tail->next = e; else set->head = e;
        set->tail = e;
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

static const struct { const char *name; nvmlReturn_t code; } wait_errors[] = {
    {"unknown", NVML_ERROR_UNKNOWN}, {"gpuIsLost", NVML_ERROR_GPU_IS_LOST},
    {"timeout", NVML_ERROR_TIMEOUT}, {"notSupported", NVML_ERROR_NOT_SUPPORTED},
    {"uninitialized", NVML_ERROR_UNINITIALIZED}, {"invalidArgument", NVML_ERROR_INVALID_ARGUMENT},
    {"noPermission", NVML_ERROR_NO_PERMISSION}, {"memory", NVML_ERROR_MEMORY},
};

/* -1: absent, else 0/1 (or the number); -2: present but of the wrong type. */
static long long field(const json *line, const char *key, json_kind kind) {
    const json *v = json_get(line, key);
    if (!v) return -1;
    if (v->kind != kind) return -2;
    if (kind == JSON_NUMBER) return v->integral && v->integer >= 0 ? v->integer : -2;
    return (long long)v->number;
}

static const char *apply(const char *text, size_t length) {
    char error[128];
    json *line = json_parse(text, length, error, sizeof error);
    if (!line) return "not JSON";
    const char *problem = NULL;
    if (line->kind != JSON_OBJECT) { json_free(line); return "not a JSON object"; }
    static const char *known[] = {"uuid", "xid", "ecc", "lost", "retiredPagesPending",
                                  "remappedRowsPending", "recoveryAction", "waitError"};
    for (const json *m = line->child; m && !problem; m = m->next) {
        int found = 0;
        for (size_t i = 0; i < sizeof known / sizeof *known; i++) found |= strcmp(m->key, known[i]) == 0;
        if (!found) problem = "unknown key";
    }
    const json *uuid = json_get(line, "uuid"), *ecc = json_get(line, "ecc"), *wait = json_get(line, "waitError");
    long long xid = field(line, "xid", JSON_NUMBER), lost = field(line, "lost", JSON_BOOL);
    long long retired = field(line, "retiredPagesPending", JSON_BOOL);
    long long remapped = field(line, "remappedRowsPending", JSON_BOOL);
    long long action = field(line, "recoveryAction", JSON_NUMBER);
    unsigned long long ecc_type = 0;
    nvmlReturn_t wait_code = NVML_SUCCESS;
    if (!problem && (xid == -2 || lost == -2 || retired == -2 || remapped == -2 || action == -2))
        problem = "a value has the wrong type";
    if (!problem && ecc) {
        if (ecc->kind == JSON_STRING && strcmp(ecc->string, "single") == 0) ecc_type = nvmlEventTypeSingleBitEccError;
        else if (ecc->kind == JSON_STRING && strcmp(ecc->string, "double") == 0) ecc_type = nvmlEventTypeDoubleBitEccError;
        else problem = "ecc must be 'single' or 'double'";
    }
    if (!problem && wait) {
        if (wait->kind == JSON_NUMBER && wait->integral && wait->integer > 0 && wait->integer < 100000)
            wait_code = (nvmlReturn_t)wait->integer;
        for (size_t i = 0; wait->kind == JSON_STRING && i < sizeof wait_errors / sizeof *wait_errors; i++)
            if (strcmp(wait->string, wait_errors[i].name) == 0) wait_code = wait_errors[i].code;
        if (wait_code == NVML_SUCCESS) problem = "waitError names no NVML error";
    }
    sim_gpu *gpu = NULL;
    sim_mig *mig = NULL;
    if (!problem && uuid && (uuid->kind != JSON_STRING || !owner(uuid->string, &gpu, &mig)))
        problem = "uuid names no GPU or MIG device of this node";
    if (!problem && !uuid && !wait) problem = "needs a uuid";
    if (!problem && xid < 0 && lost < 0 && retired < 0 && remapped < 0 && action < 0 && !ecc && !wait)
        problem = "says nothing to do";
    if (problem) { json_free(line); return problem; }
    if (wait_code != NVML_SUCCESS)
        for (struct nvmlEventSet_st *set = live_sets; set; set = set->next) set->wait_error = wait_code;
    if (gpu) {
        if (lost >= 0) gpu->lost = (int)lost;
        if (retired >= 0) gpu->retired_pages_pending = (int)retired;
        if (remapped >= 0) gpu->remapped_rows_pending = (int)remapped;
        if (action >= 0) gpu->recovery_action = (unsigned)action;
        if (xid < 0 && lost == 1) xid = XID_FALLEN_OFF_BUS;
        if (xid >= 0) deliver(gpu, mig, nvmlEventTypeXidCriticalError, (unsigned long long)xid);
        if (ecc_type) deliver(gpu, mig, ecc_type, 0);
    }
    json_free(line);
    return NULL;
}

static void line_done(const char *text, size_t length) {
    while (length && (text[length - 1] == '\r' || text[length - 1] == ' ')) length--;
    if (!length) return;
    const char *problem = apply(text, length);
    if (problem) sim_complain("skipped an event line (%s): %.*s", problem, (int)(length > 200 ? 200 : length), text);
}

void sim_events_pump(void) {
    const char *path = sim_events_path();
    FILE *file = fopen(path, "rb");
    struct stat st;
    if (!file || fstat(fileno(file), &st) != 0) {
        int reason = errno;
        nvmlReturn_t code = open_error(reason);
        if (file) fclose(file);
        if (code != file_error) sim_complain("cannot read the events file %s: %s", path, strerror(reason));
        file_error = code;
        return;
    }
    file_error = NVML_SUCCESS;
    if ((long long)st.st_size < offset) {
        sim_complain("the events file %s was truncated; reading it from its start", path);
        offset = 0;
        partial_length = 0;
    }
    if ((long long)st.st_size == offset || fseek(file, (long)offset, SEEK_SET) != 0) { fclose(file); return; }
    char chunk[8192];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, file)) > 0) {
        offset += (long long)got;
        for (size_t i = 0; i < got; i++) {
            if (chunk[i] == '\n') {
                line_done(partial, partial_length);
                partial_length = 0;
            } else if (partial_length < sizeof partial) {
                partial[partial_length++] = chunk[i];
            }
        }
    }
    fclose(file);
}

/* --- event sets ------------------------------------------------------------------------------- */

static struct nvmlEventSet_st *find_set(nvmlEventSet_t handle) {
    for (struct nvmlEventSet_st *set = live_sets; set; set = set->next)
        if (set == handle) return set;
    return NULL;
}

static void destroy(struct nvmlEventSet_st *set) {
    for (event *e = set->head, *next; e; e = next) { next = e->next; free(e); }
    set->head = set->tail = NULL;
    if (set->watch >= 0) close(set->watch);
    set->watch = -1;
    set->next = retired_sets;
    retired_sets = set;
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
        created->watch = watch_events_folder();
        created->next = live_sets;
        live_sets = created;
        *set = created;
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
