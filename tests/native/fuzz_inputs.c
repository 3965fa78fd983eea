/* libFuzzer targets over the simulated library's parsers (tests/test_sim_fuzz.py builds them
 * with clang, -fsanitize=fuzzer,address,undefined):
 *
 *   -DFUZZ_NODE    a node rendering through sim_node_parse; a node it accepts is then served:
 *                  every GPU- and compute-instance listing is called with a buffer of exactly
 *                  the profile's instanceCount, as go-nvml sizes it, so a write past it fails
 *   -DFUZZ_EVENTS  one event line through sim_event_parse
 */
#include <stdint.h>
#include <stdlib.h>

#include "sim.h"

#ifdef FUZZ_NODE
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
    }
    sim_init_count = 0;
    sim_current = NULL;
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
#ifdef FUZZ_NODE
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
