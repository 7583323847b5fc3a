"""Which replica serves a request: `policies` (pure functions: the rules), `router` (gathers
the facts a policy needs and routes), `dispatched` (requests in flight per replica, counted
atomically in Redis across web processes) and `quality` (routing-quality sums per deployment)."""
