"""Test-only replica process: reports itself ready through Redis like a real replica would, and
drains on SIGTERM. `--crash-after S` exits with code 3 after S seconds (to test restarts).

The supervisor tests use it because the real replica needs a model; it speaks the same
status protocol (see workers/agent/supervisor.py)."""

import argparse
import json
import os
import signal
import sys
import time

import redis

CRASH_FLAG = "switchyard:test:replicas-crash"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replica-id", type=int, required=True)
    parser.add_argument("--crash-after", type=float, default=None)
    args = parser.parse_args()
    client = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)
    key = f"switchyard:replica:{args.replica_id}:status"
    stopping = False

    def on_term(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    started = time.monotonic()
    print(f"fake replica {args.replica_id} pid {os.getpid()} starting", flush=True)
    if client.get(CRASH_FLAG):
        print("fake replica: cannot load model (crash flag set)", flush=True)
        return 3
    while not stopping:
        client.hset(
            key,
            mapping={
                "state": "ready",
                "load": json.dumps({"running": 0, "waiting": 0}),
                "endpoint": json.dumps({"pid": os.getpid()}),
                "heartbeat": f"{time.time():.3f}",
            },
        )
        if args.crash_after is not None and time.monotonic() - started > args.crash_after:
            print("fake replica crashing on purpose", flush=True)
            return 3
        time.sleep(0.1)
    client.hset(key, "state", "stopped")
    print("fake replica drained and stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
