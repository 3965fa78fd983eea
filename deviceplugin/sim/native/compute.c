/* The compute mode of each device, shared by every process loading this library from one
 * sim-root as the MIG layout is (state.c): etc/deviceplugin-sim/compute-mode.json beside it,
 * `{"format": 1, "modes": {"<GPU or MIG UUID>": <nvmlComputeMode_t>}}`, holding the devices not
 * in DEFAULT. A change is made under state.c's lock on the file read again, and written whole
 * through an atomic rename; readers compare the file's identity with the last one read. An MPS
 * control daemon runs on devices in EXCLUSIVE_PROCESS, so `nvmlDeviceSetComputeMode` is how a
 * consumer (the device plugin, NVIDIA's MPS daemon through nvidia-smi) prepares a GPU for it.
 *
 * As NVML documents: a MIG-enabled GPU's mode is set and read on its MIG devices, not on the
 * GPU; EXCLUSIVE_THREAD is gone (an invalid mode). Setting needs no root here. */
#define _GNU_SOURCE
#include "sim.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

#define MODES_FILE "compute-mode.json"

static json *modes;      /* the file's "modes" object, owned through `document` */
static json *document;   /* NULL: every device in DEFAULT */
static struct stat seen; /* the file last read */

static int valid_mode(long long mode) {
    return mode == NVML_COMPUTEMODE_DEFAULT || mode == NVML_COMPUTEMODE_PROHIBITED ||
           mode == NVML_COMPUTEMODE_EXCLUSIVE_PROCESS;
}

/* The document's problem, or NULL when it is a compute-mode file this library wrote. */
static const char *problem(const json *doc) {
    const json *format = json_get(doc, "format"), *table = json_get(doc, "modes");
    if (doc->kind != JSON_OBJECT || !format || format->kind != JSON_NUMBER || !format->integral ||
        format->integer != 1)
        return "format is not 1";
    if (!table || table->kind != JSON_OBJECT) return "modes is not an object";
    for (const json *m = table->child; m; m = m->next) {
        if (m->kind != JSON_NUMBER || !m->integral || !valid_mode(m->integer)) return "a mode is not 0, 2 or 3";
        if (strspn(m->key, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-/") != strlen(m->key))
            return "a key is not a device UUID";
    }
    return NULL;
}

static void refresh(const char *path) {
    size_t length;
    char *text = sim_file_read_changed(path, &seen, &length, "compute-mode state"), error[256];
    if (!text) return;
    json *doc = json_parse(text, length, error, sizeof error);
    const char *why = doc ? problem(doc) : error;
    if (why) {
        sim_complain("the compute-mode state %s is malformed: %s; ignored", path, why);
        json_free(doc);
    } else {
        json_free(document);
        document = doc;
        modes = (json *)json_get(doc, "modes");
    }
    free(text);
}

static nvmlComputeMode_t mode_of(const char *uuid) {
    const json *entry = modes ? json_get(modes, uuid) : NULL;
    return entry ? (nvmlComputeMode_t)entry->integer : NVML_COMPUTEMODE_DEFAULT;
}

/* The table with `uuid` in `mode`, written whole. */
static nvmlReturn_t write_modes(const char *path, const char *uuid, nvmlComputeMode_t mode) {
    char *text = NULL;
    size_t length;
    FILE *out = open_memstream(&text, &length);
    if (!out) return NVML_ERROR_MEMORY;
    const char *separator = "";
    fputs("{\"format\": 1, \"modes\": {", out);
    for (const json *m = modes ? modes->child : NULL; m; m = m->next)
        if (strcmp(m->key, uuid) != 0) {
            fprintf(out, "%s\"%s\": %lld", separator, m->key, m->integer);
            separator = ", ";
        }
    if (mode != NVML_COMPUTEMODE_DEFAULT) fprintf(out, "%s\"%s\": %d", separator, uuid, (int)mode);
    fputs("}}\n", out);
    if (fclose(out) != 0) { free(text); return NVML_ERROR_MEMORY; }
    int written = sim_file_replace(path, text, length, &seen);
    if (!written) sim_complain("cannot write the compute-mode state %s: %s", path, strerror(errno));
    free(text);
    nvmlReturn_t result = written ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    if (result == NVML_SUCCESS) {
        seen.st_ino = 0; /* read back our own table next time */
        refresh(path);
    }
    return result;
}

/* The device's UUID, once it is one whose mode NVML keeps. */
static nvmlReturn_t device_uuid(nvmlDevice_t device, const char *call, const char **uuid) {
    sim_gpu *gpu;
    sim_mig *mig;
    nvmlReturn_t result = sim_device(device, call, &gpu, &mig);
    if (result != NVML_SUCCESS) return result;
    if (!mig && gpu->mig_enabled) return NVML_ERROR_INVALID_ARGUMENT;
    *uuid = mig ? mig->uuid : gpu->uuid;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    char path[PATH_MAX];
    const char *uuid;
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = device_uuid(device, "nvmlDeviceGetComputeMode", &uuid);
    if (result == NVML_SUCCESS) {
        if (sim_state_file(path, sizeof path, MODES_FILE)) refresh(path);
        *mode = mode_of(uuid);
    }
    pthread_mutex_unlock(&sim_lock);
    return result;
}

nvmlReturn_t DECLDIR nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode) {
    char path[PATH_MAX];
    const char *uuid;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = device_uuid(device, "nvmlDeviceSetComputeMode", &uuid);
    if (result == NVML_SUCCESS && !valid_mode(mode)) result = NVML_ERROR_INVALID_ARGUMENT;
    if (result == NVML_SUCCESS && !sim_state_file(path, sizeof path, MODES_FILE)) result = NVML_ERROR_UNKNOWN;
    if (result == NVML_SUCCESS) {
        int lock = sim_state_lock();
        if (lock < 0) {
            result = NVML_ERROR_UNKNOWN;
        } else {
            refresh(path);
            if (mode_of(uuid) != mode) result = write_modes(path, uuid, mode);
            sim_state_unlock(lock);
        }
    }
    pthread_mutex_unlock(&sim_lock);
    return result;
}
