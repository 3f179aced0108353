"""How figures are labelled in text: the ESTIMATE tag of figures partly from a model, and
"no samples" where none was stored."""

from __future__ import annotations

from wattline.workloads.output import quantities as q

#: The text of a figure derived from energy where no sample was stored at all (not "0 J").
NO_SAMPLES = "no samples"


def estimate_tag(share: float) -> str:
    """The label of figures from energy of which ``share`` is a model estimate: "ESTIMATE"
    (all of it), "partly ESTIMATE (N % model)", or "" (none)."""
    if share <= 0:
        return ""
    if share >= 1 - 1e-9:
        return "ESTIMATE"
    return f"partly ESTIMATE ({q.share(share)} model)"


def tagged(text: str, share: float) -> str:
    tag = estimate_tag(share)
    return f"{text} {tag}" if tag and text != q.NA else text
