# The two commands of the README. Both install what is missing (as root), configure, build.
PRESET ?= default
BIN := build/$(PRESET)/bin
JOBS ?= 2

.PHONY: setup build demo test asan-test bench format clean

setup:
	@scripts/setup.sh

build: setup
	cmake --preset $(PRESET) >/dev/null
	cmake --build --preset $(PRESET) -j $(JOBS)

# The main job: scenario tables on the tiny model (see docs/how-to-run.md).
demo: build
	$(BIN)/radixtier demo

# Every unit and property test.
test: build
	ctest --preset $(PRESET) -j $(JOBS)

asan-test:
	$(MAKE) test PRESET=asan

bench: build
	$(BIN)/radixtier_bench

format:
	clang-format -i $$(git ls-files '*.hpp' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf build
