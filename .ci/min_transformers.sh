#!/usr/bin/env bash
# Check that rigkit's generation code works with the minimum transformers it declares.
# A throwaway venv that sees .venv's packages (a .pth file, searched after its own), with only
# transformers and what it pins (tokenizers, huggingface_hub) installed in it; torch is not
# touched. Then the fast generator tests, CPU float32. About a minute plus the download.
# Usage: .ci/min_transformers.sh [VERSION]   (default: the minimum in pyproject.toml)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-$(sed -n 's/.*"transformers>=\([0-9.]*\),.*/\1/p' pyproject.toml)}"
venv="${TMPDIR:-/tmp}/rigkit-min-transformers-$version"
if [ ! -x "$venv/bin/python" ]; then
  .venv/bin/python -m venv "$venv"
  own="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  .venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$own/rigkit-base.pth"
  # pip sees the base packages and installs what this version pins (never torch) into the venv only
  "$venv/bin/pip" install -q "transformers==$version"
fi
"$venv/bin/python" -c "import transformers; print('transformers', transformers.__version__)"
PYTHONPATH=. "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_generation.py tests/test_generation_loading.py -k "not bfloat16 and not cuda"
