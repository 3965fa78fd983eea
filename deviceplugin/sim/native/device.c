/* Per-device queries: identity, memory, PCI, topology, NVLink and the health probes. A MIG
 * handle answers as NVML answers for a MIG device (its own UUID, name and memory; the parent's
 * PCI address and compute capability); calls that need a whole GPU refuse it. */
#include "sim.h"

#include <stdio.h>
#include <string.h>

/* Run the body with `gpu` and `mig` (NULL for a whole GPU) under the lock; `call` is the name a
 * node file's notSupported uses for it. */
#define DEVICE(handle, out, call, ...)                                         \
    do {                                                                        \
        sim_gpu *gpu;                                                           \
        sim_mig *mig;                                                           \
        if (!(out)) return NVML_ERROR_INVALID_ARGUMENT;                         \
        pthread_mutex_lock(&sim_lock);                                          \
        nvmlReturn_t result = sim_device(handle, call, &gpu, &mig);             \
        if (result == NVML_SUCCESS) { __VA_ARGS__; }                               \
        pthread_mutex_unlock(&sim_lock);                                        \
        return result;                                                          \
    } while (0)

#define WHOLE_GPU(handle, out, call, ...) \
    DEVICE(handle, out, call, if (mig) result = NVML_ERROR_INVALID_ARGUMENT; else { __VA_ARGS__; })

nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE(device, uuid, "nvmlDeviceGetUUID", sim_copy(uuid, length, mig ? mig->uuid : gpu->uuid, &result));
}

nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE(device, name, "nvmlDeviceGetName", sim_copy(name, length, mig ? mig->name : gpu->name, &result));
}

nvmlReturn_t DECLDIR nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    WHOLE_GPU(device, serial, "nvmlDeviceGetSerial", sim_copy(serial, length, gpu->serial, &result));
}

nvmlReturn_t DECLDIR nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *brand) {
    DEVICE(device, brand, "nvmlDeviceGetBrand", *brand = (nvmlBrandType_t)gpu->brand);
}

nvmlReturn_t DECLDIR nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch) {
    DEVICE(device, arch, "nvmlDeviceGetArchitecture", *arch = gpu->architecture);
}

/* The simulated node is bare metal: no vGPU, no passthrough (NVIDIA's DRA driver refuses
 * dynamic MIG without this answer, and skips it in a vGPU guest). */
nvmlReturn_t DECLDIR nvmlDeviceGetVirtualizationMode(nvmlDevice_t device, nvmlGpuVirtualizationMode_t *mode) {
    WHOLE_GPU(device, mode, "nvmlDeviceGetVirtualizationMode", *mode = NVML_GPU_VIRTUALIZATION_MODE_NONE);
}

nvmlReturn_t DECLDIR nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    WHOLE_GPU(device, index, "nvmlDeviceGetIndex", *index = gpu->view_index);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    WHOLE_GPU(device, minor, "nvmlDeviceGetMinorNumber", *minor = gpu->minor);
}

nvmlReturn_t DECLDIR nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    DEVICE(device, node, "nvmlDeviceGetNumaNodeId",
           if (gpu->numa_node < 0) result = NVML_ERROR_NOT_SUPPORTED; else *node = (unsigned)gpu->numa_node);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE(device, major, "nvmlDeviceGetCudaComputeCapability", *major = gpu->cc_major; *minor = gpu->cc_minor);
}

static unsigned long long memory_bytes(const sim_gpu *gpu, const sim_mig *mig) {
    return (mig ? mig->memory_mib : gpu->memory_mib) << 20;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEVICE(device, memory, "nvmlDeviceGetMemoryInfo",
           memory->total = memory->free = memory_bytes(gpu, mig); memory->used = 0);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEVICE(device, memory, "nvmlDeviceGetMemoryInfo",
           if (memory->version != nvmlMemory_v2) result = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
           else {
               /* Inside a cgroup with a limit on this GPU the limit is the memory (limits.c). */
               unsigned long long limit;
               memory->total = memory->free = !mig && sim_memory_limit(gpu, &limit) ? limit : memory_bytes(gpu, mig);
               memory->reserved = memory->used = 0;
           });
}

static unsigned hex_field(const char **text) {
    unsigned value = 0;
    for (; **text && **text != ':' && **text != '.'; (*text)++) {
        char c = **text;
        unsigned digit = (c >= '0' && c <= '9') ? (unsigned)(c - '0')
                       : (c >= 'a' && c <= 'f') ? (unsigned)(c - 'a' + 10)
                       : (c >= 'A' && c <= 'F') ? (unsigned)(c - 'A' + 10) : 0;
        value = value * 16 + digit;
    }
    if (**text) (*text)++;
    return value;
}

/* nvmlPciInfo_t for a bus id such as 00000000:07:00.0 (ids in the format NVML prints). */
static void pci_info(const char *bus_id, unsigned device_id, nvmlPciInfo_t *pci) {
    const char *p = bus_id;
    memset(pci, 0, sizeof *pci);
    pci->domain = hex_field(&p);
    pci->bus = hex_field(&p);
    pci->device = hex_field(&p);
    pci->pciDeviceId = device_id;
    pci->pciSubSystemId = device_id ? ((device_id & 0xFFFF0000u) | 0x10DE) : 0;
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0",
             pci->domain & 0xFFFF, pci->bus & 0xFF, pci->device & 0xFF);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE(device, pci, "nvmlDeviceGetPciInfo", pci_info(gpu->bus_id, gpu->pci_device_id, pci));
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

/* --- topology ------------------------------------------------------------------------------- */

static nvmlReturn_t two_gpus(nvmlDevice_t first, nvmlDevice_t second, const char *call, sim_gpu **a, sim_gpu **b) {
    nvmlReturn_t result = sim_whole_gpu(first, call, a);
    return result == NVML_SUCCESS ? sim_whole_gpu(second, call, b) : result;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t first, nvmlDevice_t second,
                                                         nvmlGpuTopologyLevel_t *level) {
    sim_gpu *a, *b;
    if (!level) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = two_gpus(first, second, "nvmlDeviceGetTopologyCommonAncestor", &a, &b);
    if (result == NVML_SUCCESS) *level = (nvmlGpuTopologyLevel_t)a->topology[b->index];
    pthread_mutex_unlock(&sim_lock);
    return result;
}

static int switch_links(const sim_gpu *gpu) {
    for (unsigned i = 0; i < gpu->link_count; i++)
        if (gpu->links[i].to_switch) return 1;
    return 0;
}

static int nvlinked(const sim_gpu *a, const sim_gpu *b) {
    for (unsigned i = 0; i < a->link_count; i++)
        if (!a->links[i].to_switch && strcmp(a->links[i].remote_bus_id, b->bus_id) == 0) return 1;
    return a != b && switch_links(a) && switch_links(b);
}

nvmlReturn_t DECLDIR nvmlDeviceGetP2PStatus(nvmlDevice_t first, nvmlDevice_t second,
                                            nvmlGpuP2PCapsIndex_t index, nvmlGpuP2PStatus_t *status) {
    sim_gpu *a, *b;
    if (!status) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sim_lock);
    nvmlReturn_t result = two_gpus(first, second, "nvmlDeviceGetP2PStatus", &a, &b);
    if (result == NVML_SUCCESS) {
        int ok = index == NVML_P2P_CAPS_INDEX_NVLINK
                     ? nvlinked(a, b)
                     : nvlinked(a, b) || a->topology[b->index] <= NVML_TOPOLOGY_HOSTBRIDGE;
        *status = ok ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    }
    pthread_mutex_unlock(&sim_lock);
    return result;
}

/* The link number's errors, as NVML gives them: no NVLink at all, a number past the table, a
 * link that exists but is not active. */
static nvmlReturn_t link_of(const sim_gpu *gpu, unsigned link, int need_active) {
    if (gpu->link_count == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (need_active && link >= gpu->link_count) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *active) {
    WHOLE_GPU(device, active, "nvmlDeviceGetNvLinkState",
              if ((result = link_of(gpu, link, 0)) == NVML_SUCCESS)
                  *active = link < gpu->link_count ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED);
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    WHOLE_GPU(device, pci, "nvmlDeviceGetNvLinkRemotePciInfo",
              if ((result = link_of(gpu, link, 1)) == NVML_SUCCESS) {
                  unsigned device_id = 0;
                  for (unsigned i = 0; i < sim_current->gpu_count; i++)
                      if (strcmp(sim_current->gpus[i].bus_id, gpu->links[link].remote_bus_id) == 0)
                          device_id = sim_current->gpus[i].pci_device_id;
                  pci_info(gpu->links[link].remote_bus_id, device_id, pci);
              });
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                         nvmlIntNvLinkDeviceType_t *type) {
    WHOLE_GPU(device, type, "nvmlDeviceGetNvLinkRemoteDeviceType",
              if ((result = link_of(gpu, link, 1)) == NVML_SUCCESS)
                  *type = gpu->links[link].to_switch ? NVML_NVLINK_DEVICE_TYPE_SWITCH : NVML_NVLINK_DEVICE_TYPE_GPU);
}

/* --- health probes -------------------------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *pending) {
    WHOLE_GPU(device, pending, "nvmlDeviceGetRetiredPagesPendingStatus",
              *pending = gpu->retired_pages_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED);
}

nvmlReturn_t DECLDIR nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrected, unsigned int *uncorrected,
                                               unsigned int *pending, unsigned int *failed) {
    if (!uncorrected || !pending || !failed) return NVML_ERROR_INVALID_ARGUMENT;
    WHOLE_GPU(device, corrected, "nvmlDeviceGetRemappedRows",
              *corrected = 0; *uncorrected = *pending = gpu->remapped_rows_pending ? 1 : 0; *failed = 0);
}

nvmlReturn_t DECLDIR nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    if (count < 0) return NVML_ERROR_INVALID_ARGUMENT;
    WHOLE_GPU(device, values, "nvmlDeviceGetFieldValues",
              for (int i = 0; i < count; i++) {
                  nvmlFieldValue_t *v = &values[i];
                  v->timestamp = v->latencyUsec = 0;
                  if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
                      v->nvmlReturn = NVML_SUCCESS;
                      v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                      v->value.uiVal = gpu->recovery_action;
                  } else {
                      v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                  }
              });
}
