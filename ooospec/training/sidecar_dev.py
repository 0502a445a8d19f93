"""The sidecar's dev waves, reviewed: against whom they are scored, as trained and as served, and
whose miss each miss is.

A dev wave is scored twice: against the Qwen target's own call for the request (its teacher trace:
what greedy verification accepts) and against gold. The waves written when an adapter was trained
are its raw answers, in the arithmetic it was trained in (fp32 after the merge); the runtime serves
the same adapter in the profile's arithmetic with schema-required slots never answered null
(``required_values``) and, since the API-disjoint dev chose it, no optional slot either
(``optional_values``, `ooospec.sidecar.predictor.SlotPredictor`). `served_dev_waves` re-runs the
same dev requests that way, so the book scores the hint the target actually receives. The case
tables (`function_cases`, `value_cases`) split each miss against the target by gold: a miss where
the target departed from gold and the sidecar did not is the target's quirk, not the sidecar's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ooospec.data.request import Call, Request
from ooospec.models.adapters import read_frozen
from ooospec.progress import progress_bar
from ooospec.sidecar.metrics import score_to_dict, score_wave
from ooospec.sidecar.predictor import OPTIONAL_VALUES
from ooospec.sidecar.slots import CALLS_DIALOGUE, SlotPromptConfig, compact_json, dialogue_coverage
from ooospec.training.slot_rows import calls_from_gold
from ooospec.stage import Stage, append_jsonl, done_ids, read_jsonl
from ooospec.training.lora import AdapterRun
from ooospec.training.sidecar import SidecarConfig, find_finished, load_requests, select_calls, sidecar_config

if TYPE_CHECKING:  # annotations only: pandas is imported where a frame is built
    import pandas as pd

AS_TRAINED = "as trained (raw answers)"
AS_SERVED = "as served (every slot filled)" if OPTIONAL_VALUES else "as served (required slots filled)"
# the committed served waves beside an adapter: required slots filled (before optional slots were)
# or every slot filled
SERVED_WAVES_FILE = "dev_predictions_served-fill-{profile}.jsonl" if OPTIONAL_VALUES else "dev_predictions_served-{profile}.jsonl"


def stored_dev_waves(adapter_dir: Path) -> list[dict[str, Any]]:
    """The dev waves written when the adapter was trained (next to its ``adapter/`` folder)."""
    path = Path(adapter_dir).parent / "dev_predictions.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no stored dev waves for the adapter {adapter_dir}")
    return list(read_jsonl(path))


def served_dev_waves(adapter_dir: Path, profile: str = "cpu") -> list[dict[str, Any]]:
    """The adapter's dev waves as the runtime serves it: the profile's sidecar arithmetic,
    ``required_values`` and ``optional_values`` as served, on the same dev requests as its trained waves.

    A committed copy next to the adapter is used when present (``make reproduce`` then runs no
    sidecar here); otherwise the waves are computed into a stage keyed by the adapter's hash and
    the profile, resuming by request after an interruption (about a second per request)."""
    from ooospec.sidecar.predictor import SlotPredictor

    adapter_dir = Path(adapter_dir)
    committed = adapter_dir.parent / SERVED_WAVES_FILE.format(profile=profile)
    if committed.exists():
        return list(read_jsonl(committed))
    stage = Stage("sidecar-served-dev", {"adapter_sha256": read_frozen(adapter_dir)["sha256"], "profile": profile,
                                         "required_values": True,
                                         **({"optional_values": True} if OPTIONAL_VALUES else {})})
    out = stage.path(SERVED_WAVES_FILE.format(profile=profile))
    if not stage.done:
        trained = stored_dev_waves(adapter_dir)
        finished = done_ids(out, field="request_id")
        todo = [w for w in trained if w["request_id"] not in finished]
        if todo:
            by_id = {r.id: r for r in load_requests("dev")}
            predictor = SlotPredictor.from_frozen(adapter_dir, profile)  # as served
            for stored in progress_bar(todo, desc="served dev waves", unit="req"):
                request = by_id[stored["request_id"]]
                reference = Call.from_dict(stored["reference"])
                wave = predictor.predict_wave(request)
                score = score_to_dict(score_wave(request, reference, wave))
                append_jsonl(out, [{"reference": stored["reference"], "score": score, **wave.to_dict()}])
        stage.mark_done(waves=len(trained))
    return list(read_jsonl(out))


def dev_waves(adapter_dir: Path, profile: str = "cpu", served: bool = False) -> list[dict[str, Any]]:
    """`served_dev_waves`, or `stored_dev_waves` (as trained)."""
    return served_dev_waves(adapter_dir, profile) if served else stored_dev_waves(adapter_dir)


def served_examples(adapter_dir: Path, profile: str = "cpu") -> "pd.DataFrame":
    """Dev requests whose hint changes between the waves as trained and as served: the target's
    own call beside both payloads (what filling the required slots repairs, and what it breaks)."""
    import pandas as pd

    target = dev_references(load_requests("dev"), profile)[TARGET_REFERENCE]
    served = {w["request_id"]: w["payload"] for w in served_dev_waves(adapter_dir, profile)}
    rows = []
    for wave in stored_dev_waves(adapter_dir):
        rid = wave["request_id"]
        if served.get(rid) != wave["payload"]:
            call = target.get(rid)
            rows.append({"request": rid, "target's own call": None if call is None else compact_json(call.to_dict()),
                         AS_TRAINED: wave["payload"], AS_SERVED: served.get(rid)})
    return pd.DataFrame(rows)


def dev_scores(adapter_dir: Path, profile: str = "cpu", served: bool = False) -> "pd.DataFrame":
    """An adapter's dev waves (as trained, or ``served``) scored against the target's own calls (the
    teacher's trace of the same request: what decides whether the target accepts the hint) and
    against gold, on the same requests: one row per reference."""
    import pandas as pd

    from ooospec.sidecar.metrics import rescore

    predictions = dev_waves(adapter_dir, profile, served)
    requests = load_requests("dev")
    by_id = {r.id: r for r in requests}
    references = dev_references(requests, profile)
    columns = ("requests", "function_index_accuracy", "argument_value_exact_match", "whole_call_exact_match",
               "null_precision", "null_recall")
    rows = []
    for name, calls in references.items():
        metrics = rescore(predictions, by_id, calls)
        rows.append({"reference": name, **{c: metrics.get(c) for c in columns}})
    return pd.DataFrame(rows).set_index("reference")


TARGET_REFERENCE, GOLD_REFERENCE = "target's own call (teacher trace)", "gold call"


def dev_references(requests: list[Request], profile: str = "cpu") -> dict[str, dict[str, Any]]:
    """The two calls a dev wave is scored against, by request id: the target's own (its teacher
    trace) and gold."""
    teacher, _ = select_calls(requests, "dev", SidecarConfig(profile=profile, calls="teacher"))
    return {
        TARGET_REFERENCE: {k.request_id: k.call for k in teacher.kept if k.origin == "teacher"},
        GOLD_REFERENCE: {k.request_id: k.call for k in calls_from_gold(requests).kept},
    }


FUNCTION_CASES = ("sidecar = target = gold", "sidecar = target != gold", "sidecar != target = gold (sidecar's miss)",
                  "sidecar = gold != target (target departs from gold)", "all three differ")


def function_cases(predicted: dict[str, str | None], target: dict[str, str], gold: dict[str, str]) -> dict[str, int]:
    """Requests with a sidecar call (its name, or None) and a target call, by which of the sidecar's,
    the target's and gold's function names agree. A sidecar is scored against the target (what greedy verification accepts), so a
    miss where the sidecar wrote gold's function and the target did not is the target's departure
    from gold, which no amount of gold-like training data teaches."""
    counts = dict.fromkeys(FUNCTION_CASES, 0)
    for request_id, t in target.items():
        if request_id not in predicted:  # a request the sidecar was not run on
            continue
        p, g = predicted[request_id], gold.get(request_id)
        if p == t:
            case = FUNCTION_CASES[0] if t == g else FUNCTION_CASES[1]
        elif t == g:
            case = FUNCTION_CASES[2]
        elif p == g:
            case = FUNCTION_CASES[3]
        else:
            case = FUNCTION_CASES[4]
        counts[case] += 1
    return counts


def function_cases_table(adapter_dirs: dict[str, Path], profile: str = "cpu", served: bool = False) -> "pd.DataFrame":
    """`function_cases` of each adapter's dev waves (as trained, or ``served``), one column per adapter."""
    import pandas as pd

    references = dev_references(load_requests("dev"), profile)
    target, gold = ({i: c.name for i, c in references[ref].items()} for ref in (TARGET_REFERENCE, GOLD_REFERENCE))
    columns = {}
    for label, adapter_dir in adapter_dirs.items():
        waves = dev_waves(adapter_dir, profile, served)
        columns[label] = function_cases({w["request_id"]: (w["call"] or {}).get("name") for w in waves}, target, gold)
    return pd.DataFrame(columns)


VALUE_CASES = ("sidecar = target", "sidecar != target = gold (sidecar's miss)",
               "target departs from gold, sidecar = gold", "target departs from gold, sidecar differs from both")
_NO_GOLD = object()  # gold names another function: none of its values can agree with the target's


def value_cases(predicted: dict[str, Call | None], target: dict[str, Call], gold: dict[str, Call]) -> dict[str, int]:
    """Argument slots of the requests where the sidecar names the target's function, by which of the
    sidecar's, the target's and gold's values agree; a slot counts where the target or the sidecar
    fills it (both null is no slot). ``null`` is a value here: a slot the target fills and gold
    leaves empty (a placeholder the user never gave) is a departure from gold, as is every slot of
    a request whose gold call names another function."""
    counts = dict.fromkeys(VALUE_CASES, 0)
    for request_id, t in target.items():
        p = predicted.get(request_id)
        if p is None or p.name != t.name:
            continue
        g = gold.get(request_id)
        gold_args = g.arguments if g is not None and g.name == t.name else None
        for name in set(p.arguments) | set(t.arguments):
            pv, tv = p.arguments.get(name), t.arguments.get(name)
            if pv is None and tv is None:
                continue
            gv = _NO_GOLD if gold_args is None else gold_args.get(name)
            if pv == tv:
                case = VALUE_CASES[0]
            elif tv == gv:
                case = VALUE_CASES[1]
            elif pv == gv:
                case = VALUE_CASES[2]
            else:
                case = VALUE_CASES[3]
            counts[case] += 1
    return counts


def value_cases_table(adapter_dirs: dict[str, Path], profile: str = "cpu", served: bool = True) -> "pd.DataFrame":
    """`value_cases` of each adapter's dev waves (by default as served), one column per adapter."""
    import pandas as pd

    references = dev_references(load_requests("dev"), profile)
    columns = {}
    for label, adapter_dir in adapter_dirs.items():
        waves = dev_waves(adapter_dir, profile, served)
        predicted = {w["request_id"]: None if w["call"] is None else Call.from_dict(w["call"]) for w in waves}
        columns[label] = value_cases(predicted, references[TARGET_REFERENCE], references[GOLD_REFERENCE])
    return pd.DataFrame(columns)


def frozen_passes(profile: str = "cpu") -> dict[str, AdapterRun]:
    """The frozen adapters of presets ``teacher`` (one pass), ``pass2`` and ``scale``, by label."""
    found = {label: find_finished(sidecar_config(preset, profile)) for label, preset in
             (("one pass", "teacher"), ("two passes", "pass2"), ("every trace, one pass", "scale"))}
    return {label: run for label, run in found.items() if run is not None}


def passes_table(profile: str = "cpu") -> "pd.DataFrame | None":
    """Dev scores of the one-pass adapter (preset ``teacher``), of the second pass started from it
    (preset ``pass2``) and of one pass over every committed trace (preset ``scale``), whichever are
    frozen, on the same requests: their waves as trained and as served, each against the target's
    own calls and against gold; None while fewer than two are frozen."""
    import pandas as pd

    runs = frozen_passes(profile)
    if len(runs) < 2:
        return None
    tables = []
    for hint, served in ((AS_SERVED, True), (AS_TRAINED, False)):  # as served first: the bench's hint
        for label, run in runs.items():
            table = dev_scores(run.adapter_dir, profile, served).reset_index()
            table = table.drop(columns=["null_precision", "null_recall"])
            table.insert(0, "adapter", f"{label} ({run.record['sha256'][:12]})")
            table.insert(0, "hint", hint)
            table["final_loss"] = run.record["train"]["final_loss"]
            table["train_min"] = round(run.record["train"]["seconds"] / 60)
            tables.append(table)
    every = pd.concat(tables)
    # the target's calls first (they decide acceptance), the settings and adapters in their order
    every = every.sort_values("reference", key=lambda r: r != TARGET_REFERENCE, kind="stable")
    return every.set_index(["reference", "hint", "adapter"])


def function_case_lines(table: "pd.DataFrame") -> list[str]:
    """`function_cases_table` in a sentence per adapter: its misses against the target, how many are
    its own and how many the target's departures from gold, and its rate without its own misses."""
    lines = []
    for label, counts in table.items():
        n = int(counts.sum())
        misses = n - int(counts[FUNCTION_CASES[0]] + counts[FUNCTION_CASES[1]])
        own = int(counts[FUNCTION_CASES[2]])
        lines.append(f"{label}: {misses} of {n} function indices differ from the target's; {own} are the sidecar's own "
                     f"misses, {int(counts[FUNCTION_CASES[3]])} the target's departures from gold, "
                     f"{int(counts[FUNCTION_CASES[4]])} all three differ. Without its own misses it would name the "
                     f"target's function on {n - misses + own} of {n} ({(n - misses + own) / max(n, 1):.2f}).")
    return lines


def value_case_lines(table: "pd.DataFrame") -> list[str]:
    """`value_cases_table` in a sentence per adapter: slots that agree with the target, the sidecar's
    own misses, and the slots where the target departs from gold."""
    lines = []
    for label, counts in table.items():
        n = int(counts.sum())
        departs = int(counts[VALUE_CASES[2]] + counts[VALUE_CASES[3]])
        lines.append(f"{label}: {int(counts[VALUE_CASES[0]])} of {n} slots agree with the target; "
                     f"{int(counts[VALUE_CASES[1]])} are the sidecar's own misses; in {departs} the target departs "
                     f"from gold ({int(counts[VALUE_CASES[2]])} of them with the sidecar writing gold's value).")
    return lines


SCORE_LABELS = {"requests": "n", "function_index_accuracy": "function index", "argument_exact_match": "arguments",
                "argument_value_exact_match": "argument values", "whole_call_exact_match": "whole call",
                "null_precision": "null precision", "null_recall": "null recall", "mean_payload_bytes": "payload B",
                "median_wave_latency_s": "wave s", "final_loss": "final loss", "train_min": "train min",
                "parse_rate": "parses", "valid_call_rate": "valid call", "name_match_rate": "name match",
                "exact_match_rate": "exact match", "mean_generate_s": "generate s", "completion_nll": "completion NLL"}


def dialogue_table(served_prompt: dict[str, Any], splits: tuple[str, ...] = ("train", "dev")) -> "pd.DataFrame":
    """What the served adapter's prompt shows of each split's dialogues, beside the prompt that
    shows earlier calls and always the request (``dialogue="calls"``, the `calls` preset's):
    requests holding earlier calls, those whose prompt shows one, and those whose prompt leaves
    out the latest user turn."""
    import pandas as pd

    prompts = {"served adapter's prompt": SlotPromptConfig(**served_prompt),
               "calls prompt": SlotPromptConfig(**{**served_prompt, "dialogue": CALLS_DIALOGUE})}
    rows = []
    for split in splits:
        requests = load_requests(split)
        for name, prompt in prompts.items():
            coverage = dialogue_coverage(requests, prompt)
            rows.append({"split": split, "prompt": name, "requests": coverage.requests,
                         "with earlier calls": coverage.with_earlier_calls,
                         "earlier calls shown": coverage.earlier_calls_shown,
                         "request left out": coverage.request_turn_dropped})
    return pd.DataFrame(rows).set_index(["split", "prompt"])


def readable(table: "pd.DataFrame", digits: int = 3) -> "pd.DataFrame":
    """A score table at page width: its metric columns under short names (`SCORE_LABELS`), rounded."""
    return table.rename(columns=SCORE_LABELS).round(digits)
