#!/usr/bin/env python3
"""Regenerate the checked-in Python code of the wire contract.

Usage: ``python proto/generate.py [OUTPUT_ROOT]`` (default: the repository root).
Writes ``wattline/v1/<name>_pb2.py`` and ``.pyi`` for every .proto here, and
``<name>_pb2_grpc.py`` for those that declare a service, with the grpcio-tools pinned in
pyproject.toml, so the output is reproducible; tests/unit/test_proto.py fails when the
checked-in files differ from a fresh run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
PROTOS = sorted(str(p.relative_to(HERE)) for p in HERE.rglob("*.proto"))
#: The protos that declare a gRPC service (the others get no empty ``_grpc`` module).
SERVICES = [p for p in PROTOS if re.search(r"^service ", (HERE / p).read_text(), re.MULTILINE)]


def generate(out_root: Path) -> None:
    """Run protoc on every .proto under proto/ into ``out_root``."""
    (out_root / "wattline" / "v1").mkdir(parents=True, exist_ok=True)
    includes = ["protoc", f"-I{HERE}", f"-I{Path(protoc.__file__).parent / '_proto'}"]
    for args in (
        [*includes, f"--python_out={out_root}", f"--pyi_out={out_root}", *PROTOS],
        [*includes, f"--grpc_python_out={out_root}", *SERVICES],
    ):
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent)
