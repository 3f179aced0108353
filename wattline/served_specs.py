"""What to count from an inference server's Prometheus metrics, each spec one line (a flag's or a
config entry's value), and presets for the servers whose metric names are known.

Grammar, for a unit and for a latency histogram alike::

    NAME=METRIC[{MATCHER,...}] [by LABEL,...]      e.g.
    output_tokens=vllm:generation_tokens_total{model_name=~"llama.*"} by model_name
    e2e=vllm:e2e_request_latency_seconds by (model_name)

NAME is a short name, ``[a-z][a-z0-9_]*`` (a unit's kind, a histogram's name). METRIC is a metric
name as the server exposes it, colons allowed: for a unit, a counter's sample (a counter exposed
without ``_total`` is matched with or without it, as prometheus_client's parsers name every
counter's samples ``_total``) or a histogram's ``_sum``/``_count``; for a latency, a histogram's
base name (its ``_bucket``, ``_sum`` and ``_count`` are read). A MATCHER is ``LABEL OP "VALUE"``,
OP one of ``=``, ``!=``, ``=~``, ``!~`` as in PromQL: a regex matches the whole value, an absent
label is the empty value; VALUE is double-quoted with ``\\\\``, ``\\"`` and ``\\n`` escapes. ``by``
(its list in parentheses or not) splits the counted series by those labels' values (one series
per model, say); every other label is summed over. A ``by`` may also be given apart
(:func:`parse_unit`'s ``by``, for a ``--by`` flag). A bad spec is a :class:`ValueError` of one
line naming what is wrong.

:data:`PRESETS` holds each known server's specs with the documents their names come from.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from wattline.text import clip

NAME = re.compile(r"[a-z][a-z0-9_]*")
METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
OPS = ("=~", "!~", "!=", "=")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_SELECTOR = re.compile(r"([^{}\s]*)(?:\{(.*)\})?", re.DOTALL)
_BY = re.compile(r"\s+by\s+")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher: ``label op "value"``."""

    label: str
    op: str
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when ``labels`` pass (an absent label is the empty value, as in PromQL)."""
        have = labels.get(self.label, "")
        if self.op in ("=", "!="):
            return (have == self.value) == (self.op == "=")
        return (re.fullmatch(self.value, have) is not None) == (self.op == "=~")

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.label}{self.op}"{escaped}"'


@dataclass(frozen=True, slots=True)
class Spec:
    """A parsed spec: what ``name`` counts (a unit kind) or reads (a latency histogram)."""

    name: str
    metric: str
    matchers: tuple[Matcher, ...] = ()
    by: tuple[str, ...] = ()

    def selects(self, labels: Mapping[str, str]) -> bool:
        """True when a series with ``labels`` (a histogram's without ``le``) is one of this spec's."""
        return all(m.matches(labels) for m in self.matchers)

    def split(self, labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """The ``by`` labels' values of a series (absent: empty), in ``by``'s order."""
        return tuple((label, labels.get(label, "")) for label in self.by)

    def __str__(self) -> str:
        selector = f"{{{','.join(map(str, self.matchers))}}}" if self.matchers else ""
        by = f" by {','.join(self.by)}" if self.by else ""
        return f"{self.name}={self.metric}{selector}{by}"


def parse_unit(text: str, by: Sequence[str] = ()) -> Spec:
    """A unit spec from its line; ``by`` adds labels given apart (not with a ``by`` in the line).
    A unit is not split by ``le``: stored, that label marks a latency histogram's series."""
    spec = _parse(text, by, "unit")
    if "le" in spec.by:
        raise ValueError(f"unit spec {clip(text)}: le names a histogram's buckets; a unit cannot be split by it")
    return spec


def parse_latency(text: str, by: Sequence[str] = ()) -> Spec:
    """A latency histogram's spec from its line: METRIC is the histogram's base name, and ``le``
    is neither matched nor split on (it names the buckets)."""
    spec = _parse(text, by, "latency")
    if spec.metric.endswith(_HISTOGRAM_PARTS):
        raise ValueError(f"latency spec {clip(text)}: name the histogram, without _bucket, _sum or _count")
    if "le" in spec.by or any(m.label == "le" for m in spec.matchers):
        raise ValueError(f"latency spec {clip(text)}: the le label names the buckets; it cannot be matched or split")
    return spec


def _parse(text: str, extra_by: Sequence[str], what: str) -> Spec:
    def bad(problem: str) -> ValueError:
        return ValueError(f"{what} spec {clip(text)}: {problem}")

    name, equals, rest = text.strip().partition("=")
    if not equals:
        raise bad("expected NAME=METRIC[{MATCHERS}] [by LABELS]")
    if not NAME.fullmatch(name):
        raise bad(f"NAME must be a short name [a-z][a-z0-9_]*, got {clip(name)}")
    # A matcher's value may hold " by ": the split is looked for after the selector's braces.
    by_at = _BY.search(rest, rest.rfind("}") + 1)
    selector, by = (rest[: by_at.start()], _labels(rest[by_at.end() :], bad)) if by_at else (rest, ())
    if by and extra_by:
        raise bad("by is given twice: in the spec and apart")
    by = by or tuple(_label(label, bad) for label in extra_by)
    if len(set(by)) < len(by):
        raise bad(f"a by label is named twice: {', '.join(by)}")
    parts = _SELECTOR.fullmatch(selector.strip())
    if parts is None:
        raise bad(f"expected METRIC or METRIC{{MATCHERS}}, got {clip(selector.strip())}")
    metric, matchers = parts.groups()
    if not METRIC.fullmatch(metric):
        raise bad(f"METRIC must be a Prometheus metric name [a-zA-Z_:][a-zA-Z0-9_:]*, got {clip(metric)}")
    return Spec(name, metric, _matchers(matchers or "", bad), by)


def _labels(text: str, bad: Callable[[str], ValueError]) -> tuple[str, ...]:
    inner = text.strip()
    if inner.startswith("(") and inner.endswith(")"):
        inner = inner[1:-1]
    return tuple(_label(label.strip(), bad) for label in inner.split(","))


def _label(label: str, bad: Callable[[str], ValueError]) -> str:
    if not LABEL.fullmatch(label) or label.startswith("__"):
        raise bad(f"a label name is [a-zA-Z_][a-zA-Z0-9_]* (not starting __), got {clip(label)}")
    return label


def _matchers(text: str, bad: Callable[[str], ValueError]) -> tuple[Matcher, ...]:
    found: list[Matcher] = []
    at = 0
    while text[at:].strip():
        match = _MATCHER.match(text, at)
        if match is None:
            raise bad(f'expected LABEL OP "VALUE" (OP one of {" ".join(OPS)}) at {clip(text[at:])}')
        label, op, quoted = match.groups()
        value = re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), quoted)
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise bad(f"{label}{op}: not a regular expression ({exc})") from None
        found.append(Matcher(_label(label, bad), op, value))
        at = match.end()
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Preset:
    """A known server's specs (lines of the grammar above), where its names come from, and what
    a caller should know of its figures."""

    units: tuple[str, ...]
    latencies: tuple[str, ...]
    sources: tuple[str, ...]
    note: str

    def unit_specs(self) -> list[Spec]:
        return [parse_unit(line) for line in self.units]

    def latency_specs(self) -> list[Spec]:
        return [parse_latency(line) for line in self.latencies]


#: Known servers' specs. Each name is as the sources show it; tests/fixtures/served_metrics/ holds
#: an exposition of each in the server's shape.
PRESETS: dict[str, Preset] = {
    "vllm": Preset(
        units=(
            "requests=vllm:request_success_total by model_name",
            "input_tokens=vllm:prompt_tokens_total by model_name",
            "output_tokens=vllm:generation_tokens_total by model_name",
        ),
        latencies=("e2e=vllm:e2e_request_latency_seconds by model_name",),
        sources=(
            "https://docs.vllm.ai/en/stable/usage/metrics/",
            "https://github.com/vllm-project/vllm/blob/main/vllm/v1/metrics/loggers.py",
        ),
        note="requests are finished ones of every finished_reason (stop, length, abort); engines are summed",
    ),
    "triton": Preset(
        units=(
            "requests=nv_inference_request_success by model",
            "inferences=nv_inference_count by model",
            "request_duration_us=nv_inference_request_duration_us by model",
        ),
        latencies=(),
        sources=("https://github.com/triton-inference-server/server/blob/main/docs/user_guide/metrics.md",),
        note=(
            "no latency histogram by default: request_duration_us is a counter of microseconds, so a "
            "window's mean latency is its request_duration_us units over its requests, and no quantile"
        ),
    ),
    "tgi": Preset(
        units=(
            "requests=tgi_request_success",
            "input_tokens=tgi_request_input_length_sum",
            "output_tokens=tgi_request_generated_tokens_sum",
        ),
        latencies=("e2e=tgi_request_duration",),
        sources=(
            "https://huggingface.co/docs/text-generation-inference/reference/metrics",
            "https://github.com/huggingface/text-generation-inference/blob/main/router/src/server.rs",
        ),
        note=(
            "tokens are the sums of per-request histograms (TGI has no token counters): input_tokens "
            "counts validated requests, output_tokens successful ones; one model a server, no model label"
        ),
    ),
    "torchserve": Preset(
        units=(
            "requests=ts_inference_requests_total by model_name",
            "inference_us=ts_inference_latency_microseconds by model_name",
        ),
        latencies=(),
        sources=(
            "https://pytorch.org/serve/metrics_api.html",
            "https://github.com/pytorch/serve/blob/master/ts/configs/metrics.yaml",
        ),
        note=(
            "needs metrics_mode=prometheus (or legacy); no latency histogram: inference_us is a counter "
            "of microseconds, so a window's mean latency is its inference_us units over its requests"
        ),
    ),
}


def preset(name: str) -> Preset:
    """The preset called ``name``; ValueError naming the known ones otherwise."""
    if name not in PRESETS:
        raise ValueError(f"no preset {clip(name)}: known are {', '.join(PRESETS)}")
    return PRESETS[name]


def service_specs(count: str | None, name: str | None) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    """What a holder that names a service in one value counts (a pod's annotations, a systemd
    unit's entry): (its unit specs, the job's own first; its latency histograms' specs), from
    ``count`` (unit specs, one a line) or else the preset called ``name`` (all its units and
    latency histograms). ValueError (one line) for a bad spec, no spec, or a kind named twice."""
    if count is None:
        server = preset(name or "")
        return tuple(server.unit_specs()), tuple(server.latency_specs())
    specs = tuple(parse_unit(line) for line in count.splitlines() if line.strip())
    names = [spec.name for spec in specs]
    if not specs:
        raise ValueError("no unit spec given")
    if len(set(names)) < len(names):
        raise ValueError(f"a unit kind is named twice: {', '.join(names)}")
    return specs, ()
