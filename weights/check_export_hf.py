#!/usr/bin/env python3
"""Checks that weights/export_hf.py refuses bad input with one line and is
all-or-nothing. Standard library only (no torch, no transformers).

    python3 weights/check_export_hf.py [KVT_BINARY] [--exporter FILE]

It builds a small valid Hugging Face Llama folder in a temporary directory
(config.json, two safetensors shards of F32/F16/BF16 tensors written with
struct, model.safetensors.index.json, a byte-fallback BPE tokenizer.json with
one 1,024-byte piece, the longest kvt loads), exports it once (and runs
`KVT -m model.bin -z tokenizer.bin -n 2 -t 0` on the result when KVT_BINARY is
given), exports variants that must be accepted (rope_theta 500000: the RoPE
extension; byte-level tokenizer.json files: the BBPE trailer, read back field
by field), then breaks a fresh copy of it one way per case and runs the exporter
on it, with an old model.bin / tokenizer.bin pair at the output paths. Each
refusal must:
  - exit 1, with exactly one line on stderr that starts with "export_hf.py: "
    and names the file and the field or tensor at fault, and no Traceback;
  - leave the output directory as it was: no temporary or *.part file, the
    old pair byte for byte the same (and the same inodes: not rewritten);
  - leave the input folder as it was.
One line per check, PASS or FAIL, then "N passed, N failed"; exit 1 on any
failure. --exporter runs another copy of the exporter (to show which checks
an older version fails).
"""
import errno
import hashlib
import json
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# The fixture's shape: GQA (4 query heads, 2 kv heads), head size 8, an untied
# classifier, 300 pieces (the 259 fixed ones and 41 more).
D, HD, L, NH, NKV, V, T = 32, 64, 2, 4, 2, 300, 32
HS = D // NH
KVD = NKV * HS
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"
LONG_ID = V - 1       # the 1,024-byte piece (kvt's limit, cli/tokenizer.c)
NUL_ID = V - 2        # pieces the cases below spoil
SURROGATE_ID = V - 3

n_pass = n_fail = 0


def report(ok, title, why=""):
    global n_pass, n_fail
    if ok:
        n_pass += 1
        print(f"PASS {title}")
    else:
        n_fail += 1
        print(f"FAIL {title}: {why}")


# ---- the fixture ----------------------------------------------------------------

def tensor_list():
    """(name, shape, dtype, shard) of every tensor, in no particular order."""
    out = [("model.embed_tokens.weight", [V, D], "F32", SHARD1)]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", [D], "F16", SHARD1),
                (p + "self_attn.q_proj.weight", [D, D], "F32", SHARD1),
                (p + "self_attn.k_proj.weight", [KVD, D], "F32", SHARD1),
                (p + "self_attn.v_proj.weight", [KVD, D], "F32", SHARD1),
                (p + "self_attn.o_proj.weight", [D, D], "F32", SHARD1),
                (p + "post_attention_layernorm.weight", [D], "F16", SHARD2),
                (p + "mlp.gate_proj.weight", [HD, D], "BF16", SHARD2),
                (p + "mlp.down_proj.weight", [D, HD], "F32", SHARD2),
                (p + "mlp.up_proj.weight", [HD, D], "BF16", SHARD2)]
    out += [("model.norm.weight", [D], "F16", SHARD2), ("lm_head.weight", [V, D], "F32", SHARD2)]
    return out


def encode(values, dtype):
    """Python floats -> little-endian bytes of dtype. Values are chosen exact
    in every dtype (multiples of 1/64 below 2), so the float32 the exporter
    writes can be predicted exactly."""
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    if dtype == "BF16":  # the top two bytes of each float32
        raw = struct.pack(f"<{len(values)}f", *values)
        return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))
    if dtype == "F64":
        return struct.pack(f"<{len(values)}d", *values)
    raise ValueError(dtype)


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape, raw bytes), stored in this order."""
    header, data = {}, bytearray()
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header["__metadata__"] = {"format": "pt"}
    write_raw_safetensors(path, json.dumps(header).encode(), bytes(data))


def write_raw_safetensors(path, header_bytes, data, length=None):
    """The file as bytes: length (default: the header's true length), header
    padded with spaces to 8 bytes as safetensors does, data."""
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes) if length is None else length))
        f.write(header_bytes)
        f.write(data)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw)
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def edit_header(path, fn):
    """Rewrite one shard with fn applied to its parsed header; data unchanged."""
    header, data = read_safetensors(path)
    fn(header)
    write_raw_safetensors(path, json.dumps(header).encode(), data)


def add_tensor(path, name, dtype, shape, raw):
    header, data = read_safetensors(path)
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    write_raw_safetensors(path, json.dumps(header).encode(), data + raw)


def vocabulary():
    """piece -> id: <unk> <s> </s>, the 256 byte pieces, 38 ordinary pieces,
    then the three the cases spoil (the last one 1,024 bytes long)."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = 3 + b
    words = ["\u2581", "e", "t", "a", "o", "h", "n", "s", "\u2581t", "he", "\u2581a", "in", "\u2581the", "er",
             "an", "\u2581o", "re", "on", "\u2581c", "at", "en", "is", "it", "or", "es", "\u2581s", "\u2581w",
             "nd", "\u2581b", "ed", "\u2581f", "ing", "ou", "ar", "\u2581p", "le", "\u2581m", "al"]
    for w in words:
        vocab[w] = len(vocab)
    vocab["ab"] = SURROGATE_ID
    vocab["cd"] = NUL_ID
    vocab["\u00e9" * 512] = LONG_ID  # 512 two-byte characters: 1,024 bytes of UTF-8
    assert len(vocab) == V and sorted(vocab.values()) == list(range(V))
    return vocab


def gpt2_bytes():
    """GPT-2's bytes_to_unicode: byte b -> the character a byte-level
    vocabulary spells it with (printable Latin-1 as itself, the rest moved to
    U+0100 onwards: the space is U+0120, "\u0120")."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


# A byte-level vocabulary (ids 269..V-1 are holes: <unusedN> pieces).
BL_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BL_MERGES = ["\u0120 t", "h e", "\u0120t he", "i n", "\u0120 a", "e r", ["1", "2"], "\u0120a n", "\u0120an d", "o n"]


def byte_level_vocab():
    vocab = {p: i for i, p in enumerate(BL_SPECIAL + gpt2_bytes())}
    for m in BL_MERGES:
        a, b = m.split(" ") if isinstance(m, str) else m
        vocab.setdefault(a + b, len(vocab))
    return vocab


def byte_level_tokenizer(pre="smollm"):
    """tokenizer.json of a byte-level BPE (SmolLM2's layout: Digits then
    ByteLevel; pre="gpt2": ByteLevel alone, GPT-2's)."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "normalizer": None,
            "added_tokens": [{"id": i, "content": c, "special": True} for i, c in enumerate(BL_SPECIAL)],
            "pre_tokenizer": byte_level if pre == "gpt2" else {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True}, byte_level]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": byte_level_vocab(), "merges": list(BL_MERGES)}}


def make_byte_level(src, pre="smollm"):
    """Turn a copy of the fixture into a byte-level one (SmolLM2's special
    tokens; tokenizer_config.json names <|im_end|> as EOS)."""
    dump(os.path.join(src, "tokenizer.json"), byte_level_tokenizer(pre))
    dump(os.path.join(src, "tokenizer_config.json"),
         {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "tokenizer_class": "GPT2Tokenizer"})


def build_fixture(folder, seed=1234):
    """A valid HF folder; returns {tensor name: list of float values}."""
    os.makedirs(folder)
    rng = random.Random(seed)
    values, shards = {}, {SHARD1: [], SHARD2: []}
    for name, shape, dtype, shard in tensor_list():
        count = 1
        for d in shape:
            count *= d
        if name.endswith("norm.weight"):
            vals = [rng.randint(32, 96) / 64 for _ in range(count)]   # 0.5 .. 1.5
        else:
            vals = [rng.randint(-8, 8) / 64 for _ in range(count)]
        values[name] = vals
        shards[shard].append((name, dtype, shape, encode(vals, dtype)))
    for shard, tensors in shards.items():
        write_safetensors(os.path.join(folder, shard), tensors)
    weight_map = {name: shard for name, _, _, shard in tensor_list()}
    dump(os.path.join(folder, INDEX), {"metadata": {"total_size": 0}, "weight_map": weight_map})
    dump(os.path.join(folder, "config.json"), {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D,
        "intermediate_size": HD, "num_hidden_layers": L, "num_attention_heads": NH,
        "num_key_value_heads": NKV, "vocab_size": V, "max_position_embeddings": T, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": None, "hidden_act": "silu", "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2})
    vocab = vocabulary()
    merges = [["\u2581", "t"], ["h", "e"], ["\u2581", "a"], ["i", "n"], ["\u2581t", "he"], "e r", "a n"]
    added = [{"id": i, "content": c, "special": True} for c, i in vocab.items() if i < 259]
    dump(os.path.join(folder, "tokenizer.json"), {
        "version": "1.0", "added_tokens": added,
        "model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>", "fuse_unk": True,
                  "vocab": vocab, "merges": merges}})
    dump(os.path.join(folder, "tokenizer_config.json"),
         {"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "LlamaTokenizer"})
    return values


def dump(path, obj):
    """As Hugging Face writes it: UTF-8 text, unescaped (escaped only when a
    case puts a lone surrogate in, which UTF-8 cannot carry)."""
    text = json.dumps(obj, ensure_ascii=False)
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raw = json.dumps(obj).encode()
    write_text(path, raw)


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def edit_json(path, fn):
    obj = load(path)
    fn(obj)
    dump(path, obj)


def write_text(path, text):
    with open(path, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())


# ---- running the exporter and watching what it touches ------------------------------

def snapshot(folder):
    """Every entry under folder: its kind, content hash or link target (and
    the hash of what a link points to), inode. Equal snapshots: nothing was
    added, removed, replaced or rewritten."""
    seen = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            key = os.path.relpath(path, folder)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                inner = file_hash(path) if os.path.isfile(path) else None
                seen[key] = ("link", target, inner, st.st_ino)
            elif stat.S_ISREG(st.st_mode):
                seen[key] = ("file", file_hash(path), st.st_ino)
            elif stat.S_ISDIR(st.st_mode):
                seen[key] = ("dir", st.st_ino)
            else:
                seen[key] = ("special", st.st_mode, st.st_rdev, st.st_ino)
    return seen


def file_hash(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def diff(before, after):
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return ", ".join(changed[:4]) + (" ..." if len(changed) > 4 else "")


def run(cmd):
    """(exit status, stdout, stderr); a program that cannot start or runs past
    5 minutes gives status -1 and says why."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, "", f"{cmd[0]}: {e}\n"
    return p.returncode, p.stdout, p.stderr


def fresh_outputs(folder):
    """An output directory holding an old pair (content the export would
    never write): a refused export must leave it exactly so."""
    os.makedirs(folder)
    write_text(os.path.join(folder, "model.bin"), b"old model.bin " * 64)
    write_text(os.path.join(folder, "tokenizer.bin"), b"old tokenizer.bin " * 16)
    return os.path.join(folder, "model.bin"), os.path.join(folder, "tokenizer.bin")


def expect_refusal(title, cmd, want, watch):
    """Run cmd; the refusal rules above, want = substrings of the line."""
    before = {w: snapshot(w) for w in watch}
    rc, _, err = run(cmd)
    problems = []
    if rc != 1:
        problems.append(f"exit {rc}, expected 1")
    if "Traceback" in err:
        problems.append("a Python traceback")
    lines = err.splitlines()
    if len(lines) != 1 or not err.endswith("\n"):
        problems.append(f"{len(lines)} lines on stderr, expected 1")
    elif not lines[0].startswith("export_hf.py: "):
        problems.append("the line does not start with 'export_hf.py: '")
    missing = [w for w in want if w not in err]
    if missing:
        problems.append(f"the message lacks {missing}")
    for w in watch:
        after = snapshot(w)
        if after != before[w]:
            problems.append(f"{os.path.basename(w)} changed: {diff(before[w], after)}")
    first = lines[-1] if lines else ""
    report(not problems, f"{title}: {first[:200]}", "; ".join(problems) + f" (stderr: {err.strip()[-300:]!r})")


# ---- the checks -------------------------------------------------------------------

def check_valid_export(exporter, src, base, values, kvt):
    """The fixture exports; the files say what they should (computed here from
    the fixture's values, not from the exporter)."""
    out = os.path.join(base, "valid")
    os.makedirs(out)
    model, tok = os.path.join(out, "model.bin"), os.path.join(out, "tokenizer.bin")
    rc, _, err = run([sys.executable, exporter, src, model, tok])
    report(rc == 0 and os.path.isfile(model) and os.path.isfile(tok),
           "the valid fixture exports (2 shards, F32/F16/BF16, GQA, untied, a 1,024-byte piece)",
           f"exit {rc}: {err.strip()[-300:]}")
    if rc != 0:
        return None
    with open(model, "rb") as f:
        m = f.read()
    floats = (V * D + L * D + L * (2 * D * D + 2 * KVD * D) + L * D + L * 3 * HD * D + D + T * HS + V * D)
    header = struct.unpack_from("<7i", m)
    report(header == (D, HD, L, NH, NKV, -V, T) and len(m) == 28 + 4 * floats,
           f"model.bin: header (dim, hidden, layers, heads, kv heads, -vocab, seq_len) = {header}, {len(m)} bytes",
           f"expected {(D, HD, L, NH, NKV, -V, T)} and {28 + 4 * floats} bytes")
    emb = list(struct.unpack_from(f"<{V * D}f", m, 28))
    # wq of layer 0 follows the embeddings and the L input norms; its row 2i + 1
    # of each head is Hugging Face's row i + HS/2 (the RoPE pairing undone)
    wq = struct.unpack_from(f"<{D * D}f", m, 28 + 4 * (V * D + L * D))
    hf = values["model.layers.0.self_attn.q_proj.weight"]
    row = lambda data, r: list(data[r * D:(r + 1) * D])
    perm_ok = all(row(wq, h * HS + 2 * i + j) == row(hf, h * HS + i + j * HS // 2)
                  for h in range(NH) for i in range(HS // 2) for j in range(2))
    wcls = list(struct.unpack_from(f"<{V * D}f", m, len(m) - 4 * V * D))
    report(emb == values["model.embed_tokens.weight"] and perm_ok and wcls == values["lm_head.weight"],
           "model.bin: embeddings and classifier equal the fixture's values; wq's rows re-paired head by head",
           f"embeddings {emb == values['model.embed_tokens.weight']}, wq {perm_ok}, "
           f"classifier {wcls == values['lm_head.weight']}")
    with open(tok, "rb") as f:
        t = f.read()
    pos, pieces = 4, []
    while pos < len(t):
        _, n = struct.unpack_from("<fi", t, pos)
        pieces.append(t[pos + 8:pos + 8 + n])
        pos += 8 + n
    report(struct.unpack_from("<i", t)[0] == 1024 and len(pieces) == V and pieces[1] == b"<s>"
           and pieces[LONG_ID] == "\u00e9".encode() * 512 and pieces[3 + 0x41] == b"<0x41>",
           f"tokenizer.bin: max_token_length 1024, {len(pieces)} pieces, the long piece kept",
           f"max_token_length {struct.unpack_from('<i', t)[0]}, {len(pieces)} pieces")
    if kvt:
        rc, _, err = run([kvt, "-m", model, "-z", tok, "-n", "2", "-t", "0"])
        report(rc == 0, f"{kvt} -m model.bin -z tokenizer.bin -n 2 -t 0 loads and runs the export",
               f"exit {rc}: {err.strip()[-300:]}")
    # Over an existing pair: both replaced, nothing else left behind.
    out2 = os.path.join(base, "over")
    model2, tok2 = fresh_outputs(out2)
    rc, _, err = run([sys.executable, exporter, src, model2, tok2])
    same = rc == 0 and file_hash(model2) == file_hash(model) and file_hash(tok2) == file_hash(tok)
    report(same and sorted(os.listdir(out2)) == ["model.bin", "tokenizer.bin"],
           "an export over an existing pair replaces both and leaves no other file",
           f"exit {rc}, files {sorted(os.listdir(out2))}: {err.strip()[-200:]}")
    return file_hash(model), file_hash(tok)


def check_accepted(exporter, base, title, setup, hashes=None):
    """A variant that must still export (the refusals are not too broad)."""
    src = os.path.join(base, "in")
    out = os.path.join(base, "out")
    os.makedirs(out)
    setup(src, base)
    model, tok = os.path.join(out, "model.bin"), os.path.join(out, "tokenizer.bin")
    rc, _, err = run([sys.executable, exporter, src, model, tok])
    ok = rc == 0 and sorted(os.listdir(out)) == ["model.bin", "tokenizer.bin"]
    if ok and hashes:
        ok = (file_hash(model), file_hash(tok)) == hashes
    report(ok, f"accepted: {title}", f"exit {rc}: {err.strip()[-300:]}")


def export_variant(exporter, base, setup):
    """Export a variant of the fixture made by setup(src); (exit, stderr,
    model.bin bytes, tokenizer.bin bytes)."""
    src, out = os.path.join(base, "in"), os.path.join(base, "out")
    os.makedirs(out)
    setup(src)
    model, tok = os.path.join(out, "model.bin"), os.path.join(out, "tokenizer.bin")
    rc, _, err = run([sys.executable, exporter, src, model, tok])
    if rc != 0:
        return rc, err, None, None
    with open(model, "rb") as f, open(tok, "rb") as g:
        return rc, err, f.read(), g.read()


def check_theta(exporter, pristine, base):
    """rope_theta 500000 (refused before the extension existed): the header
    grows by "rope" + float32 theta, everything after it is the legacy
    export's bytes."""
    _, _, legacy, _ = export_variant(exporter, os.path.join(base, "theta-legacy"),
                                     lambda src: shutil.copytree(pristine, src))

    def setup(src):
        shutil.copytree(pristine, src)
        edit_json(os.path.join(src, "config.json"), lambda c: c.update(rope_theta=500000.0))

    rc, err, m, _ = export_variant(exporter, os.path.join(base, "theta"), setup)
    ok = rc == 0 and legacy is not None and m[:28] == legacy[:28] and m[28:32] == b"rope" and \
        struct.unpack_from("<f", m, 32)[0] == 500000.0 and m[36:] == legacy[28:]
    report(ok, "accepted: rope_theta 500000 -> the legacy header, b'rope', float32 500000, then the legacy file's "
           "tensors byte for byte", f"exit {rc}: {err.strip()[-300:]}")


def read_trailer(t, n):
    """tokenizer.bin -> (max_token_length, [(score, piece bytes)], BBPE
    fields (pre, bos, eos, pairs) or None, bytes left over)."""
    (maxlen,) = struct.unpack_from("<i", t)
    pos, recs = 4, []
    for _ in range(n):
        score, k = struct.unpack_from("<fi", t, pos)
        recs.append((score, t[pos + 8:pos + 8 + k]))
        pos += 8 + k
    if t[pos:pos + 4] != b"BBPE":
        return maxlen, recs, None, t[pos:]
    pre, bos, eos, nm = struct.unpack_from("<4i", t, pos + 4)
    pairs = struct.unpack_from(f"<{2 * nm}i", t, pos + 20)
    return maxlen, recs, (pre, bos, eos, pairs), t[pos + 20 + 8 * nm:]


def check_byte_level(exporter, pristine, base):
    """Byte-level tokenizer.json files export with the spec's trailer."""
    vocab = byte_level_vocab()
    pieces = {i: p for p, i in vocab.items()}
    want_pieces = [(0.0, (pieces.get(i) or f"<unused{i}>").encode()) for i in range(V)]
    pairs = tuple(x for m in BL_MERGES for x in (vocab[m.split(" ")[0] if isinstance(m, str) else m[0]],
                                                 vocab[m.split(" ")[1] if isinstance(m, str) else m[1]]))
    template = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                         {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [], "special_tokens": {}}
    for k, (title, pre, edit, want) in enumerate([
            ("SmolLM2's layout (Sequence [Digits(individual_digits), ByteLevel]), ByteLevel post_processor, "
             "eos_token <|im_end|>", "smollm", None, (2, -1, 2)),
            ("GPT-2's (ByteLevel alone), a TemplateProcessing that prepends <|endoftext|>, no eos_token: "
             "config.json's eos_token_id", "gpt2", template, (1, 0, 2))]):
        def setup(src):
            shutil.copytree(pristine, src)
            make_byte_level(src, pre)
            if edit:
                edit_json(os.path.join(src, "tokenizer.json"), lambda t: t.update(post_processor=edit))
                dump(os.path.join(src, "tokenizer_config.json"), {"tokenizer_class": "GPT2Tokenizer"})

        rc, err, _, t = export_variant(exporter, os.path.join(base, f"bl{k}"), setup)
        if rc != 0:
            report(False, f"accepted: byte-level, {title}", f"exit {rc}: {err.strip()[-300:]}")
            continue
        maxlen, recs, trailer, rest = read_trailer(t, V)
        report(maxlen == max(len(p) for _, p in want_pieces) and recs == want_pieces,
               f"byte-level, {title}: max_token_length {maxlen}, {V} records of score 0.0, the pieces as in "
               "tokenizer.json (GPT-2's byte symbols, <unusedN> in the holes)", f"max_token_length {maxlen}")
        report(trailer is not None and trailer[:3] == want and trailer[3] == pairs and rest == b"",
               f"byte-level, {title}: trailer BBPE, pre {want[0]}, bos {want[1]}, eos {want[2]}, "
               f"{len(BL_MERGES)} merges as id pairs, then the end of the file",
               f"trailer {trailer and trailer[:3]}, pairs equal {trailer is not None and trailer[3] == pairs}, "
               f"{len(rest)} bytes after it")


def cases():
    """(title, setup, expected substrings). setup(src, base, outs) breaks the
    fresh copy src (base is the case's scratch directory) and returns the
    exporter's two output paths (outs: the old pair's paths, the default)."""
    s1, s2 = SHARD1, SHARD2
    js = lambda name, fn: lambda src, base, outs: (edit_json(os.path.join(src, name), fn), outs)[1]
    text = lambda name, t: lambda src, base, outs: (write_text(os.path.join(src, name), t), outs)[1]
    hdr = lambda shard, fn: lambda src, base, outs: (edit_header(os.path.join(src, shard), fn), outs)[1]
    cfg = lambda **kv: js("config.json", lambda c: c.update(kv))

    def same_twice(src, base, outs):
        return outs[0], outs[0]

    def same_spelled(src, base, outs):
        folder = os.path.dirname(outs[0])
        return outs[0], os.path.join(folder, "..", os.path.basename(folder), "model.bin")

    def into_shard(src, base, outs):
        return os.path.join(src, s1), outs[1]

    def into_folder(src, base, outs):
        return os.path.join(src, "model.bin"), outs[1]

    def device(src, base, outs):
        os.unlink(outs[0])
        os.mknod(outs[0], 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers, in our own folder
        return outs

    def fifo(src, base, outs):
        os.unlink(outs[0])
        os.mkfifo(outs[0])
        return outs

    def symlink(src, base, outs):
        os.rename(outs[0], outs[0] + ".real")
        os.symlink(os.path.basename(outs[0]) + ".real", outs[0])
        return outs

    def dangling(src, base, outs):
        os.unlink(outs[1])
        os.symlink("nowhere.bin", outs[1])
        return outs

    def directory(src, base, outs):
        os.unlink(outs[0])
        os.mkdir(outs[0])
        return outs

    def no_folder(src, base, outs):
        return os.path.join(os.path.dirname(outs[0]), "none", "model.bin"), outs[1]

    def blob_output(src, base, outs):  # Hugging Face's cache: the shards are links to blobs elsewhere
        blobs = os.path.join(base, "blobs")
        os.mkdir(blobs)
        os.rename(os.path.join(src, s2), os.path.join(blobs, "b2"))
        os.symlink(os.path.join(blobs, "b2"), os.path.join(src, s2))
        return os.path.join(blobs, "b2"), outs[1]

    def shard_elsewhere(name, where):
        def setup(src, base, outs):
            target = os.path.normpath(os.path.join(src, name))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(os.path.join(src, s2), target)
            edit_json(os.path.join(src, INDEX),
                      lambda x: x["weight_map"].update({k: name for k, v in x["weight_map"].items() if v == s2}))
            return outs
        return setup

    def no_lm_head(drop_field):
        def setup(src, base, outs):
            edit_header(os.path.join(src, s2), lambda h: h.pop("lm_head.weight"))
            edit_json(os.path.join(src, INDEX), lambda x: x["weight_map"].pop("lm_head.weight"))
            edit_json(os.path.join(src, "config.json"),
                      lambda c: c.pop("tie_word_embeddings") if drop_field else None)
            return outs
        return setup

    def overlap(h):
        h["model.layers.0.self_attn.v_proj.weight"]["data_offsets"] = \
            h["model.layers.0.self_attn.k_proj.weight"]["data_offsets"]

    def piece(i, new):
        def fn(t):
            vocab = t["model"]["vocab"]
            old = next(p for p, j in vocab.items() if j == i)
            del vocab[old]
            vocab[new] = i
        return js("tokenizer.json", fn)

    def nested(src, base, outs):
        write_text(os.path.join(src, "config.json"), "[" * 100000 + "]" * 100000)
        return outs

    def duplicate_key(src, base, outs):
        path = os.path.join(src, "config.json")
        with open(path) as f:
            t = f.read()
        write_text(path, t.replace('"hidden_size": 32', '"hidden_size": 32, "hidden_size": 64'))
        return outs

    def header_length(delta):
        def setup(src, base, outs):
            path = os.path.join(src, s2)
            with open(path, "rb") as f:
                raw = bytearray(f.read())
            (n,) = struct.unpack_from("<Q", raw)
            struct.pack_into("<Q", raw, 0, len(raw) - 8 + 1 if delta is None else n + delta)
            write_text(path, bytes(raw))
            return outs
        return setup

    def short_file(src, base, outs):
        write_text(os.path.join(src, s2), b"\x10\0\0")
        return outs

    def bad_header_json(src, base, outs):
        _, data = read_safetensors(os.path.join(src, s2))
        write_raw_safetensors(os.path.join(src, s2), b'{"lm_head.weight": {"dtype": "F32", ', data)
        return outs

    def entry(tensor, key, value):
        return hdr(s2 if tensor in ("lm_head.weight", "model.norm.weight") else s1,
                   lambda h: h[tensor].update({key: value}) if value is not None else h[tensor].pop(key))

    def past_end(h):  # the last tensor written runs past the end of its file
        b, e = h["lm_head.weight"]["data_offsets"]
        h["lm_head.weight"]["data_offsets"] = [b + 4, e + 4]

    def missing_tensor(src, base, outs):
        edit_header(os.path.join(src, s2), lambda h: h.pop("model.norm.weight"))
        edit_json(os.path.join(src, INDEX), lambda x: x["weight_map"].pop("model.norm.weight"))
        return outs

    def remove(*names):
        def setup(src, base, outs):
            for n in names:
                os.unlink(os.path.join(src, n))
            return outs
        return setup

    def twice(src, base, outs):
        add_tensor(os.path.join(src, s1), "model.norm.weight", "F32", [D], encode([1.0] * D, "F32"))
        return outs

    def retype(tensor, dtype, shape):
        def setup(src, base, outs):
            path = os.path.join(src, s2)
            header, data = read_safetensors(path)
            count = 1
            for d in shape:
                count *= d
            size = count * (8 if dtype == "F64" else 4)
            header[tensor] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + size]}
            write_raw_safetensors(path, json.dumps(header).encode(), data + encode([0.5] * count, dtype))
            return outs
        return setup

    def bias(src, base, outs):
        add_tensor(os.path.join(src, s1), "model.layers.0.self_attn.q_proj.bias", "F32", [D],
                   encode([0.0] * D, "F32"))
        return outs

    def no_input(src, base, outs):
        shutil.rmtree(src)
        return outs

    def bl(fn=None, pre="smollm", config=None):
        """A byte-level copy, then fn(tokenizer.json) / config(tokenizer_config.json)."""
        def setup(src, base, outs):
            make_byte_level(src, pre)
            if fn:
                edit_json(os.path.join(src, "tokenizer.json"), fn)
            if config:
                edit_json(os.path.join(src, "tokenizer_config.json"), config)
            return outs
        return setup

    def set_pre(p):
        return bl(lambda t: t.update(pre_tokenizer=p))

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    llama3_pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)"}, "behavior": "Isolated", "invert": False},
        byte_level]}

    t = "tokenizer.json"
    return [
        # item 3: the outputs
        ("the two outputs are the same path", same_twice, ["model.bin", "same file"]),
        ("the two outputs are the same file, spelled two ways", same_spelled, ["model.bin", "same file"]),
        ("the model output is an input shard", into_shard, [s1, "model's folder"]),
        ("an output inside the input folder", into_folder, ["model.bin", "model's folder"]),
        ("the model output is a character device (mknod 1,3: /dev/null's numbers)", device,
         ["model.bin", "not a regular file"]),
        ("the model output is a named pipe", fifo, ["model.bin", "not a regular file"]),
        ("the model output is a symlink to a regular file", symlink, ["model.bin", "symbolic link"]),
        ("the tokenizer output is a dangling symlink", dangling, ["tokenizer.bin", "symbolic link"]),
        ("the model output is a directory", directory, ["model.bin", "directory"]),
        ("the model output's directory does not exist", no_folder, ["model.bin", "does not exist"]),
        ("the model output is a shard's blob, reached through a symlink in the folder", blob_output,
         ["b2", "input files"]),
        # item 6: what kvt refuses (its limits)
        ("max_position_embeddings above KVT_LIMIT_SEQ (2^20)", cfg(max_position_embeddings=(1 << 20) + 1),
         ["config.json", "max_position_embeddings", "KVT_LIMIT_SEQ"]),
        ("a head size above KVT_MAX_HS (256)", cfg(hidden_size=1024, num_attention_heads=2, num_key_value_heads=1),
         ["config.json", "hidden_size", "KVT_MAX_HS"]),
        ("num_hidden_layers above KVT_LIMIT_LAYERS", cfg(num_hidden_layers=1025),
         ["config.json", "num_hidden_layers"]),
        ("hidden_size above KVT_LIMIT_DIM", cfg(hidden_size=65537 * 4), ["config.json", "hidden_size"]),
        ("intermediate_size above 16 * KVT_LIMIT_DIM", cfg(intermediate_size=16 * 65536 + 1),
         ["config.json", "intermediate_size"]),
        ("vocab_size above KVT_LIMIT_VOCAB", cfg(vocab_size=(1 << 22) + 1), ["config.json", "vocab_size"]),
        ("vocab_size below the 259 fixed pieces", cfg(vocab_size=200), ["config.json", "vocab_size"]),
        ("a piece of 1,025 bytes (kvt's loader takes 1,024)", piece(LONG_ID, "\u00e9" * 512 + "x"),
         [t, f"id {LONG_ID}", "1025 bytes"]),
        ("a piece with a NUL character", piece(NUL_ID, "c\u0000d"), [t, f"id {NUL_ID}", "NUL"]),
        ("a piece that is a lone surrogate", piece(SURROGATE_ID, "\ud800"), [t, f"id {SURROGATE_ID}"]),
        # item 6: what contradicts itself
        ("overlapping data_offsets", hdr(s1, overlap),
         [s1, "k_proj.weight", "v_proj.weight", "overlap"]),
        ("tie_word_embeddings false and no lm_head.weight", no_lm_head(False),
         ["config.json", "tie_word_embeddings", "lm_head.weight"]),
        ("no tie_word_embeddings (transformers: false) and no lm_head.weight", no_lm_head(True),
         ["config.json", "tie_word_embeddings", "lm_head.weight"]),
        ("a shard named ../x.safetensors (a real file there)", shard_elsewhere("../x.safetensors", None),
         [INDEX, "weight_map", "../x.safetensors"]),
        ("a shard named a/b.safetensors (a real file there)", shard_elsewhere("a/b.safetensors", None),
         [INDEX, "weight_map", "a/b.safetensors"]),
        ("num_key_value_heads 0", cfg(num_key_value_heads=0), ["config.json", "num_key_value_heads"]),
        ("num_key_value_heads -2", cfg(num_key_value_heads=-2), ["config.json", "num_key_value_heads"]),
        ("a tensor in two shards", twice, ["model.norm.weight", s1, s2]),
        ("the index puts a tensor in a shard that lacks it",
         js(INDEX, lambda x: x["weight_map"].update({"model.norm.weight": s1})), [INDEX, "model.norm.weight"]),
        ("two pieces with one id", js(t, lambda x: x["model"]["vocab"].update({"zz": 5})), [t, "id 5"]),
        ("an added token whose id disagrees with model.vocab",
         js(t, lambda x: x["added_tokens"][1].update({"id": 7})), [t, "added_tokens[1]"]),
        ("a piece id at vocab_size", js(t, lambda x: x["model"]["vocab"].update({"zz": V})), [t, "vocab_size"]),
        ("a used tensor stored as F64", retype("model.norm.weight", "F64", [D]), [s2, "model.norm.weight", "F64"]),
        ("a bias tensor", bias, [s1, "q_proj.bias"]),
        # RoPE: any finite base above 1 is exported (the extension); scaling is not
        ("rope_theta 0.5", cfg(rope_theta=0.5), ["config.json", "rope_theta", "above 1"]),
        ("rope_theta -10000", cfg(rope_theta=-10000.0), ["config.json", "rope_theta"]),
        ("rope_theta 1e39 (no float32 holds it)", cfg(rope_theta=1e39), ["config.json", "rope_theta"]),
        ("rope_theta and rope_parameters.rope_theta disagree",
         cfg(rope_theta=10000.0, rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}),
         ["config.json", "rope_parameters.rope_theta", "disagree"]),
        ("rope_parameters.rope_type linear", cfg(rope_parameters={"rope_theta": 10000.0, "rope_type": "linear"}),
         ["config.json", "rope_parameters.rope_type"]),
        ("rope_scaling yarn", cfg(rope_scaling={"rope_type": "yarn", "factor": 4.0}), ["config.json", "rope_scaling"]),
        # byte-level vocabularies: what kvt's encoder would split or merge differently
        ("no byte fallback and no pre_tokenizer", js(t, lambda x: x["model"].update(byte_fallback=False)),
         [t, "byte_fallback", "pre_tokenizer is null"]),
        ("a byte-level vocabulary split by Llama 3's regex (Split, ByteLevel)", set_pre(llama3_pre),
         [t, "byte_fallback", "Sequence [Split, ByteLevel]"]),
        ("Digits(individual_digits=false) before ByteLevel",
         set_pre({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": False},
                                                        dict(byte_level, use_regex=True)]}),
         [t, "pre_tokenizer is Sequence [Digits, ByteLevel]"]),
        ("ByteLevel with add_prefix_space true", set_pre(dict(byte_level, use_regex=True, add_prefix_space=True)),
         [t, "pre_tokenizer.add_prefix_space"]),
        ("ByteLevel with use_regex false", set_pre(byte_level), [t, "pre_tokenizer.use_regex"]),
        ("a byte-level vocabulary with an NFC normalizer", bl(lambda x: x.update(normalizer={"type": "NFC"})),
         [t, "normalizer is NFC"]),
        ("model.ignore_merges true", bl(lambda x: x["model"].update(ignore_merges=True)),
         [t, "model.ignore_merges"]),
        ("a byte-level merge whose result is not in the vocabulary",
         bl(lambda x: x["model"]["merges"].append("t t")), [t, "model.merges[10]", "result", '"tt"']),
        ("a byte-level merge whose side is not in the vocabulary",
         bl(lambda x: x["model"]["merges"].append(["<nope>", "t"])), [t, "model.merges[10]", '"<nope>"']),
        ("a byte-level merge string with two spaces", bl(lambda x: x["model"]["merges"].append("a b c")),
         [t, "model.merges[10]"]),
        ("eos_token not in the vocabulary", bl(config=lambda c: c.update(eos_token="</s>")),
         ["tokenizer_config.json", "eos_token", "</s>"]),
        ("no eos_token and no eos_token_id",
         lambda src, base, outs: (bl(config=lambda c: c.pop("eos_token"))(src, base, outs),
                                  edit_json(os.path.join(src, "config.json"), lambda c: c.pop("eos_token_id")),
                                  outs)[2], ["config.json", "eos_token_id"]),
        ("a post_processor that appends EOS",
         bl(lambda x: x.update(post_processor={"type": "TemplateProcessing", "single": [
             {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}]})),
         [t, "post_processor.single"]),
        ("a RobertaProcessing post_processor", bl(lambda x: x.update(post_processor={"type": "RobertaProcessing"})),
         [t, "post_processor is RobertaProcessing"]),
        ("add_bos_token true, but the post_processor adds no BOS", bl(config=lambda c: c.update(add_bos_token=True)),
         ["tokenizer_config.json", "add_bos_token"]),
        ("a hole's <unusedN> spelled like a real piece",
         bl(lambda x: x["model"]["vocab"].update({"<unused290>": 280})), [t, "pieces 280 and 290", "same string"]),
        # malformed: bad JSON in every JSON file
        ("bad JSON in config.json", text("config.json", "{\"hidden_size\": 32,"), ["config.json", "JSON"]),
        ("bad JSON in the index", text(INDEX, "{\"weight_map\": "), [INDEX, "JSON"]),
        ("bad JSON in tokenizer.json", text(t, "{\"model\": [}"), [t, "JSON"]),
        ("bad JSON in tokenizer_config.json", text("tokenizer_config.json", "{'bos_token': '<s>'}"),
         ["tokenizer_config.json", "JSON"]),
        ("bad JSON in a safetensors header", bad_header_json, [s2, "JSON"]),
        ("config.json is not UTF-8", text("config.json", b"{\"hidden_size\": \xff}"), ["config.json", "JSON"]),
        ("config.json nested 100,000 deep", nested, ["config.json", "JSON"]),
        ("config.json is an array", text("config.json", "[1, 2]"), ["config.json", "object"]),
        ("config.json gives hidden_size twice", duplicate_key, ["config.json", "hidden_size", "twice"]),
        # malformed: wrong types
        ("hidden_size a string", cfg(hidden_size="32"), ["config.json", "hidden_size"]),
        ("hidden_size true", cfg(hidden_size=True), ["config.json", "hidden_size"]),
        ("hidden_size 32.0", cfg(hidden_size=32.0), ["config.json", "hidden_size"]),
        ("num_key_value_heads a string", cfg(num_key_value_heads="2"), ["config.json", "num_key_value_heads"]),
        ("rope_theta a string", cfg(rope_theta="10000"), ["config.json", "rope_theta"]),
        ("rms_norm_eps null", cfg(rms_norm_eps=None), ["config.json", "rms_norm_eps"]),
        ("rope_parameters an array", cfg(rope_parameters=[10000.0]), ["config.json", "rope_parameters"]),
        ("tie_word_embeddings the string \"no\"", cfg(tie_word_embeddings="no"),
         ["config.json", "tie_word_embeddings"]),
        ("attention_bias the string \"false\"", cfg(attention_bias="false"), ["config.json", "attention_bias"]),
        ("weight_map an array", js(INDEX, lambda x: x.update({"weight_map": [s1, s2]})), [INDEX, "weight_map"]),
        ("a weight_map shard name that is a number", js(INDEX, lambda x: x["weight_map"].update(
            {"model.norm.weight": 2})), [INDEX, "model.norm.weight"]),
        ("model.vocab an array", js(t, lambda x: x["model"].update({"vocab": ["<unk>"]})), [t, "model.vocab"]),
        ("a piece id a string", js(t, lambda x: x["model"]["vocab"].update({"he": "268"})), [t, "model.vocab"]),
        ("a merge that is a number", js(t, lambda x: x["model"]["merges"].append(7)), [t, "model.merges[7]"]),
        ("a merge string without a space", js(t, lambda x: x["model"]["merges"].append("ab")),
         [t, "model.merges[7]"]),
        ("added_tokens an object", js(t, lambda x: x.update({"added_tokens": {"id": 0}})), [t, "added_tokens"]),
        ("a tensor's shape a string", entry("model.layers.0.self_attn.q_proj.weight", "shape", "[32, 32]"),
         [s1, "q_proj.weight", "shape"]),
        ("a tensor's data_offsets floats", entry("model.layers.1.self_attn.o_proj.weight", "data_offsets",
                                                 [0.0, 4096.0]), [s1, "o_proj.weight", "data_offsets"]),
        ("a tensor's dtype a number", entry("model.norm.weight", "dtype", 16), [s2, "model.norm.weight", "dtype"]),
        ("a safetensors header that is an array", lambda src, base, outs: (write_raw_safetensors(
            os.path.join(src, s2), b"[1, 2]", b""), outs)[1], [s2, "object"]),
        # malformed: a header length that lies, offsets that do not fit
        ("a header length past the end of the file", header_length(None), [s2, "header length"]),
        ("a header length 8 bytes short (cuts the JSON)", header_length(-8), [s2, "JSON"]),
        ("a shard of 3 bytes", short_file, [s2, "8 bytes"]),
        ("data_offsets of the last tensor past the end of its file (a late failure)", hdr(s2, past_end),
         [s2, "lm_head.weight", "data_offsets"]),
        ("data_offsets that disagree with shape and dtype",
         entry("model.norm.weight", "shape", [D + 1]), [s2, "model.norm.weight", "data_offsets"]),
        ("data_offsets begin > end", entry("model.layers.0.self_attn.o_proj.weight", "data_offsets", [64, 0]),
         [s1, "o_proj.weight", "data_offsets"]),
        ("the last tensor written has the wrong shape (a late failure)",
         retype("lm_head.weight", "F32", [V, D + 1]), [s2, "lm_head.weight", "shape"]),
        # malformed: missing keys and files
        ("config.json without hidden_size", js("config.json", lambda c: c.pop("hidden_size")),
         ["config.json", "hidden_size"]),
        ("config.json without vocab_size", js("config.json", lambda c: c.pop("vocab_size")),
         ["config.json", "vocab_size"]),
        ("the index without weight_map", js(INDEX, lambda x: x.pop("weight_map")), [INDEX, "weight_map"]),
        ("tokenizer.json without model", js(t, lambda x: x.pop("model")), [t, "model"]),
        ("tokenizer.json without model.vocab", js(t, lambda x: x["model"].pop("vocab")), [t, "model.vocab"]),
        ("a tensor entry without dtype", entry("model.norm.weight", "dtype", None),
         [s2, "model.norm.weight", "dtype"]),
        ("a tensor in no shard", missing_tensor, [INDEX, "model.norm.weight"]),
        ("a missing shard", remove(s2), [s2, "missing"]),
        ("no config.json", remove("config.json"), ["config.json", "missing"]),
        ("no tokenizer.json", remove(t), [t, "missing"]),
        ("no weights at all", remove(INDEX, s1, s2), ["model.safetensors"]),
        ("no input folder", no_input, ["/in: no such directory"]),
    ]


INJECT = """
import errno, importlib.util, os, sys
mode, path = sys.argv[1:3]
spec = importlib.util.spec_from_file_location("export_hf", path)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
if mode == "read":  # the last tensor cannot be read: the failure comes mid-write
    read = m.SafeTensors.read_f32
    def failing_read(self, name, shape):
        if name == "lm_head.weight":
            raise OSError(errno.EIO, "injected read error")
        return read(self, name, shape)
    m.SafeTensors.read_f32 = failing_read
else:  # the second rename into place fails: the first must be undone
    replace, calls = os.replace, []
    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, "injected rename error", src)
        return replace(src, dst)
    os.replace = failing_replace
sys.exit(m.main(["export_hf.py"] + sys.argv[3:]))
"""


def main(argv):
    args = argv[1:]
    exporter = os.path.join(HERE, "export_hf.py")
    if "--exporter" in args:
        i = args.index("--exporter")
        exporter = os.path.abspath(args[i + 1])
        del args[i:i + 2]
    kvt = os.path.abspath(args[0]) if args else None
    scratch = tempfile.mkdtemp(prefix="kvt_check_export_")
    try:
        pristine = os.path.join(scratch, "pristine")
        values = build_fixture(pristine)
        hashes = check_valid_export(exporter, pristine, scratch, values, kvt)
        check_theta(exporter, pristine, scratch)
        check_byte_level(exporter, pristine, scratch)

        def copy_fixture(src, base):
            shutil.copytree(pristine, src, symlinks=True)

        def single_tied(src, base):
            copy_fixture(src, base)
            tensors = []
            for shard in (SHARD1, SHARD2):
                header, data = read_safetensors(os.path.join(src, shard))
                for name, e in header.items():
                    if name not in ("__metadata__", "lm_head.weight"):
                        b, end = e["data_offsets"]
                        tensors.append((name, e["dtype"], e["shape"], data[b:end]))
                os.unlink(os.path.join(src, shard))
            os.unlink(os.path.join(src, INDEX))
            write_safetensors(os.path.join(src, "model.safetensors"), tensors)
            edit_json(os.path.join(src, "config.json"), lambda c: c.update(tie_word_embeddings=True))

        def linked_shards(src, base):  # Hugging Face's cache: shards are links to blobs outside the folder
            copy_fixture(src, base)
            os.mkdir(os.path.join(base, "blobs"))
            for shard in (SHARD1, SHARD2):
                blob = os.path.join(base, "blobs", shard + ".blob")
                os.rename(os.path.join(src, shard), blob)
                os.symlink(os.path.relpath(blob, src), os.path.join(src, shard))

        for k, (title, setup, want) in enumerate([("linked", linked_shards, hashes),
                                                  ("tied", single_tied, None),
                                                  ("copy", copy_fixture, hashes)]):
            label = {"linked": "shards that are symlinks to blobs outside the folder (Hugging Face's cache)",
                     "tied": "one model.safetensors, tie_word_embeddings true, no lm_head.weight",
                     "copy": "a copy of the fixture (the same bytes as the first export)"}[title]
            check_accepted(exporter, os.path.join(scratch, f"ok{k}"), label, setup, want)

        for k, (title, setup, want) in enumerate(cases()):
            base = os.path.join(scratch, f"case{k:02d}")
            src, out = os.path.join(base, "in"), os.path.join(base, "out")
            shutil.copytree(pristine, src)
            outs = fresh_outputs(out)
            try:
                model, tok = setup(src, base, outs)
            except OSError as e:  # e.g. mknod not permitted here: say so, count nothing
                print(f"SKIP {title}: cannot set it up here ({e.strerror})")
                continue
            watch = [base]  # the input copy, the old pair, any file a case put beside them
            expect_refusal(title, [sys.executable, exporter, src, model, tok], want, watch)

        for mode, title, want in (
                ("read", "a read error on the last tensor, mid-write (injected): temporaries removed",
                 ["model.bin", "injected read error"]),
                ("rename", "the second rename into place fails (injected): the first is undone",
                 ["tokenizer.bin: renaming", "injected rename error", "model.bin restored"])):
            base = os.path.join(scratch, "inject-" + mode)
            src, out = os.path.join(base, "in"), os.path.join(base, "out")
            shutil.copytree(pristine, src)
            model, tok = fresh_outputs(out)
            expect_refusal(title, [sys.executable, "-c", INJECT, mode, exporter, src, model, tok], want, [base])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{n_pass} passed, {n_fail} failed")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
