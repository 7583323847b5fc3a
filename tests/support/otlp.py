"""An OTLP/HTTP trace receiver for tests: what a web process with OTEL_EXPORTER_OTLP_ENDPOINT
exports, decoded into spans (opentelemetry-proto's), in arrival order."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, list]]:
    """Yields (the endpoint to export to, the list the received spans are appended to)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans: list = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            exported = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
            spans.extend(span for rs in exported.resource_spans for ss in rs.scope_spans for span in ss.spans)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", spans
    finally:
        server.shutdown()
