"""The checked-in generated code must match a fresh `python proto/generate.py`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = [
    *(f"{m}{ext}" for m in ("telemetry", "podresources", "prompb") for ext in ("_pb2.py", "_pb2.pyi")),
    *(f"{m}_pb2_grpc.py" for m in ("telemetry", "podresources")),
]


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "proto" / "generate.py"), str(tmp_path)], check=True)
    for name in GENERATED:
        fresh = (tmp_path / "wattline" / "v1" / name).read_text()
        checked_in = (ROOT / "wattline" / "v1" / name).read_text()
        assert fresh == checked_in, f"wattline/v1/{name} is stale: run python proto/generate.py"
    made = {p.name for p in (tmp_path / "wattline" / "v1").iterdir()}
    assert made == set(GENERATED), "generated files and the list here differ"


def test_every_field_documents_its_unit_or_meaning() -> None:
    """Each Sample field is preceded by a comment (units live there)."""
    text = (ROOT / "proto" / "wattline" / "v1" / "telemetry.proto").read_text().splitlines()
    in_sample = False
    for i, line in enumerate(text):
        stripped = line.strip()
        if stripped.startswith("message Sample"):
            in_sample = True
        elif in_sample and stripped == "}":
            break
        elif in_sample and stripped.endswith(";") and "=" in stripped:
            previous = text[i - 1].strip()
            assert previous.startswith("//") or previous.endswith(";"), f"undocumented field: {stripped}"


def test_wire_roundtrip_keeps_quality_and_optional_fields() -> None:
    from wattline import wire
    from wattline.quality import Quality

    sample = wire.Sample(source="rapl", component="dram", device="package-0/dram", quality=Quality.COUNTER.wire)
    sample.utilization = 0.0
    parsed = wire.Sample.FromString(sample.SerializeToString())
    assert parsed.HasField("utilization") and parsed.utilization == 0.0
    assert not parsed.HasField("energy_error_j")
    assert Quality.from_wire(parsed.quality) is Quality.COUNTER
