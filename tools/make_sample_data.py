"""Writes `keras_attn/sample_data/`, the small dataset `keras-attn demo` trains on.

    python tools/make_sample_data.py

Sentiment: 70 pairs of hand-written review sentences, each a positive sentence and its negative
counterpart about the same thing (film, food, product, travel); every fourth pair goes to dev,
so dev sentences are about things the training set never mentions, and a model has to read
the opinion, not the topic. Labels are `negative` / `positive`.

Entities: hand-written sentence templates with PER / ORG / LOC / MISC slots filled from name
lists, in CoNLL format (`token TAG`, IOB2, blank line between sentences). Dev uses templates
and names that training never shows, so the score measures generalisation, not memory.

The output is deterministic (fixed seed); the files are committed, this script documents how
they were made.
"""

import pathlib
import random

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE.parent / "keras_attn" / "sample_data"

# Sentence templates: {PER}, {ORG}, {LOC}, {MISC} are entity slots; other tokens are O.
TRAIN_TEMPLATES = [
    "{PER} joined {ORG} as chief engineer last spring .",
    "{ORG} opened a new office in {LOC} on Monday .",
    "{PER} flew from {LOC} to {LOC} for the {MISC} conference .",
    "The {MISC} festival in {LOC} sold out within an hour .",
    "{PER} and {PER} signed the agreement on behalf of {ORG} .",
    "Shares of {ORG} rose after the company reported strong sales in {LOC} .",
    "{PER} , a spokesperson for {ORG} , declined to comment .",
    "Heavy rain closed roads between {LOC} and {LOC} on Sunday .",
    "{PER} won the {MISC} prize for her first novel .",
    "{ORG} will build a factory near {LOC} , the mayor {PER} said .",
    "Fans of the {MISC} series waited outside the cinema in {LOC} .",
    "{PER} scored twice as {ORG} beat {ORG} three to one .",
    "The museum in {LOC} is showing {MISC} paintings until May .",
    "{PER} told reporters in {LOC} that talks with {ORG} would continue .",
    "Many {MISC} speakers live in the north of {LOC} .",
    "{ORG} hired {PER} to lead its research team .",
    "After ten years in {LOC} , {PER} moved back home .",
    "The {MISC} team trained in {LOC} before the final .",
    "{PER} thanked the volunteers of {ORG} for their help .",
    "A bridge collapsed near {LOC} , police said .",
]
DEV_TEMPLATES = [
    "{PER} left {ORG} to start a bakery in {LOC} .",
    "Officials from {ORG} met {PER} in {LOC} on Friday .",
    "The {MISC} film was shot on location in {LOC} .",
    "{ORG} lost the final against {ORG} despite a goal from {PER} .",
    "Travellers to {LOC} should expect delays , {ORG} warned .",
    "{PER} praised the {MISC} community of {LOC} .",
]
TRAIN_NAMES = {
    "PER": ["Maria Lopez", "John Carter", "Aiko Tanaka", "Peter Novak", "Fatima Khan",
            "Lars Eriksson", "Grace Okafor", "Chen Wei", "Olivia Brown", "Ahmed Hassan",
            "Sofia Rossi", "Daniel Kim", "Emma Schulz", "Ravi Patel", "Anna Kowalska"],
    "ORG": ["Northwind Labs", "Bluebird Bank", "Red Cross", "Apex Motors", "Greenleaf Foods",
            "City University", "Harbor FC", "Atlas Airlines", "Summit Energy", "UNICEF",
            "Riverside United", "Orion Software"],
    "LOC": ["Paris", "Lagos", "Osaka", "Lima", "Toronto", "Berlin", "Cairo", "Madrid", "Oslo",
            "Nairobi", "Sydney", "Prague", "Vienna", "New York", "Lake Geneva"],
    "MISC": ["Olympic", "Nobel", "Japanese", "French", "Star Wars", "Spanish", "World Cup",
             "Impressionist", "Arabic", "Booker", "Italian", "Harry Potter"],
}
DEV_NAMES = {
    "PER": ["Lucia Moreno", "Kwame Mensah", "Hiro Sato", "Ingrid Berg", "Tom Walsh",
            "Priya Nair"],
    "ORG": ["Silverline Media", "Kestrel Bank", "Union Rail", "Westport Rovers", "Nova Pharma"],
    "LOC": ["Lisbon", "Accra", "Kyoto", "Bergen", "Dublin", "Chennai", "Quebec"],
    "MISC": ["Portuguese", "Ghanaian", "Oscar", "Norwegian", "Irish", "Bollywood"],
}


def _fill(template, names, rng):
    tokens, tags = [], []
    for piece in template.split():
        if piece.startswith("{") and piece.endswith("}"):
            kind = piece[1:-1]
            words = rng.choice(names[kind]).split()
            tokens += words
            tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(words) - 1)
        else:
            tokens.append(piece)
            tags.append("O")
    return tokens, tags


def _entities(path, templates, names, count, seed):
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            tokens, tags = _fill(templates[i % len(templates)], names, rng)
            f.writelines(f"{token} {tag}\n" for token, tag in zip(tokens, tags))
            f.write("\n")


def _sentiment(pairs_path):
    lines = pairs_path.read_text(encoding="utf-8").splitlines()
    pairs = [line.split("\t") for line in lines if line.strip()]
    train, dev = [], []
    for i, (positive, negative) in enumerate(pairs):
        (dev if i % 4 == 3 else train).extend([(positive, "positive"), (negative, "negative")])
    for name, rows in (("train", train), ("dev", dev)):
        with open(OUT / f"sentiment_{name}.tsv", "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n")
            f.writelines(f"{text}\t{label}\n" for text, label in rows)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    _sentiment(HERE / "sentiment_pairs.tsv")
    _entities(OUT / "entities_train.txt", TRAIN_TEMPLATES, TRAIN_NAMES, 200, seed=1)
    _entities(OUT / "entities_dev.txt", DEV_TEMPLATES, DEV_NAMES, 60, seed=2)


if __name__ == "__main__":
    main()
