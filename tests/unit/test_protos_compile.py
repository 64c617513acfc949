"""Everything under ``proto/`` compiles from that folder alone, as a client in another
language generates it: protoc with ``-I proto`` and nothing else but the well-known types
every protoc ships (grpc_tools' copy here). The shipped ``google/rpc`` files describe the
same messages the server packs into its error details."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"


def _well_known_include() -> Path:
    spec = importlib.util.find_spec("grpc_tools")
    assert spec is not None and spec.submodule_search_locations, "grpcio-tools is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "_proto"


def _every_proto() -> list[str]:
    return sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))


def _compile(tmp_path: Path) -> descriptor_pb2.FileDescriptorSet:
    out = tmp_path / "all.pb"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{_well_known_include()}",
            f"--descriptor_set_out={out}",
            *_every_proto(),
        ],
        cwd=tmp_path,  # not proto/: nothing may be found relative to the working directory
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"protoc failed:\n{done.stderr}{done.stdout}"
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def test_every_proto_compiles_from_the_proto_folder_alone(tmp_path: Path) -> None:
    files = _every_proto()
    assert "google/rpc/status.proto" in files
    assert "google/rpc/error_details.proto" in files
    assert "shardq/v1/jobs.proto" in files
    compiled = {f.name for f in _compile(tmp_path).file}
    assert set(files) <= compiled


def test_imports_resolve_to_the_folder_or_the_well_known_types(tmp_path: Path) -> None:
    """A client needs nothing but ``proto/`` and protoc's own ``google/protobuf``."""
    shipped = set(_every_proto())
    for f in _compile(tmp_path).file:
        for dep in f.dependency:
            assert dep in shipped or dep.startswith("google/protobuf/"), (f.name, dep)


def test_shipped_google_rpc_matches_what_the_server_sends(tmp_path: Path) -> None:
    """The copies describe the messages the coordinator packs (googleapis-common-protos'
    compiled descriptors): same package, messages, fields, numbers and types."""
    compiled = {f.name: f for f in _compile(tmp_path).file}
    for module in (status_pb2, error_details_pb2, code_pb2):
        runtime = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        shipped = compiled[runtime.name]
        assert shipped.package == runtime.package == "google.rpc"

        def shape(f: descriptor_pb2.FileDescriptorProto) -> object:
            def fields(m: descriptor_pb2.DescriptorProto) -> object:
                return (
                    m.name,
                    sorted((x.name, x.number, x.type, x.label, x.type_name) for x in m.field),
                    sorted(str(fields(n)) for n in m.nested_type),
                )

            return (
                sorted(str(fields(m)) for m in f.message_type),
                sorted((e.name, [(v.name, v.number) for v in e.value]) for e in f.enum_type),
            )

        assert shape(shipped) == shape(runtime), runtime.name
