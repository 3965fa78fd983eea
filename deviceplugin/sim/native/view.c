/* What this process sees of the node: the GPUs and MIG devices whose device nodes its dev root
 * holds, as the real driver shows a container only the devices it was given.
 *
 * The dev root is DEVICEPLUGIN_SIM_DEV, else `dev` three levels above the library's folder (node.c):
 * DIR/dev of a sim-root on the host, where every node is; /dev in a container, whose CDI spec
 * mounts the library at /usr/lib/x86_64-linux-gnu and gives it the nodes of its devices only.
 * It is read once, when the node is loaded (a container's nodes are fixed at its start).
 *
 *  - A GPU is seen when DEV/nvidia<minor> exists. The GPUs seen keep the node's order (the
 *    driver's PCI order) and are numbered from 0 in it, so a container's index 0 is the first
 *    GPU it holds. A dev root without the driver's nodes (neither nvidiactl nor any of the
 *    node's GPUs: none at all, or a node file read without its sim-root) shows every GPU and
 *    instance, as it always did.
 *  - Once GPUs are told apart, a GPU instance is seen when the node of its access capability
 *    (DEV/nvidia-caps/nvidia-cap<minor>, the driver's minor for gpu<minor>/gi<id>/access) exists,
 *    a compute instance (a MIG device) when its own node does too; the mig/monitor capability
 *    (nvidia-cap2) shows every instance of a GPU seen. Creating or destroying instances needs
 *    the mig/config capability (nvidia-cap1), else NVML_ERROR_NO_PERMISSION.
 *
 * A GPU or instance not seen is not there for this process: no index, count, listing, UUID or
 * PCI lookup finds it, its handle is refused and its events are not delivered. */
#define _GNU_SOURCE
#include "sim.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_CAPABILITY 1
#define MONITOR_CAPABILITY 2
#define CAP_PREFIX "nvidia-cap"

void sim_view_all(sim_node *node) {
    node->view_count = node->gpu_count;
    for (unsigned i = 0; i < node->gpu_count; i++) {
        node->gpus[i].hidden = 0;
        node->gpus[i].view_index = i;
    }
    node->caps_restricted = 0;
    node->mig_config = 1;
}

/* Whether DEV/<prefix><minor> (DEV/<prefix> without a minor) exists. */
static int node_exists(const char *dev, const char *prefix, long long minor) {
    char path[PATH_MAX];
    struct stat info;
    int length = minor < 0 ? snprintf(path, sizeof path, "%s/%s", dev, prefix)
                           : snprintf(path, sizeof path, "%s/%s%lld", dev, prefix, minor);
    return length < (int)sizeof path && stat(path, &info) == 0;
}

/* The capability minors DEV/nvidia-caps holds, as bits. */
static void read_capabilities(sim_node *node, const char *dev) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/nvidia-caps", dev) >= (int)sizeof path) return;
    DIR *caps = opendir(path);
    for (struct dirent *entry; caps && (entry = readdir(caps));) {
        const char *digits = entry->d_name + strlen(CAP_PREFIX);
        char *end;
        if (strncmp(entry->d_name, CAP_PREFIX, strlen(CAP_PREFIX)) != 0 || *digits < '0' || *digits > '9') continue;
        unsigned long minor = strtoul(digits, &end, 10);
        if (!*end && minor < SIM_MAX_CAP_MINOR) node->caps[minor / 8] |= (unsigned char)(1u << (minor % 8));
    }
    if (caps) closedir(caps);
}

void sim_view_open(sim_node *node, const char *dev) {
    int held[SIM_MAX_GPUS] = {0}, any = node_exists(dev, "nvidiactl", -1);
    sim_view_all(node);
    for (unsigned i = 0; i < node->gpu_count; i++) any |= held[i] = node_exists(dev, "nvidia", node->gpus[i].minor);
    if (!any) return;
    node->view_count = 0;
    for (unsigned i = 0; i < node->gpu_count; i++) {
        node->gpus[i].hidden = !held[i];
        if (held[i]) node->gpus[i].view_index = node->view_count++;
    }
    node->mig_config = node_exists(dev, "nvidia-caps/" CAP_PREFIX, CONFIG_CAPABILITY);
    if (node_exists(dev, "nvidia-caps/" CAP_PREFIX, MONITOR_CAPABILITY)) return;
    node->caps_restricted = 1;
    memset(node->caps, 0, sizeof node->caps);
    read_capabilities(node, dev);
}

static int capability_held(unsigned long long minor) {
    return minor < SIM_MAX_CAP_MINOR && (sim_current->caps[minor / 8] >> (minor % 8) & 1u);
}

int sim_gi_seen(const sim_gpu *gpu, unsigned gi_id) {
    if (gpu->hidden) return 0;
    return !sim_current->caps_restricted || capability_held(SIM_CAP_MINOR(gpu->minor, gi_id));
}

int sim_mig_seen(const sim_mig *mig) {
    if (!sim_gi_seen(mig->gpu, mig->gi_id)) return 0;
    return !sim_is_device(mig) || !sim_current->caps_restricted ||
           capability_held(SIM_CAP_MINOR(mig->gpu->minor, mig->gi_id) + 1 + mig->ci_id);
}
