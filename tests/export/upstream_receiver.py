"""A backend's receiving end built only from upstream definitions, run as a
process of its own by test_conformance.py: a gRPC server from the code
grpcio-tools generated from tests/export/protos/ (or from the
opentelemetry-proto package), which decodes every request with those
definitions and writes it as one JSON line.

    python upstream_receiver.py WIRE GENERATED_DIR OUTPUT

It prints the port it listens on. A process of its own because ember's
subset protos declare the same proto packages (push.v1,
parca.profilestore.v1alpha1) in ember's process, and one descriptor pool
holds a name once. Nothing of ember is imported here.
"""

from __future__ import annotations

import gzip
import importlib
import json
import sys
import threading
import types
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message


def as_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


class Recorder:
    def __init__(self, output: Path):
        self.output = output
        self.lock = threading.Lock()

    def write(self, request: Message, context: grpc.ServicerContext, **extra: Any) -> None:
        line = {"request": as_dict(request), "metadata": dict(context.invocation_metadata()),
                **extra}
        with self.lock, self.output.open("a") as f:
            f.write(json.dumps(line) + "\n")


def pprofs(raw_profiles: list[bytes]) -> list[dict[str, Any]]:
    """Each gzip pprof decoded with google/pprof's profile.proto."""
    profile_pb2 = importlib.import_module("profile_pb2")
    return [as_dict(profile_pb2.Profile.FromString(gzip.decompress(raw)))
            for raw in raw_profiles]


def pyroscope(server: grpc.Server, rec: Recorder, generated: Path) -> None:
    # Pyroscope's proto package "types" is also the name of a standard module:
    # the generated `from types.v1 import types_pb2` finds it through this path.
    types.__path__ = [str(generated / "types")]  # type: ignore[attr-defined]
    push_pb2 = importlib.import_module("push.v1.push_pb2")
    push_grpc = importlib.import_module("push.v1.push_pb2_grpc")

    class Pusher(push_grpc.PusherServiceServicer):  # type: ignore[misc,name-defined]
        def Push(self, request: Any, context: grpc.ServicerContext) -> Any:
            rec.write(request, context, pprof=pprofs(
                [s.raw_profile for series in request.series for s in series.samples]))
            return push_pb2.PushResponse()

    push_grpc.add_PusherServiceServicer_to_server(Pusher(), server)


def parca(server: grpc.Server, rec: Recorder, generated: Path) -> None:
    ps_pb2 = importlib.import_module("parca.profilestore.v1alpha1.profilestore_pb2")
    ps_grpc = importlib.import_module("parca.profilestore.v1alpha1.profilestore_pb2_grpc")

    class Store(ps_grpc.ProfileStoreServiceServicer):  # type: ignore[misc,name-defined]
        def WriteRaw(self, request: Any, context: grpc.ServicerContext) -> Any:
            rec.write(request, context, pprof=pprofs(
                [s.raw_profile for series in request.series for s in series.samples]))
            return ps_pb2.WriteRawResponse()

    ps_grpc.add_ProfileStoreServiceServicer_to_server(Store(), server)


def otlp(server: grpc.Server, rec: Recorder, generated: Path) -> None:
    from opentelemetry.proto.collector.profiles.v1development import (
        profiles_service_pb2 as svc,
    )
    from opentelemetry.proto.collector.profiles.v1development import (
        profiles_service_pb2_grpc as svc_grpc,
    )

    class Profiles(svc_grpc.ProfilesServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
            rec.write(request, context)
            return svc.ExportProfilesServiceResponse()

    svc_grpc.add_ProfilesServiceServicer_to_server(Profiles(), server)  # type: ignore[no-untyped-call]


RECEIVERS = {"pyroscope": pyroscope, "writeraw": parca, "otlp": otlp}


def main() -> None:
    wire, generated, output = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    sys.path.insert(0, str(generated))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    RECEIVERS[wire](server, Recorder(output), generated)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
