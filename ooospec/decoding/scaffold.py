"""Scaffold text of a surface format, derived from its own `render` with sentinel calls.

The schema FSM must propose exactly the text a target emits around the free values, for any
surface format. Instead of hard-coding ``{"name": "`` and friends, the format renders calls whose
function name, keys and values are sentinels, and the text is split around them:

    render([F()])                 = call_open + F + noargs_close
    render([F(KA=1)])             = call_open + F + args_open + KA + kv_sep + 1 + args_close
    render([F(KA=1, KB=2)])       = ... + 1 + between + KB + kv_sep + 2 + args_close
    render([F(), G()])            = render([F()]) + call_sep + render([G()])   (when it holds)

Every piece is checked for consistency across these renderings, and argument values are checked
to appear as their JSON text (``json.dumps``), which is the one thing the FSM assumes about a
surface: a value is a JSON value, so `JsonValueScanner` can tell where it ends. The text of a
real function name or key is likewise cut out of a rendering, so escaping is the format's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ooospec.data.request import Call
from ooospec.models.surface import SurfaceFormat

FN, FN2 = "ooospecfnq", "ooospecfnz"
KA, KB = "ooospeckeya", "ooospeckeyb"
NUM_A, NUM_B = 7300001, 7300002
STR = "ooospecstrv"


class ScaffoldError(ValueError):
    """The surface format's rendering does not have the regular shape the FSM needs."""


def _split(text: str, marker: str, what: str) -> tuple[str, str]:
    if text.count(marker) != 1:
        raise ScaffoldError(f"{what}: sentinel {marker!r} occurs {text.count(marker)} times in {text!r}")
    before, after = text.split(marker)
    return before, after


@dataclass(frozen=True)
class Scaffold:
    call_open: str
    noargs_close: str
    args_open: str
    kv_sep: str
    between: str
    args_close: str
    call_sep: str | None  # None: several calls are not a concatenation of single ones

    def describe(self) -> dict[str, str | None]:
        return dict(vars(self))


def derive_scaffold(surface: SurfaceFormat) -> Scaffold:
    """Split sentinel renderings of ``surface`` into scaffold pieces (raises `ScaffoldError`)."""
    r0 = surface.render([Call(FN, {})])
    call_open, noargs_close = _split(r0, FN, "call without arguments")

    r1 = surface.render([Call(FN, {KA: NUM_A})])
    head, rest = _split(r1, FN, "call with one argument")
    if head != call_open:
        raise ScaffoldError(f"call opener differs with arguments: {head!r} vs {call_open!r}")
    args_open, rest = _split(rest, KA, "call with one argument")
    kv_sep, args_close = _split(rest, str(NUM_A), "call with one argument")

    r2 = surface.render([Call(FN, {KA: NUM_A, KB: NUM_B})])
    expected_head = call_open + FN + args_open + KA + kv_sep + str(NUM_A)
    if not r2.startswith(expected_head):
        raise ScaffoldError(f"two-argument call does not start like the one-argument call: {r2!r}")
    between, rest = _split(r2[len(expected_head) :], KB, "call with two arguments")
    if rest != kv_sep + str(NUM_B) + args_close:
        raise ScaffoldError(f"second argument is rendered differently from the first: {r2!r}")

    as_string = surface.render([Call(FN, {KA: STR})])
    if as_string != call_open + FN + args_open + KA + kv_sep + json.dumps(STR) + args_close:
        raise ScaffoldError(f"string values are not rendered as JSON strings: {as_string!r}")

    call_sep = None
    r_fg = surface.render([Call(FN, {}), Call(FN2, {})])
    r_g = surface.render([Call(FN2, {})])
    if r_fg.startswith(r0) and r_fg.endswith(r_g) and len(r_fg) >= len(r0) + len(r_g):
        call_sep = r_fg[len(r0) : len(r_fg) - len(r_g)]
    return Scaffold(call_open, noargs_close, args_open, kv_sep, between, args_close, call_sep)


def function_text(surface: SurfaceFormat, scaffold: Scaffold, name: str) -> str:
    """How ``surface`` writes the function name ``name`` inside a call."""
    text = surface.render([Call(name, {})])
    if not (text.startswith(scaffold.call_open) and text.endswith(scaffold.noargs_close)):
        raise ScaffoldError(f"function {name!r} is rendered irregularly: {text!r}")
    return text[len(scaffold.call_open) : len(text) - len(scaffold.noargs_close)]


def key_text(surface: SurfaceFormat, scaffold: Scaffold, key: str) -> str:
    """How ``surface`` writes the argument key ``key``."""
    text = surface.render([Call(FN, {key: NUM_A})])
    head = scaffold.call_open + FN + scaffold.args_open
    tail = scaffold.kv_sep + str(NUM_A) + scaffold.args_close
    if not (text.startswith(head) and text.endswith(tail)):
        raise ScaffoldError(f"argument key {key!r} is rendered irregularly: {text!r}")
    return text[len(head) : len(text) - len(tail)]
