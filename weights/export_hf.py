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
float32 tensors in a fixed order (see write_checkpoint).

What the format cannot say, the exporter refuses, naming the config field:
a rope_theta other than 10000, rope_scaling, biases, a norm eps other than
1e-5, an activation other than SiLU, a head_dim other than
hidden_size / num_attention_heads, and tokenizers that are not SentencePiece-
style BPE with byte fallback (Llama 3's and GPT-2's byte-level vocabularies).

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


class Refused(Exception):
    pass


# ---- safetensors ------------------------------------------------------------

class SafeTensors:
    """The tensors of one or more .safetensors files, read one at a time."""

    def __init__(self, directory):
        index = os.path.join(directory, "model.safetensors.index.json")
        single = os.path.join(directory, "model.safetensors")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.exists(single):
            files = ["model.safetensors"]
        else:
            raise Refused(f"{directory}: no model.safetensors or model.safetensors.index.json "
                          "(pytorch_model.bin is not read: convert it to safetensors first)")
        self.where = {}  # name -> (path, data start, header entry)
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                raw = f.read(8)
                if len(raw) != 8:
                    raise Refused(f"{path}: shorter than a safetensors header")
                (n,) = struct.unpack("<Q", raw)
                if n > 100 << 20:
                    raise Refused(f"{path}: header length {n} bytes: not a safetensors file?")
                header = json.loads(f.read(n))
            for key, entry in header.items():
                if key != "__metadata__":
                    self.where[key] = (path, 8 + n, entry)

    def has(self, name):
        return name in self.where

    def shape(self, name):
        return tuple(self.where[name][2]["shape"])

    def read_f32(self, name, want_shape):
        """The tensor as float32 little-endian bytes, after checking its shape."""
        if name not in self.where:
            raise Refused(f"tensor {name} is missing")
        path, base, entry = self.where[name]
        shape = tuple(entry["shape"])
        if shape != tuple(want_shape):
            raise Refused(f"tensor {name} has shape {list(shape)}, expected {list(want_shape)}")
        begin, end = entry["data_offsets"]
        with open(path, "rb") as f:
            f.seek(base + begin)
            raw = f.read(end - begin)
        count = 1
        for d in shape:
            count *= d
        dtype = entry["dtype"]
        size = {"F32": 4, "F16": 2, "BF16": 2}.get(dtype)
        if size is None:
            raise Refused(f"tensor {name}: dtype {dtype} (only F32, F16 and BF16 are read)")
        if len(raw) != count * size:
            raise Refused(f"tensor {name}: {len(raw)} bytes for {count} values of {dtype}")
        if dtype == "F32":
            return raw
        out = bytearray(4 * count)
        if dtype == "BF16":  # bf16 is the top half of a float32: append two zero bytes (little-endian: before)
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
    if not os.path.exists(path):
        raise Refused(f"{directory}: no config.json")
    with open(path) as f:
        c = json.load(f)

    def need(field, ok, what):
        if not ok:
            raise Refused(f"config.json: {field} = {json.dumps(c.get(field))}: {what}")

    arch = c.get("architectures") or ["LlamaForCausalLM"]
    need("model_type", c.get("model_type", "llama") == "llama", "only the Llama architecture is exported")
    need("architectures", arch == ["LlamaForCausalLM"], "only LlamaForCausalLM is exported")
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "vocab_size", "max_position_embeddings"):
        need(field, isinstance(c.get(field), int) and c[field] > 0, "a positive integer is needed")
    D, NH = c["hidden_size"], c["num_attention_heads"]
    NKV = c.get("num_key_value_heads") or NH
    need("num_key_value_heads", NH % NKV == 0, "must divide num_attention_heads")
    need("hidden_size", D % NH == 0 and (D // NH) % 2 == 0,
         "hidden_size / num_attention_heads must be an even head size")
    HS = D // NH
    need("head_dim", c.get("head_dim") in (None, HS), f"the format has head size hidden_size / heads = {HS}")
    rope = c.get("rope_parameters") or {}  # transformers 5 keeps rope_theta and the scaling type in here
    need("rope_theta", float(c.get("rope_theta", rope.get("rope_theta", 10000.0))) == 10000.0,
         "kvt's RoPE uses theta = 10000 (llama2.c's format has no field for it)")
    need("rope_scaling", c.get("rope_scaling") is None, "RoPE scaling is not implemented")
    need("rope_parameters", rope.get("rope_type", "default") == "default", "RoPE scaling is not implemented")
    need("rms_norm_eps", abs(float(c.get("rms_norm_eps", 1e-5)) - 1e-5) < 1e-12,
         "kvt's RMSNorm uses eps = 1e-5 (llama2.c's format has no field for it)")
    need("hidden_act", c.get("hidden_act", "silu") == "silu", "the FFN is SwiGLU with SiLU")
    need("attention_bias", not c.get("attention_bias", False), "attention projections have no bias here")
    need("mlp_bias", not c.get("mlp_bias", False), "FFN projections have no bias here")
    return {"dim": D, "hidden_dim": c["intermediate_size"], "n_layers": c["num_hidden_layers"],
            "n_heads": NH, "n_kv_heads": NKV, "vocab_size": c["vocab_size"],
            "seq_len": c["max_position_embeddings"], "head_size": HS,
            "tied": bool(c.get("tie_word_embeddings", False))}


# ---- checkpoint ---------------------------------------------------------------

def write_checkpoint(directory, out_path, cfg):
    st = SafeTensors(directory)
    D, HD, L = cfg["dim"], cfg["hidden_dim"], cfg["n_layers"]
    NH, NKV, HS, V = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_size"], cfg["vocab_size"]
    KVD = NKV * HS
    for name in st.where:
        if name.endswith(".bias"):
            raise Refused(f"tensor {name}: biases are not part of the format")
    shared = cfg["tied"] or not st.has("lm_head.weight")
    layer = "model.layers.{}."
    tmp = out_path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<7i", D, HD, L, NH, NKV, V if shared else -V, cfg["seq_len"]))

        def put(name, shape, heads=0):
            data = st.read_f32(name, shape)
            if heads:
                data = unpermute_rows(data, heads, HS, shape[1])
            f.write(data)

        put("model.embed_tokens.weight", (V, D))
        for i in range(L):
            put(layer.format(i) + "input_layernorm.weight", (D,))
        for i in range(L):
            put(layer.format(i) + "self_attn.q_proj.weight", (D, D), heads=NH)
        for i in range(L):
            put(layer.format(i) + "self_attn.k_proj.weight", (KVD, D), heads=NKV)
        for i in range(L):
            put(layer.format(i) + "self_attn.v_proj.weight", (KVD, D))
        for i in range(L):
            put(layer.format(i) + "self_attn.o_proj.weight", (D, D))
        for i in range(L):
            put(layer.format(i) + "post_attention_layernorm.weight", (D,))
        for i in range(L):
            put(layer.format(i) + "mlp.gate_proj.weight", (HD, D))  # w1
        for i in range(L):
            put(layer.format(i) + "mlp.down_proj.weight", (D, HD))  # w2
        for i in range(L):
            put(layer.format(i) + "mlp.up_proj.weight", (HD, D))  # w3
        put("model.norm.weight", (D,))
        f.write(bytes(4 * cfg["seq_len"] * HS))  # llama2.c's two RoPE tables (seq_len x HS/2 each): unused, zeros
        if not shared:
            put("lm_head.weight", (V, D))
    os.replace(tmp, out_path)
    return shared


# ---- tokenizer ------------------------------------------------------------------

def write_tokenizer(directory, out_path, V):
    """tokenizer.json (SentencePiece-style BPE, byte fallback) -> llama2.c's
    tokenizer.bin: int32 max_token_length, then per id: float32 score, int32
    length, the piece's bytes. SentencePiece's word marker U+2581 becomes a
    space (kvt's encoder adds the leading space itself, as SentencePiece
    does). The score orders the merges: a piece made by merge number r (0 =
    first) scores -r, so kvt's "highest score first" merges in
    tokenizer.json's order; pieces no merge makes never merge (score -1e30),
    nor do special tokens."""
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
        raise Refused(f"{directory}: no tokenizer.json")
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise Refused(f"tokenizer.json: model.type = {json.dumps(model.get('type'))}: only BPE is exported")
    if not model.get("byte_fallback"):
        raise Refused("tokenizer.json: model.byte_fallback is not true: a byte-level (GPT-2 / Llama 3 style) "
                      "vocabulary, which kvt's SentencePiece-style encoder cannot reproduce")
    vocab = dict(model["vocab"])
    for t in tj.get("added_tokens") or []:
        vocab.setdefault(t["content"], t["id"])
    special = {t["content"] for t in tj.get("added_tokens") or [] if t.get("special")}
    if len(vocab) > V or max(vocab.values()) >= V:
        raise Refused(f"tokenizer.json: {len(vocab)} pieces (ids up to {max(vocab.values())}) for a model "
                      f"with vocab_size {V}")
    pieces = [None] * V
    for piece, i in vocab.items():
        pieces[i] = piece
    for i in range(V):
        if pieces[i] is None:  # a hole (vocab_size padded past the tokenizer): a piece that never matches text
            pieces[i] = f"<unused{i}>"
    for b in range(256):
        if pieces[3 + b] != f"<0x{b:02X}>":
            raise Refused(f"tokenizer.json: id {3 + b} is {json.dumps(pieces[3 + b])}, not <0x{b:02X}>: kvt expects "
                          "the 256 byte pieces at ids 3..258 (as in Llama 2 and TinyLlama)")
    if (pieces[1], pieces[2]) != ("<s>", "</s>"):
        raise Refused(f"tokenizer.json: ids 1 and 2 are {pieces[1]!r} and {pieces[2]!r}: kvt uses 1 = <s> (BOS) "
                      "and 2 = </s> (EOS)")
    merges = model.get("merges") or []
    score = [-1e30] * V
    for r, m in enumerate(merges):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        i = vocab.get(a + b)
        if i is not None and pieces[i] not in special and score[i] == -1e30:
            score[i] = -float(r)
    out = []
    for i in range(V):
        text = pieces[i]
        if not (text.startswith("<0x") and len(text) == 6) and text not in special:
            text = text.replace("\u2581", " ")
        out.append(text.encode("utf-8"))
    tmp = out_path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<i", max(len(b) for b in out)))
        for i in range(V):
            f.write(struct.pack("<fi", score[i], len(out[i])))
            f.write(out[i])
    os.replace(tmp, out_path)


def main(argv):
    if len(argv) != 4:
        print(__doc__.split("\n\n")[0] + "\n\nusage: export_hf.py HF_DIR model.bin tokenizer.bin", file=sys.stderr)
        return 2
    directory, model_out, tok_out = argv[1:]
    try:
        cfg = read_config(directory)
        write_tokenizer(directory, tok_out, cfg["vocab_size"])
        shared = write_checkpoint(directory, model_out, cfg)
    except Refused as e:
        print(f"export_hf.py: {e}", file=sys.stderr)
        return 1
    print(f"export_hf.py: {model_out}: dim {cfg['dim']}, layers {cfg['n_layers']}, heads {cfg['n_heads']} "
          f"(kv {cfg['n_kv_heads']}), vocab {cfg['vocab_size']}, seq_len {cfg['seq_len']}, classifier "
          f"{'tied to the embeddings' if shared else 'separate'}; {tok_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
