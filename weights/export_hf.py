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
float32 tensors in a fixed order (see checkpoint_plan). A rope_theta other
than 10000 adds the RoPE extension after the seven ("rope", float32 theta);
a byte-level vocabulary (GPT-2 style: a ByteLevel pre-tokenizer, alone or
after Digits(individual_digits=true) as in SmolLM) adds the BBPE trailer to
tokenizer.bin. Both formats: weights/kvt_files.py, which export_gguf.py
shares.

What the format cannot say, the exporter refuses, naming the config field:
rope_scaling, biases, a norm eps other than 1e-5, an activation other than
SiLU, a head_dim other than hidden_size / num_attention_heads, and
tokenizers that are neither SentencePiece-style BPE with byte fallback nor
byte-level BPE with one of those two pre-tokenizers (Llama 3's Split regex,
for one). It also refuses what kvt's loaders would refuse (kvt's limits, in
kvt_files.py) and input that is malformed or contradicts itself (bad JSON,
wrong types, a safetensors header that does not fit its file, overlapping
tensors, a missing shard or classifier). Every refusal is one line,
`export_hf.py: FILE: what`, exit 1.

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
import struct
import sys

sys.dont_write_bytecode = True  # importing kvt_files leaves no __pycache__ in weights/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvt_files as kf  # noqa: E402  (weights/kvt_files.py: formats, kvt's limits, outputs)
from kvt_files import (LIMIT_DIM, LIMIT_HIDDEN, LIMIT_LAYERS, LIMIT_SEQ, LIMIT_VOCAB, MAX_HS,  # noqa: E402
                       Refused, show)

# Not a kvt limit but this exporter's: the 256 byte pieces of a byte-fallback
# vocabulary sit at ids 3..258, so it has at least 259 pieces (a byte-level
# one: its 256 byte symbols and the special tokens).
MIN_VOCAB = 259
HEADER_LIMIT = 100 << 20   # a safetensors JSON header larger than this is not one


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
        why = None if value is None else kf.theta_problem(value)
        if why:
            raise Refused(path, f"{field} = {show(value)}: {why}")
    theta = rope.get("rope_theta", c.get("rope_theta"))
    if None not in (c.get("rope_theta"), rope.get("rope_theta")) and c["rope_theta"] != rope["rope_theta"]:
        raise Refused(path, f"rope_theta = {show(c['rope_theta'])} and rope_parameters.rope_theta = "
                      f"{show(rope['rope_theta'])} disagree")
    theta = kf.LEGACY_THETA if theta is None else float(theta)  # transformers' default: 10000
    need("rope_scaling", c.get("rope_scaling") is None, "RoPE scaling is not implemented")
    if rope.get("rope_type", "default") != "default":
        raise Refused(path, f"rope_parameters.rope_type = {show(rope['rope_type'])}: RoPE scaling is not "
                      "implemented")
    eps = c.get("rms_norm_eps", 1e-5)
    need("rms_norm_eps", is_number(eps) and kf.eps_ok(float(eps)),
         "kvt's RMSNorm uses eps = 1e-5 (llama2.c's format has no field for it)")
    need("hidden_act", c.get("hidden_act", "silu") == "silu", "the FFN is SwiGLU with SiLU")
    need("attention_bias", not flag("attention_bias"), "attention projections have no bias here")
    need("mlp_bias", not flag("mlp_bias"), "FFN projections have no bias here")
    return {"path": path, "dim": D, "hidden_dim": HD, "n_layers": L, "n_heads": NH, "n_kv_heads": NKV,
            "vocab_size": V, "seq_len": T, "head_size": HS, "tied": flag("tie_word_embeddings"), "theta": theta,
            "eos_token_id": c.get("eos_token_id")}


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
    f.write(kf.checkpoint_header(cfg["dim"], cfg["hidden_dim"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"],
                                 cfg["vocab_size"], cfg["seq_len"], shared, cfg["theta"]))
    for item in plan:
        if item is None:
            kf.write_zeros(f, 4 * cfg["seq_len"] * cfg["head_size"])
            continue
        name, shape, heads = item
        data = st.read_f32(name, shape)
        if heads:
            data = unpermute_rows(data, heads, cfg["head_size"], shape[1])
        f.write(data)


# ---- tokenizer ------------------------------------------------------------------

def read_vocab(path, tj, model, V):
    """model.vocab and added_tokens -> (pieces by id, piece -> id, the
    special pieces). Ids past the tokenizer up to config.json's vocab_size
    (padding) get a piece that never matches text, <unusedN>."""
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
    return pieces, vocab, special


def read_merges(path, model, exact):
    """model.merges as (left, right) pairs, from "left right" strings or
    [left, right] lists. exact: a string must hold exactly one space (the
    tokenizers library's rule for byte-level files)."""
    merges = model.get("merges") or []
    if not isinstance(merges, list):
        raise Refused(path, f"model.merges is a JSON {kind(merges)}: a list is needed")
    pairs = []
    for r, m in enumerate(merges):
        if isinstance(m, str) and " " in m and not (exact and m.count(" ") != 1):
            pairs.append(tuple(m.split(" ", 1)))
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m):
            pairs.append(tuple(m))
        else:
            raise Refused(path, f"model.merges[{r}] = {show(m)}: \"a b\" or [\"a\", \"b\"] is needed")
    return pairs


def build_tokenizer(directory, cfg, tok_config):
    """tokenizer.json -> the bytes of tokenizer.bin, and a short summary.
    model.byte_fallback true: a SentencePiece-style vocabulary, written in
    the legacy layout (sentencepiece_tokenizer); otherwise it must be a
    byte-level one (byte_level_tokenizer)."""
    V = cfg["vocab_size"]
    path = os.path.join(directory, "tokenizer.json")
    tj = load_json(path, "missing (only tokenizer.json is read, not tokenizer.model)")
    model = tj.get("model")
    if not isinstance(model, dict):
        raise Refused(path, "model is missing" if model is None else f"model is a JSON {kind(model)}, not an object")
    if model.get("type") != "BPE":
        raise Refused(path, f"model.type = {show(model.get('type'))}: only BPE is exported")
    if model.get("byte_fallback") is True:
        return sentencepiece_tokenizer(path, tj, model, V), "SentencePiece-style BPE with byte fallback"
    pre = byte_level_pre(path, tj, model)
    pieces, vocab, special = read_vocab(path, tj, model, V)
    tc_path = os.path.join(directory, "tokenizer_config.json")
    bos = template_bos(path, tj, vocab, tok_config, tc_path)
    eos = eos_id(tc_path, vocab, tok_config, cfg)
    pairs = read_merges(path, model, exact=True)
    blob = kf.bbpe_tokenizer(path, pieces, pre, bos, eos, pairs, lambda r: f"model.merges[{r}]")
    return blob, f"byte-level BPE ({pre}), {len(pairs)} merges, bos {bos}, eos {eos}"


def sentencepiece_tokenizer(path, tj, model, V):
    """SentencePiece-style BPE with byte fallback -> llama2.c's legacy
    tokenizer.bin: int32 max_token_length, then per id: float32 score, int32
    length, the piece's bytes. SentencePiece's word marker U+2581 becomes a
    space (kvt's encoder adds the leading space itself, as SentencePiece
    does). The score orders the merges: a piece made by merge number r (0 =
    first) scores -r, so kvt's "highest score first" merges in
    tokenizer.json's order; pieces no merge makes never merge (score -1e30),
    nor do special tokens."""
    pieces, vocab, special = read_vocab(path, tj, model, V)
    for b in range(256):
        if pieces[3 + b] != f"<0x{b:02X}>":
            raise Refused(path, f"id {3 + b} is {show(pieces[3 + b])}, not <0x{b:02X}>: kvt expects "
                          "the 256 byte pieces at ids 3..258 (as in Llama 2 and TinyLlama)")
    if (pieces[1], pieces[2]) != ("<s>", "</s>"):
        raise Refused(path, f"ids 1 and 2 are {show(pieces[1])} and {show(pieces[2])}: kvt uses 1 = <s> (BOS) "
                      "and 2 = </s> (EOS)")
    score = [-1e30] * V
    for r, (a, b) in enumerate(read_merges(path, model, exact=False)):
        i = vocab.get(a + b)
        if i is not None and pieces[i] not in special and score[i] == -1e30:
            score[i] = -float(r)
    raws = []
    for i in range(V):
        text = pieces[i]
        if not (text.startswith("<0x") and len(text) == 6) and text not in special:
            text = text.replace("\u2581", " ")
        raws.append(kf.piece_bytes(path, i, text))
    return kf.legacy_tokenizer(path, raws, score)


def describe(p):
    """A pre-tokenizer or normalizer, by its type(s), for messages."""
    if not isinstance(p, dict):
        return show(p)
    inner = p.get("pretokenizers", p.get("normalizers"))
    if isinstance(inner, list):
        return f"{p.get('type')} [{', '.join(describe(x) for x in inner)}]"
    return str(p.get("type"))


def byte_level_pre(path, tj, model):
    """The trailer's pre-tokenizer of a byte-level vocabulary: "gpt2" for a
    ByteLevel pre-tokenizer (GPT-2's regex, then bytes to symbols), "smollm"
    for Sequence [Digits(individual_digits=true), ByteLevel] (each digit
    alone first). Anything else would split text differently from kvt."""

    def byte_level(p, where):
        if not (isinstance(p, dict) and p.get("type") == "ByteLevel"):
            return False
        if p.get("add_prefix_space") is True:
            raise Refused(path, f"{where}.add_prefix_space is true: kvt's byte-level encoder adds no leading space")
        if p.get("use_regex", True) is not True:
            raise Refused(path, f"{where}.use_regex is false: kvt's byte-level encoder always splits with GPT-2's "
                          "regex")
        return True

    pre = tj.get("pre_tokenizer")
    kind_ = None
    if byte_level(pre, "pre_tokenizer"):
        kind_ = "gpt2"
    elif isinstance(pre, dict) and pre.get("type") == "Sequence":
        seq = pre.get("pretokenizers")
        if (isinstance(seq, list) and len(seq) == 2 and isinstance(seq[0], dict) and seq[0].get("type") == "Digits"
                and seq[0].get("individual_digits") is True and byte_level(seq[1], "pre_tokenizer.pretokenizers[1]")):
            kind_ = "smollm"
    if kind_ is None:
        raise Refused(path, f"model.byte_fallback is not true and pre_tokenizer is {describe(pre)}: kvt reads "
                      "SentencePiece-style vocabularies with byte fallback, or byte-level ones split by ByteLevel "
                      "(GPT-2) or Sequence [Digits(individual_digits=true), ByteLevel] (SmolLM)")
    if tj.get("normalizer") is not None:
        raise Refused(path, f"normalizer is {describe(tj['normalizer'])}: a byte-level vocabulary is read without "
                      "one (kvt encodes the text as it is)")
    for field in ("continuing_subword_prefix", "end_of_word_suffix", "dropout"):
        if model.get(field):
            raise Refused(path, f"model.{field} = {show(model[field])}: not part of GPT-2's byte-level BPE")
    if model.get("ignore_merges") is True:
        raise Refused(path, "model.ignore_merges is true (Llama 3 style): kvt always merges")
    return kind_


def token_of(value):
    """A token in tokenizer_config.json: a string, or an AddedToken object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def template_bos(path, tj, vocab, tok_config, tc_path):
    """The BOS kvt prepends (-1: none), as transformers' fast tokenizer does:
    the post_processor's TemplateProcessing (alone or in a Sequence) when its
    single-sequence template starts with a special token; ByteLevel or no
    post_processor: none. tokenizer_config.json's add_bos_token, when given,
    must agree."""
    pp = tj.get("post_processor")
    templates = [pp] if isinstance(pp, dict) and pp.get("type") == "TemplateProcessing" else []
    if isinstance(pp, dict) and pp.get("type") == "Sequence" and isinstance(pp.get("processors"), list):
        templates = [p for p in pp["processors"] if isinstance(p, dict) and p.get("type") == "TemplateProcessing"]
        others = [p.get("type") if isinstance(p, dict) else p for p in pp["processors"]
                  if not (isinstance(p, dict) and p.get("type") in ("TemplateProcessing", "ByteLevel"))]
        if others or len(templates) > 1:
            raise Refused(path, f"post_processor is {describe(pp)}: only ByteLevel and one TemplateProcessing are "
                          "read")
    elif pp is not None and not templates and not (isinstance(pp, dict) and pp.get("type") == "ByteLevel"):
        raise Refused(path, f"post_processor is {describe(pp)}: only ByteLevel and TemplateProcessing are read")
    bos = -1
    if templates:
        single = templates[0].get("single")
        seq = {"Sequence": {"id": "A", "type_id": 0}}
        if isinstance(single, list) and len(single) == 2 and single[1] == seq and isinstance(single[0], dict) \
                and isinstance(single[0].get("SpecialToken"), dict) and single[0]["SpecialToken"].get("id") in vocab:
            bos = vocab[single[0]["SpecialToken"]["id"]]
        elif single != [seq]:
            raise Refused(path, f"post_processor.single = {show(single)}: kvt prepends at most one BOS and "
                          "appends nothing")
    add = (tok_config or {}).get("add_bos_token")
    if isinstance(add, bool) and add != (bos >= 0):
        raise Refused(tc_path, f"add_bos_token is {str(add).lower()}, but tokenizer.json's post_processor "
                      f"{'adds no' if add else 'prepends a'} BOS")
    return bos


def eos_id(tc_path, vocab, tok_config, cfg):
    """The token that ends a reply: tokenizer_config.json's eos_token (what
    the chat template closes a turn with in instruct models, e.g. SmolLM2's
    <|im_end|>), else config.json's eos_token_id."""
    tok = token_of((tok_config or {}).get("eos_token"))
    if tok is not None:
        if tok not in vocab:
            raise Refused(tc_path, f"eos_token {show(tok)} is not in tokenizer.json's vocabulary")
        return vocab[tok]
    eos = cfg["eos_token_id"]
    if is_int(eos) and 0 <= eos < cfg["vocab_size"]:
        return eos
    raise Refused(cfg["path"], f"eos_token_id = {show(eos)}, and tokenizer_config.json names no eos_token: one id "
                  "in the vocabulary is needed (the end of a reply)")


# ---- outputs ------------------------------------------------------------------

def check_inside(path, directory):
    """An output must not be inside the model's folder: it is replaced by a
    rename, and a rename over one of the inputs would destroy it."""
    inside = os.path.realpath(directory)
    if os.path.commonpath([kf.real_output(path), inside]) == inside:
        raise Refused(path, f"is inside the model's folder {directory}: write the outputs elsewhere (an input "
                      "could be overwritten)")


# ---- export -------------------------------------------------------------------

def export(directory, model_out, tok_out):
    if not os.path.isdir(directory):
        raise Refused(directory, "not a directory" if os.path.lexists(directory) else "no such directory")
    for path in (model_out, tok_out):
        kf.check_output(path)
        check_inside(path, directory)
    kf.check_two_outputs(model_out, tok_out)

    # Read and check everything before writing anything.
    cfg = read_config(directory)
    tok_config_path = os.path.join(directory, "tokenizer_config.json")
    tok_config = None
    if os.path.lexists(tok_config_path):  # a byte-level vocabulary's BOS / EOS; transformers reads it too
        tok_config = load_json(tok_config_path)
    tok_bytes, tok_summary = build_tokenizer(directory, cfg, tok_config)
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
    inputs = [cfg["path"], tok_config_path, os.path.join(directory, "tokenizer.json"), st.source] + st.files
    for path in (model_out, tok_out):
        if kf.is_input(path, inputs):
            raise Refused(path, "is one of the model's input files")

    # Write both to temporaries, then rename both; on any failure, remove them.
    kf.write_outputs(model_out, tok_out, tok_bytes, lambda f: write_checkpoint(f, st, cfg, plan, shared))
    return cfg, shared, tok_summary


def main(argv):
    if len(argv) != 4:
        print(__doc__.split("\n\n")[0] + "\n\nusage: export_hf.py HF_DIR model.bin tokenizer.bin", file=sys.stderr)
        return 2
    directory, model_out, tok_out = argv[1:]
    kf.stop_on_signals()
    try:
        cfg, shared, tok_summary = export(directory, model_out, tok_out)
    except Exception as e:  # one line, never a traceback (kvt_files.refusal)
        message = kf.refusal(e, directory)
    else:
        rope = "10000" if kf.float32(cfg["theta"]) == kf.LEGACY_THETA else f"{cfg['theta']:g} (rope extension)"
        print(f"export_hf.py: {model_out}: dim {cfg['dim']}, layers {cfg['n_layers']}, heads {cfg['n_heads']} "
              f"(kv {cfg['n_kv_heads']}), vocab {cfg['vocab_size']}, seq_len {cfg['seq_len']}, rope theta {rope}, "
              f"classifier {'tied to the embeddings' if shared else 'separate'}; {tok_out}: {tok_summary}",
              file=sys.stderr)
        return 0
    print("export_hf.py: " + kf.printable(message), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
