"""Plant realistic dirt into the clean sample documents, deterministically, and record every planted item.

Dirt kinds: exact duplicates (within and across sources), near duplicates (word edits, an inserted
or deleted sentence, shuffled paragraphs), boilerplate lines shared by many documents of a source,
very short documents and junk (keyboard mash, symbol soup, lorem ipsum, one line repeated).
Boilerplate is planted first so that copies carry it and exact duplicates stay exact.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from sample_sources import WORD_RE, Doc

LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit. Sed do eiusmod tempor incididunt ut labore et "
    "dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex "
    "ea commodo consequat. Duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu fugiat "
    "nulla pariatur. Excepteur sint occaecat cupidatat non proident, sunt in culpa qui officia deserunt mollit "
    "anim id est laborum. Curabitur pretium tincidunt lacus. Nulla gravida orci a odio. Nullam varius, turpis et "
    "commodo pharetra, est eros bibendum elit, nec luctus magna felis sollicitudin mauris"
).split(". ")
KEYBOARD_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm", "1234567890")
SYMBOLS = "!@#$%^&*()_+-=[]{};:'\",.<>/?\\|`~"
JUNK_KINDS = ("keyboard_mash", "symbol_soup", "lorem_ipsum", "repeated_lines")
NEAR_KINDS = ("word_edits", "sentence_inserted", "sentence_deleted", "paragraphs_shuffled")
#: Planted short documents are under this many characters; every clean or junk document is longer.
SHORT_MAX_CHARS = 60
NEAR_MIN_JACCARD = 0.5


@dataclass(kw_only=True, slots=True)
class DirtPlan:
    """How much dirt one source gets (shares of its clean documents) and what its dirt looks like."""

    boilerplate: tuple[str, ...]
    short_pool: tuple[str, ...]
    units: str = "sentences"  # how near-duplicate edits cut the text: "sentences" (prose) or "lines"
    exact_share: float = 0.04
    near_share: float = 0.04
    boilerplate_share: float = 0.25
    short_share: float = 0.02
    junk_share: float = 0.015

    def __post_init__(self) -> None:
        if self.units not in ("sentences", "lines"):
            raise ValueError(f"DirtPlan.units = {self.units!r}; allowed: 'sentences', 'lines'")
        for name in ("exact_share", "near_share", "boilerplate_share", "short_share", "junk_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"DirtPlan.{name} = {getattr(self, name)!r}; allowed: a share in [0, 1]")


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = [w.lower() for w in WORD_RE.findall(text)]
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


def jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


class Planter:
    """Plants one source's dirt; ``new_id(original, salt, taken)`` names planted documents the way the source does."""

    def __init__(self, source: str, docs: list[Doc], plan: DirtPlan, new_id: Callable[[Doc | None, str, set[str]], str],
                 seed: str, editable: Callable[[Doc], bool] = lambda doc: True):
        self.source, self.docs, self.plan, self.new_id = source, docs, plan, new_id
        self.rng = random.Random(f"{seed}:{source}")
        self.clean = list(docs)  # planted items never serve as originals
        # Documents whose terms allow verbatim copies only (the GPL's own text) get no edits or added lines.
        self.editable = [d for d in docs if editable(d)]
        self.texts = {d.text for d in docs}
        self.ids = {d.id for d in docs}
        self.records: list[dict] = []

    def _count(self, share: float) -> int:
        return round(share * len(self.clean))

    def _add(self, doc: Doc, kind: str, detail: str | None = None, of: str | None = None, **extra) -> None:
        assert doc.id not in self.ids, f"planted id {doc.id} is taken"
        assert kind in ("exact_duplicate", "cross_source_duplicate") or doc.text not in self.texts, doc.id
        self.docs.append(doc)
        self.texts.add(doc.text)
        self.ids.add(doc.id)
        self.records.append({"source": self.source, "id": doc.id, "kind": kind, "detail": detail, "of": of, **extra})

    def _derive(self, orig: Doc, body: str, salt: str) -> Doc:
        return Doc(self.new_id(orig, salt, self.ids), body, dict(orig.meta), orig.head, orig.foot)

    def boilerplate(self) -> None:
        """Give a share of the clean documents one to three of the source's boilerplate lines, top or bottom."""
        for doc in self.rng.sample(self.editable, self._count(self.plan.boilerplate_share)):
            lines = self.rng.sample(self.plan.boilerplate, self.rng.randint(1, min(3, len(self.plan.boilerplate))))
            cut = self.rng.randint(0, len(lines))
            self.texts.discard(doc.text)
            doc.head, doc.foot = tuple(lines[:cut]), tuple(lines[cut:])
            self.texts.add(doc.text)

    def exact(self) -> None:
        """Copy clean documents verbatim under new ids, one to three copies each."""
        target, n = self._count(self.plan.exact_share), 0
        for orig in self.rng.sample(self.clean, len(self.clean)):
            for _ in range(min(self.rng.choice((1, 1, 1, 1, 1, 1, 1, 2, 2, 3)), target - n)):
                self._add(self._derive(orig, orig.body, f"exact{n}"), "exact_duplicate", of=orig.id)
                n += 1
            if n >= target:
                return

    def near(self) -> None:
        """Edit clean documents of 60+ words slightly; keep an edit only if word 5-gram Jaccard stays >= 0.5."""
        target, n = self._count(self.plan.near_share), 0
        pool = [d for d in self.editable if len(WORD_RE.findall(d.body)) >= 60]
        for orig in self.rng.sample(pool, len(pool)):
            kind = NEAR_KINDS[n % len(NEAR_KINDS)]
            body = getattr(self, f"_{kind}")(orig.body)
            if body is None or body == orig.body:
                continue
            doc = self._derive(orig, body, f"near{n}")
            score = jaccard(doc.text, orig.text)
            if doc.text in self.texts or score < NEAR_MIN_JACCARD:
                continue
            self._add(doc, "near_duplicate", kind, of=orig.id, jaccard=round(score, 3))
            n += 1
            if n >= target:
                return

    def _cuts(self, body: str) -> list[int]:
        pattern = r"(?<=[.!?])\s+(?=[A-Z*(\"'])" if self.plan.units == "sentences" else r"\n"
        return [0, *(m.end() for m in re.finditer(pattern, body)), len(body)]

    def _word_edits(self, body: str) -> str | None:
        words = list(re.finditer(r"\b[A-Za-z]{4,}\b", body))
        if not words:
            return None
        out = body
        for m in sorted(self.rng.sample(words, max(1, len(words) // 40)), key=lambda m: -m.start()):
            w = m[0]
            i = self.rng.randrange(len(w) - 1)
            edit = self.rng.choice((w[:i] + w[i + 1] + w[i] + w[i + 2 :], w[:i] + w[i + 1 :], self.rng.choice(words)[0]))
            out = out[: m.start()] + edit + out[m.end() :]
        return out

    def _sentence_inserted(self, body: str) -> str:
        donor = self.rng.choice(self.clean).body
        dcuts = self._cuts(donor)
        j = self.rng.randrange(len(dcuts) - 1)
        unit = donor[dcuts[j] : dcuts[j + 1]].strip()
        at = self.rng.choice(self._cuts(body)[1:-1] or [len(body)])
        sep = " " if self.plan.units == "sentences" else "\n"
        return body[:at] + unit + sep + body[at:]

    def _sentence_deleted(self, body: str) -> str | None:
        cuts = self._cuts(body)
        if len(cuts) < 5:
            return None
        j = self.rng.randrange(1, len(cuts) - 1)
        return body[: cuts[j - 1]] + body[cuts[j] :]

    def _paragraphs_shuffled(self, body: str) -> str | None:
        paras = body.split("\n\n")
        if len(paras) < 3:
            return None
        shuffled = self.rng.sample(paras, len(paras))
        return "\n\n".join(shuffled) if shuffled != paras else None

    def short(self) -> None:
        """Add very short documents: the source's typical stubs, then the first words of clean documents."""
        target, n = self._count(self.plan.short_share), 0
        candidates = list(self.plan.short_pool)
        for orig in self.rng.sample(self.clean, len(self.clean)):
            candidates.append(" ".join(orig.body.split()[: self.rng.randint(2, 7)])[: SHORT_MAX_CHARS - 1])
        for text in candidates:
            if n >= target:
                return
            if len(text) < SHORT_MAX_CHARS and text not in self.texts:
                self._add(Doc(self.new_id(None, f"short{n}", self.ids), text, {}), "short")
                n += 1

    def junk(self) -> None:
        """Add junk documents, cycling through the junk kinds."""
        target = self._count(self.plan.junk_share)
        for n in range(target):
            kind = JUNK_KINDS[n % len(JUNK_KINDS)]
            text = getattr(self, f"_{kind}")()
            while text in self.texts:
                text = getattr(self, f"_{kind}")()
            self._add(Doc(self.new_id(None, f"junk{n}", self.ids), text, {}), "junk", kind)

    def _keyboard_mash(self) -> str:
        row = lambda: self.rng.choice(KEYBOARD_ROWS)  # noqa: E731
        words = ["".join(self.rng.choices(row(), k=self.rng.randint(3, 12))) for _ in range(self.rng.randint(30, 120))]
        return "\n".join(" ".join(words[i : i + 12]) for i in range(0, len(words), 12))

    def _symbol_soup(self) -> str:
        chars = self.rng.choices(SYMBOLS + "0123456789 ", k=self.rng.randint(200, 800))
        return "".join(c if self.rng.random() > 0.02 else "\n" for c in chars)

    def _lorem_ipsum(self) -> str:
        return ". ".join(self.rng.choices(LOREM, k=self.rng.randint(4, 14))) + "."

    def _repeated_lines(self) -> str:
        line = self.rng.choice([ln for ln in self.rng.choice(self.clean).body.splitlines() if len(ln.strip()) >= 12]
                               or self.plan.boilerplate)
        return "\n".join([line.strip()] * self.rng.randint(20, 60))


def cross_copy(src: Planter, dst: Planter, count: int) -> None:
    """Copy ``count`` clean, boilerplate-free documents of ``src`` verbatim into ``dst``."""
    pool = [d for d in src.clean if not d.head and not d.foot and d.text not in dst.texts]
    for n, orig in enumerate(src.rng.sample(pool, count)):
        doc = Doc(dst.new_id(orig, f"from-{src.source}{n}", dst.ids), orig.body, dict(orig.meta))
        dst._add(doc, "cross_source_duplicate", src.source, of=orig.id)
