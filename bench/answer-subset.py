#!/usr/bin/env python3
"""Writes a small entity corpus an answer evaluation can preprocess on a small machine: the
EntityQuestions subjects (with an article) most seen in the page-view lists, then those with
the most questions, up to --entities; their articles and their questions.

usage: answer-subset.py --questions EQ.jsonl.gz --articles ARTICLES.jsonl.gz
                        --views VIEWS.csv.gz --entities 60 --out DIR
Writes DIR/questions.jsonl and DIR/articles.jsonl (same formats as the inputs).
"""
import argparse
import collections
import csv
import gzip
import json
import os


def lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        yield from f


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", required=True)
    parser.add_argument("--articles", required=True)
    parser.add_argument("--views", required=True)
    parser.add_argument("--entities", type=int, default=60)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    questions = collections.defaultdict(list)
    for line in lines(args.questions):
        q = json.loads(line)
        if q.get("has_article"):
            questions[q["subject"]].append(line)
    views = collections.Counter()
    opener = gzip.open if args.views.endswith(".gz") else open
    with opener(args.views, "rt", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            title = row["article"].replace("_", " ")
            if title in questions:
                views[title] += int(row["views"])
    chosen = [t for t, _ in views.most_common(args.entities)]
    # Then the subjects with the most questions (their own relations' homologous questions).
    for subject, _ in sorted(questions.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if len(chosen) >= args.entities:
            break
        if subject not in chosen:
            chosen.append(subject)
    wanted = set(chosen)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "questions.jsonl"), "w", encoding="utf-8") as out:
        for subject in chosen:
            out.writelines(questions[subject])
    found = 0
    with open(os.path.join(args.out, "articles.jsonl"), "w", encoding="utf-8") as out:
        for line in lines(args.articles):
            if json.loads(line)["title"] in wanted:
                out.write(line)
                found += 1
    print(json.dumps({"entities": len(chosen), "in_page_views": len(views.most_common(args.entities)),
                      "questions": sum(len(questions[s]) for s in chosen), "articles": found}))


if __name__ == "__main__":
    main()
