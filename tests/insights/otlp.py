"""A real OTLP/HTTP receiver on loopback: decodes ExportTraceServiceRequest protobuf bodies."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    service_name: str


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.headers: list[dict[str, str]] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request, dict(self.headers))
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _add(self, request: ExportTraceServiceRequest, headers: dict[str, str]) -> None:
        with self._changed:
            self.headers.append(headers)
            for rs in request.resource_spans:
                service = next(
                    (_value(a.value) for a in rs.resource.attributes if a.key == "service.name"), ""
                )
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(
                            ReceivedSpan(
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_span_id=s.parent_span_id.hex(),
                                name=s.name,
                                kind=s.kind,
                                start_ns=s.start_time_unix_nano,
                                end_ns=s.end_time_unix_nano,
                                attributes={a.key: _value(a.value) for a in s.attributes},
                                status_code=s.status.code,
                                service_name=str(service),
                            )
                        )
            self._changed.notify_all()

    def wait_for_trace(self, trace_id: str, root_name_prefix: str, timeout: float = 30) -> list[ReceivedSpan]:
        """All spans of the trace once its root has arrived (the root ends last, exported last)."""

        def ready() -> bool:
            return any(s.trace_id == trace_id and s.name.startswith(root_name_prefix) for s in self.spans)

        with self._changed:
            if not self._changed.wait_for(ready, timeout=timeout):
                raise AssertionError(f"no trace {trace_id} within {timeout}s; got {len(self.spans)} spans")
            return [s for s in self.spans if s.trace_id == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()
