# GPU node image: the node agent and the engine replicas it starts (CUDA build of torch).
# Build:  docker build -f docker/worker.Dockerfile -t switchyard-worker .
# Run:    docker run --gpus all -e SWITCHYARD_NODE=gpu-1 -e REDIS_URL=redis://HOST:6379/0 \
#             -e MODEL_ROOTS=/models -v /models:/models:ro switchyard-worker
# The agent needs Redis only, never the database. Models must be at the same path as on the
# web and control-worker machines (/models): the control plane sends the agent that path.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DEBIAN_FRONTEND=noninteractive
# Ubuntu 24.04's own Python (3.12; it has no python3.11 package). Triton compiles a small
# launcher with the C compiler and Python's headers the first time a kernel runs.
# libibverbs + libnl: the Mooncake Transfer Engine loads them even for TCP transfers.
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
        libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY requirements.txt .
# torch 2.13.0 from PyPI brings its own CUDA libraries (CUDA 13: the host needs a driver that
# supports it); the CUDA build of the Mooncake Transfer Engine replaces the non-CUDA one.
RUN python3 -m venv /venv && /venv/bin/pip install torch==2.13.0 \
    && grep -v -e '^torch==' -e '^mooncake-transfer-engine-non-cuda' requirements.txt > /tmp/req.txt \
    && /venv/bin/pip install -r /tmp/req.txt && /venv/bin/pip install mooncake-transfer-engine==0.3.13.post1
COPY . .
ENV PATH=/venv/bin:$PATH
RUN useradd --uid 10001 --create-home switchyard && mkdir -p /state && chown switchyard /state
USER 10001
CMD ["python", "-m", "workers.agent"]
