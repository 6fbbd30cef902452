"""Text-quality figures of generated tokens: are speedups coming from loops?

A draft predicts degenerate text (runs of blank lines, a phrase repeated over and over) far
better than real text, so a speedup measured on such output says little. These figures tell a
reader how much of the generated text is of that kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPEAT_N = 8  # tokens: an 8-token window seen before in the prompt or the output is a repeat


def token_spans(tokenizer: Any, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text of ``ids`` and each token's character span in it (incremental decoding)."""
    spans, prev = [], ""
    for i in range(len(ids)):
        cur = tokenizer.decode(list(ids[: i + 1]), skip_special_tokens=False)
        if not cur.startswith(prev):  # a multi-byte character completed: attribute the change to this token
            common = 0
            while common < min(len(prev), len(cur)) and prev[common] == cur[common]:
                common += 1
            spans.append((common, len(cur)))
        else:
            spans.append((len(prev), len(cur)))
        prev = cur
    return prev, spans


def loop_shares(tokenizer: Any, prompt_ids: Sequence[int], generated: Sequence[int], n: int = REPEAT_N) -> dict:
    """Counts of generated tokens in whitespace-only lines and in repeated ``n``-grams.

    * whitespace: every character of the token lies on lines (of the generated text) that hold
      only whitespace; a token that decodes to nothing does not count;
    * repeated: the token lies in a window of ``n`` consecutive tokens (of prompt + output) that
      already occurred, starting earlier.

    Returns:
        ``{"tokens", "whitespace", "repeated", "either"}``: token counts (sum them over
        generations and divide by ``tokens`` for shares).
    """
    text, spans = token_spans(tokenizer, generated)
    line_of, blank, line = [], [], 0
    start = 0
    for j, ch in enumerate(text):
        line_of.append(line)
        if ch == "\n":
            blank.append(text[start : j + 1].strip() == "")
            start, line = j + 1, line + 1
    blank.append(text[start:].strip() == "")
    ws = [b > a and all(blank[line_of[c]] for c in range(a, b)) for a, b in spans]

    ctx = list(prompt_ids) + list(generated)
    first: dict[tuple[int, ...], int] = {}
    covered = [False] * len(ctx)
    for s in range(len(ctx) - n + 1):
        key = tuple(ctx[s : s + n])
        if key in first:
            for j in range(s, s + n):
                covered[j] = True
        else:
            first[key] = s
    rep = covered[len(prompt_ids) :]
    return {
        "tokens": len(generated),
        "whitespace": sum(ws),
        "repeated": sum(rep),
        "either": sum(a or b for a, b in zip(ws, rep, strict=True)),
    }


def quality_summary(tokenizer: Any, prompts_ids: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> dict:
    """Shares over several generations: ``whitespace_share``, ``repeated_ngram_share``, ``either_share``."""
    tot = {"tokens": 0, "whitespace": 0, "repeated": 0, "either": 0}
    for p, g in zip(prompts_ids, outputs, strict=True):
        for key, v in loop_shares(tokenizer, p, g).items():
            tot[key] += v
    n = max(1, tot["tokens"])
    return {
        "tokens": tot["tokens"],
        "whitespace_share": tot["whitespace"] / n,
        "repeated_ngram_share": tot["repeated"] / n,
        "either_share": tot["either"] / n,
        "repeat_n": REPEAT_N,
    }
