"""An OTLP/HTTP trace receiver: a real HTTP server on loopback that accepts
``POST /v1/traces`` (protobuf), decodes each export with the OpenTelemetry protos and keeps
the spans, flattened, for tests to look at; or, for a soak whose spans would not fit in
the test's memory, only counts the exports and their bytes (``keep=False``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from opentelemetry.proto.trace.v1.trace_pb2 import Status


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: str
    """``SERVER``, ``CLIENT``, ``INTERNAL``, ..."""
    trace_id: str
    span_id: str
    parent_id: str
    """Empty for a root span."""
    attributes: dict[str, Any]
    error: bool
    """Whether its status is ``ERROR``."""
    service: str
    start: int
    end: int


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {item.key: _value(item.value) for item in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


class OTLPReceiver:
    """The receiver; use as a context manager. ``spans`` grows as exports arrive (with
    ``keep``); ``exports`` and ``bytes`` count them."""

    def __init__(self, *, keep: bool = True) -> None:
        self.spans: list[ReceivedSpan] = []
        self.exports = 0
        self.bytes = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                if keep:
                    receiver.add(ExportTraceServiceRequest.FromString(body))
                with receiver._lock:
                    receiver.exports += 1
                    receiver.bytes += len(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The base endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def add(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {item.key: _value(item.value) for item in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            name=span.name,
                            kind=SpanProto.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            error=span.status.code == Status.STATUS_CODE_ERROR,
                            service=str(resource.get("service.name", "")),
                            start=span.start_time_unix_nano,
                            end=span.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.spans.extend(found)

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0
    ) -> list[ReceivedSpan]:
        """The spans received, once ``found`` holds of them (else after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if found(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.02)
