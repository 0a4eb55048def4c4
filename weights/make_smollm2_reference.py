#!/usr/bin/env python3
"""Writes weights/smollm2_logits.txt: what transformers computes with
SmolLM2-135M-Instruct (the GGUF of `make smollm2`), the reference `make test`
compares kvt's converted model against, so the test needs no torch.

Run once, offline, after `make smollm2` (needs torch, transformers, gguf):

    python3 weights/make_smollm2_reference.py [weights/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf]

transformers loads the GGUF with LlamaForCausalLM, dequantizing every tensor
to float32 (gguf-py's dequantization, independent of weights/export_gguf.py),
and computes the logits of every position of three prompts in float32. The
prompts' ids come from transformers' tokenizer for the same GGUF, with the
ChatML markers as special tokens; the file stores the ids, so the test does
not depend on kvt's tokenizer.

A full row is V = 49152 floats; the file keeps, for every position, the row's
largest |logit| and the logits of about 112 ids: every 512th id (0, 512, ...) and
the row's 16 largest. Format (text, one item per line):

    prompt N id0 id1 ... id(N-1)
    row POS MAXABS id:logit id:logit ...      (N rows follow each prompt line)
"""
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(HERE, "smollm2_logits.txt")
PROMPTS = [
    "What is a KV cache?",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(10))  # 55",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nName three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\n",
]


def main():
    folder, name = os.path.split(os.path.abspath(GGUF))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    model.eval()
    lines = [f"# transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
             f"from {name}: see weights/make_smollm2_reference.py"]
    for text in PROMPTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        lines.append("prompt %d %s" % (len(ids), " ".join(str(i) for i in ids)))
        for pos in range(len(ids)):
            row = logits[pos]
            keep = sorted(set(range(0, row.numel(), 512)) | set(torch.topk(row, 16).indices.tolist()))
            cells = " ".join("%d:%.7g" % (i, row[i].item()) for i in keep)
            lines.append("row %d %.7g %s" % (pos, row.abs().max().item(), cells))
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, OUT)
    print(f"wrote {OUT}: {len(PROMPTS)} prompts, {sum(1 for l in lines if l.startswith('row'))} rows")


if __name__ == "__main__":
    main()
