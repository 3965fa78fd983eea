/* The simulated `nvidia-smi`: the one thing of NVIDIA's tool that a consumer of the simulated
 * node runs, setting a GPU's compute mode. NVIDIA's MPS daemon (k8s-device-plugin
 * cmd/mps-control-daemon) runs `nvidia-smi -i <uuid> -c EXCLUSIVE_PROCESS` before it starts a
 * control daemon and `-c DEFAULT` after; the mode must land where every NVML consumer of the node
 * reads it, so this goes through the driver root's libnvidia-ml.so.1 (the simulated one) as
 * NVIDIA's tool goes through the driver's.
 *
 *   nvidia-smi -i ID -c MODE   ID: an index, a GPU-/MIG- UUID or a PCI bus id; MODE: 0/DEFAULT,
 *                              2/PROHIBITED, 3/EXCLUSIVE_PROCESS
 *   nvidia-smi [anything else] one line naming the simulated driver version, exit 0, as the
 *                              placeholder it replaces did (a pod's `nvidia-smi -L` in the
 *                              cluster tests, where the container may not see the node file)
 *
 * On a GPU in MIG mode, whose own compute mode cannot be set (only its MIG devices'), NVIDIA's
 * tool says so, treats it as a warning and exits 0, as reported in NVIDIA/go-nvml#61; so does
 * this one.
 *
 * Exit status as NVIDIA documents it: 0 done, 2 an invalid argument, 3 not available on the
 * device, 6 NVML failed otherwise, 9 no NVML. The library is the one beside this program in its
 * driver root (`../lib/x86_64-linux-gnu/`), else whatever the loader finds by soname. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define LIBRARY "libnvidia-ml.so.1"

typedef nvmlReturn_t (*init_fn)(void);
typedef nvmlReturn_t (*index_fn)(unsigned, nvmlDevice_t *);
typedef nvmlReturn_t (*name_fn)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*set_fn)(nvmlDevice_t, nvmlComputeMode_t);
typedef nvmlReturn_t (*mig_fn)(nvmlDevice_t, unsigned *, unsigned *);
typedef const char *(*error_fn)(nvmlReturn_t);

static const struct {
    const char *name;
    nvmlComputeMode_t mode;
} MODES[] = {{"DEFAULT", NVML_COMPUTEMODE_DEFAULT},
             {"PROHIBITED", NVML_COMPUTEMODE_PROHIBITED},
             {"EXCLUSIVE_PROCESS", NVML_COMPUTEMODE_EXCLUSIVE_PROCESS}};

static void *load(void) {
    char exe[PATH_MAX], path[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0'; /* .../usr/bin */
        snprintf(path, sizeof path, "%s/../lib/x86_64-linux-gnu/" LIBRARY, exe);
        void *own = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (own) return own;
    }
    return dlopen(LIBRARY, RTLD_NOW | RTLD_LOCAL);
}

/* MODE as a number or a name; -1 if neither. */
static int parse_mode(const char *text) {
    for (size_t i = 0; i < sizeof MODES / sizeof *MODES; i++) {
        char number[8];
        snprintf(number, sizeof number, "%d", (int)MODES[i].mode);
        if (!strcasecmp(text, MODES[i].name) || !strcmp(text, number)) return (int)MODES[i].mode;
    }
    return -1;
}

static const char *mode_name(int mode) {
    for (size_t i = 0; i < sizeof MODES / sizeof *MODES; i++)
        if ((int)MODES[i].mode == mode) return MODES[i].name;
    return "?";
}

static int exit_for(nvmlReturn_t result) {
    if (result == NVML_ERROR_INVALID_ARGUMENT || result == NVML_ERROR_NOT_FOUND) return 2;
    if (result == NVML_ERROR_NOT_SUPPORTED) return 3;
    return 6;
}

int main(int argc, char **argv) {
    const char *id = NULL, *mode_text = NULL;
    int other = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-i") && i + 1 < argc) id = argv[++i];
        else if (!strcmp(argv[i], "-c") && i + 1 < argc) mode_text = argv[++i];
        else other = 1;
    }
    if (other || !mode_text) {
        printf("simulated nvidia-smi (only -i ID -c MODE acts)\n");
        return 0;
    }
    void *nvml = load();
    init_fn init = nvml ? (init_fn)dlsym(nvml, "nvmlInit_v2") : NULL;
    init_fn shutdown = nvml ? (init_fn)dlsym(nvml, "nvmlShutdown") : NULL;
    index_fn by_index = nvml ? (index_fn)dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    name_fn by_uuid = nvml ? (name_fn)dlsym(nvml, "nvmlDeviceGetHandleByUUID") : NULL;
    name_fn by_bus = nvml ? (name_fn)dlsym(nvml, "nvmlDeviceGetHandleByPciBusId_v2") : NULL;
    set_fn set = nvml ? (set_fn)dlsym(nvml, "nvmlDeviceSetComputeMode") : NULL;
    mig_fn mig_mode = nvml ? (mig_fn)dlsym(nvml, "nvmlDeviceGetMigMode") : NULL;
    error_fn text = nvml ? (error_fn)dlsym(nvml, "nvmlErrorString") : NULL;
    if (!init || !shutdown || !by_index || !by_uuid || !by_bus || !set || !mig_mode || !text) {
        fprintf(stderr, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n");
        return 9;
    }
    nvmlReturn_t result = init();
    if (result != NVML_SUCCESS) {
        fprintf(stderr, "Failed to initialize NVML: %s\n", text(result));
        return 9;
    }
    int mode = parse_mode(mode_text);
    if (!id || mode < 0) {
        fprintf(stderr, "Invalid combination of input arguments: -i ID and -c with a valid mode.\n");
        shutdown();
        return 2;
    }
    nvmlDevice_t device;
    char *end;
    unsigned long index = strtoul(id, &end, 10);
    if (*id && !*end) result = by_index((unsigned)index, &device);
    else if (!strncmp(id, "GPU-", 4) || !strncmp(id, "MIG-", 4)) result = by_uuid(id, &device);
    else result = by_bus(id, &device);
    if (result != NVML_SUCCESS) {
        fprintf(stderr, "No devices were found matching %s: %s\n", id, text(result));
        shutdown();
        return exit_for(result);
    }
    unsigned current = 0, pending = 0;
    if (mig_mode(device, &current, &pending) == NVML_SUCCESS && current == NVML_DEVICE_MIG_ENABLE) {
        printf("Setting compute mode to %s is not supported on a MIG-enabled device.\n"
               "Unable to set the compute mode for GPU %s: Not Supported\n"
               "Treating as warning and moving on.\nAll done.\n", mode_name(mode), id);
        shutdown();
        return 0;
    }
    result = set(device, (nvmlComputeMode_t)mode);
    if (result != NVML_SUCCESS) {
        fprintf(stderr, "Unable to set the compute mode for GPU %s: %s\n", id, text(result));
        shutdown();
        return exit_for(result);
    }
    printf("Set compute mode to %s for GPU %s.\nAll done.\n", mode_name(mode), id);
    shutdown();
    return 0;
}
