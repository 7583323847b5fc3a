"""The contracts the control plane and the workers share, and nothing else: torch-free and
Django-free, so that the web process, the control worker, node agents and replicas all import
them. Each message is a typed dataclass with a `version`; both ends build and read it here.

- `control`: node agent <-> control worker (Celery task names and queues, replica specs,
  replica events, node reports).
"""
