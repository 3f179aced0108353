"""Prometheus remote write 1.0: wattline's points, in the layout of :mod:`.victoria_points`,
as a snappy-compressed protobuf ``WriteRequest`` (``wattline/v1/prompb_pb2``, generated from
``proto/wattline/v1/prompb.proto``).

A point ``(measurement, tags, fields, time)`` is one sample per field, as VictoriaMetrics
stores line protocol: the metric ``<measurement>_<field>`` with the tags as labels, at the
point's millisecond (the layout already floored it there), the value as a float64 (a bool
as 1 or 0). A tag with an empty value is left out (a Prometheus label cannot be empty:
empty is absent; line protocol leaves it out too).

Names: Prometheus 2.x, Mimir and Thanos take metric and label names of
``[a-zA-Z_][a-zA-Z0-9_]*`` (names starting ``__`` are theirs). Any other name (a host label
``rack-id``, a job label ``label_team.x``, a name starting ``__`` or ``U__``) is written in
the Prometheus "U__" value-encoding escape: ``U__``, then each character as is if it is a
letter or a digit (not first), ``_`` as ``__``, any other as ``_<hex code point>_``
(``rack-id`` -> ``U__rack_2d_id``); :func:`unescape_name` undoes it, so every name reads back
as written and no two names meet.

Time order: one series' samples go out in time order in one ``TimeSeries`` per request.
Prometheus 2.42 without an out-of-order window drops, silently and with a 204, a sample of
a request that is older than an earlier one of the same new series.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Iterable

import cramjam

from wattline.stores.schema import SummaryPoint
from wattline.stores.series.points import MS
from wattline.v1 import prompb_pb2 as prompb

#: A series: its labels, ``__name__`` included, sorted by name (as remote write wants them).
Series = tuple[tuple[str, str], ...]
#: One sample of a series: (series, ms time stamp, value).
SeriesSample = tuple[Series, int, float]

HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}

_VALID = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_ESCAPED = "U__"


@functools.lru_cache(maxsize=4096)  # a fleet has few names, each written again every point
def escape_name(name: str) -> str:
    """``name`` as a Prometheus metric or label name (see the module's docstring)."""
    if _VALID.match(name) and not name.startswith(("__", _ESCAPED)):
        return name
    out = [_ESCAPED]
    for i, ch in enumerate(name):
        if ch == "_":
            out.append("__")
        elif ch.isascii() and (ch.isalpha() or (ch.isdigit() and i > 0)):
            out.append(ch)
        else:
            out.append(f"_{ord(ch):x}_")
    return "".join(out)


def unescape_name(name: str) -> str:
    """The name :func:`escape_name` wrote as ``name`` (a name it would not write: as it is)."""
    if not name.startswith(_ESCAPED):
        return name
    out: list[str] = []
    i = len(_ESCAPED)
    try:
        while i < len(name):
            if name[i] != "_":
                out.append(name[i])
                i += 1
            elif name.startswith("_", i + 1):
                out.append("_")
                i += 2
            else:
                end = name.index("_", i + 1)
                out.append(chr(int(name[i + 1 : end], 16)))
                i = end + 1
    except ValueError:
        return name
    return "".join(out)


def point_samples(point: SummaryPoint) -> list[SeriesSample]:
    """The samples of one point, a sample per number field. A string field is no number and
    is not written (the layout keeps every string a reader needs as a label)."""
    measurement, tags, fields, time_ns = point
    labels = sorted((escape_name(k), v) for k, v in tags.items() if v)
    at = bisect.bisect_left(labels, ("__name__",))  # the one place of __name__ among them
    before, after = tuple(labels[:at]), tuple(labels[at:])
    ms = time_ns // MS
    return [
        ((*before, ("__name__", escape_name(f"{measurement}_{field}")), *after), ms, float(value))
        for field, value in fields.items()
        if not isinstance(value, str)
    ]


def write_request(samples: Iterable[SeriesSample]) -> bytes:
    """The body of one remote-write request: a ``TimeSeries`` per series, its samples in time
    order, snappy-compressed (the block format, as remote write wants it). Callers leave out
    a sample whose series already has another value at its millisecond (:class:`.prometheus.PrometheusStore`)."""
    by_series: dict[Series, dict[int, float]] = {}
    for series, ms, value in samples:
        by_series.setdefault(series, {})[ms] = value
    request = prompb.WriteRequest()
    for series, values in by_series.items():
        out = request.timeseries.add()
        out.labels.extend(prompb.Label(name=k, value=v) for k, v in series)
        out.samples.extend(prompb.Sample(value=v, timestamp=ms) for ms, v in sorted(values.items()))
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))
