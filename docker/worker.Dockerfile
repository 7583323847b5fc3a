# GPU node image: the node agent and the engine replicas it starts (CUDA build of torch).
# Build:  docker build -f docker/worker.Dockerfile -t switchyard-worker .
# Run:    docker run --gpus all -e SWITCHYARD_NODE=gpu-1 -e DATABASE_URL=... -e REDIS_URL=... switchyard-worker
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip \
        libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY requirements.txt .
RUN python3.11 -m venv /venv && /venv/bin/pip install torch==2.13.0 \
    && grep -v -e '^torch==' -e '^mooncake-transfer-engine-non-cuda' requirements.txt > /tmp/req.txt && /venv/bin/pip install -r /tmp/req.txt \
    && /venv/bin/pip install mooncake-transfer-engine
COPY . .
ENV PATH=/venv/bin:$PATH
CMD ["python", "-m", "workers.agent"]
