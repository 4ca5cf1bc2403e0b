# Makefile - the one build of attnreplay.
#
#   make            bin/attnreplay (C11 host code; CUDA kernels too when nvcc is found)
#   make test       every CPU test (cmocka, one binary per module); with nvcc it also builds the
#                   GPU test and benchmark binaries, so the CUDA code is proven to compile and link
#   make demo       simulate a slice of a public workload, replay a few steps verified on the best
#                   backend here, write an HTML report (demo/); without a GPU it builds the host
#                   binary only (no CUDA kernels: nothing here could run them)
#   make gpu-build  everything the GPU machine runs (bin/attnreplay with CUDA, GPU tests, benches)
#   make test-vllm  the vLLM recorder and the sim's step-by-step parity with vLLM 0.33's scheduler
#   make fidelity   the step-time model calibrated on one public vLLM run, evaluated on the other
#                   (`make fidelity-profiles`: with the RTX cards' measured per-layer profiles)
#   make test-gpu   the GPU tests (run on the H200; uses prebuilt binaries where headers lack)
#   make bench      benchmarks (reference vs naive on the CPU; kernels on a GPU)
#   make lab        the kernel lab (kernels/lab/: variants that are not in the product, each with
#                   its benchmark; CUDA builds only); `make lab-run` runs them on the GPU machine
#   make asan       the CPU tests again under AddressSanitizer + UBSan
#   make mutate     mutation testing: one-token kernel bugs the verifier must catch (mutate-cpu here,
#                   mutate-gpu-build here and mutate-gpu on the GPU machine; tests/mutations.txt)
#   make fuzz       libFuzzer harnesses (clang, ASan + UBSan), each run FUZZ_SECONDS (default 60)
#   make valgrind   memcheck over a short replay (no leaks, no invalid accesses)
#   make test-gpu-sanitize  compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over
#                   the GPU tests with small cases (on the H200)
#   make clean
#
# `make`, `make test` and `make demo` first install missing Debian packages (as root) or print
# the apt command to run; Open MPI's mpirun among them, for the sharded-replay test (as root it
# runs with OMPI_ALLOW_RUN_AS_ROOT set by tests/shard_mpirun.sh).  Libraries a bare Ubuntu 24.04 GPU machine lacks (jansson, sqlite3, libdeflate)
# are linked statically; the CUDA runtime is static by nvcc's default.
#
# Speed.  Without -j on its command line make uses every core (a -jN given, -j1 included, wins).
# CUDA code is compiled for CUDA_ARCHS only: the GPU present (9.0 -> 90a), else 90a (the H200
# the binaries built here are carried to).  CUDA_ARCHS="80 90a compute_90" builds SASS for sm_80
# and sm_90a plus PTX for compute_90; changing it (or NVCCFLAGS) rebuilds the CUDA objects.
# The C objects are shared by the CUDA build and the host-only build (only main.c differs), so a
# `make test` after `make demo` compiles just the CUDA files, longest first.

comma   := ,
NPROC   := $(shell nproc 2>/dev/null || echo 1)
ifeq ($(filter -j% --jobs%,$(shell tr '\0' ' ' </proc/$$PPID/cmdline 2>/dev/null) $(MAKEFLAGS) $(shell printenv MAKEFLAGS)),)
MAKEFLAGS += -j$(NPROC)
endif

CC      ?= gcc
ifeq ($(CC),cc)
CC      := gcc
endif
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
OPT     ?= -O2
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla -Wformat=2
CFLAGS  += -std=c11 $(OPT) -g $(WARN) -D_GNU_SOURCE -pthread -fno-strict-aliasing
ifneq ($(CI),)
CFLAGS  += -Werror
endif
SANITIZE ?=
CFLAGS  += $(SANITIZE)
REV     := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
CFLAGS  += -DAR_CODE_REV=\"$(REV)\"
LDFLAGS += $(SANITIZE) -pthread
STATIC_LIBS := -Wl,-Bstatic -ljansson -lsqlite3 -ldeflate -lz -Wl,-Bdynamic
HOST_LIBS := $(STATIC_LIBS) -lm -ldl -lrt

BUILD   ?= build
# The revision as last compiled in: rewritten only when it changes, and the objects that record it
# (a run's code_rev in the database, `attnreplay --version`, a profile's code_rev) depend on it, so
# an incremental build after a commit or a pull records the new revision, not the one of the
# build that last compiled them.
REV_STAMP := $(BUILD)/code-rev.txt
$(shell mkdir -p $(BUILD) && (echo '$(REV)' | cmp -s - $(REV_STAMP) || echo '$(REV)' > $(REV_STAMP)))
MODULES := traces reference kernels/cpu kernels/common kernels/paged kernels/mla replay sim reports
# each .cu's stand-in for builds without CUDA
STUB_SRCS   := kernels/paged/cuda_stub.c kernels/mla/cuda_mla_stub.c kernels/common/cuda_calibrate_stub.c \
               kernels/common/cuda_profile_stub.c reference/ref_gpu_stub.c replay/plugin_cuda_stub.c
# test support: the cuda-mla test hook (and its float64 device reference) is linked into the
# tests, the benchmarks and the lab, never into bin/attnreplay
TEST_HOOK_CU   := kernels/mla/cuda_mla_case.cu
TEST_HOOK_STUB := kernels/mla/cuda_mla_case_stub.c
COMMON_SRCS := $(filter-out replay/main.c $(STUB_SRCS) $(TEST_HOOK_STUB),$(foreach m,$(MODULES),$(wildcard $(m)/*.c)))
COMMON_OBJS := $(COMMON_SRCS:%.c=$(BUILD)/%.o)
STUB_OBJS   := $(STUB_SRCS:%.c=$(BUILD)/%.o)
# Longest first, so that with -j the slow ones start at once.
CU_FIRST := kernels/mla/mla_decode.cu kernels/paged/cuda_attn_bf16.cu kernels/paged/cuda_attn_fp16.cu
CU_SRCS := $(CU_FIRST) \
           $(filter-out $(CU_FIRST) $(TEST_HOOK_CU),$(foreach m,kernels/mla kernels/paged kernels/common,$(wildcard $(m)/*.cu))) \
           $(wildcard reference/*.cu) replay/plugin_cuda.cu
SANITIZE_NOTE := $(if $(strip $(SANITIZE)),$(comma) sanitizers)

# The GPU here, as "90" for compute capability 9.0; empty without one (or without a driver).
GPU_CC  := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
ifeq ($(GPU_CC),90)
CUDA_ARCHS ?= 90a
else ifneq ($(GPU_CC),)
CUDA_ARCHS ?= $(GPU_CC)
else
CUDA_ARCHS ?= 90a
endif
CUDA_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=$(if $(filter compute_%,$(a)),$(a)$(comma)code=$(a),compute_$(a)$(comma)code=sm_$(a)))

# The host-only build: every C object, the CUDA stubs, a main.o of its own.
HOST_LIB  := $(BUILD)/libattnreplay-host.a
HOST_MAIN := $(BUILD)/host/replay/main.o

ifneq ($(NVCC),)
HAVE_CUDA := 1
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCCFLAGS ?= -O3 -std=c++17 -lineinfo --use_fast_math -Xcompiler -fno-strict-aliasing $(CUDA_GENCODE)
# host code of every .cu position-independent: the same objects also go into libattnreplay.so
override NVCCFLAGS += -Xcompiler -fPIC
else
HAVE_CUDA := 0
endif

ifeq ($(HAVE_CUDA),1)
CU_OBJS  := $(CU_SRCS:%.cu=$(BUILD)/%.o)
TEST_HOOK_OBJ := $(TEST_HOOK_CU:%.cu=$(BUILD)/%.o)
LIB      := $(BUILD)/libattnreplay.a
MAIN     := $(BUILD)/replay/main.o
LIBS     := $(HOST_LIBS) -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcudart_static -lstdc++
CUDA_CFLAGS := -DAR_HAVE_CUDA=1 -isystem $(CUDA_HOME)/include
BIN_KIND := cuda
BUILD_TYPE := CUDA kernels for $(CUDA_ARCHS)$(comma) $(OPT)$(SANITIZE_NOTE)
# NVCCFLAGS as last compiled with: the CUDA objects depend on this file, rewritten only when the
# flags change, so a new CUDA_ARCHS rebuilds them.
NVCC_STAMP := $(BUILD)/nvcc-flags.txt
$(shell mkdir -p $(BUILD) && (echo '$(NVCC) $(NVCCFLAGS)' | cmp -s - $(NVCC_STAMP) || echo '$(NVCC) $(NVCCFLAGS)' > $(NVCC_STAMP)))
else
CU_OBJS  :=
TEST_HOOK_OBJ := $(TEST_HOOK_STUB:%.c=$(BUILD)/%.o)
LIB      := $(HOST_LIB)
MAIN     := $(HOST_MAIN)
LIBS     := $(HOST_LIBS)
CUDA_CFLAGS :=
BIN_KIND := host
endif
HOST_BUILD_TYPE := CPU only$(comma) no CUDA kernels$(comma) $(OPT)$(SANITIZE_NOTE)
# the C objects of this build's library
C_OBJS   := $(COMMON_OBJS) $(if $(filter 1,$(HAVE_CUDA)),,$(STUB_OBJS))

BIN     := bin/attnreplay
# bin/attnreplay is either build; BIN.kind says which, and a different one relinks it.
ifneq ($(shell cat $(BIN).kind 2>/dev/null),$(BIN_KIND))
.PHONY: $(BIN)
endif

TEST_SRCS     := $(wildcard tests/test_*.c)
TESTS         := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
GPU_TEST_SRCS := $(wildcard tests/gpu_*.c)
GPU_TESTS     := $(GPU_TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
BENCH_SRCS    := $(wildcard tests/bench_*.c)
BENCHES       := $(BENCH_SRCS:tests/%.c=$(BUILD)/tests/%)
TEST_COMMON   := $(BUILD)/tests/testutil.o $(TEST_HOOK_OBJ)
LAB_SRCS      := $(wildcard kernels/lab/*.cu)
LABS          := $(LAB_SRCS:kernels/lab/%.cu=$(BUILD)/lab/%)
# with nvcc, `make test` also builds (not runs) what only a GPU runs
TEST_GPU_BUILD := $(if $(filter 1,$(HAVE_CUDA)),$(GPU_TESTS) $(BENCHES))

.PHONY: all test demo test-gpu bench asan clean deps fuzz fuzz-build valgrind test-gpu-sanitize gpu-build test-only lab lab-run
.SECONDARY: $(TEST_COMMON)
all: deps $(BIN)

# ---- set-up: install what is missing ---------------------------------------------------------
APT_PKGS := libcmocka-dev gnuplot-nox libjansson-dev libsqlite3-dev zlib1g-dev libdeflate-dev openmpi-bin
deps:
	@missing=""; \
	for h in cmocka.h:libcmocka-dev jansson.h:libjansson-dev sqlite3.h:libsqlite3-dev zlib.h:zlib1g-dev libdeflate.h:libdeflate-dev; do \
	  f=$${h%%:*}; p=$${h##*:}; \
	  [ -f /usr/include/$$f ] || [ -f /usr/local/include/$$f ] || missing="$$missing $$p"; \
	done; \
	command -v gnuplot >/dev/null 2>&1 || missing="$$missing gnuplot-nox"; \
	command -v mpirun >/dev/null 2>&1 || missing="$$missing openmpi-bin"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null || \
	      { echo "apt-get install failed; run: apt-get install -y$$missing" >&2; exit 1; }; \
	  else \
	    echo "missing packages; run: sudo apt-get install -y$$missing" >&2; exit 1; \
	  fi; \
	fi

# ---- build ------------------------------------------------------------------------------------
$(BUILD)/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# Every CUDA file of the product and the lab compiles through kernels/nvcc_guard.sh, which fails
# the build when ptxas serialised a kernel's wgmma (correct and slower, so no test would notice).
# Not the example plugins (teaching kernels) nor the mutants of `make mutate-gpu-build`, which
# are judged by their results only.
NVCC_GUARDED = kernels/nvcc_guard.sh $(NVCC)

$(BUILD)/%.o: %.cu $(NVCC_STAMP) | deps
	@mkdir -p $(dir $@)
	$(NVCC_GUARDED) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# The device reference rounds exactly as the host does: no fast math (approximate division,
# exp and flush-to-zero would change its float values).
$(BUILD)/reference/%.o: reference/%.cu $(NVCC_STAMP) | deps
	@mkdir -p $(dir $@)
	$(NVCC_GUARDED) $(filter-out --use_fast_math,$(NVCCFLAGS)) -MMD -MP -c $< -o $@

# main.o knows its build: CUDA (runtime and driver versions for `version`) or host only.
$(BUILD)/replay/main.o: replay/main.c $(NVCC_STAMP) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CUDA_CFLAGS) -DAR_BUILD_TYPE='"$(BUILD_TYPE)"' -MMD -MP -c $< -o $@

$(HOST_MAIN): replay/main.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DAR_BUILD_TYPE='"$(HOST_BUILD_TYPE)"' -MMD -MP -c $< -o $@

$(BUILD)/libattnreplay.a: $(CU_OBJS) $(COMMON_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(HOST_LIB): $(COMMON_OBJS) $(STUB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN): $(MAIN) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $(MAIN) $(LIB) $(LIBS)
	@echo $(BIN_KIND) > $@.kind

# Test binaries get an rpath of $ORIGIN so a copied libcmocka.so.0 beside them is found on the
# GPU machine, which has no cmocka.
$(BUILD)/tests/%: tests/%.c $(TEST_COMMON) $(LIB) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CUDA_CFLAGS) -MMD -MP -o $@ $< $(TEST_COMMON) $(LIB) $(LDFLAGS) -Wl,-rpath,'$$ORIGIN' -lcmocka $(LIBS)

# ---- a compute-sanitizer build of the MLA GPU tests ---------------------------------------------
# gpu_mla_handover, gpu_mla_backend_handover: gpu_mla and gpu_mla_backend linked with the MLA pairs
# kernel's warpgroup hand-overs on mbarriers (AR_PAIRS_HANDOVER_MBAR=1 in
# kernels/mla/mla_decode_wgmma_pairs.cuh) instead of named barriers, which racecheck does not take
# as ordering the arriving threads' writes (RELIABILITY.md); built by `make gpu-build`, run by
# `make test-gpu-sanitize` beside the product's binaries.
SANITIZE_TESTS := $(if $(filter 1,$(HAVE_CUDA)),$(addprefix $(BUILD)/tests/,gpu_mla_handover gpu_mla_backend_handover))
$(BUILD)/sanitize/mla_decode.o: kernels/mla/mla_decode.cu $(NVCC_STAMP) | deps
	@mkdir -p $(dir $@)
	$(NVCC_GUARDED) $(NVCCFLAGS) -DAR_PAIRS_HANDOVER_MBAR=1 -MMD -MP -c $< -o $@
$(BUILD)/sanitize/libattnreplay.a: $(LIB) $(BUILD)/sanitize/mla_decode.o
	cp $(LIB) $@.tmp && ar d $@.tmp mla_decode.o && ar rcs $@.tmp $(BUILD)/sanitize/mla_decode.o && mv $@.tmp $@
$(SANITIZE_TESTS): $(BUILD)/tests/%_handover: tests/%.c $(TEST_COMMON) $(BUILD)/sanitize/libattnreplay.a | deps
	$(CC) $(CFLAGS) $(CUDA_CFLAGS) -o $@ $< $(TEST_COMMON) $(BUILD)/sanitize/libattnreplay.a $(LDFLAGS) \
	  -Wl,-rpath,'$$ORIGIN' -lcmocka $(LIBS)

# ---- the kernel lab (kernels/lab/README.md): not part of bin/attnreplay -----------------------
ifeq ($(HAVE_CUDA),1)
lab: $(LABS)
else
lab:
	@echo "make lab: the kernel lab needs nvcc (none found); nothing built"
endif

$(BUILD)/lab/%: kernels/lab/%.cu $(TEST_HOOK_OBJ) $(LIB) $(NVCC_STAMP) | deps
	@mkdir -p $(dir $@)
	$(NVCC_GUARDED) $(NVCCFLAGS) -MMD -MP -c $< -o $@.o
	$(CC) $(LDFLAGS) -o $@ $@.o $(TEST_HOOK_OBJ) $(LIB) $(LIBS)

# On the GPU machine: runs what was built on the development machine.
lab-run:
	@AR_SRC=$(CURDIR) tests/run_benches.sh $(LABS)

$(BUILD)/tests/libcmocka.so.0:
	@mkdir -p $(dir $@)
	cp -L $$(ldconfig -p | awk '/libcmocka.so.0 /{print $$NF; exit}') $@

# ---- test -------------------------------------------------------------------------------------
test: deps $(BIN) $(TESTS) $(TEST_GPU_BUILD)
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) tests/run_tests.sh $(TESTS)
	@tests/build_rev_check.sh $(BUILD)
	@tests/wgmma_guard_check.sh
	@tests/gpu_carry_check.sh
	@$(PYTHON) tests/mutate.py check   # every mutation's text still in its file (code moves break them)

ASAN_BUILD ?= build-asan
asan:
	$(MAKE) BUILD=$(ASAN_BUILD) OPT=-O1 SANITIZE="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	  HAVE_CUDA=0 NVCC= BIN=$(ASAN_BUILD)/attnreplay test-only

test-only: $(BIN) $(TESTS)
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) ASAN_OPTIONS=detect_leaks=1 tests/run_tests.sh $(TESTS)

HAVE_DEV_HEADERS := $(shell [ -f /usr/include/sqlite3.h ] && [ -f /usr/include/cmocka.h ] && echo 1)
ifeq ($(HAVE_DEV_HEADERS),1)
test-gpu: $(BIN) $(GPU_TESTS) $(BUILD)/tests/libcmocka.so.0
test-gpu-sanitize: $(BIN) $(GPU_TESTS) $(SANITIZE_TESTS) $(BUILD)/tests/libcmocka.so.0
bench: $(BIN) $(BENCHES)
gpu-build: $(BIN) $(GPU_TESTS) $(SANITIZE_TESTS) $(BENCHES) $(BUILD)/tests/libcmocka.so.0 $(if $(filter 1,$(HAVE_CUDA)),$(LABS))
endif

# On the GPU machine (no dev headers) these run what was built on the development machine.
test-gpu:
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) tests/run_tests.sh $(GPU_TESTS)

bench:
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) tests/run_benches.sh $(BENCHES)

# The demo: a slice of the Azure LLM conversation trace (../shared/traces-public beside the
# checkout; a shipped sample when it is absent) simulated as Llama-3.1-8B on an H200, a few of its
# steps replayed and verified on the best backend here, the HTML report (traces/demo.sh).
# Without a GPU the host-only binary is enough and builds in seconds; a bin/attnreplay already
# built with CUDA is kept (and brought up to date) rather than replaced.
DEMO_DIR ?= demo
demo: deps
	@if [ -n "$(GPU_CC)" ] || [ "$$(cat $(BIN).kind 2>/dev/null)" = cuda ]; then \
	  $(MAKE) --no-print-directory $(BIN); \
	else \
	  echo "demo: no GPU here, so the host-only build (make test or make gpu-build add the CUDA kernels)"; \
	  $(MAKE) --no-print-directory HAVE_CUDA=0 NVCC= $(BIN); \
	fi
	@AR_BIN=$(BIN) traces/demo.sh $(DEMO_DIR)

# ---- vLLM: the recorder on vLLM's real scheduler, and the sim's parity with it (tests/vllm) ---
# The first run builds a pinned vLLM 0.33.0 environment outside the clone
# (traces/vllm_recorder/make_venv.sh; ~6 GB from PyPI); later runs reuse it.
.PHONY: test-vllm
test-vllm: deps $(BIN)
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) tests/vllm/run.sh

# ---- reliability: fuzzing, valgrind, compute-sanitizer (RELIABILITY.md) ---------------------
# `make fuzz` builds the library with clang and -fsanitize=fuzzer-no-link,address,undefined in
# FUZZ_BUILD, links each tests/fuzz/fuzz_*.c harness with libFuzzer, makes seed corpora from
# traces/samples and ../shared/traces-public (tests/fuzz/make_seeds.sh; public data is read, never
# copied into the repository) and runs each harness for FUZZ_SECONDS.  Inputs it finds go to
# FUZZ_BUILD/corpus-NAME; crashes to FUZZ_BUILD/crash-NAME-*, to be kept in tests/fuzz/regressions/.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_NAMES   := trace workload cli
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_OPTS    ?=
fuzz-build:
	$(MAKE) CC=clang BUILD=$(FUZZ_BUILD) OPT=-O1 NVCC= HAVE_CUDA=0 \
	  SANITIZE="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" \
	  $(foreach n,$(FUZZ_NAMES),$(FUZZ_BUILD)/fuzz/fuzz_$(n))

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.c tests/fuzz/fuzz_common.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $< tests/fuzz/fuzz_common.c $(LIB) $(LDFLAGS) $(LIBS)

fuzz: fuzz-build
	tests/fuzz/make_seeds.sh $(FUZZ_BUILD)/seeds
	@for n in $(FUZZ_NAMES); do \
	  d=$(abspath $(FUZZ_BUILD)); mkdir -p $$d/corpus-$$n; \
	  mask=1; [ $$n = cli ] && mask=3; \
	  echo "fuzz_$$n: $(FUZZ_SECONDS) s"; \
	  AR_SRC=$(CURDIR) ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 \
	  $$d/fuzz/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -timeout=20 -rss_limit_mb=4096 \
	    -close_fd_mask=$$mask -print_final_stats=1 -artifact_prefix=$$d/crash-$$n- \
	    $(FUZZ_OPTS) $$d/corpus-$$n $$d/seeds/$$n $(CURDIR)/tests/fuzz/regressions/$$n || exit 1; \
	done

# memcheck on a short replay of a sample trace: any leak or invalid access fails.
VALGRIND_DB ?= /tmp/attnreplay-valgrind-$(shell id -u).db
valgrind: $(BIN)
	rm -f $(VALGRIND_DB) $(VALGRIND_DB)-wal $(VALGRIND_DB)-shm
	valgrind --tool=memcheck --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
	  --show-leak-kinds=definite,indirect,possible $(BIN) replay traces/samples/mixed.trace.jsonl.gz \
	  --db $(VALGRIND_DB) --backend cpu --steps 0:12 --threads 2 --quiet
	valgrind --tool=memcheck --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
	  $(BIN) info traces/samples/prefix.trace.jsonl.gz >/dev/null
	rm -f $(VALGRIND_DB) $(VALGRIND_DB)-wal $(VALGRIND_DB)-shm
	@echo "valgrind: clean"

# compute-sanitizer over every GPU test binary with small cases (AR_GPU_SMALL=1): every
# (binary, tool) pair runs at once under a SANITIZE_TIMEOUT (default 400 s) limit
# (tests/gpu_sanitize.sh); one log per pair beside the summary (one line per pair, with each
# tool's ERROR SUMMARY) in GPU_SANITIZE_OUT.
GPU_SANITIZE_OUT ?= $(BUILD)/gpu-sanitize-summary.txt
# racecheck on gpu_mla runs as 7 processes (AR_GPU_SHARD): one ran past 480 s on the H200 (when
# it held the backend tests too, now gpu_mla_backend, which keeps the same split)
SANITIZE_SHARDS ?= gpu_mla:racecheck:7 gpu_mla_handover:racecheck:7 gpu_mla_backend:racecheck:7 \
  gpu_mla_backend_handover:racecheck:7
COMPUTE_SANITIZER ?= $(shell command -v compute-sanitizer 2>/dev/null || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
test-gpu-sanitize:
	@[ -n "$(COMPUTE_SANITIZER)" ] || { echo "compute-sanitizer not found (CUDA toolkit bin/)" >&2; exit 1; }
	@OUT=$(abspath $(dir $(GPU_SANITIZE_OUT))) SUMMARY=$(abspath $(GPU_SANITIZE_OUT)) \
	  COMPUTE_SANITIZER=$(COMPUTE_SANITIZER) AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) \
	  SANITIZE_SHARDS="$(SANITIZE_SHARDS)" tests/gpu_sanitize.sh $(GPU_TESTS) $(wildcard $(SANITIZE_TESTS))

# ---- mutation testing (tests/mutations.txt, tests/mutate.py; RELIABILITY.md has the scores) -------
# `make mutate-cpu` builds each CPU mutation of tests/mutations.txt as its own bin/attnreplay (in a
# scratch copy of the tree: the checkout is never modified) and runs the replays that should kill
# it; it fails when one survives.  `make mutate-gpu-build` builds the GPU mutations into one
# archive, MUTATE_OUT/gpu-mutants.tar.xz, that `make mutate-gpu` (tests/run_mutants.sh) runs on
# the GPU machine.  `make mutate`: the CPU mutants, then the GPU ones where a GPU and the archive
# are present.  MUTATE_ONLY=id,id limits a run to those mutations.  A CPU mutation of host code
# that no CPU replay runs (the GPU backends' planners) is killed by its unit test instead
# ("kill: test:NAME": tests/NAME.c linked against the mutant's objects).
MUTATE_OUT  ?= $(BUILD)/mutants
MUTATE_ONLY ?=
MUTATE_ARGS  = --src $(CURDIR) --build $(BUILD) --bin $(BIN) --main $(MAIN) --lib $(LIB) --cc '$(CC)' \
               --cflags '$(CFLAGS)' --link '$(CC) $(LDFLAGS)' --libs '$(LIBS)' $(if $(MUTATE_ONLY),--only $(MUTATE_ONLY)) \
               --test-objs '$(TEST_COMMON)' --test-cflags '$(CFLAGS) $(CUDA_CFLAGS)'
.PHONY: mutate mutate-cpu mutate-gpu-build mutate-gpu gpu-carry
mutate-cpu: deps $(BIN) $(TESTS)
	@$(PYTHON) tests/mutate.py cpu $(MUTATE_ARGS) --out $(MUTATE_OUT)/cpu

ifeq ($(HAVE_CUDA),1)
mutate-gpu-build: deps $(BIN)
	@$(PYTHON) tests/mutate.py gpu $(MUTATE_ARGS) --nvcc '$(NVCC) $(NVCCFLAGS)' --out $(MUTATE_OUT)
else
mutate-gpu-build:
	@echo "make mutate-gpu-build: needs nvcc (none found)" >&2; exit 1
endif

# On the GPU machine: the prebuilt archive, run against the prebuilt bin/attnreplay.
mutate-gpu:
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) tests/run_mutants.sh $(MUTATE_OUT)/gpu-mutants.tar.xz

mutate: mutate-cpu
	@if [ -n "$(GPU_CC)" ] && [ -f $(MUTATE_OUT)/gpu-mutants.tar.xz ]; then $(MAKE) --no-print-directory mutate-gpu; \
	 else echo "make mutate: GPU mutants not run (no GPU here, or no $(MUTATE_OUT)/gpu-mutants.tar.xz: make mutate-gpu-build)"; fi

# ---- bring your own kernel: libattnreplay.so, the example plugins, the Python package ----------
# (README "Bring your own kernel").  libattnreplay.so is the library again, position-independent,
# for the Python package (replay/python); jansson and sqlite3 are linked dynamically there (the
# distribution's static archives are not position-independent) and copied beside it, which its
# rpath of $ORIGIN finds on a machine without them.  The example plugins and the deliberately
# broken ones the tests load are plain shared objects that link nothing of ours.
SHLIB        := $(BUILD)/libattnreplay.so
PIC_OBJS     := $(C_OBJS:$(BUILD)/%.o=$(BUILD)/pic/%.o)
SHLIB_LIBS   := -ljansson -lsqlite3 -ldeflate -lz -lm -ldl -lrt
ifeq ($(HAVE_CUDA),1)
SHLIB_LIBS   += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcudart_static -lstdc++
endif
SHLIB_CARRY  := $(BUILD)/libjansson.so.4 $(BUILD)/libsqlite3.so.0 $(BUILD)/libdeflate.so.0
PLUGIN_DIR   := $(BUILD)/plugins
PLUGINS      := $(PLUGIN_DIR)/attnreplay-example-cpu.so
ifeq ($(HAVE_CUDA),1)
PLUGINS      += $(PLUGIN_DIR)/attnreplay-example-cuda.so
endif
BROKEN_KINDS := abi nosym refuse forward initnull badflags openfail
BROKEN_PLUGINS := $(BROKEN_KINDS:%=$(BUILD)/tests/plugins/broken-%.so) $(BUILD)/tests/plugins/example-flat.so
FAULTY_KINDS := segv hang error initsegv initabort inithang checksegv checkhang closesegv closehang
FAULTY_PLUGINS := $(FAULTY_KINDS:%=$(BUILD)/tests/plugins/faulty-%.so)
FAULTY_CUDA_PLUGINS := $(if $(filter 1,$(HAVE_CUDA)),$(BUILD)/tests/plugins/faulty-cuda-oob.so \
                  $(BUILD)/tests/plugins/faulty-cuda-hang.so)
PYENV        ?= $(BUILD)/pyenv
PYTHON       ?= python3

all: $(SHLIB) $(SHLIB_CARRY) $(PLUGINS)

# libattnreplay-lite.so: the same library without attnreplay's own CUDA kernels (their stubs
# instead; the plugin ABI's CUDA side stays): a few MB instead of ~25, for carrying next to large
# Python wheels to a GPU machine.  The Python package takes it through ATTNREPLAY_LIB.
ifeq ($(HAVE_CUDA),1)
SHLIB_LITE   := $(BUILD)/libattnreplay-lite.so
LITE_STUBS   := $(patsubst %.c,$(BUILD)/pic/%.o,$(filter kernels/%,$(STUB_SRCS)))
all: $(SHLIB_LITE)
$(SHLIB_LITE): $(PIC_OBJS) $(LITE_STUBS) $(filter-out $(BUILD)/kernels/%,$(CU_OBJS))
	$(CC) -shared $(LDFLAGS) -Wl,--no-undefined -Wl,--exclude-libs,ALL -Wl,-rpath,'$$ORIGIN' -o $@ $^ $(SHLIB_LIBS)
endif

$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -MMD -MP -c $< -o $@

$(SHLIB): $(PIC_OBJS) $(CU_OBJS)
	$(CC) -shared $(LDFLAGS) -Wl,--no-undefined -Wl,--exclude-libs,ALL -Wl,-rpath,'$$ORIGIN' -o $@ $^ $(SHLIB_LIBS)

$(BUILD)/libjansson.so.4 $(BUILD)/libsqlite3.so.0 $(BUILD)/libdeflate.so.0:
	@mkdir -p $(dir $@)
	cp -L $$(ldconfig -p | awk -v n=$(notdir $@) '$$1 == n {print $$NF; exit}') $@

$(PLUGIN_DIR)/attnreplay-example-cpu.so: replay/plugins/example_cpu.c replay/attnreplay_plugin.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -fvisibility=hidden -o $@ $< $(LDFLAGS) -lm

$(PLUGIN_DIR)/attnreplay-example-cuda.so: replay/plugins/example_cuda.cu replay/attnreplay_plugin.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -shared -Xcompiler -fvisibility=hidden -o $@ $<

$(BUILD)/tests/plugins/broken-%.so: tests/plugins/broken.c replay/attnreplay_plugin.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -fvisibility=hidden -DBROKEN_$* -o $@ $< $(LDFLAGS)

# the example kernel that faults or hangs from a given step on, or in init, check or close
# (tests/test_watchdog.c)
$(BUILD)/tests/plugins/faulty-%.so: tests/plugins/faulty.c replay/plugins/example_cpu.c replay/attnreplay_plugin.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -fvisibility=hidden -DFAULTY_$* -o $@ $< $(LDFLAGS) -lm

# the example CUDA kernel with an out-of-bounds write or a kernel that never ends (tests/gpu_faults.c)
$(BUILD)/tests/plugins/faulty-cuda-%.so: tests/plugins/faulty_cuda.cu replay/plugins/example_cuda.cu \
                                         replay/attnreplay_plugin.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -shared -Xcompiler -fvisibility=hidden -DFAULTY_$* -o $@ $<

$(BUILD)/tests/plugins/example-flat.so: replay/plugins/example_cpu.c replay/attnreplay_plugin.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -fvisibility=hidden -DEXAMPLE_FLAT_ONLY -o $@ $< $(LDFLAGS) -lm

# test_plugin loads the example plugins and the broken ones; gpu_plugin the CUDA example.
$(BUILD)/tests/test_plugin: $(PLUGINS) $(BROKEN_PLUGINS)
$(BUILD)/tests/test_coverage: $(PLUGINS)
$(BUILD)/tests/test_watchdog: $(FAULTY_PLUGINS)
$(BUILD)/tests/test_steptime: $(addprefix $(BUILD)/tests/plugins/faulty-,error.so closehang.so hang.so segv.so)
$(BUILD)/tests/gpu_faults: $(FAULTY_CUDA_PLUGINS)
$(BUILD)/tests/gpu_plugin: $(PLUGINS)

# `make gpu-carry`: everything the GPU machine (no development headers) runs, built here and packed
# into one archive, GPU_CARRY: bin/attnreplay, the GPU tests, sanitizer tests, benchmarks and labs,
# libcmocka, libattnreplay.so with the libraries it finds beside it (jansson, sqlite3, libdeflate;
# the Python package loads it), the example and test plugins, and the GPU mutants' archive when
# `make mutate-gpu-build` made one.  There: `xz -dc gpu-carry.tar.xz | tar xf -` in the checkout.
GPU_CARRY ?= $(BUILD)/gpu-carry.tar.xz
ifeq ($(HAVE_DEV_HEADERS),1)
gpu-carry: gpu-build $(SHLIB) $(SHLIB_CARRY) $(PLUGINS) $(BROKEN_PLUGINS) $(FAULTY_PLUGINS) $(FAULTY_CUDA_PLUGINS)
	@[ "$(HAVE_CUDA)" = 1 ] || { echo "make gpu-carry: needs nvcc (none found)" >&2; exit 1; }
	@{ printf '%s\n' $(BIN) $(BIN).kind $(GPU_TESTS) $(SANITIZE_TESTS) $(BENCHES) $(LABS) \
	     $(BUILD)/tests/libcmocka.so.0 $(SHLIB) $(SHLIB_CARRY) $(PLUGIN_DIR) $(BUILD)/tests/plugins \
	     $(BUILD)/code-rev.txt; \
	   [ -f $(MUTATE_OUT)/gpu-mutants.tar.xz ] && echo $(MUTATE_OUT)/gpu-mutants.tar.xz; true; } > $(GPU_CARRY).list
	@while read -r f; do [ -e "$$f" ] || { echo "make gpu-carry: $$f is missing, so the archive would lack it" >&2; \
	   rm -f $(GPU_CARRY).list; exit 1; }; done < $(GPU_CARRY).list
	@tar cf - -T $(GPU_CARRY).list | xz -T2 --lzma2=preset=1,dict=256MiB > $(GPU_CARRY).tmp && mv $(GPU_CARRY).tmp $(GPU_CARRY)
	@rm -f $(GPU_CARRY).list
	@echo "make gpu-carry: $(GPU_CARRY), $$(du -h $(GPU_CARRY) | cut -f1)"
endif

# The Python package's tests (numpy adapter against the float64 reference, the ABI error cases),
# in a virtual environment with numpy, the package installed from replay/python; and the vLLM
# recorder's trace writer, which needs no vLLM (tests/vllm/test_writer.py).
$(PYENV)/.ready:
	@command -v $(PYTHON) >/dev/null || { echo "python3 is needed for the Python package tests" >&2; exit 1; }
	$(PYTHON) -m venv $(PYENV)
	$(PYENV)/bin/python -m pip install -q --disable-pip-version-check numpy setuptools wheel
	@touch $@

py-test: $(SHLIB) $(SHLIB_CARRY) $(PLUGINS) $(BROKEN_PLUGINS) $(BIN) $(PYENV)/.ready
	rm -rf replay/python/build
	$(PYENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation ./replay/python
	ATTNREPLAY_LIB=$(abspath $(SHLIB)) AR_BIN=$(abspath $(BIN)) AR_BUILD=$(abspath $(BUILD)) AR_SRC=$(CURDIR) \
	  $(PYENV)/bin/python -m unittest discover -s replay/python/tests
	AR_BIN=$(abspath $(BIN)) $(PYENV)/bin/python -m unittest discover -s kernels/peers -p 'test_*.py'
	$(PYENV)/bin/python -m unittest discover -s tests/vllm -p 'test_writer.py'

test: py-test
.PHONY: py-test

clean:
	rm -rf $(BUILD) build-asan build-fuzz bin $(DEMO_DIR)

# the objects that compile AR_CODE_REV in (REV_STAMP above)
REV_OBJS := $(foreach f,replay/replay sim/profile,$(BUILD)/$(f).o $(BUILD)/pic/$(f).o) $(BUILD)/replay/main.o $(HOST_MAIN)
$(REV_OBJS): $(REV_STAMP)
-include $(COMMON_OBJS:.o=.d) $(STUB_OBJS:.o=.d) $(CU_OBJS:.o=.d) $(TEST_HOOK_OBJ:.o=.d) $(LABS:=.d) $(BUILD)/replay/main.d $(HOST_MAIN:.o=.d) $(PIC_OBJS:.o=.d) $(BUILD)/sanitize/mla_decode.d

# ---- simulator fidelity against real vLLM runs (tests/fidelity.c) ---------------------------
# `make fidelity` calibrates the step-time model on one public vLLM run and evaluates it on the
# other, both ways, then prints the table with the KV-block sensitivity.  CPU only.
FIDELITY_RUNS ?= $(firstword $(wildcard ../shared/traces-public/vllm-runs-llmservingsim ../../shared/traces-public/vllm-runs-llmservingsim) ../shared/traces-public/vllm-runs-llmservingsim)
.PHONY: fidelity fidelity-profiles
fidelity: $(BUILD)/fidelity
	$(BUILD)/fidelity $(FIDELITY_RUNS)

# the same protocol with each RTX card's step time from its measured per-layer profile
# (sim/profiles/*.llmservingsim.profile.db) instead of the roofline: only gap, overhead, per_req fitted
fidelity-profiles: $(BUILD)/fidelity
	FIDELITY_STEPTIME=profile $(BUILD)/fidelity $(FIDELITY_RUNS)

$(BUILD)/fidelity: tests/fidelity.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LIB) $(LDFLAGS) $(LIBS)

