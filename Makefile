# The two commands of the README. Both install what is missing (as root), configure, build.
PRESET ?= default
BIN := build/$(PRESET)/bin
JOBS ?= 2
# The fuzz smoke (CI) runs FUZZ_RUNS inputs from seed FUZZ_SEED (both fixed, so CI walks the
# very path a developer ran, whatever the machine's speed), at most FUZZ_SECONDS. Exploration:
# FUZZ_SEED=0 (a new seed) FUZZ_RUNS=-1 (no count). New inputs go to FUZZ_CORPUS (not committed).
FUZZ_RUNS ?= 20000
FUZZ_SECONDS ?= 600
FUZZ_SEED ?= 1
FUZZ_CORPUS ?= build/fuzz/corpus

.PHONY: setup build demo test asan-test tsan-test fuzz fuzz-coverage soak bench format clean

setup:
	@scripts/setup.sh $(PRESET)

build: setup
	cmake --preset $(PRESET) >/dev/null
	cmake --build --preset $(PRESET) -j $(JOBS)

# The main job: scenario tables on the tiny model (see docs/how-to-run.md). It installs and
# builds only what the demo needs: the CLI and the libraries it links (no test, benchmark
# or Python module; `make test` builds those).
demo:
	@scripts/setup.sh $(PRESET) demo
	cmake --preset $(PRESET) >/dev/null
	cmake --build --preset $(PRESET) -j $(JOBS) --target radixtier_cli
	$(BIN)/radixtier demo

# Every unit and property test (PRESET=tsan: the threaded ones).
test: build
	ctest --preset $(PRESET) -j $(JOBS) --no-tests=error

asan-test:
	$(MAKE) test PRESET=asan

tsan-test:
	$(MAKE) test PRESET=tsan

# The cache fuzzer (clang, ASan + UBSan), FUZZ_RUNS inputs from the committed seeds; a
# failing input is written to build/fuzz/crash-<sha1>.
fuzz:
	$(MAKE) build PRESET=fuzz
	mkdir -p $(FUZZ_CORPUS)
	build/fuzz/bin/radixtier_cache_fuzzer $(FUZZ_CORPUS) tests/fuzz/corpus \
	  -seed=$(FUZZ_SEED) -runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_SECONDS) -timeout=30 \
	  -print_final_stats=1 \
	  -artifact_prefix=build/fuzz/

# Line coverage (llvm-cov) of the cache sources by the committed corpus and FUZZ_CORPUS.
fuzz-coverage:
	$(MAKE) build PRESET=fuzz-coverage
	tests/fuzz/coverage.sh build/fuzz-coverage tests/fuzz/corpus $(wildcard $(FUZZ_CORPUS))

# Long runs, not CI (~2.7 h on 2 cores): the property tests at 20,000 sequences of up to
# 1,000 commands each, the disk crash test at 10,000 kill points (~4 min), the power-cut
# tests at 200 workloads each (~10 min), then the fuzzer for 30 minutes.
soak:
	$(MAKE) build
	RC_PARAMS="max_success=20000 max_size=1000" \
	  build/default/bin/radixtier_property_tests --gtest_filter='PrefixCacheProperty.*'
	RADIXTIER_DISK_CRASH_KILLS=10000 \
	  build/default/bin/radixtier_tests --gtest_filter='DiskCrash.*'
	RADIXTIER_POWER_CUT_SEEDS=200 \
	  build/default/bin/radixtier_tests --gtest_filter='DiskPowerCut.*'
	$(MAKE) fuzz FUZZ_SECONDS=1800 FUZZ_SEED=0 FUZZ_RUNS=-1

bench: build
	$(BIN)/radixtier_bench

format:
	clang-format -i $$(git ls-files '*.hpp' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf build
