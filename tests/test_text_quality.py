"""Text-quality figures (whitespace-only lines, repeated n-grams) and the sync counter."""

from __future__ import annotations

from adaptive_spec.bench.text_quality import loop_shares, quality_summary, token_spans


class CharTokenizer:
    """One token per character (ids are code points): spans are easy to check by hand."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_token_spans_cover_the_text():
    text, spans = token_spans(CharTokenizer(), ids("ab\ncd"))
    assert text == "ab\ncd" and spans == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def test_whitespace_only_lines_are_counted():
    tok = CharTokenizer()
    gen = ids("x = 1\n\n   \n\ny")  # lines: "x = 1", "", "   ", "", "y"
    shares = loop_shares(tok, [], gen, n=50)
    # Blank-line tokens: the newlines closing lines 2-4 and the three spaces; the first newline ends "x = 1".
    assert shares["whitespace"] == 6 and shares["repeated"] == 0 and shares["tokens"] == len(gen)


def test_repeated_ngrams_are_counted():
    tok = CharTokenizer()
    gen = ids("abcdXabcd")
    shares = loop_shares(tok, [], gen, n=4)
    assert shares["repeated"] == 4 and shares["either"] == 4  # the second "abcd" repeats the first
    # The prompt counts as earlier text: a copy of the prompt is a repeat.
    assert loop_shares(tok, ids("abcd"), ids("abcd"), n=4)["repeated"] == 4
    summary = quality_summary(tok, [[]], [gen])
    assert 0 <= summary["repeated_ngram_share"] <= 1
