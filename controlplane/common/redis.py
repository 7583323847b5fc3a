"""One Redis client per process, from REDIS_URL."""

from functools import lru_cache

import redis
from django.conf import settings


@lru_cache(maxsize=1)
def client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True, socket_timeout=5, socket_connect_timeout=2)
