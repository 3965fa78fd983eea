"""Failpoints: places in Prepare and Unprepare where `dra serve` can be made to die, to prove
that a driver killed there recovers (the crash tests, here and on a real cluster).

`DP_FAILPOINT=<name>` arms one point; each time it is reached the process exits at once with
status 75, without cleanup, as a kill would leave it. The environment is read once at start,
and an unarmed point costs one string comparison.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from deviceplugin.model.errors import ConfigError
from deviceplugin.model.log import log_event
from deviceplugin.model.record import record

logger = logging.getLogger(__name__)

FAILPOINT_ENV = "DP_FAILPOINT"
EXIT_STATUS = 75
# The claim's CDI spec is written; the checkpoint does not yet say it is complete.
PREPARE_AFTER_CDI_SPEC = "prepare-after-cdi-spec"
# The checkpoint says complete; the kubelet has no answer yet.
PREPARE_AFTER_CHECKPOINT = "prepare-after-checkpoint"
# The spec is gone; the checkpoint still lists the claim.
UNPREPARE_AFTER_CDI_SPEC_REMOVED = "unprepare-after-cdi-spec-removed"
# Dynamic MIG: a partition is checkpointed as wanted; none of its instances exists yet.
PREPARE_BEFORE_GPU_INSTANCE = "prepare-before-gpu-instance"
# Dynamic MIG: a partition's GPU instance exists and its id is checkpointed; its compute
# instance does not exist yet.
PREPARE_AFTER_GPU_INSTANCE = "prepare-after-gpu-instance"
# Dynamic MIG: the compute instance exists too; the checkpoint does not record either.
PREPARE_AFTER_COMPUTE_INSTANCE = "prepare-after-compute-instance"
POINTS = (
    PREPARE_AFTER_CDI_SPEC,
    PREPARE_AFTER_CHECKPOINT,
    UNPREPARE_AFTER_CDI_SPEC_REMOVED,
    PREPARE_BEFORE_GPU_INSTANCE,
    PREPARE_AFTER_GPU_INSTANCE,
    PREPARE_AFTER_COMPUTE_INSTANCE,
)


@record(frozen=True)
class Failpoints:
    """The armed point, "" for none (production)."""

    armed: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Failpoints:
        """Raises ConfigError naming DP_FAILPOINT when it names no point."""
        armed = env.get(FAILPOINT_ENV, "")
        if armed and armed not in POINTS:
            raise ConfigError(
                FAILPOINT_ENV, f"{armed!r} is not a failpoint; the points: {', '.join(POINTS)}"
            )
        if armed:
            log_event(logger, "dra.failpoint.armed", logging.WARNING, point=armed)
        return cls(armed)

    def reach(self, point: str) -> None:
        """Exit the process with status 75 when `point` is the armed one."""
        if point != self.armed:
            return
        log_event(logger, "dra.failpoint.reached", logging.WARNING, point=point)
        logging.shutdown()  # flush what the log says before dying
        os._exit(EXIT_STATUS)
