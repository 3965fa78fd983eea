/* Per-cgroup GPU memory limits (nvmlDeviceSetMemoryLimits_v1 / GetMemoryLimits_v1), and what
 * nvmlDeviceGetMemoryInfo_v2 reports inside a limited cgroup.
 *
 * The limits every process loading this library from one sim-root shares live in
 * etc/deviceplugin-sim/memory-limits.json beside the events file, kept as the MIG state is
 * (state.c: changed under an exclusive flock of memory-limits.lock, replaced atomically, re-read
 * by any process whose last copy is older). One entry per (GPU UUID, cgroup path); a cleared
 * limit (softLimit 0, hardLimit NVML_DEVICE_MEMORY_LIMIT_MAX) has none. As NVIDIA's driver does,
 * a set or clear needs the cgroup's directory to exist (else NVML_ERROR_OPERATING_SYSTEM), a
 * cgroup that is gone has no limits left, and MIG handles are not supported. The simulation
 * allocates nothing, so a limited cgroup's memory is all free. A limit holds for the cgroup's
 * descendants too (the memory-limit hook caps a pod's cgroup, its containers are below it): a
 * process sees the smallest limit of its cgroup and its ancestors. */
#define _GNU_SOURCE
#include "sim.h"

#include "cgroup.h"
#include "json.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define LIMITS_FILE "memory-limits.json"
#define LIMITS_LOCK "memory-limits.lock"
#define SET_CALL "nvmlDeviceSetMemoryLimits_v1"
#define GET_CALL "nvmlDeviceGetMemoryLimits_v1"

typedef struct {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char *space;
    unsigned long long soft, hard;
} limit_entry;

static limit_entry *entries;
static size_t entry_count;
static struct stat applied; /* the limits file last applied */

static void free_entries(limit_entry *list, size_t count) {
    for (size_t i = 0; i < count; i++) free(list[i].space);
    free(list);
}

static int whole_bytes(const json *value, unsigned long long *out) {
    if (!value || value->kind != JSON_NUMBER || !value->integral || value->integer < 0) return 0;
    *out = (unsigned long long)value->integer;
    return 1;
}

/* The file's entries, or 0 with a message; the current ones are kept then. */
static int parse_limits(const char *text, size_t length, char *error, size_t size) {
    json *root = json_parse(text, length, error, size);
    if (!root) return 0;
    const json *format = json_get(root, "format"), *list = json_get(root, "limits");
    size_t count = list && list->kind == JSON_ARRAY ? json_length(list) : 0;
    limit_entry *parsed = calloc(count ? count : 1, sizeof *parsed);
    int ok = parsed && format && format->kind == JSON_NUMBER && format->integer == 1 && list &&
             list->kind == JSON_ARRAY;
    size_t i = 0;
    for (const json *e = ok ? list->child : NULL; e && ok; e = e->next, i++) {
        const json *uuid = json_get(e, "uuid"), *space = json_get(e, "nameSpace");
        ok = e->kind == JSON_OBJECT && uuid && uuid->kind == JSON_STRING && space &&
             space->kind == JSON_STRING && space->string[0] == '/' &&
             strlen(uuid->string) < sizeof parsed[i].uuid && whole_bytes(json_get(e, "softLimit"), &parsed[i].soft) &&
             whole_bytes(json_get(e, "hardLimit"), &parsed[i].hard) && parsed[i].soft <= parsed[i].hard &&
             (parsed[i].space = strdup(space->string)) != NULL;
        if (ok) strcpy(parsed[i].uuid, uuid->string);
    }
    json_free(root);
    if (!ok) {
        if (!error[0]) snprintf(error, size, "want {\"format\": 1, \"limits\": [{uuid, nameSpace, softLimit, hardLimit}]}");
        free_entries(parsed, count);
        return 0;
    }
    free_entries(entries, entry_count);
    entries = parsed;
    entry_count = count;
    return 1;
}

static void refresh(const char *path) {
    size_t length;
    char error[256] = "";
    char *text = sim_file_read_changed(path, &applied, &length, "memory limits");
    if (text && !parse_limits(text, length, error, sizeof error))
        sim_complain("the memory limits %s are malformed: %s; ignored", path, error);
    free(text);
}

static limit_entry *find(const char *uuid, const char *space) {
    for (size_t i = 0; i < entry_count; i++)
        if (strcmp(entries[i].uuid, uuid) == 0 && strcmp(entries[i].space, space) == 0) return &entries[i];
    return NULL;
}

static int cgroup_exists(const char *space) {
    struct stat info;
    return stat(space, &info) == 0 && S_ISDIR(info.st_mode);
}

static nvmlReturn_t save(const char *path) {
    char *text = NULL;
    size_t length;
    FILE *out = open_memstream(&text, &length);
    if (!out) return NVML_ERROR_MEMORY;
    fputs("{\"format\": 1, \"limits\": [", out);
    for (size_t i = 0; i < entry_count; i++) {
        fputs(i ? ",\n {\"uuid\": " : "\n {\"uuid\": ", out);
        sim_json_string(out, entries[i].uuid);
        fputs(", \"nameSpace\": ", out);
        sim_json_string(out, entries[i].space);
        fprintf(out, ", \"softLimit\": %llu, \"hardLimit\": %llu}", entries[i].soft, entries[i].hard);
    }
    fputs("]}\n", out);
    if (fclose(out) != 0) { free(text); return NVML_ERROR_MEMORY; }
    int ok = sim_file_replace(path, text, length, &applied);
    free(text);
    if (!ok) {
        sim_complain("cannot write the memory limits %s: %s", path, strerror(errno));
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/* Record (soft, hard) for (uuid, space), or drop it on a clear; under the file's lock. */
static nvmlReturn_t change(const char *uuid, const char *space, unsigned long long soft, unsigned long long hard,
                           int clear) {
    char path[PATH_MAX], lock_path[PATH_MAX];
    if (!sim_state_file(path, sizeof path, LIMITS_FILE) || !sim_state_file(lock_path, sizeof lock_path, LIMITS_LOCK))
        return NVML_ERROR_UNKNOWN;
    int lock = sim_file_lock(lock_path);
    if (lock < 0) return NVML_ERROR_UNKNOWN;
    refresh(path);
    limit_entry *found = find(uuid, space);
    nvmlReturn_t result = NVML_SUCCESS;
    if (clear && found) {
        free(found->space);
        *found = entries[--entry_count];
    } else if (!clear && found) {
        found->soft = soft;
        found->hard = hard;
    } else if (!clear) {
        limit_entry *grown = realloc(entries, (entry_count + 1) * sizeof *entries);
        char *copy = strdup(space);
        if (!grown || !copy) {
            if (grown) entries = grown;
            free(copy);
            result = NVML_ERROR_MEMORY;
        } else {
            entries = grown;
            limit_entry *e = &entries[entry_count++];
            snprintf(e->uuid, sizeof e->uuid, "%s", uuid);
            e->space = copy;
            e->soft = soft;
            e->hard = hard;
        }
    }
    if (result == NVML_SUCCESS && (found || !clear)) result = save(path);
    sim_state_unlock(lock);
    return result;
}

/* The cgroup path a limits struct names, normalised into `out`; 0 when it is no absolute path. */
static int name_space(const char *given, char *out, size_t size) {
    if (!given || given[0] != '/' || snprintf(out, size, "%s", given) >= (int)size) return 0;
    sim_cgroup_normalise(out);
    return 1;
}

nvmlReturn_t DECLDIR nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t device, nvmlSetMemoryLimits_v1_t *limits) {
    sim_gpu *gpu;
    sim_mig *mig;
    char space[PATH_MAX], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (!limits) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_device(device, SET_CALL, &gpu, &mig);
    unsigned long long total = result == NVML_SUCCESS ? gpu->memory_mib << 20 : 0;
    int clear = limits->softLimit == 0 && limits->hardLimit == NVML_DEVICE_MEMORY_LIMIT_MAX;
    if (result == NVML_SUCCESS) {
        if (mig) result = NVML_ERROR_NOT_SUPPORTED;
        else if (!name_space(limits->nameSpace, space, sizeof space)) result = NVML_ERROR_INVALID_ARGUMENT;
        else if (!clear && (limits->softLimit > limits->hardLimit || limits->hardLimit > total))
            result = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (result == NVML_SUCCESS) {
        snprintf(uuid, sizeof uuid, "%s", gpu->uuid);
        if (!cgroup_exists(space)) {
            result = change(uuid, space, 0, 0, 1); /* a cgroup that is gone keeps no limits */
            if (result == NVML_SUCCESS) result = NVML_ERROR_OPERATING_SYSTEM;
        } else {
            result = change(uuid, space, limits->softLimit, limits->hardLimit, clear);
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return result;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t device, nvmlGetMemoryLimits_v1_t *limits) {
    sim_gpu *gpu;
    sim_mig *mig;
    char space[PATH_MAX], path[PATH_MAX];
    if (!limits) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_device(device, GET_CALL, &gpu, &mig);
    if (result == NVML_SUCCESS) {
        if (mig) result = NVML_ERROR_NOT_SUPPORTED;
        else if (!name_space(limits->nameSpace, space, sizeof space)) result = NVML_ERROR_INVALID_ARGUMENT;
        else if (!cgroup_exists(space)) result = NVML_ERROR_OPERATING_SYSTEM;
    }
    if (result == NVML_SUCCESS) {
        if (sim_state_file(path, sizeof path, LIMITS_FILE)) refresh(path);
        const limit_entry *found = find(gpu->uuid, space);
        if (!found) {
            result = NVML_ERROR_NOT_FOUND;
        } else {
            limits->softLimit = found->soft;
            limits->hardLimit = found->hard;
            limits->currentUsed = 0;
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return result;
}

int sim_memory_limit(const sim_gpu *gpu, unsigned long long *hard) {
    char space[PATH_MAX], path[PATH_MAX];
    if (!sim_own_cgroup(space, sizeof space) || !sim_state_file(path, sizeof path, LIMITS_FILE)) return 0;
    refresh(path);
    int limited = 0;
    for (size_t length = strlen(space); length > 0;) { /* the cgroup, then each of its parents */
        space[length] = '\0';
        const limit_entry *found = find(gpu->uuid, space);
        if (found && (!limited || found->hard < *hard)) *hard = found->hard;
        limited = limited || found;
        const char *slash = strrchr(space, '/');
        length = slash ? (size_t)(slash - space) : 0;
    }
    return limited;
}
