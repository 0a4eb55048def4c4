#!/usr/bin/env python3
"""A peer for make gpu-check: PyTorch on the same GPU, at kvt's shapes.

    python3 bench/peer_torch.py NH HS T [T ...] --copy-mb MB

For each T: torch.nn.functional.scaled_dot_product_attention of one query
row over T cached positions (NH heads of size HS, fp32, as `--bench
attention` times kvt's fused kernel; PyTorch picks its kernel, the
memory-efficient one for fp32 where it can), and a device-to-device copy of
MB megabytes (the 7B-shape weights' size: the most a decode step could
stream). Each is N calls launched back to back between two CUDA events, N
doubled until a batch takes 0.2 s, as kvt's bench does. Prints one line per
figure, "peer sdpa T MS" and "peer copy GBS", for gpu_check.sh to read.
The peer is a measurement only: nothing in the build needs PyTorch, and
gpu_check.sh prints "peer: skipped" where it is missing.
"""
import sys


def timed(fn, torch):
    """Milliseconds per call: N calls back to back between two events."""
    fn()  # warm-up (and the kernel choice)
    torch.cuda.synchronize()
    reps = 3
    while True:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        if ms >= 200.0 or reps >= 1 << 20:
            return ms / reps
        reps *= 2


def main(argv):
    if "--copy-mb" not in argv or len(argv) < 6:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    i = argv.index("--copy-mb")
    copy_mb = float(argv[i + 1])
    nh, hs, *ts = (int(a) for a in argv[1:i])
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("peer: skipped: PyTorch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("peer: skipped: PyTorch sees no CUDA device")
        return 0
    dev = torch.device("cuda")
    print(f"peer: PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    for t in ts:
        q = torch.randn(1, nh, 1, hs, device=dev)
        k = torch.randn(1, nh, t, hs, device=dev)
        v = torch.randn(1, nh, t, hs, device=dev)
        ms = timed(lambda: F.scaled_dot_product_attention(q, k, v), torch)
        print(f"peer sdpa {t} {ms:.5f}")
        del q, k, v
    n = int(copy_mb * 1e6) // 4
    src = torch.empty(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), torch)
    print(f"peer copy {2 * 4 * n / (ms / 1e3) / 1e9:.1f}")  # GB/s, read + write
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
