"""The pieces the PromQL twins are built of: windows, the dashboards' matchers, and the
expressions every dashboard uses (energy, means, a sample's time stamp, health, job events)."""

from __future__ import annotations

#: The dashboard's time range, exactly: Grafana runs an instant query at its end, and a range
#: selector holds the samples in (from, to] (a sample ending at ``from`` measured time before it).
RANGE = "[${__range_ms}ms]"
STEP = "[$__interval]"
#: A subquery's step for :func:`stamp`: shorter than Prometheus' lookback (5 minutes), so every
#: sample is the newest one at some step.
STAMP_STEP = "1m"
NOT_SUBZONES = 'component!~"cpu_core|cpu_uncore|psys"'
CHANNEL = ("host", "source", "component", "device")
QUALITY_CHANNEL = (*CHANNEL, "quality")
FLEET = ('host=~"$host"', 'component=~"$component"', NOT_SUBZONES)
HOST = ('host="$host"', 'component=~"$component"')
ADDING_COMPONENTS = f'label_values(energy_power_w{{host=~"$host", {NOT_SUBZONES}}}, component)'


def sel(metric: str, *matchers: str) -> str:
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric


def by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def energy(matchers: tuple[str, ...], group: tuple[str, ...] = (), per: str = "") -> str:
    """Energy of the samples in the range, and of the samples the store lacks between two of
    them in one agent stream (a series each here): its running total's last value minus its
    value before the first sample (``cumulative_start_j``, the smallest in the range: a
    running total only grows within a stream). The InfluxQL twin adds, sample by sample, what
    the running total gained beyond each sample's energy since the previous one."""
    clause = f" by ({by(group)})" if group else ""
    total, before = sel("energy_cumulative_j", *matchers), sel("energy_cumulative_start_j", *matchers)
    per_stream = f"last_over_time({total}{RANGE}) - min_over_time({before}{RANGE})"
    return f"sum{clause} ({per_stream}){per}"


def mean(metric: str, matchers: tuple[str, ...], window: str, channel: tuple[str, ...], group: tuple[str, ...]) -> str:
    """Each channel's mean over ``window`` (its agent streams' samples together, as InfluxQL's
    mean over a channel's points), summed by ``group``."""
    selector = sel(metric, *matchers)
    per_channel = (
        f"sum by ({by(channel)}) (sum_over_time({selector}{window}))"
        f" / sum by ({by(channel)}) (count_over_time({selector}{window}))"
    )
    return per_channel if group == channel else f"sum by ({by(group)}) ({per_channel})"


def stamp(selector: str, window: str = RANGE, ahead: bool = False, step: str = STAMP_STEP) -> str:
    """The time stamp (s) of each series' newest sample in ``window`` before the evaluation
    time (``ahead``: in the ``$__interval`` after it): ``timestamp()`` of the selector at every
    ``step`` of the window, at every second of its last minute and at its end (an instant
    sees a sample within the engine's lookback: Prometheus' 5 minutes, VictoriaMetrics' step);
    the samples that lookback reaches before the window are filtered out. Exact for a series
    of one sample (a job's open, phase or close); for a series of many, the newest sample seen
    at those instants, which ranks an agent's streams by their newest sample."""
    span, offset = window[1:-1], " offset -$__interval" if ahead else ""
    seen = " or ".join(
        (
            f"max_over_time(timestamp({selector})[{span}:{step}]{offset})",
            f"max_over_time(timestamp({selector})[{STAMP_STEP}:1s]{offset})",
            f"timestamp({selector}{offset})",
        )
    )
    seconds = "${__range_ms} / 1000" if window == RANGE else "$__interval_ms / 1000"
    return f"(({seen}) > time())" if ahead else f"(({seen}) > time() - {seconds})"


def newest(metric: str, matchers: tuple[str, ...], channel: tuple[str, ...]) -> str:
    """Each channel's last sample in the range, from its newest stream only (an agent restart
    starts a new series of the same channel; InfluxQL's last() sees one). Streams are ranked
    at the dashboard's steps, not every minute: a fleet has many channels, and a stream of
    samples a second apart is seen at every step it lives through."""
    selector, on = sel(metric, *matchers), by(channel)
    stamps = stamp(selector, step="$__interval")
    return (
        f"last_over_time({selector}{RANGE}) and on ({on}, stream)"
        f" ({stamps} == on ({on}) group_left max by ({on}) ({stamps}))"
    )


def last_failure(matchers: tuple[str, ...], group: tuple[str, ...]) -> str:
    """The end (s) of the last step (``$__interval``) of the range that holds an unhealthy
    sample, by ``group``; the range's end when its last, partial step holds one."""
    failed = f"(0 * (min_over_time({sel('energy_healthy', *matchers)}{STEP}) == 0) + time())"
    steps = f"max_over_time({failed}{RANGE[:-1]}:$__interval])"
    return f"max by ({by(group)}) ({failed}) or max by ({by(group)}) ({steps})"


def unhealthy(matchers: tuple[str, ...], group: tuple[str, ...] = ()) -> str:
    """Unhealthy samples in the range (``healthy`` is 1 or 0)."""
    selector, clause = sel("energy_healthy", *matchers), f" by ({by(group)})" if group else ""
    return f"sum{clause} (count_over_time({selector}{RANGE})) - sum{clause} (sum_over_time({selector}{RANGE}))"


def event_time(*matchers: str) -> str:
    """The time stamp (s) of each job event ``matchers`` select in the range (open, phase and
    close: a series each)."""
    return stamp(sel("job_events_sub_ns", *matchers))


def events_at(selector: str, joined: str = "") -> str:
    """Annotation: each event's own time (ms) as the value, seen from the step before and the
    step after it (Grafana aligns the range's end down to a step)."""
    seen = f"{stamp(selector, STEP)} or {stamp(selector, STEP, ahead=True)}"
    return f"1000 * (({seen}){joined})"
