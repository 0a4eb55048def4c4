#!/usr/bin/env python3
"""Writes weights/smollm2_tokens.txt: test strings and the token ids that Hugging
Face's tokenizer gives them with SmolLM2-135M-Instruct's vocabulary, the
fixture test.c compares kvt's byte-level BPE (cli/tokenizer.c, §16) against.

Run once, offline (needs the tokenizers and gguf packages; transformers too
for the comparison below):

    python3 weights/make_tokenizer_fixture.py SmolLM2-135M-Instruct.Q4_1.gguf

The tokenizer is built the way SmolLM2's published tokenizer.json is: a BPE
model from the GGUF's tokenizer.ggml.tokens and tokenizer.ggml.merges, the
pre-tokenizer Sequence([Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)]) (the GGUF's
tokenizer.ggml.pre = "smollm"), no normalizer, the ByteLevel decoder. No
special tokens are registered: kvt encodes "<|im_start|>" in text as plain
characters, and so does this tokenizer (no fixture string holds one).

It also reports, and does not write:
- where transformers' own GGUF loader (AutoTokenizer.from_pretrained(folder,
  gguf_file=...)) gives other ids: it ignores tokenizer.ggml.pre and uses the
  ByteLevel pre-tokenizer alone, without Digits;
- that cli/unicode_ranges.h's classes (letter, number, whitespace) agree with
  the tokenizers pre-tokenizer on every code point (about 15 s).

The fixture, one case a line, after the '#' comment lines at the top:
    <string, escaped> TAB <number of ids> [SPACE <id>]...
The string is UTF-8 with these escapes: \\\\ for a backslash, \\t, \\n, \\r,
\\xHH for any other byte below 0x20 and for 0x7F, and \\x23 for a '#' that
begins the string (so no case line starts with '#')."""
import json
import os
import random
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "smollm2_tokens.txt")
RANGES = os.path.join(HERE, "..", "cli", "unicode_ranges.h")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

PROSE = [
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, there was a little girl named Lily.",
    "It was the best of times, it was the worst of times.",
    "A KV cache stores the keys and values of every position it has seen.",
    "Tokenization is the first step: text becomes a list of integers.",
    "She said, \"I'll be there at noon,\" and left.",
    "Why? Because it works.",
    "THIS IS ALL CAPS TEXT",
    "mIxEd CaSe LeTtErS",
    "Mr. Smith went to Washington D.C. on Jan. 5th.",
    "e.g. this, i.e. that, etc.",
    "The U.S.A. and the U.K. signed the treaty.",
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer",
    "Hugging Face's tokenizers library is written in Rust.",
    "What is the capital of France?",
    "The capital of France is Paris.",
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "Write a haiku about the sea.",
    "Summarize the following paragraph in one sentence.",
    "antidisestablishmentarianism",
    "supercalifragilisticexpialidocious",
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "hello",
    "Hello",
    " hello",
    "HELLO",
    "a",
    "I",
    "OK",
    "okay",
    "The cat sat on the mat. The dog sat on the log.",
    "In 1492, Columbus sailed the ocean blue.",
    "Dear Sir or Madam,\n\nI am writing to inform you that your order has shipped.\n\nBest regards,\nAnna",
]

CODE = [
    "int main(void) { return 0; }",
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf(\"hello, %s\\n\", argv[0]);\n    return 0;\n}\n",
    "for (int i = 0; i < n; i++) {\n\tsum += x[i] * w[i];\n}",
    "static const float eps = 1e-5f;",
    "if (a != b && c >= d || !e) x <<= 2;",
    "ptr->next = NULL; // unlink",
    "/* a block comment */",
    "#define MAX(a, b) ((a) > (b) ? (a) : (b))",
    "char buf[256]; memset(buf, 0, sizeof(buf));",
    "def f(x):\n    return x * 2\n",
    "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.w = nn.Linear(64, 64)\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)",
    "print(f\"{name!r}: {value:.3f}\")",
    "lambda x, y: x if x > y else y",
    "    # indented comment\n    pass",
    "\tif x:\n\t\treturn None",
    "x = [i ** 2 for i in range(10) if i % 2 == 0]",
    "async def main() -> None:\n    await asyncio.sleep(0.1)",
    "{\"name\": \"kvt\", \"version\": \"0.1.0\", \"tags\": [\"c\", \"cuda\"]}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<div class=\"main\"><p>Hello</p></div>",
    "git commit -m \"fix: off-by-one in the chunk table\"",
    "make test 2>&1 | tail -n 5",
    "all: kvt\n\nkvt: kvtransformer.cu\n\t$(CC) -O2 -o $@ $<\n",
    "fn main() { let v: Vec<u32> = (0..10).collect(); }",
    "console.log(`value: ${x}`);",
    "a_b_c = snake_case_name; camelCaseName; PascalCaseName",
    "^[a-zA-Z0-9_.+-]+@[a-zA-Z0-9-]+\\.[a-zA-Z0-9-.]+$",
    "x+=1;y-=2;z*=3;w/=4;",
    "\"\"\"Docstring.\"\"\"",
    "return;",
    "}\n}\n}",
    "        deeply_indented()",
    "if __name__ == '__main__':\n    main()",
]

NUMBERS = [
    "123",
    "3.14",
    "3.14159265358979",
    "1,000,000",
    "2024-01-15",
    "12/31/1999",
    "12:30:45",
    "-42",
    "+7",
    "1e-10",
    "6.022e23",
    "0x1F",
    "$19.99",
    "50%",
    "v1.2.3",
    "192.168.0.1",
    "1st 2nd 3rd 4th",
    "Room 101",
    "  42  ",
    " 123",
    "a1b2c3",
    "x1",
    "abc123def",
    "1234567890",
    "007",
    "+1 (555) 123-4567",
    "\uff11\uff12\uff13",
    "\u0663\u0664\u0665",
    "\u0967\u0968\u0969",
    "x\u00b2 + y\u00b2 = z\u00b2",
    "\u00bd cup",
    "\u216b o'clock",
    "2\u00d73=6",
    "pi is 3.14, e is 2.71",
    "In 2023 there were 8,000,000,000 people.",
    "a  1",
    "\n\n1",
    "1\n\n2",
    "  12  34  ",
]

PUNCT = [
    "!!!",
    "...",
    "?!?!",
    "---",
    "***",
    "===",
    "   ",
    " ",
    "  ",
    "  leading spaces",
    "trailing spaces  ",
    "a   b",
    "a  b",
    "  \n\n  ",
    "\t\tx",
    "x \t y",
    "(a)",
    "[[x]]",
    "{{}}",
    "a,b;c:d",
    "'quoted'",
    "\"double\"",
    "''s",
    "'s",
    "''",
    "rock 'n' roll",
    "\u201csmart quotes\u201d",
    "dash \u2014 em, \u2013 en",
    "wait\u2026",
    "\u00ab guillemets \u00bb",
    "@#$%^&*()_+",
    "~`|\\/<>",
    "a.b.c.d",
    "end.",
    "What?!",
    "- item one\n- item two\n- item three",
    "## Heading\n\n**bold** and _italic_",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "https://example.com/path?q=1&r=2#frag",
    "user@example.com",
    "C:\\Users\\name\\file.txt",
    "/usr/local/bin/",
]

NEWLINES = [
    "line1\nline2",
    "a\r\nb\r\n",
    "\r\n",
    "\n",
    "\n\n\n",
    "x\n",
    "\nx",
    " \n",
    "\n ",
    "a \nb",
    "a\n b",
    "a\n\n b",
    "x\n\n y",
    "\r",
    "para one.\n\npara two.",
    "a\n\tb",
    "\t",
    "\t\n",
    "a\r\n\r\nb",
    "end\n\n\n\n",
]

CONTRACTIONS = [
    "don't",
    "I'LL",
    "we're",
    "they've",
    "I'm",
    "she'd",
    "it's",
    "It'S",
    "y'all",
    "o'clock",
    "DON'T",
    "can't won't shouldn't",
    "'re",
    "rock'n'roll",
    "that\u2019s",
    "I'd've",
    "we'll see",
    "'sup",
]

ACCENTED = [
    "caf\u00e9",
    "na\u00efve",
    "\u00c5ngstr\u00f6m",
    "fa\u00e7ade",
    "Z\u00fcrich",
    "ni\u00f1o",
    "\u0141\u00f3d\u017a",
    "Dvo\u0159\u00e1k",
    "S\u00e3o Paulo",
    "cr\u00e8me br\u00fbl\u00e9e",
    "stra\u00dfe",
    "\u0153uvre",
    "Ti\u1ebfng Vi\u1ec7t",
    "\u00c9COLE \u00c0 PARIS",
]

SCRIPTS = [
    "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5",
    "\u0391\u0392\u0393 \u03b1\u03b2\u03b3",
    "\u03a0\u03c5\u03b8\u03b1\u03b3\u03cc\u03c1\u03b1\u03c2",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u041c\u043e\u0441\u043a\u0432\u0430 \u2014 \u0441\u0442\u043e\u043b\u0438\u0446\u0430 \u0420\u043e\u0441\u0441\u0438\u0438.",
    "\u0451\u0436\u0438\u043a",
    "\u0423\u043a\u0440\u0430\u0457\u043d\u0430",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "\u0643\u062a\u0627\u0628\u064c",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u05e2\u05d1\u05e8\u05d9\u05ea",
    "\u05d1\u05bc\u05b0\u05e8\u05b5\u05d0\u05e9\u05b4\u05c1\u05d9\u05ea",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0939\u093f\u0928\u094d\u0926\u0940",
    "\u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u4e2d\u6587\u5206\u8bcd\u5f88\u96be\u3002",
    "\u6c49\u5b57",
    "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8",
    "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c",
    "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a",
    "\u6771\u4eac\u90fd\u3002\u65e5\u672c\u8a9e\u306e\u6587\u3002",
    "\uff76\uff80\uff76\uff85",
    "\uc548\ub155\ud558\uc138\uc694",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\uc11c\uc6b8\ud2b9\ubcc4\uc2dc",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
    "\u0e01\u0e23\u0e38\u0e07\u0e40\u0e17\u0e1e\u0e21\u0e2b\u0e32\u0e19\u0e04\u0e23",
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
    "\u0532\u0561\u0580\u0565\u0582",
    "\u12a0\u121b\u122d\u129b",
    "Hello\u4e16\u754c",
    "\u041f\u0440\u0438\u0432\u0435\u0442 world \u4f60\u597d",
]

EMOJI = [
    "\U0001f600",
    "\U0001f44d\U0001f3fd",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f3f3\ufe0f\u200d\U0001f308",
    "\U0001f1eb\U0001f1f7\U0001f1ef\U0001f1f5",
    "\u2764\ufe0f",
    "I \u2764\ufe0f NY",
    "\U0001f642\U0001f642\U0001f642",
    "1\ufe0f\u20e3",
    "text\U0001f600text",
    " \U0001f600",
    "\U0001f9d1\u200d\U0001f4bb coding",
    "\U0001f680 launch!",
    "\u2705 done \u274c failed",
    "\U0001f923\U0001f923 lol",
]

COMBINING = [
    "e\u0301",
    "a\u0308",
    "n\u0303o",
    "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u035a\u031ao\u0319\u0314\u036e\u0307\u0350\u0307",
    "\u0301",
    " \u0301",
    "\u1100\u1161\u11a8",
    "q\u0323\u0307",
]

MISC = [
    "",
    "0",
    "\u00a0",
    "a\u00a0b",
    "a\u3000b",
    "a\u2028b",
    "a\u200bb",
    "\u0085",
    "soft\u00adhyphen",
    "\x7f",
    "\x01\x02\x03",
    "\x1b[31mred\x1b[0m",
    "\ufeffBOM",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "hahahahahahahaha",
    "\u20ac100, \u00a35, \u00a5500",
    "\u2211\u222b\u221a\u221e \u2260 \u2248",
    "\u2192 \u21d2 \u2190",
    "\u2588\u2591\u2592\u2593",
    "\u00a9 2024 \u00ae \u2122",
    "user: hi\nassistant: hello!",
    "system\nYou are a helpful assistant.",
    "\u0130stanbul",
    "\u1e9e\u00df",
    "\ufb01nance \ufb02ow",
    "\U0001d400\U0001d401\U0001d402",
    "\U00020000\U0002a6d6",
    "\U000e0041",
    "\u00ad",
    " \u00a0 ",
]

FRAGMENTS = ["the", " cat", "123", " ", "  ", "\n", "\t", "don't", "caf\u00e9", "\u4f60\u597d", "!?", "...",
             "\U0001f600", "x=1;", "\u041f\u0440\u0438\u0432\u0435\u0442", " 42", "'s", "\r\n", "\u00a0", "(", ")",
             "\u0928\u092e\u0938\u094d\u0924\u0947", "e\u0301", "A", "\u05e9\u05dc\u05d5\u05dd", "3.5", "_", "-"]


def random_cases(n, seed=41):
    """Deterministic mixtures of fragments: where one rule meets another."""
    rng = random.Random(seed)
    return ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def all_cases():
    cases = PROSE + CODE + NUMBERS + PUNCT + NEWLINES + CONTRACTIONS + ACCENTED + SCRIPTS + EMOJI + COMBINING + MISC
    cases += random_cases(40)
    seen, out = set(), []
    for s in cases:
        if s not in seen:
            seen.add(s)
            out.append(s)
    for s in out:
        assert not any(sp in s for sp in SPECIALS), s
        assert "\0" not in s, "a C string cannot hold a NUL"
    return out


def escape(s):
    named = {0x5C: b"\\\\", 0x09: b"\\t", 0x0A: b"\\n", 0x0D: b"\\r"}
    out = b"".join(named.get(b, b"\\x%02X" % b if b < 0x20 or b == 0x7F else bytes([b])) for b in s.encode("utf-8"))
    return b"\\x23" + out[1:] if out.startswith(b"#") else out


def gguf_vocab(path):
    from gguf import GGUFReader
    r = GGUFReader(path)

    def strs(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[r.fields["tokenizer.ggml.pre"].data[0]]).decode()
    assert pre == "smollm", pre
    return strs("tokenizer.ggml.tokens"), strs("tokenizer.ggml.merges")


def hf_tokenizer(tokens, merges):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens)
    tk = Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in merges]))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    return tk


def check_classes():
    """cli/unicode_ranges.h against the tokenizers pre-tokenizers, every code point."""
    from tokenizers import pre_tokenizers as pt
    text = open(RANGES).read()
    tables = {}
    for name, body in re.findall(r"static const uint32_t (\w+)\[\]\[2\] = \{(.*?)\};", text, re.S):
        tables[name] = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", body)]

    flat = {name: set() for name in tables}
    for name, rs in tables.items():
        for lo, hi in rs:
            flat[name].update(range(lo, hi + 1))
    byte_level, digits = pt.ByteLevel(add_prefix_space=False, use_regex=True), pt.Digits(individual_digits=True)
    shapes = {(3, 1): "uni_letter", (1, 2, 1): "uni_number", (1, 1, 1, 1): "uni_space", (1, 3): None}
    bad, bad_digits = [], []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF or cp == 0x20:  # surrogates are no text; "a  !" would read as a symbol run
            continue
        c = chr(cp)
        probe = "a" + c + c + "!"  # letter: "acc" "!"; number: "a" "cc" "!"; space: "a" "c" "c" "!"; other: "a" "cc!"
        got = shapes[tuple(e - s for _, (s, e) in byte_level.pre_tokenize_str(probe))]
        ours = next((name for name in ("uni_letter", "uni_number", "uni_space") if cp in flat[name]), None)
        if got != ours:
            bad.append(cp)
        if (len(digits.pre_tokenize_str(probe)) == 4) != (cp in flat["uni_number"]):
            bad_digits.append(cp)
    print(f"unicode_ranges.h vs tokenizers' ByteLevel regex: {len(bad)} code points differ"
          + (": " + " ".join("U+%04X" % x for x in bad[:20]) if bad else ""))
    print(f"unicode_ranges.h's numbers vs tokenizers' Digits (Rust char::is_numeric): {len(bad_digits)} differ"
          + (": " + " ".join("U+%04X" % x for x in bad_digits[:20]) if bad_digits else ""))


def compare_transformers(gguf_path, cases, ids):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        print("transformers: not installed, comparison skipped")
        return
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tf = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    differ = [(s, want, tf.encode(s, add_special_tokens=False)) for s, want in zip(cases, ids)]
    differ = [d for d in differ if d[1] != d[2]]
    print(f"transformers' GGUF tokenizer (pre-tokenizer: {json.loads(tf.backend_tokenizer.to_str())['pre_tokenizer']['type']})"
          f" differs from this one on {len(differ)} of {len(cases)} strings")
    for s, want, got in differ:
        print(f"  {s!r}: tokenizers {want}, transformers {got}")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 weights/make_tokenizer_fixture.py SmolLM2-135M-Instruct.Q4_1.gguf")
    tokens, merges = gguf_vocab(sys.argv[1])
    tk = hf_tokenizer(tokens, merges)
    cases = all_cases()
    ids = [tk.encode(s, add_special_tokens=False).ids for s in cases]
    for s, i in zip(cases, ids):
        assert tk.decode(i) == s, (s, tk.decode(i))
    lines = [b"# SmolLM2-135M-Instruct (GGUF vocabulary, 49152 pieces, 48900 merges): Hugging Face tokenizers'",
             b"# ids for each string. Made by weights/make_tokenizer_fixture.py (its docstring: the escapes).",
             b"# One case a line: the escaped string, a TAB, the number of ids, then the ids."]
    for s, i in zip(cases, ids):
        lines.append(escape(s) + b"\t" + " ".join(str(x) for x in [len(i)] + i).encode())
    fd, tmp = tempfile.mkstemp(dir=HERE)
    with os.fdopen(fd, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, OUT)
    print(f"{OUT}: {len(cases)} strings, {sum(map(len, ids))} ids")
    compare_transformers(sys.argv[1], cases, ids)
    check_classes()


if __name__ == "__main__":
    main()
