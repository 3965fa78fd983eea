/* The simulated NVML library's shared state: the node it serves (node.c), the events that change
 * it (events.c), and the lock every exported call takes. */
#ifndef NVMLSIM_SIM_H
#define NVMLSIM_SIM_H

#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/stat.h>

#define SIM_MAX_GPUS 64
#define SIM_MAX_MIGS 64
#define SIM_MAX_LINKS NVML_NVLINK_MAX_LINKS
#define SIM_MAX_PLACEMENTS 8
#define SIM_MAX_SLICES 8
#define SIM_MAX_GPU_INSTANCE_ID 14
#define SIM_MAX_COMPUTE_INSTANCE_ID 7
#define SIM_GI_PROFILES NVML_GPU_INSTANCE_PROFILE_COUNT
#define SIM_NO_INSTANCE 0xFFFFFFFFu

typedef struct sim_gpu sim_gpu;

typedef struct {
    int present;
    char name[32]; /* as nvidia-smi prints it (1g.10gb); "" when the rendering has none */
    unsigned id, slices, instances, sms, copy_engines, decoders, jpegs, ofas;
    unsigned long long memory_mib;
    unsigned placement_count;
    nvmlGpuInstancePlacement_t placements[SIM_MAX_PLACEMENTS];
} sim_gi_profile;

/* A MIG device. Its address is its nvmlDevice_t; `gpu_instance` and `compute_instance` are the
 * addresses handed out as nvmlGpuInstance_t / nvmlComputeInstance_t. A GPU instance without
 * compute instances is one entry with ci_id SIM_NO_INSTANCE (no UUID, no device handle). */
typedef struct {
    sim_gpu *gpu;
    unsigned index;
    char gpu_instance;     /* never at offset 0: each handle kind has its own address */
    char compute_instance;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned gi_id, ci_id, gi_enum, gi_profile_id, gi_slices, ci_slices;
    unsigned sms, copy_engines, decoders, jpegs, ofas;
    unsigned long long memory_mib;
    nvmlGpuInstancePlacement_t placement;
} sim_mig;

typedef struct {
    char remote_bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    int to_switch;
} sim_link;

/* A GPU. Its address is its nvmlDevice_t. */
struct sim_gpu {
    unsigned index, minor, brand, architecture, pci_device_id;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE];
    char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned long long memory_mib;
    int numa_node; /* -1: unknown */
    int cc_major, cc_minor;
    int mig_capable, mig_enabled, mig_pending;
    unsigned long long supported_events;
    char *not_supported; /* "\n"-joined NVML function names answering NOT_SUPPORTED here */
    unsigned topology[SIM_MAX_GPUS];
    unsigned link_count;
    sim_link links[SIM_MAX_LINKS];
    sim_gi_profile gi_profiles[SIM_GI_PROFILES];
    unsigned mig_count;
    sim_mig migs[SIM_MAX_MIGS];
    /* Changed by event lines. */
    int lost, retired_pages_pending, remapped_rows_pending;
    unsigned recovery_action;
};

typedef struct {
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    int cuda_driver_version;
    unsigned gpu_count;
    unsigned long long created; /* MIG devices created so far: new UUIDs derive from it */
    sim_gpu gpus[SIM_MAX_GPUS];
} sim_node;

/* A MIG device, not a GPU instance still waiting for its first compute instance. */
static inline int sim_is_device(const sim_mig *mig) { return mig->ci_id != SIM_NO_INSTANCE; }

/* One lock for the node, the event sets and the init count. */
extern pthread_mutex_t sim_lock;
extern sim_node *sim_current;
extern unsigned sim_init_count;

/* node.c */
nvmlReturn_t sim_load(void);
const char *sim_events_path(void);
void sim_complain(const char *format, ...) __attribute__((format(printf, 1, 2)));

/* Handle checks, under sim_lock with NVML initialised; each answers as NVML would. */
nvmlReturn_t sim_enter(void);
nvmlReturn_t sim_device(nvmlDevice_t handle, const char *call, sim_gpu **gpu, sim_mig **mig);
nvmlReturn_t sim_whole_gpu(nvmlDevice_t handle, const char *call, sim_gpu **gpu);
sim_mig *sim_find_gi(sim_gpu *gpu, unsigned gi_id);
nvmlReturn_t sim_gpu_instance(nvmlGpuInstance_t handle, const char *call, sim_mig **mig);
nvmlReturn_t sim_compute_instance(nvmlComputeInstance_t handle, const char *call, sim_mig **mig);
void sim_copy(char *out, unsigned length, const char *text, nvmlReturn_t *result);

/* node.c: a node rendering (`length` bytes of JSON) -> a checked node, or NULL with a message. */
sim_node *sim_node_parse(const char *text, size_t length, char *error, size_t size);
void sim_node_free(sim_node *node);

/* node.c: a MIG state document (state.c writes it) laid over `node`'s GPUs once checked; 0 with
 * a message, the node unchanged. */
int sim_state_parse(sim_node *node, const char *text, size_t length, char *error, size_t size);

/* state.c: the MIG layout shared through DIR/etc/deviceplugin-sim/mig-state.json. */
void sim_state_paths(const char *events_path);
void sim_state_refresh(void);
int sim_state_lock(void);
nvmlReturn_t sim_state_commit(int lock);
void sim_state_unlock(int lock);
void sim_new_mig_uuid(const sim_gpu *gpu, const sim_mig *mig, char *out, size_t size);
/* state.c: any other state file beside it (`name`), under the same lock: its path; its text when
 * it differs from `seen` (then updated; NULL otherwise); and its atomic replacement. */
int sim_state_file(const char *name, char *out, size_t size);
char *sim_state_read(const char *path, struct stat *seen, size_t *length);
nvmlReturn_t sim_state_replace(const char *path, const char *text, size_t length, struct stat *seen);

/* check.c: what the node's parts must agree on (unique ids, MIG layout); 0 with a message. */
int sim_node_check(const sim_node *node, char *error, size_t size);

/* eventline.c: one event line, read apart from the node it applies to. */
typedef struct {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE]; /* "" when the line names none */
    long long xid, recovery_action;               /* -1: absent */
    int lost, retired_pages_pending, remapped_rows_pending; /* -1: absent */
    unsigned long long ecc_type;                  /* 0: none */
    nvmlReturn_t wait_error;                      /* NVML_SUCCESS: none */
} sim_event_line;
const char *sim_event_parse(const char *text, size_t length, sim_event_line *out);
int sim_event_blank(const char *text, size_t length);

/* events.c */
#define SIM_MAX_LINE 4096
nvmlReturn_t sim_events_open(void);
void sim_events_pump(void);

#endif
