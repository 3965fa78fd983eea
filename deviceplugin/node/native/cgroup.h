/* The cgroup a per-cgroup GPU memory limit names, by one rule that the simulated library (for
 * the calling process) and the memory-limit hook (for the container it runs in) share. */
#ifndef NVMLSIM_CGROUP_H
#define NVMLSIM_CGROUP_H

#include <stddef.h>

/* From a /proc/<pid>/cgroup file, the sysfs directory of that process's cgroup, as
 * nvmlSetMemoryLimits_v1_t.nameSpace takes it: the cgroup v1 `memory` controller's path under
 * SYSFS/memory when the file names one (v1 or hybrid), else the v2 `0::` path under SYSFS
 * (/sys/fs/cgroup on a host). `mount` gets that hierarchy's directory (both `size` bytes).
 * 0 when the file names neither (or a path does not fit). The path is as the file gives it,
 * relative to the reader's cgroup namespace and unchecked. */
int sim_cgroup_of(const char *file, const char *sysfs, char *mount, char *out, size_t size);

/* sim_cgroup_of for this process: /proc/self/cgroup under /sys/fs/cgroup. */
int sim_own_cgroup(char *out, size_t size);

/* `path` with trailing slashes dropped (the root stays "/"), so one cgroup has one name. */
void sim_cgroup_normalise(char *path);

#endif
