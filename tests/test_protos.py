from pathlib import Path

from protos.generate import PROTO_FILES, ROOT, generate


def test_committed_stubs_match_the_proto(tmp_path):
    fresh = generate(tmp_path)
    assert len(fresh) == 3 * len(PROTO_FILES)
    for path in fresh:
        committed = ROOT / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run `python -m protos.generate`"
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run `python -m protos.generate`"


def test_field_numbers_are_never_reused():
    """Every message's field numbers are unique (protoc enforces it) and retired ones stay reserved."""
    from protos.specfleet.v1 import fleet_pb2

    for message in fleet_pb2.DESCRIPTOR.message_types_by_name.values():
        numbers = [f.number for f in message.fields]
        assert len(numbers) == len(set(numbers)), message.name
    assert Path(ROOT / PROTO_FILES[0]).read_text().count("package specfleet.v1;") == 1
