#!/usr/bin/env python3
"""Ways of choosing among Speculative RAG's drafts, compared on drafts already written.

hasten-specrag-eval saves every draft of a speculative system with its F1 and the verifier's
scores (report.json, `draft_outcomes`). Choosing is free next to drafting and verifying, so
each rule below is scored on the same drafts, without running a model:

  paper        rho_draft + rho_self-contain + rho_self-reflect (log space): what the edge does
  drafter, consistency, reflection, verifier (the latter two summed): one part, or the
               verifier's alone
  agreement    the draft whose answer agrees most with the other drafts' (summed token F1
               between answers: minimum Bayes risk), ties broken by the paper's score
  agreement-drafter  the same, ties broken by the drafter's score alone (no verifier pass)
  first, oracle  the first draft; the best draft (a perfect verifier's F1)
  random       the mean F1 of the drafts with an answer (a random pick's expected F1, as
               the edge's random ablation picks)

The rule is picked on one report (--tune) and stated on another (--report), never the
same questions. `paper` must choose the system's own answer on every question (which checks
that this script reads the drafts the way the edge chose them); its F1 here is the whole
draft's, before the reply's token limit cut any answer, and so is every rule's.

  bench/specrag-selection.py --tune run/A/report.json --report run/B/report.json
"""

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from answer_eval import f1 as token_f1  # noqa: E402  (SQuAD's token F1, as the other scripts score)

RULES = [
    "paper",
    "drafter",
    "consistency",
    "reflection",
    "verifier",
    "agreement",
    "agreement-drafter",
    "first",
]


def paper_score(d):
    return d["draft_logprob"] + d["consistency_logprob"] + d["reflection_logprob"]


KEYS = {
    "paper": paper_score,
    "drafter": lambda d: d["draft_logprob"],
    "consistency": lambda d: d["consistency_logprob"],
    "reflection": lambda d: d["reflection_logprob"],
    "verifier": lambda d: d["consistency_logprob"] + d["reflection_logprob"],
}


def argmax_first(indices, key):
    """The first index of the highest key, as the edge breaks ties."""
    best = indices[0]
    for i in indices:
        if key(i) > key(best):
            best = i
    return best


def candidates_of(drafts):
    """The drafts the edge chooses among: those with an answer, unless none has one."""
    answered = [i for i, d in enumerate(drafts) if d["answer"]]
    return answered or list(range(len(drafts)))


def choose(rule, drafts):
    candidates = candidates_of(drafts)
    if rule == "first":
        return candidates[0]
    if rule in KEYS:
        return argmax_first(candidates, lambda i: KEYS[rule](drafts[i]))
    if rule.startswith("agreement"):
        # Rounded, so that drafts with the same answer tie whatever order their supports
        # were summed in, and the tie-breaker decides between them.
        support = {
            i: round(sum(token_f1(drafts[i]["answer"], drafts[j]["answer"]) for j in candidates if j != i), 4)
            for i in candidates
        }
        tie = KEYS["drafter"] if rule == "agreement-drafter" else paper_score
        return argmax_first(candidates, lambda i: (support[i], tie(drafts[i])))
    raise ValueError(rule)


def speculative_outcomes(path, system):
    report = json.load(open(path))
    rows = []
    for question in report["per_question"]:
        for outcome in question["outcomes"]:
            if outcome["system"] == system and outcome.get("draft_outcomes"):
                rows.append((question["index"], outcome))
    if not rows:
        sys.exit(f"{path}: no {system} outcome with draft_outcomes (rerun hasten-specrag-eval)")
    return rows


def scores(rows):
    """Each rule's F1 per question, plus the oracle and a random pick's expectation."""
    per_rule = {rule: [] for rule in RULES + ["oracle", "random"]}
    for _, outcome in rows:
        drafts = outcome["draft_outcomes"]
        for rule in RULES:
            per_rule[rule].append(drafts[choose(rule, drafts)]["f1"])
        per_rule["oracle"].append(max(d["f1"] for d in drafts))
        candidates = candidates_of(drafts)
        per_rule["random"].append(sum(drafts[i]["f1"] for i in candidates) / len(candidates))
    return per_rule


def paired(a, b, resamples=2000, seed=0):
    """Mean of a - b with a 95% bootstrap interval."""
    diffs = [x - y for x, y in zip(a, b)]
    rng = random.Random(seed)
    means = sorted(
        sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(resamples)
    )
    return sum(diffs) / len(diffs), means[int(0.025 * resamples)], means[int(0.975 * resamples)]


def check_paper(rows, path):
    """`paper` must choose what the edge chose: the system's answer is that draft's answer,
    or its start where the reply's token limit cut it."""
    mismatched = [
        i
        for i, outcome in rows
        if not outcome["draft_outcomes"][choose("paper", outcome["draft_outcomes"])]["answer"].startswith(
            outcome["answer"]
        )
    ]
    if mismatched:
        sys.exit(f"{path}: the paper's rule does not choose the system's answer on questions {mismatched[:10]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tune", required=True, help="report.json the rule is picked on")
    parser.add_argument("--report", required=True, help="report.json the picked rule is stated on")
    parser.add_argument("--system", default="speculative-rag")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    tune_rows = speculative_outcomes(args.tune, args.system)
    report_rows = speculative_outcomes(args.report, args.system)
    tune, held_out = scores(tune_rows), scores(report_rows)
    check_paper(tune_rows, args.tune)
    check_paper(report_rows, args.report)

    mean = lambda xs: sum(xs) / len(xs)
    print(f"{'rule':<18} {'F1 tune':>8} {'F1 report':>10}   ({len(tune_rows)} and {len(report_rows)} questions)")
    for rule in RULES + ["random", "oracle"]:
        print(f"{rule:<18} {mean(tune[rule]):>8.3f} {mean(held_out[rule]):>10.3f}")
    picked = max(RULES, key=lambda r: mean(tune[r]))
    diff, low, high = paired(held_out[picked], held_out["paper"])
    print(
        f"picked on the tune split: {picked}; on the report split F1 {mean(held_out[picked]):.3f} "
        f"against paper {mean(held_out['paper']):.3f} (paired {diff:+.3f}, 95% {low:+.3f}..{high:+.3f})"
    )
    if args.out:
        json.dump(
            {
                "tune": {"path": args.tune, "f1": {r: mean(v) for r, v in tune.items()}},
                "report": {"path": args.report, "f1": {r: mean(v) for r, v in held_out.items()}},
                "picked": picked,
                "against_paper": {"mean": diff, "low": low, "high": high},
            },
            open(args.out, "w"),
            indent=2,
        )


if __name__ == "__main__":
    main()
