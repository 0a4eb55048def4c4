# The gdb sessions of docs/GDB.md, for .ci/walkthrough.sh. A session is a
# transcript: lines "(gdb) COMMAND" are what the reader types, the lines under
# a command are what the page says gdb prints for it (a selection: only the
# lines shown are checked, in their order; a line "..." marks lines left out).
# This file runs in gdb's own Python (no python3 needed), in one of two modes.
#
# Run mode (KVT_GDB_TRANSCRIPT set, gdb started with --args ./kvt-debug ...):
# runs the commands one at a time, each after a marker line, so the check can
# cut gdb's output (and the program's) into one piece per command. Like gdb's
# own -x, the first error ends the session ("Error in sourced command file").
# One error is let through, because some machines cannot avoid it: on CPUs
# with AMX, gdb 13 runs a `call`ed function, which prints what it should,
# then fails to write the vector registers back ("Couldn't write extended
# state status: Bad address"), for any program. The program goes on
# unchanged and the check reads the call's output, so the session goes on
# after a note.
#
# Check mode (KVT_GDB_CHECK=1, gdb -batch with no program): reads the
# transcript, the output of its run (KVT_GDB_OUT) and the prose's claims
# (KVT_GDB_PROSE, one per line), and prints one line per wrong claim, then
# "[walkthrough] claims: N checked, M wrong". The rules:
#   - a shown output line must equal a line of its command's output, in order;
#   - "..." inside a line matches any text (an address, a line number);
#   - a number with a decimal point matches a printed number that rounds to
#     it (the page shows 9.942 where gdb prints 9.9421854);
#   - a claim in the prose (a code span of the session's text that shows a
#     value) names the value it quotes: `$8 = {0, 1, 2}` must match what gdb
#     printed as $8 in this session (so it cannot pass by matching another
#     moment's value), and a line of the pool map (`seq 0 [ 0* 2c (2/4) ] len
#     6`, `pool [...`, `totals: ...`) must be one of the session's lines. A
#     value quoted without its $N fails, with a note saying so.
import os
import re

import gdb

XSTATE = "Couldn't write extended state status"
MARK = "@@walkthrough command %d@@"
PROMPT = "(gdb) "
FLOAT = re.compile(r"(?<![\w.$])-?\d+\.\d+(?![\w.])")


def transcript(path):
    """[(command, [claimed output lines])] of a transcript file."""
    steps = []
    with open(path) as f:
        for line in f.read().splitlines():
            if line.startswith(PROMPT):
                steps.append((line[len(PROMPT):].strip(), []))
            elif steps and line.strip() and line.strip() != "...":
                steps[-1][1].append(line.rstrip())
    return steps


def pattern(claim):
    """A regex for a claimed text, and the numbers it claims with their decimals."""
    parts, wanted, pos = [], [], 0
    for m in FLOAT.finditer(claim):
        parts.append(literal(claim[pos:m.start()]))
        parts.append(r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)")
        wanted.append((float(m.group()), len(m.group().split(".")[1])))
        pos = m.end()
    parts.append(literal(claim[pos:]))
    return "".join(parts), wanted


def literal(text):
    return ".*?".join(re.escape(piece) for piece in text.split("..."))


def matches(claim, line, whole):
    rx, wanted = pattern(claim)
    found = (re.fullmatch if whole else re.search)(rx, line)
    if not found:
        return False
    for (want, decimals), got in zip(wanted, found.groups()):
        if abs(float(got) - want) > 0.5 * 10 ** -decimals * (1 + 1e-9):
            return False
    return True


def run_session():
    for i, (cmd, _) in enumerate(transcript(os.environ["KVT_GDB_TRANSCRIPT"])):
        print(MARK % i)
        gdb.flush()
        try:
            gdb.execute(cmd)
        except gdb.error as ex:
            if cmd.startswith("call ") and XSTATE in str(ex):
                print("[walkthrough] note: '%s' ran; then this gdb could not restore the vector registers (%s)"
                      % (cmd, ex))
                continue
            print("Error in sourced command file:\n%s: %s" % (cmd, ex))
            break
        finally:
            gdb.flush()


def check_session():
    steps = transcript(os.environ["KVT_GDB_TRANSCRIPT"])
    with open(os.environ["KVT_GDB_OUT"], errors="replace") as f:
        out = [line.rstrip() for line in f.read().splitlines()]
    pieces, cur = {}, None  # command index -> its output lines
    for line in out:
        m = re.fullmatch(r"@@walkthrough command (\d+)@@", line)
        if m:
            cur = int(m.group(1))
            pieces[cur] = []
        elif cur is not None:
            pieces[cur].append(line)
    checked = wrong = 0
    for i, (cmd, claims) in enumerate(steps):
        got, at = pieces.get(i), 0
        for claim in claims:
            checked += 1
            if got is None:
                wrong += 1
                print("[walkthrough] WRONG: '%s' never ran, so it did not print: %s" % (cmd, claim))
                continue
            k = at
            while k < len(got) and not matches(claim, got[k], True):
                k += 1
            if k < len(got):
                at = k + 1
                continue
            wrong += 1
            print("[walkthrough] WRONG: the page says '%s' prints:\n    %s\n  gdb printed:" % (cmd, claim))
            for line in got[at:at + 12]:
                print("    " + line)
    prose = os.environ.get("KVT_GDB_PROSE")
    if prose and os.path.exists(prose):
        with open(prose) as f:
            for claim in f.read().splitlines():
                checked += 1
                hist = re.match(r"\$(\d+) = ", claim)
                if hist:  # the value gdb printed as $N: from "$N = " to the end of its line
                    said = [line[m.start(1):] for line in out
                            for m in [re.search(r"(?:^|\s)(\$%s = .*)$" % hist.group(1), line)] if m]
                    if not any(matches(claim, value, True) for value in said):
                        wrong += 1
                        print("[walkthrough] WRONG: the text says `%s`; gdb printed %s" %
                              (claim, ", ".join("`%s`" % v for v in said) or "no $%s" % hist.group(1)))
                elif re.match(r"(seq \d+ \[|pool \[|totals: )", claim):
                    if not any(matches(claim, line, True) for line in out):
                        wrong += 1
                        print("[walkthrough] WRONG: the text quotes the pool line `%s`, which gdb printed nowhere "
                              "in this session" % claim)
                else:
                    wrong += 1
                    print("[walkthrough] WRONG: the text quotes the value `%s` without saying which one: write it "
                          "as gdb prints it, `$N = ...`" % claim)
    print("[walkthrough] claims: %d checked, %d wrong" % (checked, wrong))


if os.environ.get("KVT_GDB_CHECK") == "1":
    check_session()
else:
    run_session()
