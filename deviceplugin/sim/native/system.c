/* Library life cycle, system queries and the ways to get a device handle. */
#include "sim.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "json.h"

/* Init is counted, as NVML counts it: consumers nest Init/Shutdown pairs. */
nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_load();
    if (result == NVML_SUCCESS) sim_init_count++;
    pthread_mutex_unlock(&sim_lock);
    return result;
}

nvmlReturn_t DECLDIR nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t DECLDIR nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t DECLDIR nvmlShutdown(void) {
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_init_count ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (sim_init_count) sim_init_count--;
    pthread_mutex_unlock(&sim_lock);
    return result;
}

const DECLDIR char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t system_text(char *out, unsigned length, int which) {
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_enter();
    if (result == NVML_SUCCESS)
        sim_copy(out, length, which ? sim_current->nvml_version : sim_current->driver_version, &result);
    pthread_mutex_unlock(&sim_lock);
    return result;
}

nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return system_text(version, length, 0);
}

nvmlReturn_t DECLDIR nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return system_text(version, length, 1);
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_enter();
    if (result == NVML_SUCCESS) *version = sim_current->cuda_driver_version;
    pthread_mutex_unlock(&sim_lock);
    return result;
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_enter();
    if (result == NVML_SUCCESS) *count = sim_current->view_count;
    pthread_mutex_unlock(&sim_lock);
    return result;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

/* The GPU (or MIG device, when `migs`) that `match` picks among those this process sees, as a
 * handle. */
typedef int (*matcher)(const sim_gpu *gpu, const sim_mig *mig, const void *key);

static nvmlReturn_t find(matcher match, const void *key, int migs, nvmlDevice_t *device) {
    if (!device || !key) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = sim_enter();
    if (result == NVML_SUCCESS) result = NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; result == NVML_ERROR_NOT_FOUND && i < sim_current->gpu_count; i++) {
        sim_gpu *gpu = &sim_current->gpus[i];
        if (gpu->hidden) continue;
        if (match(gpu, NULL, key)) {
            *device = (nvmlDevice_t)gpu;
            result = gpu->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
        }
        for (unsigned j = 0; migs && result == NVML_ERROR_NOT_FOUND && j < gpu->mig_count; j++)
            if (sim_mig_seen(&gpu->migs[j]) && match(gpu, &gpu->migs[j], key)) {
                *device = (nvmlDevice_t)&gpu->migs[j];
                result = gpu->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
            }
    }
    pthread_mutex_unlock(&sim_lock);
    return result;
}

static int by_index(const sim_gpu *gpu, const sim_mig *mig, const void *key) {
    return !mig && gpu->view_index == *(const unsigned *)key;
}

static int by_uuid(const sim_gpu *gpu, const sim_mig *mig, const void *key) {
    if (mig && !sim_is_device(mig)) return 0;
    return strcmp(mig ? mig->uuid : gpu->uuid, key) == 0;
}

static int by_serial(const sim_gpu *gpu, const sim_mig *mig, const void *key) {
    return !mig && strcmp(gpu->serial, key) == 0;
}

/* Bus ids compare case-insensitively, with or without the 8-digit domain's leading zeros. */
static const char *short_bus(const char *id) {
    size_t n = strlen(id);
    return n > 12 ? id + n - 12 : id;
}

static int by_bus_id(const sim_gpu *gpu, const sim_mig *mig, const void *key) {
    return !mig && strcasecmp(short_bus(gpu->bus_id), short_bus(key)) == 0;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t result = find(by_index, &index, 0, device);
    return result == NVML_ERROR_NOT_FOUND ? NVML_ERROR_INVALID_ARGUMENT : result;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return find(by_uuid, uuid, 1, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) {
    return find(by_serial, serial, 0, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    return find(by_bus_id, bus_id, 0, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUIDV(const nvmlUUID_t *uuid, nvmlDevice_t *device) {
    char text[NVML_DEVICE_UUID_ASCII_LEN + 1];
    if (!uuid) return NVML_ERROR_INVALID_ARGUMENT;
    if (uuid->type != NVML_UUID_TYPE_ASCII) return NVML_ERROR_NOT_SUPPORTED;
    memcpy(text, uuid->value.str, NVML_DEVICE_UUID_ASCII_LEN);
    text[NVML_DEVICE_UUID_ASCII_LEN] = '\0';
    return find(by_uuid, text, 1, device);
}
