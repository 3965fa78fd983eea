# deviceplugin container image. Build it with `make image` (BASE_IMAGE=..., IMAGE=...):
#
#   make image BASE_IMAGE=registry.local/python:3.11-slim IMAGE=registry.local/deviceplugin:0.1.0
#
# `make image` (image/build.sh) makes the wheels on the host, with the host's pip settings, for
# the base image's Python, into build/wheels; this file installs them with --no-index. So the
# build itself reaches no package index and no registry (it runs with --network none): it
# works on air-gapped and mirrored clusters as it does here.
#
# Both stages start from the same base so the virtual environment built in the first one runs
# unchanged in the second. The final image adds to the base only that virtual environment (the
# package and its runtime dependencies, no installer in it) and removes the base's own
# installers. No compilers, no pip cache, no sources. The base needs Python 3.11+ with venv.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS builder
# `[dra]` for the DRA driver's image (`make image-dra`): pydantic for claims' opaque configs.
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY build/wheels /wheels
# A venv without pip, filled by the base's pip from the wheels alone.
RUN python3 -m venv --without-pip /opt/deviceplugin \
 && python3 -m pip --python /opt/deviceplugin/bin/python install --no-index --no-cache-dir \
        --find-links /wheels "deviceplugin${EXTRAS}" \
 && /opt/deviceplugin/bin/deviceplugin --version

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="deviceplugin" \
      org.opencontainers.image.description="Kubernetes device plugin for NVIDIA GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY image/strip_installers.py /tmp/strip_installers.py
RUN python3 /tmp/strip_installers.py \
 && ! python3 -m pip --version 2>/dev/null
COPY --from=builder /opt/deviceplugin /opt/deviceplugin
# NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES ask the NVIDIA container runtime for every
# GPU, its device nodes and libnvidia-ml: the plugin needs NVML, not privileged mode.
# NVIDIA_MIG_MONITOR_DEVICES=all lets NVML in this container see MIG devices and their events.
# The runtime honours it only with CAP_SYS_ADMIN and refuses to start a container that sets it
# without: the default DaemonSet, which holds no capabilities, overrides it with an empty value
# (the runtime treats empty as unset); the MIG variant keeps it and adds that one capability.
ENV PATH=/opt/deviceplugin/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_MIG_MONITOR_DEVICES=all
# Root on purpose: the plugin creates its sockets in the host's /var/lib/kubelet/device-plugins,
# a root-owned 0750 directory, and connects to the kubelet's root-owned socket there. UID 0 is
# all it needs; the manifests drop every capability and forbid privilege escalation.
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["deviceplugin", "serve"]
