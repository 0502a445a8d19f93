#!/usr/bin/env python
"""Probe: does the Qwen target write its call when the AI's last words open the call's turn?

65% of API-Bank's evaluation requests end with an ``AI:`` line (e.g. "Sure, let me check that for
you.") that upstream follows with the ``API-Request``. We render it as a finished assistant turn
and open a new one (the chat template's generation prompt); the history renders an ``AI:`` text
and the call after it as *one* turn. So the alternative is to leave that last assistant message
open (``continue_final_message=True``) for the target to complete with its call. This script
decodes the first N such requests (prompt-hash order) greedily both ways and records whether the
output parses as a call in the target's frozen surface.

It reads evaluation requests to measure the issue's own aim (the API-Bank parse rate); the
committed prompts did not change on its account (the open turn did worse: see the ToolSpec chapter).

    python tools/probe_open_final_turn.py --n 24   # about 5 min on one core
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ooospec.data.build import load_split
from ooospec.models.prompts import openai_tools
from ooospec.models.target import load_role
from ooospec.paths import artifact_path
from ooospec.provenance import code_commit

RENDERINGS = ("new turn (committed)", "open last assistant turn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--target", default="qwen2.5-coder-0.5b")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--max-new-tokens", type=int, default=80)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = load_role(args.target, args.profile)
    tok = target.tokenizer
    requests = load_split("eval_apibank")
    ending = [r for r in requests
              if r.messages[-1]["role"] == "assistant" and not r.messages[-1].get("tool_calls")]
    chosen = sorted(ending, key=lambda r: (r.prompt_hash, r.id))[:args.n]
    rows, began = [], time.time()
    for request in chosen:
        texts = {RENDERINGS[0]: target.prompt_text(request),
                 RENDERINGS[1]: tok.apply_chat_template(request.messages, tools=openai_tools(request),
                                                        continue_final_message=True, tokenize=False)}
        for rendering, text in texts.items():
            ids = torch.tensor([tok(text, add_special_tokens=False).input_ids])
            with torch.no_grad():
                out = target.model.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens,
                                            eos_token_id=target.eos_token_ids)
            output = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            calls = target.surface_for(request).parse(output)
            rows.append({"request_id": request.id, "rendering": rendering, "parsed": bool(calls),
                         "functions": [c.name for c in calls], "gold": [c.name for c in request.gold or []],
                         "output": output})
        print(request.id, [r["parsed"] for r in rows[-2:]], flush=True)
    out = artifact_path("committed", "probes", "apibank-open-final-turn", "outputs.jsonl")
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    (out.parent / "provenance.json").write_text(json.dumps({
        "made_by": f"python tools/probe_open_final_turn.py --n {args.n} --target {args.target} --profile {args.profile}",
        "code_commit": code_commit(), "requests": len(chosen), "of_requests_ending_with_ai_text": len(ending),
        "of_apibank_requests": len(requests), "max_new_tokens": args.max_new_tokens,
        "parsed": {k: sum(r["parsed"] for r in rows if r["rendering"] == k) for k in RENDERINGS},
        "seconds": round(time.time() - began, 1), "torch": torch.__version__}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
