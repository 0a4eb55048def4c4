#!/usr/bin/env python3
"""GGUF Llama file (llama.cpp's format) -> llama2.c checkpoint + tokenizer.bin for kvt.

    python3 weights/export_gguf.py model.gguf model.bin tokenizer.bin
    ./kvt -m model.bin -z tokenizer.bin --chat

Python's standard library only. GGUF (version 3) is one file: a header, typed
metadata key/values (the hyperparameters, the vocabulary), a table of tensor
infos (name, dims, type, offset), then the tensor data, aligned. The
tensors may be quantized; each one is dequantized to float32 block by block
and written before the next is read, so memory stays at one block batch, not
the model. Read: F32, F16, Q8_0, Q4_0 and Q4_1 (the formats are spelled out
above dequantize()); any other type is refused by its name (e.g. Q4_K).

The output is llama2.c's legacy checkpoint (weights/kvt_files.py): seven
int32, then float32 tensors in a fixed order (checkpoint_plan); when
llama.rope.freq_base is not 10000 the header carries the RoPE extension
("rope" + float32 theta). The vocabulary becomes tokenizer.bin: a byte-level
("gpt2") vocabulary with the BBPE trailer (pre-tokenizer, BOS, EOS, merges),
a SentencePiece ("llama") vocabulary in the legacy layout.

No permutation: llama.cpp's convert_hf_to_gguf.py (LlamaModel.modify_tensors)
applies `permute` to q_proj and k_proj,
    w.reshape(n_head, 2, HS // 2, D).swapaxes(1, 2).reshape(w.shape)
so within each head GGUF row 2i + j is Hugging Face row i + j * HS/2: the
rows of attn_q and attn_k are already in Meta's order, RoPE on adjacent pairs
(2i, 2i+1) (llama.cpp's LLAMA_ROPE_TYPE_NORM), which is what kvt computes.
export_hf.py undoes exactly this permutation (unpermute_rows); here the rows
are copied as they are. ggml lists dims fastest first: ne[0] is the row
length, so a GGUF tensor of dims [D, HD] is PyTorch's (HD, D), row-major.

Refused, with one line `export_gguf.py: FILE: what` naming the key or tensor,
exit 1 (never a traceback): what is not a well-formed GGUF v3 file (bad magic,
another version, a truncated header, an unknown value type, a bad alignment,
tensor data past the end of the file or overlapping), an architecture other
than llama, what the format cannot say (RoPE scaling, rope_freqs, a norm eps
other than 1e-5, a head size other than embedding_length / head_count,
partial rotary, experts, biases or any other tensor), what kvt would refuse
(its limits, as in export_hf.py), a missing tensor or one of the wrong
shape, and outputs that cannot be replaced safely (an output that is the
input, the two outputs one file, a link, a directory, a missing folder).
All or nothing, as export_hf.py: everything is read and checked first, both
outputs go to temporary names and are renamed into place when both are
complete.
"""
import math
import os
import struct
import sys
import time
from array import array

sys.dont_write_bytecode = True  # importing kvt_files leaves no __pycache__ in weights/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvt_files as kf  # noqa: E402  (weights/kvt_files.py: formats, limits, outputs)
from kvt_files import Refused  # noqa: E402

# ---- GGUF: the container ---------------------------------------------------------

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32        # when general.alignment is absent
MAX_DIMS = 4                  # GGML_MAX_DIMS
MAX_NESTING = 8               # arrays of arrays: deeper than this is not a model file

# Value types: id -> (name, struct code, bytes). STRING and ARRAY are read apart.
VALUE_TYPES = {0: ("UINT8", "B", 1), 1: ("INT8", "b", 1), 2: ("UINT16", "H", 2), 3: ("INT16", "h", 2),
               4: ("UINT32", "I", 4), 5: ("INT32", "i", 4), 6: ("FLOAT32", "f", 4), 7: ("BOOL", "B", 1),
               8: ("STRING", None, 8), 9: ("ARRAY", None, 12), 10: ("UINT64", "Q", 8), 11: ("INT64", "q", 8),
               12: ("FLOAT64", "d", 8)}
INT_TYPES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64")
FLOAT_TYPES = ("FLOAT32", "FLOAT64")

# ggml's tensor types, by id (ggml.h), for messages; only READ is dequantized:
# type -> (values per block, bytes per block).
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
              10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
              17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
              24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
              35: "TQ2_0", 39: "MXFP4"}
READ = {"F32": (1, 4), "F16": (1, 2), "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20)}


def type_name(t):
    return GGML_TYPES.get(t, f"id {t} (unknown to this reader)")


class Cursor:
    """Sequential reads of the header through a window of the file: every
    length is checked against the file's size before anything is read, so a
    corrupt length is refused, not allocated."""

    def __init__(self, f, path, size):
        self.f, self.path, self.size = f, path, size
        self.buf, self.start, self.pos = b"", 0, 0

    def take(self, n, what):
        if n > self.size - self.pos:
            raise Refused(self.path, f"truncated: {what} needs {n} bytes at offset {self.pos}, the file has "
                          f"{self.size - self.pos} left")
        i = self.pos - self.start
        if i + n > len(self.buf):
            self.f.seek(self.pos)
            self.buf, self.start, i = self.f.read(max(n, 1 << 20)), self.pos, 0
            if len(self.buf) < n:
                raise Refused(self.path, "the file ended early (did it change during the export?)")
        self.pos += n
        return self.buf[i:i + n]

    def skip(self, n, what):
        """Move past n bytes without reading them (checked against the file's size)."""
        if n > self.size - self.pos:
            raise Refused(self.path, f"truncated: {what} needs {n} bytes at offset {self.pos}, the file has "
                          f"{self.size - self.pos} left")
        self.pos += n

    def u32(self, what):
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what):
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what):
        n = self.u64(f"the length of {what}")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Refused(self.path, f"{what} is not valid UTF-8") from None


class Value:
    """One metadata value: kind is the GGUF type name (ARRAY: "ARRAY[INT32]")."""

    def __init__(self, kind, value):
        self.kind, self.value = kind, value


# The only arrays the export uses; any other array is read past, not built as
# Python objects (a 60M-element BOOL array would take a gigabyte as a list).
NEEDED_ARRAYS = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                 "tokenizer.ggml.merges"}


def skip_array(c, etype, n, what, depth):
    """Read past an array's n elements of type etype, keeping nothing."""
    ename, ecode, esize = VALUE_TYPES[etype]
    if ename == "STRING":
        for i in range(n):
            c.skip(c.u64(f"the length of {what}[{i}]"), f"{what}[{i}]")
    elif ename == "ARRAY":
        if depth >= MAX_NESTING:
            raise Refused(c.path, f"{what}: arrays nested more than {MAX_NESTING} deep")
        for i in range(n):  # each element an array: read_value checks its header and, at depth > 0, skips it
            read_value(c, etype, f"{what}[{i}]", depth + 1)
    else:
        c.skip(n * esize, what)


def read_value(c, vtype, what, depth=0):
    """One metadata value. An array is built only for NEEDED_ARRAYS (at most
    KVT_LIMIT_VOCAB elements); any other array is skipped: Value(kind, None)."""
    if vtype not in VALUE_TYPES:
        raise Refused(c.path, f"{what}: unknown value type {vtype} (GGUF v3 has types 0..12)")
    name, code, size = VALUE_TYPES[vtype]
    if name == "STRING":
        return Value(name, c.string(what))
    if name == "ARRAY":
        etype = c.u32(f"the element type of {what}")
        n = c.u64(f"the length of {what}")
        if etype not in VALUE_TYPES:
            raise Refused(c.path, f"{what}: unknown element type {etype} (GGUF v3 has types 0..12)")
        ename, ecode, esize = VALUE_TYPES[etype]
        if n * esize > c.size - c.pos:  # each element takes at least esize bytes
            raise Refused(c.path, f"truncated: {what} holds {n} {ename} values, more than the {c.size - c.pos} "
                          "bytes left in the file")
        if depth > 0 or what not in NEEDED_ARRAYS:
            skip_array(c, etype, n, what, depth)
            return Value(f"ARRAY[{ename}]", None)
        if n > kf.LIMIT_VOCAB:
            raise Refused(c.path, f"{what} holds {n} values: more than kvt's KVT_LIMIT_VOCAB ({kf.LIMIT_VOCAB})")
        if ename == "STRING":
            return Value("ARRAY[STRING]", [c.string(f"{what}[{i}]") for i in range(n)])
        if ename == "ARRAY":
            if depth >= MAX_NESTING:
                raise Refused(c.path, f"{what}: arrays nested more than {MAX_NESTING} deep")
            return Value("ARRAY[ARRAY]", [read_value(c, etype, f"{what}[{i}]", depth + 1) for i in range(n)])
        values = struct.unpack(f"<{n}{ecode}", c.take(n * esize, what))
        if ename == "BOOL":
            bad = next((i for i, v in enumerate(values) if v > 1), None)
            if bad is not None:
                raise Refused(c.path, f"{what}[{bad}] = {values[bad]}: a BOOL is 0 or 1")
            values = [bool(v) for v in values]
        return Value(f"ARRAY[{ename}]", values)
    (v,) = struct.unpack("<" + code, c.take(size, what))
    if name == "BOOL":
        if v > 1:
            raise Refused(c.path, f"{what} = {v}: a BOOL is 0 or 1")
        v = bool(v)
    return Value(name, v)


class TensorInfo:
    def __init__(self, name, dims, ttype, offset):
        self.name = name
        self.dims = dims      # ggml order: dims[0] is the row length
        self.type = ttype     # ggml type id
        self.offset = offset  # from the start of the data section
        self.start = None     # absolute file offset, set once the data section is known
        self.nbytes = None    # set for the types this reader reads

    def count(self):
        n = 1
        for d in self.dims:
            n *= d
        return n


class GGUF:
    """The header of a GGUF v3 file: metadata and tensor infos, checked
    against the file. The data is read later, one tensor at a time."""

    def __init__(self, path):
        self.path = path
        if not os.path.lexists(path):
            raise Refused(path, "no such file")
        if not os.path.isfile(path):
            raise Refused(path, "not a regular file")
        with open(path, "rb") as f:
            self.size = os.fstat(f.fileno()).st_size
            c = Cursor(f, path, self.size)
            magic = c.take(4, "the magic number") if self.size >= 4 else None
            if magic != GGUF_MAGIC:
                raise Refused(path, f"not a GGUF file: it starts with {magic!r}, not b'GGUF'" if magic else
                              f"not a GGUF file: {self.size} bytes, shorter than the magic number")
            version = c.u32("the version")
            if version != GGUF_VERSION:
                hint = " (a big-endian file?)" if version & 0xFFFF == 0 else ""
                raise Refused(path, f"GGUF version {version}{hint}: only version {GGUF_VERSION} is read")
            n_tensors = c.u64("the tensor count")
            n_kv = c.u64("the metadata count")
            if n_kv * 13 > self.size or n_tensors * 24 > self.size:  # a key/value, a tensor info: at least 13, 24 bytes
                raise Refused(path, f"truncated: {n_kv} metadata entries and {n_tensors} tensors cannot fit in "
                              f"{self.size} bytes")
            self.kv = {}
            for i in range(n_kv):
                key = c.string(f"metadata key {i}")
                if key in self.kv:
                    raise Refused(path, f"metadata key {key} appears twice")
                self.kv[key] = read_value(c, c.u32(f"the value type of {key}"), key)
            self.alignment = DEFAULT_ALIGNMENT
            if "general.alignment" in self.kv:
                a = self.kv["general.alignment"]
                if a.kind != "UINT32" or a.value == 0 or a.value & (a.value - 1):
                    raise Refused(path, f"general.alignment = {kf.show(a.value)} ({a.kind}): a UINT32 power of "
                                  "two is needed")
                self.alignment = a.value
            self.tensors = {}
            for i in range(n_tensors):
                name = c.string(f"the name of tensor {i}")
                if name in self.tensors:
                    raise Refused(path, f"tensor {name} appears twice")
                n_dims = c.u32(f"tensor {name}'s dims")
                if not 1 <= n_dims <= MAX_DIMS:
                    raise Refused(path, f"tensor {name}: {n_dims} dims (ggml has 1 to {MAX_DIMS})")
                dims = list(struct.unpack(f"<{n_dims}Q", c.take(8 * n_dims, f"tensor {name}'s dims")))
                ttype = c.u32(f"tensor {name}'s type")
                offset = c.u64(f"tensor {name}'s offset")
                if offset % self.alignment:
                    raise Refused(path, f"tensor {name}: offset {offset} is not a multiple of the alignment "
                                  f"{self.alignment} (general.alignment)")
                self.tensors[name] = TensorInfo(name, dims, ttype, offset)
            pad = -c.pos % self.alignment
            self.data_start = c.pos + pad
        for t in self.tensors.values():
            t.start = self.data_start + t.offset

    def place(self, t):
        """Size a tensor of a readable type and check it lies inside the file."""
        per_block, block_bytes = READ[type_name(t.type)]
        if t.dims[0] % per_block:
            raise Refused(self.path, f"tensor {t.name}: row length {t.dims[0]} is not a multiple of "
                          f"{type_name(t.type)}'s block of {per_block} values")
        t.nbytes = t.count() // per_block * block_bytes
        if t.start + t.nbytes > self.size:
            raise Refused(self.path, f"tensor {t.name}: its data ({t.nbytes} bytes at offset {t.start}) runs past "
                          f"the end of the file ({self.size} bytes)")

    # typed access to the metadata; every refusal names the key

    def get(self, key, kinds, what, required=True):
        v = self.kv.get(key)
        if v is None:
            if required:
                raise Refused(self.path, f"{key} is missing")
            return None
        if v.kind not in kinds:
            raise Refused(self.path, f"{key} is {v.kind}: {what} is needed")
        return v.value

    def integer(self, key, lo, hi, why, required=True):
        v = self.get(key, INT_TYPES, "an integer", required)
        if v is not None and not lo <= v <= hi:
            raise Refused(self.path, f"{key} = {v}: must be in [{lo}, {hi}] ({why})")
        return v

    def number(self, key, required=True):
        return self.get(key, FLOAT_TYPES + INT_TYPES, "a number", required)


# ---- dequantization ----------------------------------------------------------------
# The block formats (ggml-common.h), every scale an IEEE half (f16):
#   F32, F16   plain little-endian values.
#   Q8_0       34 bytes per 32 values: f16 d, then 32 int8 q;  x[j] = d * q[j].
#   Q4_0       18 bytes per 32 values: f16 d, then 16 bytes;   x[j] = d * (n[j] - 8).
#   Q4_1       20 bytes per 32 values: f16 d, f16 m, 16 bytes; x[j] = d * n[j] + m.
# In Q4_0 and Q4_1, byte k holds n[k] in its low nibble and n[k + 16] in its
# high nibble: elements 0..15 are the low nibbles, 16..31 the high ones.
#
# Exactness: d * n is exact in float32 (11 + 8 significant bits at most), so
# ggml's float32 result is d * n rounded once (Q4_1: + m, rounded once). Python
# computes in float64, where d * n + m is exact, and array('f') rounds it once
# to float32: the same bits as ggml's dequantize_row_*.
#
# Speed without numpy: bytes.translate splits nibbles for a whole batch of
# blocks at once, slice assignment regroups them, and each block then costs
# one 16-entry table (the block's 16 possible values) and one map over its 32
# nibbles in C. About 0.1-0.3 s per million values on a 2-core machine.

LOW = bytes(b & 15 for b in range(256))
HIGH = bytes(b >> 4 for b in range(256))
NIBBLES = range(16)
BATCH = 8192  # blocks per read: 262,144 values, about 1 MB of float32 at a time


def gather(raw, n, stride, off, width):
    """Bytes off..off+width of each of n records of stride bytes, packed."""
    out = bytearray(n * width)
    for k in range(width):
        out[k::width] = raw[off + k::stride]
    return out


def nibbles(qs, n):
    """16 bytes per block -> 32 values 0..15 per block, in element order."""
    lo, hi = qs.translate(LOW), qs.translate(HIGH)
    out = bytearray(32 * n)
    for k in range(16):
        out[k::32] = lo[k::16]
        out[16 + k::32] = hi[k::16]
    return out


def dequantize(kind, raw, n):
    """n blocks (n values for F32 / F16) of raw bytes -> array('f')."""
    out = array("f")
    if kind == "F32":
        out.frombytes(raw)
        if sys.byteorder != "little":
            out.byteswap()
        return out
    if kind == "F16":
        return array("f", struct.unpack(f"<{n}e", raw))
    if kind == "Q8_0":
        d = struct.unpack(f"<{n}e", gather(raw, n, 34, 0, 2))
        q = array("b", gather(raw, n, 34, 2, 32))  # int8, signed
        for b in range(n):
            out.extend(map(d[b].__mul__, q[32 * b:32 * b + 32]))
        return out
    if kind == "Q4_0":
        d = struct.unpack(f"<{n}e", gather(raw, n, 18, 0, 2))
        nib = nibbles(gather(raw, n, 18, 2, 16), n)
        for b in range(n):
            db = d[b]
            table = [db * (k - 8) for k in NIBBLES]
            out.extend(map(table.__getitem__, nib[32 * b:32 * b + 32]))
        return out
    if kind == "Q4_1":
        d = struct.unpack(f"<{n}e", gather(raw, n, 20, 0, 2))
        m = struct.unpack(f"<{n}e", gather(raw, n, 20, 2, 2))
        nib = nibbles(gather(raw, n, 20, 4, 16), n)
        for b in range(n):
            db, mb = d[b], m[b]
            table = [db * k + mb for k in NIBBLES]
            out.extend(map(table.__getitem__, nib[32 * b:32 * b + 32]))
        return out
    raise ValueError(kind)


def write_tensor(f, g, t):
    """Dequantize tensor t of file g, BATCH blocks at a time, into f."""
    kind = type_name(t.type)
    per_block, block_bytes = READ[kind]
    blocks = t.nbytes // block_bytes
    step = BATCH * (32 // per_block)  # F32 / F16: 32 times as many (single-value) blocks
    with open(g.path, "rb") as src:
        src.seek(t.start)
        for i in range(0, blocks, step):
            n = min(step, blocks - i)
            raw = src.read(n * block_bytes)
            if len(raw) != n * block_bytes:  # checked when the header was read: the file changed since
                raise Refused(g.path, f"tensor {t.name}: the file ended early (did it change during the export?)")
            out = dequantize(kind, raw, n)
            if sys.byteorder != "little":
                out.byteswap()
            f.write(out)


# ---- the model ----------------------------------------------------------------------

def read_config(g):
    """llama.* metadata -> the checkpoint header fields, checked like
    export_hf.py checks config.json."""
    arch = g.get("general.architecture", ("STRING",), "a string")
    if arch != "llama":
        raise Refused(g.path, f"general.architecture = {kf.show(arch)}: only llama is exported")
    D = g.integer("llama.embedding_length", 1, kf.LIMIT_DIM, "kvt's KVT_LIMIT_DIM")
    HD = g.integer("llama.feed_forward_length", 1, kf.LIMIT_HIDDEN, "kvt's 16 * KVT_LIMIT_DIM")
    L = g.integer("llama.block_count", 1, kf.LIMIT_LAYERS, "kvt's KVT_LIMIT_LAYERS")
    NH = g.integer("llama.attention.head_count", 1, kf.LIMIT_DIM, "kvt's KVT_LIMIT_DIM")
    NKV = g.integer("llama.attention.head_count_kv", 1, kf.LIMIT_DIM, "kvt's KVT_LIMIT_DIM", required=False)
    NKV = NH if NKV is None else NKV  # absent: no grouping, as in llama.cpp
    T = g.integer("llama.context_length", 1, kf.LIMIT_SEQ, "kvt's KVT_LIMIT_SEQ")
    if NH % NKV:
        raise Refused(g.path, f"llama.attention.head_count_kv = {NKV}: must divide llama.attention.head_count "
                      f"= {NH}")
    if D % NH or (D // NH) % 2:
        raise Refused(g.path, f"llama.embedding_length = {D}: embedding_length / head_count ({NH}) must be an "
                      "even head size")
    HS = D // NH
    if HS > kf.MAX_HS:
        raise Refused(g.path, f"llama.embedding_length = {D}: head size {HS} above kvt's KVT_MAX_HS ({kf.MAX_HS})")
    for key, why in (("llama.rope.dimension_count", "RoPE on part of each head is not implemented"),
                     ("llama.attention.key_length", "the format has head size embedding_length / head_count"),
                     ("llama.attention.value_length", "the format has head size embedding_length / head_count")):
        v = g.integer(key, 0, 1 << 32, "a head size", required=False)
        if v is not None and v != HS:
            raise Refused(g.path, f"{key} = {v}, not the head size {HS}: {why}")
    experts = g.integer("llama.expert_count", 0, 1 << 32, "a count", required=False)
    if experts:
        raise Refused(g.path, f"llama.expert_count = {experts}: mixture-of-experts models are not implemented")
    theta = g.number("llama.rope.freq_base", required=False)
    theta = kf.LEGACY_THETA if theta is None else theta  # llama.cpp's default
    why = kf.theta_problem(theta)
    if why:
        raise Refused(g.path, f"llama.rope.freq_base = {theta}: {why}")
    scaling = g.get("llama.rope.scaling.type", ("STRING",), "a string", required=False)
    if scaling not in (None, "none"):
        raise Refused(g.path, f"llama.rope.scaling.type = {kf.show(scaling)}: RoPE scaling is not implemented")
    for key in ("llama.rope.scale_linear", "llama.rope.scaling.factor"):
        factor = g.number(key, required=False)
        if factor not in (None, 0, 1) and scaling != "none":
            raise Refused(g.path, f"{key} = {factor}: RoPE scaling is not implemented")
    eps = g.number("llama.attention.layer_norm_rms_epsilon")
    if not kf.eps_ok(eps):
        raise Refused(g.path, f"llama.attention.layer_norm_rms_epsilon = {eps}: kvt's RMSNorm uses eps = 1e-5 "
                      "(KVT_RMS_EPS; llama2.c's format has no field for it)")
    return {"dim": D, "hidden_dim": HD, "n_layers": L, "n_heads": NH, "n_kv_heads": NKV, "seq_len": T,
            "head_size": HS, "theta": theta}


def checkpoint_plan(cfg, V, shared):
    """The checkpoint's tensors in file order: (GGUF name, ggml dims, row
    length first); None marks llama2.c's two RoPE tables."""
    D, HD, L, KVD = cfg["dim"], cfg["hidden_dim"], cfg["n_layers"], cfg["n_kv_heads"] * cfg["head_size"]
    plan = [("token_embd.weight", [D, V])]                 # token_embedding (V, D)
    for part, dims in (("attn_norm", [D]),                 # rms_att (L, D)
                       ("attn_q", [D, D]),                 # wq (L, D, D)
                       ("attn_k", [D, KVD]),               # wk (L, KVD, D)
                       ("attn_v", [D, KVD]),               # wv (L, KVD, D)
                       ("attn_output", [D, D]),            # wo (L, D, D)
                       ("ffn_norm", [D]),                  # rms_ffn (L, D)
                       ("ffn_gate", [D, HD]),              # w1 (L, HD, D)
                       ("ffn_down", [HD, D]),              # w2 (L, D, HD)
                       ("ffn_up", [D, HD])):               # w3 (L, HD, D)
        plan += [(f"blk.{i}.{part}.weight", dims) for i in range(L)]
    plan.append(("output_norm.weight", [D]))               # rms_final (D)
    plan.append(None)                                      # freq_cis_real, freq_cis_imag (T, HS/2): zeros
    if not shared:
        plan.append(("output.weight", [D, V]))             # wcls (V, D)
    return plan


def trimmed(dims):
    """Dims without trailing 1s (ggml pads every shape to 4 dims with 1s), so
    [64, 1] and [64] are one shape: both sides of a comparison are trimmed."""
    dims = list(dims)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return dims


def check_tensors(g, plan):
    """Every tensor in the file is one the plan uses, of a readable type and
    the right dims, inside the file; no two share a byte."""
    wanted = {item[0] for item in plan if item}
    for name in g.tensors:
        if name not in wanted:
            what = ("RoPE frequency factors (Llama 3.1-style RoPE scaling) are not implemented"
                    if name.startswith("rope_freqs") else "not a tensor of the model kvt runs (biases, experts, "
                    "and other extras are not part of the format)")
            raise Refused(g.path, f"tensor {name}: {what}")
    for item in plan:
        if item is None:
            continue
        name, dims = item
        t = g.tensors.get(name)
        if t is None:
            raise Refused(g.path, f"tensor {name} is missing")
        if trimmed(t.dims) != trimmed(dims):
            raise Refused(g.path, f"tensor {name} has dims {trimmed(t.dims)}, expected {trimmed(dims)} (ggml order: "
                          "the row length first; trailing 1s dropped)")
        if type_name(t.type) not in READ:
            raise Refused(g.path, f"tensor {name}: type {type_name(t.type)} is not read (only F32, F16, Q8_0, Q4_0 "
                          "and Q4_1 are)")
        g.place(t)
    placed = sorted((g.tensors[item[0]] for item in plan if item), key=lambda t: t.start)
    for a, b in zip(placed, placed[1:]):
        if b.start < a.start + a.nbytes:
            raise Refused(g.path, f"tensors {a.name} and {b.name} overlap: bytes [{a.start}, {a.start + a.nbytes}) "
                          f"and [{b.start}, {b.start + b.nbytes})")


def write_checkpoint(f, g, cfg, V, plan, shared):
    f.write(kf.checkpoint_header(cfg["dim"], cfg["hidden_dim"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"],
                                 V, cfg["seq_len"], shared, cfg["theta"]))
    for item in plan:
        if item is None:
            kf.write_zeros(f, 4 * cfg["seq_len"] * cfg["head_size"])
        else:
            write_tensor(f, g, g.tensors[item[0]])


# ---- the tokenizer ---------------------------------------------------------------------

# tokenizer.ggml.pre -> the trailer's pre-tokenizer. llama.cpp spells GPT-2's
# own "gpt-2" (llama-vocab.cpp); "gpt2" is the spec's name for the same regex.
PRE = {"smollm": "smollm", "gpt2": "gpt2", "gpt-2": "gpt2"}
CONTROL = 3  # tokenizer.ggml.token_type of a control token (<s>, </s>)


def token_id(g, key, V, required=True):
    i = g.integer(key, 0, V - 1, f"an id of the {V}-piece vocabulary", required)
    return i


def build_tokenizer(g):
    """tokenizer.ggml.* -> (tokenizer.bin bytes, V, a one-line summary)."""
    model = g.get("tokenizer.ggml.model", ("STRING",), "a string")
    tokens = g.get("tokenizer.ggml.tokens", ("ARRAY[STRING]",), "an array of strings")
    V = len(tokens)
    if not kf.MIN_VOCAB <= V <= kf.LIMIT_VOCAB:
        raise Refused(g.path, f"tokenizer.ggml.tokens holds {V} pieces: must be in [{kf.MIN_VOCAB}, "
                      f"{kf.LIMIT_VOCAB}] (kvt: ids 1 and 2 are BOS and EOS; KVT_LIMIT_VOCAB)")
    n = g.integer("llama.vocab_size", 0, 1 << 32, "a count", required=False)
    if n is not None and n != V:
        raise Refused(g.path, f"llama.vocab_size = {n}, but tokenizer.ggml.tokens holds {V} pieces")
    if model == "gpt2":
        return build_bbpe(g, tokens, V)
    if model == "llama":
        return build_sentencepiece(g, tokens, V)
    raise Refused(g.path, f"tokenizer.ggml.model = {kf.show(model)}: only gpt2 (byte-level BPE) and llama "
                  "(SentencePiece) vocabularies are exported")


def build_bbpe(g, tokens, V):
    """A byte-level (GPT-2 style) vocabulary: the pieces as they are, the BBPE
    trailer. BOS: llama.cpp prepends one for a gpt2 vocabulary only when
    tokenizer.ggml.add_bos_token says so (its default is false for the gpt-2
    and smollm pre-tokenizers: llama-vocab.cpp sets add_bos only for llama3,
    tekken and chameleon), so absent or false means bos -1."""
    pre = g.get("tokenizer.ggml.pre", ("STRING",), "a string", required=False)
    if pre not in PRE:
        raise Refused(g.path, f"tokenizer.ggml.pre = {kf.show(pre)}: kvt's byte-level encoder splits text as "
                      "\"gpt2\" (GPT-2's regex) or \"smollm\" (each digit alone, then GPT-2's regex)"
                      if pre is not None else "tokenizer.ggml.pre is missing: kvt needs to know how the text is "
                      "split (gpt2 or smollm)")
    merges = g.get("tokenizer.ggml.merges", ("ARRAY[STRING]",), "an array of strings")
    pairs = []
    for r, m in enumerate(merges):
        parts = m.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise Refused(g.path, f"tokenizer.ggml.merges[{r}] = {kf.show(m)}: \"left right\" with one space is "
                          "needed")
        pairs.append(parts)
    add_bos = g.get("tokenizer.ggml.add_bos_token", ("BOOL",), "true or false", required=False)
    bos = token_id(g, "tokenizer.ggml.bos_token_id", V) if add_bos else -1
    eos = token_id(g, "tokenizer.ggml.eos_token_id", V)
    blob = kf.bbpe_tokenizer(g.path, tokens, PRE[pre], bos, eos, pairs, lambda r: f"tokenizer.ggml.merges[{r}]")
    return blob, V, f"byte-level BPE ({PRE[pre]}), {len(pairs)} merges, bos {bos}, eos {eos}"


def build_sentencepiece(g, tokens, V):
    """A SentencePiece vocabulary (Llama 2, TinyLlama) in the legacy layout,
    as llama2.c's own tokenizer.bin: the SentencePiece scores, U+2581 as a
    space, BOS 1 and EOS 2, the byte pieces at ids 3..258. Control tokens
    score -1e30, so no merge ever makes one from text (as export_hf.py)."""
    scores = g.get("tokenizer.ggml.scores", ("ARRAY[FLOAT32]",), "an array of FLOAT32")
    types = g.get("tokenizer.ggml.token_type", ("ARRAY[INT32]",), "an array of INT32", required=False)
    for key, arr in (("tokenizer.ggml.scores", scores), ("tokenizer.ggml.token_type", types)):
        if arr is not None and len(arr) != V:
            raise Refused(g.path, f"{key} holds {len(arr)} values for {V} pieces")
    if V < 259 or tokens[1:3] != ["<s>", "</s>"] or any(tokens[3 + b] != f"<0x{b:02X}>" for b in range(256)):
        raise Refused(g.path, "tokenizer.ggml.tokens: kvt's legacy vocabulary needs <s> and </s> at ids 1 and 2 "
                      "and the byte pieces <0x00>..<0xFF> at ids 3..258 (as Llama 2)")
    for key, want in (("tokenizer.ggml.bos_token_id", 1), ("tokenizer.ggml.eos_token_id", 2)):
        i = token_id(g, key, V, required=False)
        if i not in (None, want):
            raise Refused(g.path, f"{key} = {i}: the legacy vocabulary has {want}")
    for key in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix"):
        if g.get(key, ("BOOL",), "true or false", required=False) is False:
            raise Refused(g.path, f"{key} is false: kvt's legacy encoder always adds BOS and a leading space "
                          "(as SentencePiece)")
    raws, out_scores = [], []
    for i, piece in enumerate(tokens):
        control = types is not None and types[i] == CONTROL
        if not (3 <= i < 259) and not control:
            piece = piece.replace("\u2581", " ")
        raws.append(kf.piece_bytes(g.path, i, piece))
        s = scores[i]
        if not math.isfinite(s):
            raise Refused(g.path, f"tokenizer.ggml.scores[{i}] = {s}: kvt's tokenizer loader needs finite scores")
        out_scores.append(-1e30 if control else s)
    return kf.legacy_tokenizer(g.path, raws, out_scores), V, "SentencePiece (legacy layout, bos 1, eos 2)"


# ---- export ----------------------------------------------------------------------------

def export(src, model_out, tok_out):
    for path in (model_out, tok_out):
        kf.check_output(path)
        if kf.is_input(path, [src]):
            raise Refused(path, f"is the input file {src}: write the outputs elsewhere")
    kf.check_two_outputs(model_out, tok_out)

    # Read and check everything before writing anything.
    g = GGUF(src)
    cfg = read_config(g)
    tok_bytes, V, tok_summary = build_tokenizer(g)
    shared = "output.weight" not in g.tensors  # absent: the classifier is the embedding table
    plan = checkpoint_plan(cfg, V, shared)
    check_tensors(g, plan)
    kf.write_outputs(model_out, tok_out, tok_bytes, lambda f: write_checkpoint(f, g, cfg, V, plan, shared))
    return cfg, V, shared, tok_summary


def main(argv):
    if len(argv) != 4:
        print(__doc__.split("\n\n")[0] + "\n\nusage: export_gguf.py MODEL.gguf model.bin tokenizer.bin",
              file=sys.stderr)
        return 2
    src, model_out, tok_out = argv[1:]
    t0 = time.time()
    kf.stop_on_signals()
    try:
        cfg, V, shared, tok_summary = export(src, model_out, tok_out)
    except Exception as e:  # one line, never a traceback (kvt_files.refusal)
        message = kf.refusal(e, src)
    else:
        theta = cfg["theta"]
        rope = "10000 (legacy header)" if kf.float32(theta) == kf.LEGACY_THETA else f"{theta:g} (rope extension)"
        print(f"export_gguf.py: {model_out}: dim {cfg['dim']}, layers {cfg['n_layers']}, heads {cfg['n_heads']} "
              f"(kv {cfg['n_kv_heads']}), vocab {V}, seq_len {cfg['seq_len']}, rope theta {rope}, classifier "
              f"{'tied to the embeddings' if shared else 'separate'}; {tok_out}: {tok_summary}; "
              f"{time.time() - t0:.1f} s", file=sys.stderr)
        return 0
    print("export_gguf.py: " + kf.printable(message), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
