/* Exercises every modelled call of the simulated libnvidia-ml.so.1 on one node, from several
 * threads, with events appended meanwhile; built with AddressSanitizer and UBSan by
 * tests/test_sim_library_sanitized.py (and with ThreadSanitizer), which passes the node file
 * and the events file:
 *
 *   simlib_selftest NODE_JSON EVENTS_FILE
 *
 * Prints each failed check and exits 1; the sanitizers abort on any memory or UB error. */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"

static int failures;
static const char *events_path;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            __atomic_add_fetch(&failures, 1, __ATOMIC_SEQ_CST);                \
        }                                                                      \
    } while (0)

static void append(const char *line) {
    FILE *f = fopen(events_path, "a");
    if (!f) { perror(events_path); exit(2); }
    fprintf(f, "%s\n", line);
    fclose(f);
}

static void every_query(nvmlDevice_t device, unsigned count) {
    char text[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned value, current, pending, max;
    int major, minor;
    nvmlMemory_t memory;
    nvmlMemory_v2_t memory2 = {.version = nvmlMemory_v2};
    nvmlPciInfo_t pci;
    nvmlBrandType_t brand;
    nvmlDeviceArchitecture_t arch;
    CHECK(nvmlDeviceGetUUID(device, text, sizeof text) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetUUID(device, text, 4) == NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(nvmlDeviceGetName(device, text, sizeof text) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetSerial(device, text, sizeof text) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetBrand(device, &brand) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetArchitecture(device, &arch) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetIndex(device, &value) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetMinorNumber(device, &value) == NVML_SUCCESS);
    nvmlDeviceGetNumaNodeId(device, &value);
    CHECK(nvmlDeviceGetCudaComputeCapability(device, &major, &minor) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetMemoryInfo(device, &memory) == NVML_SUCCESS && memory.total > 0);
    CHECK(nvmlDeviceGetMemoryInfo_v2(device, &memory2) == NVML_SUCCESS && memory2.total == memory.total);
    memory2.version = 7;
    CHECK(nvmlDeviceGetMemoryInfo_v2(device, &memory2) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    CHECK(nvmlDeviceGetPciInfo_v3(device, &pci) == NVML_SUCCESS && strlen(pci.busId) == 16);
    for (unsigned other = 0; other < count; other++) {
        nvmlDevice_t peer;
        nvmlGpuTopologyLevel_t level;
        nvmlGpuP2PStatus_t status;
        CHECK(nvmlDeviceGetHandleByIndex_v2(other, &peer) == NVML_SUCCESS);
        CHECK(nvmlDeviceGetTopologyCommonAncestor(device, peer, &level) == NVML_SUCCESS);
        CHECK(nvmlDeviceGetP2PStatus(device, peer, NVML_P2P_CAPS_INDEX_NVLINK, &status) == NVML_SUCCESS);
    }
    for (unsigned link = 0; link <= NVML_NVLINK_MAX_LINKS; link++) {
        nvmlEnableState_t state;
        nvmlIntNvLinkDeviceType_t type;
        nvmlDeviceGetNvLinkState(device, link, &state);
        nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, &pci);
        nvmlDeviceGetNvLinkRemoteDeviceType(device, link, &type);
    }
    nvmlEnableState_t retired;
    unsigned corrected, uncorrected, is_pending, failed;
    nvmlFieldValue_t fields[2] = {{.fieldId = NVML_FI_DEV_GET_GPU_RECOVERY_ACTION}, {.fieldId = 1}};
    CHECK(nvmlDeviceGetRetiredPagesPendingStatus(device, &retired) == NVML_SUCCESS);
    nvmlReturn_t rows = nvmlDeviceGetRemappedRows(device, &corrected, &uncorrected, &is_pending, &failed);
    CHECK(rows == NVML_SUCCESS || rows == NVML_ERROR_NOT_SUPPORTED); /* a node file's notSupported */
    CHECK(nvmlDeviceGetFieldValues(device, 2, fields) == NVML_SUCCESS && fields[1].nvmlReturn == NVML_ERROR_NOT_SUPPORTED);
    unsigned long long types;
    CHECK(nvmlDeviceGetSupportedEventTypes(device, &types) == NVML_SUCCESS);

    if (nvmlDeviceGetMigMode(device, &current, &pending) != NVML_SUCCESS) return;
    CHECK(nvmlDeviceGetMaxMigDeviceCount(device, &max) == NVML_SUCCESS);
    for (unsigned e = 0; e <= NVML_GPU_INSTANCE_PROFILE_COUNT; e++) {
        nvmlGpuInstanceProfileInfo_t v1;
        nvmlGpuInstanceProfileInfo_v2_t v2 = {.version = nvmlGpuInstanceProfileInfo_v2};
        nvmlGpuInstanceProfileInfo_v3_t v3 = {.version = nvmlGpuInstanceProfileInfo_v3};
        if (nvmlDeviceGetGpuInstanceProfileInfo(device, e, &v1) != NVML_SUCCESS) continue;
        CHECK(nvmlDeviceGetGpuInstanceProfileInfoV(device, e, &v2) == NVML_SUCCESS && v2.id == v1.id);
        CHECK(nvmlDeviceGetGpuInstanceProfileInfoV(device, e, (nvmlGpuInstanceProfileInfo_v2_t *)&v3) == NVML_SUCCESS);
        CHECK(v3.memorySizeMB == v1.memorySizeMB && v3.version == nvmlGpuInstanceProfileInfo_v3);
        CHECK(nvmlDeviceGetGpuInstanceProfileInfoByIdV(device, v1.id, &v2) == NVML_SUCCESS);
        unsigned places = 0, remaining;
        CHECK(nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, v1.id, NULL, &places) == NVML_SUCCESS);
        nvmlGpuInstancePlacement_t *placements = calloc(places + 1, sizeof *placements);
        unsigned short_count = 0;
        if (places) CHECK(nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, v1.id, placements, &short_count) == NVML_ERROR_INSUFFICIENT_SIZE);
        CHECK(nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, v1.id, placements, &places) == NVML_SUCCESS);
        free(placements);
        if (current == NVML_DEVICE_MIG_ENABLE) {
            nvmlGpuInstance_t instances[16];
            unsigned found = 16;
            CHECK(nvmlDeviceGetGpuInstanceRemainingCapacity(device, v1.id, &remaining) == NVML_SUCCESS);
            CHECK(nvmlDeviceGetGpuInstances(device, v1.id, instances, &found) == NVML_SUCCESS);
        }
    }
    for (unsigned i = 0; current == NVML_DEVICE_MIG_ENABLE && i <= max; i++) {
        nvmlDevice_t mig, parent;
        nvmlDeviceAttributes_t attributes;
        unsigned gi_id, ci_id, is_mig;
        nvmlReturn_t got = nvmlDeviceGetMigDeviceHandleByIndex(device, i, &mig);
        CHECK(got == NVML_SUCCESS || got == NVML_ERROR_NOT_FOUND || (i == max && got == NVML_ERROR_INVALID_ARGUMENT));
        if (got != NVML_SUCCESS) continue;
        CHECK(nvmlDeviceGetUUID(mig, text, sizeof text) == NVML_SUCCESS && strncmp(text, "MIG-", 4) == 0);
        CHECK(nvmlDeviceIsMigDeviceHandle(mig, &is_mig) == NVML_SUCCESS && is_mig == 1);
        CHECK(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, &parent) == NVML_SUCCESS && parent == device);
        CHECK(nvmlDeviceGetAttributes_v2(mig, &attributes) == NVML_SUCCESS);
        CHECK(nvmlDeviceGetMemoryInfo(mig, &memory) == NVML_SUCCESS && memory.total == attributes.memorySizeMB << 20);
        CHECK(nvmlDeviceGetMinorNumber(mig, &value) == NVML_ERROR_INVALID_ARGUMENT);
        CHECK(nvmlDeviceGetGpuInstanceId(mig, &gi_id) == NVML_SUCCESS);
        CHECK(nvmlDeviceGetComputeInstanceId(mig, &ci_id) == NVML_SUCCESS);
        nvmlGpuInstance_t gi;
        nvmlGpuInstanceInfo_t gi_info;
        nvmlComputeInstance_t ci;
        nvmlComputeInstanceInfo_t ci_info;
        CHECK(nvmlDeviceGetGpuInstanceById(device, gi_id, &gi) == NVML_SUCCESS);
        CHECK(nvmlGpuInstanceGetInfo(gi, &gi_info) == NVML_SUCCESS && gi_info.id == gi_id && gi_info.device == device);
        for (unsigned p = 0; p <= NVML_COMPUTE_INSTANCE_PROFILE_COUNT; p++) {
            nvmlComputeInstanceProfileInfo_t c1;
            nvmlComputeInstanceProfileInfo_v2_t c2 = {.version = nvmlComputeInstanceProfileInfo_v2};
            nvmlComputeInstanceProfileInfo_v3_t c3 = {.version = nvmlComputeInstanceProfileInfo_v3};
            nvmlComputeInstance_t computes[8];
            unsigned found = 8;
            if (nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, p, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &c1) != NVML_SUCCESS) continue;
            CHECK(nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi, p, 0, &c2) == NVML_SUCCESS && c2.sliceCount == c1.sliceCount);
            CHECK(nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi, p, 0, (nvmlComputeInstanceProfileInfo_v2_t *)&c3) == NVML_SUCCESS);
            CHECK(nvmlGpuInstanceGetComputeInstances(gi, p, computes, &found) == NVML_SUCCESS);
        }
        CHECK(nvmlGpuInstanceGetComputeInstanceById(gi, ci_id, &ci) == NVML_SUCCESS);
        CHECK(nvmlComputeInstanceGetInfo_v2(ci, &ci_info) == NVML_SUCCESS && ci_info.id == ci_id && ci_info.gpuInstance == gi);
        CHECK(nvmlGpuInstanceGetComputeInstanceById(gi, 99, &ci) == NVML_ERROR_NOT_FOUND);
    }
}

static void *reader(void *arg) {
    unsigned count = *(unsigned *)arg, seen;
    for (int round = 0; round < 3; round++)
        for (unsigned i = 0; i < count; i++) {
            CHECK(nvmlDeviceGetCount_v2(&seen) == NVML_SUCCESS && seen == count);
            nvmlDevice_t device;
            if (nvmlDeviceGetHandleByIndex_v2(i, &device) == NVML_SUCCESS) every_query(device, count);
        }
    return NULL;
}

static void *appender(void *arg) {
    const char *uuid = arg;
    char line[256];
    for (int xid = 40; xid < 48; xid++) {
        snprintf(line, sizeof line, "{\"uuid\": \"%s\", \"xid\": %d}", uuid, xid);
        append(line);
        usleep(20000);
    }
    return NULL;
}

/* Every prefix of the node file, and a few broken documents, through the JSON reader. */
static void parse_prefixes(const char *node_path) {
    FILE *f = fopen(node_path, "rb");
    if (!f) { perror(node_path); exit(2); }
    static char text[1 << 20];
    size_t length = fread(text, 1, sizeof text, f);
    fclose(f);
    char error[128];
    for (size_t n = 0; n < length && n < 4096; n++) {
        json *v = json_parse(text, n, error, sizeof error);
        json_free(v);
    }
    json *whole = json_parse(text, length, error, sizeof error);
    CHECK(whole != NULL);
    json_free(whole);
    const char *broken[] = {"", "{", "[1,", "\"\\u12", "{\"a\":}", "1e999", "-", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", "{\"x\":\"\\q\"}", "nul", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof broken / sizeof *broken; i++) json_free(json_parse(broken[i], strlen(broken[i]), error, sizeof error));
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s NODE_JSON EVENTS_FILE\n", argv[0]); return 2; }
    setenv("DEVICEPLUGIN_SIM_NODE", argv[1], 1);
    setenv("DEVICEPLUGIN_SIM_EVENTS", argv[2], 1);
    events_path = argv[2];
    parse_prefixes(argv[1]);

    unsigned count = 0;
    nvmlDevice_t device, gpu0;
    char text[96], uuid[96];
    int cuda;
    CHECK(nvmlDeviceGetCount_v2(&count) == NVML_ERROR_UNINITIALIZED);
    CHECK(nvmlShutdown() == NVML_ERROR_UNINITIALIZED);
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    CHECK(nvmlInitWithFlags(0) == NVML_SUCCESS);
    CHECK(nvmlSystemGetDriverVersion(text, sizeof text) == NVML_SUCCESS);
    CHECK(nvmlSystemGetNVMLVersion(text, sizeof text) == NVML_SUCCESS);
    CHECK(nvmlSystemGetDriverVersion(text, 2) == NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(nvmlSystemGetCudaDriverVersion(&cuda) == NVML_SUCCESS && cuda > 0);
    CHECK(nvmlDeviceGetCount_v2(&count) == NVML_SUCCESS && count > 0);
    CHECK(nvmlDeviceGetHandleByIndex_v2(count, &device) == NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &gpu0) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetUUID(gpu0, uuid, sizeof uuid) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetHandleByUUID(uuid, &device) == NVML_SUCCESS && device == gpu0);
    CHECK(nvmlDeviceGetHandleByUUID("GPU-nope", &device) == NVML_ERROR_NOT_FOUND);
    CHECK(nvmlDeviceGetName((nvmlDevice_t)&count, text, sizeof text) == NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetName(NULL, text, sizeof text) == NVML_ERROR_INVALID_ARGUMENT);
    unsigned speed;
    CHECK(nvmlDeviceGetFanSpeed(gpu0, &speed) == NVML_ERROR_NOT_SUPPORTED);
    CHECK(strcmp(nvmlErrorString(NVML_ERROR_GPU_IS_LOST), "GPU is lost") == 0);

    nvmlEventSet_t sets[2];
    nvmlEventData_t data;
    for (int s = 0; s < 2; s++) {
        CHECK(nvmlEventSetCreate(&sets[s]) == NVML_SUCCESS);
        CHECK(nvmlDeviceRegisterEvents(gpu0, nvmlEventTypeXidCriticalError, sets[s]) == NVML_SUCCESS);
    }
    CHECK(nvmlEventSetWait_v2(sets[0], &data, 10) == NVML_ERROR_TIMEOUT);
    append("not json");
    append("{\"uuid\": \"GPU-nope\", \"xid\": 1}");
    append("{\"waitError\": \"unknown\"}");
    for (int s = 0; s < 2; s++) CHECK(nvmlEventSetWait_v2(sets[s], &data, 100) == NVML_ERROR_UNKNOWN);

    pthread_t threads[9];
    for (int t = 0; t < 8; t++) pthread_create(&threads[t], NULL, reader, &count);
    pthread_create(&threads[8], NULL, appender, uuid);
    int received[2] = {0, 0};
    for (int s = 0; s < 2; s++)
        while (received[s] < 8 && nvmlEventSetWait_v2(sets[s], &data, 5000) == NVML_SUCCESS) {
            CHECK(data.device == gpu0 && data.eventData == (unsigned long long)(40 + received[s]));
            CHECK(data.gpuInstanceId == 0xFFFFFFFFu);
            received[s]++;
        }
    CHECK(received[0] == 8 && received[1] == 8);
    for (int t = 0; t < 9; t++) pthread_join(threads[t], NULL);

    char line[256];
    snprintf(line, sizeof line, "{\"uuid\": \"%s\", \"lost\": true}", uuid);
    append(line);
    CHECK(nvmlEventSetWait_v2(sets[1], &data, 1000) == NVML_SUCCESS && data.eventData == 79);
    CHECK(nvmlDeviceGetName(gpu0, text, sizeof text) == NVML_ERROR_GPU_IS_LOST);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &device) == NVML_ERROR_GPU_IS_LOST);
    for (int s = 0; s < 2; s++) CHECK(nvmlEventSetFree(sets[s]) == NVML_SUCCESS);
    CHECK(nvmlEventSetFree(sets[0]) == NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
    CHECK(nvmlSystemGetDriverVersion(text, sizeof text) == NVML_ERROR_UNINITIALIZED);
    if (failures) fprintf(stderr, "%d checks failed\n", failures);
    else printf("all checks passed\n");
    return failures ? 1 : 0;
}
