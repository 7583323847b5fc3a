"""The gateway's routing policies by name: what a CachePolicy may choose (its `routing` field's
choices) and the defaults. The names are owned here, below the gateway, so that the deployments
models take them without importing the gateway; how each policy picks a replica is
gateway/routing/policies.py's."""

ROUND_ROBIN = "round_robin"
LEAST_LOADED = "least_loaded"
SESSION = "session"
KV_AWARE = "kv_aware"
SESSION_KV_AWARE = "session+kv_aware"
POLICIES = (ROUND_ROBIN, LEAST_LOADED, SESSION, KV_AWARE, SESSION_KV_AWARE)
DEFAULT_POLICY = SESSION_KV_AWARE
DEFAULT_LOAD_FACTOR = 1.25
