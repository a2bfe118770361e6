# tessera — two commands do everything on a fresh Debian 12 machine:
#   make run    install what is missing, build Release, run the main job
#   make test   install what is missing, build, run every test (ctest), then the
#               sanitizer (ASan/UBSan) pass over the comm and model tests
JOBS ?= $(shell nproc)
BUILD ?= build
CTEST_ARGS ?=
# Test binaries rebuilt and re-run under AddressSanitizer + UBSan by `make test`.
ASAN_TARGETS ?= base_tests comm_tests comm_failure_tests model_tests kernels_tests kv_tests engine_unit_tests \
                parallel_tests engine_parallel_tests
RUN_ARGS ?=

.PHONY: all deps configure build run test test-release test-asan bench fuzz format clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake --preset release >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	@MODEL="$(MODEL)" scripts/run-default.sh $(RUN_ARGS)

test: test-release test-asan

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) $(CTEST_ARGS)

test-asan: deps
	@cmake --preset asan >/dev/null
	@targets=""; for t in $(ASAN_TARGETS); do \
	  if cmake --build build-asan --target help | grep -q "^$$t:"; then targets="$$targets $$t"; fi; \
	done; \
	if [ -n "$$targets" ]; then cmake --build build-asan -j $(JOBS) --target $$targets && \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS) -E '_NOT_BUILT' $(CTEST_ARGS); fi

fuzz: deps
	@cmake --preset fuzz >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzzers
	@scripts/run-fuzzers.sh build-fuzz

format:
	@git ls-files '*.h' '*.cc' | xargs clang-format -i

clean:
	rm -rf build build-debug build-asan build-tsan build-fuzz
