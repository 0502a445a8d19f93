"""What is being accelerated: each target's task accuracy on the requests the speed tables time.

Every decoding method is lossless (its output equals greedy autoregressive decoding token for
token), so accuracy belongs to a *target x request*, not to a method: score the AR output once and
it holds for PLD, ToolSpec and OoO-Spec alike. A speedup on calls the target gets wrong is still a
speedup, but a reader should see what kind of calls these small targets write.

* **BFCL** is scored by BFCL's own AST checker (``bfcl_eval.eval_checker.ast_eval.ast_checker``
  from the pinned ``bfcl-eval`` package, the version whose data files our loader reads), not by a
  re-implementation: its rules (string normalisation, int-to-float, optional parameters marked by
  ``""``, any order for parallel calls, ...) are part of the benchmark's definition. It is given
  BFCL's own function docs (from the package's data files, looked up by the entry id; our
  ``request.tools`` are converted to JSON Schema and no longer carry BFCL's type words) and the
  possible answers our loader kept in ``request.meta["acceptable"]``. Irrelevance entries follow
  BFCL's ``relevance_file_runner`` rule: right when no call is decoded.
* **API-Bank and ToolAlpaca** have one gold call list per request (``request.gold``). Two rates:
  *name match* (the same function names in the same order) and *exact match* (the same calls,
  arguments equal after JSON canonicalisation: key order ignored, ``1.0 == 1`` as in JSON).
  Requests whose gold could not be parsed upstream (``gold == []``) are counted in ``n`` but not
  scored.

Decoded calls come from the target's output text through its surface format
(:func:`parse_calls`), the same parser the rest of the pipeline uses; a text with no call is
``parsed = False`` (wrong, except for irrelevance).

``bfcl-eval`` is installed with ``--no-deps`` (requirements-nodeps.txt): its declared dependencies
are its model handlers' SDKs (openai, anthropic, vllm, ...) and ``numpy==1.26.4``, which would
replace our pins. The checker itself needs only the standard library and four of the package's own
modules; one of them, ``constants.model_config``, imports every model handler just to answer
whether a model spells ``math.factorial`` as ``math_factorial``. We register a stand-in for that
one module before importing the checker (:func:`bfcl_checker`): our surface formats keep dotted
names as written, which is the ``underscore_to_dot=False`` answer. The checking code is BFCL's,
unchanged.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Iterable

import pandas as pd

from ooospec.data.bfcl import language_of
from ooospec.data.request import Call, Request

BFCL_MODEL_NAME = "ooospec"  # the model name we give BFCL's checker (it only asks about dotted names)


@dataclass
class AccuracyRecord:
    """One request's score. ``None`` where a measure does not apply (BFCL has no exact match
    against one canonical call, irrelevance has no names, a request without gold is unscored)."""

    request_id: str
    benchmark: str
    category: str | None  # BFCL's category (simple_python, parallel, irrelevance, ...)
    target: str
    parsed: bool  # at least one call decoded from the output
    n_calls: int
    name_match: bool | None
    exact_match: bool | None  # API-Bank, ToolAlpaca
    bfcl_valid: bool | None  # BFCL (incl. irrelevance), by BFCL's checker
    error: str = ""  # the checker's error text, a parse error, or why the request is unscored
    error_type: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- BFCL's checker ------------------------------------------------------------------------------

class _NoDotRenaming(dict):
    """Stand-in ``MODEL_CONFIG_MAPPING``: every model keeps ``.`` in function names."""

    def __missing__(self, key: str) -> Any:
        return types.SimpleNamespace(underscore_to_dot=False)


@lru_cache(maxsize=1)
def bfcl_checker() -> tuple[Callable[..., dict[str, Any]], Any]:
    """``(ast_checker, Language)`` from the installed ``bfcl-eval``.

    ``bfcl_eval.constants.model_config`` is replaced by a module holding only
    ``MODEL_CONFIG_MAPPING`` (see the module docstring) unless the real one is already imported.
    Importing nothing else keeps BFCL's ``eval_config`` (which creates result/score folders next
    to the installed package) out of the process.
    """
    name = "bfcl_eval.constants.model_config"
    try:
        import bfcl_eval  # noqa: F401
    except ImportError as err:
        raise ImportError("BFCL accuracy needs bfcl-eval: pip install --no-deps -r requirements-nodeps.txt") from err
    if name not in sys.modules:
        stand_in = types.ModuleType(name)
        stand_in.__doc__ = "ooospec stand-in: the checker reads only MODEL_CONFIG_MAPPING[...].underscore_to_dot"
        stand_in.MODEL_CONFIG_MAPPING = _NoDotRenaming()
        sys.modules[name] = stand_in
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker, Language


def bfcl_version() -> str:
    from importlib.metadata import version

    return version("bfcl-eval")


@lru_cache(maxsize=32)
def _bfcl_function_docs(category: str) -> dict[str, list[dict[str, Any]]]:
    path = resources.files("bfcl_eval") / "data" / f"BFCL_v4_{category}.json"
    if not path.is_file():
        raise FileNotFoundError(f"bfcl-eval {bfcl_version()} has no data file for category {category!r} ({path})")
    docs = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            entry = json.loads(line)
            docs[entry["id"]] = entry["function"]
    return docs


def bfcl_functions(request: Request) -> list[dict[str, Any]]:
    """BFCL's own function docs for a BFCL request (its types: ``dict``, ``float``, ``tuple``...)."""
    category = request.meta.get("category")
    if not category:
        raise ValueError(f"request {request.id}: no BFCL category in meta")
    entry_id = request.id.removeprefix("bfcl-")
    docs = _bfcl_function_docs(category)
    if entry_id not in docs:
        raise KeyError(f"request {request.id}: entry {entry_id!r} not in bfcl-eval {bfcl_version()}'s {category} file")
    return docs[entry_id]


def bfcl_check(request: Request, calls: list[Call], functions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """BFCL's verdict ``{"valid": bool, "error": [...], "error_type": str}`` for decoded calls.

    Irrelevance (``category`` containing ``irrelevance``): valid when no call was decoded, as in
    BFCL's ``relevance_file_runner``. Otherwise BFCL's ``ast_checker`` on the calls in BFCL's
    model-output form ``[{name: {argument: value}}]``. ``functions`` overrides the docs looked up
    from the package (hand-made entries).
    """
    category = str(request.meta.get("category") or "")
    if "irrelevance" in category:
        if calls:
            return {"valid": False, "error": ["Valid syntax. Successfully decode AST when it should not."],
                    "error_type": "irrelevance_error:decoder_success"}
        return {"valid": True, "error": []}
    if "acceptable" not in request.meta:
        raise ValueError(f"request {request.id}: no BFCL possible answer (meta['acceptable'])")
    ast_checker, language_enum = bfcl_checker()
    functions = bfcl_functions(request) if functions is None else functions
    language = language_enum(language_of(category))
    model_output = [{call.name: call.arguments} for call in calls]
    try:
        return ast_checker(functions, model_output, request.meta["acceptable"], language, category, BFCL_MODEL_NAME)
    except Exception as err:  # BFCL's runner would crash; we record it against the output
        return {"valid": False, "error": [f"BFCL checker raised {type(err).__name__}: {err}"],
                "error_type": "checker_exception"}


# --- call match (API-Bank, ToolAlpaca) -----------------------------------------------------------

def _canonical_value(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)  # JSON has one number type: 1.0 and 1 are the same value
    if isinstance(value, dict):
        return {str(k): _canonical_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical_value(v) for v in value]
    return value


def canonical_call(call: Call) -> str:
    """A call as canonical JSON: sorted keys, compact, integral floats as integers."""
    return json.dumps({"name": call.name, "arguments": _canonical_value(call.arguments)},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def call_match(gold: list[Call], calls: list[Call]) -> tuple[bool, bool]:
    """(name match, exact match): the same function names in order; the same canonical calls in order."""
    names = [c.name for c in calls] == [g.name for g in gold]
    exact = names and [canonical_call(c) for c in calls] == [canonical_call(g) for g in gold]
    return names, exact


# --- scoring ---------------------------------------------------------------------------------------

def parse_calls(request: Request, text: str, surface: Any) -> tuple[list[Call], str]:
    """Calls in a target's output text via its surface format (an object or a format name);
    ``(calls, parse error text)``."""
    if isinstance(surface, str):
        from ooospec.models.formats import get_surface

        surface = get_surface(surface)
    try:
        return list(surface.for_request(request).parse(text)), ""
    except (ValueError, KeyError, TypeError) as err:
        return [], f"{type(err).__name__}: {err}"


def score_output(request: Request, calls: list[Call], *, target: str = "",
                 functions: list[dict[str, Any]] | None = None, parse_error: str = "") -> AccuracyRecord:
    """Score one request's decoded calls against its gold (see the module docstring for the rules).

    ``functions``: BFCL function docs for a hand-made BFCL request (else looked up by id).
    """
    category = request.meta.get("category") if request.benchmark == "bfcl" else None
    base = dict(request_id=request.id, benchmark=request.benchmark, category=category, target=target,
                parsed=bool(calls), n_calls=len(calls))
    if request.benchmark == "bfcl":
        verdict = bfcl_check(request, calls, functions)
        names = None if request.gold is None else sorted(c.name for c in calls) == sorted(g.name for g in request.gold)
        error = "; ".join(str(e) for e in verdict.get("error", []))
        return AccuracyRecord(**base, name_match=names, exact_match=None, bfcl_valid=bool(verdict["valid"]),
                              error=error or parse_error, error_type=str(verdict.get("error_type", "")) if error else "")
    if not request.gold:
        return AccuracyRecord(**base, name_match=None, exact_match=None, bfcl_valid=None,
                              error="no gold call (unparsed upstream); not scored", error_type="no_gold")
    names, exact = call_match(request.gold, calls)
    error_type = "" if exact else ("no_call" if not calls else ("wrong_arguments" if names else "wrong_name"))
    return AccuracyRecord(**base, name_match=names, exact_match=exact, bfcl_valid=None,
                          error=parse_error, error_type=error_type)


def score_text(request: Request, text: str, surface: Any, *, target: str = "",
               functions: list[dict[str, Any]] | None = None) -> AccuracyRecord:
    """`score_output` on the calls a target's surface format parses out of its output ``text``."""
    calls, error = parse_calls(request, text, surface)
    return score_output(request, calls, target=target, functions=functions, parse_error=error)


def _rate(values: pd.Series) -> float:
    known = values.dropna()
    return float(known.astype(float).mean()) if len(known) else float("nan")


def accuracy_table(records: Iterable[AccuracyRecord | dict[str, Any]], by: tuple[str, ...] = ("benchmark",)) -> pd.DataFrame:
    """One row per group (default: benchmark; e.g. ``by=("target", "benchmark")``).

    Columns: ``n`` (every request, scored or not), ``scored`` (requests with a measure),
    ``parse rate`` (an output with at least one call), ``name match``, ``exact match``
    (API-Bank/ToolAlpaca), ``BFCL valid`` (BFCL's checker; irrelevance = no call); rates are over
    the requests where the measure applies (NaN where it never does).
    """
    rows = [r.to_dict() if isinstance(r, AccuracyRecord) else dict(r) for r in records]
    columns = list(by) + ["n", "scored", "parse rate", "name match", "exact match", "BFCL valid"]
    if not rows:
        return pd.DataFrame(columns=columns)
    frame = pd.DataFrame(rows)
    out = []
    for key, group in frame.groupby(list(by), sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        scored = group["exact_match"].notna() | group["bfcl_valid"].notna()
        out.append({**dict(zip(by, key)), "n": len(group), "scored": int(scored.sum()),
                    "parse rate": float(group["parsed"].astype(float).mean()),
                    "name match": _rate(group["name_match"]), "exact match": _rate(group["exact_match"]),
                    "BFCL valid": _rate(group["bfcl_valid"])})
    return pd.DataFrame(out, columns=columns)


__all__ = ["AccuracyRecord", "accuracy_table", "bfcl_check", "bfcl_checker", "bfcl_functions", "call_match",
           "canonical_call", "parse_calls", "score_output", "score_text"]
