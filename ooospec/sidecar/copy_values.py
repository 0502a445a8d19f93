"""Copy-aware decoding of string slots: a string value stays a span of the request's own text.

Most string values a target writes occur verbatim in the dialogue (73% on dev), and about half of
the sidecar's wrong strings were invented where a span of the request was right (an id made up,
"Paris, France" for "Paris"). Plain argmax keeps nothing near the request. This module makes one
change to a string row's greedy step, and only while the row is inside a JSON string:

* the chosen token must keep the string's content a substring of the request text (or close the
  string on such a substring); among the ``top_k`` highest-scoring tokens the first that does is
  taken, provided its log-probability is within ``margin`` nats of the best token's;
* if none is, the row takes the plain greedy token and writes free text from then on (what it
  copied so far stays: there is no backtracking).

So a row whose greedy answer already is a span is unchanged, and a row that the model is sure
writes new text (a date reformatted, a number spelled out) is unchanged too. Character level, not
token level: the span may be tokenized differently inside a JSON string than in the dialogue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ooospec.data.request import Request
from ooospec.sidecar.slots import compact_json

QUOTE = '"'


@dataclass(frozen=True)
class CopySettings:
    """``margin``: nats below the best token a copying token may score; ``top_k``: tokens looked at."""

    margin: float = 4.0
    top_k: int = 16

    def to_dict(self) -> dict[str, Any]:
        return {"margin": self.margin, "top_k": self.top_k}


def request_text(request: Request) -> str:
    """Every text a value may be copied from: each message's content and earlier calls' arguments."""
    parts = []
    for message in request.messages:
        content = message.get("content")
        if content:
            parts.append(content if isinstance(content, str) else compact_json(content))
        for tool_call in message.get("tool_calls") or []:
            function = tool_call.get("function", tool_call)
            arguments = function.get("arguments")
            if arguments:
                parts.append(arguments if isinstance(arguments, str) else compact_json(arguments))
    return "\n".join(parts)


def string_body(answer: str) -> tuple[str, bool] | None:
    """(content, closed) of an answer that is a JSON string so far; None when it is not one.

    ``answer`` is the row's text after its leading space. A closed string may only be followed by
    whitespace; an escape inside the content is not followed (None: the row writes free text)."""
    if not answer.startswith(QUOTE):
        return None
    rest = answer[1:]
    if "\\" in rest:
        return None
    end = rest.find(QUOTE)
    if end < 0:
        return rest, False
    if rest[end + 1:].strip():
        return None
    return rest[:end], True


def keeps_span(answer: str, text: str) -> bool:
    """Whether ``answer`` (a row's text so far) is still a copy of a span of ``text``: not a string
    yet (nothing to check), or an open string whose content occurs in ``text``, or a closed one
    whose whole content does (and is not empty)."""
    body = string_body(answer)
    if body is None:
        return not answer.lstrip().startswith(QUOTE) and QUOTE not in answer
    content, closed = body
    return content in text and (bool(content) or not closed)


class SpanCopier:
    """Per-wave state of copy-aware decoding: which rows copy, and their answers so far."""

    def __init__(self, token_texts: Sequence[str], text: str, string_rows: list[bool], settings: CopySettings,
                 lead: str = " "):
        self.token_texts = token_texts
        self.text = text
        self.settings = settings
        self.lead = lead
        self.copying = list(string_rows)  # by original row: still constrained
        self.answers = ["" for _ in string_rows]
        self.changed = [False for _ in string_rows]  # a token other than greedy was taken

    def _answer(self, row: int, token: int) -> str:
        raw = self.answers[row] + self.token_texts[token]
        return raw[len(self.lead):] if raw.startswith(self.lead) else raw.lstrip()

    def choose(self, logits: torch.Tensor, rows: list[int], eos: set[int]) -> list[int]:
        """The token of each active row (``rows``: original row index per logits row)."""
        chosen = logits.argmax(-1).tolist()
        flagged = [p for p, row in enumerate(rows) if self.copying[row]]
        if flagged:
            scores = torch.log_softmax(logits[flagged].float(), dim=-1)
            top = torch.topk(scores, min(self.settings.top_k, scores.shape[-1]), dim=-1)
            for i, p in enumerate(flagged):
                row = rows[p]
                pick = self._copying_token(row, top.values[i].tolist(), top.indices[i].tolist(), eos)
                if pick is None:
                    self.copying[row] = False
                else:
                    self.changed[row] |= pick != chosen[p]
                    chosen[p] = pick
        for p, row in enumerate(rows):
            if chosen[p] not in eos:
                self.answers[row] += self.token_texts[chosen[p]]
        return chosen

    def _copying_token(self, row: int, values: list[float], indices: list[int], eos: set[int]) -> int | None:
        best = values[0]
        for value, token in zip(values, indices):
            if value < best - self.settings.margin:
                return None
            if token in eos:
                answer = self.answers[row][len(self.lead):] if self.answers[row].startswith(self.lead) else self.answers[row]
                body = string_body(answer.strip())
                if body is None or body[1]:  # ending is fine outside a string or after it closed
                    return token
                continue
            if keeps_span(self._answer(row, token), self.text):
                return token
        return None


def string_slot(schema: Any) -> bool:
    """Whether a parameter schema admits a string (the rows copy-aware decoding constrains)."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    return kind == "string" or (isinstance(kind, list) and "string" in kind)

