"""Writes SQuAD v1.1 questions as JSON lines in the format the evaluations read
({"question", "answer": [golds]}, no context: the passages are retrieved), taking every
`every`-th question so that a short run spans many articles.

    python3 bench/squad-questions.py ../shared/data/squad-dev-v1.1-visible.json 25 > run/squad-questions.jsonl
"""

import json
import sys


def main(path: str, every: int) -> None:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)["data"]
    n = 0
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph.get("qas", []):
                golds = sorted({a["text"] for a in qa.get("answers", []) if a["text"].strip()})
                if golds and n % every == 0:
                    print(json.dumps({"question": qa["question"], "answer": golds}))
                n += 1


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 1)
