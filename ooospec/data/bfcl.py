"""BFCL v4 single-turn AST categories -> `Request`.

* Question and answer files are JSON Lines despite their ``.json`` names; they are joined on the
  full ``id`` (and an id mismatch is an error).
* ``messages`` = the single turn's messages as given (live entries may open with a system
  message); no system message is added.
* Tools: BFCL's ``FunctionDoc`` with its own types converted by :func:`schema.bfcl_parameters`
  (``dict`` -> object, ``float`` -> number, ``tuple`` -> array, ``any`` -> unconstrained;
  Java/JavaScript parameters -> strings). Dotted function names (``math.factorial``) are kept
  as-is; the surface format decides how to spell them.
* **Canonical gold rule.** BFCL lists acceptable values per argument. The canonical gold call
  takes, for every argument, the **first** acceptable value, and **leaves the argument out when
  that first value is ``""``** (BFCL's "may be omitted" marker). Nested dict arguments apply the
  same rule recursively to their own value lists, and so does a list of such dicts. The argument order is the order of the answer
  file. The full sets are kept in ``meta["acceptable"]`` (the upstream ``ground_truth``) so a
  checker can accept any listed value. Parallel calls keep the answer file's order (BFCL accepts
  any order).
* Irrelevance entries (``gold = None``: the right answer is no call) are loaded separately.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ooospec.data.loading import SourceLoad, check_gold, read_json_lines, require
from ooospec.data.raw import raw_file
from ooospec.data.request import Call, Request
from ooospec.data.schema import DataError, bfcl_parameters, function_spec

V4_DIR = "bfcl/bfcl_eval-2026.3.23"
CORE = ("simple_python", "multiple", "parallel", "parallel_multiple")
LIVE = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
JAVA_JS = ("simple_java", "simple_javascript")
IRRELEVANCE = ("irrelevance",)
LIVE_IRRELEVANCE = ("live_irrelevance",)


def question_path(category: str) -> str:
    return f"{V4_DIR}/BFCL_v4_{category}.json"


def answer_path(category: str) -> str:
    return f"{V4_DIR}/possible_answer/BFCL_v4_{category}.json"


def language_of(category: str) -> str:
    if category.endswith("javascript"):
        return "javascript"
    if category.endswith("java"):
        return "java"
    return "python"


def canonical_value(options: Any) -> tuple[Any, bool]:
    """First acceptable value (recursing into nested dicts); (value, omit?)."""
    if not isinstance(options, list) or not options:
        return options, False
    first = options[0]
    if first == "":
        return None, True
    if isinstance(first, dict):
        return canonical_arguments(first), False
    if isinstance(first, list) and first and all(_is_acceptable_map(d) for d in first):
        return [canonical_arguments(d) for d in first], False  # a list of nested dicts
    return first, False


def _is_acceptable_map(value: Any) -> bool:
    """A nested dict in BFCL's answer form: every value is a list of acceptable values."""
    return isinstance(value, dict) and bool(value) and all(isinstance(v, list) for v in value.values())


def canonical_arguments(acceptable: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, options in acceptable.items():
        value, omit = canonical_value(options)
        if not omit:
            out[key] = value
    return out


def canonical_calls(ground_truth: list[dict[str, Any]], where: str) -> list[Call]:
    calls = []
    for k, item in enumerate(ground_truth):
        if not isinstance(item, dict) or len(item) != 1:
            raise DataError(f"{where}: ground_truth[{k}] is not a single-key {{name: arguments}} dict")
        (name, acceptable), = item.items()
        if not isinstance(acceptable, dict):
            raise DataError(f"{where}: ground_truth[{k}] arguments of {name!r} are not an object")
        calls.append(Call(name, canonical_arguments(acceptable)))
    return calls


def bfcl_tools(functions: list[dict[str, Any]], where: str, language: str) -> list[dict[str, Any]]:
    tools = []
    for k, fn in enumerate(functions):
        require(fn, ("name", "parameters"), f"{where} function {k}")
        params = bfcl_parameters(fn["parameters"], f"{where} function {fn['name']}", language)
        tools.append(function_spec(fn["name"], fn.get("description", ""), params, f"{where} function {fn['name']}"))
    return tools


def load_category(category: str, root: Path | None = None, with_answers: bool = True) -> SourceLoad:
    qrel = question_path(category)
    load = SourceLoad(source=f"bfcl-{category}", split="eval", files=[qrel])
    questions = read_json_lines(raw_file(qrel, root=root))
    answers: list[dict[str, Any]] = []
    if with_answers:
        arel = answer_path(category)
        load.files.append(arel)
        answers = read_json_lines(raw_file(arel, root=root))
        if len(answers) != len(questions):
            raise DataError(f"{arel}: {len(answers)} answers for {len(questions)} questions in {qrel}")
    language = language_of(category)
    for i, question in enumerate(questions):
        where = f"{qrel}:{i + 1}"
        require(question, ("id", "question", "function"), where)
        turns = question["question"]
        if not isinstance(turns, list) or len(turns) != 1:
            raise DataError(f"{where} ({question['id']}): expected exactly one turn, got {len(turns) if isinstance(turns, list) else turns!r}")
        messages = [{"role": m["role"], "content": m["content"]} for m in turns[0]]
        tools = bfcl_tools(question["function"], f"{where} ({question['id']})", language)
        gold: list[Call] | None = None
        meta: dict[str, Any] = {"category": category}
        if with_answers:
            answer = answers[i]
            require(answer, ("id", "ground_truth"), f"{answer_path(category)}:{i + 1}")
            if answer["id"] != question["id"]:
                raise DataError(f"{answer_path(category)}:{i + 1}: id {answer['id']!r} does not match question {question['id']!r}")
            gold = canonical_calls(answer["ground_truth"], f"{answer_path(category)}:{i + 1}")
            meta["acceptable"] = answer["ground_truth"]
        request = Request(id=f"bfcl-{question['id']}", benchmark="bfcl", split="eval", messages=messages,
                          tools=tools, gold=gold, source=load.source, meta=meta)
        check_gold(load, request, qrel, question["id"], strict=False)
        load.requests.append(request)
    return load


def load_eval(include_live: bool = False, include_java_js: bool = False, root: Path | None = None) -> list[SourceLoad]:
    categories = CORE + (LIVE if include_live else ()) + (JAVA_JS if include_java_js else ())
    return [load_category(c, root) for c in categories]


def load_irrelevance(include_live: bool = False, root: Path | None = None) -> list[SourceLoad]:
    categories = IRRELEVANCE + (LIVE_IRRELEVANCE if include_live else ())
    return [load_category(c, root, with_answers=False) for c in categories]
