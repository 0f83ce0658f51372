"""Generate a held-out set of messy inputs, unlike the shipped regression set, so that both arms
can be judged on text the calibrated recipes never saw.

    python -m ops.generate.messy_set --out messy.jsonl                  # 1200 inputs, default seed
    python -m ops.generate.messy_set --out messy.jsonl --count 300 --seed 7
    rollout verify --set messy.jsonl --no-speed --no-store          # judge both arms on it

One JSON object per line: `text` and `kind` (the family below that made it), no `label`: the
set asks only whether the optimized arm answers like the baseline on text that looks like real
traffic, never whether either is right. The families: product, restaurant and app reviews
(slang, typos, emoji, star ratings); social-media posts (hashtags, @mentions, URLs); word
salad; mixed scripts (Latin with Cyrillic, Greek, CJK, Arabic or Devanagari fragments, and
look-alike letters inside Latin words); code snippets, JSON fragments and URLs; log lines and
stack traces; very short inputs (one to three tokens); long rambling texts, some past the
256-token truncation limit; shouting in capitals with repeated characters. None of its
vocabulary, emoji or templates comes from `ops.generate.regression_set`, and its default seed is
another, so no text is shared with `serve/common/data/regression.jsonl`. Everything comes from one
seeded `random.Random` and the file is written with `\\n` line ends as UTF-8, so it is the same
on every machine and Python 3.11+. Each text stays under the gateway's default
`max_item_chars` (8,192), so the set can also be sent through the gateway.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

from ops.cli.types import positive_int

SEED = 20261313
COUNT = 1200
MAX_CHARS = 6000  # well under the gateway's default max_item_chars (8,192)

THINGS = (
    "blender", "headphones", "air fryer", "phone case", "mattress", "hoodie", "sneakers",
    "charger", "vacuum", "kettle", "backpack", "smartwatch", "desk lamp", "yoga mat",
)
PLACES = (
    "ramen place", "taco truck", "pizzeria", "brunch spot", "sushi bar", "diner",
    "kebab shop", "bakery", "noodle house", "burger joint", "vegan cafe", "dumpling bar",
)
APPS = (
    "budgeting app", "meditation app", "banking app", "food delivery app", "dating app",
    "photo editor", "language app", "fitness tracker", "podcast player", "parking app",
)
PRAISE = (
    "lowkey amazing", "slaps", "hits different", "chef's kiss", "no cap the best",
    "actually decent", "worth every penny", "a vibe", "bussin", "goated",
)
GRIPES = (
    "mid at best", "a total scam", "broke after 2 days", "kinda sus", "straight trash",
    "crashes every time i open it", "took forever", "overpriced af", "not it", "meh",
)
REVIEW_FRAMES = (
    "{stars} this {thing} is {opinion} {emo}",
    "ok so i got the {thing} last week and honestly its {opinion}. {stars}",
    "{stars}\n{opinion}!! would {again} {emo}",
    "tried the {thing} bc my roommate wouldnt shut up about it... {opinion} tbh {emo}{emo}",
    "Update: {opinion}. customer service ghosted me. {stars}",
    "{opinion} {emo} delivery guy was nice tho. {stars} {again}",
    "5 mins in and i can already tell: {opinion}. {stars}",
)
AGAIN = ("buy again", "not recommend", "go back fr", "never order again", "gift it to my mom")
REVIEW_EMOJI = ("😭", "🙄", "💀", "🤡", "😍", "🥲", "🤌", "👎", "💯", "🍕", "🍜", "📦", "🐌",
                "✨", "🫠", "😤", "🤮", "🥳")

HANDLES = ("dana_k", "lilbyte", "mx_rivera", "the_real_pat", "noodlequeen", "zed404", "ottoK",
           "sunny.side", "grumpycat99", "vee")
TAGS = ("mondaymood", "nofilter", "ootd", "throwback", "fail", "blessed", "mood", "rant",
        "foodie", "wfh", "nerdlife", "petsofinstagram", "unpopularopinion", "relatable")
DOMAINS = ("t.co", "bit.ly", "insta.gr", "youtu.be", "example.org", "tinyurl.com", "imgur.com")
SOCIAL_FRAMES = (
    "@{h} u seeing this?? {tags} {url}",
    "cant believe this happened again lmao {tags}",
    "RT @{h}: not me crying at a {place} at 2am {emo} {tags}",
    "new post is up!! link in bio {url} {tags}",
    "@{h} @{h2} who is bringing snacks saturday {emo}",
    "{tags} {tags2} {emo}",
    "thread 🧵 1/{n}: why my {thing} hates me {url}",
)

SALAD = (
    "marmalade", "thimble", "cantilever", "ostrich", "velvet", "sprocket", "whisper", "pumice",
    "lantern", "gossamer", "turnip", "zeppelin", "corduroy", "mandolin", "pelican", "quartzite",
    "drizzle", "galoshes", "spatula", "hexagonal", "murmured", "wobbly", "crimson", "oddly",
    "against", "toward", "nor", "whenever", "its", "those", "eleven", "frozen", "hollow",
    "jumped", "softly", "inside", "without", "yonder", "sideways", "eighty",
)
SALAD_MARKS = ("", "", "", ",", ".", "?", "!", ";", " -", "...")

FRAGMENTS = {
    "cyrillic": ("привет", "спасибо большое", "кошка", "доставка опоздала", "ничего себе",
                 "очень вкусно"),
    "greek": ("καλημέρα", "ευχαριστώ", "θάλασσα", "πολύ καλό", "γεια σου"),
    "cjk": ("好吃", "快递太慢了", "猫", "ラーメン", "ありがとう", "超级好", "맛있어요"),
    "arabic": ("مرحبا", "شكرا جزيلا", "قهوة", "ممتاز جدا", "يا سلام"),
    "devanagari": ("नमस्ते", "बहुत अच्छा", "चाय", "क्या बात है", "ठीक है"),
}
HOMOGLYPHS = {"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "x": "х", "y": "у"}
MIXED_FRAMES = (
    "ordered the {w} and it was {f} honestly",
    "{f}!!! best {w} in town",
    "my grandma says {f} every time she sees the {w}",
    "{f} {f2} lol",
    "pls help, the {w} label only says {f}",
    "{F} - {w} - {f}",
)

SHORT = ("meh", "lol", "ok", "idk", "brb", "nope", "k", "hmm", "10/10", "asdf", "yikes", "ugh",
         "sry", "gg", "fr", "tbh", "???", "...", "🙃", "+1", "nah", "ty", "pls", "wut", "👀")

RAMBLE = (
    "so anyway", "and then my cousin", "which reminds me", "not that it matters but",
    "long story short (it is not short)", "okay where was i", "you know how it is",
    "the thing nobody tells you", "back in like 2016", "and honestly", "for some reason",
    "my neighbour keeps saying", "i swear", "to be fair", "right after that",
)
RAMBLE_TAILS = (
    "the bus was late again", "we ended up at a garage sale", "the cat knocked over a plant",
    "i forgot my keys twice", "the wifi died mid call", "someone brought a tuba",
    "the soup was somehow cold and hot", "my phone autocorrected everything",
    "we argued about parking for an hour", "the landlord texted a thumbs up",
    "there was glitter everywhere", "i learned what a spoke wrench is",
)

SHOUT = (
    "why is my order still not here", "who let this happen", "stop calling me",
    "this is the worst update ever", "refund me now", "i love this so much",
    "best day of my life", "do not buy this", "where is the manager", "finally it works",
)


def _typo(rng: random.Random, word: str) -> str:
    """One keyboard slip: a swapped, dropped or doubled letter."""
    if len(word) < 4:
        return word
    i = rng.randrange(1, len(word) - 1)
    slip = rng.randrange(3)
    if slip == 0:
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if slip == 1:
        return word[:i] + word[i + 1:]
    return word[:i] + word[i] + word[i:]


def _typos(rng: random.Random, text: str, rate: float) -> str:
    return " ".join(_typo(rng, w) if rng.random() < rate else w for w in text.split(" "))


def _stars(rng: random.Random) -> str:
    n = rng.randint(1, 5)
    forms = ("★" * n + "☆" * (5 - n), f"{n}/5", f"{n} stars", "⭐" * n, f"({n}★)", f"rating: {n}")
    return rng.choice(forms)


def review(rng: random.Random) -> str:
    thing = rng.choice(THINGS + PLACES + APPS)
    opinion = rng.choice(PRAISE + GRIPES)
    text = rng.choice(REVIEW_FRAMES).format(
        stars=_stars(rng), thing=thing, opinion=opinion, again=rng.choice(AGAIN),
        emo=rng.choice(REVIEW_EMOJI),
    )
    return _typos(rng, text, rng.choice((0.0, 0.1, 0.25)))


def _url(rng: random.Random) -> str:
    slug = "".join(rng.choice("abcdefghjkmnpqrstuvwxyzABCDEFGH23456789") for _ in range(8))
    return f"https://{rng.choice(DOMAINS)}/{slug}"


def _tags(rng: random.Random) -> str:
    return " ".join("#" + t for t in rng.sample(TAGS, rng.randint(1, 4)))


def social(rng: random.Random) -> str:
    h, h2 = rng.sample(HANDLES, 2)
    return rng.choice(SOCIAL_FRAMES).format(
        h=h, h2=h2, tags=_tags(rng), tags2=_tags(rng), url=_url(rng), n=rng.randint(2, 14),
        emo=rng.choice(REVIEW_EMOJI), place=rng.choice(PLACES), thing=rng.choice(THINGS),
    )


def salad(rng: random.Random) -> str:
    words = (rng.choice(SALAD) + rng.choice(SALAD_MARKS) for _ in range(rng.randint(3, 30)))
    text = " ".join(words)
    return text[0].upper() + text[1:] if rng.random() < 0.5 else text


def _fragment(rng: random.Random) -> str:
    return rng.choice(FRAGMENTS[rng.choice(sorted(FRAGMENTS))])


def _lookalike(rng: random.Random, word: str) -> str:
    """Some Latin letters swapped for Cyrillic look-alikes (what spam and phishing do)."""
    return "".join(HOMOGLYPHS[ch] if ch in HOMOGLYPHS and rng.random() < 0.5 else ch
                   for ch in word)


def mixed_script(rng: random.Random) -> str:
    word = rng.choice(THINGS + PLACES)
    if rng.random() < 0.25:
        return f"{_lookalike(rng, 'paypal')} {_lookalike(rng, word)} {_url(rng)}"
    return rng.choice(MIXED_FRAMES).format(
        w=word, f=_fragment(rng), f2=_fragment(rng), F=_fragment(rng),
    )


def _ident(rng: random.Random) -> str:
    return rng.choice(("tmp", "acc", "node", "buf", "res", "ctx", "item", "row")) + str(
        rng.randint(0, 99))


def _cut(rng: random.Random, text: str) -> str:
    """A fragment: the text with up to 12 characters cut off its end (half the time)."""
    return text[: len(text) - rng.randint(1, 12)] if rng.random() < 0.5 else text


def code(rng: random.Random) -> str:
    a, b = _ident(rng), _ident(rng)
    n = rng.randint(2, 500)
    forms = (
        lambda: f"fn {a}(v: &[u8]) -> usize {{ v.iter().filter(|b| **b > {n % 256}).count() }}",
        lambda: f"const {a} = await fetch(`/api/{b}?page=${{p}}`).then(r => r.json());",
        lambda: f"{a} := make(map[string]int, {n})\nfor k, v := range {b} {{ {a}[k] += v }}",
        lambda: f"awk -F, '$3 > {n} {{ print $1 }}' {a}.csv | sort -u | head",
        lambda: f"replicas: {n % 9 + 1}\nimage: {a}:1.{n % 30}.0\nenv:\n  - name: {b.upper()}",
        lambda: f"FROM python:3.{n % 4 + 9}-slim\nRUN pip install {a} && rm -rf /root/.cache",
        lambda: f"^(?:[a-z0-9]{{{n % 8 + 1},}})@{b}\\.(com|net)$",
        lambda: _cut(rng, json.dumps({a: {"id": n, b: [n, None, True]}, "ok": n % 2 == 0})),
        lambda: f'{{"{a}": [{n}, {n + 1}, "{b}"], "meta": {{"next": null',
        lambda: f"{_url(rng)}?utm_source={a}&utm_medium={b}&ref={n}#section-{n % 7}",
    )
    return rng.choice(forms)()


def log(rng: random.Random) -> str:
    ts = (f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
          f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z")
    ip = ".".join(str(rng.randint(1, 254)) for _ in range(4))
    mod, line = _ident(rng), rng.randint(10, 900)
    forms = (
        lambda: f"{ts} {rng.choice(('WARN', 'ERROR', 'DEBUG', 'INFO'))} [{mod}] "
                f"retrying in {rng.randint(1, 30)}s (attempt {rng.randint(2, 9)})",
        lambda: f'{ip} - - [{ts}] "GET /{mod}/{line} HTTP/1.1" '
                f'{rng.choice((200, 301, 404, 502))} {rng.randint(0, 99999)}',
        lambda: f"[{rng.uniform(0, 99999):.6f}] usb 1-{rng.randint(1, 4)}: device descriptor "
                f"read/64, error -{rng.randint(60, 110)}",
        lambda: "Traceback (most recent call last):\n"
                f'  File "/srv/app/{mod}.py", line {line}, in handle\n'
                f"    return cache[key]\nKeyError: '{_ident(rng)}'",
        lambda: f"java.lang.NullPointerException: {mod} was null\n"
                f"\tat com.shop.cart.CartService.total(CartService.java:{line})\n"
                f"\tat com.shop.api.Handler.run(Handler.java:{line + 17})",
        lambda: f"panic: runtime error: index out of range [{line}] with length {line % 7}\n\n"
                f"goroutine {rng.randint(1, 99)} [running]:\nmain.{mod}()",
    )
    return rng.choice(forms)()


def short(rng: random.Random) -> str:
    return " ".join(rng.sample(SHORT, rng.randint(1, 3)))


def long(rng: random.Random) -> str:
    """A rambling text of 150 to 450 words; the longer ones pass the 256-token limit."""
    target, parts, words = rng.randint(150, 450), [], 0
    while words < target:
        sentence = f"{rng.choice(RAMBLE)} {rng.choice(RAMBLE_TAILS)}"
        sentence += rng.choice((".", ",", " and", "...", "!!", " lol", ""))
        parts.append(sentence)
        words += len(sentence.split())
    return _typos(rng, " ".join(parts), 0.03)[:MAX_CHARS]


def _stretch(rng: random.Random, word: str) -> str:
    """The last vowel (or letter) repeated 3 to 12 times."""
    vowels = [i for i, ch in enumerate(word) if ch in "aeiouAEIOU"]
    i = vowels[-1] if vowels else len(word) - 1
    return word[:i] + word[i] * rng.randint(3, 12) + word[i + 1:]


def shouting(rng: random.Random) -> str:
    words = rng.choice(SHOUT).split()
    words = [_stretch(rng, w) if rng.random() < 0.3 else w for w in words]
    text = " ".join(words)
    if rng.random() < 0.7:
        text = text.upper()
    return text + rng.choice(("!" * rng.randint(1, 15), "?!" * rng.randint(1, 6), "", " 😤😤😤"))


# (kind, maker, share of the default 1200)
KINDS: tuple[tuple[str, Callable[[random.Random], str], int], ...] = (
    ("review", review, 240),
    ("social", social, 180),
    ("salad", salad, 120),
    ("mixed-script", mixed_script, 150),
    ("code", code, 120),
    ("log", log, 120),
    ("short", short, 90),
    ("long", long, 60),
    ("shouting", shouting, 120),
)


def quotas(count: int) -> dict[str, int]:
    """How many of each kind `count` inputs hold: shares by largest remainder, ties in order."""
    total = sum(share for _, _, share in KINDS)
    exact = [(kind, count * share / total) for kind, _, share in KINDS]
    result = {kind: int(value) for kind, value in exact}
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i][1] % 1), i))
    for i in order[: count - sum(result.values())]:
        result[exact[i][0]] += 1
    return result


def generate(count: int = COUNT, seed: int = SEED) -> list[dict]:
    """`count` rows, each kind in its share; a text already made is drawn again (a few tries)."""
    rng = random.Random(seed)
    wanted = quotas(count)
    rows: list[dict] = []
    seen: set[str] = set()
    for kind, make, _ in KINDS:
        for _ in range(wanted[kind]):
            for _ in range(20):
                text = make(rng)
                if text.strip() and text not in seen:
                    break
            if not text.strip():
                text = kind
            seen.add(text)
            rows.append({"text": text, "kind": kind})
    rng.shuffle(rows)
    return rows


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.generate.messy_set", description=__doc__.splitlines()[0],
        epilog="Then: rollout verify --set PATH --no-speed --no-store",
    )
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    parser.add_argument("--count", type=positive_int, default=COUNT,
                        help=f"how many inputs (default {COUNT})")
    parser.add_argument("--seed", type=int, default=SEED, help=f"the seed (default {SEED})")
    args = parser.parse_args(argv)
    if not args.out.parent.is_dir():
        parser.error(f"cannot write {args.out}: the folder {args.out.parent} does not exist")
    rows = generate(args.count, args.seed)
    try:
        with args.out.open("w", encoding="utf-8", newline="\n") as out:
            out.write(render(rows))
    except OSError as exc:
        parser.error(f"cannot write {args.out}: {exc.strerror}")
    kinds = ", ".join(f"{kind} {n}" for kind, n in quotas(args.count).items() if n)
    print(f"wrote {len(rows)} inputs to {args.out} ({kinds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
