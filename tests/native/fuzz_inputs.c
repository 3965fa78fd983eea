/* libFuzzer targets over the simulated library's parsers (tests/test_sim_fuzz.py builds them
 * with clang, -fsanitize=fuzzer,address,undefined):
 *
 *   -DFUZZ_NODE    a node rendering through sim_node_parse; a node it accepts is then served:
 *                  every GPU- and compute-instance listing is called with a buffer of exactly
 *                  the profile's instanceCount, as go-nvml sizes it, so a write past it fails
 *   -DFUZZ_EVENTS  one event line through sim_event_parse
 *   -DFUZZ_MIG_STATE  a MIG state document (etc/deviceplugin-sim/mig-state.json, state.c writes
 *                  it) through sim_state_parse, laid over the node fuzz_mig_state_node.json beside
 *                  this file; a state it accepts is then served as an accepted node is, and its
 *                  MIG devices looked up by index and UUID
 *
 * fuzz_mig_state_node.json is `deviceplugin sim-root` rendering of a two-GPU node (an A100 in
 * MIG mode holding three MIG devices, an H100 with MIG off); tests/test_sim_fuzz.py checks it is
 * the current rendering of MIG_STATE_NODE there.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#if defined(FUZZ_NODE) || defined(FUZZ_MIG_STATE)
static void serve(sim_node *node) {
    sim_current = node;
    sim_init_count = 1;
    for (unsigned g = 0; g < node->gpu_count; g++) {
        nvmlDevice_t device = (nvmlDevice_t)&node->gpus[g];
        for (unsigned e = 0; e < SIM_GI_PROFILES; e++) {
            nvmlGpuInstanceProfileInfo_t info;
            unsigned count = 0;
            if (nvmlDeviceGetGpuInstanceProfileInfo(device, e, &info) != NVML_SUCCESS || !info.instanceCount) continue;
            nvmlGpuInstance_t *instances = malloc(info.instanceCount * sizeof *instances);
            if (!instances) continue;
            if (nvmlDeviceGetGpuInstances(device, info.id, instances, &count) != NVML_SUCCESS) count = 0;
            for (unsigned i = 0; i < count; i++) {
                for (unsigned c = 0; c < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; c++) {
                    nvmlComputeInstanceProfileInfo_t ci;
                    unsigned found = 0;
                    if (nvmlGpuInstanceGetComputeInstanceProfileInfo(instances[i], c, 0, &ci) != NVML_SUCCESS ||
                        !ci.instanceCount)
                        continue;
                    nvmlComputeInstance_t *computes = malloc(ci.instanceCount * sizeof *computes);
                    if (computes) nvmlGpuInstanceGetComputeInstances(instances[i], c, computes, &found);
                    free(computes);
                }
            }
            free(instances);
        }
        for (unsigned i = 0; i < node->gpus[g].mig_count; i++) {
            nvmlDevice_t mig = NULL;
            char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
            if (nvmlDeviceGetMigDeviceHandleByIndex(device, i, &mig) == NVML_SUCCESS &&
                nvmlDeviceGetUUID(mig, uuid, sizeof uuid) == NVML_SUCCESS)
                nvmlDeviceGetHandleByUUID(uuid, &mig);
        }
    }
    sim_init_count = 0;
    sim_current = NULL;
}
#endif

#ifdef FUZZ_MIG_STATE
static sim_node *state_node, *scratch;

/* The node beside this source file, parsed once; every input is laid over a fresh copy of it. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char path[4096], error[256];
    const char *slash = strrchr(__FILE__, '/');
    snprintf(path, sizeof path, "%.*sfuzz_mig_state_node.json", slash ? (int)(slash - __FILE__ + 1) : 0, __FILE__);
    FILE *file = fopen(path, "rb");
    char *text = malloc(1 << 20);
    size_t length = file && text ? fread(text, 1, 1 << 20, file) : 0;
    if (file) fclose(file);
    state_node = length ? sim_node_parse(text, length, error, sizeof error) : NULL;
    free(text);
    scratch = malloc(sizeof *scratch);
    if (!state_node || !scratch) {
        fprintf(stderr, "fuzz_inputs: cannot read the node %s: %s\n", path, length ? error : "unreadable");
        exit(2);
    }
    return 0;
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
#ifdef FUZZ_MIG_STATE
    char error[256];
    memcpy(scratch, state_node, sizeof *scratch); /* an accepted state points every entry at scratch */
    if (sim_state_parse(scratch, (const char *)data, size, error, sizeof error)) serve(scratch);
#elif defined(FUZZ_NODE)
    char error[256];
    sim_node *node = sim_node_parse((const char *)data, size, error, sizeof error);
    if (node) serve(node);
    sim_node_free(node);
#else
    sim_event_line line;
    if (!sim_event_blank((const char *)data, size)) sim_event_parse((const char *)data, size, &line);
#endif
    return 0;
}
