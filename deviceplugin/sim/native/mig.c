/* MIG: mode, MIG device handles, GPU and compute instances and their profiles, as NVML reports
 * them. GPU-instance profile ids are the driver's (per model, from the rendering); compute-
 * instance profile ids equal their NVML enum. */
#include "sim.h"

#include <stdio.h>
#include <string.h>

#define MAX_MIG_DEVICES 7

/* NVML_COMPUTE_INSTANCE_PROFILE_* enum -> compute slices (0: none). */
static const unsigned ci_slices_by_enum[NVML_COMPUTE_INSTANCE_PROFILE_COUNT] = {1, 2, 3, 4, 7, 8, 6, 0, 0};

static unsigned ci_enum(unsigned slices) {
    for (unsigned e = 0; e < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; e++)
        if (ci_slices_by_enum[e] == slices) return e;
    return 0;
}

#define LOCKED(...)                                  \
    do {                                             \
        pthread_mutex_lock(&sim_lock);               \
        nvmlReturn_t result;                         \
        __VA_ARGS__;                                 \
        pthread_mutex_unlock(&sim_lock);             \
        return result;                               \
    } while (0)

/* A whole, MIG-capable GPU (MIG-enabled when `enabled`). */
static nvmlReturn_t mig_gpu(nvmlDevice_t device, const char *call, int enabled, sim_gpu **gpu) {
    nvmlReturn_t result = sim_whole_gpu(device, call, gpu);
    if (result != NVML_SUCCESS) return result;
    if (!(*gpu)->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (enabled && !(*gpu)->mig_enabled) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

/* MIG devices, GPU instances and compute instances are those this process sees (view.c). */
static int seen_device(const sim_mig *mig) { return sim_is_device(mig) && sim_mig_seen(mig); }

static unsigned mig_devices(const sim_gpu *gpu) {
    unsigned count = 0;
    for (unsigned i = 0; i < gpu->mig_count; i++) count += seen_device(&gpu->migs[i]);
    return count;
}

static unsigned max_mig_devices(const sim_gpu *gpu) {
    unsigned count = mig_devices(gpu);
    return count > MAX_MIG_DEVICES ? count : MAX_MIG_DEVICES;
}

/* The `index`th MIG device (GPU instances without compute instances are none). */
static sim_mig *mig_by_index(sim_gpu *gpu, unsigned index) {
    for (unsigned i = 0; i < gpu->mig_count; i++)
        if (seen_device(&gpu->migs[i]) && index-- == 0) return &gpu->migs[i];
    return NULL;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    sim_gpu *gpu;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = mig_gpu(device, "nvmlDeviceGetMigMode", 0, &gpu)) == NVML_SUCCESS)
               { *current = gpu->mig_enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
                 *pending = gpu->mig_pending ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE; });
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    sim_gpu *gpu;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = mig_gpu(device, "nvmlDeviceGetMaxMigDeviceCount", 0, &gpu)) == NVML_SUCCESS)
               *count = max_mig_devices(gpu));
}

nvmlReturn_t DECLDIR nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    sim_gpu *gpu;
    if (!mig) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = mig_gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex", 1, &gpu)) == NVML_SUCCESS) {
        sim_mig *found = mig_by_index(gpu, index);
        if (found) *mig = (nvmlDevice_t)found;
        else result = index < max_mig_devices(gpu) ? NVML_ERROR_NOT_FOUND : NVML_ERROR_INVALID_ARGUMENT;
    });
}

/* A MIG device handle; a whole GPU's is an INVALID_ARGUMENT. */
static nvmlReturn_t mig_device(nvmlDevice_t device, const char *call, sim_mig **mig) {
    sim_gpu *gpu;
    nvmlReturn_t result = sim_device(device, call, &gpu, mig);
    if (result == NVML_SUCCESS && !*mig) return NVML_ERROR_INVALID_ARGUMENT;
    return result;
}

nvmlReturn_t DECLDIR nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t device, nvmlDevice_t *parent) {
    sim_mig *mig;
    if (!parent) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = mig_device(device, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", &mig)) == NVML_SUCCESS)
               *parent = (nvmlDevice_t)mig->gpu);
}

nvmlReturn_t DECLDIR nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    sim_gpu *gpu;
    sim_mig *mig;
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = sim_device(device, "nvmlDeviceIsMigDeviceHandle", &gpu, &mig)) == NVML_SUCCESS)
               *is_mig = mig != NULL);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    sim_mig *mig;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = mig_device(device, "nvmlDeviceGetGpuInstanceId", &mig)) == NVML_SUCCESS) *id = mig->gi_id);
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    sim_mig *mig;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = mig_device(device, "nvmlDeviceGetComputeInstanceId", &mig)) == NVML_SUCCESS) *id = mig->ci_id);
}

nvmlReturn_t DECLDIR nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    sim_gpu *gpu;
    sim_mig *mig;
    if (!attributes) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = sim_device(device, "nvmlDeviceGetAttributes", &gpu, &mig)) == NVML_SUCCESS) {
        if (!mig) {
            result = NVML_ERROR_NOT_SUPPORTED; /* NVML answers this for MIG devices only */
        } else {
            attributes->multiprocessorCount = mig->sms;
            attributes->sharedCopyEngineCount = mig->copy_engines;
            attributes->sharedDecoderCount = mig->decoders;
            attributes->sharedEncoderCount = 0;
            attributes->sharedJpegCount = mig->jpegs;
            attributes->sharedOfaCount = mig->ofas;
            attributes->gpuInstanceSliceCount = mig->gi_slices;
            attributes->computeInstanceSliceCount = mig->ci_slices;
            attributes->memorySizeMB = mig->memory_mib;
        }
    });
}

nvmlReturn_t DECLDIR nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* --- GPU-instance profiles ------------------------------------------------------------------ */

/* The profile for enum `profile` (or, with `by_id`, for driver id `profile`). */
static nvmlReturn_t gi_profile(nvmlDevice_t device, const char *call, unsigned profile, int by_id,
                               const sim_gi_profile **out) {
    sim_gpu *gpu;
    nvmlReturn_t result = mig_gpu(device, call, 0, &gpu);
    if (result != NVML_SUCCESS) return result;
    if (!by_id) {
        if (profile >= SIM_GI_PROFILES) return NVML_ERROR_INVALID_ARGUMENT;
        *out = &gpu->gi_profiles[profile];
        return (*out)->present ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    }
    for (unsigned e = 0; e < SIM_GI_PROFILES; e++)
        if (gpu->gi_profiles[e].present && gpu->gi_profiles[e].id == profile) {
            *out = &gpu->gi_profiles[e];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

#define FILL_GI(info, gi)                                \
    do {                                                 \
        (info)->id = (gi)->id;                           \
        (info)->sliceCount = (gi)->slices;               \
        (info)->instanceCount = (gi)->instances;         \
        (info)->multiprocessorCount = (gi)->sms;         \
        (info)->copyEngineCount = (gi)->copy_engines;    \
        (info)->decoderCount = (gi)->decoders;           \
        (info)->encoderCount = 0;                        \
        (info)->jpegCount = (gi)->jpegs;                 \
        (info)->ofaCount = (gi)->ofas;                   \
        (info)->memorySizeMB = (gi)->memory_mib;         \
    } while (0)

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_t *info) {
    const sim_gi_profile *gi;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = gi_profile(device, "nvmlDeviceGetGpuInstanceProfileInfo", profile, 0, &gi)) == NVML_SUCCESS) {
        memset(info, 0, sizeof *info);
        FILL_GI(info, gi);
        info->isP2pSupported = 0;
    });
}

/* The v2 or v3 struct, told apart by its version word. */
static nvmlReturn_t gi_profile_v(nvmlDevice_t device, unsigned profile, int by_id, nvmlGpuInstanceProfileInfo_v2_t *info) {
    const sim_gi_profile *gi;
    unsigned version = info->version;
    if (version != nvmlGpuInstanceProfileInfo_v2 && version != nvmlGpuInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t result = gi_profile(device, "nvmlDeviceGetGpuInstanceProfileInfo", profile, by_id, &gi);
    if (result != NVML_SUCCESS) return result;
    if (version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        memset(v3, 0, sizeof *v3);
        v3->version = version;
        FILL_GI(v3, gi);
    } else {
        memset(info, 0, sizeof *info);
        info->version = version;
        FILL_GI(info, gi);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                          nvmlGpuInstanceProfileInfo_v2_t *info) {
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(result = gi_profile_v(device, profile, 0, info));
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profile_id,
                                                              nvmlGpuInstanceProfileInfo_v2_t *info) {
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(result = gi_profile_v(device, profile_id, 1, info));
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profile_id,
                                                                   nvmlGpuInstancePlacement_t *placements,
                                                                   unsigned int *count) {
    const sim_gi_profile *gi;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = gi_profile(device, "nvmlDeviceGetGpuInstancePossiblePlacements", profile_id, 1, &gi)) ==
               NVML_SUCCESS) {
        if (placements && *count < gi->placement_count) result = NVML_ERROR_INSUFFICIENT_SIZE;
        else if (placements) memcpy(placements, gi->placements, gi->placement_count * sizeof *placements);
        *count = gi->placement_count;
    });
}

static int overlaps(const nvmlGpuInstancePlacement_t *a, const nvmlGpuInstancePlacement_t *b) {
    return a->start < b->start + b->size && b->start < a->start + a->size;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profile_id,
                                                               unsigned int *count) {
    const sim_gi_profile *gi;
    sim_gpu *gpu;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = gi_profile(device, "nvmlDeviceGetGpuInstanceRemainingCapacity", profile_id, 1, &gi)) ==
                   NVML_SUCCESS &&
               (result = mig_gpu(device, "nvmlDeviceGetGpuInstanceRemainingCapacity", 1, &gpu)) == NVML_SUCCESS) {
        /* Free placements, taken greedily in order. */
        nvmlGpuInstancePlacement_t taken[SIM_MAX_MIGS + SIM_MAX_PLACEMENTS];
        unsigned used = 0, free_count = 0;
        for (unsigned i = 0; i < gpu->mig_count; i++) taken[used++] = gpu->migs[i].placement;
        for (unsigned p = 0; p < gi->placement_count; p++) {
            int clash = 0;
            for (unsigned t = 0; t < used; t++) clash |= overlaps(&gi->placements[p], &taken[t]);
            if (!clash) { taken[used++] = gi->placements[p]; free_count++; }
        }
        *count = free_count;
    });
}

/* --- GPU instances -------------------------------------------------------------------------- */

/* Callers size `instances` from the profile's instanceCount (go-nvml does), so no more are
 * written, whatever the node holds. */
nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profile_id,
                                               nvmlGpuInstance_t *instances, unsigned int *count) {
    sim_gpu *gpu;
    const sim_gi_profile *gi;
    if (!count || !instances) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = gi_profile(device, "nvmlDeviceGetGpuInstances", profile_id, 1, &gi)) == NVML_SUCCESS &&
               (result = mig_gpu(device, "nvmlDeviceGetGpuInstances", 1, &gpu)) == NVML_SUCCESS) {
        unsigned found = 0;
        for (unsigned i = 0; i < gpu->mig_count && result == NVML_SUCCESS; i++) {
            sim_mig *m = &gpu->migs[i];
            if (m->gi_profile_id != profile_id || sim_find_gi(gpu, m->gi_id) != m || !sim_gi_seen(gpu, m->gi_id))
                continue;
            if (found < gi->instances) instances[found++] = (nvmlGpuInstance_t)&m->gpu_instance;
            else result = NVML_ERROR_INSUFFICIENT_SIZE;
        }
        *count = found;
    });
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *instance) {
    sim_gpu *gpu;
    if (!instance) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = mig_gpu(device, "nvmlDeviceGetGpuInstanceById", 1, &gpu)) == NVML_SUCCESS) {
        sim_mig *m = sim_find_gi(gpu, id);
        if (m && sim_gi_seen(gpu, id)) *instance = (nvmlGpuInstance_t)&m->gpu_instance;
        else result = NVML_ERROR_NOT_FOUND;
    });
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetInfo(nvmlGpuInstance_t instance, nvmlGpuInstanceInfo_t *info) {
    sim_mig *mig;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = sim_gpu_instance(instance, "nvmlGpuInstanceGetInfo", &mig)) == NVML_SUCCESS) {
        info->device = (nvmlDevice_t)mig->gpu;
        info->id = mig->gi_id;
        info->profileId = mig->gi_profile_id;
        info->placement = mig->placement;
    });
}

/* --- compute instances ---------------------------------------------------------------------- */

static nvmlReturn_t ci_profile(nvmlGpuInstance_t instance, unsigned profile, unsigned engines, sim_mig **mig) {
    nvmlReturn_t result = sim_gpu_instance(instance, "nvmlGpuInstanceGetComputeInstanceProfileInfo", mig);
    if (result != NVML_SUCCESS) return result;
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned slices = ci_slices_by_enum[profile];
    if (!slices || slices > (*mig)->gi_slices) return NVML_ERROR_NOT_SUPPORTED;
    if (engines != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

#define FILL_CI(info, mig, profile)                                                   \
    do {                                                                              \
        unsigned slices_ = ci_slices_by_enum[profile];                                \
        (info)->id = (profile);                                                       \
        (info)->sliceCount = slices_;                                                 \
        (info)->instanceCount = (mig)->gi_slices / slices_;                           \
        /* the GPU instance's SMs per slice: it may have no compute instance yet */  \
        (info)->multiprocessorCount =                                                 \
            (mig)->gpu->gi_profiles[(mig)->gi_enum].sms * slices_ / (mig)->gi_slices; \
        (info)->sharedCopyEngineCount = (mig)->copy_engines;                          \
        (info)->sharedDecoderCount = (mig)->decoders;                                 \
        (info)->sharedEncoderCount = 0;                                               \
        (info)->sharedJpegCount = (mig)->jpegs;                                       \
        (info)->sharedOfaCount = (mig)->ofas;                                         \
    } while (0)

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t instance, unsigned int profile,
                                                                  unsigned int engines,
                                                                  nvmlComputeInstanceProfileInfo_t *info) {
    sim_mig *mig;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = ci_profile(instance, profile, engines, &mig)) == NVML_SUCCESS) {
        memset(info, 0, sizeof *info);
        FILL_CI(info, mig, profile);
    });
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t instance, unsigned int profile,
                                                                   unsigned int engines,
                                                                   nvmlComputeInstanceProfileInfo_v2_t *info) {
    sim_mig *mig;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = info->version;
    if (version != nvmlComputeInstanceProfileInfo_v2 && version != nvmlComputeInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    LOCKED(if ((result = ci_profile(instance, profile, engines, &mig)) == NVML_SUCCESS) {
        if (version == nvmlComputeInstanceProfileInfo_v3) {
            nvmlComputeInstanceProfileInfo_v3_t *v3 = (nvmlComputeInstanceProfileInfo_v3_t *)info;
            memset(v3, 0, sizeof *v3);
            v3->version = version;
            FILL_CI(v3, mig, profile);
        } else {
            memset(info, 0, sizeof *info);
            info->version = version;
            FILL_CI(info, mig, profile);
        }
    });
}

/* The MIG device of compute instance `id` in the GPU instance `gi` belongs to. */
static sim_mig *find_ci(const sim_mig *gi, unsigned id) {
    for (unsigned i = 0; i < gi->gpu->mig_count; i++) {
        sim_mig *m = &gi->gpu->migs[i];
        if (m->gi_id == gi->gi_id && m->ci_id == id && sim_is_device(m)) return m;
    }
    return NULL;
}

/* As for GPU instances: at most the compute-instance profile's instanceCount handles. */
nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t instance, unsigned int profile_id,
                                                        nvmlComputeInstance_t *instances, unsigned int *count) {
    sim_mig *gi;
    if (!count || !instances) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = sim_gpu_instance(instance, "nvmlGpuInstanceGetComputeInstances", &gi)) == NVML_SUCCESS) {
        unsigned slices = profile_id < NVML_COMPUTE_INSTANCE_PROFILE_COUNT ? ci_slices_by_enum[profile_id] : 0;
        unsigned room = slices && slices <= gi->gi_slices ? gi->gi_slices / slices : 0, found = 0;
        for (unsigned i = 0; room && i < gi->gpu->mig_count && result == NVML_SUCCESS; i++) {
            sim_mig *m = &gi->gpu->migs[i];
            if (m->gi_id != gi->gi_id || m->ci_slices != slices || !seen_device(m)) continue;
            if (found < room) instances[found++] = (nvmlComputeInstance_t)&m->compute_instance;
            else result = NVML_ERROR_INSUFFICIENT_SIZE;
        }
        *count = found;
    });
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t instance, unsigned int id,
                                                           nvmlComputeInstance_t *compute) {
    sim_mig *gi;
    if (!compute) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = sim_gpu_instance(instance, "nvmlGpuInstanceGetComputeInstanceById", &gi)) == NVML_SUCCESS) {
        sim_mig *m = find_ci(gi, id);
        if (m && sim_mig_seen(m)) *compute = (nvmlComputeInstance_t)&m->compute_instance;
        else result = NVML_ERROR_NOT_FOUND;
    });
}

nvmlReturn_t DECLDIR nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t compute, nvmlComputeInstanceInfo_t *info) {
    sim_mig *mig;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    LOCKED(if ((result = sim_compute_instance(compute, "nvmlComputeInstanceGetInfo", &mig)) == NVML_SUCCESS) {
        info->device = (nvmlDevice_t)mig->gpu;
        info->gpuInstance = (nvmlGpuInstance_t)&sim_find_gi(mig->gpu, mig->gi_id)->gpu_instance;
        info->id = mig->ci_id;
        info->profileId = ci_enum(mig->ci_slices);
        info->placement.start = 0;
        info->placement.size = mig->ci_slices;
    });
}

nvmlReturn_t DECLDIR nvmlComputeInstanceGetInfo(nvmlComputeInstance_t compute, nvmlComputeInstanceInfo_t *info) {
    return nvmlComputeInstanceGetInfo_v2(compute, info);
}

/* --- changing the layout ---------------------------------------------------------------------
 * Each change holds sim_lock and the state's flock from before the handles are resolved (so
 * against the layout every process last wrote) until the new layout is written. Creating and
 * destroying instances needs the mig/config capability where the dev root is a container's
 * (view.c). */

/* Hopper and later switch MIG mode at once; Ampere only at the GPU's next reset. */
static int mig_mode_at_once(const sim_gpu *gpu) {
    return gpu->architecture >= NVML_DEVICE_ARCH_HOPPER && gpu->architecture != NVML_DEVICE_ARCH_UNKNOWN;
}

#define CHANGE(...)                                         \
    do {                                                    \
        pthread_mutex_lock(&sim_lock);                      \
        int lock_ = sim_current ? sim_state_lock() : -1;    \
        nvmlReturn_t result;                                \
        int changed = 0;                                    \
        __VA_ARGS__;                                        \
        if (result == NVML_SUCCESS && changed) result = sim_state_commit(lock_); \
        sim_state_unlock(lock_);                            \
        pthread_mutex_unlock(&sim_lock);                    \
        return result;                                      \
    } while (0)

nvmlReturn_t DECLDIR nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t *activation) {
    sim_gpu *gpu;
    if (!activation || (mode != NVML_DEVICE_MIG_ENABLE && mode != NVML_DEVICE_MIG_DISABLE))
        return NVML_ERROR_INVALID_ARGUMENT;
    CHANGE(if ((result = mig_gpu(device, "nvmlDeviceSetMigMode", 0, &gpu)) == NVML_SUCCESS) {
        int on = mode == NVML_DEVICE_MIG_ENABLE;
        if (!on && gpu->mig_count) {
            *activation = NVML_ERROR_IN_USE; /* GPU instances still exist: nothing changes */
        } else {
            changed = gpu->mig_pending != on || gpu->mig_enabled != on;
            gpu->mig_pending = on;
            if (mig_mode_at_once(gpu)) gpu->mig_enabled = on;
            *activation = gpu->mig_enabled == on ? NVML_SUCCESS : NVML_ERROR_RESET_REQUIRED;
        }
    });
}

static unsigned instances_of(const sim_gpu *gpu, unsigned profile_id) {
    unsigned count = 0;
    for (unsigned i = 0; i < gpu->mig_count; i++)
        count += gpu->migs[i].gi_profile_id == profile_id && sim_find_gi((sim_gpu *)gpu, gpu->migs[i].gi_id) == &gpu->migs[i];
    return count;
}

static int placement_free(const sim_gpu *gpu, const nvmlGpuInstancePlacement_t *place) {
    for (unsigned i = 0; i < gpu->mig_count; i++)
        if (overlaps(place, &gpu->migs[i].placement)) return 0;
    return 1;
}

/* A new GPU instance of the profile with driver id `profile_id`, at `place` or (NULL) at the
 * first free placement of the profile. */
static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned profile_id, const nvmlGpuInstancePlacement_t *place,
                              nvmlGpuInstance_t *out) {
    sim_gpu *gpu;
    const sim_gi_profile *gi;
    const char *call = "nvmlDeviceCreateGpuInstance";
    nvmlReturn_t result = mig_gpu(device, call, 0, &gpu);
    if (result != NVML_SUCCESS) return result;
    if (!sim_current->mig_config) return NVML_ERROR_NO_PERMISSION;
    if (!gpu->mig_enabled) return NVML_ERROR_NOT_SUPPORTED;
    if (gi_profile(device, call, profile_id, 1, &gi) != NVML_SUCCESS) return NVML_ERROR_INVALID_ARGUMENT;
    const nvmlGpuInstancePlacement_t *chosen = NULL;
    for (unsigned p = 0; p < gi->placement_count && p < SIM_MAX_PLACEMENTS; p++) {
        const nvmlGpuInstancePlacement_t *candidate = &gi->placements[p];
        if (place && (candidate->start != place->start || candidate->size != place->size)) continue;
        if (place || placement_free(gpu, candidate)) { chosen = candidate; break; }
    }
    if (!chosen) return place ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (!placement_free(gpu, chosen) || instances_of(gpu, gi->id) >= gi->instances || gpu->mig_count >= SIM_MAX_MIGS)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    unsigned id = 1;
    while (id <= SIM_MAX_GPU_INSTANCE_ID && sim_find_gi(gpu, id)) id++;
    if (id > SIM_MAX_GPU_INSTANCE_ID) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    sim_mig *m = &gpu->migs[gpu->mig_count];
    memset(m, 0, sizeof *m);
    m->gpu = gpu;
    m->index = gpu->mig_count++;
    m->gi_id = id;
    m->ci_id = SIM_NO_INSTANCE;
    m->gi_enum = (unsigned)(gi - gpu->gi_profiles);
    m->gi_profile_id = gi->id;
    m->gi_slices = gi->slices;
    m->sms = gi->sms;
    m->copy_engines = gi->copy_engines;
    m->decoders = gi->decoders;
    m->jpegs = gi->jpegs;
    m->ofas = gi->ofas;
    m->memory_mib = gi->memory_mib;
    m->placement = *chosen;
    *out = (nvmlGpuInstance_t)&m->gpu_instance;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profile_id,
                                                 nvmlGpuInstance_t *instance) {
    if (!instance) return NVML_ERROR_INVALID_ARGUMENT;
    CHANGE(changed = (result = create_gi(device, profile_id, NULL, instance)) == NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profile_id,
                                                              const nvmlGpuInstancePlacement_t *placement,
                                                              nvmlGpuInstance_t *instance) {
    if (!instance || !placement) return NVML_ERROR_INVALID_ARGUMENT;
    CHANGE(changed = (result = create_gi(device, profile_id, placement, instance)) == NVML_SUCCESS);
}

/* Drop entry `m` of its GPU; later entries move down one (their handles with them). */
static void remove_entry(sim_mig *m) {
    sim_gpu *gpu = m->gpu;
    unsigned at = (unsigned)(m - gpu->migs);
    memmove(m, m + 1, (gpu->mig_count - at - 1) * sizeof *m);
    gpu->mig_count--;
    for (unsigned i = at; i < gpu->mig_count; i++) gpu->migs[i].index = i;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceDestroy(nvmlGpuInstance_t instance) {
    sim_mig *gi;
    CHANGE(if ((result = sim_gpu_instance(instance, "nvmlGpuInstanceDestroy", &gi)) == NVML_SUCCESS) {
        if (!sim_current->mig_config) result = NVML_ERROR_NO_PERMISSION;
        else if (sim_is_device(gi)) result = NVML_ERROR_IN_USE; /* compute instances remain */
        else { remove_entry(gi); changed = 1; }
    });
}

/* A compute instance of CI profile `profile` in `instance`; with `place`, only there. */
static nvmlReturn_t create_ci(nvmlGpuInstance_t instance, unsigned profile,
                              const nvmlComputeInstancePlacement_t *place, nvmlComputeInstance_t *out) {
    sim_mig *gi;
    nvmlReturn_t result = sim_gpu_instance(instance, "nvmlGpuInstanceCreateComputeInstance", &gi);
    if (result != NVML_SUCCESS) return result;
    if (!sim_current->mig_config) return NVML_ERROR_NO_PERMISSION;
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned slices = ci_slices_by_enum[profile], used = 0, id = 0;
    if (!slices || slices > gi->gi_slices) return NVML_ERROR_NOT_SUPPORTED;
    if (place && (place->size != slices || place->start % slices || place->start + slices > gi->gi_slices))
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_gpu *gpu = gi->gpu;
    for (unsigned i = 0; i < gpu->mig_count; i++)
        if (gpu->migs[i].gi_id == gi->gi_id) used += gpu->migs[i].ci_slices;
    if (used + slices > gi->gi_slices) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    while (id <= SIM_MAX_COMPUTE_INSTANCE_ID && find_ci(gi, id)) id++;
    if (id > SIM_MAX_COMPUTE_INSTANCE_ID) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    sim_mig *m = gi;
    if (sim_is_device(gi)) {
        if (gpu->mig_count >= SIM_MAX_MIGS) return NVML_ERROR_INSUFFICIENT_RESOURCES;
        m = &gpu->migs[gpu->mig_count];
        *m = *gi;
        m->index = gpu->mig_count++;
    }
    m->ci_id = id;
    m->ci_slices = slices;
    m->sms = gpu->gi_profiles[m->gi_enum].sms * slices / m->gi_slices;
    const char *profile_name = gpu->gi_profiles[m->gi_enum].name;
    char shape[48];
    if (slices < m->gi_slices) snprintf(shape, sizeof shape, "%uc.%s", slices, profile_name);
    else snprintf(shape, sizeof shape, "%s", profile_name);
    if (snprintf(m->name, sizeof m->name, "%s MIG %s", gpu->name, shape) >= (int)sizeof m->name)
        m->name[sizeof m->name - 1] = '\0';
    sim_current->created++;
    sim_new_mig_uuid(gpu, m, m->uuid, sizeof m->uuid);
    *out = (nvmlComputeInstance_t)&m->compute_instance;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t instance, unsigned int profile,
                                                          nvmlComputeInstance_t *compute) {
    if (!compute) return NVML_ERROR_INVALID_ARGUMENT;
    CHANGE(changed = (result = create_ci(instance, profile, NULL, compute)) == NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlGpuInstanceCreateComputeInstanceWithPlacement(nvmlGpuInstance_t instance, unsigned int profile,
                                                                       const nvmlComputeInstancePlacement_t *placement,
                                                                       nvmlComputeInstance_t *compute) {
    if (!compute || !placement) return NVML_ERROR_INVALID_ARGUMENT;
    CHANGE(changed = (result = create_ci(instance, profile, placement, compute)) == NVML_SUCCESS);
}

nvmlReturn_t DECLDIR nvmlComputeInstanceDestroy(nvmlComputeInstance_t compute) {
    sim_mig *m;
    CHANGE(if ((result = sim_compute_instance(compute, "nvmlComputeInstanceDestroy", &m)) == NVML_SUCCESS &&
               (result = sim_current->mig_config ? NVML_SUCCESS : NVML_ERROR_NO_PERMISSION) == NVML_SUCCESS) {
        unsigned others = 0;
        for (unsigned i = 0; i < m->gpu->mig_count; i++) others += m->gpu->migs[i].gi_id == m->gi_id;
        if (others > 1) {
            remove_entry(m);
        } else { /* the GPU instance stays, without compute instances */
            m->ci_id = SIM_NO_INSTANCE;
            m->ci_slices = 0;
            m->uuid[0] = m->name[0] = '\0';
        }
        changed = 1;
    });
}
