/* The cgroup a per-cgroup GPU memory limit names, by one rule that the simulated library (for
 * the calling process) and the memory-limit hook (for the container it runs in) share. */
#ifndef NVMLSIM_CGROUP_H
#define NVMLSIM_CGROUP_H

#include <stddef.h>

/* The sysfs directory of this process's cgroup, as nvmlSetMemoryLimits_v1_t.nameSpace takes it,
 * from /proc/self/cgroup: the cgroup v1 `memory` controller's path under /sys/fs/cgroup/memory
 * when the machine mounts one (v1 or hybrid), else the v2 `0::` path under /sys/fs/cgroup.
 * 0 when the file names neither (or the path does not fit). */
int sim_own_cgroup(char *out, size_t size);

/* `path` with trailing slashes dropped (the root stays "/"), so one cgroup has one name. */
void sim_cgroup_normalise(char *path);

#endif
