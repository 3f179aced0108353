"""Build the stand-in ``libnvidia-ml.so.1`` from ``libnvml_stub.c``.

The library lands in ``tests/_build/nvml_stub-<hash>/`` (gitignored), keyed by a hash of the
source and the compiler command, so it is compiled once per change. Put that directory on
``LD_LIBRARY_PATH`` of a fresh process: the dynamic loader reads it only at start-up.

Run as a script to print the directory: ``python tests/nvml_stub/build.py``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "libnvml_stub.c"
BUILD_ROOT = HERE.parent / "_build"
LIBRARY_NAME = "libnvidia-ml.so.1"
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra")
LIBS = ("-lm",)


def build_stub(build_root: Path = BUILD_ROOT, compiler: str = "gcc") -> Path:
    """Return the directory holding ``libnvidia-ml.so.1``, compiling it if needed."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join((compiler, *CFLAGS, *LIBS)).encode()).hexdigest()[:16]
    out_dir = build_root / f"nvml_stub-{key}"
    library = out_dir / LIBRARY_NAME
    if library.is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    # Compile to a temporary name, then rename: concurrent builders never see half a file.
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run([compiler, *CFLAGS, "-o", tmp, str(SOURCE), *LIBS], check=True, capture_output=True, text=True)
        os.replace(tmp, library)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{compiler} failed on {SOURCE.name}:\n{exc.stderr}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out_dir


if __name__ == "__main__":
    sys.stdout.write(f"{build_stub()}\n")
