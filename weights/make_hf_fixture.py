#!/usr/bin/env python3
"""Writes weights/hf-tiny/: a tiny random Hugging Face Llama model and what
transformers computes with it, the fixture `make test` uses to check
weights/export_hf.py and kvt against transformers without needing torch.

Run once, offline (needs torch, transformers, tokenizers):

    python3 weights/make_hf_fixture.py

What it makes, on purpose unlike llama2.c's own checkpoints:
- grouped-query attention (4 query heads, 2 kv heads), head size 16;
- an untied classifier (lm_head), scaled up so logits are well spread and
  greedy decoding has clear winners;
- random RMSNorm weights (not all ones), so a norm applied to the wrong
  tensor shows;
- weights stored as bf16, in two shards with model.safetensors.index.json
  (the exporter's bf16 path and shard index); the reference logits are
  computed in float32 from exactly those bf16 values;
- a SentencePiece-style BPE vocabulary with byte fallback: <unk>, <s>, </s>,
  the 256 byte pieces <0x00>..<0xFF> at ids 3..258, then pieces learned from
  the text below, with U+2581 as the word marker.

Files: the HF directory itself (config.json, model-0000x-of-00002.safetensors,
model.safetensors.index.json, tokenizer.json, tokenizer_config.json, ...),
expected.json (the prompt ids, transformers' greedy continuation, and the
tokenizer's ids for a sample text) and logits.f32 (float32 little-endian,
[positions][V], transformers' logits for every position of the greedy run).
"""
import json
import os

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizerFast

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf-tiny")
TEXT = """The cache keeps the keys and values of every position it has seen.
A new token only computes its own row, then reads all the others back.
Without the cache, every step would run the whole sequence again.
Chunks of sixteen positions are taken from a shared pool when needed.
Two sequences that start with the same prompt can share those chunks.
When one of them writes into a shared chunk, it copies it first.
Smaller numbers in the cache mean fewer bytes to read at every step.
"""
SAMPLE = "The cache reads every key again, naïvely: 42 × 3 = 126 ✓"


def main():
    torch.manual_seed(20261130)
    os.makedirs(OUT, exist_ok=True)
    # the tokenizer
    special = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special, show_progress=False)
    tok.train_from_iterator(TEXT.splitlines(), trainer)
    hf_tok = LlamaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                add_bos_token=True, add_eos_token=False)
    V = tok.get_vocab_size()
    assert tok.token_to_id("<0x00>") == 3 and tok.token_to_id("<0xFF>") == 258
    # the model
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name == "lm_head.weight":
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.08)
    model = model.to(torch.bfloat16)
    model.save_pretrained(OUT, safe_serialization=True, max_shard_size="150KB")
    hf_tok.save_pretrained(OUT)
    # reference: float32 from the stored bf16 values, greedy from a fixed prompt
    model = LlamaForCausalLM.from_pretrained(OUT, torch_dtype=torch.float32).eval()
    prompt = hf_tok("Two sequences share a prompt")["input_ids"]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            logits = model(torch.tensor([ids])).logits[0]
            ids.append(int(logits[-1].argmax()))
        logits = model(torch.tensor([ids[:-1]])).logits[0]  # every fed position, in one pass
    assert not {1, 2} & set(ids[len(prompt):]), "greedy chose BOS/EOS (kvt stops there): change the seed"

    with open(os.path.join(OUT, "logits.f32"), "wb") as f:
        f.write(logits.float().numpy().astype("<f4").tobytes())
    top2 = logits.topk(2, dim=-1).values
    gap = float(((top2[:, 0] - top2[:, 1]) / logits.abs().max(dim=-1).values).min())
    expected = {"prompt": prompt, "greedy": ids, "positions": len(ids) - 1, "vocab_size": V,
                "smallest_top2_gap_relative": gap,
                "sample_text": SAMPLE, "sample_ids": hf_tok(SAMPLE)["input_ids"],
                "transformers": __import__("transformers").__version__, "torch": torch.__version__}
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{OUT}: V {V}, prompt {len(prompt)} ids, greedy to {len(ids)}, smallest top-2 gap {gap:.3f}")


if __name__ == "__main__":
    main()
