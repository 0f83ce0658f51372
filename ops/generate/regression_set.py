"""Generate the default regression set, `serve/common/data/regression.jsonl`, deterministically.

    python -m ops.generate.regression_set            # rewrite the shipped file
    python -m ops.generate.regression_set --check    # exit 1 when the shipped file is out of date

One JSON object per line: `text` (required), `label` (optional: one of the default zero-shot
labels, when the text was written about that topic), and `kind` (which family below made it;
ignored by `rollout verify` except in its per-kind breakdown). The families: topical sentences
per label, short inputs, long inputs near and past the 256-token truncation limit, unicode and
emoji, mixed languages, code, numbers, near-duplicates, texts that mix two topics (close to a
label boundary), and word salad. Everything comes from one seeded `random.Random`, so the file
is the same on every machine and Python 3.11+.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

OUTPUT = Path(__file__).resolve().parents[2] / "serve" / "common" / "data" / "regression.jsonl"
SEED = 20240611

TOPICS = {
    "technology": (
        "GPU", "compiler", "smartphone", "cloud server", "neural network", "database",
        "operating system", "chip maker", "software update", "laptop", "open-source library",
        "quantum computer", "browser", "data center", "robot", "API", "encryption", "5G network",
    ),
    "sports": (
        "striker", "championship", "marathon", "goalkeeper", "tennis final", "coach",
        "world cup", "relay team", "penalty kick", "league table", "home run", "Olympic sprinter",
        "cycling stage", "referee", "playoffs", "boxing match", "transfer window", "ski jump",
    ),
    "politics": (
        "parliament", "senator", "election", "coalition", "prime minister", "referendum",
        "opposition leader", "ballot", "campaign", "minister", "treaty", "governor", "cabinet",
        "constitutional court", "voters", "diplomat", "sanctions", "bill",
    ),
    "business": (
        "quarterly earnings", "stock market", "merger", "startup", "investors", "central bank",
        "interest rates", "retail chain", "supply chain", "revenue", "shareholders", "IPO",
        "inflation", "bond yields", "CEO", "layoffs", "venture capital", "trade deficit",
    ),
    "entertainment": (
        "film festival", "pop star", "box office", "streaming series", "album", "director",
        "red carpet", "sitcom", "concert tour", "Oscar nominee", "video game", "band",
        "reality show", "actress", "movie trailer", "theatre", "comedian", "soundtrack",
    ),
    "health": (
        "vaccine", "hospital", "nurse", "diabetes", "clinical trial", "flu season", "surgeon",
        "mental health", "diet", "cancer screening", "blood pressure", "pandemic", "therapy",
        "sleep", "pharmacy", "vitamin", "heart disease", "public health agency",
    ),
}
VERBS = (
    "announced", "criticised", "praised", "delayed", "launched", "questioned", "reported on",
    "raised concerns about", "celebrated", "reviewed", "cancelled", "expanded", "defended",
)
FRAMES = (
    "The {a} {v} the {b} on {day}.",
    "Experts say the {a} could change how the {b} works.",
    "Yesterday the {a} {v} a new plan for the {b}.",
    "Why the {a} matters for every {b} this year",
    "{A} and {b}: what happened after the announcement",
    "A report on the {a} {v} the latest figures from the {b}.",
    "Local news: the {a} {v} the {b} after weeks of debate.",
    "Is the {a} really better than the {b}?",
)
DAYS = ("Monday", "Tuesday", "Friday", "the weekend", "March 3", "New Year's Eve")
FILLER = (
    "Officials did not comment further.", "More details are expected next week.",
    "Critics were not convinced.", "The story is developing.", "Analysts were surprised.",
    "Many people shared the news online.", "It was the first time in a decade.",
)
FOREIGN = {
    "de": ("Die Regierung hat heute neue Regeln beschlossen.", "Das Spiel endete unentschieden."),
    "fr": ("Le gouvernement a annoncé une réforme.", "Le film sort en salle mercredi."),
    "es": ("El equipo ganó el campeonato ayer.", "La empresa presentó sus resultados."),
    "ru": ("Правительство объявило о новых мерах.", "Команда выиграла матч со счётом 2:1."),
    "zh": ("政府宣布了新的经济政策。", "这部电影在周末票房第一。", "医院开始接种新疫苗。"),
    "ja": ("新しいスマートフォンが発売されました。", "選挙の結果が発表された。"),
    "ar": ("أعلنت الحكومة عن خطة جديدة.", "فاز الفريق بالبطولة."),
    "hi": ("सरकार ने नई नीति की घोषणा की।", "अस्पताल में नए डॉक्टर आए।"),
    "ko": ("회사가 새로운 칩을 공개했다.", "배우가 영화제에서 상을 받았다."),
    "pt": ("O banco central manteve os juros.", "A vacina chegou aos postos de saúde."),
}
EMOJI = ("🚀", "⚽", "🗳️", "📈", "🎬", "💉", "🔥", "😂", "👍🏽", "🇺🇳", "❤️", "🤖", "🏥", "💰", "🎵")
ODD = ("naïve café", "Zürich", "Ångström", "Ελληνικά", "ﬁnance ligature", "e\u0301", "\u200bzero",
       "full\u3000width", "ＡＢＣ", "𝔪𝔞𝔱𝔥", "ｓｐｏｒｔｓ", "tab\tinside", "line\nbreak")
CODE = (
    "def predict(x):\n    return model(x).argmax(-1)",
    "SELECT name, SUM(revenue) FROM sales GROUP BY name ORDER BY 2 DESC LIMIT 10;",
    '{"model": "minilm", "batch_size": 32, "dtype": "int8"}',
    "for i in range(10): print(i ** 2)",
    "kubectl rollout undo deployment/gateway --to-revision=3",
    "if (score > 0.5) { return 'pos'; } else { return 'neg'; }",
    "git commit -m 'fix flaky test' && git push origin main",
    "import torch; torch.set_num_threads(2)",
    "<div class=\"match-score\">2 - 1</div>",
    "curl -X POST localhost:8000/v1/predict -d '{\"inputs\": [\"hi\"]}'",
)
WORDS = tuple(w for terms in TOPICS.values() for term in terms for w in term.split()) + (
    "the", "a", "of", "blue", "quickly", "seven", "under", "river", "window", "sang", "paper",
    "maybe", "loud", "green", "between", "north", "small", "because", "stone", "dream",
)


def topical(rng: random.Random, label: str) -> str:
    a, b = rng.sample(TOPICS[label], 2)
    text = rng.choice(FRAMES).format(a=a, b=b, A=a[0].upper() + a[1:], v=rng.choice(VERBS),
                                     day=rng.choice(DAYS))
    if rng.random() < 0.5:
        text += " " + rng.choice(FILLER)
    return text


def mixed_topics(rng: random.Random) -> str:
    one, two = rng.sample(sorted(TOPICS), 2)
    a, b = rng.choice(TOPICS[one]), rng.choice(TOPICS[two])
    return rng.choice(FRAMES).format(a=a, b=b, A=a[0].upper() + a[1:], v=rng.choice(VERBS),
                                     day=rng.choice(DAYS))


def long_text(rng: random.Random, words: int) -> str:
    label = rng.choice(sorted(TOPICS))
    parts, count = [], 0
    while count < words:
        sentence = topical(rng, label) if rng.random() < 0.7 else mixed_topics(rng)
        parts.append(sentence)
        count += len(sentence.split())
    return " ".join(parts)


def numbers(rng: random.Random) -> str:
    forms = (
        lambda: (
            f"Revenue rose {rng.uniform(0, 40):.1f}% "
            f"to ${rng.randint(1, 999)}.{rng.randint(0, 9)}bn"
        ),
        lambda: (
            f"Final score {rng.randint(0, 7)}-{rng.randint(0, 7)} "
            f"after {rng.randint(90, 120)} minutes"
        ),
        lambda: f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(1990, 2030)}",
        lambda: (
            f"BP {rng.randint(100, 180)}/{rng.randint(60, 110)} mmHg, "
            f"HR {rng.randint(50, 120)}"
        ),
        lambda: " ".join(
            str(rng.randint(0, 10 ** rng.randint(1, 9))) for _ in range(rng.randint(1, 12))
        ),
        lambda: f"{rng.uniform(-1e6, 1e6):.3e} ± {rng.random():.4f}",
        lambda: (
            f"Turnout was {rng.randint(30, 90)}% "
            f"with {rng.randint(1000, 99999):,} votes counted"
        ),
    )
    return rng.choice(forms)()


def near_duplicates(rng: random.Random, base: str) -> list[str]:
    def typo(text: str) -> str:
        i = rng.randrange(len(text))
        return text[:i] + text[i + 1:] if len(text) > 3 else text + "s"

    edits = (
        str.lower, str.upper, lambda t: t + "!", lambda t: t.rstrip(".") + "?",
        lambda t: "  " + t + "  ", typo, lambda t: t.replace(" the ", " a ", 1),
        lambda t: t + " " + rng.choice(EMOJI), lambda t: t.replace(" ", "  ", 1),
    )
    return [edit(base) for edit in rng.sample(edits, 3)]


def unicode_text(rng: random.Random, labels: list[str]) -> str:
    """A topical sentence strewn with emoji, framed by odd characters, or emoji alone."""
    text = topical(rng, rng.choice(labels))
    style = rng.randrange(3)
    if style == 0:
        return " ".join(w + (rng.choice(EMOJI) if rng.random() < 0.3 else "")
                        for w in text.split())
    if style == 1:
        return f"{rng.choice(ODD)} {text} {rng.choice(ODD)}"
    return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 8)))


def multilingual(rng: random.Random, labels: list[str]) -> str:
    """Another language's sentence, alone or after an English one."""
    foreign = rng.choice(FOREIGN[rng.choice(sorted(FOREIGN))])
    if rng.random() < 0.4:
        return foreign
    return f"{topical(rng, rng.choice(labels))} {foreign}"


def generate(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    labels = sorted(TOPICS)
    rows: list[dict] = []

    def add(kind: str, text: str, label: str | None = None) -> None:
        if text.strip():
            rows.append({"text": text, **({"label": label} if label else {}), "kind": kind})

    for i in range(900):  # topical, labelled
        label = labels[i % len(labels)]
        add("topical", topical(rng, label), label)
    for _ in range(300):  # two topics in one sentence: near a label boundary
        add("boundary", mixed_topics(rng))
    for _ in range(150):  # short: one to three words
        add("short", " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))))
    for _ in range(60):  # long: well past the truncation limit
        add("long", long_text(rng, rng.randint(300, 420)))
    for _ in range(90):  # near the 256-token limit, on both sides
        add("near-limit", long_text(rng, rng.randint(170, 215)))
    for _ in range(160):  # unicode and emoji
        add("unicode", unicode_text(rng, labels))
    for _ in range(160):  # other languages, alone and mixed with English
        add("multilingual", multilingual(rng, labels))
    for _ in range(120):  # code
        snippet = rng.choice(CODE)
        add("code", snippet if rng.random() < 0.5 else f"{topical(rng, 'technology')}\n{snippet}")
    for _ in range(140):  # numbers
        add("numbers", numbers(rng))
    for _ in range(100):  # near-duplicates: a labelled base and three small edits
        label = rng.choice(labels)
        base = topical(rng, label)
        add("near-duplicate", base, label)
        for variant in near_duplicates(rng, base):
            add("near-duplicate", variant, label)
    for _ in range(120):  # word salad
        add("salad", " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40))))
    rng.shuffle(rows)
    return rows


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.generate.regression_set",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the shipped file")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render(generate())
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(
                f"{args.output} is out of date: run python -m ops.generate.regression_set",
                file=sys.stderr,
            )
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {len(text.splitlines())} inputs to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
