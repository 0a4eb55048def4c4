#!/usr/bin/env python3
"""Checks weights/export_gguf.py: its dequantization, the bytes of what it
writes, and its refusals. Standard library only (no gguf, no numpy).

    python3 weights/check_export_gguf.py [--exporter FILE]

It writes its own small GGUF v3 files (write_gguf below, from the format:
header, typed key/values, tensor infos, aligned data) in a temporary folder:
  1. dequantization: one or two blocks of each type read (F32, F16, Q8_0,
     Q4_0, Q4_1), with the expected float32 values written out by hand from
     the block formats;
  2. tiny valid models (GQA, every tensor type, tied and untied classifiers,
     RoPE base 10000 and 100000, both byte-level pre-tokenizers, a
     SentencePiece vocabulary) converted, and their model.bin and
     tokenizer.bin read back field by field against the shared spec; the
     weights are compared with this file's own plain dequantizer;
  3. malformed or unsupported inputs, each refused with exactly one line
     "export_gguf.py: ..." naming the key or tensor, exit 1, no traceback,
     and nothing left behind: no temporary file, an old model.bin /
     tokenizer.bin pair byte for byte the same, the input unchanged.
One line per check, PASS or FAIL, then "N passed, N failed"; exit 1 on any
failure. --exporter runs another copy of the exporter.
"""
import hashlib
import importlib.util
import math
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = "export_gguf.py: "

n_pass = n_fail = 0


def report(ok, title, why=""):
    global n_pass, n_fail
    if ok:
        n_pass += 1
        print(f"PASS {title}")
    else:
        n_fail += 1
        print(f"FAIL {title}: {why}")


# ---- writing GGUF files ----------------------------------------------------------------
# A key/value is (key, type, value); type is a GGUF value type name, or
# "ARRAY:<element type>" (nested: "ARRAY:ARRAY:INT8"). A tensor is
# [name, dims (ggml order, row length first), ggml type name, raw bytes].

VALUE_IDS = {"UINT8": 0, "INT8": 1, "UINT16": 2, "INT16": 3, "UINT32": 4, "INT32": 5, "FLOAT32": 6, "BOOL": 7,
             "STRING": 8, "ARRAY": 9, "UINT64": 10, "INT64": 11, "FLOAT64": 12}
CODES = {"UINT8": "B", "INT8": "b", "UINT16": "H", "INT16": "h", "UINT32": "I", "INT32": "i", "FLOAT32": "f",
         "BOOL": "B", "UINT64": "Q", "INT64": "q", "FLOAT64": "d"}
GGML_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "BF16": 30}


def gguf_string(s):
    raw = s if isinstance(s, bytes) else s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def type_id(vtype):
    """A type name, or a raw number (a case's unknown type)."""
    if isinstance(vtype, int):
        return vtype
    name = vtype.split(":")[0]
    return int(name) if name.isdigit() else VALUE_IDS[name]


def value_bytes(vtype, value):
    """The value's bytes, without its type id."""
    if isinstance(vtype, int):  # an unknown type: 4 bytes of anything
        return struct.pack("<I", 0)
    if vtype.startswith("ARRAY:"):
        etype = vtype[6:]
        if isinstance(value, tuple):  # (count, the elements' bytes): a large array, written at once
            return struct.pack("<IQ", type_id(etype), value[0]) + value[1]
        return (struct.pack("<IQ", type_id(etype), len(value)) +
                b"".join(value_bytes(etype, v) for v in value))
    if vtype == "STRING":
        return gguf_string(value)
    return struct.pack("<" + CODES[vtype], value)


def write_gguf(path, kv, tensors, alignment=32, version=3, magic=b"GGUF", cut=None, offsets=None):
    """The file; offsets overrides tensors' offsets (a case), cut keeps only
    the first cut bytes."""
    head = [magic, struct.pack("<IQQ", version, len(tensors), len(kv))]
    for key, vtype, value in kv:
        head.append(gguf_string(key) + struct.pack("<I", type_id(vtype)) + value_bytes(vtype, value))
    data, placed = bytearray(), []
    for name, dims, ttype, raw in tensors:
        data += bytes(-len(data) % alignment)
        placed.append(len(data))
        data += raw
    for k, (name, dims, ttype, raw) in enumerate(tensors):
        offset = placed[k] if offsets is None or k not in offsets else offsets[k]
        tid = ttype if isinstance(ttype, int) else GGML_IDS[ttype]
        head.append(gguf_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, tid, offset))
    blob = b"".join(head)
    blob += bytes(-len(blob) % alignment) + data
    with open(path, "wb") as f:
        f.write(blob if cut is None else blob[:cut])


# ---- 1. dequantization by hand -----------------------------------------------------------

def half(bits):
    return struct.pack("<H", bits)


# Q8_0: f16 d, then 32 int8 q; x = d * q.
# Block 1: d = 0.5 (0x3800), q[j] = j - 16, so x runs -8.0 .. 7.5 by 0.5.
# Block 2: d = -0.25 (0xB400), q = 127, -128, 1, -1, then 28 zeros.
Q8_0_RAW = (half(0x3800) + bytes((j - 16) & 0xFF for j in range(32)) +
            half(0xB400) + bytes([127, 128, 1, 255]) + bytes(28))
Q8_0_WANT = [-8.0, -7.5, -7.0, -6.5, -6.0, -5.5, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5,
             0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5,
             -31.75, 32.0, -0.25, 0.25] + [-0.0] * 28   # d * 0 with d < 0 is -0.0 in IEEE arithmetic (as in ggml)

# Q4_0: f16 d, then 16 bytes; byte k = n[k] (low nibble) | n[k + 16] << 4; x = d * (n - 8).
# d = 2.0 (0x4000); byte k = k | (15 - k) << 4: elements 0..15 are n = 0..15,
# elements 16..31 are n = 15..0.
Q4_0_RAW = half(0x4000) + bytes(k | (15 - k) << 4 for k in range(16))
Q4_0_WANT = [-16.0, -14.0, -12.0, -10.0, -8.0, -6.0, -4.0, -2.0, 0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0,
             14.0, 12.0, 10.0, 8.0, 6.0, 4.0, 2.0, 0.0, -2.0, -4.0, -6.0, -8.0, -10.0, -12.0, -14.0, -16.0]

# Q4_1: f16 d, f16 m, then 16 bytes as Q4_0; x = d * n + m.
# Block 1: d = 0.25 (0x3400), m = -1.0 (0xBC00), the same nibbles as above.
# Block 2: d = 2^-16 (0x0100, a half subnormal), m = 1000.0 (0x63D0), low nibbles
# n = 0..15, high nibbles 0. Near 1000 a float32 step is 2^-14, so d * n is n/4
# of a step: the sum rounds to the nearest step, ties to even (1000.0 is an even
# step): n = 0, 1, 2 -> 1000.0; 3..5 -> +1 step; 6..10 -> +2 (6 and 10 are
# ties); 11..13 -> +3; 14, 15 -> +4 (14 is a tie). ggml rounds the same way
# (d * n is exact in float32, the one rounding is the addition).
Q4_1_RAW = (half(0x3400) + half(0xBC00) + bytes(k | (15 - k) << 4 for k in range(16)) +
            half(0x0100) + half(0x63D0) + bytes(range(16)))
S1, S2, S3, S4 = 1000.0000610351562, 1000.0001220703125, 1000.0001831054688, 1000.000244140625
Q4_1_WANT = [-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75,
             2.75, 2.5, 2.25, 2.0, 1.75, 1.5, 1.25, 1.0, 0.75, 0.5, 0.25, 0.0, -0.25, -0.5, -0.75, -1.0,
             1000.0, 1000.0, 1000.0, S1, S1, S1, S2, S2, S2, S2, S2, S3, S3, S3, S4, S4] + [1000.0] * 16

# F16: 1.0, -2.0, 65504 (the largest half), 2^-24 (the smallest subnormal),
# -0.0, 2^-14 (the smallest normal), 0x3555 (1/3 rounded to a half).
F16_RAW = b"".join(half(b) for b in (0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x0400, 0x3555))
F16_WANT = [1.0, -2.0, 65504.0, 5.960464477539063e-08, -0.0, 6.103515625e-05, 0.333251953125]

F32_RAW = struct.pack("<3f", 1.5, -0.1, 3e38)
F32_WANT = [1.5, struct.unpack("<f", struct.pack("<f", -0.1))[0], struct.unpack("<f", struct.pack("<f", 3e38))[0]]

HAND = [("F32", F32_RAW, 3, F32_WANT), ("F16", F16_RAW, 7, F16_WANT), ("Q8_0", Q8_0_RAW, 2, Q8_0_WANT),
        ("Q4_0", Q4_0_RAW, 1, Q4_0_WANT), ("Q4_1", Q4_1_RAW, 2, Q4_1_WANT)]


def same_floats(got, want):
    """Equal as float32 bits (so -0.0 differs from 0.0)."""
    return struct.pack(f"<{len(want)}f", *want) == struct.pack(f"<{len(got)}f", *got)


def check_hand_blocks(exporter):
    sys.dont_write_bytecode = True  # no __pycache__ left in weights/
    spec = importlib.util.spec_from_file_location("export_gguf", exporter)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    # ggml pads dims with 1s: a feed_forward_length of 1 makes the plan's ffn_gate [64, 1], which must
    # equal the file's [64, 1, 1, 1] (once only the file's side was trimmed: "[64, 1], expected [64, 1]")
    report(m.trimmed([64, 1, 1, 1]) == m.trimmed([64, 1]) == [64] and m.trimmed([1, 64]) == [1, 64],
           "tensor dims: trailing 1s are dropped on both sides ([64, 1, 1, 1] is [64, 1]; [1, 64] stays)")
    for kind, raw, n, want in HAND:
        got = list(m.dequantize(kind, raw, n))
        bad = next((i for i, (a, b) in enumerate(zip(got, want)) if struct.pack("<f", a) != struct.pack("<f", b)),
                   None)
        report(len(got) == len(want) and bad is None,
               f"dequantize {kind}: {len(want)} values equal the hand-computed ones (float32 bits)",
               f"{len(got)} values; first difference at {bad}: got {got[bad] if bad is not None else '-'}, "
               f"want {want[bad] if bad is not None else '-'}")


def plain_dequantize(kind, raw):
    """This checker's own reference: one value at a time, straight from the
    formats above (independent of the exporter's batched tables)."""
    if kind == "F32":
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    if kind == "F16":
        return list(struct.unpack(f"<{len(raw) // 2}e", raw))
    out = []
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[kind]
    for b in range(0, len(raw), size):
        block = raw[b:b + size]
        (d,) = struct.unpack_from("<e", block)
        if kind == "Q8_0":
            out += [d * q for q in struct.unpack_from("<32b", block, 2)]
        elif kind == "Q4_0":
            qs = block[2:]
            out += [d * ((qs[j] & 15) - 8) for j in range(16)] + [d * ((qs[j] >> 4) - 8) for j in range(16)]
        else:
            (m,) = struct.unpack_from("<e", block, 2)
            qs = block[4:]
            out += [d * (qs[j] & 15) + m for j in range(16)] + [d * (qs[j] >> 4) + m for j in range(16)]
    return out


# ---- 2. tiny models ------------------------------------------------------------------------

# The shape: GQA (4 query heads, 2 kv heads), head size 16; row lengths 64
# and 96, multiples of the 32-value blocks.
D, HD, L, NH, NKV, T = 64, 96, 2, 4, 2, 16
HS = D // NH
KVD = NKV * HS
PARTS = [("attn_norm", [D], "F32"), ("attn_q", [D, D], "Q4_0"), ("attn_k", [D, KVD], "Q4_1"),
         ("attn_v", [D, KVD], "F16"), ("attn_output", [D, D], "F32"), ("ffn_norm", [D], "F16"),
         ("ffn_gate", [D, HD], "Q4_1"), ("ffn_down", [HD, D], "Q8_0"), ("ffn_up", [D, HD], "Q4_0")]

# A byte-level vocabulary in GPT-2's mapped form (Ġ is the space, Ã© is é's two
# bytes), the special tokens first as SmolLM2's, and one 1,024-byte piece
# (kvt's longest).
LONG = "\u00e9" * 512
PIECES = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "e", "h", "t", "1", "2", "\u0120", "\u00c3",
          "\u00a9", "th", "\u0120t", "he", "\u0120th", "the", "\u0120the", "\u00c3\u00a9", LONG]
MERGES = ["t h", "\u0120 t", "h e", "\u0120t h", "t he", "\u0120th e", "\u00c3 \u00a9"]
V = len(PIECES)


def sentencepiece_vocab():
    """Llama 2's layout: <unk> <s> </s>, the 256 byte pieces, then pieces
    with U+2581 (the word marker), their SentencePiece scores and types."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
        ["\u2581t", "he", "\u2581the", "\u2581", "t", "h", "e"]
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0]
    types = [2, 3, 3] + [6] * 256 + [1] * 7
    return tokens, scores, types


def random_tensor(rng, kind, count):
    """count values of ggml type kind as raw bytes (scales kept small and
    normal so the model's numbers stay ordinary)."""
    if kind == "F32":
        return struct.pack(f"<{count}f", *[rng.uniform(-1, 1) for _ in range(count)])
    if kind == "F16":
        return struct.pack(f"<{count}e", *[rng.uniform(-1, 1) for _ in range(count)])
    out = bytearray()
    for _ in range(count // 32):
        if kind == "Q8_0":
            out += struct.pack("<e", rng.uniform(0.001, 0.01)) + bytes(rng.randrange(256) for _ in range(32))
        elif kind == "Q4_0":
            out += struct.pack("<e", rng.uniform(0.01, 0.1)) + bytes(rng.randrange(256) for _ in range(16))
        else:
            out += struct.pack("<2e", rng.uniform(0.01, 0.1), rng.uniform(-0.5, 0.5)) + \
                bytes(rng.randrange(256) for _ in range(16))
    return bytes(out)


class Model:
    """A GGUF file to be written: key/values and tensors, which a case edits."""

    def __init__(self, theta=100000.0, tied=True, pre="smollm", add_bos=False, vocab="bpe", seed=41, dim=D):
        rng = random.Random(seed)
        self.kv = [("general.architecture", "STRING", "llama"), ("general.name", "STRING", "tiny"),
                   ("llama.block_count", "UINT32", L), ("llama.context_length", "UINT32", T),
                   ("llama.embedding_length", "UINT32", dim), ("llama.feed_forward_length", "UINT32", HD),
                   ("llama.attention.head_count", "UINT32", NH), ("llama.attention.head_count_kv", "UINT32", NKV),
                   ("llama.rope.freq_base", "FLOAT32", theta),
                   ("llama.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-5),
                   ("llama.rope.dimension_count", "UINT32", dim // NH)]
        if vocab == "bpe":
            self.pieces = list(PIECES)
            self.kv += [("tokenizer.ggml.model", "STRING", "gpt2"), ("tokenizer.ggml.pre", "STRING", pre),
                        ("tokenizer.ggml.tokens", "ARRAY:STRING", self.pieces),
                        ("tokenizer.ggml.token_type", "ARRAY:INT32", [3, 3, 3] + [1] * (V - 3)),
                        ("tokenizer.ggml.merges", "ARRAY:STRING", list(MERGES)),
                        ("tokenizer.ggml.bos_token_id", "UINT32", 1), ("tokenizer.ggml.eos_token_id", "UINT32", 2)]
            if add_bos is not None:
                self.kv.append(("tokenizer.ggml.add_bos_token", "BOOL", add_bos))
        else:
            tokens, scores, types = sentencepiece_vocab()
            self.pieces = tokens
            self.kv += [("tokenizer.ggml.model", "STRING", "llama"), ("tokenizer.ggml.tokens", "ARRAY:STRING", tokens),
                        ("tokenizer.ggml.scores", "ARRAY:FLOAT32", scores),
                        ("tokenizer.ggml.token_type", "ARRAY:INT32", types),
                        ("tokenizer.ggml.bos_token_id", "UINT32", 1), ("tokenizer.ggml.eos_token_id", "UINT32", 2),
                        ("tokenizer.ggml.add_bos_token", "BOOL", True)]
        nv = len(self.pieces)
        # llama.cpp's order: the embedding, then per layer, then output_norm and output
        self.tensors = [["token_embd.weight", [dim, nv], "Q8_0", None]]
        for i in range(L):  # (dim: a case's other width; its rows are not whole blocks, so only F32 there)
            self.tensors += [[f"blk.{i}.{p}.weight", [dim if d == D else d * dim // D for d in dims],
                              kind if dim == D else "F32", None] for p, dims, kind in PARTS]
        self.tensors.append(["output_norm.weight", [dim], "F32", None])
        if not tied:
            self.tensors.append(["output.weight", [dim, nv], "Q4_1", None])
        for t in self.tensors:
            count = 1
            for d in t[1]:
                count *= d
            t[3] = random_tensor(rng, t[2], count)
        self.alignment = 32
        self.theta, self.tied = theta, tied

    def set(self, key, vtype, value):
        """Replace (or add) a key; value None removes it."""
        self.kv = [e for e in self.kv if e[0] != key]
        if value is not None:
            self.kv.append((key, vtype, value))

    def tensor(self, name):
        return next(t for t in self.tensors if t[0] == name)

    def write(self, path, **kw):
        kv = list(self.kv)
        if self.alignment != 32:
            kv.append(("general.alignment", "UINT32", self.alignment))
        write_gguf(path, kv, self.tensors, alignment=self.alignment, **kw)

    def expected_checkpoint(self):
        """model.bin as the spec says, computed here."""
        nv = len(self.pieces)
        head = struct.pack("<7i", D, HD, L, NH, NKV, nv if self.tied else -nv, T)
        if struct.unpack("<f", struct.pack("<f", self.theta))[0] != 10000.0:
            head += b"rope" + struct.pack("<f", self.theta)
        order = ["token_embd.weight"] + [f"blk.{i}.{p}.weight" for p, _, _ in PARTS for i in range(L)] + \
            ["output_norm.weight", None] + ([] if self.tied else ["output.weight"])
        regions = []
        for name in order:
            if name is None:
                regions.append(("freq_cis_real/imag", bytes(4 * T * HS)))
            else:
                t = self.tensor(name)
                vals = plain_dequantize(t[2], t[3])
                regions.append((name, struct.pack(f"<{len(vals)}f", *vals)))
        return head, regions


def parse_tokenizer(blob, n):
    """tokenizer.bin -> (max_token_length, [(score, bytes)] * n, the rest)."""
    (maxlen,) = struct.unpack_from("<i", blob)
    pos, records = 4, []
    for _ in range(n):
        score, k = struct.unpack_from("<fi", blob, pos)
        records.append((score, blob[pos + 8:pos + 8 + k]))
        pos += 8 + k
    return maxlen, records, blob[pos:]


def check_model(exporter, base, title, model):
    """Convert model; read both outputs back field by field."""
    os.makedirs(base)
    src, out_m, out_t = (os.path.join(base, n) for n in ("in.gguf", "model.bin", "tokenizer.bin"))
    model.write(src)
    rc, _, err = run([sys.executable, exporter, src, out_m, out_t])
    report(rc == 0 and err.startswith(TOOL) and len(err.splitlines()) == 1, f"{title}: converts",
           f"exit {rc}: {err.strip()[-300:]}")
    if rc != 0:
        return
    with open(out_m, "rb") as f:
        got = f.read()
    head, regions = model.expected_checkpoint()
    nv = len(model.pieces)
    fields = struct.unpack_from("<7i", got)
    report(fields == (D, HD, L, NH, NKV, nv if model.tied else -nv, T),
           f"{title}: header (dim, hidden, layers, heads, kv heads, vocab, seq_len) = {fields}",
           f"expected {(D, HD, L, NH, NKV, nv if model.tied else -nv, T)}")
    if len(head) == 36:
        ext = got[28:32], struct.unpack_from("<f", got, 32)[0]
        report(ext == (b"rope", model.theta), f"{title}: the RoPE extension follows: b'rope', theta {ext[1]:g}",
               f"got {ext}")
    else:
        report(got[28:32] != b"rope", f"{title}: theta 10000: no extension (legacy header of 28 bytes)",
               "the file has 'rope' after the header")
    n_floats = sum(len(r) for _, r in regions) // 4
    report(len(got) == len(head) + 4 * n_floats, f"{title}: length {len(got)} = {len(head)} + 4 * {n_floats} floats",
           f"expected {len(head) + 4 * n_floats}")
    pos, bad = len(head), None
    for name, region in regions:
        if got[pos:pos + len(region)] != region:
            bad = name
            break
        pos += len(region)
    report(bad is None, f"{title}: {len(regions)} tensors in the spec's order equal this checker's dequantization "
           "(the RoPE tables zeros" + ("" if model.tied else ", wcls last") + ")", f"first difference in {bad}")
    with open(out_t, "rb") as f:
        tok = f.read()
    maxlen, records, rest = parse_tokenizer(tok, nv)
    pieces_ok = all(r[1] == p.encode() and r[0] == 0.0 for r, p in zip(records, model.pieces))
    report(maxlen == max(len(p.encode()) for p in model.pieces) and pieces_ok,
           f"{title}: tokenizer.bin: max_token_length {maxlen}, {nv} records of score 0.0 and the pieces as they are",
           f"max_token_length {maxlen}, pieces equal: {pieces_ok}")
    kv = {k: v for k, _, v in model.kv}
    want_pre = {"smollm": 2, "gpt2": 1, "gpt-2": 1}[kv["tokenizer.ggml.pre"]]
    want_bos = kv["tokenizer.ggml.bos_token_id"] if kv.get("tokenizer.ggml.add_bos_token") else -1
    ids = {p: i for i, p in enumerate(model.pieces)}
    want_pairs = [x for m in kv["tokenizer.ggml.merges"] for x in (ids[m.split(" ")[0]], ids[m.split(" ")[1]])]
    trailer = (b"BBPE" + struct.pack("<4i", want_pre, want_bos, kv["tokenizer.ggml.eos_token_id"], len(want_pairs) // 2)
               + struct.pack(f"<{len(want_pairs)}i", *want_pairs))
    report(rest == trailer, f"{title}: trailer BBPE, pre {want_pre}, bos {want_bos}, eos "
           f"{kv['tokenizer.ggml.eos_token_id']}, {len(want_pairs) // 2} merges as id pairs, then the end of the file",
           f"got {rest[:40]!r}... ({len(rest)} bytes), want {trailer[:40]!r}... ({len(trailer)} bytes)")


# A signal while the checkpoint is being written: the exporter itself, run with
# its write_tensor wrapped so the process sends itself the signal before the
# third tensor (a real signal, delivered at a known point, not a race).
SIGNAL_RUNNER = """
import os, signal, sys
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import importlib.util
spec = importlib.util.spec_from_file_location("export_gguf", sys.argv[1])
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)
plain, count = ex.write_tensor, [0]
def write_tensor(f, g, t):
    count[0] += 1
    if count[0] == 3:
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    plain(f, g, t)
ex.write_tensor = write_tensor
sys.exit(ex.main(["export_gguf.py"] + sys.argv[3:]))
"""


def check_signals(exporter, base):
    """TERM, HUP and INT mid-write: one line, exit 1, no hidden temporary left,
    the old outputs untouched."""
    os.makedirs(base)
    src, out_m, out_t = (os.path.join(base, n) for n in ("in.gguf", "model.bin", "tokenizer.bin"))
    Model().write(src)
    for path in (out_m, out_t):
        with open(path, "wb") as f:
            f.write(b"the old output")
    for name in ("SIGTERM", "SIGHUP", "SIGINT"):
        before = snapshot(base)
        rc, _, err = run([sys.executable, "-c", SIGNAL_RUNNER, exporter, name, src, out_m, out_t])
        after = snapshot(base)
        ok = (rc == 1 and "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith(TOOL)
              and f"stopped by {name}" in err and after == before)
        report(ok, f"{name} while writing: one line, exit 1, no temporary left, the old outputs kept",
               f"exit {rc}; changed: {sorted(set(before) ^ set(after))}; stderr {err.strip()[-300:]!r}")


def check_big_arrays(exporter, base):
    """Metadata arrays the export does not use are read past, not built: a
    10M-element BOOL array and 1M empty nested arrays (22 MB of metadata)
    convert with the exporter's peak memory under 100 MB (building them as
    Python objects took about 0.25 GB; the untouched file, about 20 MB)."""
    os.makedirs(base)
    src, out_m, out_t = (os.path.join(base, n) for n in ("in.gguf", "model.bin", "tokenizer.bin"))
    m = Model()
    n_bool, n_nested = 10_000_000, 1_000_000
    m.kv += [("x.bools", "ARRAY:BOOL", (n_bool, bytes(n_bool))),
             ("x.nested", "ARRAY:ARRAY:INT8", (n_nested, struct.pack("<IQ", type_id("INT8"), 0) * n_nested))]
    m.write(src)
    measure = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "sys.stderr.write(p.stderr); "
               "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    rc, out, err = run([sys.executable, "-c", measure, sys.executable, exporter, src, out_m, out_t])
    fields = out.split()
    ok = rc == 0 and len(fields) == 2 and fields[0] == "0"
    peak_mb = int(fields[1]) / 1024 if ok else 0
    report(ok and peak_mb < 100, f"unused metadata arrays (10M BOOL, 1M nested) skipped: peak {peak_mb:.0f} MB "
           "(< 100 MB)", f"exit {rc}: {out.strip()} {err.strip()[-300:]}")


def check_sentencepiece(exporter, base):
    os.makedirs(base)
    src, out_m, out_t = (os.path.join(base, n) for n in ("in.gguf", "model.bin", "tokenizer.bin"))
    model = Model(theta=10000.0, vocab="spm")
    model.write(src)
    rc, _, err = run([sys.executable, exporter, src, out_m, out_t])
    report(rc == 0, "SentencePiece vocabulary (tokenizer.ggml.model llama): converts", f"exit {rc}: {err.strip()}")
    if rc != 0:
        return
    tokens, scores, types = sentencepiece_vocab()
    with open(out_t, "rb") as f:
        tok = f.read()
    maxlen, records, rest = parse_tokenizer(tok, len(tokens))
    want = []
    for i, (t, s, ty) in enumerate(zip(tokens, scores, types)):
        text = t if ty == 3 or 3 <= i < 259 else t.replace("\u2581", " ")
        want.append((-1e30 if ty == 3 else s, text.encode()))
    got = [(struct.unpack("<f", struct.pack("<f", s))[0], b) for s, b in records]
    want = [(struct.unpack("<f", struct.pack("<f", s))[0], b) for s, b in want]
    report(got == want and rest == b"" and maxlen == 6,
           "SentencePiece: legacy tokenizer.bin (U+2581 -> space, the scores kept, control tokens -1e30, no "
           "trailer)", f"records equal {got == want}, {len(rest)} bytes after them, max_token_length {maxlen}")


# ---- running the exporter and watching what it touches --------------------------------------

def run(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, "", f"{cmd[0]}: {e}\n"
    return p.returncode, p.stdout, p.stderr


def file_hash(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def snapshot(folder):
    """Every entry under folder: kind, content hash or link target, inode."""
    seen = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            key = os.path.relpath(path, folder)
            if stat.S_ISLNK(st.st_mode):
                seen[key] = ("link", os.readlink(path), st.st_ino)
            elif stat.S_ISREG(st.st_mode):
                seen[key] = ("file", file_hash(path), st.st_ino)
            else:
                seen[key] = ("other", st.st_mode, st.st_ino)
    return seen


def expect_refusal(title, cmd, want, watch):
    before = snapshot(watch)
    rc, _, err = run(cmd)
    problems = []
    if rc != 1:
        problems.append(f"exit {rc}, expected 1")
    if "Traceback" in err:
        problems.append("a Python traceback")
    lines = err.splitlines()
    if len(lines) != 1 or not err.endswith("\n"):
        problems.append(f"{len(lines)} lines on stderr, expected 1")
    elif not lines[0].startswith(TOOL):
        problems.append(f"the line does not start with {TOOL!r}")
    missing = [w for w in want if w not in err]
    if missing:
        problems.append(f"the message lacks {missing}")
    if any(not c.isprintable() for c in err[:-1]):
        problems.append("a non-printable character on stderr (unescaped)")
    after = snapshot(watch)
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        problems.append(f"changed: {', '.join(changed[:4])}")
    first = lines[-1] if lines else ""
    report(not problems, f"{title}: {first[:200]}", "; ".join(problems) + f" (stderr: {err.strip()[-300:]!r})")


# ---- 3. the refusals -----------------------------------------------------------------------

def cases():
    """(title, setup, expected substrings). setup(model, src, outs) edits the
    Model (written to src afterwards unless setup wrote src itself and
    returns written=True) and returns (model path, tokenizer path, written)."""

    def kv(key, vtype, value):
        def setup(m, src, outs):
            m.set(key, vtype, value)
            return outs + (False,)
        return setup

    def edit(fn):
        def setup(m, src, outs):
            fn(m)
            return outs + (False,)
        return setup

    def raw(**kw):  # write the file with one of write_gguf's knobs
        def setup(m, src, outs):
            m.write(src, **kw)
            return outs + (True,)
        return setup

    def cut_at(where):
        def setup(m, src, outs):
            m.write(src)
            with open(src, "rb") as f:
                blob = f.read()
            n = where(blob)
            with open(src, "wb") as f:
                f.write(blob[:n])
            return outs + (True,)
        return setup

    def patch(fn):  # bytes of the written file -> new bytes
        def setup(m, src, outs):
            m.write(src)
            with open(src, "rb") as f:
                blob = f.read()
            with open(src, "wb") as f:
                f.write(fn(blob))
            return outs + (True,)
        return setup

    def retype(name, kind, dims=None):
        def fn(m):
            t = m.tensor(name)
            t[2] = kind
            if dims:
                t[1] = dims
            t[3] = bytes(len(t[3]))  # any bytes: refused before they are read
        return edit(fn)

    def drop(name):
        return edit(lambda m: m.tensors.remove(m.tensor(name)))

    def add(name, dims, kind="F32"):
        return edit(lambda m: m.tensors.append([name, dims, kind, bytes(4 * dims[0])]))

    def merges(values):
        return kv("tokenizer.ggml.merges", "ARRAY:STRING", values)

    def piece(i, text):
        def fn(m):
            m.pieces[i] = text
        return edit(fn)

    def out_is_input(src, which):
        def setup(m, s, outs):
            return (s, outs[1], False) if which == 0 else (outs[0], s, False)
        return setup

    def hard_link(m, src, outs):  # the model output is another name of the input file
        m.write(src)
        os.unlink(outs[0])
        os.link(src, outs[0])
        return outs + (True,)

    def symlink(m, src, outs):
        os.rename(outs[0], outs[0] + ".real")
        os.symlink(os.path.basename(outs[0]) + ".real", outs[0])
        return outs + (False,)

    def directory(m, src, outs):
        os.unlink(outs[1])
        os.mkdir(outs[1])
        return outs + (False,)

    def no_folder(m, src, outs):
        return (os.path.join(os.path.dirname(outs[0]), "none", "model.bin"), outs[1], False)

    def same_twice(m, src, outs):
        return (outs[0], outs[0], False)

    def no_input(m, src, outs):
        return outs + (None,)  # None: the input is never written

    def input_dir(m, src, outs):
        os.mkdir(src)
        return outs + (True,)

    def tensor_info_offset(blob, name, delta):
        """Move tensor name's offset by delta bytes (in place in the header)."""
        key = struct.pack("<Q", len(name)) + name.encode()
        i = blob.index(key) + len(key)
        (n_dims,) = struct.unpack_from("<I", blob, i)
        at = i + 4 + 8 * n_dims + 4
        (off,) = struct.unpack_from("<Q", blob, at)
        return blob[:at] + struct.pack("<Q", off + delta) + blob[at + 8:]

    def overlap(m, src, outs):
        m.write(src)
        with open(src, "rb") as f:
            blob = f.read()
        # blk.0.attn_norm.weight's data: move it onto token_embd's (offset 0)
        key = b"blk.0.attn_norm.weight"
        i = blob.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
        at = i + 4 + 8 + 4
        with open(src, "wb") as f:
            f.write(blob[:at] + struct.pack("<Q", 0) + blob[at + 8:])
        return outs + (True,)

    last = "output_norm.weight"
    return [
        # the container
        ("a file of 3 bytes", cut_at(lambda b: 3), ["in.gguf", "shorter than the magic"]),
        ("bad magic (GGML)", patch(lambda b: b"GGML" + b[4:]), ["in.gguf", "not a GGUF file"]),
        ("GGUF version 2", raw(version=2), ["in.gguf", "version 2", "only version 3"]),
        ("a big-endian file (version 3 byte-swapped)", raw(version=3 << 24), ["in.gguf", "big-endian"]),
        ("truncated in the header counts", cut_at(lambda b: 20), ["in.gguf", "truncated", "metadata count"]),
        ("truncated in the middle of the metadata", cut_at(lambda b: b.index(b"tokenizer.ggml.tokens") + 30),
         ["in.gguf", "truncated", "tokenizer.ggml.tokens"]),
        ("truncated in the tensor infos", cut_at(lambda b: b.index(b"blk.1.ffn_up.weight") + 25),
         ["in.gguf", "truncated", "blk.1.ffn_up.weight"]),
        ("a tensor count larger than the file can hold",
         patch(lambda b: b[:8] + struct.pack("<Q", 1 << 40) + b[16:]), ["in.gguf", "truncated", "cannot fit"]),
        ("a string length past the end of the file",
         patch(lambda b: b[:24] + struct.pack("<Q", 1 << 50) + b[32:]), ["in.gguf", "truncated", "metadata key 0"]),
        ("an unknown value type (13)", edit(lambda m: m.kv.append(("general.weird", 13, None))),
         ["in.gguf", "general.weird", "unknown value type 13"]),
        ("an array of an unknown element type", edit(lambda m: m.kv.append(("general.arr", "ARRAY:99", []))),
         ["in.gguf", "general.arr", "unknown element type 99"]),
        ("a BOOL of value 2", patch(lambda b: b.replace(b"tokenizer.ggml.add_bos_token" + struct.pack("<IB", 7, 0),
                                                         b"tokenizer.ggml.add_bos_token" + struct.pack("<IB", 7, 2))),
         ["in.gguf", "tokenizer.ggml.add_bos_token", "BOOL"]),
        ("a key given twice", edit(lambda m: m.kv.append(("llama.block_count", "UINT32", 2))),
         ["in.gguf", "llama.block_count", "twice"]),
        ("a string that is not UTF-8", kv("general.name", "STRING", b"\xff\xfe"), ["in.gguf", "general.name",
                                                                                 "UTF-8"]),
        ("a tensor given twice", edit(lambda m: m.tensors.append(list(m.tensor(last)))), [last, "twice"]),
        # names and keys from the file reach the terminal escaped: no raw ESC or NUL
        ("a tensor name with ESC sequences", add("evil\x1b[2J\x1b[31mRED", [D]),
         ["tensor evil\\x1b[2J\\x1b[31mRED", "not a tensor"]),
        ("a key with NUL and ESC given twice", edit(lambda m: m.kv.extend([("x\x00\x1b", "UINT32", 1)] * 2)),
         ["metadata key x\\x00\\x1b appears twice"]),
        ("a tensor of 5 dims", edit(lambda m: m.tensor(last).__setitem__(1, [D, 1, 1, 1, 1])), [last, "5 dims"]),
        ("general.alignment 0", kv("general.alignment", "UINT32", 0), ["general.alignment", "power of two"]),
        ("general.alignment 48", kv("general.alignment", "UINT32", 48), ["general.alignment", "power of two"]),
        ("general.alignment a UINT64", kv("general.alignment", "UINT64", 32), ["general.alignment", "UINT32"]),
        ("a tensor offset that is not a multiple of the alignment",
         patch(lambda b: tensor_info_offset(b, last, 4)), [last, "not a multiple of the alignment"]),
        ("tensor data past the end of the file (the last tensor)",
         patch(lambda b: tensor_info_offset(b, last, 1 << 20)), [last, "past the end"]),
        ("a file cut inside the last tensor's data", cut_at(lambda b: len(b) - 8), [last, "past the end"]),
        ("two tensors overlap", overlap, ["token_embd.weight", "blk.0.attn_norm.weight", "overlap"]),
        # the tensors
        ("an unsupported tensor type named (Q4_K)", retype("blk.1.ffn_up.weight", "Q4_K"),
         ["blk.1.ffn_up.weight", "Q4_K"]),
        ("an unsupported tensor type named (BF16)", retype("blk.0.attn_norm.weight", "BF16"),
         ["blk.0.attn_norm.weight", "BF16"]),
        ("an unknown tensor type id (99)", retype("blk.0.attn_norm.weight", 99), ["blk.0.attn_norm.weight", "99"]),
        ("a row that is not whole blocks (Q8_0 rows of 48)",
         lambda m, src, outs: (Model.__init__(m, dim=48), outs + (False,))[1],
         ["token_embd.weight", "row length 48", "Q8_0"]),
        ("a missing tensor named", drop("blk.1.ffn_down.weight"), ["blk.1.ffn_down.weight", "missing"]),
        ("a wrong shape (attn_k as wide as attn_q)",
         edit(lambda m: m.tensor("blk.0.attn_k.weight").__setitem__(1, [D, D])), ["blk.0.attn_k.weight", "dims"]),
        ("token_embd with one row too many", edit(lambda m: m.tensor("token_embd.weight").__setitem__(1, [D, V + 1])),
         ["token_embd.weight", "dims"]),
        ("a bias tensor", add("blk.0.attn_q.bias", [D]), ["blk.0.attn_q.bias", "not a tensor"]),
        ("rope_freqs (Llama 3.1 RoPE scaling)", add("rope_freqs.weight", [HS // 2]), ["rope_freqs.weight",
                                                                                      "RoPE"]),
        # the hyperparameters
        ("general.architecture gpt2", kv("general.architecture", "STRING", "gpt2"), ["general.architecture", "gpt2"]),
        ("no general.architecture", kv("general.architecture", None, None), ["general.architecture", "missing"]),
        ("no llama.embedding_length", kv("llama.embedding_length", None, None), ["llama.embedding_length",
                                                                                 "missing"]),
        ("llama.block_count a string", kv("llama.block_count", "STRING", "2"), ["llama.block_count", "STRING"]),
        ("head_count_kv 3 does not divide head_count 4", kv("llama.attention.head_count_kv", "UINT32", 3),
         ["llama.attention.head_count_kv"]),
        ("context_length above KVT_LIMIT_SEQ", kv("llama.context_length", "UINT32", (1 << 20) + 1),
         ["llama.context_length", "KVT_LIMIT_SEQ"]),
        ("llama.rope.scaling.type linear", kv("llama.rope.scaling.type", "STRING", "linear"),
         ["llama.rope.scaling.type", "linear"]),
        ("llama.rope.scale_linear 2", kv("llama.rope.scale_linear", "FLOAT32", 2.0), ["llama.rope.scale_linear"]),
        ("llama.rope.freq_base 0.5", kv("llama.rope.freq_base", "FLOAT32", 0.5), ["llama.rope.freq_base"]),
        ("llama.rope.freq_base NaN", kv("llama.rope.freq_base", "FLOAT32", math.nan), ["llama.rope.freq_base"]),
        # kvt's loader takes a base below 1e30 only: the exporter refuses what kvt would
        ("llama.rope.freq_base 1e30 (kvt's limit)", kv("llama.rope.freq_base", "FLOAT32", 1e30),
         ["llama.rope.freq_base", "below 1e30"]),
        ("llama.rope.freq_base 1e31", kv("llama.rope.freq_base", "FLOAT32", 1e31), ["llama.rope.freq_base",
                                                                                    "below 1e30"]),
        ("a 2-piece vocabulary (kvt needs ids 1 and 2)", kv("tokenizer.ggml.tokens", "ARRAY:STRING", ["a", "b"]),
         ["tokenizer.ggml.tokens holds 2 pieces", "[3, "]),
        ("layer_norm_rms_epsilon 1e-6", kv("llama.attention.layer_norm_rms_epsilon", "FLOAT32", 1e-6),
         ["llama.attention.layer_norm_rms_epsilon", "1e-5"]),
        ("no layer_norm_rms_epsilon", kv("llama.attention.layer_norm_rms_epsilon", None, None),
         ["llama.attention.layer_norm_rms_epsilon", "missing"]),
        ("partial rotary (rope.dimension_count 8)", kv("llama.rope.dimension_count", "UINT32", 8),
         ["llama.rope.dimension_count"]),
        ("experts (llama.expert_count 8)", kv("llama.expert_count", "UINT32", 8), ["llama.expert_count"]),
        # the tokenizer
        ("tokenizer.ggml.model bert", kv("tokenizer.ggml.model", "STRING", "bert"), ["tokenizer.ggml.model", "bert"]),
        ("tokenizer.ggml.pre llama-bpe", kv("tokenizer.ggml.pre", "STRING", "llama-bpe"),
         ["tokenizer.ggml.pre", "llama-bpe"]),
        ("no tokenizer.ggml.pre", kv("tokenizer.ggml.pre", None, None), ["tokenizer.ggml.pre", "missing"]),
        ("no tokenizer.ggml.merges", kv("tokenizer.ggml.merges", None, None), ["tokenizer.ggml.merges", "missing"]),
        ("a merge whose side is not in the vocabulary", merges(MERGES + ["x t"]),
         ["tokenizer.ggml.merges[7]", '"x"', "not in the vocabulary"]),
        ("a merge whose result is not in the vocabulary", merges(MERGES + ["a t"]),
         ["tokenizer.ggml.merges[7]", "result", '"at"']),
        ("a merge without a space", merges(MERGES + ["th"]), ["tokenizer.ggml.merges[7]", "one space"]),
        ("a merge with two spaces", merges(MERGES + ["t h e"]), ["tokenizer.ggml.merges[7]", "one space"]),
        ("two pieces with one string", piece(4, "a"), ["pieces 3 and 4", "same string"]),
        ("a piece with a NUL", piece(3, "a\0"), ["piece id 3", "NUL"]),
        ("a piece of 1,025 bytes", piece(V - 1, LONG + "x"), [f"piece id {V - 1}", "1025 bytes"]),
        ("eos_token_id past the vocabulary", kv("tokenizer.ggml.eos_token_id", "UINT32", V),
         ["tokenizer.ggml.eos_token_id"]),
        ("no eos_token_id", kv("tokenizer.ggml.eos_token_id", None, None), ["tokenizer.ggml.eos_token_id",
                                                                            "missing"]),
        ("add_bos_token true without bos_token_id",
         edit(lambda m: (m.set("tokenizer.ggml.add_bos_token", "BOOL", True),
                         m.set("tokenizer.ggml.bos_token_id", None, None))), ["tokenizer.ggml.bos_token_id"]),
        ("llama.vocab_size disagrees with the token list", kv("llama.vocab_size", "UINT32", V + 1),
         ["llama.vocab_size"]),
        ("tokenizer.ggml.scores of the wrong length (SentencePiece)",
         lambda m, src, outs: (Model.__init__(m, theta=10000.0, vocab="spm"),
                               m.set("tokenizer.ggml.scores", "ARRAY:FLOAT32", [0.0] * 3), outs + (False,))[2],
         ["tokenizer.ggml.scores"]),
        ("SentencePiece without the byte pieces",
         lambda m, src, outs: (Model.__init__(m, theta=10000.0, vocab="spm"), m.pieces.__setitem__(3, "<0xZZ>"),
                               outs + (False,))[2], ["tokenizer.ggml.tokens", "<0x00>"]),
        # the outputs
        ("the model output is the input", out_is_input(None, 0), ["in.gguf", "is the input file"]),
        ("the tokenizer output is the input", out_is_input(None, 1), ["in.gguf", "is the input file"]),
        ("the model output is a hard link to the input", hard_link, ["model.bin", "is the input file"]),
        ("the two outputs are the same path", same_twice, ["model.bin", "same file"]),
        ("the model output's folder does not exist", no_folder, ["none/model.bin", "does not exist"]),
        ("the model output is a symbolic link", symlink, ["model.bin", "symbolic link"]),
        ("the tokenizer output is a directory", directory, ["tokenizer.bin", "directory"]),
        ("no input file", no_input, ["in.gguf", "no such file"]),
        ("the input is a directory", input_dir, ["in.gguf", "not a regular file"]),
    ]


INJECT = """
import errno, importlib.util, os, sys
mode, path = sys.argv[1:3]
spec = importlib.util.spec_from_file_location("export_gguf", path)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
if mode == "read":  # the last tensor cannot be read: the failure comes mid-write
    write = m.write_tensor
    def failing_write(f, g, t):
        if t.name == "output_norm.weight":
            raise OSError(errno.EIO, "injected read error")
        return write(f, g, t)
    m.write_tensor = failing_write
else:  # the second rename into place fails: the first must be undone
    replace, calls = os.replace, []
    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, "injected rename error", src)
        return replace(src, dst)
    os.replace = failing_replace
sys.exit(m.main(["export_gguf.py"] + sys.argv[3:]))
"""


def fresh_outputs(folder):
    """An output folder holding an old pair: a refusal must leave it so."""
    os.makedirs(folder)
    pair = os.path.join(folder, "model.bin"), os.path.join(folder, "tokenizer.bin")
    for path, text in zip(pair, (b"old model.bin " * 64, b"old tokenizer.bin " * 16)):
        with open(path, "wb") as f:
            f.write(text)
    return pair


def main(argv):
    args = argv[1:]
    exporter = os.path.join(HERE, "export_gguf.py")
    if "--exporter" in args:
        i = args.index("--exporter")
        exporter = os.path.abspath(args[i + 1])
        del args[i:i + 2]
    scratch = tempfile.mkdtemp(prefix="kvt_check_gguf_")
    try:
        check_hand_blocks(exporter)
        for k, (title, model) in enumerate([
                ("theta 100000, tied, smollm, no add_bos_token", Model(theta=100000.0, tied=True, add_bos=None)),
                ("theta 10000, untied, gpt2, add_bos_token false", Model(theta=10000.0, tied=False, pre="gpt2")),
                ("theta 500000, untied, pre gpt-2 (llama.cpp's spelling), add_bos_token true",
                 Model(theta=500000.0, tied=False, pre="gpt-2", add_bos=True, seed=7))]):
            check_model(exporter, os.path.join(scratch, f"model{k}"), title, model)
        check_sentencepiece(exporter, os.path.join(scratch, "spm"))
        check_signals(exporter, os.path.join(scratch, "signals"))
        check_big_arrays(exporter, os.path.join(scratch, "arrays"))

        def accepted(title, fn):
            m = Model()
            fn(m)
            check_model(exporter, os.path.join(scratch, "ok-" + title.split()[0]), "accepted: " + title, m)

        def every_type(m):  # metadata of every value type, arrays nested, that the exporter must read past
            m.kv += [("x.u8", "UINT8", 255), ("x.i8", "INT8", -128), ("x.u16", "UINT16", 65535),
                     ("x.i16", "INT16", -32768), ("x.u32", "UINT32", 1 << 31), ("x.i32", "INT32", -1),
                     ("x.f32", "FLOAT32", 0.5), ("x.bool", "BOOL", True), ("x.str", "STRING", "\u00e9t\u00e9"),
                     ("x.u64", "UINT64", 1 << 63), ("x.i64", "INT64", -(1 << 63)), ("x.f64", "FLOAT64", 1e300),
                     ("x.arr", "ARRAY:ARRAY:INT8", [[1, -2], [], [3]]), ("x.bools", "ARRAY:BOOL", [True, False]),
                     ("x.empty", "ARRAY:STRING", [])]

        accepted("alignment 64 (general.alignment)", lambda m: setattr(m, "alignment", 64))
        accepted("tensors stored in another order", lambda m: m.tensors.reverse())
        accepted("metadata of every value type, nested arrays", every_type)
        accepted("rope.scaling.type none", lambda m: m.set("llama.rope.scaling.type", "STRING", "none"))

        for k, (title, setup, want) in enumerate(cases()):
            base = os.path.join(scratch, f"case{k:02d}")
            src = os.path.join(base, "in.gguf")
            outs = fresh_outputs(os.path.join(base, "out"))
            m = Model()
            try:
                model_out, tok_out, written = setup(m, src, outs)
            except OSError as e:
                print(f"SKIP {title}: cannot set it up here ({e.strerror})")
                continue
            if written is False:
                m.write(src)
            if model_out is None:
                model_out = src
            if tok_out is None:
                tok_out = src
            expect_refusal(title, [sys.executable, exporter, src, model_out, tok_out], want, base)

        for mode, title, want in (
                ("read", "a read error on a late tensor, mid-write (injected): temporaries removed",
                 ["model.bin", "injected read error"]),
                ("rename", "the second rename into place fails (injected): the first is undone",
                 ["tokenizer.bin: renaming", "injected rename error", "model.bin restored"])):
            base = os.path.join(scratch, "inject-" + mode)
            src = os.path.join(base, "in.gguf")
            outs = fresh_outputs(os.path.join(base, "out"))
            Model().write(src)
            expect_refusal(title, [sys.executable, "-c", INJECT, mode, exporter, src, *outs], want, base)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{n_pass} passed, {n_fail} failed")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
