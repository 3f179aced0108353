"""The stores fed InfluxDB line protocol (InfluxDB 1.x and 2.x): encode, then write lines."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from wattline import wire
from wattline.stores.base import IntervalSummary, JobSummary, Store, WriteResult
from wattline.stores.lineprotocol import EncodedBatch, LineEncoder
from wattline.stores.schema import SummaryPoint, interval_point, summary_points


class LineProtocolStore(Store):
    """A store fed InfluxDB line protocol: encodes with its :attr:`encoder` (points it
    cannot encode are rejected with the reason), then :meth:`write_lines`."""

    encoder: LineEncoder

    def encode(self, batch: wire.pb.Batch) -> EncodedBatch:
        """``batch`` as lines; a store with another point layout (VictoriaMetrics) overrides it."""
        return self.encoder.batch(batch)

    def summary_points(self, summary: JobSummary) -> list[SummaryPoint]:
        """The points of a job's summary (:func:`summary_points`, or this store's layout)."""
        return summary_points(summary)

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        encoded = self.encode(batch)
        return _with_encoder_refusals(self.write_lines(encoded.lines), encoded)

    def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        """All batches' lines in one write (one request per MAX_BODY_BYTES)."""
        if len(batches) == 1:
            return [self.write(batches[0])]
        encoded = [self.encode(batch) for batch in batches]
        together = self.write_lines([line for e in encoded for line in e.lines])
        if together.rejected:
            # The server refused some points without saying whose: write each batch again
            # alone (idempotent) so that every Ack counts its own refusals.
            return [_with_encoder_refusals(self.write_lines(e.lines), e) for e in encoded]
        return [_with_encoder_refusals(WriteResult(written=len(e.lines)), e) for e in encoded]

    @abc.abstractmethod
    def write_lines(self, lines: Sequence[str]) -> WriteResult:
        """Write already-encoded points; raises StoreUnavailable when they must be retried."""

    def write_summary(self, summary: JobSummary) -> WriteResult:
        """Write a job's summary points (:func:`summary_points`); same key, same point: idempotent."""
        try:
            lines = [self.encoder.line(*point) for point in self.summary_points(summary)]
        except ValueError as exc:  # LineProtocolError: no retry can store it
            return WriteResult(rejected=1, reasons=[f"job summary of {summary.job_id[:100]!r}: {exc}"])
        return self.write_lines(lines)

    #: Whether a rewrite of an interval replaces it: InfluxDB keys a point by series and time.
    replaces_intervals = True

    def write_intervals(self, intervals: Sequence[IntervalSummary]) -> WriteResult:
        """Write service intervals (:func:`interval_point`), each refused alone if it cannot be encoded."""
        lines, refused = [], []
        for interval in intervals:
            try:
                lines.append(self.encoder.line(*interval_point(interval)))
            except ValueError as exc:  # LineProtocolError: no retry can store it
                refused.append(f"interval of {interval.job_id[:100]!r}: {exc}")
        result = self.write_lines(lines) if lines else WriteResult()
        result.rejected += len(refused)
        result.reasons.extend(refused)
        return result


def _with_encoder_refusals(result: WriteResult, encoded: EncodedBatch) -> WriteResult:
    """``result`` of writing ``encoded.lines``, plus the points the encoder refused."""
    result.rejected += len(encoded.rejected)
    result.reasons[:0] = encoded.rejected
    return result
