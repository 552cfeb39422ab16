#!/usr/bin/env python3
"""Split EntityQuestions by subject into a tuning set and a reporting set (issue 50).

Every default of HaS is chosen on the tuning set and reported on the reporting set, so no
subject is in both: a subject's questions (under all its relations, homologous to each
other) go to one side, chosen by a seeded hash of the subject's name. The hash, not a
shuffle, keeps a subject on its side when questions are added or the input is reordered.

    bench/eq-split.py [--questions FILE] [--seed 50] [--tuning-share 0.5] [--out DIR]
    bench/eq-split.py --check      the split's counts and digests against bench/eq-split.json

Writes DIR/tuning.jsonl.gz and DIR/reporting.jsonl.gz (gzip without a timestamp, so equal
splits are equal bytes) and prints their counts and SHA-256; bench/eq-split.json records
those of the committed split (seed 50, half and half, the shared train+dev file).
"""
import argparse
import gzip
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "eq-split.json")


def side(subject: str, seed: int, tuning_share: float) -> str:
    digest = hashlib.sha256(f"{seed}:{subject}".encode()).digest()
    draw = int.from_bytes(digest[:8], "big") / 2**64
    return "tuning" if draw < tuning_share else "reporting"


def split(questions_path: str, seed: int, tuning_share: float, out: str) -> dict:
    lines = {"tuning": [], "reporting": []}
    subjects = {"tuning": set(), "reporting": set()}
    with_article = {"tuning": 0, "reporting": 0}
    with gzip.open(questions_path, "rt", encoding="utf-8") as questions:
        for number, line in enumerate(questions, 1):
            if not line.strip():
                continue
            try:
                question = json.loads(line)
                subject = question["subject"]
            except (json.JSONDecodeError, KeyError) as error:
                sys.exit(f"{questions_path}:{number}: not an EntityQuestions line ({error})")
            name = side(subject, seed, tuning_share)
            lines[name].append(line if line.endswith("\n") else line + "\n")
            subjects[name].add(subject)
            with_article[name] += bool(question.get("has_article"))
    os.makedirs(out, exist_ok=True)
    summary = {"seed": seed, "tuning_share": tuning_share, "sets": {}}
    for name, rows in lines.items():
        path = os.path.join(out, f"{name}.jsonl.gz")
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write("".join(rows).encode("utf-8"))
        with open(path, "rb") as written:
            digest = hashlib.sha256(written.read()).hexdigest()
        summary["sets"][name] = {
            "questions": len(rows),
            "questions_with_article": with_article[name],
            "subjects": len(subjects[name]),
            "sha256": digest,
        }
    shared = subjects["tuning"] & subjects["reporting"]
    if shared:
        sys.exit(f"{len(shared)} subjects on both sides (e.g. {sorted(shared)[0]!r})")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions",
                        default=os.path.join(HERE, "..", "..", "shared", "data",
                                             "entityquestions-train-dev.jsonl.gz"))
    parser.add_argument("--seed", type=int, default=50)
    parser.add_argument("--tuning-share", type=float, default=0.5)
    parser.add_argument("--out", default="run/eq-split")
    parser.add_argument("--check", action="store_true",
                        help="fail unless the split equals the one recorded in bench/eq-split.json")
    args = parser.parse_args()
    if not 0 < args.tuning_share < 1:
        sys.exit("--tuning-share must lie strictly between 0 and 1")
    summary = split(args.questions, args.seed, args.tuning_share, args.out)
    print(json.dumps(summary, indent=2))
    if args.check:
        with open(RECORD) as recorded:
            expected = json.load(recorded)
        if expected != summary:
            sys.exit(f"the split differs from {RECORD}")
        print(f"the split equals {RECORD}")


if __name__ == "__main__":
    main()
