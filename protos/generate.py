"""Regenerate the Python stubs from the .proto files: `python -m protos.generate`.

The stubs are committed; tests/test_protos.py fails when they differ from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_FILES = ["protos/specfleet/v1/fleet.proto"]


def generate(out_dir: Path) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every proto into out_dir."""
    import grpc_tools
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(ROOT / p) for p in PROTO_FILES],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {PROTO_FILES}")
    return sorted(
        out_dir / Path(p).parent / f"{Path(p).stem}{suffix}"
        for p in PROTO_FILES
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
    )


def main() -> int:
    for path in generate(ROOT):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
