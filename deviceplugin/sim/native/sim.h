/* The simulated NVML library's shared state: the node it serves (node.c), the events that change
 * it (events.c), and the lock every exported call takes. */
#ifndef NVMLSIM_SIM_H
#define NVMLSIM_SIM_H

#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
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
/* The driver's MIG capability minors: gpu<N>/gi<G>/access is 3 + 135 N + 9 G, its ci<C> one more
 * plus C; view.c keeps those below SIM_MAX_CAP_MINOR. */
#define SIM_CAP_MINOR(gpu, gi) (3ull + 135ull * (gpu) + 9ull * (gi))
#define SIM_MAX_CAP_MINOR (1u << 16)

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
    /* What this process sees (view.c): hidden GPUs have no view_index. */
    int hidden;
    unsigned view_index;
};

typedef struct {
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    int cuda_driver_version;
    unsigned gpu_count;
    unsigned long long created; /* MIG devices created so far: new UUIDs derive from it */
    sim_gpu gpus[SIM_MAX_GPUS];
    /* What this process sees (view.c): how many GPUs; whether MIG instances are seen only
     * through their capability nodes (`caps`, one bit per minor); whether it may change them. */
    unsigned view_count;
    int caps_restricted, mig_config;
    unsigned char caps[SIM_MAX_CAP_MINOR / 8];
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
/* state.c: what every state file under the sim-root shares. `name` beside the events file; an
 * exclusive flock of a lock file (-1: none); the text of a file changed since `seen` (NULL: not
 * changed, or unreadable, complained about); a file replaced atomically, `seen` updated (0 with
 * errno); a JSON string. */
int sim_state_file(char *out, size_t size, const char *name);
int sim_file_lock(const char *path);
char *sim_file_read_changed(const char *path, struct stat *seen, size_t *length, const char *what);
int sim_file_replace(const char *path, const char *text, size_t length, struct stat *seen);
void sim_json_string(FILE *out, const char *text);

/* limits.c: the hard memory limit of the calling process's cgroup on `gpu`, under sim_lock; 0
 * when it has none. */
int sim_memory_limit(const sim_gpu *gpu, unsigned long long *hard);

/* check.c: what the node's parts must agree on (unique ids, MIG layout); 0 with a message. */
int sim_node_check(const sim_node *node, char *error, size_t size);

/* view.c: the GPUs and MIG instances this process sees. Every one (a parsed node's view), or
 * those whose device nodes the dev root `dev` holds; then whether a GPU instance (of a GPU seen)
 * or a MIG entry is seen, under sim_lock with sim_current set. */
void sim_view_all(sim_node *node);
void sim_view_open(sim_node *node, const char *dev);
int sim_gi_seen(const sim_gpu *gpu, unsigned gi_id);
int sim_mig_seen(const sim_mig *mig);

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
