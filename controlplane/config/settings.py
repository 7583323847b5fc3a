"""Django settings. Every value comes from the environment through one django-environ `env`;
production differs from development by environment variables only (see README)."""

from __future__ import annotations

import secrets
from pathlib import Path

import environ

from workers.state_dir import make_private

BASE_DIR = Path(__file__).resolve().parents[2]
env = environ.Env()

STATE_DIR = Path(env("SWITCHYARD_STATE_DIR", default=str(BASE_DIR / ".switchyard")))
# Owner-only (0700/0600) and a 077 umask for this process and those it starts: the database,
# secret key and logs hold secrets.
make_private(STATE_DIR)


def _dev_secret_key() -> str:
    """Generated once and kept, so sessions survive restarts on a dev machine."""
    path = STATE_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env("SECRET_KEY", default=None) or _dev_secret_key()
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{STATE_DIR / 'db.sqlite3'}")}
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=0))
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several processes (web, beat, control worker) share the file. WAL lets readers and one
    # writer work at once; a writer waits up to 20 s for the lock, and takes it when its
    # transaction begins (IMMEDIATE), so that two transactions never deadlock upgrading a read
    # lock into a write lock (that gives "database is locked" at once, whatever the timeout).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
# Local model directories may only be registered from under these (symlinks resolved).
MODEL_ROOTS = env.list("MODEL_ROOTS", default=[str(BASE_DIR / "workers" / "demo"), str(STATE_DIR / "models")])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served from /static/ (the docs work offline)
    "channels",
    "controlplane.common",
    "controlplane.events",
    "controlplane.catalog",
    "controlplane.inventory",
    "controlplane.deployments",
    "controlplane.autoscaling",
    "controlplane.gateway",
    "controlplane.batches",
    "controlplane.usage",
    "controlplane.telemetry",
    "controlplane.planner",
    "controlplane.console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "controlplane.config.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ASGI_APPLICATION = "controlplane.config.asgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "/static/"  # served by controlplane.config.views.static from the apps' static dirs
CSRF_FAILURE_VIEW = "controlplane.config.views.csrf_failure"
STATIC_ROOT = STATE_DIR / "static"

# Request limits on every surface (/v1, /api/v1, websockets). 8 MiB holds the longest prompts
# served: a 1M-token text prompt (~4 bytes a token) or a 256k-token prompt sent as token ids
# (~7 bytes each), with room for JSON escaping; a request over it is a 413 before it is parsed.
# 64 levels are far more than any tool schema nests and far fewer than what recurses per level
# later (json, chat templates) can take.
MAX_REQUEST_BYTES = env.int("MAX_REQUEST_BYTES", default=8 << 20)
MAX_JSON_DEPTH = env.int("MAX_JSON_DEPTH", default=64)
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BYTES  # Django's own check (request.body, forms)
# The Batch API (controlplane/batches): an uploaded file of requests may be larger (OpenAI's
# limits: 200 MB, 50,000 lines), kept under BATCH_FILES_DIR.
MAX_UPLOAD_BYTES = env.int("MAX_UPLOAD_BYTES", default=200 << 20)
BATCH_MAX_LINES = env.int("BATCH_MAX_LINES", default=50_000)
BATCH_FILES_DIR = Path(env("BATCH_FILES_DIR", default="") or STATE_DIR / "files")
# Where the control worker's batch dispatcher sends a batch's lines: the web process's own API.
GATEWAY_URL = env("GATEWAY_URL", default="http://127.0.0.1:8000")
# The share of a deployment's sequence slots a batch may fill, less the interactive requests there.
BATCH_FILL = env.float("BATCH_FILL", default=0.5)
# Usage per tenant (controlplane/usage): hourly rows older than this are deleted.
USAGE_RETENTION_DAYS = env.int("USAGE_RETENTION_DAYS", default=90)

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": env("CHANNELS_PREFIX", default="asgi")},
    }
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.common.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.common.permissions.StaffWritesOrReadOnly"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.common.pagination.Pagination",
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "controlplane.common.schema.AutoSchema",  # with the error responses
    "EXCEPTION_HANDLER": "controlplane.common.errors.exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.common.parsers.JSONParser",  # within MAX_REQUEST_BYTES and MAX_JSON_DEPTH
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Switchyard management API",
    "DESCRIPTION": "Models, deployments, replicas, GPU inventory, cache policies and API keys.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI from drf-spectacular-sidecar instead of a CDN, and no online spec validator.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
}

# Celery: a control queue for the reconciler, one queue per node for its agent.
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A broker (Redis) outage is waited out, never fatal: workers reconnect when it returns.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BEAT_SCHEDULE = {
    "reconcile": {"task": "deployments.reconcile", "schedule": env.float("RECONCILE_INTERVAL", default=10.0)},
    "check-nodes": {"task": "inventory.check_nodes", "schedule": env.float("NODE_CHECK_INTERVAL", default=5.0)},
    "telemetry": {"task": "telemetry.sample", "schedule": env.float("TELEMETRY_INTERVAL", default=1.0)},
    "autoscale": {"task": "autoscaling.tick", "schedule": env.float("AUTOSCALE_INTERVAL", default=15.0)},
    "usage": {"task": "usage.flush", "schedule": env.float("USAGE_FLUSH_INTERVAL", default=10.0)},
    "batches": {"task": "batches.dispatch", "schedule": env.float("BATCH_DISPATCH_INTERVAL", default=2.0)},
}

# The control plane's side of nodes and replicas. A node agent's own settings (REPLICA_COMMAND,
# REPLICA_MAX_RESTARTS, KV_TRANSFER_HOST, ...) are read from its environment by
# workers/agent/config.py: the agent does not load Django.
SWITCHYARD = {
    "NODE_STALE_SECONDS": env.float("NODE_STALE_SECONDS", default=15.0),
    "CPU_REPLICAS_PER_DEVICE": env.int("CPU_REPLICAS_PER_DEVICE", default=4),
    # A deployment gives up starting replicas after this many failed ones of its generation,
    # counted since one of them was last ready for REPLICA_HEALTHY_SECONDS.
    "REPLICA_FAILURE_BUDGET": env.int("REPLICA_FAILURE_BUDGET", default=3),
    "REPLICA_HEALTHY_SECONDS": env.float("REPLICA_HEALTHY_SECONDS", default=300.0),
    # Disaggregated deployments (sent in each replica spec): a decode replica that gets no KV
    # within the timeout prefills the request itself.
    "KV_TRANSFER_TIMEOUT": env.float("KV_TRANSFER_TIMEOUT", default=2.0),
    # Prompts shorter than this are prefilled by the decode replica itself.
    "PD_LOCAL_PREFILL_TOKENS": env.int("PD_LOCAL_PREFILL_TOKENS", default=256),
    # The fleet's Mooncake Store: "host:port" of its mooncake_master, run by the operator beside
    # Redis (make run starts one). Empty: no cache policy may turn store_tier on.
    "KV_STORE_MASTER": env("SWITCHYARD_KV_STORE_MASTER", default=""),
    # "host:port" of that master's metrics (its --metrics_port): replicas read the pool's
    # capacity and use there, and wait for it before connecting. Optional.
    "KV_STORE_METRICS": env("SWITCHYARD_KV_STORE_METRICS", default=""),
    # /metrics is open unless this is set (then Prometheus sends it as a Bearer token).
    "METRICS_TOKEN": env("METRICS_TOKEN", default=""),
    # A request whose replica dies, hangs or restarts mid-way resumes on another ready replica.
    "FAILOVER": env.bool("FAILOVER", default=True),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
}
