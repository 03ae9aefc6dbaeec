"""Chakra protobuf side: schema drift, reader, writer, attribute helpers, dumping."""

from __future__ import annotations

import contextlib
import gzip
import io
import pickle
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import wire_decoder
from linker.write import chakra_wire as chakra_io
from linker.model import et_def_pb2 as pb
from linker.write.chakra_wire import EtWriter, TraceFormatError, open_et, read_et
from linker.model.errors import TraceInputError
from conftest import shared_reason

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "schema" / "et_def.proto"
SHARED = Path(__file__).resolve().parents[2] / "shared"
REAL_ET = SHARED / "traces" / "chakra_protobuf" / "chakra.0.et.gz"


def real_et() -> Path:
    if not REAL_ET.exists():
        pytest.skip(shared_reason(REAL_ET))
    return REAL_ET


# =============================================================================================
# Schema drift: a small .proto parser, compared with the committed generated module
# =============================================================================================

_TOKEN = re.compile(
    r'(?P<skip>\s+|//[^\n]*|/\*.*?\*/)|(?P<tok>"(?:[^"\\]|\\.)*"|[A-Za-z_][\w.]*|-?\d+|[{}=;<>,\[\]()])',
    re.S,
)
SCALAR_TYPES = {
    "double": "TYPE_DOUBLE", "float": "TYPE_FLOAT", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "uint32": "TYPE_UINT32", "uint64": "TYPE_UINT64", "sint32": "TYPE_SINT32", "sint64": "TYPE_SINT64",
    "fixed32": "TYPE_FIXED32", "fixed64": "TYPE_FIXED64", "sfixed32": "TYPE_SFIXED32",
    "sfixed64": "TYPE_SFIXED64", "bool": "TYPE_BOOL", "string": "TYPE_STRING", "bytes": "TYPE_BYTES",
}


@dataclass
class ParsedField:
    name: str
    number: int
    label: str  # "repeated", "optional" (proto3 explicit presence) or ""
    type_name: str  # as written
    oneof: str | None


@dataclass
class ParsedMessage:
    full_name: str
    fields: list[ParsedField] = field(default_factory=list)
    oneofs: list[str] = field(default_factory=list)


@dataclass
class ParsedSchema:
    package: str = ""
    messages: dict[str, ParsedMessage] = field(default_factory=dict)
    enums: dict[str, dict[str, int]] = field(default_factory=dict)


def tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    for match in _TOKEN.finditer(text):
        if match.start() != pos:
            raise ValueError(f"unexpected character at {pos}: {text[pos:pos + 20]!r}")
        pos = match.end()
        if match.group("tok"):
            tokens.append(match.group("tok"))
    if pos != len(text):
        raise ValueError(f"unexpected character at {pos}")
    return tokens


class ProtoParser:
    """Recursive descent over the proto3 subset the schema uses (no maps, services, extensions)."""

    def __init__(self, text: str):
        self.tokens = tokenize(text)
        self.pos = 0
        self.schema = ParsedSchema()

    def peek(self) -> str:
        return self.tokens[self.pos]

    def take(self, expected: str | None = None) -> str:
        token = self.tokens[self.pos]
        if expected is not None and token != expected:
            raise ValueError(f"expected {expected!r}, got {token!r} at token {self.pos}")
        self.pos += 1
        return token

    def skip_statement(self) -> None:
        while self.take() != ";":
            pass

    def parse(self) -> ParsedSchema:
        while self.pos < len(self.tokens):
            token = self.peek()
            if token == "package":
                self.take()
                self.schema.package = self.take()
                self.take(";")
            elif token in ("syntax", "option", "import"):
                self.skip_statement()
            elif token == "message":
                self.message(self.schema.package)
            elif token == "enum":
                self.enum(self.schema.package)
            else:
                raise ValueError(f"unexpected top-level token {token!r}")
        return self.schema

    def message(self, scope: str) -> None:
        self.take("message")
        message = ParsedMessage(f"{scope}.{self.take()}")
        self.schema.messages[message.full_name] = message
        self.take("{")
        while self.peek() != "}":
            token = self.peek()
            if token == "message":
                self.message(message.full_name)
            elif token == "enum":
                self.enum(message.full_name)
            elif token == "oneof":
                self.take()
                name = self.take()
                message.oneofs.append(name)
                self.take("{")
                while self.peek() != "}":
                    message.fields.append(self.field(name))
                self.take("}")
            elif token in ("option", "reserved"):
                self.skip_statement()
            elif token == ";":
                self.take()
            else:
                message.fields.append(self.field(None))
        self.take("}")

    def field(self, oneof: str | None) -> ParsedField:
        label = self.take() if self.peek() in ("repeated", "optional") else ""
        type_name = self.take()
        name = self.take()
        self.take("=")
        number = int(self.take())
        if self.peek() == "[":
            while self.take() != "]":
                pass
        self.take(";")
        return ParsedField(name, number, label, type_name, oneof)

    def enum(self, scope: str) -> None:
        self.take("enum")
        values: dict[str, int] = {}
        self.schema.enums[f"{scope}.{self.take()}"] = values
        self.take("{")
        while self.peek() != "}":
            if self.peek() in ("option", "reserved"):
                self.skip_statement()
                continue
            name = self.take()
            self.take("=")
            values[name] = int(self.take())
            if self.peek() == "[":
                while self.take() != "]":
                    pass
            self.take(";")
        self.take("}")


def resolve_type(schema: ParsedSchema, scope: str, type_name: str) -> str:
    """Full name of a message/enum type named in ``scope`` (protobuf scoping: innermost first)."""
    if type_name.startswith("."):
        return type_name[1:]
    parts = scope.split(".")
    for depth in range(len(parts), -1, -1):
        candidate = ".".join(parts[:depth] + [type_name])
        if candidate in schema.messages or candidate in schema.enums:
            return candidate
    raise ValueError(f"unknown type {type_name!r} in {scope}")


def descriptor_messages(file_descriptor) -> dict:
    out = {}
    stack = list(file_descriptor.message_types_by_name.values())
    while stack:
        message = stack.pop()
        out[message.full_name] = message
        stack.extend(message.nested_types)
    return out


def descriptor_enums(file_descriptor) -> dict:
    out = {e.full_name: e for e in file_descriptor.enum_types_by_name.values()}
    for message in descriptor_messages(file_descriptor).values():
        out.update({e.full_name: e for e in message.enum_types})
    return out


def is_synthetic_oneof(oneof) -> bool:
    """protoc wraps each proto3 ``optional`` field in a oneof named '_<field>'."""
    return len(oneof.fields) == 1 and oneof.name == "_" + oneof.fields[0].name


def descriptor_label(fd) -> str:
    repeated = getattr(fd, "is_repeated", None)
    if repeated is None:
        repeated = fd.label == fd.LABEL_REPEATED
    if repeated:
        return "repeated"
    if fd.containing_oneof is not None and is_synthetic_oneof(fd.containing_oneof):
        return "optional"
    return ""


def schema_differences(schema: ParsedSchema, file_descriptor) -> list[str]:
    """Every difference between the parsed .proto and a FileDescriptor, as readable strings."""
    problems: list[str] = []
    if schema.package != file_descriptor.package:
        problems.append(f"package {schema.package!r} != {file_descriptor.package!r}")
    messages = descriptor_messages(file_descriptor)
    enums = descriptor_enums(file_descriptor)
    for name in sorted(set(schema.messages) ^ set(messages)):
        problems.append(f"message {name} only in {'proto' if name in schema.messages else 'module'}")
    for name in sorted(set(schema.enums) ^ set(enums)):
        problems.append(f"enum {name} only in {'proto' if name in schema.enums else 'module'}")
    for name in sorted(set(schema.enums) & set(enums)):
        module_values = {v.name: v.number for v in enums[name].values}
        if schema.enums[name] != module_values:
            problems.append(f"enum {name}: proto {schema.enums[name]} != module {module_values}")
    for name in sorted(set(schema.messages) & set(messages)):
        problems.extend(_message_differences(schema, schema.messages[name], messages[name]))
    return problems


def _message_differences(schema: ParsedSchema, parsed: ParsedMessage, descriptor) -> list[str]:
    problems = []
    real_oneofs = [o.name for o in descriptor.oneofs if not is_synthetic_oneof(o)]
    if sorted(parsed.oneofs) != sorted(real_oneofs):
        problems.append(f"{parsed.full_name}: oneofs {parsed.oneofs} != {real_oneofs}")
    by_name = {f.name: f for f in descriptor.fields}
    for name in sorted({f.name for f in parsed.fields} ^ set(by_name)):
        problems.append(f"{parsed.full_name}.{name} only in one side")
    for pf in parsed.fields:
        fd = by_name.get(pf.name)
        if fd is None:
            continue
        where = f"{parsed.full_name}.{pf.name}"
        if pf.number != fd.number:
            problems.append(f"{where}: number {pf.number} != {fd.number}")
        if pf.label != descriptor_label(fd):
            problems.append(f"{where}: label {pf.label!r} != {descriptor_label(fd)!r}")
        oneof = fd.containing_oneof
        module_oneof = oneof.name if oneof is not None and not is_synthetic_oneof(oneof) else None
        if pf.oneof != module_oneof:
            problems.append(f"{where}: oneof {pf.oneof} != {module_oneof}")
        problems.extend(_type_differences(schema, parsed.full_name, pf, fd, where))
    return problems


def _type_differences(schema: ParsedSchema, scope: str, pf: ParsedField, fd, where: str) -> list[str]:
    if pf.type_name in SCALAR_TYPES:
        expected = getattr(fd, SCALAR_TYPES[pf.type_name])
        return [] if fd.type == expected else [f"{where}: type {pf.type_name} != module type {fd.type}"]
    full = resolve_type(schema, scope, pf.type_name)
    if full in schema.enums:
        ok = fd.type == fd.TYPE_ENUM and fd.enum_type.full_name == full
    else:
        ok = fd.type == fd.TYPE_MESSAGE and fd.message_type.full_name == full
    return [] if ok else [f"{where}: type {full} differs in the module"]


def test_proto_matches_generated_module():
    schema = ProtoParser(SCHEMA.read_text()).parse()
    assert schema.package == "ChakraProtoMsg"
    assert "ChakraProtoMsg.Node" in schema.messages and "ChakraProtoMsg.FsOp.Op" in schema.enums
    assert schema_differences(schema, pb.DESCRIPTOR) == []


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("uint64 duration_micros = 7;", "uint64 duration_micros = 17;", "duration_micros: number 17 != 7"),
        ("COMM_COLL_NODE = 7;", "COMM_COLL_NODE = 8;", "enum ChakraProtoMsg.NodeType"),
        ("repeated uint64 data_deps = 5;", "uint64 data_deps = 5;", "data_deps: label '' != 'repeated'"),
        ("int64 int64_val = 9;", "uint64 int64_val = 9;", "int64_val: type uint64"),
        ("  string strides = 4;\n", "", "IOInfo.strides only in one side"),
        ("message Tensor {", "message Tensors {", "message ChakraProtoMsg.Tensors only in proto"),
        ("optional StorageInfo storage = 11;", "StorageInfo storage = 11;", "storage: label '' != 'optional'"),
    ],
)
def test_drift_check_detects_a_changed_schema(old, new, expected):
    text = SCHEMA.read_text()
    assert old in text
    problems = schema_differences(ProtoParser(text.replace(old, new, 1)).parse(), pb.DESCRIPTOR)
    assert any(expected in p for p in problems), problems


def test_drift_check_detects_a_field_moved_out_of_its_oneof():
    text = SCHEMA.read_text().replace("    bytes bytes_val = 31;\n", "", 1)
    text = text.replace("message DoubleList", "message Extra { bytes bytes_val = 31; }\nmessage DoubleList", 1)
    problems = schema_differences(ProtoParser(text).parse(), pb.DESCRIPTOR)
    assert any("AttributeProto.bytes_val only in one side" in p for p in problems), problems


def test_chakra_wire_facts():
    """Field numbers / enum values that consumers of Chakra files depend on (spot check)."""
    node = pb.Node.DESCRIPTOR.fields_by_name
    assert [node[n].number for n in ("id", "name", "type", "ctrl_deps", "data_deps")] == [1, 2, 3, 4, 5]
    assert node["duration_micros"].number == 7 and node["attr"].number == 10
    attr = pb.AttributeProto.DESCRIPTOR.fields_by_name
    assert (attr["int64_val"].number, attr["uint64_val"].number, attr["bool_val"].number) == (9, 13, 27)
    assert (attr["string_val"].number, attr["bool_list"].number) == (29, 28)
    assert (pb.COMP_NODE, pb.COMM_COLL_NODE, pb.METADATA_NODE) == (4, 7, 1)
    assert (pb.ALL_REDUCE, pb.BROADCAST, pb.ALL_TO_ALL, pb.BARRIER) == (0, 5, 6, 9)


def committed_protoc_version() -> str | None:
    """The protoc version scripts/gen_proto.py expects, if that protoc is on PATH."""
    protoc = shutil.which("protoc")
    if protoc is None:
        return None
    version = subprocess.run([protoc, "--version"], capture_output=True, text=True).stdout.split()[-1]
    return version if version.startswith("3.21.") else None


@pytest.mark.skipif(committed_protoc_version() is None, reason="protoc 3.21 (Debian bookworm) not installed")
def test_generated_module_is_what_protoc_makes():
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_proto.py"), "--check"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_messages_pickle_for_multiprocessing():
    node = pb.Node(id=9, name="aten::mm", type=pb.COMP_NODE, ctrl_deps=[1])
    assert type(node).__module__ == "linker.model.et_def_pb2"
    assert pickle.loads(pickle.dumps(node)) == node


# =============================================================================================
# The real Chakra file
# =============================================================================================


def test_real_file_message_counts():
    messages = list(read_et(real_et()))
    assert isinstance(messages[0], pb.GlobalMetadata)
    nodes = messages[1:]
    assert all(isinstance(n, pb.Node) for n in nodes)
    assert len(nodes) == 3664
    types = [n.type for n in nodes]
    assert types.count(pb.COMP_NODE) == 3643 and types.count(pb.COMM_COLL_NODE) == 21


def test_real_file_metadata_attrs():
    with open_et(real_et()) as reader:
        md = reader.metadata
        assert chakra_io.find_attr(md, "schema").WhichOneof("value") == "string_val"
        assert chakra_io.find_attr(md, "pid").WhichOneof("value") == "uint64_val"
        assert chakra_io.find_attr(md, "start_ts").WhichOneof("value") == "uint64_val"
        assert chakra_io.get_attr(md, "schema") == "1.0.1"
        assert chakra_io.get_attr(md, "finish_ts") > chakra_io.get_attr(md, "start_ts")
        first = next(reader.nodes())
    assert first.id > 0 and first.name


def test_wire_decoder_agrees_with_generated_module():
    frames = wire_decoder.read_stream(real_et())
    messages = list(read_et(real_et()))
    assert len(frames) == len(messages)
    md = wire_decoder.decode_metadata(frames[0])
    assert [a[1] for a in md[2]] == [a.name for a in messages[0].attr]
    assert [a.get(29, a.get(13)) for a in md[2]] == [chakra_io.attr_value(a) for a in messages[0].attr]
    for frame, node in zip(frames[1:], messages[1:]):
        raw = wire_decoder.decode_node(frame)
        assert raw[1] == [node.id]
        assert raw[2] == [node.name]
        assert raw[3] == [node.type]
        assert raw.get(4, []) == list(node.ctrl_deps)
        assert raw.get(5, []) == list(node.data_deps)
        assert raw.get(7, [0]) == [node.duration_micros]
        assert raw[8][0].get(1, "") == node.inputs.values and raw[9][0].get(3, "") == node.outputs.types
        decoded_attrs = [(a[1], _wire_attr_value(a)) for a in raw.get(10, [])]
        assert decoded_attrs == [(a.name, chakra_io.attr_value(a)) for a in node.attr]


def _wire_attr_value(attr: dict) -> object:
    values = [v for k, v in attr.items() if k not in (1, 2)]
    assert len(values) == 1
    return values[0]


def test_wire_decoder_matches_on_every_attribute_kind(tmp_path):
    attrs = [
        chakra_io.make_attr("i", -5), chakra_io.make_attr("u", 2**63 + 1, "uint64_val"),
        chakra_io.make_attr("s32", -7, "sint32_val"), chakra_io.make_attr("d", 1.25),
        chakra_io.make_attr("f", 0.5, "float_val"), chakra_io.make_attr("b", True),
        chakra_io.make_attr("str", "x\u00e9"), chakra_io.make_attr("il", [1, -2, 3]),
        chakra_io.make_attr("bl", [True, False]), chakra_io.make_attr("sl", ["a", "b"]),
        chakra_io.make_attr("i32", -3, "int32_val"), chakra_io.make_attr("sf64", -9, "sfixed64_val"),
    ]
    path = tmp_path / "kinds.et"
    with EtWriter(path) as writer:
        writer.write_metadata(pb.GlobalMetadata(version="0.0.4"))
        writer.write_node(pb.Node(id=1, name="n", type=pb.COMP_NODE, attr=attrs))
    raw = wire_decoder.decode_node(wire_decoder.read_stream(path)[1])
    decoded = {a[1]: _wire_attr_value(a) for a in raw[10]}
    assert decoded == {a.name: chakra_io.attr_value(a) for a in attrs}
    assert decoded["u"] == 2**63 + 1 and decoded["il"] == [1, -2, 3] and decoded["sf64"] == -9


# =============================================================================================
# Writer and reader on synthetic files
# =============================================================================================


def sample_metadata() -> pb.GlobalMetadata:
    return pb.GlobalMetadata(
        attr=[chakra_io.make_attr("schema", "1.1.1-chakra.0.0.4"), chakra_io.make_attr("pid", 42, "uint64_val")]
    )


def sample_nodes(count: int) -> list[pb.Node]:
    nodes = []
    for i in range(1, count + 1):
        node = pb.Node(id=i, name=f"op{i}", type=pb.COMP_NODE, duration_micros=i * 3)
        if i > 1:
            node.ctrl_deps.append(1)
            node.data_deps.append(i - 1)
        node.attr.append(chakra_io.make_attr("is_cpu_op", True))
        node.inputs.values = f"[{i}]"
        nodes.append(node)
    return nodes


def write_et(path: Path, metadata: pb.GlobalMetadata, nodes: list[pb.Node]) -> None:
    with EtWriter(path) as writer:
        writer.write_metadata(metadata)
        for node in nodes:
            writer.write_node(node)


@pytest.mark.parametrize("name", ["t.et", "t.et.gz"])
def test_round_trip(tmp_path, name):
    path = tmp_path / name
    nodes = sample_nodes(50)
    write_et(path, sample_metadata(), nodes)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    with open_et(path) as reader:
        assert reader.metadata == sample_metadata()
        assert list(reader.nodes()) == nodes
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temp file left


def test_gzip_detected_by_content_not_suffix(tmp_path):
    gz = tmp_path / "a.et.gz"
    write_et(gz, sample_metadata(), sample_nodes(3))
    renamed = tmp_path / "compressed_but_named.et"
    gz.rename(renamed)
    plain = tmp_path / "plain_but_named.et.gz"
    plain.write_bytes(gzip.decompress(renamed.read_bytes()))
    assert [n.id for n in list(read_et(renamed))[1:]] == [1, 2, 3]
    assert [n.id for n in list(read_et(plain))[1:]] == [1, 2, 3]


def test_frames_across_read_chunks_and_a_frame_larger_than_a_chunk(tmp_path):
    nodes = sample_nodes(20_000)  # ~0.7 MB of frames: crosses chunk boundaries
    nodes[10_000].name = "x" * (chakra_io.READ_CHUNK_BYTES * 3 // 2)
    path = tmp_path / "big.et"
    write_et(path, sample_metadata(), nodes)
    with open_et(path) as reader:
        read_back = list(reader.nodes())
    assert len(read_back) == 20_000
    assert read_back[10_000].name == nodes[10_000].name
    assert read_back[-1] == nodes[-1]


def test_reader_streams_nodes_before_a_corrupt_tail(tmp_path):
    path = tmp_path / "tail.et"
    write_et(path, sample_metadata(), sample_nodes(5))
    with open(path, "ab") as f:
        f.write(chakra_io.encode_varint(1000) + b"\x08\x01")  # a frame promising 1000 bytes
    seen = []
    with pytest.raises(TraceFormatError, match="truncated"):
        for node in read_et(path):
            seen.append(node)
    assert len(seen) == 6  # metadata + 5 nodes came out before the error


def test_writer_discards_output_on_exception(tmp_path):
    path = tmp_path / "out.et.gz"
    path.write_bytes(b"previous content")
    with pytest.raises(RuntimeError, match="boom"):
        with EtWriter(path) as writer:
            writer.write_metadata(sample_metadata())
            writer.write_node(sample_nodes(1)[0])
            raise RuntimeError("boom")
    assert path.read_bytes() == b"previous content"
    assert [p.name for p in tmp_path.iterdir()] == ["out.et.gz"]


@pytest.mark.parametrize("name", ["b.et", "b.et.gz"])
def test_background_writer_writes_the_same_bytes(tmp_path, name):
    """A writer thread (``background=True``) gives the file a plain writer gives, through every
    way of writing: messages, framed bytes, frames copied from a stream; small flush blocks make
    many blocks wait for the thread."""
    nodes = sample_nodes(200)
    frames = b"".join(chakra_io.encode_varint(len(n.SerializeToString())) + n.SerializeToString() for n in nodes)
    paths = []
    for background in (False, True):
        path = tmp_path / f"{background}{name}"
        with EtWriter(path, background=background, flush_bytes=64) as writer:
            writer.write_metadata(sample_metadata())
            for node in nodes:
                writer.write_node(node)
            writer.write_frames_bytes(frames, len(nodes))
        assert writer.nodes_written == 2 * len(nodes)
        paths.append(path)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert len(list(read_et(paths[1]))) == 1 + 2 * len(nodes)


def test_background_writer_error_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "out.et"
    path.write_bytes(b"previous content")

    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            raise OSError(28, "No space left on device")

    real_output = chakra_io.atomic_output

    @contextlib.contextmanager
    def failing_output(target, protected=()):
        with real_output(target, protected) as real:  # the temporary file, deleted on error
            del real
            yield Full()

    monkeypatch.setattr(chakra_io, "atomic_output", failing_output)
    with pytest.raises(TraceInputError, match="space"):
        with EtWriter(path, background=True) as writer:
            writer.write_metadata(sample_metadata())
            writer.write_frames_bytes(b"\x02\x08\x01", 1)
    assert path.read_bytes() == b"previous content"
    assert [p.name for p in tmp_path.iterdir()] == ["out.et"]


def test_writer_requires_metadata_first_and_non_empty(tmp_path):
    path = tmp_path / "x.et"
    with pytest.raises(ValueError, match="no GlobalMetadata"):
        with EtWriter(path):
            pass
    assert not path.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="write_metadata must be called"):
        with EtWriter(path) as writer:
            writer.write_node(pb.Node(id=1))
    with pytest.raises(ValueError, match="empty GlobalMetadata"):
        with EtWriter(path) as writer:
            writer.write_metadata(pb.GlobalMetadata())
    with pytest.raises(ValueError, match="empty Node"):
        with EtWriter(path) as writer:
            writer.write_metadata(sample_metadata())
            writer.write_node(pb.Node())
    with pytest.raises(ValueError, match="already written"):
        with EtWriter(path) as writer:
            writer.write_metadata(sample_metadata())
            writer.write_metadata(sample_metadata())
    assert list(tmp_path.iterdir()) == []


def test_writer_counts_nodes(tmp_path):
    with EtWriter(tmp_path / "c.et") as writer:
        writer.write_metadata(sample_metadata())
        for node in sample_nodes(7):
            writer.write_node(node)
    assert writer.nodes_written == 7 and writer.metadata_written


# =============================================================================================
# Bad files
# =============================================================================================


def good_bytes(tmp_path) -> bytes:
    path = tmp_path / "good.et"
    write_et(path, sample_metadata(), sample_nodes(10))
    return path.read_bytes()


def read_all(path: Path) -> list:
    return list(read_et(path))


def test_truncated_file_names_the_file(tmp_path):
    data = good_bytes(tmp_path)
    path = tmp_path / "cut.et"
    path.write_bytes(data[: len(data) - 7])
    with pytest.raises(TraceFormatError) as err:
        read_all(path)
    assert str(path) in str(err.value) and "truncated" in err.value.problem


def test_truncated_inside_a_length_prefix(tmp_path):
    metadata = sample_metadata().SerializeToString()
    path = tmp_path / "prefix.et"
    path.write_bytes(chakra_io.encode_varint(len(metadata)) + metadata + b"\x96")  # varint continues
    with pytest.raises(TraceFormatError, match="length prefix .* cut off"):
        read_all(path)


def test_truncated_gzip_names_the_file(tmp_path):
    data = good_bytes(tmp_path)
    path = tmp_path / "cut.et.gz"
    path.write_bytes(gzip.compress(data)[:-12])
    with pytest.raises(TraceFormatError) as err:
        read_all(path)
    assert err.value.path == str(path)


@pytest.mark.parametrize(
    "content",
    [b"hello, this is not a trace\n", bytes(range(255, 0, -1)) * 3, b"\xff" * 40, b'{"nodes": []}'],
)
def test_garbage_raises_trace_format_error(tmp_path, content):
    path = tmp_path / "garbage.et"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError) as err:
        read_all(path)
    assert err.value.path == str(path)


def test_garbage_payload_with_valid_framing(tmp_path):
    metadata = sample_metadata().SerializeToString()
    bad = b"\x0a\xff\xff\xff\x0f"  # field 1 (string) claiming a huge length inside the message
    path = tmp_path / "payload.et"
    path.write_bytes(chakra_io.encode_varint(len(metadata)) + metadata + chakra_io.encode_varint(len(bad)) + bad)
    with pytest.raises(TraceFormatError, match=r"message #1 .* not a valid Node"):
        read_all(path)


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.et"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty"):
        open_et(empty)
    empty_gz = tmp_path / "empty.et.gz"
    empty_gz.write_bytes(gzip.compress(b""))
    with pytest.raises(TraceFormatError, match="empty"):
        open_et(empty_gz)
    with pytest.raises(TraceFormatError, match="no such file"):
        open_et(tmp_path / "missing.et")


def test_nodes_iterates_once(tmp_path):
    path = tmp_path / "once.et"
    write_et(path, sample_metadata(), sample_nodes(2))
    with open_et(path) as reader:
        assert len(list(reader.nodes())) == 2
        with pytest.raises(RuntimeError):
            list(reader.nodes())


# =============================================================================================
# Attributes and dumping
# =============================================================================================


def test_attr_helpers():
    node = pb.Node(id=1)
    node.attr.extend(
        [chakra_io.make_attr("comm_type", pb.ALL_REDUCE), chakra_io.make_attr("comm_size", 1024),
         chakra_io.make_attr("is_cpu_op", False), chakra_io.make_attr("involved_dim", [True, True])]
    )
    assert node.attr[0].WhichOneof("value") == "int64_val"  # 0 is still set: oneof has presence
    assert chakra_io.get_attr(node, "comm_type") == 0
    assert chakra_io.get_attr(node, "is_cpu_op") is False
    assert chakra_io.get_attr(node, "involved_dim") == [True, True]
    assert chakra_io.get_attr(node, "absent", None) is None
    with pytest.raises(KeyError):
        chakra_io.get_attr(node, "absent")
    assert chakra_io.attr_dict(node) == {
        "comm_type": 0, "comm_size": 1024, "is_cpu_op": False, "involved_dim": [True, True]
    }
    assert chakra_io.make_attr("pid", 7, "uint64_val").WhichOneof("value") == "uint64_val"
    assert chakra_io.attr_value(pb.AttributeProto(name="unset")) is None
    with pytest.raises(ValueError):
        chakra_io.make_attr("x", [])


def test_message_to_dict_keeps_ints_and_names_enums():
    node = sample_nodes(2)[1]
    node.id = 2**63 + 5
    out = chakra_io.message_to_dict(node)
    assert out["id"] == 2**63 + 5 and out["type"] == "COMP_NODE"
    assert out["ctrl_deps"] == [1] and out["data_deps"] == [1]
    assert out["attr"] == [{"name": "is_cpu_op", "bool_val": True}]
    assert out["inputs"] == {"values": "[2]"}
    assert list(out)[:3] == ["id", "name", "type"]


def test_iter_dump_records(tmp_path):
    path = tmp_path / "d.et.gz"
    write_et(path, sample_metadata(), sample_nodes(5))
    records = list(chakra_io.iter_dump_records(path, limit=2))
    assert list(records[0]) == ["metadata"]
    assert records[0]["metadata"]["attr"][1] == {"name": "pid", "uint64_val": 42}
    assert [r["node"]["id"] for r in records[1:]] == [1, 2]
    assert len(list(chakra_io.iter_dump_records(path))) == 6


def test_encode_varint_matches_decoder():
    for value in (0, 1, 127, 128, 300, 2**32, 2**64 - 1):
        encoded = chakra_io.encode_varint(value)
        assert wire_decoder.read_varint(encoded, 0) == (value, len(encoded))
    with pytest.raises(ValueError):
        chakra_io.encode_varint(-1)


def test_decode_varint_reads_what_protobuf_writes():
    """The readers' one varint decoder against the protobuf runtime's own encoding (a Node's
    ``id``, field 1: tag byte 0x08, then the varint), at an offset inside the bytes; 0, which
    proto3 does not write, is the single byte 0."""
    from linker.write.protobuf_wire import decode_varint

    assert decode_varint(b"\x05\x00", 1) == (0, 2)
    for value in (1, 127, 128, 300, 2**32, 2**63 - 1, 2**64 - 1):
        wire = b"\xff" + pb.Node(id=value).SerializeToString()
        assert wire[1] == 0x08
        assert decode_varint(wire, 2) == (value, len(wire))
    with pytest.raises(IndexError):  # the bytes end inside the varint
        decode_varint(b"\x08\x96", 1)
    with pytest.raises(ValueError):  # eleven bytes: longer than any 64-bit value
        decode_varint(b"\x80" * 10 + b"\x01", 0)


def test_varint_columns_are_what_protobuf_writes():
    """``varint_rows`` (a column of varints, the ``.et`` encoder's) gives for each value the bytes
    protobuf writes for it: a ``Node`` whose only field is that ``id`` is its tag and the varint."""
    import numpy as np

    from linker.write.protobuf_wire import tag, varint_rows

    edges = [v for k in range(1, 10) for v in ((1 << 7 * k) - 1, 1 << 7 * k)]
    values = [1, 5, 300, 1_700_000_000_123_456, (1 << 63) - 1] + [v for v in edges if v < 1 << 63]
    values += np.random.default_rng(7).integers(1, 1 << 62, 200).tolist()
    rows, lengths = varint_rows(np.array(values, dtype=np.int64))
    id_tag = tag(pb.Node, "id")
    for value, row, length in zip(values, rows, lengths.tolist()):
        assert id_tag + bytes(row[:length]) == pb.Node(id=value).SerializeToString(), value
        assert not row[length:].any()
    with pytest.raises(ValueError, match="negative"):
        varint_rows(np.array([3, -1], dtype=np.int64))
