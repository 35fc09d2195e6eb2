from pathlib import Path

from protos.generate import PROTO_FILES, ROOT, generate


def test_committed_stubs_match_the_proto(tmp_path):
    fresh = generate(tmp_path)
    assert len(fresh) == 3 * len(PROTO_FILES)
    for path in fresh:
        committed = ROOT / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run `python -m protos.generate`"
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run `python -m protos.generate`"


LEDGER = Path(__file__).with_name("captured") / "fleet_proto_fields.txt"


def _fields(messages, prefix: str = ""):
    """(message, number, name) of every field and enum value, nested ones under their path."""
    for m in messages:
        yield from ((f"{prefix}{m.name}", f.number, f.name) for f in m.field)
        for e in m.enum_type:
            yield from ((f"{prefix}{m.name}.{e.name}", v.number, v.name) for v in e.value)
        yield from _fields(m.nested_type, f"{prefix}{m.name}.")


def _messages(messages, prefix: str = ""):
    for m in messages:
        yield f"{prefix}{m.name}", m
        yield from _messages(m.nested_type, f"{prefix}{m.name}.")


def test_field_numbers_are_never_reused():
    """A field number once used (tests/captured/fleet_proto_fields.txt, append-only) is never
    used again under another name, and a field that left its message stays `reserved` there by
    number and by name, as fleet.proto's header promises: what protoc cannot know, since it sees
    one version only. The stubs carry the reservations (the test above keeps them in step)."""
    from google.protobuf import descriptor_pb2

    from protos.specfleet.v1 import fleet_pb2

    proto = descriptor_pb2.FileDescriptorProto()
    fleet_pb2.DESCRIPTOR.CopyToProto(proto)
    assert proto.package == "specfleet.v1"
    ledger = [tuple(line.split()) for line in LEDGER.read_text().splitlines() if line and not line.startswith("#")]
    ever = {(message, int(number)): name for message, number, name in ledger}
    assert len(ever) == len(ledger), "the ledger names one number twice in a message"
    now = {(message, number): name for message, number, name in _fields(proto.message_type)}
    for key, name in now.items():
        assert key in ever, f"{key[0]}.{name} = {key[1]} is new: append `{key[0]} {key[1]} {name}` to {LEDGER.name}"
        assert ever[key] == name, f"{key[0]} field {key[1]} was {ever[key]!r}, now {name!r}: never reuse a number"
    messages = dict(_messages(proto.message_type))
    retired = [key for key in ever if key not in now and key[0] in messages]
    for message, number in retired:
        m = messages[message]
        assert any(r.start <= number < r.end for r in m.reserved_range), f"{message}: `reserved {number};` is missing"
        assert ever[message, number] in m.reserved_name, f'{message}: `reserved "{ever[message, number]}";` missing'
    assert ("ReportResultRequest", 3) in retired  # schema 1's untyped run message
