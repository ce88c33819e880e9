#!/usr/bin/env bash
# Install fusionplan (editable) with its test tools.
# An installed torch is kept (a CUDA build on a GPU machine, say). Where there is none, torch is
# pinned to 2.13.0: an unpinned torch pulls gigabytes of CUDA wheels onto machines without a GPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test]"
