#!/usr/bin/env python3
"""Hugging Face Llama directory -> llama2.c checkpoint + tokenizer.bin for kvt.

    python3 weights/export_hf.py DIR model.bin tokenizer.bin
    ./kvt -m model.bin -z tokenizer.bin -i "Once upon a time"

DIR holds config.json, the weights (model.safetensors, or the shards listed in
model.safetensors.index.json) and tokenizer.json. Python's standard library
only: safetensors is an 8-byte header length, a JSON header (name -> dtype,
shape, byte offsets) and raw little-endian tensors, so each tensor is read,
converted to float32 (from bf16, fp16 or fp32) and written before the next one
is read. Memory stays at about the largest tensor (the embedding table), not
the model.

The output is llama2.c's legacy (version 0) format, the one kvt reads: seven
int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
vocab_size negative when the classifier is not the embedding table), then the
float32 tensors in a fixed order (see checkpoint_plan).

What the format cannot say, the exporter refuses, naming the config field:
a rope_theta other than 10000, rope_scaling, biases, a norm eps other than
1e-5, an activation other than SiLU, a head_dim other than
hidden_size / num_attention_heads, and tokenizers that are not SentencePiece-
style BPE with byte fallback (Llama 3's and GPT-2's byte-level vocabularies).
It also refuses what kvt's loaders would refuse (the limits below) and input
that is malformed or contradicts itself (bad JSON, wrong types, a safetensors
header that does not fit its file, overlapping tensors, a missing shard or
classifier). Every refusal is one line, `export_hf.py: FILE: what`, exit 1.

All or nothing: every file is read and every tensor checked before anything
is written; both outputs are written to temporary names next to them and
renamed into place only when both are complete. A failed export leaves no
temporary file and does not touch an existing model.bin / tokenizer.bin.

The one step that is easy to get wrong: Hugging Face stores the rows of wq and
wk permuted. RoPE rotates pairs of channels. Meta's checkpoints (and
llama2.c, and kvt) pair adjacent channels (0, 1), (2, 3), ...; Hugging Face's
rotate_half pairs channel i with channel i + HS/2 within each head, and its
conversion script reorders the rows of wq and wk so both give the same
result. Here that reordering is undone: within each head, output row 2i comes
from HF row i and row 2i + 1 from HF row i + HS/2. (wv and wo are not
rotated and are copied as they are.)
"""
import json
import os
import stat
import struct
import sys

# ---- kvt's limits -------------------------------------------------------------
# The same numbers as kvt's C source, so that whatever is exported also loads.
# kvt_config_check (kvtransformer.cu §4) checks every checkpoint header field:
LIMIT_DIM = 65536          # KVT_LIMIT_DIM: dim, n_heads, n_kv_heads in [1, this]
LIMIT_HIDDEN = 16 * 65536  # 16L * KVT_LIMIT_DIM: hidden_dim
LIMIT_LAYERS = 1024        # KVT_LIMIT_LAYERS: n_layers
LIMIT_VOCAB = 1 << 22      # KVT_LIMIT_VOCAB: |vocab_size|
LIMIT_SEQ = 1 << 20        # KVT_LIMIT_SEQ: seq_len
MAX_HS = 256               # KVT_MAX_HS (kvtransformer.cu §2): head size dim / n_heads, which must also be even
# kvt_tokenizer_load (cli/tokenizer.c) takes max_token_length in [1, 1024], so
# no piece may be longer than 1024 bytes, and refuses a piece holding a NUL
# byte (its pieces are C strings).
MAX_PIECE_BYTES = 1024
# Not a kvt limit but this exporter's: the 256 byte pieces sit at ids 3..258,
# so a byte-fallback vocabulary has at least 259 pieces.
MIN_VOCAB = 259
HEADER_LIMIT = 100 << 20   # a safetensors JSON header larger than this is not one


class Refused(Exception):
    """One line for the user: the file it is about, then what is wrong."""

    def __init__(self, path, what):
        super().__init__(f"{path}: {what}")


# ---- JSON ---------------------------------------------------------------------

def kind(value):
    """JSON's name for a parsed value's type (for messages)."""
    if value is None:
        return "null"
    for t, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                    (list, "array"), (dict, "object")):
        if isinstance(value, t):
            return name
    return type(value).__name__


def show(value):
    """A value as JSON, cut short: a message stays one readable line."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)  # JSON's true is not the integer 1


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _unique_keys(pairs):
    """json's object_pairs_hook: a key given twice contradicts itself (json
    would keep the last one silently)."""
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {show(key)} appears twice in one object")
        obj[key] = value
    return obj


def parse_json(path, raw):
    """bytes -> a JSON object (dict), or Refused naming path."""
    try:
        value = json.loads(raw, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise Refused(path, "not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits, a twice-given key
        raise Refused(path, f"not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise Refused(path, f"the file holds a JSON {kind(value)}, not an object")
    return value


def load_json(path, why="missing"):
    if not os.path.lexists(path):
        raise Refused(path, why)
    if not os.path.isfile(path):
        raise Refused(path, "not a regular file")
    with open(path, "rb") as f:
        return parse_json(path, f.read())


# ---- safetensors --------------------------------------------------------------

# Bytes per value of every dtype the safetensors format defines: sizes are
# checked for all tensors (a header that lies is caught even in a tensor that
# is not exported); only the first three are read.
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
READ_DTYPES = ("F32", "F16", "BF16")


def plain_name(name):
    """A shard named in the index must be a file in DIR itself: no directory
    part, nothing that climbs out of DIR."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name)


class Tensor:
    def __init__(self, path, name, dtype, shape, start, nbytes):
        self.path = path      # the shard file
        self.name = name
        self.dtype = dtype
        self.shape = shape    # tuple of ints
        self.start = start    # absolute offset of the first byte in the file
        self.nbytes = nbytes


def read_header(path):
    """The tensors of one .safetensors file, every entry checked against the
    file: its dtype, shape and data_offsets agree with each other, lie inside
    the file, and no two tensors share a byte."""
    if not os.path.lexists(path):
        raise Refused(path, "missing (model.safetensors.index.json's weight_map names it)")
    if not os.path.isfile(path):
        raise Refused(path, "not a regular file")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(8)
        if len(raw) != 8:
            raise Refused(path, f"{size} bytes: shorter than a safetensors header length (8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            raise Refused(path, f"header length {n} bytes, but the file has {size - 8} bytes after it")
        if n > HEADER_LIMIT:
            raise Refused(path, f"header length {n} bytes: not a safetensors file?")
        header = parse_json(path, f.read(n))
    data_bytes = size - 8 - n  # the data area: data_offsets count from its start
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        what = f"tensor {name}"
        if not isinstance(entry, dict):
            raise Refused(path, f"{what}: its header entry is a JSON {kind(entry)}, not an object")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in entry:
                raise Refused(path, f"{what}: no {key} in its header entry")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str):
            raise Refused(path, f"{what}: dtype = {show(dtype)}: a string is needed")
        if not (isinstance(shape, list) and all(is_int(d) and d >= 0 for d in shape)):
            raise Refused(path, f"{what}: shape = {show(shape)}: a list of non-negative integers is needed")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) for o in offsets)):
            raise Refused(path, f"{what}: data_offsets = {show(offsets)}: two integers [begin, end] are needed")
        begin, end = offsets
        if not 0 <= begin <= end <= data_bytes:
            raise Refused(path, f"{what}: data_offsets [{begin}, {end}] do not fit in the file's "
                          f"{data_bytes} data bytes")
        count = 1
        for d in shape:
            count *= d
        if dtype in DTYPE_BYTES and count * DTYPE_BYTES[dtype] != end - begin:
            raise Refused(path, f"{what}: data_offsets [{begin}, {end}] hold {end - begin} bytes, its shape "
                          f"{shape} of {dtype} needs {count * DTYPE_BYTES[dtype]}")
        tensors.append(Tensor(path, name, dtype, tuple(shape), 8 + n + begin, end - begin))
    # No two tensors may share a byte: sorted by start, each begins at or
    # after the end of the one before (empty tensors hold no bytes).
    placed = sorted((t for t in tensors if t.nbytes), key=lambda t: t.start)
    for a, b in zip(placed, placed[1:]):
        if b.start < a.start + a.nbytes:
            raise Refused(path, f"tensors {a.name} and {b.name} overlap: data_offsets "
                          f"[{a.start - 8 - n}, {a.start - 8 - n + a.nbytes}] and "
                          f"[{b.start - 8 - n}, {b.start - 8 - n + b.nbytes}]")
    return tensors


class SafeTensors:
    """The tensors of one or more .safetensors files: every header is read
    and checked when this is made; the data is read one tensor at a time."""

    def __init__(self, directory):
        index = os.path.join(directory, "model.safetensors.index.json")
        single = os.path.join(directory, "model.safetensors")
        weight_map = None
        if os.path.lexists(index):
            self.source = index  # the file that says where each tensor is
            weight_map = load_json(index).get("weight_map")
            if weight_map is None:
                raise Refused(index, "weight_map is missing")
            if not isinstance(weight_map, dict):
                raise Refused(index, f"weight_map is a JSON {kind(weight_map)}: an object (tensor -> shard file "
                              "name) is needed")
            for name, shard in weight_map.items():
                if not plain_name(shard):
                    raise Refused(index, f"weight_map[{show(name)}] = {show(shard)}: a shard must be a plain "
                                  "file name in the model's folder")
            files = sorted(set(weight_map.values()))
        elif os.path.lexists(single):
            self.source = single
            files = ["model.safetensors"]
        else:
            raise Refused(directory, "no model.safetensors or model.safetensors.index.json "
                          "(pytorch_model.bin is not read: convert it to safetensors first)")
        self.files = [os.path.join(directory, name) for name in files]
        self.where = {}  # name -> Tensor
        for path in self.files:
            for t in read_header(path):
                if t.name in self.where:
                    raise Refused(path, f"tensor {t.name} is also in {self.where[t.name].path}")
                self.where[t.name] = t
        for name, shard in (weight_map or {}).items():
            t = self.where.get(name)
            if t is None or os.path.basename(t.path) != shard:
                raise Refused(index, f"weight_map puts tensor {name} in {shard}, which does not hold it")

    def has(self, name):
        return name in self.where

    def check(self, name, want_shape):
        """The tensor, after checking that it exists and has the shape and a
        dtype that can be read."""
        t = self.where.get(name)
        if t is None:
            raise Refused(self.source, f"tensor {name} is missing")
        if t.shape != tuple(want_shape):
            raise Refused(t.path, f"tensor {name} has shape {list(t.shape)}, expected {list(want_shape)}")
        if t.dtype not in READ_DTYPES:
            raise Refused(t.path, f"tensor {name}: dtype {t.dtype} (only F32, F16 and BF16 are read)")
        return t

    def read_f32(self, name, want_shape):
        """The tensor as float32 little-endian bytes."""
        t = self.check(name, want_shape)
        try:
            with open(t.path, "rb") as f:
                f.seek(t.start)
                raw = f.read(t.nbytes)
        except OSError as e:
            raise Refused(t.path, f"tensor {name}: {e.strerror or e}") from None
        if len(raw) != t.nbytes:  # checked when the header was read: the file changed since
            raise Refused(t.path, f"tensor {name}: the file ended early (did it change during the export?)")
        count = t.nbytes // DTYPE_BYTES[t.dtype]
        if t.dtype == "F32":
            return raw
        out = bytearray(4 * count)
        if t.dtype == "BF16":  # bf16 is the top half of a float32: append two zero bytes (little-endian: before)
            out[2::4] = raw[0::2]
            out[3::4] = raw[1::2]
            return bytes(out)
        step = 1 << 20  # F16: through struct's half-float format, a million at a time
        for i in range(0, count, step):
            k = min(step, count - i)
            vals = struct.unpack_from(f"<{k}e", raw, 2 * i)
            struct.pack_into(f"<{k}f", out, 4 * i, *vals)
        return bytes(out)


def unpermute_rows(data, n_heads, head_size, cols):
    """Hugging Face's rotate_half row order -> adjacent pairs, head by head."""
    row = 4 * cols
    half = head_size // 2
    out = bytearray(len(data))
    for h in range(n_heads):
        base = h * head_size
        for i in range(half):
            for j in range(2):  # output row 2i + j <- HF row i + j * HS/2
                src = (base + i + j * half) * row
                dst = (base + 2 * i + j) * row
                out[dst:dst + row] = data[src:src + row]
    return bytes(out)


# ---- config -----------------------------------------------------------------

def read_config(directory):
    path = os.path.join(directory, "config.json")
    c = load_json(path)

    def need(field, ok, what):
        if not ok:
            raise Refused(path, f"{field} = {show(c.get(field))}: {what}")

    def integer(field, lo, hi, why):
        """A required integer field in [lo, hi]; why says where the bounds come from."""
        if field not in c:
            raise Refused(path, f"{field} is missing")
        need(field, is_int(c[field]), "an integer is needed")
        need(field, lo <= c[field] <= hi, f"must be in [{lo}, {hi}] ({why})")
        return c[field]

    def flag(field):
        """An optional boolean; absent and null read as false, as in transformers."""
        need(field, c.get(field) is None or isinstance(c[field], bool), "true or false is needed")
        return bool(c.get(field))

    need("model_type", c.get("model_type", "llama") == "llama", "only the Llama architecture is exported")
    arch = c.get("architectures")
    need("architectures", arch in (None, [], ["LlamaForCausalLM"]), "only LlamaForCausalLM is exported")
    D = integer("hidden_size", 1, LIMIT_DIM, "kvt's KVT_LIMIT_DIM")
    HD = integer("intermediate_size", 1, LIMIT_HIDDEN, "kvt's 16 * KVT_LIMIT_DIM")
    L = integer("num_hidden_layers", 1, LIMIT_LAYERS, "kvt's KVT_LIMIT_LAYERS")
    NH = integer("num_attention_heads", 1, LIMIT_DIM, "kvt's KVT_LIMIT_DIM")
    V = integer("vocab_size", MIN_VOCAB, LIMIT_VOCAB, "kvt's KVT_LIMIT_VOCAB; at least 259 for the byte pieces at "
                "ids 3..258")
    T = integer("max_position_embeddings", 1, LIMIT_SEQ, "kvt's KVT_LIMIT_SEQ")
    if c.get("num_key_value_heads") is None:  # absent: no grouping, as in transformers
        NKV = NH
    else:
        NKV = integer("num_key_value_heads", 1, LIMIT_DIM, "kvt's KVT_LIMIT_DIM")
    need("num_key_value_heads", NH % NKV == 0, "must divide num_attention_heads")
    need("hidden_size", D % NH == 0 and (D // NH) % 2 == 0,
         "hidden_size / num_attention_heads must be an even head size")
    HS = D // NH
    need("hidden_size", HS <= MAX_HS, f"head size hidden_size / num_attention_heads = {HS}: kvt's attention "
         f"holds at most {MAX_HS} (KVT_MAX_HS)")
    need("head_dim", c.get("head_dim") is None or (is_int(c["head_dim"]) and c["head_dim"] == HS),
         f"the format has head size hidden_size / heads = {HS}")
    rope = c.get("rope_parameters")  # transformers 5 keeps rope_theta and the scaling type in here
    need("rope_parameters", rope is None or isinstance(rope, dict), "an object is needed")
    rope = rope or {}
    for field, value in (("rope_theta", c.get("rope_theta")), ("rope_parameters.rope_theta", rope.get("rope_theta"))):
        if value is not None and not (is_number(value) and float(value) == 10000.0):
            raise Refused(path, f"{field} = {show(value)}: kvt's RoPE uses theta = 10000 (llama2.c's format has "
                          "no field for it)")
    need("rope_scaling", c.get("rope_scaling") is None, "RoPE scaling is not implemented")
    if rope.get("rope_type", "default") != "default":
        raise Refused(path, f"rope_parameters.rope_type = {show(rope['rope_type'])}: RoPE scaling is not "
                      "implemented")
    eps = c.get("rms_norm_eps", 1e-5)
    need("rms_norm_eps", is_number(eps) and abs(float(eps) - 1e-5) < 1e-12,
         "kvt's RMSNorm uses eps = 1e-5 (llama2.c's format has no field for it)")
    need("hidden_act", c.get("hidden_act", "silu") == "silu", "the FFN is SwiGLU with SiLU")
    need("attention_bias", not flag("attention_bias"), "attention projections have no bias here")
    need("mlp_bias", not flag("mlp_bias"), "FFN projections have no bias here")
    return {"path": path, "dim": D, "hidden_dim": HD, "n_layers": L, "n_heads": NH, "n_kv_heads": NKV,
            "vocab_size": V, "seq_len": T, "head_size": HS, "tied": flag("tie_word_embeddings")}


# ---- checkpoint ---------------------------------------------------------------

def checkpoint_plan(cfg, shared):
    """The checkpoint's tensors in file order: (HF name, shape, heads to
    unpermute or 0); None marks llama2.c's two RoPE tables."""
    D, HD, L = cfg["dim"], cfg["hidden_dim"], cfg["n_layers"]
    NH, NKV, HS, V = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_size"], cfg["vocab_size"]
    KVD = NKV * HS
    layer = "model.layers.{}."
    plan = [("model.embed_tokens.weight", (V, D), 0)]
    for part, shape, heads in (("input_layernorm.weight", (D,), 0),
                               ("self_attn.q_proj.weight", (D, D), NH),
                               ("self_attn.k_proj.weight", (KVD, D), NKV),
                               ("self_attn.v_proj.weight", (KVD, D), 0),
                               ("self_attn.o_proj.weight", (D, D), 0),
                               ("post_attention_layernorm.weight", (D,), 0),
                               ("mlp.gate_proj.weight", (HD, D), 0),   # w1
                               ("mlp.down_proj.weight", (D, HD), 0),   # w2
                               ("mlp.up_proj.weight", (HD, D), 0)):    # w3
        plan += [(layer.format(i) + part, shape, heads) for i in range(L)]
    plan.append(("model.norm.weight", (D,), 0))
    plan.append(None)  # llama2.c's two RoPE tables (seq_len x HS/2 each): unused, zeros
    if not shared:
        plan.append(("lm_head.weight", (V, D), 0))
    return plan


def write_checkpoint(f, st, cfg, plan, shared):
    V = cfg["vocab_size"]
    f.write(struct.pack("<7i", cfg["dim"], cfg["hidden_dim"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"],
                        V if shared else -V, cfg["seq_len"]))
    for item in plan:
        if item is None:
            zeros = 4 * cfg["seq_len"] * cfg["head_size"]
            while zeros:  # in pieces: at kvt's limits the tables are a gigabyte
                k = min(zeros, 16 << 20)
                f.write(bytes(k))
                zeros -= k
            continue
        name, shape, heads = item
        data = st.read_f32(name, shape)
        if heads:
            data = unpermute_rows(data, heads, cfg["head_size"], shape[1])
        f.write(data)


# ---- tokenizer ------------------------------------------------------------------

def build_tokenizer(directory, V):
    """tokenizer.json (SentencePiece-style BPE, byte fallback) -> the bytes of
    llama2.c's tokenizer.bin: int32 max_token_length, then per id: float32
    score, int32 length, the piece's bytes. SentencePiece's word marker U+2581
    becomes a space (kvt's encoder adds the leading space itself, as
    SentencePiece does). The score orders the merges: a piece made by merge
    number r (0 = first) scores -r, so kvt's "highest score first" merges in
    tokenizer.json's order; pieces no merge makes never merge (score -1e30),
    nor do special tokens."""
    path = os.path.join(directory, "tokenizer.json")
    tj = load_json(path, "missing (only tokenizer.json is read, not tokenizer.model)")
    model = tj.get("model")
    if not isinstance(model, dict):
        raise Refused(path, "model is missing" if model is None else f"model is a JSON {kind(model)}, not an object")
    if model.get("type") != "BPE":
        raise Refused(path, f"model.type = {show(model.get('type'))}: only BPE is exported")
    if model.get("byte_fallback") is not True:
        raise Refused(path, "model.byte_fallback is not true: a byte-level (GPT-2 / Llama 3 style) "
                      "vocabulary, which kvt's SentencePiece-style encoder cannot reproduce")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise Refused(path, "model.vocab is missing" if vocab is None else
                      f"model.vocab is a JSON {kind(vocab)}: an object (piece -> id) is needed")
    vocab = dict(vocab)
    for piece, i in vocab.items():
        if not (is_int(i) and i >= 0):
            raise Refused(path, f"model.vocab[{show(piece)}] = {show(i)}: an id must be a non-negative integer")
    added = tj.get("added_tokens") or []
    if not isinstance(added, list):
        raise Refused(path, f"added_tokens is a JSON {kind(added)}: a list is needed")
    special = set()
    for k, t in enumerate(added):
        if not (isinstance(t, dict) and isinstance(t.get("content"), str) and is_int(t.get("id"))
                and t["id"] >= 0):
            raise Refused(path, f"added_tokens[{k}] = {show(t)}: an object with a string content and a "
                          "non-negative integer id is needed")
        if vocab.setdefault(t["content"], t["id"]) != t["id"]:
            raise Refused(path, f"added_tokens[{k}]: {show(t['content'])} has id {t['id']}, model.vocab gives it "
                          f"{vocab[t['content']]}")
        if t.get("special"):
            special.add(t["content"])
    pieces = [None] * V
    for piece, i in vocab.items():
        if i >= V:
            raise Refused(path, f"piece {show(piece)} has id {i}, but config.json's vocab_size is {V}")
        if pieces[i] is not None:
            raise Refused(path, f"model.vocab: {show(pieces[i])} and {show(piece)} both have id {i}")
        pieces[i] = piece
    for i in range(V):
        if pieces[i] is None:  # a hole (vocab_size padded past the tokenizer): a piece that never matches text
            pieces[i] = f"<unused{i}>"
    for b in range(256):
        if pieces[3 + b] != f"<0x{b:02X}>":
            raise Refused(path, f"id {3 + b} is {show(pieces[3 + b])}, not <0x{b:02X}>: kvt expects "
                          "the 256 byte pieces at ids 3..258 (as in Llama 2 and TinyLlama)")
    if (pieces[1], pieces[2]) != ("<s>", "</s>"):
        raise Refused(path, f"ids 1 and 2 are {show(pieces[1])} and {show(pieces[2])}: kvt uses 1 = <s> (BOS) "
                      "and 2 = </s> (EOS)")
    merges = model.get("merges") or []
    if not isinstance(merges, list):
        raise Refused(path, f"model.merges is a JSON {kind(merges)}: a list is needed")
    score = [-1e30] * V
    for r, m in enumerate(merges):
        if isinstance(m, str) and " " in m:
            a, b = m.split(" ", 1)
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m):
            a, b = m
        else:
            raise Refused(path, f"model.merges[{r}] = {show(m)}: \"a b\" or [\"a\", \"b\"] is needed")
        i = vocab.get(a + b)
        if i is not None and pieces[i] not in special and score[i] == -1e30:
            score[i] = -float(r)
    out = []
    for i in range(V):
        text = pieces[i]
        if not (text.startswith("<0x") and len(text) == 6) and text not in special:
            text = text.replace("\u2581", " ")
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:
            raise Refused(path, f"piece id {i} ({show(pieces[i])}) is not valid Unicode (a lone surrogate)") from None
        if len(raw) > MAX_PIECE_BYTES:
            raise Refused(path, f"piece id {i} ({show(pieces[i])}) is {len(raw)} bytes: kvt's tokenizer loader "
                          f"takes at most {MAX_PIECE_BYTES} (cli/tokenizer.c)")
        if b"\0" in raw:
            raise Refused(path, f"piece id {i} ({show(pieces[i])}) contains a NUL character, which kvt's "
                          "tokenizer loader refuses (cli/tokenizer.c)")
        out.append(raw)
    blob = [struct.pack("<i", max(len(b) for b in out))]
    for i in range(V):
        blob.append(struct.pack("<fi", score[i], len(out[i])))
        blob.append(out[i])
    return b"".join(blob)


# ---- outputs ------------------------------------------------------------------

def real_output(path):
    """Where path would be written: its directory resolved, its own name kept
    (the output itself must not be a link, see check_output)."""
    return os.path.join(os.path.realpath(os.path.dirname(path) or "."), os.path.basename(path))


def check_output(path, directory):
    """An output must be a new name or a regular file, in a directory that
    exists and is not the model's folder: it is replaced by a rename, and a
    rename over a link, a device or a directory, or over one of the inputs,
    would not do what the user meant."""
    folder = os.path.dirname(path) or "."
    if not os.path.basename(path):
        raise Refused(path, "names a directory, not a file")
    if not os.path.isdir(folder):
        raise Refused(path, f"its directory {folder} does not exist")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if stat.S_ISLNK(mode):
            raise Refused(path, "is a symbolic link: give the path of a regular file (it would be replaced, "
                          "not written through)")
        if stat.S_ISDIR(mode):
            raise Refused(path, "is a directory: give a file name")
        if not stat.S_ISREG(mode):
            raise Refused(path, "is a device, pipe or socket, not a regular file: the output is written to a "
                          "temporary file and renamed, which needs a regular file")
    inside = os.path.realpath(directory)
    if os.path.commonpath([real_output(path), inside]) == inside:
        raise Refused(path, f"is inside the model's folder {directory}: write the outputs elsewhere (an input "
                      "could be overwritten)")


def create_temp(final):
    """A new, unique file next to final (same directory, so the rename that
    puts it in place is atomic), created with the usual permissions."""
    folder = os.path.dirname(final) or "."
    for _ in range(100):
        tmp = os.path.join(folder, f".{os.path.basename(final)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as e:
            raise Refused(final, f"cannot create a temporary file in {folder}: {e.strerror}") from None
        return tmp, os.fdopen(fd, "wb")
    raise Refused(final, f"cannot find an unused temporary name in {folder}")


def replace_both(model_tmp, model_out, tok_tmp, tok_out):
    """Rename both temporaries into place. Two renames are not one atomic
    step: if the second fails, the first is undone from a hard link to the
    old model file made beforehand. (On a file system without hard links the
    old model cannot be restored then; the new one is removed rather than
    left beside the old tokenizer, a pair that does not match.)"""
    backup = None
    if os.path.lexists(model_out):
        backup = model_tmp + ".old"
        try:
            os.link(model_out, backup)
        except OSError:
            backup = None
    try:
        try:
            os.replace(model_tmp, model_out)
        except OSError as e:
            raise Refused(model_out, f"renaming {model_tmp} into place failed: {e.strerror or e}") from None
        try:
            os.replace(tok_tmp, tok_out)
        except OSError as e:
            if backup:
                os.replace(backup, model_out)
            else:
                os.unlink(model_out)
            raise Refused(tok_out, f"renaming {tok_tmp} into place failed: {e.strerror or e}; {model_out} "
                          f"{'restored' if backup else 'removed'}") from None
    finally:
        if backup and os.path.lexists(backup):
            os.unlink(backup)


# ---- export -------------------------------------------------------------------

def export(directory, model_out, tok_out):
    if not os.path.isdir(directory):
        raise Refused(directory, "not a directory" if os.path.lexists(directory) else "no such directory")
    for path in (model_out, tok_out):
        check_output(path, directory)
    if real_output(model_out) == real_output(tok_out) or (
            os.path.exists(model_out) and os.path.exists(tok_out) and os.path.samefile(model_out, tok_out)):
        raise Refused(tok_out, f"is the same file as the model output {model_out}: give two different files")

    # Read and check everything before writing anything.
    cfg = read_config(directory)
    tok_config = os.path.join(directory, "tokenizer_config.json")
    if os.path.lexists(tok_config):  # not used, but transformers reads it: a broken one is a broken download
        load_json(tok_config)
    tok_bytes = build_tokenizer(directory, cfg["vocab_size"])
    st = SafeTensors(directory)
    for t in st.where.values():
        if t.name.endswith(".bias"):
            raise Refused(t.path, f"tensor {t.name}: biases are not part of the format")
    if cfg["tied"]:
        shared = True
    elif st.has("lm_head.weight"):
        shared = False
    else:
        raise Refused(cfg["path"], "tie_word_embeddings is false (transformers' default when absent), but no "
                      f"lm_head.weight is in {os.path.basename(st.source)}: the classifier is missing")
    plan = checkpoint_plan(cfg, shared)
    for item in plan:
        if item:
            st.check(item[0], item[1])
    inputs = [cfg["path"], tok_config, os.path.join(directory, "tokenizer.json"), st.source] + st.files
    for path in (model_out, tok_out):
        if os.path.realpath(path) in {os.path.realpath(p) for p in inputs}:
            raise Refused(path, "is one of the model's input files")

    # Write both to temporaries, then rename both; on any failure, remove them.
    temps = []
    try:
        for final, data in ((tok_out, tok_bytes), (model_out, None)):
            tmp, f = create_temp(final)
            temps.append(tmp)
            try:
                with f:
                    if data is None:
                        write_checkpoint(f, st, cfg, plan, shared)
                    else:
                        f.write(data)
                    f.flush()
                    os.fsync(f.fileno())  # the data is on disk before the name points at it
            except OSError as e:
                raise Refused(final, f"writing {tmp} failed: {e.strerror or e}") from None
        replace_both(temps[1], model_out, temps[0], tok_out)
    finally:
        for tmp in temps:
            if os.path.lexists(tmp):
                os.unlink(tmp)
    return cfg, shared


def main(argv):
    if len(argv) != 4:
        print(__doc__.split("\n\n")[0] + "\n\nusage: export_hf.py HF_DIR model.bin tokenizer.bin", file=sys.stderr)
        return 2
    directory, model_out, tok_out = argv[1:]
    try:
        cfg, shared = export(directory, model_out, tok_out)
    except Refused as e:
        message = str(e)
    except OSError as e:  # an input that cannot be read (permissions, I/O error)
        message = f"{e.filename or directory}: {e.strerror or e}"
    except MemoryError:
        message = f"{directory}: out of memory"
    except Exception as e:  # a check this file lacks: still one line, never a traceback
        message = f"{directory}: {type(e).__name__}: {e} (unexpected: please report this input)"
    else:
        print(f"export_hf.py: {model_out}: dim {cfg['dim']}, layers {cfg['n_layers']}, heads {cfg['n_heads']} "
              f"(kv {cfg['n_kv_heads']}), vocab {cfg['vocab_size']}, seq_len {cfg['seq_len']}, classifier "
              f"{'tied to the embeddings' if shared else 'separate'}; {tok_out}", file=sys.stderr)
        return 0
    print("export_hf.py: " + message.replace("\r", "\\r").replace("\n", "\\n"), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
