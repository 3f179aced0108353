"""A host's energy channels for a report: from the cumulative counters at the windows'
edges, or from the samples themselves (several streams, shared hosts), each channel with
its error bound in the job's windows (:mod:`wattline.accounting.window_bounds`)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable

from wattline import wire
from wattline.accounting.attribution import ChannelEnergy
from wattline.accounting.streams import StreamMerge, StreamSample, merge_streams
from wattline.accounting.uncertainty import Bound
from wattline.accounting.window_bounds import Gaps, edge_bound, samples_bound
from wattline.accounting.window_energy import EdgeSample, Interval, cumulative_window_energy, window_energy
from wattline.quality import Quality
from wattline.reports.model import ReportSettings
from wattline.stores.reader import Reader, StoredSample

#: Sub-domains and supersets left out of a host's total (see :mod:`.build`).
EXCLUDED_COMPONENTS = frozenset({"cpu_core", "cpu_uncore", "psys"})

Series = tuple[str, str, str, str, str]  # host, source, component, device, quality
#: A NeuronCores-per-device count above this is not a device's (a bad writer): not taken.
MAX_NEURONCORES_PER_DEVICE = 128
#: (window key, component, device, quality) -> (the channel's bound in that window, its energy there).
Bounds = dict[tuple[str, str, str, str], tuple[Bound, float]]


def _channel(
    series: Series, intervals: list[Interval], settings: ReportSettings, samples: Iterable[StoredSample]
) -> ChannelEnergy:
    """A series' channel; its claim keys: a GPU by UUID, a Neuron device by itself and its
    cores, numbered by the count its samples carry (the host's own: trn1 and trn2 differ),
    else by ``settings.cores_per_neuron_device``, an assumption the channel states."""
    host, _source, component, device, quality = series
    keys: frozenset[str] = frozenset()
    assumed = ""
    if component == "gpu":
        keys = frozenset({wire.claim_key(component, device)})
    elif component == "accelerator" and device.startswith("neuron") and device[6:].isdigit():
        found = [
            c
            for s in sorted(samples, key=lambda s: s.end_ns)
            if (c := s.neuroncores_per_device) is not None and 0 < c <= MAX_NEURONCORES_PER_DEVICE
        ]
        n, per = int(device[6:]), found[-1] if found else settings.cores_per_neuron_device
        cores = (f"neuroncore:{c}" for c in range(n * per, (n + 1) * per))
        keys = frozenset({wire.claim_key(component, device), *cores})
        if not found:
            assumed = (
                f"{host}: its Neuron samples do not say how many NeuronCores a device has (an older agent); "
                f"assumed {per} to map neuroncore claims to devices"
            )
    return ChannelEnergy(host, component, device, Quality(quality), intervals, keys, assumed)


def channels_from_samples(
    samples: Iterable[StoredSample],
    host: str,
    settings: ReportSettings,
    notes: list[str],
    out: tuple[tuple[str, str], tuple[int, int, int], Bounds],
) -> list[ChannelEnergy]:
    """One channel per series, each instant counted once across overlapping streams; each
    one's bound in the job's two windows (``out``: their keys, the edges, where to put them)."""
    grouped: dict[Series, list[StoredSample]] = defaultdict(list)
    for s in samples:
        if s.component not in EXCLUDED_COMPONENTS:
            grouped[s.series].append(s)
    merges = {k: merge_series(grouped[k]) for k in _known_quality(host, grouped, notes)}
    keys, edges, bounds = out
    _stream_notes(host, merges.values(), notes, restarts=False)
    # a restart in the job's own window or across one of its edges, as the edge counters find it
    inside = (merge_series(_around_window(grouped[k], edges[0], edges[-1])) for k in merges)
    _stream_notes(host, inside, notes, overlaps=False)
    channels = []
    for key, merged in merges.items():
        gaps: Gaps = []
        for window, (t0, t1) in zip(keys, itertools.pairwise(edges), strict=True):
            energy = window_energy(merged.intervals, t0, t1)
            bound = samples_bound((key[1], key[4]), grouped[key], merged.intervals, (t0, t1, energy), gaps)
            bounds[(window, key[2], key[3], key[4])] = (bound, energy)
        channels.append(_channel(key, [*merged.intervals, *gap_intervals(gaps)], settings, grouped[key]))
    return channels


def gap_intervals(gaps: Gaps) -> list[Interval]:
    """A channel's stretches without a good sample in the job's windows, as intervals of no
    energy that carry what they could have held (handed out to the jobs there like energy)."""
    return [Interval(a, b, 0.0, gap_j=j) for a, b, j in gaps if b > a and j > 0]


def _around_window(samples: list[StoredSample], lo: int, hi: int) -> list[StoredSample]:
    """The samples overlapping ``(lo, hi)``, with the last one ending before and the first one
    starting after it (a stream that ended, or began, across an edge)."""
    inside = [s for s in samples if s.end_ns > lo and s.start_ns < hi]
    before = max((s for s in samples if s.end_ns <= lo), key=lambda s: s.end_ns, default=None)
    after = min((s for s in samples if s.start_ns >= hi), key=lambda s: s.start_ns, default=None)
    return [*([before] if before else []), *inside, *([after] if after else [])]


def _known_quality(host: str, series: Iterable[Series], notes: list[str]) -> list[Series]:
    """The series whose quality a report can present, sorted; one note names the others (rows
    an older collector stored as "unspecified": how their energy was obtained is unknown)."""
    keys = sorted(series)
    known = {q.value for q in Quality}
    if unknown := [f"{k[1]} {k[2]} {k[3]} ({k[4]})" for k in keys if k[4] not in known]:
        why = "stored with no known quality (how its energy was obtained is unknown)"
        notes.append(f"{host}: left out of the figures, {why}: {', '.join(unknown)}")
    return [k for k in keys if k[4] in known]


def merge_series(samples: Iterable[StoredSample]) -> StreamMerge:
    """One series' samples counted once across streams, a stretch the store lacks between two
    samples of one stream bridged by its counter (:func:`~wattline.accounting.streams.merge_streams`)."""
    return merge_streams(StreamSample(s.start_ns, s.end_ns, s.energy_j, s.stream, s.cumulative_j) for s in samples)


def _stream_notes(
    host: str,
    merges: Iterable[StreamMerge],
    notes: list[str],
    *,
    restarts: bool = True,
    overlaps: bool = True,
    across_edges: Iterable[int] = (),
) -> None:
    """One note per host when streams overlapped in time (with ``overlaps``); with ``restarts``,
    one when one followed another (``across_edges``: the ns between two streams across an edge
    of the window), saying how long no stream measured the host."""
    done, straddled = list(merges), list(across_edges)
    overlapping = max((m.overlapping for m in done), default=0)
    if overlaps and overlapping:
        notes.append(f"{host}: {overlapping} streams overlapped in time (two agents under one host id?); counted once")
    if restarts and (any(m.restarts for m in done) or straddled):
        # The host's sources share the agent's downtime: its longest gap is the host's.
        gap = f"{max([m.unmeasured_ns for m in done if m.restarts] + straddled) / 1e9:.3g} s"
        notes.append(f"{host}: agent restarted during the job; {gap} between its streams not measured, the rest summed")


def _edge_neighbours(
    before: StoredSample | None, after: StoredSample | None, inside: list[StoredSample], hi: int
) -> list[StoredSample]:
    """A series' samples in a span with its last one ending before the span (``before``) and
    its first one starting at or after its end ``hi`` (``after``, when it does)."""
    return [*([before] if before else []), *inside, *([after] if after and after.start_ns >= hi else [])]


def edge_sample(s: StoredSample | None) -> EdgeSample | None:
    return None if s is None else EdgeSample(s.start_ns, s.end_ns, s.energy_j, s.cumulative_j, s.stream)


def channels_from_edges(
    reader: Reader,
    host: str,
    edges: tuple[int, ...],
    settings: ReportSettings,
    notes: list[str],
    out: tuple[tuple[str, ...], Bounds],
) -> list[ChannelEnergy]:
    """One Interval per window per series, from the cumulative counter at the edges; its
    bound from the same edge samples (``out``: the windows' keys, where to put the bounds).

    When the edge samples of a series inside the job's span come from more than one
    stream (an agent restarted, or two agents sample the host), its samples in the span
    are merged instead (:mod:`wattline.accounting.streams`: overlapping streams count once, restarts add up).
    A second stream never seen at an edge (started and stopped inside the job) changes
    nothing: the edges' stream measured the whole job; it is only not noted.
    """
    lo, hi = edges[0], edges[-1]
    found = reader.around(host, edges)
    before = [{s.series: s for s in last} for last, _first in found]
    after = [{s.series: s for s in first} for _last, first in found]
    found_series = {k for d in before[1:] + after[:-1] for k in d if k[2] not in EXCLUDED_COMPONENTS}
    series = _known_quality(host, found_series, notes)
    windows = [(i, t0, t1) for i, (t0, t1) in enumerate(itertools.pairwise(edges)) if t1 > t0]
    channels: list[ChannelEnergy] = []
    samples: dict[Series, list[StoredSample]] | None = None
    merges: list[StreamMerge] = []
    straddled: list[int] = []  # ns between two streams across an edge (a restart there)
    for key in series:
        for last, first in zip(before, after, strict=True):
            a, b = last.get(key), first.get(key)
            if a and b and a.stream != b.stream and a.end_ns < min(b.start_ns, hi) and b.start_ns > lo:
                straddled.append(b.start_ns - a.end_ns)
        inside = [s for d in before + after if (s := d.get(key)) is not None and s.start_ns < hi and s.end_ns > lo]
        energies: list[float | None] = [None] * len(windows)
        if len({s.stream for s in inside}) <= 1:
            energies = [
                cumulative_window_energy(
                    edge_sample(before[i].get(key)),
                    edge_sample(after[i].get(key)),
                    edge_sample(before[i + 1].get(key)),
                    edge_sample(after[i + 1].get(key)),
                    t0,
                    t1,
                )
                for i, t0, t1 in windows
            ]
        merged: StreamMerge | None = None
        raw: list[StoredSample] = []
        # A restart, or a source's own bound per sample (summed over the window): read the samples.
        if None in energies or any(s.energy_error_j is not None for s in inside):
            if samples is None:
                samples = defaultdict(list)
                for s in reader.samples(host, lo, hi):
                    samples[s.series].append(s)
            # with the samples just outside: a stretch the store lacks across an edge is bridged
            raw = _edge_neighbours(before[0].get(key), after[-1].get(key), samples.get(key, []), hi)
            merged = merge_series(raw)
            if None in energies:
                merges.append(merged)
                energies = [window_energy(merged.intervals, t0, t1) for _i, t0, t1 in windows]
        gaps: Gaps = []
        for (i, t0, t1), e in zip(windows, energies, strict=True):
            window = (t0, t1, e or 0.0)
            if merged is not None:
                bound = samples_bound((key[1], key[4]), raw, merged.intervals, window, gaps)
            else:
                at_t0, at_t1 = (before[i].get(key), after[i].get(key)), (before[i + 1].get(key), after[i + 1].get(key))
                bound = edge_bound((key[1], key[4]), at_t0, at_t1, window, gaps)
            out[1][(out[0][i], key[2], key[3], key[4])] = (bound, e or 0.0)
        intervals = [Interval(t0, t1, e or 0.0) for (_i, t0, t1), e in zip(windows, energies, strict=True)]
        intervals += gap_intervals(gaps)
        at_edges = (s for d in before + after if (s := d.get(key)) is not None)
        channels.append(_channel(key, intervals, settings, at_edges))
    _stream_notes(host, merges, notes, across_edges=straddled)
    return channels
