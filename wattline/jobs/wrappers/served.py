"""``wattline run --metrics``: the units of a command that serves, counted from its server's own
Prometheus metrics as it serves (a service never ends, so it cannot count its work at its end).

A thread scrapes the server every ``--scrape-every`` and passes each scrape's units since the
previous one to the job's :class:`~wattline.jobs.events.UnitAccumulator` with the
scrape's time, so each UNITS event covers the time since the previous one
(:mod:`wattline.served_metrics` does the counting: resets, late series, failed scrapes). The
command starts the server, so its counters are ours from 0: the first good scrape counts what
the server answered before it, over the time from the job's open. A failed scrape is said once
per reason and counts nothing; the next good one covers the gap. Once the command has ended,
one last scrape is taken if the endpoint still answers (a server that keeps ``/metrics`` up a
moment after it stops serving loses nothing), then the job closes.

The first spec (``--count``'s first, or the one ``--units`` picks of a preset) counts the job's
own units, summed over its ``by`` labels, as every other holder sends them. Every other spec is
an extra unit kind, and a preset's latency histograms (vLLM's end-to-end request latency, say)
are read bucket by bucket: each series goes as UNITS events with ``unit`` and ``unit_labels``
set, as :mod:`wattline.served_series` counts and holds them (the agent's watchers send theirs
the same way), numbered by an :class:`~wattline.jobs.events.EventBuilder` of its own,
so that its ``units_total`` is that series' alone and readers never add it into the job's units.
"""

from __future__ import annotations

import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wattline import wire
from wattline.config import ConfigError
from wattline.jobs.events import EventBuilder, UnitAccumulator
from wattline.served_metrics import REFUSED, RESET, RETURNED, Reading, ServedCounters
from wattline.served_scrape import ScrapeError, scrape
from wattline.served_series import Send, Series, SeriesBook, ServerSeries
from wattline.served_specs import Spec, parse_latency, parse_unit, preset
from wattline.text import clip
from wattline.units import parse_duration

#: Default seconds between scrapes: about one point per second, as the saturation detector wants.
EVERY_S = 1.0
#: Shortest interval taken: a server's /metrics is rendered on each request, and under load faster
#: scrapes cost it work without adding information.
MIN_EVERY_S = 0.1
#: A scrape's timeout is the interval, but at least the first (a loaded server renders slowly) and
#: at most the second (the command's end waits for a scrape under way).
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 2.0, 10.0
#: The last scrape, once the command has ended: a server gone answers at once (refused); this
#: bounds how long an exit waits for one that neither answers nor refuses.
FINAL_TIMEOUT_S = 2.0
#: Before the first good scrape, failures are the server still starting: said after this long.
STARTUP_GRACE_S = 10.0
#: Most distinct lines said about the scrapes in one run.
MAX_SAID = 50
UNITS = wire.pb.JobEvent.KIND_UNITS
#: Note kinds said on stderr (once each): what changes how far the count can be trusted.
SAID_NOTES = (RESET, RETURNED, REFUSED)


@dataclass(frozen=True, slots=True)
class ServedUnits:
    """Where a served command's units come from: its metrics URL, the unit spec (the job's own
    units), the interval, the specs of the extra unit kinds and of the latency histograms."""

    url: str
    spec: Spec
    every_s: float = EVERY_S
    extra: tuple[Spec, ...] = ()
    latencies: tuple[Spec, ...] = ()


def served_units(
    url: str | None,
    count: Sequence[str] | None,
    preset_name: str | None,
    units: str | None,
    every: str | None,
    units_from_stdout: bool,
    latency: Sequence[str] | None = None,
) -> tuple[ServedUnits | None, str]:
    """``wattline run``'s served options checked: (what to scrape, None without ``--metrics``;
    the job's unit name). Any bad combination or value is a ConfigError (one line, exit 2).

    ``--units`` names the unit once: by default the first ``--count``'s NAME or the preset's
    first unit (``--preset``, whose unit ``--units`` otherwise picks); a ``--units`` other than
    the first ``--count``'s NAME is refused rather than one of the two names silently dropped.
    Every other ``--count`` and every other unit of the preset is an extra unit kind; the
    preset's latency histograms are read, and each ``--latency``'s."""
    count = list(count or []) or None
    if url is None:
        flags = (("--count", count), ("--preset", preset_name), ("--scrape-every", every), ("--latency", latency))
        for flag, value in flags:
            if value:
                raise ConfigError(f"option {flag} needs --metrics URL (the server's Prometheus endpoint)")
        return None, units or "units"
    if units_from_stdout:
        raise ConfigError("options --metrics and --units-from-stdout both count the job's units: give one of them")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"option --metrics: {clip(url)} is not an http or https URL")
    if count is not None and preset_name is not None:
        raise ConfigError("options --count and --preset both say what to count: give one of them")
    spec, *extra = _count_specs(count, units) if count is not None else _preset_specs(preset_name, units)
    latencies = _latency_specs(preset_name, latency or [])
    seconds = EVERY_S if every is None else parse_duration(every, "--scrape-every")
    if not seconds >= MIN_EVERY_S:
        raise ConfigError(f"option --scrape-every: {every} is under {MIN_EVERY_S:g} s")
    return ServedUnits(url, spec, seconds, tuple(extra), latencies), spec.name


def _count_specs(count: list[str], units: str | None) -> list[Spec]:
    """Every ``--count``'s spec, the job's own unit first; a unit kind named twice is refused."""
    try:
        specs = [parse_unit(line) for line in count]
    except ValueError as exc:
        raise ConfigError(f"option --count: {exc}") from None
    names = [spec.name for spec in specs]
    if len(set(names)) < len(names):
        raise ConfigError(f"option --count: a unit kind is named twice: {', '.join(names)}")
    if units is not None and units != names[0]:
        raise ConfigError(f"option --units: {clip(units)} differs from --count's unit {names[0]!r}: name it once")
    return specs


def _latency_specs(preset_name: str | None, lines: Sequence[str]) -> tuple[Spec, ...]:
    """The preset's latency specs, then each ``--latency``'s; a name given twice is refused."""
    try:
        specs = [*(preset(preset_name).latency_specs() if preset_name else []), *map(parse_latency, lines)]
    except ValueError as exc:
        raise ConfigError(f"option --latency: {exc}") from None
    names = [spec.name for spec in specs]
    if len(set(names)) < len(names):
        raise ConfigError(f"option --latency: a latency histogram is named twice: {', '.join(names)}")
    return tuple(specs)


def _preset_specs(name: str | None, units: str | None) -> list[Spec]:
    """The preset's specs, the one ``--units`` picks (by default its first) first."""
    if name is None:
        raise ConfigError("option --metrics needs --count SPEC or --preset NAME (what to count)")
    try:
        specs = preset(name).unit_specs()
    except ValueError as exc:
        raise ConfigError(f"option --preset: {exc}") from None
    if units is None:
        return specs
    for spec in specs:
        if spec.name == units:
            return [spec, *(other for other in specs if other is not spec)]
    known = ", ".join(spec.name for spec in specs)
    raise ConfigError(f"option --units: preset {name} counts {known}, not {clip(units)}")


def _stderr(line: str) -> None:
    print(f"wattline: {line}", file=sys.stderr, flush=True)


class ServedHolder:
    """Counts a served command's units into ``units`` from scrapes of its server, from a thread."""

    def __init__(
        self,
        served: ServedUnits,
        units: UnitAccumulator,
        open_ns: int,
        say: Callable[[str], None] = _stderr,
        fetch: Callable[[str, float], str] = scrape,
    ) -> None:
        self.served, self.units, self.say, self.fetch = served, units, say, fetch
        self.counters = ServedCounters(
            [served.spec, *served.extra], served.latencies, start_ns=open_ns, started_server=True
        )
        self.timeout_s = min(max(served.every_s, MIN_TIMEOUT_S), MAX_TIMEOUT_S)
        self._own = Series(lambda count, time_ns, _place: units.add(count, time_ns))
        self._server = ServerSeries(served.spec.name)
        self._book = SeriesBook(self._sender)  #: the extra unit kinds' series and the latency buckets'
        self.good = 0  #: scrapes that gave a reading
        self.missed = 0  #: failed scrapes between two good ones (a gap; not the server starting or gone)
        self._since_good = 0  # failed scrapes since the last good one
        self.last_failure = ""
        self._said: set[str] = set()
        self._started = time.monotonic()
        self._last_ns = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wattline-scrape", daemon=True)

    @property
    def total(self) -> float:
        """The job's own units counted so far."""
        return self._own.total

    def start(self) -> ServedHolder:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No scrape starts after this; a scrape under way ends within its timeout."""
        self._stop.set()

    def finish(self) -> None:
        """Once the command has ended, before the job closes: the thread stopped, one last
        scrape if the endpoint still answers (its failure is expected: the server is gone), and
        one line saying what was counted."""
        self.stop()
        if self._thread.ident is not None:
            self._thread.join(self.timeout_s + 1.0)
        if not self._thread.is_alive():  # else a scrape hangs past its timeout: skip the last one
            self.scrape(FINAL_TIMEOUT_S, final=True)
        self.say(self._summary())

    def scrape(self, timeout_s: float, final: bool = False) -> Reading | None:
        """One scrape, counted; None when it failed (said once per reason unless ``final``)."""
        with self._lock:
            try:
                text = self.fetch(self.served.url, timeout_s)
                reading = self.counters.update(text, self._now())
            except ScrapeError as exc:
                self._failed(str(exc), final)
                return None
            self.good += 1
            self.missed += self._since_good if self.good > 1 else 0
            self._since_good = 0
            own, counts = self._server.counts(reading)
            self._own.count(own, reading.time_ns)
            self._book.count(counts, reading.time_ns)
            self._said_notes(reading)
            return reading

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            self.scrape(self.timeout_s)
            due = max(due + self.served.every_s, time.monotonic())
            self._stop.wait(due - time.monotonic())

    def _now(self) -> int:
        """The scrape's time: its units were done by then. Increasing, whatever the wall clock does."""
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return self._last_ns

    def _sender(self, kind: str, labels: dict[str, str]) -> Send:
        """An extra series' sender: its UNITS events numbered by a builder of its own (its
        ``units_total`` is the series' alone), sent at once."""
        builder = EventBuilder(self.units.builder.spec)

        def send(units: float, time_ns: int, _place: int) -> None:
            self.units.emit([builder.make(UNITS, time_ns, units=units, unit=kind, unit_labels=labels)])

        return send

    def _failed(self, reason: str, final: bool) -> None:
        self._since_good += 1
        self.counters.failed(self._now(), reason)
        self.last_failure = reason.removeprefix(f"{self.served.url}: ")
        if final or (not self.good and time.monotonic() - self._started < STARTUP_GRACE_S):
            return
        url, why = self.served.url, self.last_failure
        if not self.good:
            self._once(f"no answer from {url} yet: {why} (still trying; nothing is counted until one)")
        else:
            self._once(f"scrape of {url} failed: {why} (said once; the next good scrape counts what it missed)")

    def _said_notes(self, reading: Reading) -> None:
        if self.good == 1 and not reading.units:
            spec = self.served.spec
            self._once(f"{self.served.url} exposes no series {spec} selects: none counted until one appears")
        for note in reading.notes:
            if note.kind in SAID_NOTES:
                self._once(f"{self.served.url}: {note.message}")

    def _once(self, line: str) -> None:
        """Says ``line`` unless said before; past :data:`MAX_SAID` lines, says no more (a server
        whose errors name a changing line or value must not fill a service's log)."""
        if line in self._said or len(self._said) > MAX_SAID:
            return
        self._said.add(line)
        self.say(line if len(self._said) <= MAX_SAID else f"{MAX_SAID} lines said about {self.served.url}: no more")

    def _summary(self) -> str:
        kind, url = self.served.spec.name, self.served.url
        if not self.good:
            why = self.last_failure or "none tried"
            return f"no {kind} were counted from the metrics: no scrape of {url} answered ({why})"
        missed = f", {self.missed} failed between them" if self.missed else ""
        scrapes = f"{self.good} scrape{'s' if self.good > 1 else ''}"
        extra = "".join(f", {_number(units)} {name}" for name, units in self._book.kind_totals().items())
        return f"{_number(self.total)} {kind}{extra} counted from {url} ({scrapes}{missed})"


def _number(units: float) -> str:
    return f"{units:.0f}" if units.is_integer() else f"{units:.6g}"
