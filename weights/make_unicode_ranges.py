#!/usr/bin/env python3
"""Writes cli/unicode_ranges.h: the Unicode character classes that the
byte-level BPE pre-tokenizer (cli/tokenizer.c, §16) needs, as sorted tables of
code point ranges that the C code binary-searches.

    python3 weights/make_unicode_ranges.py > cli/unicode_ranges.h

Needs the Unicode 16.0.0 character database: Python 3.14's own unicodedata
module, or on an older Python the backport (pip install unicodedata2==16.0.0).
Why 16.0: Hugging Face tokenizers (0.23) runs its GPT-2 pattern with
Oniguruma, whose \\p{L} and \\p{N} are Unicode 16.0's; with these tables the C
pre-tokenizer classifies all 1,112,064 code points as tokenizers does
(weights/make_tokenizer_fixture.py checks that, every code point).

The classes:
  letter  \\p{L}: general category Lu, Ll, Lt, Lm or Lo
  number  \\p{N}: general category Nd, Nl or No (also what Rust's
          char::is_numeric tests, which tokenizers' Digits pre-tokenizer uses)
  space   \\s: Unicode's White_Space property, which is what Oniguruma's \\s
          matches. It is not in unicodedata (str.isspace() also accepts
          U+001C..U+001F, which are not White_Space), so it is written out
          below; it has not changed since Unicode 6.3.
Standard library only (apart from the backport)."""
import sys

try:
    import unicodedata2 as ud
except ImportError:
    import unicodedata as ud

VERSION = "16.0.0"
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
               (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]


def ranges(test):
    """Sorted, merged [lo, hi] ranges of the code points where test(cp) holds."""
    out = []
    for cp in range(0x110000):
        if test(cp):
            if out and out[-1][1] == cp - 1:
                out[-1][1] = cp
            else:
                out.append([cp, cp])
    return out


def table(name, rs, what):
    lines = [f"/* {what}: {len(rs)} ranges */", f"static const uint32_t {name}[][2] = {{"]
    row = []
    for lo, hi in rs:
        row.append(f"{{0x{lo:X}, 0x{hi:X}}}")
        if len(row) == 6:
            lines.append("    " + ", ".join(row) + ",")
            row = []
    if row:
        lines.append("    " + ", ".join(row) + ",")
    lines.append("};")
    return "\n".join(lines)


def main():
    if ud.unidata_version != VERSION:
        sys.exit(f"make_unicode_ranges.py: this Python's Unicode database is {ud.unidata_version}, not {VERSION}: "
                 f"pip install unicodedata2=={VERSION} (or use Python 3.14)")
    cat = lambda cp: ud.category(chr(cp))
    letter = ranges(lambda cp: cat(cp)[0] == "L")
    number = ranges(lambda cp: cat(cp)[0] == "N")
    print(f"""/* cli/unicode_ranges.h: Unicode {VERSION} character classes for the byte-level
 * pre-tokenizer (cli/tokenizer.c, §16): each table is sorted, non-overlapping,
 * inclusive [first, last] code point ranges, binary-searched by uni_in().
 * Generated, do not edit:
 *     python3 weights/make_unicode_ranges.py > cli/unicode_ranges.h
 * (Unicode {VERSION}'s database: Python 3.14, or pip install unicodedata2=={VERSION}.) */""")
    print(table("uni_letter", letter, "\\p{L}: general categories Lu Ll Lt Lm Lo"))
    print(table("uni_number", number, "\\p{N}: general categories Nd Nl No"))
    print(table("uni_space", [list(r) for r in WHITE_SPACE],
                "\\s: the White_Space property (not in unicodedata; written out in the script)"))


if __name__ == "__main__":
    main()
