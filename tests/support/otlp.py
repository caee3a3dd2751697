"""A local OTLP profiles endpoint built on opentelemetry-proto's own servicer:
it keeps what it receives, decoded, and can reject a share of it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2 as svc,
)
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2_grpc as svc_grpc,
)
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb


@dataclass
class Received:
    requests: list[svc.ExportProfilesServiceRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Servicer(svc_grpc.ProfilesServiceServicer):
    def __init__(self, received: Received):
        self.received = received

    def Export(self, request: svc.ExportProfilesServiceRequest,
               context: grpc.ServicerContext) -> svc.ExportProfilesServiceResponse:
        with self.received.lock:
            self.received.requests.append(request)
            self.received.metadata.append(dict(context.invocation_metadata()))
        return svc.ExportProfilesServiceResponse()


@contextmanager
def otlp_server() -> Iterator[tuple[str, Received]]:
    received = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    svc_grpc.add_ProfilesServiceServicer_to_server(Servicer(received), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", received
    finally:
        server.stop(grace=None)


def stacks(req: svc.ExportProfilesServiceRequest, profile: pb.Profile
           ) -> list[tuple[list[str], int]]:
    """(function names root first, value) of each sample, through the dictionary."""
    d = req.dictionary
    out = []
    for s in profile.samples:
        names = []
        for li in d.stack_table[s.stack_index].location_indices:
            loc = d.location_table[li]
            for line in loc.lines:  # innermost (inlined) first, as the stack is leaf first
                names.append(d.string_table[d.function_table[line.function_index]
                                            .name_strindex])
        out.append((names[::-1], sum(s.values)))
    return out
