#!/usr/bin/env bash
# Builds .gpu/ (git-ignored) for bench/gpu_qlora.py on the device tool's nvidia-h200: the packages its
# image lacks, for its Python 3.12 on manylinux x86-64, unpacked into site/ (cft) and site_u/ (Unsloth,
# which pins trl<=1.15) and packed as .gpu/sites.tar.xz (~15 MB), plus the SmolLM2 tokenizer in .gpu/tok.
# Carry [".gpu/sites.tar.xz", ".gpu/tok"]; on the device: tar -C /tmp -xJf .gpu/sites.tar.xz and
# PYTHONPATH=/tmp/site, --unsloth-site /tmp/site_u (BENCHMARKS.md, "QLoRA against Unsloth").
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
      --platform any)
python3 -m pip download -q "${plat[@]}" -d "$work/wh" bitsandbytes==0.50.2 trl==1.16.0 datasets==5.2.0 \
  "dill<0.4.2" "multiprocess<0.70.20" liger-kernel==0.8.5 pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types typing-inspection
python3 -m pip download -q "${plat[@]}" -d "$work/whu" unsloth==2026.10.9 unsloth_zoo==2026.10.9 \
  trl==1.15.0 torchao==0.18.0 cut_cross_entropy msgspec tyro docstring-parser typeguard shtab json5 \
  nest-asyncio structlog hf_transfer
mkdir -p "$work/site" "$work/site_u"
for w in "$work"/wh/*.whl; do unzip -q -o "$w" -d "$work/site"; done
for w in "$work"/whu/*.whl; do unzip -q -o "$w" -d "$work/site_u"; done
# the image has torch 2.11+cu130: bitsandbytes needs only its cuda130 (and cpu) library
find "$work/site/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name '*_cuda130.so' ! -name '*_cpu.so' -delete
rm -rf "$work/site_u/studio" "$work/site_u/test"
mkdir -p .gpu/tok
tar -C "$work" -cJf .gpu/sites.tar.xz site site_u
cp ../shared/data/smollm2-135m-instruct-tokenizer/* .gpu/tok/ 2>/dev/null \
  || cp /work/shared/data/smollm2-135m-instruct-tokenizer/* .gpu/tok/
rm -rf "$work"
ls -la .gpu/sites.tar.xz
