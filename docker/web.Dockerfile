# Web, beat and control-worker image: Django/DRF/Channels/Celery and the admin console, no CUDA.
# Build from the repository root:  docker build -f docker/web.Dockerfile -t switchyard-web .
# (.dockerignore keeps .venv/, .switchyard/, node_modules/ and frontend/dist/ out of the context.)

# The admin console, built as `make frontend` builds it (Node.js >= 20.19).
FROM node:22-bookworm-slim AS console
WORKDIR /frontend
COPY frontend/package.json frontend/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error
COPY frontend/index.html frontend/vite.config.ts frontend/tsconfig.json ./
COPY frontend/src ./src
RUN npm run build

FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY requirements.txt .
# The web process never imports torch, but the shared requirements pin the CPU build so that
# nothing pulls a CUDA wheel by accident.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 && pip install -r requirements.txt
COPY . .
COPY --from=console /frontend/dist frontend/dist
# Not root; /state (SWITCHYARD_STATE_DIR in compose) is this user's, as make_private wants it.
RUN useradd --uid 10001 --create-home switchyard && mkdir -p /state && chown switchyard /state
USER 10001
EXPOSE 8000
CMD ["python", "-m", "uvicorn", "controlplane.config.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
