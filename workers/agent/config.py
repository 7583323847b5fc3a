"""The node agent's settings, read from the environment: the variables and defaults of the
README's configuration table (the control plane's settings do not hold them; only agents read
them). The agent does not load Django: a GPU node needs Redis, not the database or the web
settings."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env(name: str, default: str) -> str:
    value = os.environ.get(name, "")
    return value if value != "" else default


@dataclass(frozen=True)
class AgentConfig:
    node: str
    hostname: str
    redis_url: str
    broker_url: str
    state_dir: Path
    heartbeat_seconds: float
    cpu_memory_bytes: int
    replica_command: str
    max_restarts: int
    backoff_seconds: float
    stop_timeout: float
    hang_seconds: float  # a ready replica silent this long is killed (and restarted)
    # Filled into every replica spec: they describe this node, not the deployment.
    cpu_kv_bytes: int
    cpu_threads: int
    kv_protocol: str
    kv_host: str
    # A replica of a deployment whose cache policy uses the KV store: the memory it lends the
    # store (0: the engine's default) and, over rdma, the devices it uses (empty: Mooncake's choice).
    kv_store_segment_bytes: int = 0
    kv_store_device: str = ""
    # How many "cpu" devices the node reports (a parallel replica takes one per rank); each
    # has the whole CPU_MEMORY_BYTES budget, since they share the machine's memory.
    cpu_devices: int = 1

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @classmethod
    def from_env(cls, node: str | None = None) -> AgentConfig:
        redis_url = _env("REDIS_URL", "redis://127.0.0.1:6379/0")
        return cls(
            node=node or _env("SWITCHYARD_NODE", socket.gethostname().split(".")[0]),
            hostname=socket.gethostname(),
            redis_url=redis_url,
            broker_url=_env("CELERY_BROKER_URL", redis_url),
            state_dir=Path(_env("SWITCHYARD_STATE_DIR", str(ROOT / ".switchyard"))),
            heartbeat_seconds=float(_env("NODE_HEARTBEAT_SECONDS", "2")),
            cpu_memory_bytes=int(_env("CPU_MEMORY_BYTES", str(8 << 30))),
            cpu_devices=max(1, int(_env("CPU_DEVICES", "1"))),
            replica_command=_env("REPLICA_COMMAND", "{python} -m workers.replica --replica-id {replica_id}"),
            max_restarts=int(_env("REPLICA_MAX_RESTARTS", "5")),
            backoff_seconds=float(_env("REPLICA_BACKOFF_SECONDS", "1")),
            stop_timeout=float(_env("REPLICA_STOP_TIMEOUT", "10")),
            hang_seconds=float(_env("REPLICA_HANG_SECONDS", "30")),
            cpu_kv_bytes=int(_env("REPLICA_CPU_KV_BYTES", str(512 << 20))),
            cpu_threads=int(_env("REPLICA_CPU_THREADS", "0")),
            kv_protocol=_env("KV_TRANSFER_PROTOCOL", "tcp"),
            kv_host=_env("KV_TRANSFER_HOST", "127.0.0.1"),
            kv_store_segment_bytes=int(_env("KV_STORE_SEGMENT_BYTES", "0")),
            kv_store_device=_env("KV_STORE_DEVICE", ""),
        )
