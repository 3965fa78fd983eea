/* What the parts of a node rendering (or a MIG state laid over it) must agree on before any handle reaches them: UUIDs,
 * minors and PCI addresses unique; and MIG devices laid out as a GPU can hold them, since the
 * listing calls write one handle per instance into buffers their callers size from the
 * profiles (go-nvml allocates instanceCount handles). A GPU instance has one profile and one
 * placement, among its profile's; no two GPU instances overlap; the compute instances of one
 * fit its slices; (GPU instance, compute instance) ids are unique. */
#include "sim.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* NVML_COMPUTE_INSTANCE_PROFILE_* slice counts. */
static int compute_slices_known(unsigned slices) {
    return slices == 1 || slices == 2 || slices == 3 || slices == 4 || slices == 6 || slices == 7 || slices == 8;
}

static int fail(char *error, size_t size, const char *format, unsigned a, unsigned b) {
    snprintf(error, size, format, a, b);
    return 0;
}

static int is_placement_of(const sim_gi_profile *gi, nvmlGpuInstancePlacement_t place) {
    for (unsigned p = 0; p < gi->placement_count && p < SIM_MAX_PLACEMENTS; p++)
        if (gi->placements[p].start == place.start && gi->placements[p].size == place.size) return 1;
    return 0;
}

static int check_migs(const sim_gpu *gpu, unsigned g, char *error, size_t size) {
    unsigned per_profile[SIM_GI_PROFILES] = {0};
    unsigned slices_used[SIM_MAX_GPU_INSTANCE_ID + 1] = {0};
    if (gpu->mig_count && !gpu->mig_enabled) return fail(error, size, "gpus[%u].migDevices: MIG is not enabled%.0u", g, 0);
    for (unsigned i = 0; i < gpu->mig_count; i++) {
        const sim_mig *m = &gpu->migs[i];
        if (m->gi_enum >= SIM_GI_PROFILES || !gpu->gi_profiles[m->gi_enum].present)
            return fail(error, size, "gpus[%u].migDevices[%u].giEnum: no such GPU-instance profile", g, i);
        const sim_gi_profile *gi = &gpu->gi_profiles[m->gi_enum];
        if (gi->id != m->gi_profile_id || gi->slices != m->gi_slices || !is_placement_of(gi, m->placement))
            return fail(error, size, "gpus[%u].migDevices[%u]: does not match its GPU-instance profile", g, i);
        if (sim_is_device(m) && !compute_slices_known(m->ci_slices))
            return fail(error, size, "gpus[%u].migDevices[%u].ciSlices: no compute-instance profile has it", g, i);
        const sim_mig *first = NULL;
        for (unsigned j = 0; j < i; j++) {
            const sim_mig *o = &gpu->migs[j];
            if (o->gi_id == m->gi_id && o->ci_id == m->ci_id)
                return fail(error, size, "gpus[%u].migDevices[%u]: GPU/compute instance ids repeat", g, i);
            if (o->gi_id == m->gi_id && !first) first = o;
            if (o->gi_id == m->gi_id && !(sim_is_device(o) && sim_is_device(m)))
                return fail(error, size, "gpus[%u].migDevices[%u]: a GPU instance without compute instances has more", g, i);
            if (o->gi_id != m->gi_id && m->placement.start < o->placement.start + o->placement.size &&
                o->placement.start < m->placement.start + m->placement.size)
                return fail(error, size, "gpus[%u].migDevices[%u].placement: overlaps another GPU instance", g, i);
        }
        if (first && (first->gi_enum != m->gi_enum || first->placement.start != m->placement.start))
            return fail(error, size, "gpus[%u].migDevices[%u]: differs from its GPU instance's other devices", g, i);
        if (!first && ++per_profile[m->gi_enum] > gi->instances)
            return fail(error, size, "gpus[%u].migDevices[%u]: more GPU instances than the profile allows", g, i);
        slices_used[m->gi_id] += m->ci_slices;
        if (slices_used[m->gi_id] > m->gi_slices)
            return fail(error, size, "gpus[%u].migDevices[%u]: compute instances overfill their GPU instance", g, i);
    }
    return 1;
}

int sim_node_check(const sim_node *node, char *error, size_t size) {
    for (unsigned g = 0; g < node->gpu_count; g++) {
        const sim_gpu *gpu = &node->gpus[g];
        if (strncmp(gpu->uuid, "GPU-", 4) != 0 || !gpu->uuid[4])
            return fail(error, size, "gpus[%u].uuid: must start with GPU- and go on%.0u", g, 0);
        for (unsigned i = 0; i < gpu->mig_count; i++)
            if (sim_is_device(&gpu->migs[i]) && (strncmp(gpu->migs[i].uuid, "MIG-", 4) != 0 || !gpu->migs[i].uuid[4]))
                return fail(error, size, "gpus[%u].migDevices[%u].uuid: must start with MIG- and go on", g, i);
        for (unsigned o = 0; o < g; o++) {
            const sim_gpu *other = &node->gpus[o];
            if (other->minor == gpu->minor) return fail(error, size, "gpus[%u].minor: repeats gpus[%u]'s", g, o);
            if (strcasecmp(other->bus_id, gpu->bus_id) == 0)
                return fail(error, size, "gpus[%u].pciBusId: repeats gpus[%u]'s", g, o);
        }
        /* Every UUID against every one before it (at most 64 x 65 of them). */
        for (unsigned i = 0; i <= gpu->mig_count; i++) {
            const char *uuid = i ? gpu->migs[i - 1].uuid : gpu->uuid;
            if (!*uuid) continue; /* a GPU instance without compute instances */
            for (unsigned o = 0; o <= g; o++) {
                const sim_gpu *other = &node->gpus[o];
                unsigned last = o == g ? i : other->mig_count + 1;
                for (unsigned k = 0; k < last; k++)
                    if (strcmp(uuid, k ? other->migs[k - 1].uuid : other->uuid) == 0)
                        return fail(error, size, "gpus[%u]: UUID number %u repeats another", g, i);
            }
        }
        if (!check_migs(gpu, g, error, size)) return 0;
    }
    return 1;
}
