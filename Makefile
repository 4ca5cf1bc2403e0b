# Makefile - the one build of attnreplay.
#
#   make            bin/attnreplay (C11 host code; CUDA kernels too when nvcc is found)
#   make test       every CPU test (cmocka, one binary per module); GPU tests skip with a reason
#   make demo       replay a sample trace on the best available backend into demo.db
#   make test-gpu   the GPU tests (run on the H200; uses prebuilt binaries where headers lack)
#   make bench      benchmarks (reference vs naive on the CPU; kernels on a GPU)
#   make lab        the kernel lab (kernels/lab/: variants that are not in the product, each with
#                   its benchmark; CUDA builds only); `make lab-run` runs them on the GPU machine
#   make asan       the CPU tests again under AddressSanitizer + UBSan
#   make fuzz       libFuzzer harnesses (clang, ASan + UBSan), each run FUZZ_SECONDS (default 60)
#   make valgrind   memcheck over a short replay (no leaks, no invalid accesses)
#   make test-gpu-sanitize  compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over
#                   the GPU tests with small cases (on the H200)
#   make clean
#
# `make`, `make test` and `make demo` first install missing Debian packages (as root) or print
# the apt command to run.  Libraries a bare Ubuntu 24.04 GPU machine lacks (jansson, sqlite3)
# are linked statically; the CUDA runtime is static by nvcc's default.

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
STATIC_LIBS := -Wl,-Bstatic -ljansson -lsqlite3 -lz -Wl,-Bdynamic
LIBS    := $(STATIC_LIBS) -lm -ldl -lrt

BUILD   ?= build
MODULES := traces reference kernels/cpu kernels/common kernels/paged kernels/mla replay sim reports
STUBS   := kernels/paged/cuda_stub.c kernels/mla/cuda_mla_stub.c kernels/common/cuda_calibrate_stub.c reference/ref_gpu_stub.c
# test support: the cuda-mla test hook (and its float64 device reference) is linked into the
# tests, the benchmarks and the lab, never into bin/attnreplay
TEST_HOOK_CU   := kernels/mla/cuda_mla_case.cu
TEST_HOOK_STUB := kernels/mla/cuda_mla_case_stub.c
C_SRCS  := $(filter-out replay/main.c $(STUBS) $(TEST_HOOK_STUB),$(foreach m,$(MODULES),$(wildcard $(m)/*.c)))
CU_SRCS := $(filter-out $(TEST_HOOK_CU),$(foreach m,kernels/common kernels/paged kernels/mla reference,$(wildcard $(m)/*.cu)))

ifneq ($(NVCC),)
HAVE_CUDA := 1
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCCFLAGS ?= -O3 -std=c++17 -lineinfo --use_fast_math -Xcompiler -fno-strict-aliasing \
             -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a \
             -gencode arch=compute_90,code=compute_90
CU_OBJS := $(CU_SRCS:%.cu=$(BUILD)/%.o)
TEST_HOOK_OBJ := $(TEST_HOOK_CU:%.cu=$(BUILD)/%.o)
CFLAGS  += -DAR_HAVE_CUDA=1
LIBS    += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcudart_static -lstdc++
else
HAVE_CUDA := 0
CU_OBJS :=
TEST_HOOK_OBJ := $(TEST_HOOK_STUB:%.c=$(BUILD)/%.o)
C_SRCS  += $(STUBS)
endif

C_OBJS  := $(C_SRCS:%.c=$(BUILD)/%.o)

# ---- the plugin ABI's CUDA side (replay/plugin_cuda.cu, or its stub without nvcc) -------------
# Host code of every .cu is compiled position-independent so the same objects also go into
# libattnreplay.so (below).
ifeq ($(HAVE_CUDA),1)
C_OBJS  := $(filter-out $(BUILD)/replay/plugin_cuda_stub.o,$(C_OBJS))
CU_OBJS += $(BUILD)/replay/plugin_cuda.o
override NVCCFLAGS += -Xcompiler -fPIC
endif
LIB     := $(BUILD)/libattnreplay.a
BIN     := bin/attnreplay

TEST_SRCS     := $(wildcard tests/test_*.c)
TESTS         := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
GPU_TEST_SRCS := $(wildcard tests/gpu_*.c)
GPU_TESTS     := $(GPU_TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
BENCH_SRCS    := $(wildcard tests/bench_*.c)
BENCHES       := $(BENCH_SRCS:tests/%.c=$(BUILD)/tests/%)
TEST_COMMON   := $(BUILD)/tests/testutil.o $(TEST_HOOK_OBJ)
.SECONDARY: $(TEST_COMMON)   # kept between builds: make test deleted them as intermediates
LAB_SRCS      := $(wildcard kernels/lab/*.cu)
LABS          := $(LAB_SRCS:kernels/lab/%.cu=$(BUILD)/lab/%)

.PHONY: all test demo test-gpu bench asan clean deps fuzz fuzz-build valgrind test-gpu-sanitize lab lab-run
all: deps $(BIN)

# ---- set-up: install what is missing ---------------------------------------------------------
APT_PKGS := libcmocka-dev gnuplot-nox libjansson-dev libsqlite3-dev zlib1g-dev
deps:
	@missing=""; \
	for h in cmocka.h:libcmocka-dev jansson.h:libjansson-dev sqlite3.h:libsqlite3-dev zlib.h:zlib1g-dev; do \
	  f=$${h%%:*}; p=$${h##*:}; \
	  [ -f /usr/include/$$f ] || [ -f /usr/local/include/$$f ] || missing="$$missing $$p"; \
	done; \
	command -v gnuplot >/dev/null 2>&1 || missing="$$missing gnuplot-nox"; \
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
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# The device reference rounds exactly as the host does: no fast math (approximate division,
# exp and flush-to-zero would change its float values).
$(BUILD)/reference/%.o: reference/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(filter-out --use_fast_math,$(NVCCFLAGS)) -MMD -MP -c $< -o $@

$(LIB): $(C_OBJS) $(CU_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN): $(BUILD)/replay/main.o $(LIB)
	@mkdir -p bin
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

# Test binaries get an rpath of $ORIGIN so a copied libcmocka.so.0 beside them is found on the
# GPU machine, which has no cmocka.
$(BUILD)/tests/%: tests/%.c $(TEST_COMMON) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -o $@ $< $(TEST_COMMON) $(LIB) $(LDFLAGS) -Wl,-rpath,'$$ORIGIN' -lcmocka $(LIBS)

# ---- the kernel lab (kernels/lab/README.md): not part of bin/attnreplay -----------------------
ifeq ($(HAVE_CUDA),1)
lab: $(LABS)
else
lab:
	@echo "make lab: the kernel lab needs nvcc (none found); nothing built"
endif

$(BUILD)/lab/%: kernels/lab/%.cu $(TEST_HOOK_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@.o
	$(CC) $(LDFLAGS) -o $@ $@.o $(TEST_HOOK_OBJ) $(LIB) $(LIBS)

# On the GPU machine: runs what was built on the development machine.
lab-run:
	@AR_SRC=$(CURDIR) tests/run_benches.sh $(LABS)

$(BUILD)/tests/libcmocka.so.0:
	@mkdir -p $(dir $@)
	cp -L $$(ldconfig -p | awk '/libcmocka.so.0 /{print $$NF; exit}') $@

# ---- test -------------------------------------------------------------------------------------
test: deps $(BIN) $(TESTS)
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) tests/run_tests.sh $(TESTS)

ASAN_BUILD ?= build-asan
asan:
	$(MAKE) BUILD=$(ASAN_BUILD) OPT=-O1 SANITIZE="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	  HAVE_CUDA=0 NVCC= BIN=$(ASAN_BUILD)/attnreplay test-only

test-only: $(BIN) $(TESTS)
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) ASAN_OPTIONS=detect_leaks=1 tests/run_tests.sh $(TESTS)

HAVE_DEV_HEADERS := $(shell [ -f /usr/include/sqlite3.h ] && [ -f /usr/include/cmocka.h ] && echo 1)
ifeq ($(HAVE_DEV_HEADERS),1)
test-gpu: $(BIN) $(GPU_TESTS) $(BUILD)/tests/libcmocka.so.0
test-gpu-sanitize: $(BIN) $(GPU_TESTS) $(BUILD)/tests/libcmocka.so.0
bench: $(BIN) $(BENCHES)
gpu-build: $(BIN) $(GPU_TESTS) $(BENCHES) $(BUILD)/tests/libcmocka.so.0 $(if $(filter 1,$(HAVE_CUDA)),$(LABS))
endif
# On the GPU machine (no dev headers) these run what was built on the development machine.
test-gpu:
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) tests/run_tests.sh $(GPU_TESTS)

bench:
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) tests/run_benches.sh $(BENCHES)

demo: deps $(BIN)
	@rm -f demo.db demo.db-wal demo.db-shm
	$(BIN) info traces/samples/mixed.trace.jsonl.gz
	$(BIN) replay traces/samples/mixed.trace.jsonl.gz --db demo.db --backend auto

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
# racecheck on gpu_mla runs as 7 processes (AR_GPU_SHARD): one ran past 480 s on the H200
SANITIZE_SHARDS ?= gpu_mla:racecheck:7
COMPUTE_SANITIZER ?= $(shell command -v compute-sanitizer 2>/dev/null || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
test-gpu-sanitize:
	@[ -n "$(COMPUTE_SANITIZER)" ] || { echo "compute-sanitizer not found (CUDA toolkit bin/)" >&2; exit 1; }
	@OUT=$(abspath $(dir $(GPU_SANITIZE_OUT))) SUMMARY=$(abspath $(GPU_SANITIZE_OUT)) \
	  COMPUTE_SANITIZER=$(COMPUTE_SANITIZER) AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) \
	  SANITIZE_SHARDS="$(SANITIZE_SHARDS)" tests/gpu_sanitize.sh $(GPU_TESTS)

# ---- bring your own kernel: libattnreplay.so, the example plugins, the Python package ----------
# (README "Bring your own kernel").  libattnreplay.so is the library again, position-independent,
# for the Python package (replay/python); jansson and sqlite3 are linked dynamically there (the
# distribution's static archives are not position-independent) and copied beside it, which its
# rpath of $ORIGIN finds on a machine without them.  The example plugins and the deliberately
# broken ones the tests load are plain shared objects that link nothing of ours.
SHLIB        := $(BUILD)/libattnreplay.so
PIC_OBJS     := $(C_OBJS:$(BUILD)/%.o=$(BUILD)/pic/%.o)
SHLIB_LIBS   := -ljansson -lsqlite3 -lz -lm -ldl -lrt
ifeq ($(HAVE_CUDA),1)
SHLIB_LIBS   += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcudart_static -lstdc++
endif
SHLIB_CARRY  := $(BUILD)/libjansson.so.4 $(BUILD)/libsqlite3.so.0
PLUGIN_DIR   := $(BUILD)/plugins
PLUGINS      := $(PLUGIN_DIR)/attnreplay-example-cpu.so
ifeq ($(HAVE_CUDA),1)
PLUGINS      += $(PLUGIN_DIR)/attnreplay-example-cuda.so
endif
BROKEN_KINDS := abi nosym refuse forward initnull badflags openfail
BROKEN_PLUGINS := $(BROKEN_KINDS:%=$(BUILD)/tests/plugins/broken-%.so) $(BUILD)/tests/plugins/example-flat.so
PYENV        ?= $(BUILD)/pyenv
PYTHON       ?= python3

all: $(SHLIB) $(SHLIB_CARRY) $(PLUGINS)

# libattnreplay-lite.so: the same library without attnreplay's own CUDA kernels (their stubs
# instead; the plugin ABI's CUDA side stays): a few MB instead of ~25, for carrying next to large
# Python wheels to a GPU machine.  The Python package takes it through ATTNREPLAY_LIB.
ifeq ($(HAVE_CUDA),1)
SHLIB_LITE   := $(BUILD)/libattnreplay-lite.so
LITE_STUBS   := $(patsubst %.c,$(BUILD)/pic/%.o,$(filter kernels/%,$(STUBS)))
all: $(SHLIB_LITE)
$(SHLIB_LITE): $(PIC_OBJS) $(LITE_STUBS) $(filter-out $(BUILD)/kernels/%,$(CU_OBJS))
	$(CC) -shared $(LDFLAGS) -Wl,--no-undefined -Wl,--exclude-libs,ALL -Wl,-rpath,'$$ORIGIN' -o $@ $^ $(SHLIB_LIBS)
endif

$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -MMD -MP -c $< -o $@

$(SHLIB): $(PIC_OBJS) $(CU_OBJS)
	$(CC) -shared $(LDFLAGS) -Wl,--no-undefined -Wl,--exclude-libs,ALL -Wl,-rpath,'$$ORIGIN' -o $@ $^ $(SHLIB_LIBS)

$(BUILD)/libjansson.so.4 $(BUILD)/libsqlite3.so.0:
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

$(BUILD)/tests/plugins/example-flat.so: replay/plugins/example_cpu.c replay/attnreplay_plugin.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -fvisibility=hidden -DEXAMPLE_FLAT_ONLY -o $@ $< $(LDFLAGS) -lm

# test_plugin loads the example plugins and the broken ones; gpu_plugin the CUDA example.
$(BUILD)/tests/test_plugin: $(PLUGINS) $(BROKEN_PLUGINS)
$(BUILD)/tests/gpu_plugin: $(PLUGINS)

# The Python package's tests (numpy adapter against the float64 reference, the ABI error cases),
# in a virtual environment with numpy, the package installed from replay/python.
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

test: py-test
.PHONY: py-test

clean:
	rm -rf $(BUILD) build-asan build-fuzz bin demo.db demo.db-wal demo.db-shm

-include $(C_OBJS:.o=.d) $(CU_OBJS:.o=.d) $(TEST_HOOK_OBJ:.o=.d) $(LABS:=.d) $(BUILD)/replay/main.d $(PIC_OBJS:.o=.d)
