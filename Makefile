# Makefile - the one build of attnreplay.
#
#   make            bin/attnreplay (C11 host code; CUDA kernels too when nvcc is found)
#   make test       every CPU test (cmocka, one binary per module); GPU tests skip with a reason
#   make demo       replay a sample trace on the best available backend into demo.db
#   make test-gpu   the GPU tests (run on the H200; uses prebuilt binaries where headers lack)
#   make bench      benchmarks (reference vs naive on the CPU; kernels on a GPU)
#   make asan       the CPU tests again under AddressSanitizer + UBSan
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
MODULES := traces reference kernels replay sim reports
C_SRCS  := $(filter-out replay/main.c kernels/cuda_stub.c,$(foreach m,$(MODULES),$(wildcard $(m)/*.c)))
CU_SRCS := $(wildcard kernels/*.cu)

ifneq ($(NVCC),)
HAVE_CUDA := 1
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCCFLAGS ?= -O3 -std=c++17 -lineinfo --use_fast_math -Xcompiler -fno-strict-aliasing \
             -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a \
             -gencode arch=compute_90,code=compute_90
CU_OBJS := $(CU_SRCS:%.cu=$(BUILD)/%.o)
CFLAGS  += -DAR_HAVE_CUDA=1
LIBS    += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcudart_static -lstdc++
else
HAVE_CUDA := 0
CU_OBJS :=
C_SRCS  += kernels/cuda_stub.c
endif

C_OBJS  := $(C_SRCS:%.c=$(BUILD)/%.o)
LIB     := $(BUILD)/libattnreplay.a
BIN     := bin/attnreplay

TEST_SRCS     := $(wildcard tests/test_*.c)
TESTS         := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
GPU_TEST_SRCS := $(wildcard tests/gpu_*.c)
GPU_TESTS     := $(GPU_TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
BENCH_SRCS    := $(wildcard tests/bench_*.c)
BENCHES       := $(BENCH_SRCS:tests/%.c=$(BUILD)/tests/%)
TEST_COMMON   := $(BUILD)/tests/testutil.o

.PHONY: all test demo test-gpu bench asan clean deps
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

$(BUILD)/tests/libcmocka.so.0:
	@mkdir -p $(dir $@)
	cp -L $$(ldconfig -p | awk '/libcmocka.so.0 /{print $$NF; exit}') $@

# ---- test -------------------------------------------------------------------------------------
test: deps $(BIN) $(TESTS)
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) tests/run_tests.sh $(TESTS)

asan:
	$(MAKE) BUILD=build-asan OPT=-O1 SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	  HAVE_CUDA=0 NVCC= BIN=build-asan/attnreplay test-only

test-only: $(BIN) $(TESTS)
	@AR_BIN=$(abspath $(BIN)) AR_SRC=$(CURDIR) ASAN_OPTIONS=detect_leaks=1 tests/run_tests.sh $(TESTS)

HAVE_DEV_HEADERS := $(shell [ -f /usr/include/sqlite3.h ] && [ -f /usr/include/cmocka.h ] && echo 1)
ifeq ($(HAVE_DEV_HEADERS),1)
test-gpu: $(BIN) $(GPU_TESTS) $(BUILD)/tests/libcmocka.so.0
bench: $(BIN) $(BENCHES)
gpu-build: $(BIN) $(GPU_TESTS) $(BENCHES) $(BUILD)/tests/libcmocka.so.0
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

clean:
	rm -rf $(BUILD) build-asan bin demo.db demo.db-wal demo.db-shm

-include $(C_OBJS:.o=.d) $(CU_OBJS:.o=.d) $(BUILD)/replay/main.d
