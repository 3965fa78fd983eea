# deviceplugin container image.
#
#   docker build -t deviceplugin:0.1.0 .
#   docker build --build-arg BASE_IMAGE=registry.local/python:3.11-slim \
#                --build-arg PIP_INDEX_URL=https://mirror.local/simple -t deviceplugin:0.1.0 .
#
# Both stages start from the same base so the virtual environment built in the first one runs
# unchanged in the second. The final image adds to the base only that virtual environment: the
# package and its runtime dependencies, without pip or setuptools. No compilers, no pip cache, no
# sources. The base needs Python 3.11+ with pip and venv (python:*-slim images have both).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS builder
ARG PIP_INDEX_URL
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY deviceplugin ./deviceplugin
# A wheel of the package, installed with its dependencies into a fresh virtual environment that
# then drops its own installers (pip, setuptools): the final image copies only this directory.
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/deviceplugin \
 && /opt/deviceplugin/bin/pip install --no-cache-dir /wheels/deviceplugin-*.whl \
 && /opt/deviceplugin/bin/pip uninstall --yes pip setuptools \
 && /opt/deviceplugin/bin/deviceplugin --help > /dev/null

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="deviceplugin" \
      org.opencontainers.image.description="Kubernetes device plugin for NVIDIA GPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
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
