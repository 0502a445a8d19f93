"""Which draft source supplied each committed token, as text spans a reader can see.

The loop credits every committed token to one source (the first source tag of its tree node, or
``bonus`` for the target's own token at the end of an accepted path). Joining those credits with
the output tokens shows *where* a hint or a retrieved call paid off inside the call text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from ooospec.report.figures import SOURCE_COLORS



@dataclass
class Span:
    text: str
    source: str
    tokens: int


def token_credits(record: dict[str, Any]) -> list[str]:
    """One credit per output token, from a `DecodeResult.to_record()` (first token: prefill)."""
    credits = ["bonus"]
    for round_ in record["rounds"]:
        credits.extend(round_["credits"])
    if len(credits) != len(record["output_ids"]):
        raise ValueError(f"request {record.get('id')}: {len(credits)} credits for "
                         f"{len(record['output_ids'])} tokens")
    return credits


def credited_spans(record: dict[str, Any], tokenizer: Any) -> list[Span]:
    """Maximal runs of tokens with the same credit, decoded to text."""
    spans: list[Span] = []
    ids, credits = record["output_ids"], token_credits(record)
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or credits[end] != credits[start]:
            text = tokenizer.decode(ids[start:end], skip_special_tokens=False)
            spans.append(Span(text, credits[start], end - start))
            start = end
    return spans


def spans_html(spans: list[Span]) -> str:
    """The output text coloured by source, with a legend (for notebooks and the book)."""
    legend = " ".join(f'<span style="color:{c};font-weight:bold">{name}</span>'
                      for name, c in SOURCE_COLORS.items())
    body = "".join(f'<span title="{s.source}: {s.tokens} tokens" style="color:{SOURCE_COLORS.get(s.source, "#000")}">'
                   f"{html.escape(s.text)}</span>" for s in spans)
    return f'<div>source of each token: {legend}</div><pre style="white-space:pre-wrap">{body}</pre>'
