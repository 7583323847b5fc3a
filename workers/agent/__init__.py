"""The node agent: a Celery worker per machine (queue `node.<name>`) that reports the machine's
devices and supervises its replica processes."""
