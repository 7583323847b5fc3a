"""The contracts the control plane and the workers share, and nothing else: torch-free and
Django-free, so that the web process, the control worker, node agents and replicas all import
them. Each message is a typed dataclass with a `version`; both ends build and read it here.

- `replica`: gateway <-> replica (request stream messages, reply events, the status hash, the
  wire form of sampling parameters, replica specs, Redis key names).
- `control`: node agent <-> control worker (Celery task names and queues, replica events, node
  reports).
- `model_files`: what a model directory must hold, read without torch (the engine's loader and
  the catalog both check with it).
- `tokenizer`: a model's tokenizer and chat templates (the gateway tokenises prompts with it, the
  replica whatever the gateway could not); `errors`: RequestError, a request's own fault.
- `kv_blocks`: the chained KV block hash and each replica's Redis set of the blocks it holds
  (KV-aware routing).
- `suspects`: requests in flight on a replica after a replica died under them (the gateway
  writes them, a node agent reads them when a replica dies: a poison request costs one restart).
- `wire`: what the messages share (ProtocolError, the version check).
"""
