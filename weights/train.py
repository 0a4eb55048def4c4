#!/usr/bin/env python3
"""
train.py -- train a tiny character-level Llama model on Tiny Shakespeare and
export it for kvtransformer (llama2.c legacy "version 0" checkpoint format).

What this script does, in order:
  1. reads the corpus, builds the character vocabulary and writes tokenizer.bin
  2. trains the model (AdamW, linear warmup + cosine decay, fixed seed)
  3. writes model.bin (fp32, llama2.c legacy layout, unshared classifier)
  4. reloads model.bin and, with those exact fp32 weights:
       - computes the held-out loss the same way kvtransformer's perplexity
         mode does and writes it to heldout_loss.txt
       - writes testvec.txt (token ids + fp32 logits of a short prompt)
       - cross-checks the batched PyTorch forward against a naive one-token-
         at-a-time NumPy forward with a KV cache (the way run.c computes it)
       - prints a short generated sample

With --eval-only, steps 1-3 are skipped (the vocabulary is still rebuilt from
the corpus) and step 4 runs on an existing model.bin.

Vocabulary (the C side relies on this exact layout):
  id 0 = "<unk>", id 1 = "<s>" (BOS), id 2 = "</s>",
  id 3 + k = k-th character of sorted(set(corpus)) (sorted by byte value).
A text is fed to the model as [BOS] + [3 + index(c) for c in text].
"""

import argparse
import math
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

BOS = 1
NUM_SPECIAL = 3  # <unk>, <s>, </s>


# ---------------------------------------------------------------------------
# Corpus and tokenizer
# ---------------------------------------------------------------------------

def load_corpus(path):
    """Return (text, chars, train_text, heldout_text). The split is by bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    text = raw.decode("ascii")  # the corpus is pure ASCII, so 1 byte = 1 char
    chars = sorted(set(text))   # sorted by code point == sorted by byte value
    n = len(text)
    split = int(0.9 * n)
    return text, chars, text[:split], text[split:]


def encode(text, chars):
    """Characters -> token ids (no BOS)."""
    index = {c: i for i, c in enumerate(chars)}
    return [NUM_SPECIAL + index[c] for c in text]


def token_strings(chars):
    """The V token strings in id order, as bytes."""
    return [b"<unk>", b"<s>", b"</s>"] + [c.encode("ascii") for c in chars]


def write_tokenizer(path, chars):
    """llama2.c tokenizer.bin: int32 max_token_length, then for every token
    float32 score, int32 len, len bytes (no terminating NUL)."""
    toks = token_strings(chars)
    max_len = max(len(t) for t in toks)
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max_len))
        for t in toks:
            f.write(struct.pack("<fi", 0.0, len(t)))
            f.write(t)


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------

def rope_tables(seq_len, head_size):
    """cos/sin tables of shape (seq_len, head_size/2), as llama2.c uses them:
    freq_i = 1 / 10000^(2i/HS), angle = pos * freq_i.
    Computed in float64 and rounded once to float32. The model uses exactly
    these float32 values, and the same values are written into model.bin."""
    i = np.arange(head_size // 2, dtype=np.float64)
    freq = 1.0 / (10000.0 ** (2.0 * i / head_size))
    pos = np.arange(seq_len, dtype=np.float64)
    angle = np.outer(pos, freq)
    return (np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32))


def apply_rope(x, cos, sin):
    """Rotate adjacent channel pairs (2i, 2i+1) inside every head.
    x: (B, T, H, HS); cos, sin: (T, HS/2).
    (a, b) -> (a*cos - b*sin, a*sin + b*cos)."""
    a = x[..., 0::2]
    b = x[..., 1::2]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    ra = a * c - b * s
    rb = a * s + b * c
    # interleave back: (..., HS/2, 2) -> (..., HS)
    return torch.stack((ra, rb), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """One decoder layer: pre-norm GQA attention + pre-norm SwiGLU FFN."""

    def __init__(self, dim, hidden_dim, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_size = dim // n_heads
        kv_dim = n_kv_heads * self.head_size
        self.attention_norm = RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_dim, bias=False)
        self.wv = nn.Linear(dim, kv_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        HS = self.head_size
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, self.n_heads, HS)
        k = self.wk(h).view(B, T, self.n_kv_heads, HS)
        v = self.wv(h).view(B, T, self.n_kv_heads, HS)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        # Grouped-query attention: query head h reads kv head h // group,
        # i.e. every kv head is repeated `group` times in a row.
        group = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
        # (B, H, T, HS) for attention; causal, scale 1/sqrt(HS) (the default)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        att = att.transpose(1, 2).reshape(B, T, D)
        x = x + self.wo(att)
        h = self.ffn_norm(x)
        x = x + self.w2(F.silu(self.w1(h)) * self.w3(h))
        return x


class Llama(nn.Module):
    def __init__(self, vocab_size, dim, hidden_dim, n_layers, n_heads,
                 n_kv_heads, seq_len):
        super().__init__()
        assert dim % n_heads == 0 and n_heads % n_kv_heads == 0
        self.cfg = dict(dim=dim, hidden_dim=hidden_dim, n_layers=n_layers,
                        n_heads=n_heads, n_kv_heads=n_kv_heads,
                        vocab_size=vocab_size, seq_len=seq_len)
        head_size = dim // n_heads
        assert head_size % 2 == 0
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(
            [Block(dim, hidden_dim, n_heads, n_kv_heads) for _ in range(n_layers)])
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)  # unshared wcls
        cos, sin = rope_tables(seq_len, head_size)
        self.register_buffer("rope_cos", torch.from_numpy(cos), persistent=False)
        self.register_buffer("rope_sin", torch.from_numpy(sin), persistent=False)
        self._init_weights(n_layers)

    def _init_weights(self, n_layers):
        # GPT-2 style: N(0, 0.02), residual output projections scaled down.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("wo.weight") or name.endswith("w2.weight"):
                    std = 0.02 / math.sqrt(2 * n_layers)
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx):
        """idx: (B, T) token ids at positions 0..T-1 -> logits (B, T, V)."""
        T = idx.shape[1]
        x = self.tok_embeddings(idx)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


# ---------------------------------------------------------------------------
# Export / import of the llama2.c legacy (version 0) checkpoint
# ---------------------------------------------------------------------------

def export_model(model, path):
    """Header: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
    -vocab_size (negative = unshared classifier), seq_len), then fp32 tensors
    in llama2.c legacy order. Weight matrices are (out, in), row-major."""
    c = model.cfg
    L = c["n_layers"]
    layers = model.layers

    def cat(get):  # stack one tensor over all layers
        return torch.stack([get(l) for l in layers])

    tensors = [
        model.tok_embeddings.weight,                 # (V, D)
        cat(lambda l: l.attention_norm.weight),      # (L, D)
        cat(lambda l: l.wq.weight),                  # (L, D, D)
        cat(lambda l: l.wk.weight),                  # (L, KVD, D)
        cat(lambda l: l.wv.weight),                  # (L, KVD, D)
        cat(lambda l: l.wo.weight),                  # (L, D, D)
        cat(lambda l: l.ffn_norm.weight),            # (L, D)
        cat(lambda l: l.w1.weight),                  # (L, HD, D)
        cat(lambda l: l.w2.weight),                  # (L, D, HD)
        cat(lambda l: l.w3.weight),                  # (L, HD, D)
        model.norm.weight,                           # (D,)
        model.rope_cos,                              # (TMAX, HS/2)
        model.rope_sin,                              # (TMAX, HS/2)
        model.output.weight,                         # (V, D)
    ]
    assert len(layers) == L
    n_floats = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", c["dim"], c["hidden_dim"], L, c["n_heads"],
                            c["n_kv_heads"], -c["vocab_size"], c["seq_len"]))
        for t in tensors:
            a = t.detach().cpu().to(torch.float32).contiguous().numpy()
            f.write(a.astype("<f4").tobytes())
            n_floats += a.size
    assert os.path.getsize(path) == 28 + 4 * n_floats
    return n_floats


def read_checkpoint(path):
    """Parse model.bin into (cfg dict, dict of numpy float32 arrays)."""
    with open(path, "rb") as f:
        data = f.read()
    D, HD, L, NH, NKV, V, T = struct.unpack("<7i", data[:28])
    shared = V > 0
    V = abs(V)
    HS = D // NH
    KVD = NKV * HS
    shapes = [
        ("tok_embeddings", (V, D)), ("rms_att", (L, D)), ("wq", (L, D, D)),
        ("wk", (L, KVD, D)), ("wv", (L, KVD, D)), ("wo", (L, D, D)),
        ("rms_ffn", (L, D)), ("w1", (L, HD, D)), ("w2", (L, D, HD)),
        ("w3", (L, HD, D)), ("rms_final", (D,)),
        ("freq_cis_real", (T, HS // 2)), ("freq_cis_imag", (T, HS // 2)),
    ]
    if not shared:
        shapes.append(("wcls", (V, D)))
    flat = np.frombuffer(data, dtype="<f4", offset=28)
    w, off = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        w[name] = flat[off:off + n].reshape(shape).astype(np.float32)
        off += n
    assert off == flat.size, "model.bin has an unexpected size"
    if shared:
        w["wcls"] = w["tok_embeddings"]
    cfg = dict(dim=D, hidden_dim=HD, n_layers=L, n_heads=NH, n_kv_heads=NKV,
               vocab_size=V, seq_len=T)
    return cfg, w


def load_model(path):
    """Build a float32 Llama from model.bin (eval mode)."""
    cfg, w = read_checkpoint(path)
    model = Llama(**cfg)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(t(w["tok_embeddings"]))
        for i, l in enumerate(model.layers):
            l.attention_norm.weight.copy_(t(w["rms_att"][i]))
            l.wq.weight.copy_(t(w["wq"][i]))
            l.wk.weight.copy_(t(w["wk"][i]))
            l.wv.weight.copy_(t(w["wv"][i]))
            l.wo.weight.copy_(t(w["wo"][i]))
            l.ffn_norm.weight.copy_(t(w["rms_ffn"][i]))
            l.w1.weight.copy_(t(w["w1"][i]))
            l.w2.weight.copy_(t(w["w2"][i]))
            l.w3.weight.copy_(t(w["w3"][i]))
        model.norm.weight.copy_(t(w["rms_final"]))
        model.output.weight.copy_(t(w["wcls"]))
    # The model's own RoPE tables must be the ones stored in the file.
    assert np.array_equal(model.rope_cos.numpy(), w["freq_cis_real"])
    assert np.array_equal(model.rope_sin.numpy(), w["freq_cis_imag"])
    model.eval()
    return model, w


# ---------------------------------------------------------------------------
# Evaluation (same definition as kvtransformer's perplexity mode)
# ---------------------------------------------------------------------------

@torch.no_grad()
def heldout_loss(model, ids, seq_len, max_windows=None, batch=32):
    """Mean NLL (nats/char) of `ids` (no BOS). The ids are cut into
    consecutive windows of W = seq_len-1 chars (last one shorter); each window
    is fed as [BOS] + window at positions 0..len, and char j of the window is
    predicted from BOS and the window chars before it.
    Returns (mean_nll, number_of_predicted_chars). float64 accumulation."""
    W = seq_len - 1
    windows = [ids[i:i + W] for i in range(0, len(ids), W)]
    if max_windows is not None:
        windows = windows[:max_windows]
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    for b in range(0, len(windows), batch):
        chunk = windows[b:b + batch]
        # group by length so every batch is rectangular (only the last
        # window can be shorter; it simply gets its own batch)
        by_len = {}
        for w in chunk:
            by_len.setdefault(len(w), []).append(w)
        for n, ws in by_len.items():
            x = torch.tensor([[BOS] + w[:-1] for w in ws], dtype=torch.long)
            y = torch.tensor(ws, dtype=torch.long)
            logits = model(x).float()
            logp = F.log_softmax(logits, dim=-1)
            nll = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
            total += float(nll.double().sum())
            count += y.numel()
    model.train(was_training)
    return total / count, count


# ---------------------------------------------------------------------------
# Independent reference: run.c-style forward, one token at a time, KV cache
# ---------------------------------------------------------------------------

def reference_logits(w, cfg, tokens):
    """Straightforward NumPy float32 re-implementation of the llama2.c
    forward pass, reading the arrays exactly as they lie in model.bin
    (including the RoPE tables). Returns (len(tokens), V) logits."""
    D, L = cfg["dim"], cfg["n_layers"]
    NH, NKV = cfg["n_heads"], cfg["n_kv_heads"]
    HS = D // NH
    KVD = NKV * HS
    group = NH // NKV
    T = len(tokens)
    kcache = np.zeros((L, T, KVD), np.float32)
    vcache = np.zeros((L, T, KVD), np.float32)

    def rmsnorm(x, g):
        ss = np.float32(np.mean(x * x) + 1e-5)
        return (x / np.sqrt(ss)).astype(np.float32) * g

    def rope(vec, pos):
        out = vec.copy()
        for i in range(0, vec.size, 2):
            j = (i % HS) // 2
            fcr, fci = w["freq_cis_real"][pos, j], w["freq_cis_imag"][pos, j]
            a, b = vec[i], vec[i + 1]
            out[i] = a * fcr - b * fci
            out[i + 1] = a * fci + b * fcr
        return out

    out = []
    for pos, tok in enumerate(tokens):
        x = w["tok_embeddings"][tok].copy()
        for l in range(L):
            xb = rmsnorm(x, w["rms_att"][l])
            q = rope(w["wq"][l] @ xb, pos)
            kcache[l, pos] = rope(w["wk"][l] @ xb, pos)
            vcache[l, pos] = w["wv"][l] @ xb
            att_out = np.zeros(D, np.float32)
            for h in range(NH):
                kh = h // group
                qh = q[h * HS:(h + 1) * HS]
                ks = kcache[l, :pos + 1, kh * HS:(kh + 1) * HS]
                vs = vcache[l, :pos + 1, kh * HS:(kh + 1) * HS]
                s = ks @ qh / np.float32(math.sqrt(HS))
                s = np.exp(s - s.max())
                s /= s.sum()
                att_out[h * HS:(h + 1) * HS] = s @ vs
            x = x + w["wo"][l] @ att_out
            xb = rmsnorm(x, w["rms_ffn"][l])
            h1 = w["w1"][l] @ xb
            h3 = w["w3"][l] @ xb
            x = x + w["w2"][l] @ ((h1 / (1.0 + np.exp(-h1))) * h3)
        x = rmsnorm(x, w["rms_final"])
        out.append(w["wcls"] @ x)
    return np.array(out, dtype=np.float32)


# ---------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------

@torch.no_grad()
def generate(model, n_chars, temperature, seed, seq_len):
    """Generate from [BOS]; temperature 0 = greedy. Recomputes the whole
    prefix each step (simple and fine for a few hundred chars)."""
    gen = torch.Generator().manual_seed(seed)
    ids = [BOS]
    for _ in range(min(n_chars, seq_len - 1)):
        logits = model(torch.tensor([ids]))[0, -1].float()
        logits[:NUM_SPECIAL] = -float("inf")  # only characters
        if temperature == 0:
            nxt = int(torch.argmax(logits))
        else:
            p = F.softmax(logits / temperature, dim=-1)
            nxt = int(torch.multinomial(p, 1, generator=gen))
        ids.append(nxt)
    return ids[1:]


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/work/shared/data/tinyshakespeare.txt",
                   help="path to the Tiny Shakespeare text (read only)")
    p.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)),
                   help="where model.bin, tokenizer.bin, ... are written")
    p.add_argument("--eval-only", action="store_true",
                   help="skip training; evaluate an existing OUT_DIR/model.bin")
    # model shape
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--hidden-dim", type=int, default=384)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--n-kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    # optimisation
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=500,
                   help="held-out estimate every N steps (first --eval-windows windows)")
    p.add_argument("--eval-windows", type=int, default=32)
    # test vector and sample
    p.add_argument("--testvec-offset", type=int, default=11,
                   help="start of the test prompt inside the held-out text")
    p.add_argument("--testvec-len", type=int, default=8)
    p.add_argument("--sample-chars", type=int, default=400)
    p.add_argument("--sample-temp", type=float, default=0.8)
    p.add_argument("--sample-seed", type=int, default=42)
    return p.parse_args()


def lr_at(step, args):
    """Linear warmup to --lr, then cosine decay to --min-lr at --steps."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * frac))


def train(args, train_ids, heldout_ids, vocab_size):
    torch.manual_seed(args.seed)
    model = Llama(vocab_size, args.dim, args.hidden_dim, args.n_layers,
                  args.n_heads, args.n_kv_heads, args.seq_len)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params}", flush=True)

    # weight decay on the matrices only (not on norms)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95))

    data = torch.tensor(train_ids, dtype=torch.long)
    n_chars = args.seq_len - 1          # 511 chars after BOS
    gen = torch.Generator().manual_seed(args.seed)
    bos_col = torch.full((args.batch_size, 1), BOS, dtype=torch.long)
    t0 = time.time()
    loss_acc, loss_n = 0.0, 0
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        # window = [BOS] + 511 consecutive chars from a random offset;
        # inputs are tokens 0..510, targets are tokens 1..511
        starts = torch.randint(0, len(data) - n_chars + 1, (args.batch_size,),
                               generator=gen)
        chunk = torch.stack([data[s:s + n_chars] for s in starts.tolist()])
        window = torch.cat([bos_col, chunk], dim=1)        # (B, 512)
        x, y = window[:, :-1], window[:, 1:]
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        loss_acc += loss.item()
        loss_n += 1

        last = step == args.steps - 1
        if (step + 1) % args.log_every == 0 or last:
            el = time.time() - t0
            msg = (f"step {step + 1:6d}/{args.steps}  train {loss_acc / loss_n:.4f}"
                   f"  lr {lr_at(step, args):.2e}  {el:7.1f}s")
            if (step + 1) % args.eval_every == 0 or last:
                hl, _ = heldout_loss(model, heldout_ids, args.seq_len,
                                     max_windows=args.eval_windows)
                msg += f"  heldout~ {hl:.4f}"
            print(msg, flush=True)
            loss_acc, loss_n = 0.0, 0
    print(f"training time: {time.time() - t0:.1f}s", flush=True)
    return model


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out_dir, exist_ok=True)
    model_path = os.path.join(args.out_dir, "model.bin")

    text, chars, train_text, heldout_text = load_corpus(args.data)
    vocab_size = NUM_SPECIAL + len(chars)
    train_ids = encode(train_text, chars)
    heldout_ids = encode(heldout_text, chars)
    print(f"torch {torch.__version__}  corpus {len(text)} chars  "
          f"train {len(train_ids)}  heldout {len(heldout_ids)}  V {vocab_size}",
          flush=True)

    write_tokenizer(os.path.join(args.out_dir, "tokenizer.bin"), chars)

    if not args.eval_only:
        model = train(args, train_ids, heldout_ids, vocab_size)
        n = export_model(model, model_path)
        print(f"wrote {model_path}: {n} floats, {os.path.getsize(model_path)} bytes",
              flush=True)

    # ---- everything below uses the fp32 weights read back from model.bin ----
    model, w = load_model(model_path)
    cfg = model.cfg
    assert cfg["vocab_size"] == vocab_size, "model.bin / corpus vocab mismatch"
    print("config: " + " ".join(f"{k}={v}" for k, v in cfg.items()), flush=True)
    print(f"parameters: {sum(p.numel() for p in model.parameters())}", flush=True)

    t0 = time.time()
    loss, count = heldout_loss(model, heldout_ids, cfg["seq_len"])
    print(f"held-out loss: {loss:.6f} nats/char over {count} chars "
          f"({time.time() - t0:.1f}s)", flush=True)
    with open(os.path.join(args.out_dir, "heldout_loss.txt"), "w") as f:
        f.write(f"{loss:.6f}\n")

    # test vector: a fixed prompt from the held-out text, with BOS
    prompt = heldout_text[args.testvec_offset:args.testvec_offset + args.testvec_len]
    tokens = [BOS] + encode(prompt, chars)
    with torch.no_grad():
        logits = model(torch.tensor([tokens]))[0].float().numpy()
    with open(os.path.join(args.out_dir, "testvec.txt"), "w") as f:
        f.write(f"{len(tokens)}\n")
        f.write(" ".join(str(t) for t in tokens) + "\n")
        for row in logits:
            f.write(" ".join("%.9g" % v for v in row) + "\n")
    print(f"test vector: prompt {prompt!r}, {len(tokens)} tokens", flush=True)

    # cross-check against the naive KV-cache forward pass
    ref = reference_logits(w, cfg, tokens)
    diff = float(np.abs(ref - logits).max())
    print(f"max |torch - naive kv-cache reference| over test logits: {diff:.3e}",
          flush=True)
    assert diff < 1e-3, "batched and incremental forward passes disagree"

    # a short sample
    torch.manual_seed(args.sample_seed)
    ids = generate(model, args.sample_chars, args.sample_temp, args.sample_seed,
                   cfg["seq_len"])
    sample = "".join(chars[i - NUM_SPECIAL] for i in ids)
    print(f"--- sample (temperature {args.sample_temp}, seed {args.sample_seed}) ---")
    print(sample)
    print("---")


if __name__ == "__main__":
    main()
