#!/usr/bin/env python3
"""Writes a request trace for ./kvt --serve (docs/SERVING.md) to stdout.

Arrivals are a Poisson process (exponential gaps, RATE requests per second);
prompt and output lengths are long-tailed, as chat traffic is: a log-normal
length (median m, spread s) clipped to [lo, hi], so most are short and a few
are long. The same arguments always write the same trace (random.Random(SEED)).

  serve_trace.py random N RATE SEED [VOCAB [TMAX]]  token-id prompts for a --random model
  serve_trace.py shakespeare TEXT N RATE SEED        speeches cut from TEXT (the default model)
  serve_trace.py chat TEXT N RATE SEED               one shared system prompt, then a short turn

Python's standard library only.
"""
import math
import random
import sys


def lognormal(rng, median, spread, lo, hi):
    return max(lo, min(hi, int(round(median * math.exp(rng.gauss(0.0, spread))))))


def arrivals(rng, n, rate):
    t, out = 0.0, []
    for _ in range(n):
        out.append(int(t))  # whole milliseconds, never decreasing
        t += rng.expovariate(rate) * 1000.0
    return out


def escape(text):
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def speeches(path):
    """The speeches of a play in the tinyshakespeare layout: 'NAME:' on a line,
    the speech below it, a blank line after it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"serve_trace.py: cannot read '{path}': {e.strerror}")
    out = [s.strip("\n") + "\n" for s in text.split("\n\n") if ":\n" in s]
    if len(out) < 10:
        sys.exit(f"serve_trace.py: '{path}' holds {len(out)} speeches ('NAME:' lines); want at least 10")
    return out


def line_cut(speech, n):
    """The speaker's line and the speech's first n characters, ended at a word."""
    head, _, body = speech.partition(":\n")
    body = body[:n]
    if " " in body and len(body) == n:
        body = body[: body.rindex(" ") + 1]
    return head + ":\n" + body


def main(argv):
    if len(argv) < 2 or argv[1] not in ("random", "shakespeare", "chat"):
        sys.exit(__doc__.strip())
    kind, args = argv[1], argv[2:]
    try:
        if kind == "random":
            n, rate, seed = int(args[0]), float(args[1]), int(args[2])
            vocab = int(args[3]) if len(args) > 3 else 512
            tmax = int(args[4]) if len(args) > 4 else 1024
        else:
            path, n, rate, seed = args[0], int(args[1]), float(args[2]), int(args[3])
    except (IndexError, ValueError):
        sys.exit(__doc__.strip())
    if n < 1 or rate <= 0:
        sys.exit("serve_trace.py: N must be at least 1 and RATE above 0")
    rng = random.Random(seed)
    at = arrivals(rng, n, rate)
    shown = [a.rsplit("/", 1)[-1] for a in argv[1:]]  # the text file by its name, not where it sat
    rows = [f"# {n} requests, {rate:g}/s Poisson arrivals, seed {seed}: bench/serve_trace.py {' '.join(shown)}"]
    if kind == "random":
        rows[0] += f" (for a --random model with vocabulary {vocab} and context {tmax})"
        for t in at:
            plen = lognormal(rng, 64, 0.9, 4, tmax // 2)
            new = min(lognormal(rng, 96, 0.8, 4, tmax // 2), tmax - plen)
            ids = ",".join(str(rng.randrange(vocab)) for _ in range(plen))
            rows.append(f"{t}\t{new}\tids:{ids}")
    else:
        sp = speeches(path)
        system = ""
        if kind == "chat":  # the first speeches of the play, the same for every request
            system = "".join(sp[:3]) + "\n"
            rows[0] += f"; a system prompt of {len(system)} characters"
        for t in at:
            prompt = system + line_cut(rng.choice(sp[3:]), lognormal(rng, 40, 0.8, 8, 240))
            new = min(lognormal(rng, 60, 0.7, 8, 400), 500 - len(prompt))  # the default model: context 512
            rows.append(f"{t}\t{new}\t{escape(prompt)}")
    sys.stdout.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main(sys.argv)
