#!/usr/bin/env python3
"""The HaS-against-semantic-cache frontier from hasten-loadtest eval reports.

Reads one or more report.json files of runs over the same workload (each with its own
cloud-only run, against which drops are paired), prints every system's first-occurrence
point (DAR, paired DHR drop, gold-recall drop, CAR) as a Markdown table, and for each HaS
point which semantic-cache points it dominates: accepts at least as much while losing no
more DHR and no more gold recall.

    bench/frontier.py run/has-eval/tuning-*/report.json
"""

import argparse
import json
import sys


def label(system):
    params = ",".join(f"{k}={v}" for k, v in system["params"].items())
    return f"{system['name']} {params}".strip()


def points(path):
    with open(path) as f:
        report = json.load(f)
    systems = report["systems"]
    baseline = next((s for s in systems if s["name"] == "cloud-only"), None)
    if baseline is None:
        sys.exit(f"{path}: no cloud-only run to pair against")
    gold = baseline["first_occurrence"]["gold_recall_at_k"]
    for system in systems:
        if system["name"] == "cloud-only":
            continue
        first = system["first_occurrence"]
        yield {
            "label": label(system),
            "semantic": system["name"] == "semantic-cache",
            "has": system["name"].startswith("has"),
            "queries": first["queries"],
            "dar": first["dar"],
            "dhr_drop": 100 * (first.get("paired_dhr_drop") or 0.0),
            "gold_drop": 100 * (gold - first["gold_recall_at_k"]),
            "car": first.get("car"),
            "report": path,
        }


def dominates(a, b):
    return a["dar"] >= b["dar"] and a["dhr_drop"] <= b["dhr_drop"] and a["gold_drop"] <= b["gold_drop"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+")
    args = parser.parse_args()
    rows = [p for path in args.reports for p in points(path)]
    semantic = [r for r in rows if r["semantic"]]
    print("| system | first occurrences | DAR | paired DHR drop (pt) | gold drop (pt) | CAR | dominates |")
    print("|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (not r["semantic"], r["label"])):
        beaten = [s["label"].split()[-1] for s in semantic if r["has"] and dominates(r, s)]
        car = "" if r["car"] is None else f"{r['car']:.3f}"
        print(
            f"| {r['label']} | {r['queries']} | {r['dar']:.3f} | {r['dhr_drop']:.2f} | "
            f"{r['gold_drop']:.2f} | {car} | {', '.join(beaten)} |"
        )


if __name__ == "__main__":
    main()
