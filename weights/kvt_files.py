"""What export_hf.py and export_gguf.py share: kvt's two file formats, kvt's
limits, and the all-or-nothing writing of the two outputs. Standard library
only; imported, not run.

The formats (the full text: the shared spec, summarized in weights/README.md):

  model.bin      llama2.c's legacy checkpoint: seven int32 (dim, hidden_dim,
                 n_layers, n_heads, n_kv_heads, vocab_size [negative: a
                 separate classifier], seq_len), then float32 tensors. When
                 the RoPE base is not 10000, two more 4-byte words follow the
                 seven: the bytes "rope" and float32 theta (so every base-10000
                 file stays legacy byte for byte). checkpoint_header().

  tokenizer.bin  llama2.c's legacy vocabulary: int32 max_token_length, then
                 per id float32 score, int32 length, the piece's bytes.
                 A byte-level (GPT-2 style) vocabulary adds a trailer: "BBPE",
                 int32 pre-tokenizer (1 gpt2, 2 smollm), int32 bos_id (-1: none),
                 int32 eos_id, int32 n_merges, then n_merges pairs of int32
                 (left id, right id), rank = index. bbpe_tokenizer().

Every refusal is a Refused(path, what): the exporter prints it as one line,
`export_xx.py: path: what`, and exits 1.
"""
import json
import math
import os
import signal
import stat
import struct

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
RMS_EPS = 1e-5             # KVT_RMS_EPS (kvtransformer.cu §8, rmsnorm): the format has no field for it
LEGACY_THETA = 10000.0     # the RoPE base of a checkpoint without the extension
ROPE_MAGIC = b"rope"
BBPE_MAGIC = b"BBPE"
PRE_TOKENIZERS = {"gpt2": 1, "smollm": 2}  # the trailer's pre_tokenizer codes


class Refused(Exception):
    """One line for the user: the file it is about, then what is wrong."""

    def __init__(self, path, what):
        super().__init__(f"{path}: {what}")


def float32(x):
    """x rounded to float32, as the file stores it."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def eps_ok(eps):
    """kvt's RMSNorm adds 1e-5f: an eps that is 1e-5 once rounded to float32
    (GGUF stores it as float32 already: 9.99999975e-06)."""
    return isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and \
        abs(eps) < 1.0 and float32(eps) == float32(RMS_EPS)


# ---- the checkpoint ---------------------------------------------------------------

def theta_problem(theta):
    """Why theta cannot be stored (None when it can): kvt's loader takes a
    float32 base in (1, 1e30) (kvt_model_load: the same rule, so nothing the
    exporters write is refused by kvt)."""
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        return "a number is needed"
    if not (math.isfinite(theta) and abs(theta) < 3.4e38 and 1.0 < float32(theta) < float32(1e30)):
        return "the RoPE base must be above 1 and below 1e30 (kvt's loader)"
    return None


MIN_VOCAB = 3  # kvt with a tokenizer: ids BOS = 1 and EOS = 2 are pieces of the vocabulary


def checkpoint_header(dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len, shared, theta):
    """The 28 header bytes of the legacy format, or 36 with the RoPE
    extension when theta (rounded to float32, as stored) is not 10000."""
    head = struct.pack("<7i", dim, hidden_dim, n_layers, n_heads, n_kv_heads,
                       vocab_size if shared else -vocab_size, seq_len)
    if float32(theta) != LEGACY_THETA:
        head += ROPE_MAGIC + struct.pack("<f", theta)
    return head


def write_zeros(f, nbytes):
    """llama2.c's two RoPE tables (seq_len x HS/2 floats each): kvt computes
    RoPE itself and ignores them, so they are zeros (as in export_hf.py since
    its first version), written in pieces: at kvt's limits they are a gigabyte."""
    while nbytes:
        k = min(nbytes, 16 << 20)
        f.write(bytes(k))
        nbytes -= k


# ---- the tokenizer ------------------------------------------------------------------

def printable(text):
    """text for a terminal: every non-printable character (ESC, NUL, a
    newline, an undecodable byte kept as a surrogate) written as its Python
    escape (\\x1b, \\x00, \\n, \\udcff), so a tensor name or key taken from a file
    cannot clear or recolour the screen. Printable text (\u00e9) is kept."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def show(value):
    """A value as JSON (ASCII, escapes visible), cut short: a message stays
    one readable line whatever a piece or a field holds."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."


def piece_bytes(path, i, piece):
    """A vocabulary string as the UTF-8 bytes kvt loads, or Refused."""
    try:
        raw = piece.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(path, f"piece id {i} ({show(piece)}) is not valid Unicode (a lone surrogate)") from None
    if len(raw) > MAX_PIECE_BYTES:
        raise Refused(path, f"piece id {i} ({show(piece)}) is {len(raw)} bytes: kvt's tokenizer loader "
                      f"takes at most {MAX_PIECE_BYTES} (cli/tokenizer.c)")
    if b"\0" in raw:
        raise Refused(path, f"piece id {i} ({show(piece)}) contains a NUL character, which kvt's "
                      "tokenizer loader refuses (cli/tokenizer.c)")
    return raw


def legacy_records(path, raws, scores):
    """int32 max_token_length, then per id float32 score, int32 length, bytes."""
    longest = max((len(b) for b in raws), default=0)
    if longest < 1:
        raise Refused(path, "every piece is empty: kvt's tokenizer loader needs max_token_length >= 1")
    blob = [struct.pack("<i", longest)]
    for raw, score in zip(raws, scores):
        blob.append(struct.pack("<fi", score, len(raw)))
        blob.append(raw)
    return blob


def legacy_tokenizer(path, raws, scores):
    """The bytes of a legacy tokenizer.bin (SentencePiece-style: merges by
    highest score, BOS 1, EOS 2)."""
    return b"".join(legacy_records(path, raws, scores))


def bbpe_tokenizer(path, pieces, pre, bos, eos, merges, where):
    """The bytes of a byte-level tokenizer.bin: the V records (score 0.0,
    each piece the vocabulary string as it is, e.g. "Ġthe", in UTF-8), then
    the BBPE trailer. pieces: list of str by id; pre: "gpt2" or "smollm";
    bos: an id or -1; eos: an id; merges: (left, right) strings in rank
    order; where(r): how a message names merge r (e.g. "tokenizer.ggml.merges[3]").
    A merge whose sides or result are not in the vocabulary is refused."""
    V = len(pieces)
    ids = {}
    for i, piece in enumerate(pieces):
        j = ids.setdefault(piece, i)
        if j != i:
            raise Refused(path, f"pieces {j} and {i} are the same string {show(piece)}: a merge could not say "
                          "which one it means")
    for name, value in (("bos", bos), ("eos", eos)):
        if not (-1 if name == "bos" else 0) <= value < V:
            raise Refused(path, f"{name} id {value} is not in the vocabulary of {V} pieces")
    pairs = []
    for r, (a, b) in enumerate(merges):
        for what, piece in (("its left side", a), ("its right side", b), ("its result", a + b)):
            if piece not in ids:
                raise Refused(path, f"{where(r)} = {show(a + ' ' + b)}: {what} {show(piece)} is not in the "
                              "vocabulary")
        pairs += (ids[a], ids[b])
    raws = [piece_bytes(path, i, p) for i, p in enumerate(pieces)]
    blob = legacy_records(path, raws, [0.0] * V)
    blob.append(BBPE_MAGIC + struct.pack("<4i", PRE_TOKENIZERS[pre], bos, eos, len(merges)))
    blob.append(struct.pack(f"<{len(pairs)}i", *pairs))
    return b"".join(blob)


# ---- the outputs ----------------------------------------------------------------------

def real_output(path):
    """Where path would be written: its directory resolved, its own name kept
    (the output itself must not be a link, see check_output)."""
    return os.path.join(os.path.realpath(os.path.dirname(path) or "."), os.path.basename(path))


def check_output(path):
    """An output must be a new name or a regular file, in a directory that
    exists: it is replaced by a rename, and a rename over a link, a device or
    a directory would not do what the user meant."""
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


def check_two_outputs(model_out, tok_out):
    if real_output(model_out) == real_output(tok_out) or (
            os.path.exists(model_out) and os.path.exists(tok_out) and os.path.samefile(model_out, tok_out)):
        raise Refused(tok_out, f"is the same file as the model output {model_out}: give two different files")


def is_input(path, inputs):
    """Whether writing path would replace one of the input files (by name,
    through links, or as a second hard link to the same file)."""
    where = real_output(path)
    for p in inputs:
        if not os.path.lexists(p):
            continue
        if where == os.path.realpath(p):
            return True
        if os.path.exists(path) and os.path.exists(p) and os.path.samefile(path, p):
            return True
    return False


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


class Stopped(Exception):
    """A signal (TERM, HUP, INT) asked the exporter to stop: raised where the
    program is, so write_outputs's cleanup runs and main prints one line."""


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
RENAMED = [False]  # set once write_outputs has renamed both outputs into place


def stop_on_signals():
    """TERM, HUP and INT (Ctrl-C) become Stopped, an ordinary exception: the
    hidden temporaries are removed and the line is one line, not a
    KeyboardInterrupt traceback (nor, for TERM and HUP, files left behind)."""
    def stop(signum, frame):
        if RENAMED[0]:  # both outputs are in place: the export is done, let it finish its line
            return
        raise Stopped(f"stopped by {signal.Signals(signum).name}: nothing written, the old outputs are kept")
    for s in STOP_SIGNALS:
        signal.signal(s, stop)


def write_outputs(model_out, tok_out, tok_bytes, write_model):
    """Both outputs to temporaries (write_model(f) writes the checkpoint),
    each flushed to disk, then both renamed into place; on any failure both
    temporaries are removed and the old pair is left as it was."""
    temps = []
    try:
        for final, data in ((tok_out, tok_bytes), (model_out, None)):
            tmp, f = create_temp(final)
            temps.append(tmp)
            try:
                with f:
                    if data is None:
                        write_model(f)
                    else:
                        f.write(data)
                    f.flush()
                    os.fsync(f.fileno())  # the data is on disk before the name points at it
            except OSError as e:
                raise Refused(final, f"writing {tmp} failed: {e.strerror or e}") from None
        # the two renames are not interrupted half-way: a signal waits until both are done
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            replace_both(temps[1], model_out, temps[0], tok_out)
            RENAMED[0] = True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    finally:
        for tmp in temps:
            if os.path.lexists(tmp):
                os.unlink(tmp)


def refusal(exc, src):
    """The one line an exporter prints for an exception raised while it
    exported src: a refusal as it is, an unreadable input, memory, or a check
    the exporter lacks (still one line, never a traceback)."""
    if isinstance(exc, Refused):
        return str(exc)
    if isinstance(exc, Stopped):
        return f"{src}: {exc}"
    if isinstance(exc, OSError):  # an input that cannot be read (permissions, I/O error)
        return f"{exc.filename or src}: {exc.strerror or exc}"
    if isinstance(exc, MemoryError):
        return f"{src}: out of memory"
    return f"{src}: {type(exc).__name__}: {exc} (unexpected: please report this input)"
