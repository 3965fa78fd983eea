/* Where the simulated node comes from and how handles map onto it.
 *
 * The node is the JSON rendering `deviceplugin sim-root` writes beside this library
 * (`deviceplugin-sim-node.json`); events are read from `etc/deviceplugin-sim/events.jsonl` three
 * levels above the library's folder (DIR of DIR/usr/lib/x86_64-linux-gnu), and device nodes from
 * DIR/dev (view.c: what this process sees). DEVICEPLUGIN_SIM_NODE, DEVICEPLUGIN_SIM_EVENTS and
 * DEVICEPLUGIN_SIM_DEV name others. The node is read once, at the first successful nvmlInit; it
 * is never freed, so handles stay valid for the life of the process.
 *
 * The file is untrusted: it must be a regular file (opened without blocking, so a FIFO is
 * refused rather than waited on) of at most MAX_NODE_BYTES, and every count and id in it is
 * checked against the arrays here (and check.c) before a handle can reach it. */
#define _GNU_SOURCE
#include "sim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

#define NODE_FILE "deviceplugin-sim-node.json"
#define EVENTS_FROM_LIBRARY "/../../../etc/deviceplugin-sim/events.jsonl"
#define DEV_FROM_LIBRARY "/../../../dev"
#define MAX_NODE_BYTES (4 << 20)

pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
sim_node *sim_current;
unsigned sim_init_count;
static char events_path[PATH_MAX];

void sim_complain(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("libnvidia-ml.so.1 (deviceplugin simulated node): ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
}

/* The folder this library was loaded from, resolved through symlinks. */
static int library_dir(char *out, size_t size) {
    Dl_info info;
    char resolved[PATH_MAX];
    if (!dladdr((void *)&library_dir, &info) || !info.dli_fname || !realpath(info.dli_fname, resolved))
        return 0;
    char *slash = strrchr(resolved, '/');
    if (!slash) return 0;
    *slash = '\0';
    return snprintf(out, size, "%s", resolved) < (int)size;
}

static int default_path(char *out, size_t size, const char *env, const char *relative) {
    const char *chosen = getenv(env);
    if (chosen && *chosen) return snprintf(out, size, "%s", chosen) < (int)size;
    char dir[PATH_MAX];
    if (!library_dir(dir, sizeof dir)) return 0;
    return snprintf(out, size, "%s%s", dir, relative) < (int)size;
}

const char *sim_events_path(void) { return events_path; }

/* --- reading the rendering ------------------------------------------------------------------ */

typedef struct {
    char error[256];
    char where[96];
} parse_state;

static int bad(parse_state *st, const char *where, const char *what) {
    if (!st->error[0]) snprintf(st->error, sizeof st->error, "%s%s: %s", st->where, where, what);
    return 0;
}

static int get_uint(parse_state *st, const json *obj, const char *key, unsigned long long max,
                    unsigned long long *out) {
    const json *v = json_get(obj, key);
    if (!v || v->kind != JSON_NUMBER || !v->integral || v->integer < 0 ||
        (unsigned long long)v->integer > max)
        return bad(st, key, "must be a non-negative integer in range");
    *out = (unsigned long long)v->integer;
    return 1;
}

static int get_u(parse_state *st, const json *obj, const char *key, unsigned *out) {
    unsigned long long v;
    if (!get_uint(st, obj, key, 0xFFFFFFFFull, &v)) return 0;
    *out = (unsigned)v;
    return 1;
}

static int get_str(parse_state *st, const json *obj, const char *key, char *out, size_t size) {
    const json *v = json_get(obj, key);
    if (!v || v->kind != JSON_STRING) return bad(st, key, "must be a string");
    if (strlen(v->string) >= size) return bad(st, key, "is too long");
    memcpy(out, v->string, strlen(v->string) + 1);
    return 1;
}

static int get_bool(parse_state *st, const json *obj, const char *key, int *out) {
    const json *v = json_get(obj, key);
    if (!v || v->kind != JSON_BOOL) return bad(st, key, "must be true or false");
    *out = (int)v->number;
    return 1;
}

static const json *get_array(parse_state *st, const json *obj, const char *key, size_t max) {
    const json *v = json_get(obj, key);
    if (!v || v->kind != JSON_ARRAY) { bad(st, key, "must be a list"); return NULL; }
    if (json_length(v) > max) { bad(st, key, "has too many entries"); return NULL; }
    return v;
}

static int get_pair(parse_state *st, const json *v, const char *key, nvmlGpuInstancePlacement_t *out) {
    if (!v || v->kind != JSON_ARRAY || json_length(v) != 2 || v->child->kind != JSON_NUMBER ||
        v->child->next->kind != JSON_NUMBER || !v->child->integral || !v->child->next->integral ||
        v->child->integer < 0 || v->child->next->integer < 1 ||
        v->child->integer + v->child->next->integer > SIM_MAX_SLICES)
        return bad(st, key, "must be [start, size] within the GPU's 8 slices");
    out->start = (unsigned)v->child->integer;
    out->size = (unsigned)v->child->next->integer;
    return 1;
}

static int read_profile(parse_state *st, const json *p, sim_gpu *gpu) {
    unsigned e;
    if (!get_u(st, p, "enum", &e)) return 0;
    if (e >= SIM_GI_PROFILES) return bad(st, "enum", "is not a GPU-instance profile");
    sim_gi_profile *gi = &gpu->gi_profiles[e];
    if (gi->present) return bad(st, "enum", "repeats another profile's");
    gi->present = 1;
    const json *name = json_get(p, "name");
    if (name && !get_str(st, p, "name", gi->name, sizeof gi->name)) return 0;
    const json *places = get_array(st, p, "placements", SIM_MAX_PLACEMENTS);
    if (!places || !get_u(st, p, "id", &gi->id) || !get_u(st, p, "slices", &gi->slices) ||
        !get_u(st, p, "instances", &gi->instances) || !get_u(st, p, "sms", &gi->sms) ||
        !get_u(st, p, "copyEngines", &gi->copy_engines) || !get_u(st, p, "decoders", &gi->decoders) ||
        !get_u(st, p, "jpegs", &gi->jpegs) || !get_u(st, p, "ofas", &gi->ofas) ||
        !get_uint(st, p, "memoryMiB", 1ull << 40, &gi->memory_mib))
        return 0;
    for (const json *pl = places->child; pl; pl = pl->next) {
        if (gi->placement_count >= SIM_MAX_PLACEMENTS) return bad(st, "placements", "has too many entries");
        if (!get_pair(st, pl, "placements", &gi->placements[gi->placement_count++])) return 0;
    }
    if (gi->instances < 1 || gi->instances > gi->placement_count)
        return bad(st, "instances", "must be between 1 and the number of placements");
    return 1;
}

static int read_mig(parse_state *st, const json *m, sim_gpu *gpu, unsigned index) {
    if (index >= SIM_MAX_MIGS) return bad(st, "migDevices", "has too many entries");
    sim_mig *mig = &gpu->migs[index];
    mig->gpu = gpu;
    mig->index = index;
    if (!get_str(st, m, "uuid", mig->uuid, sizeof mig->uuid) ||
        !get_str(st, m, "name", mig->name, sizeof mig->name) ||
        !get_u(st, m, "gpuInstanceId", &mig->gi_id) || !get_u(st, m, "computeInstanceId", &mig->ci_id) ||
        !get_u(st, m, "giEnum", &mig->gi_enum) || !get_u(st, m, "giProfileId", &mig->gi_profile_id) ||
        !get_u(st, m, "giSlices", &mig->gi_slices) || !get_u(st, m, "ciSlices", &mig->ci_slices) ||
        !get_u(st, m, "sms", &mig->sms) || !get_u(st, m, "copyEngines", &mig->copy_engines) ||
        !get_u(st, m, "decoders", &mig->decoders) || !get_u(st, m, "jpegs", &mig->jpegs) ||
        !get_u(st, m, "ofas", &mig->ofas) ||
        !get_uint(st, m, "memoryMiB", 1ull << 40, &mig->memory_mib) ||
        !get_pair(st, json_get(m, "placement"), "placement", &mig->placement))
        return 0;
    if (!sim_is_device(mig)) {
        if (mig->ci_slices != 0 || mig->uuid[0]) return bad(st, "ciSlices", "must be 0 and uuid \"\" without a compute instance");
        if (mig->gi_slices == 0) return bad(st, "giSlices", "must be at least 1");
    } else if (mig->gi_slices == 0 || mig->ci_slices == 0 || mig->ci_slices > mig->gi_slices)
        return bad(st, "ciSlices", "must be between 1 and giSlices");
    if (mig->gi_id > SIM_MAX_GPU_INSTANCE_ID || (sim_is_device(mig) && mig->ci_id > SIM_MAX_COMPUTE_INSTANCE_ID))
        return bad(st, "gpuInstanceId", "or computeInstanceId is past the driver's table (14, 7)");
    return 1;
}

static int read_gpu(parse_state *st, const json *g, sim_gpu *gpu, unsigned count) {
    unsigned long long events;
    const json *cc = json_get(g, "computeCapability"), *numa = json_get(g, "numaNode");
    const json *topology = get_array(st, g, "topology", SIM_MAX_GPUS);
    const json *links = topology ? get_array(st, g, "nvlinks", SIM_MAX_LINKS) : NULL;
    const json *profiles = links ? get_array(st, g, "giProfiles", SIM_GI_PROFILES) : NULL;
    const json *migs = profiles ? get_array(st, g, "migDevices", SIM_MAX_MIGS) : NULL;
    const json *unsupported = migs ? get_array(st, g, "notSupported", 1024) : NULL;
    if (!unsupported || !get_u(st, g, "index", &gpu->index) || !get_u(st, g, "minor", &gpu->minor) ||
        !get_u(st, g, "brand", &gpu->brand) || !get_u(st, g, "architecture", &gpu->architecture) ||
        !get_u(st, g, "pciDeviceId", &gpu->pci_device_id) ||
        !get_str(st, g, "uuid", gpu->uuid, sizeof gpu->uuid) ||
        !get_str(st, g, "name", gpu->name, sizeof gpu->name) ||
        !get_str(st, g, "serial", gpu->serial, sizeof gpu->serial) ||
        !get_str(st, g, "pciBusId", gpu->bus_id, sizeof gpu->bus_id) ||
        !get_uint(st, g, "memoryMiB", 1ull << 40, &gpu->memory_mib) ||
        !get_bool(st, g, "migCapable", &gpu->mig_capable) ||
        !get_bool(st, g, "migEnabled", &gpu->mig_enabled) ||
        !get_uint(st, g, "supportedEvents", ~0ull >> 1, &events))
        return 0;
    gpu->supported_events = events;
    gpu->mig_pending = gpu->mig_enabled;
    if (gpu->index >= count) return bad(st, "index", "is not below the GPU count");
    if (!numa || numa->kind != JSON_NUMBER || !numa->integral || numa->integer < -1 || numa->integer > 4096)
        return bad(st, "numaNode", "must be an integer, -1 for none");
    gpu->numa_node = (int)numa->integer;
    if (!cc || cc->kind != JSON_ARRAY || json_length(cc) != 2 || cc->child->kind != JSON_NUMBER ||
        cc->child->next->kind != JSON_NUMBER || !cc->child->integral || !cc->child->next->integral ||
        cc->child->integer < 0 || cc->child->integer > 99 || cc->child->next->integer < 0 ||
        cc->child->next->integer > 99)
        return bad(st, "computeCapability", "must be [major, minor], each 0 to 99");
    gpu->cc_major = (int)cc->child->integer;
    gpu->cc_minor = (int)cc->child->next->integer;
    if (json_length(topology) != count) return bad(st, "topology", "needs one level per GPU");
    unsigned i = 0;
    for (const json *t = topology->child; t; t = t->next, i++) {
        if (i >= SIM_MAX_GPUS) return bad(st, "topology", "has too many entries");
        if (t->kind != JSON_NUMBER || !t->integral || t->integer < 0 || t->integer > 100)
            return bad(st, "topology", "must hold topology levels");
        gpu->topology[i] = (unsigned)t->integer;
    }
    for (const json *l = links->child; l; l = l->next) {
        if (gpu->link_count >= SIM_MAX_LINKS) return bad(st, "nvlinks", "has too many entries");
        sim_link *link = &gpu->links[gpu->link_count++];
        if (!get_str(st, l, "remotePciBusId", link->remote_bus_id, sizeof link->remote_bus_id) ||
            !get_bool(st, l, "toSwitch", &link->to_switch))
            return 0;
    }
    for (const json *p = profiles->child; p; p = p->next)
        if (!read_profile(st, p, gpu)) return 0;
    for (const json *m = migs->child; m; m = m->next)
        if (!read_mig(st, m, gpu, gpu->mig_count++)) return 0;
    size_t length = 1;
    for (const json *n = unsupported->child; n; n = n->next) {
        if (n->kind != JSON_STRING || strlen(n->string) > 150)
            return bad(st, "notSupported", "must hold function names");
        length += strlen(n->string) + 2;
    }
    if (!(gpu->not_supported = calloc(1, length + 1))) return bad(st, "notSupported", "out of memory");
    strcpy(gpu->not_supported, "\n");
    for (const json *n = unsupported->child; n; n = n->next) {
        strcat(gpu->not_supported, n->string);
        strcat(gpu->not_supported, "\n");
    }
    return 1;
}

static int read_node(parse_state *st, const json *doc, sim_node *node) {
    unsigned format, cuda;
    const json *gpus = get_array(st, doc, "gpus", SIM_MAX_GPUS);
    if (!gpus || !get_u(st, doc, "format", &format)) return 0;
    if (format != 1) return bad(st, "format", "is not 1 (rendered by another deviceplugin release)");
    if (!get_str(st, doc, "driverVersion", node->driver_version, sizeof node->driver_version) ||
        !get_str(st, doc, "nvmlVersion", node->nvml_version, sizeof node->nvml_version) ||
        !get_u(st, doc, "cudaDriverVersion", &cuda))
        return 0;
    if (cuda > 0x7FFFFFFF) return bad(st, "cudaDriverVersion", "is past 2^31-1");
    node->cuda_driver_version = (int)cuda;
    node->gpu_count = (unsigned)json_length(gpus);
    unsigned position = 0;
    unsigned char taken[SIM_MAX_GPUS] = {0};
    for (const json *g = gpus->child; g; g = g->next, position++) {
        /* Each GPU at its NVML index: a slot is read into once. */
        const json *index = json_get(g, "index");
        snprintf(st->where, sizeof st->where, "gpus[%u].", position);
        if (!index || index->kind != JSON_NUMBER || !index->integral || index->integer < 0 ||
            index->integer >= (long long)node->gpu_count)
            return bad(st, "index", "is not below the GPU count");
        unsigned slot = (unsigned)index->integer;
        if (taken[slot]) return bad(st, "index", "is used twice");
        taken[slot] = 1;
        if (!read_gpu(st, g, &node->gpus[slot], node->gpu_count)) return 0;
    }
    st->where[0] = '\0';
    sim_view_all(node);
    return sim_node_check(node, st->error, sizeof st->error);
}

/* One GPU of the state document: its UUID must be the node's (the state belongs to this node),
 * its MIG mode and devices replace the scratch copy's. */
static int read_state_gpu(parse_state *st, const json *g, sim_gpu *gpu) {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    const json *migs = get_array(st, g, "migDevices", SIM_MAX_MIGS);
    if (!migs || !get_str(st, g, "uuid", uuid, sizeof uuid) ||
        !get_bool(st, g, "migEnabled", &gpu->mig_enabled) || !get_bool(st, g, "migPending", &gpu->mig_pending))
        return 0;
    if (strcmp(uuid, gpu->uuid) != 0) return bad(st, "uuid", "is not this node's GPU at that index");
    if ((gpu->mig_enabled || gpu->mig_pending) && !gpu->mig_capable) return bad(st, "migEnabled", "on a GPU without MIG");
    memset(gpu->migs, 0, sizeof gpu->migs);
    gpu->mig_count = 0;
    for (const json *m = migs->child; m; m = m->next)
        if (!read_mig(st, m, gpu, gpu->mig_count++)) return 0;
    return 1;
}

int sim_state_parse(sim_node *node, const char *text, size_t length, char *error, size_t size) {
    parse_state st = {{0}, {0}};
    unsigned long long created = 0;
    unsigned format = 0;
    json *doc = json_parse(text, length, st.error, sizeof st.error);
    sim_node *scratch = doc ? malloc(sizeof *scratch) : NULL;
    const json *gpus = scratch ? get_array(&st, doc, "gpus", SIM_MAX_GPUS) : NULL;
    int ok = gpus && get_u(&st, doc, "format", &format) && get_uint(&st, doc, "created", ~0ull >> 1, &created);
    if (ok && format != 1) ok = bad(&st, "format", "is not 1 (written by another deviceplugin release)");
    if (ok && json_length(gpus) != node->gpu_count) ok = bad(&st, "gpus", "is not one entry per GPU of the node");
    if (ok) {
        memcpy(scratch, node, sizeof *scratch);
        unsigned i = 0;
        for (const json *g = gpus->child; ok && g; g = g->next, i++) {
            snprintf(st.where, sizeof st.where, "gpus[%u].", i);
            ok = read_state_gpu(&st, g, &scratch->gpus[i]);
            /* Each entry points at the node's GPU: where it will live once copied. */
            for (unsigned j = 0; ok && j < scratch->gpus[i].mig_count; j++) scratch->gpus[i].migs[j].gpu = &node->gpus[i];
        }
        st.where[0] = '\0';
        ok = ok && sim_node_check(scratch, st.error, sizeof st.error);
    }
    if (ok) {
        for (unsigned i = 0; i < node->gpu_count; i++) {
            sim_gpu *to = &node->gpus[i], *from = &scratch->gpus[i];
            to->mig_enabled = from->mig_enabled;
            to->mig_pending = from->mig_pending;
            to->mig_count = from->mig_count;
            memcpy(to->migs, from->migs, sizeof to->migs);
        }
        node->created = created;
    } else {
        snprintf(error, size, "%s", st.error[0] ? st.error : "out of memory");
    }
    free(scratch);
    json_free(doc);
    return ok;
}

void sim_node_free(sim_node *node) {
    if (!node) return;
    for (unsigned i = 0; i < SIM_MAX_GPUS; i++) free(node->gpus[i].not_supported);
    free(node);
}

sim_node *sim_node_parse(const char *text, size_t length, char *error, size_t size) {
    parse_state st = {{0}, {0}};
    json *doc = json_parse(text, length, st.error, sizeof st.error);
    sim_node *node = doc ? calloc(1, sizeof *node) : NULL;
    int ok = node && read_node(&st, doc, node);
    json_free(doc);
    if (!ok) {
        sim_node_free(node);
        snprintf(error, size, "%s", st.error[0] ? st.error : "out of memory");
        return NULL;
    }
    return node;
}

/* The whole of a regular file of at most `limit` bytes, NUL-terminated; NULL with errno set
 * (EINVAL: not a regular file, EFBIG: too big). */
static char *read_regular(const char *path, size_t limit, size_t *length) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return NULL;
    if (fstat(fd, &st) != 0) { int code = errno; close(fd); errno = code; return NULL; }
    if (!S_ISREG(st.st_mode)) { close(fd); errno = EINVAL; return NULL; }
    if ((unsigned long long)st.st_size > limit) { close(fd); errno = EFBIG; return NULL; }
    char *text = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    ssize_t n = 1;
    while (text && got < (size_t)st.st_size && (n = read(fd, text + got, (size_t)st.st_size - got)) > 0)
        got += (size_t)n;
    int code = !text ? ENOMEM : n < 0 ? errno : 0;
    close(fd);
    if (code) { free(text); errno = code; return NULL; }
    text[got] = '\0';
    *length = got;
    return text;
}

static nvmlReturn_t node_from_file(const char *path, sim_node **out) {
    size_t length;
    char *text = read_regular(path, MAX_NODE_BYTES, &length);
    if (!text) {
        int code = errno;
        sim_complain("cannot read the node file %s: %s (write it with `deviceplugin sim-root NODE DIR`)", path,
                     code == EINVAL ? "not a regular file" : code == EFBIG ? "larger than 4 MiB" : strerror(code));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    char error[256];
    sim_node *node = sim_node_parse(text, length, error, sizeof error);
    free(text);
    if (!node) {
        sim_complain("the node file %s is malformed: %s", path, error);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    *out = node;
    return NVML_SUCCESS;
}

nvmlReturn_t sim_load(void) {
    if (sim_current) return NVML_SUCCESS;
    char node_path[PATH_MAX], dev_path[PATH_MAX];
    if (!default_path(node_path, sizeof node_path, "DEVICEPLUGIN_SIM_NODE", "/" NODE_FILE) ||
        !default_path(events_path, sizeof events_path, "DEVICEPLUGIN_SIM_EVENTS", EVENTS_FROM_LIBRARY) ||
        !default_path(dev_path, sizeof dev_path, "DEVICEPLUGIN_SIM_DEV", DEV_FROM_LIBRARY)) {
        sim_complain("cannot tell where this library lies; set DEVICEPLUGIN_SIM_NODE, DEVICEPLUGIN_SIM_EVENTS "
                     "and DEVICEPLUGIN_SIM_DEV");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    sim_node *node;
    nvmlReturn_t result = node_from_file(node_path, &node);
    if (result != NVML_SUCCESS) return result;
    sim_view_open(node, dev_path);
    sim_state_paths(events_path);
    if ((result = sim_events_open()) != NVML_SUCCESS) {
        sim_node_free(node);
        return result;
    }
    sim_current = node;
    return NVML_SUCCESS;
}

/* --- handles ---------------------------------------------------------------------------------- */

nvmlReturn_t sim_enter(void) {
    if (sim_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    sim_events_pump();
    sim_state_refresh();
    return NVML_SUCCESS;
}

static int unsupported(const sim_gpu *gpu, const char *call) {
    char needle[160];
    if (!call || snprintf(needle, sizeof needle, "\n%s\n", call) >= (int)sizeof needle) return 0;
    return strstr(gpu->not_supported, needle) != NULL;
}

nvmlReturn_t sim_device(nvmlDevice_t handle, const char *call, sim_gpu **gpu, sim_mig **mig) {
    nvmlReturn_t result = sim_enter();
    if (result != NVML_SUCCESS) return result;
    const char *address = (const char *)handle;
    for (unsigned i = 0; i < sim_current->gpu_count; i++) {
        sim_gpu *g = &sim_current->gpus[i];
        sim_mig *m = NULL;
        if (address != (const char *)g) {
            if (address < (const char *)g->migs || address >= (const char *)(g->migs + g->mig_count))
                continue;
            size_t offset = (size_t)(address - (const char *)g->migs);
            if (offset % sizeof(sim_mig) != 0) return NVML_ERROR_INVALID_ARGUMENT;
            m = &g->migs[offset / sizeof(sim_mig)];
            if (!sim_is_device(m) || !sim_mig_seen(m)) return NVML_ERROR_INVALID_ARGUMENT;
        }
        if (g->hidden) return NVML_ERROR_INVALID_ARGUMENT;
        if (g->lost) return NVML_ERROR_GPU_IS_LOST;
        if (unsupported(g, call)) return NVML_ERROR_NOT_SUPPORTED;
        *gpu = g;
        if (mig) *mig = m;
        else if (m) return NVML_ERROR_INVALID_ARGUMENT;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t sim_whole_gpu(nvmlDevice_t handle, const char *call, sim_gpu **gpu) {
    return sim_device(handle, call, gpu, NULL);
}

sim_mig *sim_find_gi(sim_gpu *gpu, unsigned gi_id) {
    for (unsigned i = 0; i < gpu->mig_count; i++)
        if (gpu->migs[i].gi_id == gi_id) return &gpu->migs[i];
    return NULL;
}

/* The MIG device whose `member` (gpu_instance or compute_instance) is at `address`. */
static nvmlReturn_t instance(const void *address, size_t member, const char *call, sim_mig **out) {
    nvmlReturn_t result = sim_enter();
    if (result != NVML_SUCCESS) return result;
    for (unsigned i = 0; i < sim_current->gpu_count; i++) {
        sim_gpu *g = &sim_current->gpus[i];
        for (unsigned j = 0; j < g->mig_count; j++) {
            if ((const char *)&g->migs[j] + member != address) continue;
            int compute = member == offsetof(sim_mig, compute_instance);
            if (compute ? !sim_is_device(&g->migs[j]) || !sim_mig_seen(&g->migs[j]) : !sim_gi_seen(g, g->migs[j].gi_id))
                return NVML_ERROR_INVALID_ARGUMENT;
            if (g->lost) return NVML_ERROR_GPU_IS_LOST;
            if (unsupported(g, call)) return NVML_ERROR_NOT_SUPPORTED;
            *out = &g->migs[j];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t sim_gpu_instance(nvmlGpuInstance_t handle, const char *call, sim_mig **mig) {
    return instance(handle, offsetof(sim_mig, gpu_instance), call, mig);
}

nvmlReturn_t sim_compute_instance(nvmlComputeInstance_t handle, const char *call, sim_mig **mig) {
    return instance(handle, offsetof(sim_mig, compute_instance), call, mig);
}

void sim_copy(char *out, unsigned length, const char *text, nvmlReturn_t *result) {
    if (!out) { *result = NVML_ERROR_INVALID_ARGUMENT; return; }
    size_t n = strlen(text);
    if (length <= n) { *result = NVML_ERROR_INSUFFICIENT_SIZE; return; }
    memcpy(out, text, n + 1);
    *result = NVML_SUCCESS;
}
