# Web, beat and control-worker image: Django/DRF/Channels/Celery without CUDA.
# Build from the repository root:  docker build -f docker/web.Dockerfile -t switchyard-web .
FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
COPY requirements.txt .
# The web process never imports torch, but the shared requirements pin the CPU build so that
# nothing pulls a CUDA wheel by accident.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 && pip install -r requirements.txt
COPY . .
EXPOSE 8000
CMD ["python", "-m", "uvicorn", "controlplane.config.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
